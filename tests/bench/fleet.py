"""The fleet benchmark: thousands of clients speaking the real client protocol to a
3-server cluster, through a leader failover.

Each simulated client does what the client agent (client_agent/) does, over grpc.aio in a
few child processes (``python -m tests.bench.fleet sim ...``, one asyncio loop each, one
coroutine pair per client):

* ``Nodes.Register`` with the node's secret; again after a failed heartbeat or a refused
  report (the agent's rule; a failed watch only backs off);
* ``UpdateStatus(ready)`` every half of the TTL the leader returned, as a message on its
  ``Nodes.Heartbeat`` stream, as the agent beats (client_agent/rpc.py);
* its alloc watch: a blocking ``Nodes.GetClientAllocs(min_index=last index)`` held open
  (at most ``WATCH_WAIT_S``), forwarded to the leader by a follower as for real clients;
* ``Nodes.UpdateAllocs``: every alloc placed on it reported ``running``, as its runner would;
* its tunnel: one ``Nodes.Connect`` stream held open to its current server (the hello with
  its secret, then nothing asked of it), opened again after it breaks.

A call that fails ``UNAVAILABLE`` (its server is gone) moves the client to the next server.

The benchmark process registers a service job (``job_count`` allocs, one per client that
gets one), then holds the fleet for ``duration_s`` while it reads the jobs table as
``drover job status`` does (``Jobs.List`` on the leader, every ``READ_INTERVAL_S``), and
SIGKILLs the leader at ``failover_at_s``. Measured: heartbeat latency (p50/p99, before and
after the failover), the job-status read latency, false downs (a node never paused that a
server judged anyway: its "heartbeat missed" log line or node event, or a non-ready status
seen by a poller), and how long after the kill each client's heartbeat was accepted again
(by the new leader: heartbeats are writes), against the failover TTL the new leader gives.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import os
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import grpc

from deploy.cluster import LocalCluster
from drover.client.sync import heartbeat_timeout_s
from drover.common.gc_pauses import GC_PAUSE_METRIC
from drover.sdk import DroverClient, DroverError
from drover.server.telemetry.loop_lag import API_LOOP_LAG_SECONDS
from drover.server.telemetry.metrics import RPC_SECONDS
from drover.server.telemetry.rpc import method_label
from drover.v1 import api_pb2, api_pb2_grpc, structs_pb2
from tests.bench import _procs
from tests.bench._stats import CpuProbe, histogram_latency_ms, latency_ms, scrape_histogram
from tests.bench.heartbeats import (
    CLUSTER_WAIT_S,
    CONTROL_POLL_S,
    HEARTBEAT_TIMEOUT_S,
    JOB_ID,
    KIND_HEARTBEAT,
    KIND_REGISTER,
    MIN_TTL_S,
    RPC_TIMEOUT_S,
    Beats,
    EveryInterval,
    NodeSim,
    Record,
    StatusPoller,
    base_ttl_s,
    bench_cluster,
    failure_record,
    false_downs,
    job_proto,
    node_id,
    node_proto,
    node_secret,
    run_sim_process,
    server_args,
    sim_or_usage,
)

NAME: Final = "fleet"
MODULE: Final = "tests.bench.fleet"
AGENT_MODULE: Final = "tests.bench._agent"
TARGET_CLIENTS: Final = 5_000
TARGET_P99_MS: Final = 100.0
FAILOVER_TTL_S: Final = 120.0
SERVER_ARGS: Final = server_args(f"{FAILOVER_TTL_S:g}s")
WATCH_WAIT_S: Final = 30.0
READ_INTERVAL_S: Final = 0.25
LAG_PROBE_S: Final = 0.05
# What the breakdown reads from the leader between the window's start and the kill: the
# heartbeat as its handler timed it, how late its API loop ran (a wait before every
# handler), and its full collections' pauses (which stop every thread).
LEADER_HISTOGRAMS: Final[dict[str, tuple[str, dict[str, str]]]] = {
    "leader_heartbeat_served_ms": (
        RPC_SECONDS.describe()[0].name,
        {"method": method_label("/drover.v1.Nodes/UpdateStatus")},
    ),
    "leader_api_loop_lag_ms": (API_LOOP_LAG_SECONDS.describe()[0].name, {}),
    "leader_gc_gen2_pause_ms": (GC_PAUSE_METRIC, {"generation": "2"}),
}

# The codes after which the agent registers again although the call was no heartbeat (an
# alloc report refused: the servers take the node for down; client_agent/rpc.py _REFUSED).
REFUSED_CODES: Final = frozenset({"FAILED_PRECONDITION", "PERMISSION_DENIED"})

# Records are the heartbeat bench's, with the node's index as subject; KIND_HEARTBEAT and
# KIND_REGISTER are its kinds.
KIND_REPORT: Final = 2


@dataclass(frozen=True, slots=True)
class FleetConfig:
    clients: int
    processes: int
    job_count: int
    duration_s: float
    failover_at_s: float
    channels_per_process: int = 24
    register_concurrency: int = 16
    registration_timeout_s: float = 300.0

    @classmethod
    def make(cls, *, quick: bool) -> FleetConfig:
        if quick:
            return cls(clients=200, processes=2, job_count=40, duration_s=30.0, failover_at_s=12.0)
        return cls(clients=TARGET_CLIENTS, processes=4, job_count=500, duration_s=600.0, failover_at_s=300.0)

    def base_ttl_s(self) -> float:
        return base_ttl_s(self.clients)

    def budget_s(self) -> float:
        return (
            3 * CLUSTER_WAIT_S + self.registration_timeout_s + self.duration_s + 4 * self.base_ttl_s() + 180.0
        )


# --- the simulator (a child process) ----------------------------------------------------------


@dataclass(slots=True)
class _Client:
    index: int
    slot: int
    ttl_s: float = MIN_TTL_S
    registered: bool = False
    heard_at: float = 0.0  # monotonic time of the last answered Register or heartbeat
    beats: Beats = field(default_factory=Beats)


class _Sim(NodeSim):
    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__(args)
        self.reported: set[str] = set()
        self.tunnels_open = 0
        self.loop_lag: list[tuple[float, float]] = []  # (wall time, seconds late)

    def _failed(
        self, kind: str, client: _Client, exc: grpc.aio.AioRpcError, *, register: bool = True
    ) -> None:
        code = self._note_error(kind, exc)
        if code in ("UNAVAILABLE", "DEADLINE_EXCEEDED", "CANCELLED"):
            client.slot = (client.slot + 1) % len(self.stubs)
        if register or code in REFUSED_CODES:
            client.registered = False

    async def _timed(self, kind: int, client: _Client, call: Callable[[api_pb2_grpc.NodesStub], Any]) -> Any:
        start_wall, start = time.time(), time.perf_counter()
        ok = 0
        try:
            response = await call(self.stubs[client.slot])
            ok = 1
            return response
        finally:
            self.records.append((start_wall, time.perf_counter() - start, ok, kind, client.index))

    async def _register(self, client: _Client) -> None:
        request = api_pb2.NodeRegisterRequest(node=node_proto(self.nonce, client.index))
        call = functools.partial(
            self._timed, KIND_REGISTER, client, lambda s: s.Register(request, timeout=RPC_TIMEOUT_S)
        )
        if client.index in self.registered:
            # Registering again (a heartbeat failed): at once, as the agent does. Queued on
            # register_sem, which only spreads the fleet's first start, such a node waited
            # behind the burst's first registrations past its TTL and its grace, and was
            # marked down with nothing wrong but the queue (294 in a 4,000-client run).
            response = await call()
        else:
            async with self.register_sem:
                response = await call()
        client.ttl_s = response.heartbeat_ttl_ns / 1e9 or client.ttl_s
        client.registered = True
        client.heard_at = time.monotonic()
        self.registered.add(client.index)

    async def _heartbeats(self, client: _Client) -> None:
        beat = api_pb2.NodeUpdateStatusRequest(
            node_id=node_id(self.nonce, client.index),
            status="ready",
            secret_id=node_secret(self.nonce, client.index),
        )
        failures = 0
        first = True
        while not self.stop.is_set():
            try:
                if not client.registered:
                    await self._register(client)
                else:
                    # As the agent waits (client_agent/agent.py): while the TTL allows.
                    ttl_left_s = client.heard_at + client.ttl_s - time.monotonic()
                    timeout = heartbeat_timeout_s(ttl_left_s, HEARTBEAT_TIMEOUT_S)
                    response = await self._timed(
                        KIND_HEARTBEAT,
                        client,
                        lambda s, t=timeout: client.beats.beat(s, client.slot, beat, t),
                    )
                    client.ttl_s = response.heartbeat_ttl_ns / 1e9 or client.ttl_s
                    client.heard_at = time.monotonic()
            except grpc.aio.AioRpcError as exc:
                self._failed("register" if not client.registered else "heartbeat", client, exc)
                failures += 1
                await self._sleep(min(client.ttl_s / 4, self.rng.uniform(0.1, min(2.0, 0.1 * 2**failures))))
                continue
            failures = 0
            if first:
                first = False  # agents start at random moments: spread the fleet over a TTL/2
                await self._sleep(self.rng.uniform(0, client.ttl_s / 2))
            else:
                await self._sleep(client.ttl_s / 2)

    async def _watch(self, client: _Client) -> None:
        """The alloc watch, and the runner's reports of what it is given."""
        nid, secret = node_id(self.nonce, client.index), node_secret(self.nonce, client.index)
        index = 0
        failures = 0
        while not self.stop.is_set():
            if not client.registered:
                await self._sleep(CONTROL_POLL_S)
                continue
            request = api_pb2.ClientAllocsRequest(
                node_id=nid,
                secret_id=secret,
                options=api_pb2.QueryOptions(min_index=index, wait_ns=int(WATCH_WAIT_S * 1e9)),
            )
            try:
                response = await self.stubs[client.slot].GetClientAllocs(
                    request, timeout=WATCH_WAIT_S + RPC_TIMEOUT_S
                )
                # The index moves on only once what it brought is reported: a report that
                # fails (a timeout under load) is retried from the same answer, as the agent
                # keeps unsent updates; moving on first dropped those allocs for good.
                seen = max(index, response.meta.index)
                updates = [
                    _running(a)
                    for a in response.allocs
                    if a.desired_status == "run"
                    and a.client_status == "pending"
                    and a.id not in self.reported
                ]
                if updates:
                    report = api_pb2.AllocUpdateRequest(node_id=nid, secret_id=secret, allocs=updates)
                    await self._timed(
                        KIND_REPORT, client, lambda s, r=report: s.UpdateAllocs(r, timeout=RPC_TIMEOUT_S)
                    )
                    self.reported.update(u.id for u in updates)
                index = seen
                failures = 0
            except grpc.aio.AioRpcError as exc:
                # The agent's watch only backs off (a refused report registers again): it
                # registered here after any failure, so when the leader was slow to confirm
                # reads, thousands of watch failures became re-registrations, queued behind
                # one another (register_sem) in place of those nodes' heartbeats.
                self._failed("watch", client, exc, register=False)
                failures += 1
                await self._sleep(self.rng.uniform(0.1, min(2.0, 0.1 * 2**failures)))

    async def _tunnel(self, client: _Client) -> None:
        """The node's tunnel, as the agent's ``ClientTunnel`` holds it (client_agent/tunnel.py):
        open while registered, to the server it talks to, reopened after a break. Nothing is
        asked down it here: what the servers pay is holding it."""
        hello = api_pb2.ClientTunnelUp(
            node_id=node_id(self.nonce, client.index), secret_id=node_secret(self.nonce, client.index)
        )
        failures = 0

        async def up() -> AsyncIterator[api_pb2.ClientTunnelUp]:
            yield hello
            await self.stop.wait()

        while not self.stop.is_set():
            if not client.registered:
                await self._sleep(CONTROL_POLL_S)
                continue
            self.tunnels_open += 1
            try:
                async for _down in self.stubs[client.slot].Connect(up()):
                    pass
                failures = 0
            except grpc.aio.AioRpcError as exc:
                if self.stop.is_set():
                    return
                self._failed("tunnel", client, exc, register=False)
                failures += 1
            finally:
                self.tunnels_open -= 1
            await self._sleep(self.rng.uniform(0.1, min(2.0, 0.1 * 2**failures)))

    async def _lag_probe(self) -> None:
        """How late this process's loop wakes a sleeper: every call's latency here includes
        that much wait before its answer is read, so a lag of this size is the simulator's,
        not the servers'."""
        while not self.stop.is_set():
            start = time.perf_counter()
            await asyncio.sleep(LAG_PROBE_S)
            self.loop_lag.append((time.time(), time.perf_counter() - start - LAG_PROBE_S))

    async def _control(self) -> None:
        while not self.stop.is_set():
            if (_procs.read_json(self.control) or {}).get("stop"):
                self.stop.set()
                break
            status = {
                "registered": len(self.registered),
                "reported": len(self.reported),
                "tunnels": self.tunnels_open,
            }
            _procs.write_json(self.out.with_suffix(".status.json"), status)
            await self._sleep(CONTROL_POLL_S)

    async def run(self) -> None:
        options = [("grpc.use_local_subchannel_pool", 1)]  # one connection per channel
        channels = [grpc.aio.insecure_channel(a, options=options) for a in self.addresses]
        self.stubs = [api_pb2_grpc.NodesStub(c) for c in channels]
        try:
            clients = [_Client(i, i % len(self.stubs)) for i in range(self.first, self.first + self.count)]
            tasks = [asyncio.create_task(self._heartbeats(c)) for c in clients]
            tasks += [asyncio.create_task(self._watch(c)) for c in clients]
            tasks += [asyncio.create_task(self._tunnel(c)) for c in clients]
            tasks.append(asyncio.create_task(self._lag_probe()))
            await self._control()
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        finally:
            for channel in channels:
                await channel.close()
        _procs.write_json(
            self.out,
            {
                "records": self.records,
                "errors": dict(self.errors),
                "error_samples": self.error_samples,
                "reported": len(self.reported),
                "loop_lag": self.loop_lag,
            },
        )


