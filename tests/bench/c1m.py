"""The C1M-like benchmark: a sustained placement run at the size of Nomad's scale tests,
then what the cluster costs at that size.

A 3-server LocalCluster and ``nodes`` simulated clients on the real client protocol
(tests/bench/fleet.py's simulator: register with a secret, heartbeat, alloc watch, every
placed alloc reported running), all registered before the clock starts. Then
``service_jobs`` service jobs of ``count`` allocs and ``system_jobs`` system jobs (one
alloc per node) are registered at once from ``register_threads`` threads. Measured:

* placements/s sustained: allocs in the leader's state (its job summaries, read every
  ``sample_interval_s`` as ``drover job status`` reads them) over the time from the first
  register call to the first sample that holds every alloc; beside it the rate between 10%
  and 90% placed, and the timeline;
* the leader's RSS (psutil on its pid): baseline before the first register, peak during
  placement, settled ``settle_s`` after;
* the snapshot at that size: ``operator snapshot save`` (Operator.SnapshotSave on the
  leader, timed from here) and the raft snapshot file write that log compaction performs
  (server/raft/snapshot_writer.py: ``to_snapshot`` of the tables, serialize, write,
  fsync), timed in this process on the same state, with the load a restarted server does
  (the servers' own compactions log no start, so they cannot be timed from outside; at
  these sizes the 20,000-entry threshold is rarely reached anyway). A state too big for
  one gRPC message (MAX_MESSAGE_BYTES) fails the save, which is recorded; the file write is
  then timed on the big tables read through the API piecewise;
* catch-up: a follower SIGKILLed and restarted, until its applied index reaches the
  leader's applied index at the restart (Operator.AgentInfo on each server);
* failover: the leader SIGKILLed, until a surviving server accepts a write (the
  scheduler config written back unchanged, a raft write that schedules nothing);
  ``failovers`` times, each killed leader restarted and caught up before the next kill.

Every node gets 1,000 MHz and 1 GiB (the fleet simulator's nodes); a service alloc asks
for 20 MHz and 40 MB, a system alloc for 20 MHz and 1 MB, so a node binpacked full of
service allocs (25) still has room for 24 system allocs. Failures are recorded in the
JSON, not raised. ``python -m tests.bench.c1m --nodes ... --service-jobs ... --count ...
--system-jobs ...`` runs one size; ``python -m tests.bench.run --only c1m`` runs the
issue's size (``--quick``: 1,000 nodes, 40 jobs of 500, 4 system jobs).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import statistics
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Final

import psutil

from deploy.cluster import LocalCluster
from drover.sdk import DroverClient, DroverError
from drover.server.codec import to_proto
from drover.server.jobspec import parse_jobspec
from drover.server.snapshot import from_snapshot, to_snapshot
from drover.v1 import api_pb2, raft_pb2, structs_pb2
from tests.bench import _procs, fleet
from tests.bench.heartbeats import (
    CLUSTER_WAIT_S,
    NODE_CPU_MHZ,
    NODE_MEMORY_MB,
    RPC_TIMEOUT_S,
    base_ttl_s,
    bench_cluster,
    failure_record,
)

NAME: Final = "c1m"
JOB_PREFIX: Final = "c1m-"
TARGET_PLACEMENTS_PER_S: Final = 5_000.0
TARGET_SNAPSHOT_WRITE_S: Final = 5.0
TARGET_FAILOVER_P50_S: Final = 2.0
TARGET_NODES: Final = 5_000
TARGET_ALLOCS: Final = 100_000
SERVICE_CPU_MHZ: Final = 20
SERVICE_MEMORY_MB: Final = 40
SYSTEM_CPU_MHZ: Final = 20
SYSTEM_MEMORY_MB: Final = 1
SERVER_ARGS: Final = fleet.SERVER_ARGS
PROBE_TIMEOUT_S: Final = 2.0
CATCH_UP_TIMEOUT_S: Final = 300.0
FAILOVER_TIMEOUT_S: Final = 60.0
TIMELINE_POINTS: Final = 120
SIM_RESULTS_WAIT_S: Final = 60.0


@dataclass(frozen=True, slots=True)
class C1MConfig:
    nodes: int = TARGET_NODES
    service_jobs: int = 200
    count: int = 500
    system_jobs: int = 20
    processes: int = 4
    failovers: int = 3
    register_threads: int = 8
    registration_timeout_s: float = 600.0
    settle_s: float = 10.0
    sample_interval_s: float = 0.5

    @classmethod
    def make(cls, *, quick: bool) -> C1MConfig:
        if quick:
            return cls(nodes=1_000, service_jobs=40, count=500, system_jobs=4, processes=2)
        return cls()

    def service_slots_per_node(self) -> int:
        return NODE_MEMORY_MB // SERVICE_MEMORY_MB

    def expected_allocs(self) -> int:
        return self.service_jobs * self.count + self.system_jobs * self.nodes

    def check(self) -> None:
        """Refuse a size whose allocs cannot all fit: binpacking fills a node with service
        allocs before the next, and every node must still take one alloc of each system job."""
        slots = self.service_slots_per_node()
        room = NODE_MEMORY_MB - slots * SERVICE_MEMORY_MB
        if self.system_jobs * SYSTEM_MEMORY_MB > room:
            raise ValueError(f"at most {room // SYSTEM_MEMORY_MB} system jobs fit beside full service nodes")
        if slots * SERVICE_CPU_MHZ + self.system_jobs * SYSTEM_CPU_MHZ > NODE_CPU_MHZ:
            raise ValueError("a full node's allocs would need more CPU than it has")
        if self.service_jobs * self.count > self.nodes * slots:
            raise ValueError(
                f"{self.service_jobs * self.count} service allocs exceed {self.nodes * slots} slots"
            )
        if min(self.nodes, self.processes) < 1 or min(self.service_jobs, self.count, self.system_jobs) < 0:
            raise ValueError("sizes must be positive")

    def placement_timeout_s(self) -> float:
        """Generous: 300 placements/s (a 1,000-node run placed 750/s on 2 cores), plus the
        first evals' imports."""
        return 120.0 + self.expected_allocs() / 300.0

    def budget_s(self) -> float:
        restarts = (1 + self.failovers) * (CATCH_UP_TIMEOUT_S / 2 + FAILOVER_TIMEOUT_S)
        return (
            3 * CLUSTER_WAIT_S
            + self.registration_timeout_s
            + self.placement_timeout_s()
            + self.settle_s
            + restarts
            + 4 * base_ttl_s(self.nodes)
            + 300.0
        )


