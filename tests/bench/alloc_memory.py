"""The leader's memory per allocation, in one process: how much, and where the bytes go.

``python -m tests.bench.alloc_memory [--allocs 20000] [--nodes 1000] [--system] [--top 15] [--save]``

The scheduling benchmark (tests/bench/scheduling.py) measures the leader's RSS end to end
on a 3-server cluster: noisy, slow, and silent about where the bytes are. This reproduces
what the leader keeps for one big placement, without raft, gRPC or other threads:

* the writes go through the real ``Endpoints`` (nodes, then the job and its eval) and the
  real ``FSM`` on a ``StateStore``, one index per proposal, as raft would apply them;
* the eval is scheduled as a worker does (its scheduler on a snapshot, the plan
  stamped with the eval), then committed by a real ``PlanApplier`` (``_apply``, called
  directly instead of from its thread): it evaluates the plan, splits it into entries,
  computes the expected state it keeps in ``_inflight`` until the next plan, and proposes
  each entry; the stand-in for raft keeps every proposed command as pysyncobj's in-memory
  journal does (a pickled ``(func_id, (entry,))`` behind a command-type byte) and applies it;
* the worker's eval update is written last.

Two modes, each in a fresh interpreter (``measure_alloc_memory`` starts them):

* ``rss``: the process's RSS before the placement (nodes and job registered), its peak
  while placing (sampled every few ms) and after (garbage collected): the figure the
  benchmark target is about, minus the cluster's noise;
* ``trace``: tracemalloc, the Python heap: the same before / peak / settled figures, what
  each holder keeps (the applier's expected state, the raft log, the state store) found by
  dropping them one after the other, the top allocation sites of what stays, and a
  structural census of the stored allocations (each distinct object counted once, by the
  field it hangs from; ``sys.getsizeof``, so without allocator rounding).

Per-alloc figures divide by the number of allocs placed. The job is the scheduling
benchmark's: one group of one 100 MHz / 64 MB task, a service job of count ``allocs`` on
4,000 MHz / 16 GiB nodes (its ``service`` scenario: 20,000 on 1,000), or with ``--system``
a system job, one alloc per node (its ``system`` scenario: 5,000 nodes).
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import os
import random
import subprocess
import sys
import threading
import time
import tracemalloc
from collections.abc import Iterable, Iterator
from concurrent.futures import Future
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

import psutil
from pysyncobj import pickle as raft_pickle

from drover.scheduler.interfaces import SchedulerContext, seed_from
from drover.scheduler.structs import JOB_TYPE_SERVICE, JOB_TYPE_SYSTEM, Allocation, Job, Node, PlanResult
from drover.scheduler.validate import Limits
from drover.server.clock import UuidIds
from drover.server.codec import from_proto
from drover.server.endpoints import Endpoints
from drover.server.fsm import FSM, ApplyResult
from drover.server.plan_apply import PendingPlan, PlanApplier, PlanQueue
from drover.server.state_store import StateStore
from drover.server.worker import scheduler_for, write_evals
from tests.bench._machine import machine_info
from tests.bench._procs import REPO_ROOT
from tests.cluster.jobs import service_job
from tests.cluster.nodes import simulated_node

NAME: Final = "alloc_memory"
NODE_CPU_MHZ: Final = 4_000
NODE_MEMORY_MB: Final = 16_384
NOW_NS: Final = 1_700_000_000_000_000_000
RSS_INTERVAL_S: Final = 0.002
MODES: Final = ("rss", "trace")
# pysyncobj's journal: (command, index, term), the command a type byte and a pickled call.
_COMMAND_TYPE_REGULAR: Final = b"\x00"


class _Clock:
    """Advances a microsecond per reading: distinct, deterministic times."""

    def __init__(self) -> None:
        self._now = NOW_NS

    def now_ns(self) -> int:
        self._now += 1_000
        return self._now


class _Raft:
    """Stands in for raft on the leader: keeps each command as pysyncobj's in-memory
    journal does, and applies it at once through the FSM (one index per entry)."""

    def __init__(self, fsm: FSM) -> None:
        self.fsm = fsm
        self.log: list[tuple[bytes, int, int]] = []

    def _append(self, data: bytes) -> ApplyResult:
        index = self.fsm.store.index + 1
        command = _COMMAND_TYPE_REGULAR + raft_pickle.dumps((0, (data,)))
        self.log.append((command, index, 1))
        return self.fsm.apply(data, index)

    def propose(self, data: bytes, timeout: float) -> ApplyResult:
        result = self._append(data)
        if result.error:
            raise RuntimeError(f"entry refused: {result.error}")
        return result

    def propose_async(self, data: bytes, on_done: Any) -> None:
        on_done(self._append(data), "")


@dataclasses.dataclass
class _Leader:
    store: StateStore
    raft: _Raft
    endpoints: Endpoints
    applier: PlanApplier
    clock: _Clock
    ids: UuidIds


def _leader() -> _Leader:
    store = StateStore()
    raft = _Raft(FSM(store))
    clock, ids = _Clock(), UuidIds()
    # Measured at counts past the default per-group limit (10,000): the bench raises it.
    endpoints = Endpoints(raft, store, clock, ids, limits=Limits(max_group_count=1_000_000))
    queue = PlanQueue()
    applier = PlanApplier(queue, store, raft.propose_async, lambda _e, _t: True, clock.now_ns, lambda: True)
    return _Leader(store, raft, endpoints, applier, clock, ids)


def _register(leader: _Leader, allocs: int, nodes: int, job_type: str) -> str:
    """Nodes and the job through the endpoints, as clients and the CLI would; the eval ID."""
    for i in range(nodes):
        node = simulated_node(f"{job_type}-node-{i:05d}", cpu=NODE_CPU_MHZ, memory=NODE_MEMORY_MB)
        leader.endpoints.register_node(from_proto(node, Node))
    job = service_job(f"bench-{job_type}", count=1 if job_type == JOB_TYPE_SYSTEM else allocs)
    job.type = job_type
    _result, eval_id = leader.endpoints.register_job(from_proto(job, Job))
    scheduler_for(job_type)  # imports the schedulers: not memory the placement keeps
    return eval_id


def _place(leader: _Leader, eval_id: str) -> int:
    """What a worker and the plan applier do with the job's eval; the allocs placed."""
    snap = leader.store.snapshot()
    ev = snap.eval(eval_id)
    assert ev is not None
    seed = seed_from(ev.id, snap.index)
    ctx = SchedulerContext(
        now_ns=leader.clock.now_ns(), new_id=leader.ids.new, seed=seed, rng=random.Random(seed)
    )
    result = scheduler_for(ev.type)(ev, snap, ctx)
    assert result.plan is not None, "nothing to place"
    plan = replace(
        result.plan, eval_id=ev.id, eval_token="token", priority=ev.priority, snapshot_index=snap.index
    )
    future: Future[PlanResult] = Future()
    leader.applier._apply(PendingPlan(plan, future))
    outcome = future.result(timeout=0)
    assert not outcome.rejected_nodes, f"rejected: {outcome.rejected_nodes}"
    update = replace(result.eval_update, snapshot_index=snap.index, modify_time_ns=leader.clock.now_ns())
    write_evals(leader.raft.propose, [update, *result.created_evals])
    return sum(len(a) for a in outcome.node_allocation.values())