def _running(alloc: structs_pb2.Allocation) -> structs_pb2.Allocation:
    update = structs_pb2.Allocation(id=alloc.id, node_id=alloc.node_id, client_status="running")
    task = update.task_states["server"]
    task.state = "running"
    task.started_at_ns = time.time_ns()
    return update


def sim_main(argv: Sequence[str]) -> int:
    return run_sim_process(argv, MODULE, _Sim)


# --- the benchmark's side ---------------------------------------------------------------------


class _Reader(EveryInterval):
    """``drover job status``'s read (Jobs.List, on the leader) every ``READ_INTERVAL_S``."""

    def __init__(self, addresses: Sequence[str]) -> None:
        super().__init__("fleet-reader", READ_INTERVAL_S)
        self._api = DroverClient(addresses, timeout=RPC_TIMEOUT_S, retry_deadline=RPC_TIMEOUT_S)
        self.samples: list[tuple[float, float, int]] = []  # (wall start, latency s, ok)

    def tick(self) -> None:
        start_wall, start = time.time(), time.perf_counter()
        try:
            self._api.list_jobs()
            ok = 1
        except DroverError:
            ok = 0
        self.samples.append((start_wall, time.perf_counter() - start, ok))

    def close(self) -> None:
        self._api.close()


def _stats(records: Sequence[Record], kind: int, start: float, end: float) -> dict[str, Any]:
    lat = [lat for t, lat, ok, k, _ in records if k == kind and ok and start <= t < end]
    failed = sum(1 for t, _, ok, k, _ in records if k == kind and not ok and start <= t < end)
    return {
        "calls": len(lat),
        "errors": failed,
        "per_s": round(len(lat) / max(end - start, 1e-9), 1),
        "latency_ms": latency_ms(lat),
    }