# --- jobs -------------------------------------------------------------------------------------


def service_job_id(k: int) -> str:
    return f"{JOB_PREFIX}service-{k:04d}"


def system_job_id(k: int) -> str:
    return f"{JOB_PREFIX}system-{k:03d}"


def _job(job_id: str, job_type: str, group: str, cpu: int, memory: int) -> structs_pb2.Job:
    text = f"""
job "{job_id}" {{
  type        = "{job_type}"
  datacenters = ["dc1"]

  group "web" {{
    {group}

    task "server" {{
      driver = "mock"

      config {{
        run_for = "24h"
      }}

      resources {{
        cpu    = {cpu}
        memory = {memory}
      }}
    }}
  }}
}}
"""
    return to_proto(parse_jobspec(text, filename=f"{job_id}.hcl"), structs_pb2.Job())


def service_job(k: int, count: int) -> structs_pb2.Job:
    """``count`` allocs, waiting an hour for a node that misses heartbeats (as the fleet's)."""
    group = f'count = {count}\n    disconnect {{\n      lost_after = "1h"\n      replace = true\n    }}'
    return _job(service_job_id(k), "service", group, SERVICE_CPU_MHZ, SERVICE_MEMORY_MB)


def system_job(k: int) -> structs_pb2.Job:
    return _job(system_job_id(k), "system", "", SYSTEM_CPU_MHZ, SYSTEM_MEMORY_MB)


def jobs_in_order(cfg: C1MConfig) -> list[structs_pb2.Job]:
    """The service jobs with the system jobs spread among them, as they are registered."""
    jobs = [service_job(k, cfg.count) for k in range(cfg.service_jobs)]
    for k in range(cfg.system_jobs):
        at = (k + 1) * len(jobs) // (cfg.system_jobs + 1)
        jobs.insert(at, system_job(k))
    return jobs