# ---------------------------------------------------------------------------------------
# Measuring


def _rss() -> int:
    return int(psutil.Process().memory_info().rss)


class _PeakRss:
    """Samples this process's RSS from a thread; ``peak`` is the highest seen."""

    def __init__(self) -> None:
        self.peak = _rss()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        proc = psutil.Process()
        while not self._stop.wait(RSS_INTERVAL_S):
            self.peak = max(self.peak, int(proc.memory_info().rss))

    def __enter__(self) -> _PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, _rss())


def _traced() -> int:
    gc.collect()
    return tracemalloc.get_traced_memory()[0]


def _per(n: int, value: float) -> float:
    return round(value / max(n, 1), 1)


def _run_rss(allocs: int, nodes: int, job_type: str) -> dict[str, Any]:
    leader = _leader()
    eval_id = _register(leader, allocs, nodes, job_type)
    gc.collect()
    baseline = _rss()
    with _PeakRss() as sampler:
        placed = _place(leader, eval_id)
    gc.collect()
    settled = _rss()
    leader.applier._inflight = None
    gc.collect()
    without_applier = _rss()
    mb = 2**20
    return {
        "placed": placed,
        "baseline_mb": round(baseline / mb, 1),
        "peak_mb": round(sampler.peak / mb, 1),
        "settled_mb": round(settled / mb, 1),
        "peak_bytes_per_alloc": _per(placed, sampler.peak - baseline),
        "settled_bytes_per_alloc": _per(placed, settled - baseline),
        # RSS rarely shrinks when Python frees (arenas stay mapped while partly used).
        "settled_without_applier_expected_state_bytes_per_alloc": _per(placed, without_applier - baseline),
    }


