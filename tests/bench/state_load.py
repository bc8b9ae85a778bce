"""The state-load benchmark: decoding a whole state, and what the cyclic collector costs.

A server decodes a whole state when it starts from its raft snapshot, when a lagging
follower installs the leader's, and on ``operator snapshot restore``
(``drover.server.snapshot.from_snapshot``). Decoding makes several GC-tracked objects per
alloc, and none is garbage, so every collection it starts is wasted; one that reaches the
oldest generation walks the whole heap, so the cost grows with what the process already
holds. Measured in one process, one state after another, each kept (a server holds the
state it loaded, and the plan applier and the snapshot in flight hold more):

* ``decode_s`` per round: ``from_snapshot`` as the server runs it (collector paused);
* ``decode_collecting_s`` per round: the same decode with the collector running, for
  the ratio;
* after the rounds, one full collection (``gc.collect()``): the pause every thread of a
  server with that heap takes when the oldest generation is collected, with the tracked
  objects behind it and their number per alloc.

The allocs are tests/fixtures/mock.py's (one task, two ports, a task state): smaller than a
real placement's (metrics, scores), so real states cost more per alloc.
"""

from __future__ import annotations

import dataclasses
import gc
import statistics
import time
from dataclasses import dataclass
from typing import Any, Final

import immutables

from drover.scheduler.structs import Allocation, Node
from drover.server import snapshot as snapshot_module
from drover.server.state_store import Tables
from drover.v1 import raft_pb2
from tests.fixtures import mock

NAME: Final = "state_load"
FULL_ALLOCS: Final = 60_000
QUICK_ALLOCS: Final = 20_000
NODES: Final = 5_000
ROUNDS: Final = 3


@dataclass(frozen=True, slots=True)
class StateLoadConfig:
    allocs: int
    rounds: int = ROUNDS

    @classmethod
    def make(cls, *, quick: bool) -> StateLoadConfig:
        return cls(allocs=QUICK_ALLOCS if quick else FULL_ALLOCS)

    def budget_s(self) -> float:
        # ~60 us per alloc per decode at worst, two decodes a round, plus building the state.
        return 60.0 + self.allocs * self.rounds * 2 * 100e-6


def _state_bytes(allocs: int) -> bytes:
    job = mock.job()
    nodes: list[Node] = [mock.node(id=f"node-{i:05d}", name=f"node-{i:05d}") for i in range(NODES)]
    table: dict[str, Allocation] = {}
    for i in range(allocs):
        alloc = mock.alloc(
            job,
            nodes[i % NODES],
            index=i,
            client_status="running",
            task_states={"web": mock.running_task_state()},
        )
        table[alloc.id] = alloc
    tables = dataclasses.replace(
        Tables(), allocs=immutables.Map(table), nodes=immutables.Map({n.id: n for n in nodes})
    )
    return raft_pb2.RaftSnapshotFile(state=snapshot_module.to_snapshot(tables)).SerializeToString()


def _timed_decode(data: bytes, *, collecting: bool) -> tuple[float, Tables]:
    state = raft_pb2.RaftSnapshotFile.FromString(data).state
    # Collecting: from_snapshot's own steps without its pause.
    decode = snapshot_module._decode_tables if collecting else snapshot_module.from_snapshot
    started = time.perf_counter()
    tables = decode(state)
    return time.perf_counter() - started, tables


def run_state_load(cfg: StateLoadConfig) -> dict[str, Any]:
    data = _state_bytes(cfg.allocs)
    held: list[Tables] = []
    rounds = []
    baseline_tracked = len(gc.get_objects())
    for _ in range(cfg.rounds):
        paused_s, tables = _timed_decode(data, collecting=False)
        held.append(tables)
        collecting_s, tables = _timed_decode(data, collecting=True)
        held.append(tables)
        rounds.append({"decode_s": round(paused_s, 3), "decode_collecting_s": round(collecting_s, 3)})
    tracked = len(gc.get_objects())
    started = time.perf_counter()
    gc.collect()
    full_collection_s = time.perf_counter() - started
    paused = statistics.median(r["decode_s"] for r in rounds)
    collecting = statistics.median(r["decode_collecting_s"] for r in rounds)
    results = {
        "allocs": cfg.allocs,
        "nodes": NODES,
        "snapshot_bytes": len(data),
        "rounds": rounds,
        "decode_s_median": paused,
        "decode_collecting_s_median": collecting,
        "collecting_vs_paused": round(collecting / max(paused, 1e-9), 2),
        "states_held": len(held),
        "tracked_objects": tracked,
        "tracked_per_alloc_per_state": round((tracked - baseline_tracked) / (len(held) * cfg.allocs), 1),
        "full_collection_s": round(full_collection_s, 3),
    }
    return {"config": dataclasses.asdict(cfg), "results": results}


def summary_lines(doc: dict[str, Any]) -> list[str]:
    r = doc["results"]
    return [
        f"  decode {r['allocs']} allocs: {r['decode_s_median']} s (collector paused, as the server runs it), "
        f"{r['decode_collecting_s_median']} s collecting ({r['collecting_vs_paused']}x; medians of "
        f"{len(r['rounds'])} rounds, later rounds with more states held)",
        f"  full collection with {r['states_held']} states held: {r['full_collection_s']} s over "
        f"{r['tracked_objects']} tracked objects ({r['tracked_per_alloc_per_state']} per alloc per state)",
    ]