def placed_in(response: api_pb2.JobListResponse) -> tuple[int, int, int]:
    """Over the bench's jobs: allocs in state (every summary bucket but queued: a
    replacement for an alloc on a node judged down counts as one more), those running, and
    those still queued (none once every eval has placed all it had)."""
    placed = running = queued = 0
    for summary in response.summaries:
        if not summary.job_id.startswith(JOB_PREFIX):
            continue
        for group in summary.summary.values():
            placed += (
                group.starting + group.running + group.complete + group.failed + group.lost + group.unknown
            )
            running += group.running
            queued += group.queued
    return placed, running, queued


# --- servers, seen one at a time --------------------------------------------------------------


class Servers:
    """One client per server address, for the calls every server answers for itself
    (Operator.AgentInfo: role, applied index); channels reconnect after a restart."""

    def __init__(self, cluster: LocalCluster) -> None:
        self.cluster = cluster
        self._clients = [
            DroverClient([a], timeout=PROBE_TIMEOUT_S, retry_deadline=PROBE_TIMEOUT_S)
            for a in cluster.grpc_addresses
        ]

    def raft(self, i: int) -> dict[str, str] | None:
        """Server ``i``'s raft section, or None while it does not answer."""
        try:
            info = self._clients[i].agent_info()
        except DroverError:
            return None
        return next((dict(s.values) for s in info.sections if s.name == "raft"), None)

    def applied(self, i: int) -> int | None:
        raft = self.raft(i)
        return int(raft["applied_index"]) if raft else None

    def leader(self, among: Sequence[int] | None = None) -> int | None:
        for i in among if among is not None else range(len(self._clients)):
            raft = self.raft(i)
            if raft is not None and raft.get("state") == "leader":
                return i
        return None

    def close(self) -> None:
        for client in self._clients:
            client.close()


def _leader_index(
    servers: Servers, among: Sequence[int] | None = None, timeout: float = CLUSTER_WAIT_S
) -> int:
    """The leader's index, once there is one (as a 1-tuple inside: index 0 is falsy, and
    wait_until waits for a truthy answer)."""

    def leader() -> tuple[int] | None:
        i = servers.leader(among)
        return None if i is None else (i,)

    (found,) = _procs.wait_until(leader, timeout, "a leader", interval=0.1)
    return int(found)


# --- the fleet --------------------------------------------------------------------------------


@dataclass(slots=True)
class _Fleet:
    """The fleet simulator's children (``python -m tests.bench.fleet sim``), run as that
    bench runs them: a control file they obey, a status file each writes."""

    cfg: C1MConfig
    base: Path
    cluster: LocalCluster
    children: list[_procs.Child]
    nonce: str = field(default_factory=lambda: os.urandom(3).hex())
    control: Path = field(init=False)
    sims: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.control = self.base / "control.json"
        _procs.write_json(self.control, {})

    def spawn(self, budget_s: float) -> None:
        per = -(-self.cfg.nodes // self.cfg.processes)
        servers = ",".join(self.cluster.grpc_addresses)
        for k in range(self.cfg.processes):
            first, count = k * per, min(per, self.cfg.nodes - k * per)
            if count <= 0:
                break
            name = f"sim{k}"
            argv = _procs.python_module_argv(
                fleet.MODULE, "sim", "--nonce", self.nonce, "--first", str(first), "--count", str(count),
                "--servers", servers, "--control", str(self.control), "--out", str(self.base / f"{name}.json"),
            )  # fmt: skip
            self.children.append(_procs.spawn(name, argv, self.base / f"{name}.log", budget_s))
            self.sims.append(name)

    def status(self, key: str) -> int:
        return sum(
            int((_procs.read_json(self.base / f"{name}.status.json") or {}).get(key, 0)) for name in self.sims
        )

    def stop(self) -> dict[str, Any]:
        """Stop the simulators; the errors their calls met, summed."""
        _procs.write_json(self.control, {"stop": True})
        errors: Counter[str] = Counter()
        samples: list[str] = []
        for name in self.sims:
            path = self.base / f"{name}.json"
            doc = _procs.wait_until(
                functools.partial(_procs.read_json, path), SIM_RESULTS_WAIT_S, f"{name} results"
            )
            errors.update(doc["errors"])
            samples.extend(doc["error_samples"][:3])
        return {"errors": dict(errors), "samples": samples}


# --- samplers ---------------------------------------------------------------------------------


class _Every:
    """``tick`` on a daemon thread every ``interval_s`` while the with-block runs."""

    def __init__(self, interval_s: float, tick: Callable[[], None]) -> None:
        self._interval_s = interval_s
        self._tick = tick
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="c1m-sampler", daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self._tick()
            self._stop.wait(self._interval_s)

    def __enter__(self) -> _Every:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=RPC_TIMEOUT_S + 5)