def _run_trace(allocs: int, nodes: int, job_type: str, top: int) -> dict[str, Any]:
    already = tracemalloc.is_tracing()
    if not already:
        tracemalloc.start(1)
    leader = _leader()
    eval_id = _register(leader, allocs, nodes, job_type)
    log_start = len(leader.raft.log)
    base = _traced()
    before = tracemalloc.take_snapshot()
    tracemalloc.reset_peak()
    placed = _place(leader, eval_id)
    peak = tracemalloc.get_traced_memory()[1]
    settled = _traced()
    after = tracemalloc.take_snapshot()
    tables = leader.store.snapshot().tables
    census = allocation_census(tables.allocs.values(), held_elsewhere=tables.nodes.values())
    del tables
    # What each holder keeps: drop them one after the other.
    leader.applier._inflight = None
    without_applier = _traced()
    del leader.raft.log[log_start:]
    without_log = _traced()
    state = without_log - base
    sites = [
        {
            "site": str(stat.traceback[0]),
            "bytes_per_alloc": _per(placed, stat.size_diff),
            "count": stat.count_diff,
        }
        for stat in after.compare_to(before, "lineno")[:top]
    ]
    if not already:
        tracemalloc.stop()
    return {
        "placed": placed,
        "peak_bytes_per_alloc": _per(placed, peak - base),
        "settled_bytes_per_alloc": _per(placed, settled - base),
        "by_holder_bytes_per_alloc": {
            "applier_expected_state": _per(placed, settled - without_applier),
            "raft_log": _per(placed, without_applier - without_log),
            "state_store": _per(placed, state),
        },
        "state_store_allocs_census_bytes_per_alloc": {k: _per(placed, v) for k, v in census.items()},
        "state_store_rest_bytes_per_alloc": _per(placed, state - sum(census.values())),
        "top_sites_settled": sites,
    }


def _deep_size(value: Any, seen: set[int]) -> int:
    """``sys.getsizeof`` of ``value`` and what it holds, skipping objects already in ``seen``."""
    if id(value) in seen or (type(value) is int and -5 <= value <= 256):
        return 0  # counted already, or one of the interpreter's cached small ints
    seen.add(id(value))
    size = sys.getsizeof(value)
    if dataclasses.is_dataclass(value):
        size += sum(_deep_size(getattr(value, f.name), seen) for f in dataclasses.fields(value))
    elif isinstance(value, tuple | list):
        size += sum(_deep_size(item, seen) for item in value)
    elif isinstance(value, dict):
        size += sum(_deep_size(k, seen) + _deep_size(v, seen) for k, v in value.items())
    return size


def allocation_census(allocs: Iterable[Allocation], held_elsewhere: Iterable[Any] = ()) -> dict[str, int]:
    """Bytes of the distinct objects the allocs hold, by the field they hang from (the first
    alloc to reach a shared object pays for it); ``Allocation`` is the records themselves.
    What ``held_elsewhere`` (e.g. the nodes) reaches costs the allocs nothing."""
    seen: set[int] = set()
    # Interpreter-wide singletons cost the allocs nothing either.
    for shared in ((), "", False, True, None):
        seen.add(id(shared))
    for record in held_elsewhere:
        _deep_size(record, seen)
    sizes: dict[str, int] = {"Allocation": 0}
    names = [f.name for f in dataclasses.fields(Allocation)]
    for alloc in allocs:
        seen.add(id(alloc))
        sizes["Allocation"] += sys.getsizeof(alloc)
        for name in names:
            size = _deep_size(getattr(alloc, name), seen)
            if size:
                sizes[name] = sizes.get(name, 0) + size
    return dict(sorted(sizes.items(), key=lambda kv: -kv[1]))


def measure_in_process(
    mode: str, allocs: int = 20_000, nodes: int = 1_000, job_type: str = JOB_TYPE_SERVICE, top: int = 15
) -> dict[str, Any]:
    """One mode (``rss`` or ``trace``) in this process; see the module docstring."""
    started = time.perf_counter()
    trace = mode == "trace"
    out = _run_trace(allocs, nodes, job_type, top) if trace else _run_rss(allocs, nodes, job_type)
    out["seconds"] = round(time.perf_counter() - started, 1)
    return out


