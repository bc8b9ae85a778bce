"""drover's write path end to end: Jobs.Register against a 3-server LocalCluster.

Each client thread has its own DroverClient (its own channel) pointed at one server: the
leader, or a follower to show what forwarding costs. The jobs are periodic batch jobs,
which are templates (no evaluation is created, so nothing is scheduled): the measured path
is gRPC -> validation -> raft commit on a majority -> FSM apply -> response. Job IDs cycle
over a few hundred names and every write carries a new meta value, so each one is a real
new version of its job.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal

from deploy.cluster import LocalCluster
from drover.sdk import DroverClient, DroverError
from drover.v1 import structs_pb2
from tests.bench._load import Operation, closed_loop
from tests.bench._procs import MAX_SECONDS_ENV, PARENT_PID_ENV, BenchError
from tests.bench._pyspy import recording, thread_cpu_by_role
from tests.bench._stats import rss_mb

JOB_IDS: Final = 500
OP_TIMEOUT_S: Final = 10.0
CLUSTER_WAIT_S: Final = 60.0
AGENT_MODULE: Final = "tests.bench._agent"
# Never fires during a run: the jobs stay templates and nothing is ever launched.
PERIODIC_SPEC: Final = "0 0 1 1 *"

Via = Literal["leader", "follower"]


@dataclass(frozen=True, slots=True)
class RegisterRun:
    concurrency: int
    via: Via
    profile: bool = False


def bench_job() -> structs_pb2.Job:
    """A small periodic batch job (a template: registering it creates no evaluation)."""
    task = structs_pb2.Task(
        name="work",
        driver="mock",
        config_json='{"run_for": "1s"}',
        resources=structs_pb2.Resources(cpu_mhz=100, memory_mb=64),
    )
    return structs_pb2.Job(
        type="batch",
        datacenters=["dc1"],
        periodic=structs_pb2.PeriodicConfig(enabled=True, spec=PERIODIC_SPEC, time_zone="UTC"),
        groups=[structs_pb2.TaskGroup(name="g", count=1, tasks=[task])],
    )


@contextlib.contextmanager
def _registrar(address: str, label: str, sequence: Iterator[int]) -> Iterator[Operation]:
    client = DroverClient([address], timeout=OP_TIMEOUT_S, retry_deadline=OP_TIMEOUT_S)
    job = bench_job()

    def op() -> None:
        seq = next(sequence)
        job.id = job.name = f"bench-{seq % JOB_IDS:03d}"
        job.meta["write"] = f"{label}-{seq}"
        client.register_job(job)

    try:
        yield op
    finally:
        client.close()


def _applied_index(cluster: LocalCluster, i: int) -> int | None:
    answer = cluster.query_digest(i)
    return None if answer is None else int(answer.applied_index)


def _servers_rss(cluster: LocalCluster) -> dict[str, float | None]:
    out: dict[str, float | None] = {}
    for i, name in enumerate(cluster.server_names):
        pid = cluster.pid(i)
        out[name] = rss_mb(pid) if pid is not None else None
    return out


def _forwarding_ready(cluster: LocalCluster, leader: int) -> None:
    """One write through each follower: forwarding needs the leader's row in the servers table."""
    job = bench_job()
    for i in range(len(cluster.server_names)):
        if i == leader:
            continue
        job.id = job.name = f"bench-warmup-{i}"
        with DroverClient([cluster.grpc_addresses[i]], timeout=5.0, retry_deadline=CLUSTER_WAIT_S) as client:
            client.register_job(job)