Sample = tuple[float, int, int, int]  # (monotonic time, placed, running, queued)


class _Placements:
    """(monotonic time, placed, running) from the leader's job summaries."""

    def __init__(self, api: DroverClient) -> None:
        self._api = api
        self.samples: list[Sample] = []
        self.errors = 0

    def tick(self) -> None:
        try:
            response = self._api.list_jobs(prefix=JOB_PREFIX)
        except DroverError:
            self.errors += 1
            return
        self.samples.append((time.monotonic(), *placed_in(response)))

    def all_placed(self, expected: int) -> bool:
        return bool(self.samples) and _done(self.samples[-1], expected)


class _Rss:
    """The RSS of one process, (monotonic time, bytes)."""

    def __init__(self, pid: int) -> None:
        self._proc = psutil.Process(pid)
        self.samples: list[tuple[float, int]] = []

    def tick(self) -> None:
        with contextlib.suppress(psutil.Error):
            self.samples.append((time.monotonic(), self._proc.memory_info().rss))

    def between(self, t0: float, t1: float) -> list[int]:
        return [rss for t, rss in list(self.samples) if t0 <= t <= t1]


def _mb(value: float) -> float:
    return round(value / 2**20, 1)


def _done(sample: Sample, expected: int) -> bool:
    return sample[1] >= expected and sample[3] == 0


def _time_at(samples: Sequence[Sample], at_least: float) -> float | None:
    return next((t for t, placed, _, _ in samples if placed >= at_least), None)