def measure_alloc_memory(
    allocs: int = 20_000, nodes: int = 1_000, job_type: str = JOB_TYPE_SERVICE, top: int = 15
) -> dict[str, Any]:
    """Bytes per alloc the leader keeps, by RSS and by tracemalloc, each in a fresh interpreter.

    A system job places one alloc per node: ``allocs`` is then ignored."""
    out: dict[str, Any] = {
        "job_type": job_type,
        "allocs": nodes if job_type == JOB_TYPE_SYSTEM else allocs,
        "nodes": nodes,
        "python": sys.version.split()[0],
    }
    for mode in MODES:
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "tests.bench.alloc_memory",
                "--child",
                mode,
                "--allocs",
                str(allocs),
                "--nodes",
                str(nodes),
                "--job-type",
                job_type,
                "--top",
                str(top),
            ],
            cwd=REPO_ROOT,
            env={**os.environ, "PYTHONHASHSEED": "0"},
            capture_output=True,
            text=True,
            check=False,
        )
        if proc.returncode != 0:
            out[mode] = {"error": proc.stderr.strip().splitlines()[-5:]}
            continue
        out[mode] = json.loads(proc.stdout)
    return out


def summary_lines(doc: dict[str, Any]) -> Iterator[str]:
    rss, trace = doc.get("rss", {}), doc.get("trace", {})
    for mode in MODES:
        if "error" in doc.get(mode, {}):
            yield f"{mode}: failed: {doc[mode]['error']}"
    yield f"{doc['job_type']} job, {doc['allocs']} allocs on {doc['nodes']} nodes (python {doc['python']}), bytes per alloc:"
    yield f"  RSS         peak {rss.get('peak_bytes_per_alloc')}  settled {rss.get('settled_bytes_per_alloc')}"
    yield f"  tracemalloc peak {trace.get('peak_bytes_per_alloc')}  settled {trace.get('settled_bytes_per_alloc')}"
    for name, value in trace.get("by_holder_bytes_per_alloc", {}).items():
        yield f"    {name:<24} {value}"
    yield "  state store allocs, by field:"
    for name, value in trace.get("state_store_allocs_census_bytes_per_alloc", {}).items():
        if value >= 0.5:  # shared values: a few bytes per alloc at most
            yield f"    {name:<24} {value}"
    yield f"    {'(maps, indexes, rest)':<24} {trace.get('state_store_rest_bytes_per_alloc')}"
    yield "  top allocation sites still held:"
    for site in trace.get("top_sites_settled", []):
        yield f"    {site['bytes_per_alloc']:>8}  {site['site']}"


def save(doc: dict[str, Any], started: datetime, out_dir: Path = REPO_ROOT / "bench-results") -> Path:
    """Write ``doc`` as tests/bench/run.py writes a benchmark's document (name, timestamp,
    machine first), so the figures quoted in commits can be found again."""
    stamp = started.strftime("%Y%m%dT%H%M%SZ")
    machine = machine_info()
    full = {"name": NAME, "timestamp": started.strftime("%Y-%m-%dT%H:%M:%SZ"), "machine": machine, **doc}
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{NAME}-{stamp}.json"
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(full, indent=2) + "\n")
    os.replace(tmp, path)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--allocs", type=int, default=20_000)
    parser.add_argument("--nodes", type=int, default=1_000)
    parser.add_argument("--system", action="store_true", help="a system job: one alloc per node")
    parser.add_argument("--job-type", default=JOB_TYPE_SERVICE, help=argparse.SUPPRESS)
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument("--json", action="store_true", help="print the whole document as JSON")
    parser.add_argument(
        "--save", action="store_true", help="also write it to bench-results/alloc_memory-<UTC timestamp>.json"
    )
    parser.add_argument("--child", choices=MODES, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(measure_in_process(args.child, args.allocs, args.nodes, args.job_type, args.top)))
        return 0
    job_type = JOB_TYPE_SYSTEM if args.system else args.job_type
    started = datetime.now(UTC)
    doc = measure_alloc_memory(args.allocs, args.nodes, job_type, args.top)
    if args.save:
        print(f"saved to {save(doc, started)}", file=sys.stderr)
    if args.json:
        print(json.dumps(doc, indent=2))
    else:
        print("\n".join(summary_lines(doc)))
    return 0 if all("error" not in doc[m] for m in MODES) else 1


if __name__ == "__main__":
    sys.exit(main())
