"""Where a Jobs.Register spends CPU in drover's own code: one thread, no network, no raft.

Times the stages the leader runs for each write, in this process:

* ``request_decode``: JobRegisterRequest off the wire (what grpc's deserializer does);
* ``from_proto``: the servicer's protobuf -> domain Job conversion;
* ``endpoint``: Endpoints.register_job up to the proposal (canonicalize, validate, build and
  encode the log entry), with a proposer that only records the entry;
* ``fsm_apply``: FSM.apply of those entries in order (what the raft tick thread runs
  before it can call back; it also delays every other commit).

The sum is a floor for the leader's CPU per write; compare it with the measured leader CPU
per write (leader CPU % / writes/s) to see what gRPC and raft add on top.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Final

from drover.scheduler.structs import Job
from drover.server.clock import SystemClock, UuidIds
from drover.server.codec import from_proto
from drover.server.endpoints import Endpoints
from drover.server.fsm import FSM, ApplyResult
from drover.server.state_store import StateStore
from drover.v1 import api_pb2
from tests.bench.drover_register import JOB_IDS, bench_job

ROUNDS: Final = 3


class _RecordingProposer:
    """Stands in for raft: keeps each proposed entry, applies nothing."""

    def __init__(self) -> None:
        self.entries: list[bytes] = []

    def propose(self, data: bytes, timeout: float) -> ApplyResult:
        self.entries.append(data)
        return ApplyResult(index=len(self.entries), value={})


def _wires(count: int) -> list[bytes]:
    job = bench_job()
    out = []
    for seq in range(count):
        job.id = job.name = f"bench-{seq % JOB_IDS:03d}"
        job.meta["write"] = f"stage-{seq}"
        out.append(api_pb2.JobRegisterRequest(job=job).SerializeToString())
    return out


def _per_op_us(fn: Callable[[], None], count: int) -> float:
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) / count * 1e6


def _one_round(wires: list[bytes]) -> dict[str, float]:
    requests: list[api_pb2.JobRegisterRequest] = []
    jobs: list[Job] = []
    proposer = _RecordingProposer()
    endpoints = Endpoints(proposer, StateStore(), SystemClock(), UuidIds())
    fsm = FSM(StateStore())

    def decode() -> None:
        requests.extend(api_pb2.JobRegisterRequest.FromString(w) for w in wires)

    def convert() -> None:
        jobs.extend(from_proto(r.job, Job) for r in requests)

    def endpoint() -> None:
        for job in jobs:
            endpoints.register_job(job)

    def apply() -> None:
        for index, data in enumerate(proposer.entries, start=1):
            fsm.apply(data, index)

    stages = {"request_decode": decode, "from_proto": convert, "endpoint": endpoint, "fsm_apply": apply}
    return {name: _per_op_us(fn, len(wires)) for name, fn in stages.items()}


def measure_write_path(writes: int = 3000) -> dict[str, Any]:
    """Microseconds per write for each stage (best of a few rounds, so noise is lower)."""
    wires = _wires(writes)
    best: dict[str, float] = {}
    for _ in range(ROUNDS):
        for name, us in _one_round(wires).items():
            best[name] = min(best.get(name, us), us)
    out: dict[str, Any] = {name: round(us, 1) for name, us in best.items()}
    out["total"] = round(sum(best.values()), 1)
    out["writes"] = writes
    out["max_writes_per_s_on_one_core"] = round(1e6 / out["total"], 0)
    out["max_fsm_applies_per_s"] = round(1e6 / best["fsm_apply"], 0)
    return out