def placement_figures(samples: Sequence[Sample], started: float, expected: int) -> dict[str, Any]:
    """Sustained placements/s (first register call -> every alloc in state, none queued),
    the 10%-90% rate, and a timeline of at most TIMELINE_POINTS samples."""
    done = next((sample for sample in samples if _done(sample, expected)), None)
    end, placed, _, queued = done or (samples[-1] if samples else (started, 0, 0, 0))
    out: dict[str, Any] = {
        "expected_allocs": expected,
        "placed": placed,  # above expected by the replacements of allocs on nodes judged down
        "queued": queued,
        "complete": done is not None,
        "seconds": round(end - started, 2),
        # Sustained: the allocs asked for, over first register -> the last in state.
        "placements_per_s": round(min(placed, expected) / max(end - started, 1e-9), 1),
    }
    t10, t90 = _time_at(samples, 0.1 * expected), _time_at(samples, 0.9 * expected)
    out["placements_per_s_10_to_90"] = (
        round(0.8 * expected / (t90 - t10), 1) if t10 and t90 and t90 > t10 else None
    )
    out["first_alloc_s"] = round(t - started, 2) if (t := _time_at(samples, 1)) is not None else None
    step = max(1, len(samples) // TIMELINE_POINTS)
    out["timeline_columns"] = ["s", "placed", "running", "queued"]
    out["timeline"] = [[round(t - started, 2), p, r, q] for t, p, r, q in samples[::step]]
    return out


# --- the measurement --------------------------------------------------------------------------


def _wait_announced(api: DroverClient, servers: int) -> None:
    """Every server announced its gRPC address: followers can forward to the leader."""

    def announced() -> bool:
        peers = api.raft_peers().peers
        return len(peers) == servers and all(p.grpc_address for p in peers)

    _procs.wait_until(announced, CLUSTER_WAIT_S, "every server to announce its gRPC address", interval=0.2)


def _register_all(addresses: Sequence[str], jobs: Sequence[structs_pb2.Job], threads: int) -> list[str]:
    """Register ``jobs`` from ``threads`` threads at once; the errors met."""
    errors: list[str] = []
    with (
        DroverClient(addresses, timeout=RPC_TIMEOUT_S * 3, retry_deadline=CLUSTER_WAIT_S) as api,
        ThreadPoolExecutor(threads, thread_name_prefix="c1m-register") as pool,
    ):
        for future in [pool.submit(api.register_job, job) for job in jobs]:
            try:
                future.result()
            except DroverError as exc:
                errors.append(str(exc)[:200])
    return errors


def _place(
    cfg: C1MConfig, cluster: LocalCluster, api: DroverClient, leader: int, out: dict[str, Any]
) -> None:
    jobs = jobs_in_order(cfg)
    placements = _Placements(api)
    rss = _Rss(cluster.pid(leader) or 0)
    expected = cfg.expected_allocs()
    with _Every(0.2, rss.tick):
        time.sleep(1.0)  # the baseline
        with _Every(cfg.sample_interval_s, placements.tick):
            started = time.monotonic()
            register_errors = _register_all(cluster.grpc_addresses, jobs, cfg.register_threads)
            registered = time.monotonic()
            with contextlib.suppress(_procs.BenchError):  # a partial run is recorded, not raised
                _procs.wait_until(
                    lambda: placements.all_placed(expected) or _servers_down(cluster), cfg.placement_timeout_s(),
                    f"{expected} allocs in state", interval=0.2,
                )  # fmt: skip
        placed_at = time.monotonic()
        time.sleep(cfg.settle_s)
        settled_at = time.monotonic()
    out["register"] = {
        "jobs": len(jobs),
        "seconds": round(registered - started, 2),
        "errors": len(register_errors),
        "error_samples": register_errors[:3],
    }
    out["placement"] = placement_figures(placements.samples, started, expected)
    out["placement"]["summary_read_errors"] = placements.errors
    out["placement"]["servers_down"] = _servers_down(cluster)
    before = rss.between(started - 1.0, started)
    during = rss.between(started, placed_at)
    after = rss.between(settled_at - 1.0, settled_at)
    if before and during and after:
        baseline, peak, settled = statistics.median(before), max(during), statistics.median(after)
        placed = max(out["placement"]["placed"], 1)
        out["leader_rss"] = {
            "baseline_mb": _mb(baseline),
            "peak_mb": _mb(peak),
            "settled_mb": _mb(settled),
            "settled_after_s": cfg.settle_s,
            "peak_bytes_per_alloc": round((peak - baseline) / placed, 1),
            "settled_bytes_per_alloc": round((settled - baseline) / placed, 1),
        }


def _snapshot(api: DroverClient, base: Path, cluster: LocalCluster) -> dict[str, Any]:
    """``operator snapshot save`` on the leader, then the raft snapshot file's write (and
    load) in this process on the same state, as server/raft/snapshot_writer.py does them."""
    out: dict[str, Any] = {
        "compactions_logged": {
            name: cluster.log(i).count("raft.snapshot_written") for i, name in enumerate(cluster.server_names)
        }
    }
    t0 = time.perf_counter()
    try:
        state = api.snapshot_save().snapshot
        out["operator_save_s"] = round(time.perf_counter() - t0, 3)
        out["state_from"] = "operator snapshot save"
    except DroverError as exc:
        out["operator_save_error"] = str(exc)[:300]
        state = state_from_reads(api)
        out["state_from"] = "API reads (allocs job by job, nodes, jobs, summaries, evals)"
    out.update(bytes=state.ByteSize(), allocs=len(state.allocs), index=state.index)
    tables = from_snapshot(state)
    del state
    path = base / "c1m-raft-snapshot.writing"
    t0 = time.perf_counter()
    msg = raft_pb2.RaftSnapshotFile(state=to_snapshot(tables))
    with open(path, "wb") as f:
        f.write(msg.SerializeToString())
        f.flush()
        os.fsync(f.fileno())
    out["raft_file_write_s"] = round(time.perf_counter() - t0, 3)
    out["raft_file_bytes"] = path.stat().st_size
    del msg, tables
    t0 = time.perf_counter()
    from_snapshot(raft_pb2.RaftSnapshotFile.FromString(path.read_bytes()).state)
    out["raft_file_load_s"] = round(time.perf_counter() - t0, 3)
    path.unlink()
    return out


def state_from_reads(api: DroverClient) -> raft_pb2.StateSnapshot:
    """The state's big tables read through the API in pieces that each fit in one message,
    for a state too big for Operator.SnapshotSave's (MAX_MESSAGE_BYTES): what the raft
    snapshot file is mostly made of, without the small tables (versions, ACLs, servers)."""
    jobs = api.list_jobs()
    state = raft_pb2.StateSnapshot(index=jobs.meta.index)
    state.jobs.extend(jobs.jobs)
    state.job_summaries.extend(jobs.summaries)
    state.nodes.extend(api.list_nodes().nodes)
    state.evals.extend(api.list_evals().evals)
    for job in jobs.jobs:
        state.allocs.extend(api.list_allocs(job_id=job.id, namespace=job.namespace).allocs)
    return state


def _restart_and_catch_up(servers: Servers, i: int) -> dict[str, Any]:
    """Restart server ``i`` (down); until it answers, and until its applied index reaches
    the leader's applied index at the restart."""
    cluster = servers.cluster
    others = [j for j in range(len(cluster.server_names)) if j != i]
    leader = _leader_index(servers, others)
    cluster.restart(i)
    restarted = time.monotonic()
    target = servers.applied(leader) or 0
    _procs.wait_until(
        lambda: servers.applied(i) is not None, CATCH_UP_TIMEOUT_S, "the restarted server to answer"
    )
    answering = time.monotonic()
    _procs.wait_until(
        lambda: (servers.applied(i) or 0) >= target,
        CATCH_UP_TIMEOUT_S,
        f"applied index {target}",
        interval=0.1,
    )
    return {
        "server": cluster.server_names[i],
        "target_index": target,
        "answering_s": round(answering - restarted, 2),
        "caught_up_s": round(time.monotonic() - restarted, 2),
    }


def _follower_catch_up(servers: Servers) -> dict[str, Any]:
    leader = _leader_index(servers)
    follower = (leader + 1) % len(servers.cluster.server_names)
    servers.cluster.kill(follower)
    time.sleep(1.0)  # down long enough to miss some entries
    return _restart_and_catch_up(servers, follower)


def _write_accepted(addresses: Sequence[str], config: structs_pb2.SchedulerConfig, deadline: float) -> None:
    with DroverClient(addresses, timeout=PROBE_TIMEOUT_S, retry_deadline=PROBE_TIMEOUT_S) as api:
        while True:
            try:
                api.scheduler_set_config(config)
                return
            except DroverError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.02)