def _one_run(
    cluster: LocalCluster, run: RegisterRun, warmup: float, duration: float, profile_path: Path | None
) -> dict[str, Any]:
    leader = cluster.leader_index(CLUSTER_WAIT_S)
    n = len(cluster.server_names)
    target = leader if run.via == "leader" else (leader + 1) % n
    pids: dict[str, int] = {"bench_client": os.getpid()}
    for i in range(n):
        pid = cluster.pid(i)
        role = "leader" if i == leader else f"follower_{cluster.server_names[i]}"
        if pid is not None:
            pids[role] = pid
    leader_pid = pids["leader"]
    rss_before = rss_mb(leader_pid)
    applied_before = _applied_index(cluster, leader)
    label = f"c{run.concurrency}-{run.via}-{time.monotonic_ns()}"
    sequence = itertools.count()
    profile: contextlib.AbstractContextManager[dict[str, Any]] = (
        recording(leader_pid, profile_path, seconds=warmup + duration)
        if profile_path is not None
        else contextlib.nullcontext({})
    )
    with profile as profile_info:
        result = closed_loop(
            lambda _i: _registrar(cluster.grpc_addresses[target], label, sequence),
            threads=run.concurrency,
            warmup=warmup,
            duration=duration,
            cpu_pids=pids,
            op_timeout=OP_TIMEOUT_S,
            threads_of="leader",
        )
    applied_after = _applied_index(cluster, leader)
    leader_after = cluster.leader_index(CLUSTER_WAIT_S)
    out: dict[str, Any] = {
        "concurrency": run.concurrency,
        "via": run.via,
        "target": cluster.server_names[target],
        "leader": cluster.server_names[leader],
        **result.summary(),
    }
    out["writes_per_s"] = out["per_s"]
    out["leader_threads"] = thread_cpu_by_role(leader_pid, result.thread_percent, out["writes_per_s"])
    out["leader_rss_mb_before"] = rss_before
    out["leader_rss_mb_after"] = rss_mb(leader_pid)
    if applied_before is not None and applied_after is not None:
        out["raft_entries_applied"] = applied_after - applied_before
    if leader_after != leader:
        out["leader_changed_to"] = cluster.server_names[leader_after]
    if profile_path is not None:
        out["profiled"] = True
        out["py_spy"] = profile_info
    return out


def measure_drover_register(
    runs: list[RegisterRun],
    *,
    warmup: float,
    duration: float,
    profile_dir: Path | None = None,
    before_run: Callable[[str], None] | None = None,
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Run ``runs`` one after the other on one fresh 3-server cluster.

    ``before_run`` is called with each run's name before it starts (to let the machine
    settle).

    Returns the runs' results and facts about the cluster (servers' RSS at start and end,
    and whether all servers converged to one state digest afterwards).
    """
    max_seconds = 120.0 + len(runs) * (warmup + duration + 60.0)
    env = {PARENT_PID_ENV: str(os.getpid()), MAX_SECONDS_ENV: f"{max_seconds:.0f}"}
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="drover-bench-cluster-") as tmp:
        cluster = LocalCluster(Path(tmp), servers=3, env=env, agent_module=AGENT_MODULE)
        with cluster:
            started = time.monotonic()
            leader = cluster.leader_index(CLUSTER_WAIT_S)
            try:
                _forwarding_ready(cluster, leader)
            except DroverError as exc:
                raise BenchError(f"cluster not writable: {exc}\n{cluster.logs_tail()}") from exc
            info: dict[str, Any] = {
                "ready_after_s": round(time.monotonic() - started, 2),
                "rss_mb_start": _servers_rss(cluster),
            }
            for run in runs:
                if before_run is not None:
                    before_run(f"drover c{run.concurrency} {run.via}")
                path = None
                if run.profile and profile_dir is not None:
                    path = profile_dir / f"leader-c{run.concurrency}-{run.via}.pyspy.txt"
                results.append(_one_run(cluster, run, warmup, duration, path))
            info["rss_mb_end"] = _servers_rss(cluster)
            try:
                digest, index = cluster.wait_converged(CLUSTER_WAIT_S)
                info["converged"] = {"applied_index": index, "digest": digest[:16]}
            except Exception as exc:
                info["converged"] = False
                info["convergence_error"] = str(exc)[:2000]
    return results, info