def back_after_failover(records: Sequence[Record], clients: int, killed_at: float) -> dict[str, Any]:
    """For each client, how long after the kill its first heartbeat (or re-registration)
    accepted by the new leader started; the slowest, and who never came back."""
    first_ok: dict[int, float] = {}
    for t, _lat, ok, kind, client in records:
        if ok and kind in (KIND_HEARTBEAT, KIND_REGISTER) and t >= killed_at:
            first_ok[client] = min(first_ok.get(client, t), t)
    back = sorted(t - killed_at for t in first_ok.values())
    return {
        "clients_back": len(back),
        "clients_missing": clients - len(back),
        "slowest_s": round(back[-1], 2) if back else None,
        "p50_s": round(back[len(back) // 2], 2) if back else None,
    }


@dataclass(slots=True)
class _Fleet:
    cfg: FleetConfig
    base: Path
    nonce: str
    cluster: LocalCluster
    children: list[_procs.Child]
    control: Path = field(init=False)

    def __post_init__(self) -> None:
        self.control = self.base / "control.json"
        _procs.write_json(self.control, {})

    def spawn(self) -> None:
        per = -(-self.cfg.clients // self.cfg.processes)
        servers = ",".join(self.cluster.grpc_addresses)
        for k in range(self.cfg.processes):
            first, count = k * per, min(per, self.cfg.clients - k * per)
            if count <= 0:
                break
            name = f"sim{k}"
            argv = _procs.python_module_argv(
                MODULE, "sim", "--nonce", self.nonce, "--first", str(first), "--count", str(count),
                "--servers", servers, "--channels", str(self.cfg.channels_per_process),
                "--register-concurrency", str(self.cfg.register_concurrency),
                "--control", str(self.control), "--out", str(self.base / f"{name}.json"),
            )  # fmt: skip
            self.children.append(_procs.spawn(name, argv, self.base / f"{name}.log", self.cfg.budget_s()))

    def status(self, key: str) -> int:
        total = 0
        for child in self.children:
            total += int((_procs.read_json(self.base / f"{child.name}.status.json") or {}).get(key, 0))
        return total

    def collect(self) -> _Collected:
        _procs.write_json(self.control, {"stop": True})
        out = _Collected()
        for child in self.children:
            path = self.base / f"{child.name}.json"
            doc = _procs.wait_until(lambda p=path: _procs.read_json(p), 60.0, f"{child.name} results", [])
            out.records.extend(
                (float(a), float(b), int(c), int(d), int(e)) for a, b, c, d, e in doc["records"]
            )
            out.loop_lag.extend((float(t), float(lag)) for t, lag in doc["loop_lag"])
            out.errors.update(doc["errors"])
            out.error_samples.extend(doc["error_samples"])
        return out


def _scrape_leader(http_address: str) -> dict[str, dict[float, float]]:
    """Each of LEADER_HISTOGRAMS' bucket counts on the leader now."""
    return {
        key: scrape_histogram(http_address, name, **labels)
        for key, (name, labels) in LEADER_HISTOGRAMS.items()
    }


@dataclass(slots=True)
class _Collected:
    """What the simulators wrote at the end: every call's record, their loops' lag
    samples, and their errors (counted by kind and code, and the first few in words)."""

    records: list[Record] = field(default_factory=list)
    loop_lag: list[tuple[float, float]] = field(default_factory=list)
    errors: Counter[str] = field(default_factory=Counter)
    error_samples: list[str] = field(default_factory=list)


def _placement_state(fleet: _Fleet, api: DroverClient) -> str:
    """Where the job's placement stands, for a wait that timed out: its allocs by desired
    and client status, its evals by status, and what the simulators counted."""
    allocs = Counter(f"{a.desired_status}/{a.client_status}" for a in api.list_allocs(job_id=JOB_ID).allocs)
    evals = Counter(e.status for e in api.list_evals(job_id=JOB_ID).evals)
    nodes = Counter(n.status for n in api.list_nodes().nodes)
    sims = {key: fleet.status(key) for key in ("registered", "reported", "tunnels")}
    return f"allocs {dict(allocs)}; evals {dict(evals)}; nodes {dict(nodes)}; simulators {sims}"


def _measure(fleet: _Fleet, api: DroverClient) -> dict[str, Any]:
    cfg, cluster = fleet.cfg, fleet.cluster
    out: dict[str, Any] = {}
    started = time.monotonic()
    phases = {"registration": time.time()}
    fleet.spawn()
    _procs.wait_until(
        lambda: fleet.status("registered") >= cfg.clients, cfg.registration_timeout_s, "every client registered",
        fleet.children, interval=0.5,
    )  # fmt: skip
    out["registration_s"] = round(time.monotonic() - started, 2)
    phases["placement"] = time.time()
    api.register_job(job_proto(cfg.job_count))
    placed = time.monotonic()
    try:
        _procs.wait_until(
            lambda: fleet.status("reported") >= cfg.job_count, 180.0, f"{cfg.job_count} allocs reported running",
            fleet.children, interval=0.5,
        )  # fmt: skip
    except _procs.BenchError as exc:
        raise _procs.BenchError(f"{exc}\n{_placement_state(fleet, api)}") from exc
    out["job_placed_and_running_s"] = round(time.monotonic() - placed, 2)
    _procs.wait_until(
        lambda: fleet.status("tunnels") >= cfg.clients, 60.0, "every client's tunnel open",
        fleet.children, interval=0.5,
    )  # fmt: skip
    leader = cluster.leader_index(CLUSTER_WAIT_S)
    poll_at = (leader + 1) % len(cluster.server_names)
    leader_http = cluster.http_address(leader)
    pids = {f"s{i + 1}": cluster.pid(i) for i in range(len(cluster.server_names))}
    pids.update({child.name: child.pid for child in fleet.children})
    cpu = CpuProbe({name: pid for name, pid in pids.items() if pid})
    with StatusPoller(cluster.grpc_addresses[poll_at]) as poller, _Reader(cluster.grpc_addresses) as reader:
        leader_before = _scrape_leader(leader_http)
        cpu.start(time.monotonic())
        window_start = phases["window"] = time.time()
        _procs.wait_until(
            lambda: time.time() >= window_start + cfg.failover_at_s, cfg.failover_at_s + 5, "the failover moment",
            fleet.children, interval=0.2,
        )  # fmt: skip
        leader_at_kill = _scrape_leader(leader_http)
        cpu_before_failover = cpu.stop(time.monotonic())
        killed_at = phases["after_failover"] = time.time()
        cluster.kill(leader)
        new_leader = cluster.wait_for_leader(CLUSTER_WAIT_S)
        out["failover"] = {
            "killed": cluster.server_names[leader],
            "new_leader": new_leader,
            "election_s": round(time.time() - killed_at, 2),
        }
        _procs.wait_until(
            lambda: time.time() >= window_start + cfg.duration_s, cfg.duration_s + 5, "the end of the window",
            fleet.children, interval=0.5,
        )  # fmt: skip
        window_end = time.time()
        out["tunnels_open_at_end"] = fleet.status("tunnels")
        non_ready = {nid: s for nid, s in poller.snapshot().items() if s != "ready"}
    collected = fleet.collect()
    records = collected.records
    reads = [(t, lat, ok) for t, lat, ok in reader.samples if window_start <= t < window_end]
    out["window_s"] = round(window_end - window_start, 1)
    out["heartbeats"] = {
        # While the fleet registers: the burst of writes every node's first beats meet.
        "during_registration": _stats(records, KIND_HEARTBEAT, phases["registration"], phases["placement"]),
        "all": _stats(records, KIND_HEARTBEAT, window_start, window_end),
        "before_failover": _stats(records, KIND_HEARTBEAT, window_start, killed_at),
        "after_failover": _stats(records, KIND_HEARTBEAT, killed_at, window_end),
        # The settled part: from one base TTL after the kill, once every client has moved.
        "settled_after_failover": _stats(records, KIND_HEARTBEAT, killed_at + cfg.base_ttl_s(), window_end),
    }
    out["job_status_read"] = {
        "calls": sum(ok for _, _, ok in reads),
        "errors": sum(1 - ok for _, _, ok in reads),
        "latency_ms": latency_ms(lat for _, lat, ok in reads if ok),
    }
    out["back_after_failover"] = {
        **back_after_failover(records, cfg.clients, killed_at),
        "failover_ttl_s": FAILOVER_TTL_S,
    }
    out["false_downs"] = false_downs(
        cluster, api, poller, {node_id(fleet.nonce, i) for i in range(cfg.clients)}, phases
    )
    out["non_ready_at_end"] = len(non_ready)
    out["client_errors"] = collected.errors
    out["client_error_samples"] = collected.error_samples
    # Where a heartbeat's time goes before the failover: the leader's own measures
    # (LEADER_HISTOGRAMS), how late the simulators' loops woke (a wait inside every latency
    # they record), and what each process used of a core.
    out["before_failover_breakdown"] = {
        **{key: histogram_latency_ms(leader_before[key], leader_at_kill[key]) for key in LEADER_HISTOGRAMS},
        "sim_loop_lag_ms": latency_ms(lag for t, lag in collected.loop_lag if window_start <= t < killed_at),
        "cpu_percent_of_a_core": cpu_before_failover,
    }
    return out


def run_fleet(cfg: FleetConfig) -> dict[str, Any]:
    """The whole benchmark on one fresh cluster; failures are recorded, not raised."""
    errors: list[str] = []
    results: dict[str, Any] = {}
    try:
        with bench_cluster("drover-bench-fleet-", cfg.budget_s(), SERVER_ARGS) as (base, cluster, children):
            cluster.wait_converged(CLUSTER_WAIT_S)
            with DroverClient(
                cluster.grpc_addresses, timeout=RPC_TIMEOUT_S, retry_deadline=CLUSTER_WAIT_S
            ) as api:
                _wait_announced(api, len(cluster.server_names))
                fleet = _Fleet(cfg, base, os.urandom(3).hex(), cluster, children)
                try:
                    results = _measure(fleet, api)
                except Exception as exc:
                    results, line = failure_record(exc)
                    errors.append(line)
    except _procs.BenchError as exc:
        errors.append(str(exc).splitlines()[0][:300])
        results.setdefault("error", str(exc)[:4000])
    hb = results.get("heartbeats", {}).get("all", {})
    reads = results.get("job_status_read", {})
    back = results.get("back_after_failover", {})
    targets_met = {
        "no_false_down": results.get("false_downs", {}).get("count") == 0,
        "heartbeat_p99_ms": hb.get("calls", 0) > 0 and hb["latency_ms"]["p99"] < TARGET_P99_MS,
        "job_status_read_p99_ms": reads.get("calls", 0) > 0 and reads["latency_ms"]["p99"] < TARGET_P99_MS,
        "all_back_within_failover_ttl": back.get("clients_missing") == 0
        and (back.get("slowest_s") or 1e9) < FAILOVER_TTL_S,
        "at_target_scale": cfg.clients >= TARGET_CLIENTS,
    }
    return {
        "config": {
            "clients": cfg.clients,
            "processes": cfg.processes,
            "job_count": cfg.job_count,
            "duration_s": cfg.duration_s,
            "failover_at_s": cfg.failover_at_s,
            "server_args": list(SERVER_ARGS),
        },
        "results": results,
        "targets": {"clients": TARGET_CLIENTS, "p99_ms_max": TARGET_P99_MS, "false_downs": 0},
        "targets_met": targets_met,
        "errors": errors,
    }


def _wait_announced(api: DroverClient, servers: int) -> None:
    """Every server announced its gRPC address: followers can forward to the leader."""

    def announced() -> bool:
        peers = api.raft_peers().peers
        return len(peers) == servers and all(p.grpc_address for p in peers)

    _procs.wait_until(announced, CLUSTER_WAIT_S, "every server to announce its gRPC address", interval=0.2)


def summary_lines(doc: dict[str, Any]) -> list[str]:
    res = doc.get("results", {})
    if res.get("error") and "heartbeats" not in res:
        return [f"  ERROR {str(res['error']).splitlines()[0][:300]}"]
    cfg = doc.get("config", {})
    lines = [
        f"  {cfg.get('clients')} clients in {cfg.get('processes')} processes, registered in "
        f"{res.get('registration_s')} s; {cfg.get('job_count')} allocs running in {res.get('job_placed_and_running_s')} s"
    ]
    for phase, s in res.get("heartbeats", {}).items():
        ms = s["latency_ms"]
        lines.append(
            f"  heartbeats {phase:<22} {s['per_s']:7.1f}/s p50 {ms['p50']:7.2f} ms p99 {ms['p99']:8.2f} ms "
            f"max {ms['max']:8.2f} ms errors {s['errors']}"
        )
    reads = res.get("job_status_read", {})
    if reads:
        ms = reads["latency_ms"]
        lines.append(
            f"  job status read: {reads['calls']} ok, {reads['errors']} failed; p50 {ms['p50']} ms p99 {ms['p99']} ms max {ms['max']} ms"
        )
    breakdown = res.get("before_failover_breakdown")
    if breakdown:
        served, lag = breakdown["leader_heartbeat_served_ms"], breakdown["sim_loop_lag_ms"]
        loop, gc2 = breakdown.get("leader_api_loop_lag_ms", {}), breakdown.get("leader_gc_gen2_pause_ms", {})
        lines.append(
            f"  before the failover: the leader served heartbeats in p50 {served['p50']} ms p99 {served['p99']} ms; "
            f"its API loop ran late by p50 {loop.get('p50')} ms p99 {loop.get('p99')} ms; "
            f"{gc2.get('count')} full collections, p99 {gc2.get('p99')} ms; "
            f"simulator loops woke late by p50 {lag['p50']} ms p99 {lag['p99']} ms; "
            f"CPU % of a core {breakdown['cpu_percent_of_a_core']}"
        )
    lines.append(f"  failover: {res.get('failover')}; back: {res.get('back_after_failover')}")
    lines.append(
        f"  false downs: {res.get('false_downs', {}).get('count')}   targets met: {doc.get('targets_met')}"
    )
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    return sim_or_usage(NAME, sim_main, argv)


if __name__ == "__main__":
    sys.exit(main())