def _failover(servers: Servers, config: structs_pb2.SchedulerConfig) -> dict[str, Any]:
    """SIGKILL the leader; until a survivor accepts a write; then the killed one restarted."""
    cluster = servers.cluster
    leader = _leader_index(servers)
    survivors = [j for j in range(len(cluster.server_names)) if j != leader]
    killed_at = time.monotonic()
    cluster.kill(leader)
    _write_accepted([cluster.grpc_addresses[j] for j in survivors], config, killed_at + FAILOVER_TIMEOUT_S)
    failover_s = time.monotonic() - killed_at
    new_leader = _leader_index(servers, survivors)
    return {
        "killed": cluster.server_names[leader],
        "new_leader": cluster.server_names[new_leader],
        "write_accepted_s": round(failover_s, 3),
        "restart": _restart_and_catch_up(servers, leader),
    }


def _servers_down(cluster: LocalCluster) -> list[str]:
    """Servers whose process has exited (none is stopped on purpose during placement)."""
    return [name for i, name in enumerate(cluster.server_names) if not cluster.is_alive(i)]


def crash_dumps(cluster: LocalCluster) -> dict[str, str]:
    """Each exited server's faulthandler dump (run with PYTHONFAULTHANDLER=1), from its
    first line: the crashing thread comes first, and the temp dir goes with the cluster."""
    dumps: dict[str, str] = {}
    for i in range(len(cluster.server_names)):
        log = cluster.log(i)
        if not cluster.is_alive(i) and (at := log.find("Fatal Python error")) >= 0:
            dumps[cluster.server_names[i]] = log[at : at + 60_000]
    return dumps


def _not_ready(api: DroverClient) -> int:
    """Simulated nodes a server judged down (none is ever paused: each is a false down)."""
    return sum(1 for n in api.list_nodes(prefix="hb-").nodes if n.status != "ready")


