"""Ceiling B: bare pysyncobj, three processes on loopback, tuned exactly like server/raft/tuning.py.

Each node is ``python -m tests.bench.raft_bare --self ADDR --peers A,B --dir D``. It writes
its raft status to ``D/<addr>.status.json`` every 50 ms. The parent waits for one ready
leader that both followers agree on, then writes ``D/go.json`` naming it and the schedule;
the leader proposes a ``@replicated`` counter increment carrying a ~200-byte payload from
several threads with a fixed number in flight, measures commit latency (propose ->
callback on the leader) and writes ``D/<addr>.result.json``.
"""

from __future__ import annotations

import argparse
import itertools
import os
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Final

from pysyncobj import SyncObj, SyncObjConf, replicated
from pysyncobj.config import FAIL_REASON

from deploy.cluster import pick_free_ports
from drover.server.raft.tuning import RaftTuning, tuned_conf
from tests.bench import _procs
from tests.bench._stats import CpuProbe, OpRecord, WindowStats

STATUS_INTERVAL_S: Final = 0.05
DRAIN_TIMEOUT_S: Final = 10.0
GO_FILE: Final = "go.json"


def make_conf(tuning: RaftTuning, data_dir: Path) -> SyncObjConf:
    """The SyncObjConf of drover.server.raft.RaftNode, minus drover's snapshot hooks."""
    return tuned_conf(
        tuning, journal_file=str(data_dir / "journal.bin"), full_dump_file=str(data_dir / "dump.bin")
    )


class BenchCounter(SyncObj):  # type: ignore[misc]
    def __init__(self, self_address: str, peers: list[str], conf: SyncObjConf) -> None:
        self.count = 0
        self.payload_bytes = 0
        super().__init__(self_address, peers, conf)

    @replicated  # type: ignore[untyped-decorator]
    def add(self, payload: bytes) -> int:
        self.count += 1
        self.payload_bytes += len(payload)
        return self.count

    def leader_ready(self) -> bool:
        noop = self._SyncObj__noopIDx
        return bool(self._isLeader()) and noop is not None and self.raftLastApplied >= noop

    def status(self) -> dict[str, Any]:
        leader = self._getLeader()
        return {
            "is_leader": bool(self._isLeader()),
            "leader_ready": self.leader_ready(),
            "leader": None if leader is None else str(leader.id),
            "connected": sum(1 for n in self.otherNodes if self.isNodeConnected(n)),
            "term": int(self.raftCurrentTerm),
            "commit_index": int(self.raftCommitIndex),
            "last_applied": int(self.raftLastApplied),
            "count": self.count,
        }


def _file_name(address: str) -> str:
    return address.replace(":", "_")


def _propose_load(node: BenchCounter, go: dict[str, Any]) -> dict[str, Any]:
    """Keep ``inflight`` proposals outstanding from ``threads`` threads; measure the window."""
    inflight = int(go["inflight"])
    payload = os.urandom(int(go["payload_bytes"]))
    slots = threading.BoundedSemaphore(inflight)
    stop = threading.Event()
    records: list[OpRecord] = []
    failures: dict[str, int] = {}
    issued = itertools.count()
    fail_names = {v: k for k, v in vars(FAIL_REASON).items() if isinstance(v, int)}

    def propose() -> None:
        while not stop.is_set():
            if not slots.acquire(timeout=0.5):
                continue
            start = time.perf_counter()

            def done(_result: Any, error: int, start: float = start) -> None:
                records.append(OpRecord(start, time.perf_counter(), error == FAIL_REASON.SUCCESS))
                if error != FAIL_REASON.SUCCESS:
                    name = fail_names.get(error, str(error))
                    failures[name] = failures.get(name, 0) + 1
                slots.release()

            next(issued)
            node.add(payload, callback=done)

    # The parent scheduled the run in wall-clock time, so it can sample CPU use alongside.
    begin = time.perf_counter() + (float(go["start_at"]) - time.time())
    window_start = begin + float(go["warmup"])
    window_end = window_start + float(go["duration"])
    threads = [
        threading.Thread(target=propose, name=f"propose-{i}", daemon=True) for i in range(int(go["threads"]))
    ]
    _sleep_until(begin)
    for thread in threads:
        thread.start()
    _sleep_until(window_end)
    stop.set()
    for thread in threads:
        thread.join(timeout=5.0)
    total = next(issued)
    drain_deadline = time.monotonic() + DRAIN_TIMEOUT_S
    while len(records) < total and time.monotonic() < drain_deadline:
        time.sleep(0.01)
    stats = WindowStats(window_start, window_end, list(records))
    out = stats.summary()
    out.update(
        commits_per_s=out["per_s"],
        issued=total,
        callbacks=len(records),
        failures=failures,
        final_status=node.status(),
    )
    return out