def _measure(
    cfg: C1MConfig, base: Path, cluster: LocalCluster, children: list[_procs.Child], out: dict[str, Any]
) -> None:
    """Fill ``out`` phase by phase: what was measured before a failure is kept."""
    with DroverClient(
        cluster.grpc_addresses, timeout=RPC_TIMEOUT_S * 3, retry_deadline=CLUSTER_WAIT_S
    ) as api:
        _wait_announced(api, len(cluster.server_names))
        servers = Servers(cluster)
        fleet_sims = _Fleet(cfg, base, cluster, children)
        try:
            started = time.monotonic()
            fleet_sims.spawn(cfg.budget_s())
            _procs.wait_until(
                lambda: fleet_sims.status("registered") >= cfg.nodes, cfg.registration_timeout_s,
                "every node registered", children, interval=0.5,
            )  # fmt: skip
            out["nodes_registered_s"] = round(time.monotonic() - started, 2)
            leader = _leader_index(servers)
            _place(cfg, cluster, api, leader, out)
            if down := out["placement"]["servers_down"]:
                raise _procs.BenchError(f"server(s) {', '.join(down)} exited during placement")
            out["nodes_not_ready_after_placement"] = _not_ready(api)
            out["snapshot"] = _snapshot(api, base, cluster)
            out["follower_catch_up"] = _follower_catch_up(servers)
            config = api.scheduler_get_config().config
            out["failovers"] = []
            for _ in range(cfg.failovers):
                out["failovers"].append(_failover(servers, config))
            times = [f["write_accepted_s"] for f in out["failovers"]]
            out["failover_p50_s"] = round(statistics.median(times), 3) if times else None
            out["nodes_not_ready_at_end"] = _not_ready(api)
        finally:
            servers.close()
            with contextlib.suppress(_procs.BenchError):
                out["fleet"] = fleet_sims.stop() if fleet_sims.sims else {}


def run_c1m(cfg: C1MConfig) -> dict[str, Any]:
    """The whole benchmark on one fresh cluster; failures are recorded, not raised."""
    cfg.check()
    errors: list[str] = []
    results: dict[str, Any] = {}
    # A server that crashes dumps every thread's stack into its log (servers inherit this
    # process's environment): both full-size runs so far lost servers to SIGSEGV in grpcio.
    os.environ.setdefault("PYTHONFAULTHANDLER", "1")
    try:
        with bench_cluster("drover-bench-c1m-", cfg.budget_s(), SERVER_ARGS) as (base, cluster, children):
            try:
                _measure(cfg, base, cluster, children, results)
            except Exception as exc:
                failure, line = failure_record(exc)
                results.update(failure, servers_down=_servers_down(cluster))
                results["logs_tail"] = cluster.logs_tail(40)[-12000:]
                results["crash_dumps"] = crash_dumps(cluster)
                errors.append(line)
    except _procs.BenchError as exc:
        errors.append(str(exc).splitlines()[0][:300])
        results.setdefault("error", str(exc)[:4000])
    placement = results.get("placement", {})
    snap = results.get("snapshot", {})
    p50 = results.get("failover_p50_s")
    targets_met = {
        "placements_per_s": placement.get("complete", False)
        and placement.get("placements_per_s", 0) >= TARGET_PLACEMENTS_PER_S,
        "snapshot_write_s": snap.get("raft_file_write_s", 1e9) < TARGET_SNAPSHOT_WRITE_S,
        "failover_p50_s": p50 is not None and p50 < TARGET_FAILOVER_P50_S,
        "at_target_scale": cfg.nodes >= TARGET_NODES and cfg.expected_allocs() >= TARGET_ALLOCS,
    }
    return {
        "config": {**asdict(cfg), "expected_allocs": cfg.expected_allocs(), "server_args": list(SERVER_ARGS)},
        "results": results,
        "targets": {
            "placements_per_s_min": TARGET_PLACEMENTS_PER_S,
            "snapshot_write_s_max": TARGET_SNAPSHOT_WRITE_S,
            "failover_p50_s_max": TARGET_FAILOVER_P50_S,
        },
        "targets_met": targets_met,
        "errors": errors,
    }


def summary_lines(doc: dict[str, Any]) -> list[str]:
    res = doc.get("results", {})
    cfg = doc.get("config", {})
    lines = [
        f"  {cfg.get('nodes')} nodes, {cfg.get('service_jobs')} service jobs x {cfg.get('count')} + "
        f"{cfg.get('system_jobs')} system jobs = {cfg.get('expected_allocs')} allocs"
    ]
    if res.get("error"):
        lines.append(
            f"  ERROR {str(res['error']).splitlines()[0][:300]}; servers down: {res.get('servers_down')}"
        )
    p = res.get("placement", {})
    if p:
        lines.append(
            f"  placed {p['placed']}/{p['expected_allocs']} in {p['seconds']} s: {p['placements_per_s']}/s "
            f"sustained ({p['placements_per_s_10_to_90']}/s from 10% to 90%); nodes registered in "
            f"{res.get('nodes_registered_s')} s"
            + ("" if p["complete"] else f"; INCOMPLETE, {p['queued']} queued")
        )
        lines.append(
            f"  nodes judged down (false downs): {res.get('nodes_not_ready_after_placement')} after placement, "
            f"{res.get('nodes_not_ready_at_end')} at the end"
        )
    if rss := res.get("leader_rss"):
        lines.append(
            f"  leader RSS {rss['baseline_mb']} -> peak {rss['peak_mb']} MB, settled {rss['settled_mb']} MB "
            f"({rss['settled_bytes_per_alloc']} B/alloc settled)"
        )
    if snap := res.get("snapshot"):
        lines.append(
            f"  snapshot: operator save {snap.get('operator_save_s') or snap.get('operator_save_error')} s "
            f"({snap.get('allocs')} allocs, {snap.get('bytes')} B), raft file write "
            f"{snap.get('raft_file_write_s')} s, load {snap.get('raft_file_load_s')} s"
        )
    if catch := res.get("follower_catch_up"):
        lines.append(
            f"  follower restart: answering {catch['answering_s']} s, caught up {catch['caught_up_s']} s"
        )
    for f in res.get("failovers", []):
        lines.append(
            f"  failover {f['killed']} -> {f['new_leader']}: write accepted after {f['write_accepted_s']} s; "
            f"restarted and caught up in {f['restart']['caught_up_s']} s"
        )
    lines.append(f"  failover p50 {res.get('failover_p50_s')} s   targets met: {doc.get('targets_met')}")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    """One run at a chosen size, its JSON written as tests.bench.run writes it."""
    from tests.bench import run  # run imports this module: only here, not at the top

    defaults = C1MConfig()
    parser = argparse.ArgumentParser(prog="python -m tests.bench.c1m", description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=defaults.nodes)
    parser.add_argument("--service-jobs", type=int, default=defaults.service_jobs)
    parser.add_argument("--count", type=int, default=defaults.count, help="allocs per service job")
    parser.add_argument("--system-jobs", type=int, default=defaults.system_jobs)
    parser.add_argument(
        "--processes", type=int, help="fleet simulator processes (default: 1 per 1,250 nodes)"
    )
    parser.add_argument("--failovers", type=int, default=defaults.failovers)
    parser.add_argument("--out-dir", type=Path, default=run.DEFAULT_OUT_DIR)
    args = parser.parse_args(argv)
    cfg = C1MConfig(
        nodes=args.nodes,
        service_jobs=args.service_jobs,
        count=args.count,
        system_jobs=args.system_jobs,
        processes=args.processes or max(1, min(4, -(-args.nodes // 1_250))),
        failovers=args.failovers,
    )
    try:
        cfg.check()
    except ValueError as exc:
        parser.error(str(exc))
    bench = run.Benchmark(
        run=lambda _opts: run_c1m(cfg), summary=summary_lines, budget_s=lambda _opts: cfg.budget_s()
    )
    path, doc = run.run_one(
        NAME,
        bench,
        quick=False,
        duration=None,
        profile=False,
        wait_quiet_s=0.0,
        out_dir=args.out_dir.resolve(),
    )
    print(f"{NAME}: wrote {os.path.relpath(path)}")
    for line in summary_lines(doc):
        print(line)
    return 1 if doc.get("errors") else 0


if __name__ == "__main__":
    sys.exit(main())