def node_main(self_address: str, peers: list[str], run_dir: Path) -> int:
    stop = _procs.child_stop_event()
    name = _file_name(self_address)
    data_dir = run_dir / name
    data_dir.mkdir(parents=True, exist_ok=True)
    node = BenchCounter(self_address, peers, make_conf(RaftTuning(), data_dir))
    status_path = run_dir / f"{name}.status.json"
    ran = False
    try:
        while not stop.wait(STATUS_INTERVAL_S):
            _procs.write_json(status_path, node.status())
            go = _procs.read_json(run_dir / GO_FILE)
            if not ran and go is not None and go["leader"] == self_address:
                ran = True
                _procs.write_json(run_dir / f"{name}.result.json", _propose_load(node, go))
    finally:
        node.destroy()
        thread = node._SyncObj__thread
        if thread is not None:
            thread.join(timeout=5.0)
    return 0


def _sleep_until(t: float) -> None:
    while (remaining := t - time.perf_counter()) > 0:
        time.sleep(min(remaining, 0.5))


# --- the parent side ----------------------------------------------------------------------


def _ready_leader(run_dir: Path, addresses: list[str]) -> str | None:
    """The one leader that is ready and connected and that every node names, if there is one."""
    statuses = [_procs.read_json(run_dir / f"{_file_name(a)}.status.json") for a in addresses]
    if any(s is None for s in statuses):
        return None
    leaders = [a for a, s in zip(addresses, statuses, strict=True) if s["is_leader"]]
    if len(leaders) != 1:
        return None
    (leader,) = leaders
    lead = statuses[addresses.index(leader)]
    if not lead["leader_ready"] or lead["connected"] != len(addresses) - 1:
        return None
    return leader if all(s["leader"] == leader for s in statuses) else None


def measure_pysyncobj_bare(
    *, inflight: int, threads: int, payload_bytes: int, warmup: float, duration: float
) -> dict[str, Any]:
    """Commits/s and commit latency of bare pysyncobj, 3 nodes on loopback."""
    max_seconds = warmup + duration + 120.0
    addresses = [f"127.0.0.1:{p}" for p in pick_free_ports(3)]
    with (
        tempfile.TemporaryDirectory(prefix="drover-bench-raft-") as tmp,
        _procs.children_stopped_on_exit() as kids,
    ):
        run_dir = Path(tmp)
        by_address: dict[str, _procs.Child] = {}
        for i, address in enumerate(addresses):
            peers = ",".join(a for a in addresses if a != address)
            argv = _procs.python_module_argv(
                "tests.bench.raft_bare", "--self", address, "--peers", peers, "--dir", str(run_dir)
            )
            child = _procs.spawn(f"raft-{i + 1}", argv, run_dir / f"node{i + 1}.log", max_seconds)
            kids.append(child)
            by_address[address] = child
        leader = _procs.wait_until(
            lambda: _ready_leader(run_dir, addresses), 60.0, "a ready raft leader", kids
        )
        start_at = time.time() + 0.3
        go = {
            "leader": leader,
            "start_at": start_at,
            "warmup": warmup,
            "duration": duration,
            "inflight": inflight,
            "threads": threads,
            "payload_bytes": payload_bytes,
        }
        _procs.write_json(run_dir / GO_FILE, go)
        others = [a for a in addresses if a != leader]
        pids = {"leader": by_address[leader].pid, "bench_parent": os.getpid()}
        pids.update({f"follower_{i + 1}": by_address[a].pid for i, a in enumerate(others)})
        probe = CpuProbe(pids)
        _sleep_until_wall(start_at + warmup)
        probe.start(time.monotonic())
        _sleep_until_wall(start_at + warmup + duration)
        cpu = probe.stop(time.monotonic())
        result_path = run_dir / f"{_file_name(leader)}.result.json"
        result: dict[str, Any] = _procs.wait_until(
            lambda: _procs.read_json(result_path), DRAIN_TIMEOUT_S + 30.0, "the leader's result", kids
        )
        follower_status = [_procs.read_json(run_dir / f"{_file_name(a)}.status.json") for a in others]
    result["cpu_percent_of_one_core"] = cpu
    result["follower_status"] = follower_status
    result.update(inflight=inflight, proposer_threads=threads, payload_bytes=payload_bytes)
    result["tuning"] = {k: getattr(RaftTuning(), k) for k in RaftTuning.__dataclass_fields__}
    return result


def _sleep_until_wall(t: float) -> None:
    while (remaining := t - time.time()) > 0:
        time.sleep(min(remaining, 0.5))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="one bare pysyncobj node of the foundation benchmark")
    parser.add_argument("--self", dest="self_address", required=True)
    parser.add_argument("--peers", required=True, help="comma-separated raft addresses of the others")
    parser.add_argument("--dir", type=Path, required=True)
    args = parser.parse_args(argv)
    return node_main(args.self_address, [p for p in args.peers.split(",") if p], args.dir)


if __name__ == "__main__":
    raise SystemExit(main())
