"""The heartbeats benchmark: thousands of clients heartbeating a 3-server cluster.

The TTL each client is told scales with the cluster (docs/nomad-notes.md#ratescaledinterval).

Target: 2,000 clients held with heartbeat p99 under 100 ms and no false down.

The clients are simulated, lightweight: ``processes`` child processes
(``python -m tests.bench.heartbeats sim ...``), each an asyncio loop with one coroutine
per node over a few ``grpc.aio`` channels spread over the three servers. Each node does
what the client agent does: ``Register`` (again after any failure or pause), then
``UpdateStatus(ready)`` every half of the TTL the server returned, as a message on its
``Nodes.Heartbeat`` stream (``Beats``, as the agent beats). A follower forwards both to
the leader, as for real clients. The benchmark process itself plays the nodes'
alloc runners (``FleetReporter``): it reports every alloc the servers place as
``running``, every alloc they stop as ``complete``, and, for a node back from a
partition, its allocs' current states (what the agent resends after re-registering).

Phases, on one fresh cluster (``SERVER_ARGS``: min TTL 5 s, at most 200 heartbeats/s
planned for, grace 5 s, so 2,000 nodes get TTLs of 10-20 s and a run stays bounded):

1. registration: every node registers; timed (nodes/s).
2. steady: a window of ``window_s`` during which a service job of ``job_count`` allocs (one
   per node: each takes most of a node) is registered, placed and reported running.
   Measured: heartbeats/s, heartbeat latency p50/p99/max (client side, every call
   started in the window), errors, CPU of every server (the leader's is the figure).
3. partition: ``partition`` nodes stop heartbeating at once. Measured: time until the
   servers consider every one of them gone (``disconnected`` when it runs allocs of the
   job, whose group has ``disconnect.lost_after``; ``down`` otherwise), and until the
   job's replacements run. Healthy nodes' heartbeat latency over the phase.
4. heal: they resume (register, resend alloc states, heartbeat). Measured: time from heal
   until every node is ``ready`` again, until no eval of the job is pending or blocked,
   and until the plan converged: exactly ``job_count`` allocs desired running, all
   running, none unknown (the reconnect picker stopped one of each original/replacement
   pair). Healthy nodes' heartbeat latency over the phase, CPU of every server.

False downs: nodes never paused that a leader judged anyway (its "heartbeat missed" log
line, a "Node heartbeat missed" node event, or a non-ready status seen by the poller).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import os
import random
import signal
import sys
import tempfile
import threading
import time
import traceback
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Final, Protocol, Self, cast

import grpc

from deploy.cluster import LocalCluster
from drover.sdk import DroverClient, DroverError
from drover.server.codec import to_proto
from drover.server.jobspec import parse_jobspec
from drover.v1 import api_pb2, api_pb2_grpc, structs_pb2
from tests.bench import _procs
from tests.bench._stats import OTHERS, QUIET_PERCENT, CpuProbe, latency_ms, rss_mb
from tests.cluster.nodes import simulated_node

NAME: Final = "heartbeats"
TARGET_P99_MS: Final = 100.0
TARGET_CLIENTS: Final = 2_000
MODULE: Final = "tests.bench.heartbeats"
AGENT_MODULE: Final = "tests.bench._agent"
MIN_TTL_S: Final = 5.0
MAX_HEARTBEATS_PER_S: Final = 200
GRACE_S: Final = 5.0


def server_args(failover_ttl: str) -> tuple[str, ...]:
    """The TTL flags of a cluster under heartbeat load, shared with the fleet bench (which
    differs only in the TTL it grants after a leader change)."""
    return (
        "-min-heartbeat-ttl",
        f"{MIN_TTL_S:g}s",
        "-max-heartbeats-per-second",
        str(MAX_HEARTBEATS_PER_S),
        "-heartbeat-grace",
        f"{GRACE_S:g}s",
        "-failover-heartbeat-ttl",
        failover_ttl,
    )


def base_ttl_s(clients: int) -> float:
    """The server's rate-scaled TTL base for this many nodes (a TTL is in [base, 2 base))."""
    return max(MIN_TTL_S, clients / MAX_HEARTBEATS_PER_S)


SERVER_ARGS: Final = server_args("2m")
JOB_ID: Final = "bench-hb-service"
CLUSTER_WAIT_S: Final = 60.0
RPC_TIMEOUT_S: Final = 10.0
HEARTBEAT_TIMEOUT_S: Final = 5.0
NODE_CPU_MHZ: Final = 1_000
NODE_MEMORY_MB: Final = 1_024
CONTROL_POLL_S: Final = 0.2
REPORT_INTERVAL_S: Final = 0.5
REPORTER_THREADS: Final = 8
STATUS_POLL_S: Final = 1.0
SIM_OUT_WAIT_S: Final = 30.0
MAX_ERROR_SAMPLES: Final = 12

# Record kinds in the simulators' output.
KIND_HEARTBEAT: Final = 0
KIND_REGISTER: Final = 1
# One call: (wall-clock start, latency s, ok 0/1, kind, subject): the subject is the index of
# the server called here, of the node calling in the fleet bench.
Record = tuple[float, float, int, int, int]


@dataclass(frozen=True, slots=True)
class HeartbeatsConfig:
    clients: int
    processes: int
    partition: int
    job_count: int
    window_s: float
    channels_per_process: int = 24
    register_concurrency: int = 16
    registration_timeout_s: float = 300.0
    phase_timeout_s: float = 180.0
    wait_quiet_s: float = 0.0

    @classmethod
    def make(cls, *, quick: bool, wait_quiet_s: float = 0.0) -> HeartbeatsConfig:
        if quick:
            return cls(
                clients=300,
                processes=2,
                partition=75,
                job_count=150,
                window_s=20.0,
                wait_quiet_s=wait_quiet_s,
            )
        return cls(
            clients=TARGET_CLIENTS,
            processes=4,
            partition=500,
            job_count=1_000,
            window_s=60.0,
            wait_quiet_s=wait_quiet_s,
        )

    def base_ttl_s(self) -> float:
        return base_ttl_s(self.clients)

    def max_ttl_s(self) -> float:
        return 2 * self.base_ttl_s()

    def planned_per_s(self) -> float:
        """Heartbeats/s the TTLs ask for: one per TTL/2, the mean TTL being 1.5 base."""
        return self.clients / (0.75 * self.base_ttl_s())

    def budget_s(self) -> float:
        return (
            3 * CLUSTER_WAIT_S
            + self.registration_timeout_s
            + self.window_s
            + 3 * self.phase_timeout_s
            + self.max_ttl_s() * 3
            + 120.0
        )


# --- node identities ----------------------------------------------------------------------


def node_id(nonce: str, i: int) -> str:
    return f"hb-{nonce}-{i:05d}"


def node_secret(nonce: str, i: int) -> str:
    return hashlib.sha256(f"{nonce}/{i}".encode()).hexdigest()[:32]


def node_index(node_id_: str) -> int:
    return int(node_id_.rsplit("-", 1)[1])


def node_proto(nonce: str, i: int) -> structs_pb2.Node:
    node = simulated_node(node_id(nonce, i), cpu=NODE_CPU_MHZ, memory=NODE_MEMORY_MB)
    node.secret_id = node_secret(nonce, i)
    return node


def job_proto(count: int) -> structs_pb2.Job:
    """One alloc per node (each takes most of one), waiting 1h for a disconnected node."""
    text = f"""
job "{JOB_ID}" {{
  type        = "service"
  datacenters = ["dc1"]

  group "web" {{
    count = {count}

    disconnect {{
      lost_after = "1h"
      replace    = true
    }}

    task "server" {{
      driver = "mock"

      config {{
        run_for = "24h"
      }}

      resources {{
        cpu    = {NODE_CPU_MHZ * 6 // 10}
        memory = 64
      }}
    }}
  }}
}}
"""
    return to_proto(parse_jobspec(text, filename=f"{JOB_ID}.hcl"), structs_pb2.Job())


# --- the simulator (a child process) ----------------------------------------------------------


class _BeatStream:
    """One open ``Nodes.Heartbeat`` stream, as the agent's HeartbeatStream holds it
    (client_agent/rpc.py): a beat is a message up and its answer down, each with its own
    deadline."""

    def __init__(self, stub: api_pb2_grpc.NodesStub, slot: int) -> None:
        self.slot = slot
        self._up: asyncio.Queue[api_pb2.NodeUpdateStatusRequest | None] = asyncio.Queue()
        self._call = stub.Heartbeat(self._requests())

    async def _requests(self) -> AsyncIterator[api_pb2.NodeUpdateStatusRequest]:
        while (request := await self._up.get()) is not None:
            yield request

    async def beat(
        self, request: api_pb2.NodeUpdateStatusRequest, timeout_s: float
    ) -> api_pb2.NodeUpdateStatusResponse:
        await self._up.put(request)
        try:
            answer = await asyncio.wait_for(self._call.read(), timeout_s)
        except TimeoutError:
            raise _status_error(grpc.StatusCode.DEADLINE_EXCEEDED, "no heartbeat answer in time") from None
        if answer is grpc.aio.EOF:
            raise _status_error(grpc.StatusCode.UNAVAILABLE, "the server ended the heartbeat stream")
        return cast(api_pb2.NodeUpdateStatusResponse, answer)

    def ended(self) -> bool:
        """The server ended it while it was idle (the agent opens another then too)."""
        return self._call.done()

    def close(self) -> None:
        self._up.put_nowait(None)
        self._call.cancel()


def _status_error(code: grpc.StatusCode, details: str) -> grpc.aio.AioRpcError:
    """A failure seen by the simulator itself, counted as the call's would be."""
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details)


class Beats:
    """A simulated node's heartbeats, on one stream to its current server, as the agent
    beats: opened at the first beat, again when the node moves to another server or the
    server ended it, and closed by any beat that fails. Both benches' simulators beat so."""

    def __init__(self) -> None:
        self._stream: _BeatStream | None = None

    async def beat(
        self,
        stub: api_pb2_grpc.NodesStub,
        slot: int,
        request: api_pb2.NodeUpdateStatusRequest,
        timeout_s: float,
    ) -> api_pb2.NodeUpdateStatusResponse:
        stream = self._stream
        if stream is not None and (stream.slot != slot or stream.ended()):
            stream.close()
            stream = None
        if stream is None:
            stream = self._stream = _BeatStream(stub, slot)
        try:
            return await stream.beat(request, timeout_s)
        except BaseException:
            stream.close()
            self._stream = None
            raise


class NodeSim:
    """What every simulator child of the heartbeat and fleet benches keeps: its share of the
    fleet (``first``, ``count``, under the run's ``nonce``), the control file it obeys and the
    output it writes, one server address per channel, every call's record and every error
    (the first of each kind and code in words, MAX_ERROR_SAMPLES at most), and the stop
    event. Each bench's sim adds the calls its nodes make; both count and sample errors and
    sleep the same way."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.nonce: str = args.nonce
        self.first: int = args.first
        self.count: int = args.count
        self.control = Path(args.control)
        self.out = Path(args.out)
        servers = [s for s in args.servers.split(",") if s]
        self.server_of_slot = [i % len(servers) for i in range(args.channels)]
        self.addresses = [servers[k] for k in self.server_of_slot]
        self.register_sem = asyncio.Semaphore(args.register_concurrency)
        self.rng = random.Random(f"{self.nonce}/{self.first}")
        self.records: list[Record] = []
        self.errors: Counter[str] = Counter()
        self.error_samples: list[str] = []
        self.stop = asyncio.Event()
        self.registered: set[int] = set()
        self.stubs: list[api_pb2_grpc.NodesStub] = []

    def _note_error(self, kind: str, exc: grpc.aio.AioRpcError) -> str:
        code = exc.code().name
        self.errors[f"{kind}:{code}"] += 1
        # The first of each kind and code: the commonest error must not hide a rare one.
        if self.errors[f"{kind}:{code}"] == 1 and len(self.error_samples) < MAX_ERROR_SAMPLES:
            self.error_samples.append(f"{kind} {code}: {exc.details()}")
        return code

    async def _sleep(self, seconds: float) -> None:
        """Sleep, but wake at once when the sim is told to stop."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.stop.wait(), seconds)


class _Sim(NodeSim):
    """Many simulated nodes in one asyncio loop (see the module docstring)."""

    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__(args)
        self.paused: frozenset[int] = frozenset()
        self.channels: list[grpc.aio.Channel] = []

    async def _call(self, slot: int, kind: int, fn: Callable[[api_pb2_grpc.NodesStub], Any]) -> Any:
        """One call on the node's channel; on UNAVAILABLE the node moves to another server."""
        start_wall, start = time.time(), time.perf_counter()
        try:
            resp = await fn(self.stubs[slot])
        except grpc.aio.AioRpcError:
            self.records.append((start_wall, time.perf_counter() - start, 0, kind, self.server_of_slot[slot]))
            raise
        self.records.append((start_wall, time.perf_counter() - start, 1, kind, self.server_of_slot[slot]))
        return resp

    async def _register(self, i: int, slot: int) -> float:
        req = api_pb2.NodeRegisterRequest(node=node_proto(self.nonce, i))
        async with self.register_sem:
            resp = await self._call(slot, KIND_REGISTER, lambda s: s.Register(req, timeout=RPC_TIMEOUT_S))
        self.registered.add(i)
        return float(resp.heartbeat_ttl_ns) / 1e9

    async def _node(self, i: int) -> None:
        slot = i % len(self.stubs)
        ttl_s = MIN_TTL_S
        need_register = True
        was_paused = False
        failures = 0
        beats = Beats()
        beat = api_pb2.NodeUpdateStatusRequest(node_id=node_id(self.nonce, i), status="ready")
        beat.secret_id = node_secret(self.nonce, i)
        first = True
        while not self.stop.is_set():
            if i in self.paused:
                was_paused = True
                await self._sleep(CONTROL_POLL_S)
                continue
            if was_paused:
                need_register, was_paused = True, False
            try:
                if need_register:
                    ttl_s = await self._register(i, slot)
                    need_register = False
                else:
                    resp = await self._call(
                        slot,
                        KIND_HEARTBEAT,
                        lambda s, on=slot: beats.beat(s, on, beat, HEARTBEAT_TIMEOUT_S),
                    )
                    ttl_s = float(resp.heartbeat_ttl_ns) / 1e9 or ttl_s
            except grpc.aio.AioRpcError as exc:
                code = self._note_error("register" if need_register else "heartbeat", exc)
                if code in ("UNAVAILABLE", "DEADLINE_EXCEEDED", "CANCELLED"):
                    slot = (slot + 1) % len(self.stubs)
                # Like the agent: after any failure the next call is a Register.
                need_register = True
                failures += 1
                delay = min(ttl_s / 2, self.rng.uniform(0.1, min(5.0, 0.1 * 2**failures)))
                await self._sleep(delay)
                continue
            failures = 0
            if first:
                # Spread the nodes over the interval, as their agents would start at random.
                first = False
                await self._sleep(self.rng.uniform(0, ttl_s / 2))
            else:
                await self._sleep(ttl_s / 2)

    async def _watch_control(self) -> None:
        while not self.stop.is_set():
            data = _procs.read_json(self.control) or {}
            if data.get("stop"):
                self.stop.set()
                break
            self.paused = frozenset(int(x) for x in data.get("paused", ()))
            status = {"registered": len(self.registered), "records": len(self.records)}
            _procs.write_json(self.out.with_suffix(".status.json"), status)
            await self._sleep(CONTROL_POLL_S)

    async def run(self) -> None:
        options = [("grpc.use_local_subchannel_pool", 1)]  # one connection per channel
        self.channels = [grpc.aio.insecure_channel(a, options=options) for a in self.addresses]
        self.stubs = [api_pb2_grpc.NodesStub(c) for c in self.channels]
        try:
            nodes = [asyncio.create_task(self._node(i)) for i in range(self.first, self.first + self.count)]
            await self._watch_control()
            await asyncio.gather(*nodes, return_exceptions=True)
        finally:
            for channel in self.channels:
                await channel.close()
        _procs.write_json(
            self.out,
            {
                "first": self.first,
                "count": self.count,
                "records": self.records,
                "errors": dict(self.errors),
                "error_samples": self.error_samples,
            },
        )


class SimProcess(Protocol):
    """A simulator process's body: built from the ``sim`` arguments, run on one event loop
    until ``stop`` is set (by SIGTERM, or its watchdog)."""

    stop: asyncio.Event

    async def run(self) -> None: ...


def sim_main(argv: Sequence[str]) -> int:
    return run_sim_process(argv, MODULE, _Sim)


def run_sim_process(
    argv: Sequence[str], module: str, make: Callable[[argparse.Namespace], SimProcess]
) -> int:
    """The ``sim`` subcommand both fleet benchmarks (this one and tests/bench/fleet.py)
    spawn: one process, its share of the simulated clients, stopped by SIGTERM."""
    parser = argparse.ArgumentParser(prog=f"python -m {module} sim")
    parser.add_argument("--nonce", required=True)
    parser.add_argument("--first", type=int, required=True)
    parser.add_argument("--count", type=int, required=True)
    parser.add_argument("--servers", required=True)
    parser.add_argument("--channels", type=int, default=24)
    parser.add_argument("--register-concurrency", type=int, default=16)
    parser.add_argument("--control", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    _procs.start_watchdog(lambda: os.kill(os.getpid(), signal.SIGTERM))
    sim = make(args)
    loop = asyncio.new_event_loop()
    loop.add_signal_handler(signal.SIGTERM, sim.stop.set)
    try:
        loop.run_until_complete(sim.run())
    finally:
        loop.close()
    return 0


# --- the fleet's alloc runners, played by the benchmark ---------------------------------------


class EveryInterval:
    """A daemon thread calling ``tick`` every ``interval_s`` while the with-block runs, then
    ``close`` once it has ended."""

    def __init__(self, name: str, interval_s: float) -> None:
        self._interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(RPC_TIMEOUT_S * 2)
        self.close()

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            self.tick()

    def tick(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        """Release what ``tick`` used."""


class FleetReporter(EveryInterval):
    """Reports allocs as their clients would: placed -> running, stopped -> complete, and a
    node back from a partition resends its allocs' states (unknown -> running).

    Nodes in ``paused`` are partitioned: nothing is reported for them. A report the servers
    refuse (the node is still disconnected or down) is simply tried again next round.
    """

    def __init__(self, addresses: Sequence[str], nonce: str) -> None:
        super().__init__("fleet-reporter", REPORT_INTERVAL_S)
        self._api = DroverClient(addresses, timeout=RPC_TIMEOUT_S, retry_deadline=RPC_TIMEOUT_S)
        # UpdateAllocs as a client sends it (with its node's secret): the SDK's has no node.
        self._channels = [grpc.insecure_channel(a) for a in addresses]
        self._stubs = [api_pb2_grpc.NodesStub(c) for c in self._channels]
        self._nonce = nonce
        self._pool = ThreadPoolExecutor(REPORTER_THREADS, thread_name_prefix="fleet-report")
        self.paused: frozenset[str] = frozenset()
        self.reports = 0
        self.refused = 0
        self.errors: Counter[str] = Counter()

    def tick(self) -> None:
        try:
            self.report_once()
        except DroverError as exc:
            self.errors[f"list:{exc.code.name}"] += 1

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._api.close()
        for channel in self._channels:
            channel.close()

    def report_once(self) -> None:
        allocs = self._api.list_allocs(job_id=JOB_ID).allocs
        now = time.time_ns()
        by_node: dict[str, list[structs_pb2.Allocation]] = {}
        for a in allocs:
            if a.node_id in self.paused:
                continue
            if a.desired_status == "run" and a.client_status in ("pending", "unknown"):
                status = "running"
            elif a.desired_status != "run" and a.client_status in ("pending", "running", "unknown"):
                status = "complete"
            else:
                continue
            update = structs_pb2.Allocation(id=a.id, node_id=a.node_id, client_status=status)
            task = update.task_states["server"]
            task.state = "running" if status == "running" else "dead"
            task.started_at_ns = a.task_states["server"].started_at_ns or now
            if status == "complete":
                task.finished_at_ns = now
            by_node.setdefault(a.node_id, []).append(update)
        futures = [self._pool.submit(self._send, nid, updates) for nid, updates in by_node.items()]
        for f in futures:
            f.result()

    def _send(self, nid: str, updates: list[structs_pb2.Allocation]) -> None:
        req = api_pb2.AllocUpdateRequest(
            node_id=nid, secret_id=node_secret(self._nonce, node_index(nid)), allocs=updates
        )
        start = node_index(nid)
        for attempt in range(len(self._stubs)):
            stub = self._stubs[(start + attempt) % len(self._stubs)]
            try:
                stub.UpdateAllocs(req, timeout=RPC_TIMEOUT_S)
            except grpc.RpcError as exc:
                code = exc.code() if isinstance(exc, grpc.Call) else grpc.StatusCode.UNKNOWN
                if code == grpc.StatusCode.UNAVAILABLE:
                    continue
                if code == grpc.StatusCode.FAILED_PRECONDITION:
                    self.refused += 1  # still disconnected or down: next round
                else:
                    self.errors[f"update:{code.name}"] += 1
                return
            self.reports += 1
            return
        self.errors["update:UNAVAILABLE"] += 1


# --- watching the servers ---------------------------------------------------------------------


class StatusPoller(EveryInterval):
    """Every node's status, polled from one follower (stale reads: the leader is spared)."""

    def __init__(self, address: str) -> None:
        super().__init__("status-poller", STATUS_POLL_S)
        self._api = DroverClient([address], timeout=RPC_TIMEOUT_S, retry_deadline=RPC_TIMEOUT_S)
        self._lock = threading.Lock()
        self.latest: dict[str, str] = {}
        self.non_ready_seen: dict[str, set[str]] = {}
        self.polls = 0

    def tick(self) -> None:
        with contextlib.suppress(DroverError):
            self.poll()

    def close(self) -> None:
        self._api.close()

    def poll(self) -> dict[str, str]:
        nodes = self._api.list_nodes(stale=True).nodes
        statuses = {n.id: n.status for n in nodes}
        with self._lock:
            self.latest = statuses
            self.polls += 1
            for nid, status in statuses.items():
                if status != "ready":
                    self.non_ready_seen.setdefault(nid, set()).add(status)
        return statuses

    def snapshot(self) -> dict[str, str]:
        with self._lock:
            return dict(self.latest)


# --- the benchmark ----------------------------------------------------------------------------


@dataclass(slots=True)
class _Run:
    cfg: HeartbeatsConfig
    base: Path
    nonce: str
    cluster: LocalCluster
    children: list[_procs.Child]
    control: Path
    api: DroverClient
    marks: dict[str, float] = field(default_factory=dict)  # phase -> wall clock

    def mark(self, name: str) -> float:
        t = time.time()
        self.marks[name] = t
        return t

    def set_control(self, **data: Any) -> None:
        _procs.write_json(self.control, data)

    def sims_registered(self) -> int:
        total = 0
        for child in self.children:
            status = _procs.read_json(self.base / f"{child.name}.status.json") or {}
            total += int(status.get("registered", 0))
        return total

    def server_pids(self) -> dict[str, int]:
        leader = self.cluster.leader_index(CLUSTER_WAIT_S)
        out: dict[str, int] = {}
        for i, name in enumerate(self.cluster.server_names):
            pid = self.cluster.pid(i)
            if pid is not None:
                out["leader" if i == leader else f"follower_{name}"] = pid
        for child in self.children:
            out[child.name] = child.pid
        out["bench"] = os.getpid()
        return out


def _wait_peers(cluster: LocalCluster) -> None:
    """Every server announced its gRPC address: followers can forward to the leader."""
    with DroverClient(cluster.grpc_addresses, retry_deadline=CLUSTER_WAIT_S) as api:

        def announced() -> bool:
            peers = api.raft_peers().peers
            return len(peers) == len(cluster.server_names) and all(p.grpc_address for p in peers)

        _procs.wait_until(
            announced, CLUSTER_WAIT_S, "every server to announce its gRPC address", interval=0.2
        )
    cluster.wait_converged(CLUSTER_WAIT_S)


def _spawn_sims(run: _Run) -> None:
    cfg = run.cfg
    per = -(-cfg.clients // cfg.processes)
    servers = ",".join(run.cluster.grpc_addresses)
    for k in range(cfg.processes):
        first = k * per
        count = min(per, cfg.clients - first)
        if count <= 0:
            break
        name = f"sim{k}"
        argv = _procs.python_module_argv(
            MODULE,
            "sim",
            "--nonce",
            run.nonce,
            "--first",
            str(first),
            "--count",
            str(count),
            "--servers",
            servers,
            "--channels",
            str(cfg.channels_per_process),
            "--register-concurrency",
            str(cfg.register_concurrency),
            "--control",
            str(run.control),
            "--out",
            str(run.base / f"{name}.json"),
        )
        run.children.append(_procs.spawn(name, argv, run.base / f"{name}.log", cfg.budget_s()))


def _collect_sims(run: _Run) -> tuple[list[Record], dict[str, int], list[str]]:
    run.set_control(stop=True)
    records: list[Record] = []
    errors: Counter[str] = Counter()
    samples: list[str] = []
    for child in run.children:
        out = run.base / f"{child.name}.json"

        def result(path: Path = out, child: _procs.Child = child) -> Any:
            doc = _procs.read_json(path)
            if doc is None and not child.alive() and _procs.read_json(path) is None:
                raise _procs.BenchError(
                    f"{child.name} exited ({child.proc.returncode}) without results:\n{child.log_tail()}"
                )
            return doc

        doc = _procs.wait_until(result, SIM_OUT_WAIT_S, f"{child.name} results")
        records.extend(
            (float(t), float(lat), int(ok), int(kind), int(server))
            for t, lat, ok, kind, server in doc["records"]
        )
        errors.update(doc["errors"])
        samples.extend(doc["error_samples"][:3])
    return records, dict(errors), samples


def heartbeat_stats(
    records: Iterable[Record], start: float, end: float, servers: frozenset[int] | None = None
) -> dict[str, Any]:
    """Heartbeats (not registrations) started in [start, end), optionally only those sent
    to ``servers`` (indexes): rate, latency, errors."""
    lat: list[float] = []
    ok = failed = 0
    for t, latency, good, kind, server in records:
        if kind != KIND_HEARTBEAT or not start <= t < end or (servers is not None and server not in servers):
            continue
        if good:
            ok += 1
            lat.append(latency)
        else:
            failed += 1
    window = max(end - start, 1e-9)
    return {
        "window_s": round(window, 2),
        "heartbeats": ok,
        "errors": failed,
        "per_s": round(ok / window, 1),
        "latency_ms": latency_ms(lat),
    }


def p99_series(records: Sequence[Record], start: float, end: float, step: float) -> list[dict[str, Any]]:
    """Heartbeat p99 (and count) per ``step`` seconds of [start, end): where the tail comes from."""
    out = []
    t = start
    while t < end:
        s = heartbeat_stats(records, t, min(t + step, end))
        out.append({"from_s": round(t - start, 1), "n": s["heartbeats"], "p99_ms": s["latency_ms"]["p99"]})
        t += step
    return out


def _register_stats(records: Iterable[Record], start: float, end: float) -> dict[str, Any]:
    lat = [
        latency
        for t, latency, good, kind, _ in records
        if kind == KIND_REGISTER and good and start <= t < end
    ]
    return {"registrations": len(lat), "latency_ms": latency_ms(lat)}


def _job_state(api: DroverClient, count: int) -> dict[str, Any]:
    allocs = api.list_allocs(job_id=JOB_ID).allocs
    desired_run = [a for a in allocs if a.desired_status == "run"]
    by_status = Counter(a.client_status for a in desired_run)
    evals = api.list_evals(job_id=JOB_ID).evals
    open_evals = Counter(e.status for e in evals if e.status in ("pending", "blocked"))
    return {
        "desired_run": len(desired_run),
        "client_status": dict(by_status),
        "open_evals": dict(open_evals),
        "converged": len(desired_run) == count and by_status.get("running", 0) == count and not open_evals,
        "evals_settled": not open_evals,
    }


def _phase_wait(
    run: _Run, predicate: Callable[[], Any], what: str, timeout: float | None = None
) -> tuple[Any, float]:
    start = time.monotonic()
    result = _procs.wait_until(
        predicate, timeout or run.cfg.phase_timeout_s, what, run.children, interval=0.2
    )
    return result, round(time.monotonic() - start, 2)


def _wait_others_quiet(pids: Mapping[str, int], max_wait: float) -> float:
    """Wait (at most ``max_wait`` s) until processes other than ours use under
    ``QUIET_PERCENT`` % of a core (our own cluster and fleet are busy by design); the last
    figure seen. With ``max_wait`` 0 it only measures, for a second."""
    deadline = time.monotonic() + max_wait
    while True:
        probe = CpuProbe(pids)
        probe.start(time.monotonic())
        time.sleep(1.0)
        others = probe.stop(time.monotonic()).get(OTHERS, 0.0)
        if others < QUIET_PERCENT or time.monotonic() >= deadline:
            return others


def _top_threads(per_thread: Mapping[int, tuple[str, float]], n: int = 8) -> dict[str, float]:
    """The busiest threads of a process by kernel name (same names summed), % of one core."""
    by_name: dict[str, float] = {}
    for name, pct in per_thread.values():
        by_name[name] = by_name.get(name, 0.0) + pct
    top = sorted(by_name.items(), key=lambda kv: -kv[1])[:n]
    return {name: round(pct, 1) for name, pct in top}


def _false_downs(run: _Run, poller: StatusPoller, partitioned: set[str]) -> dict[str, Any]:
    healthy = {node_id(run.nonce, i) for i in range(run.cfg.clients)} - partitioned
    return false_downs(run.cluster, run.api, poller, healthy)


def false_downs(
    cluster: LocalCluster,
    api: DroverClient,
    poller: StatusPoller,
    watched: set[str],
    phases: Mapping[str, float] | None = None,
) -> dict[str, Any]:
    """How many of the ``watched`` nodes (ones that never stopped heartbeating) were taken
    for down, seen any of three ways: a server logged a missed heartbeat for it, the node
    has a "heartbeat missed" event, or the status poll caught it not ready. The heartbeat
    and fleet benches both hold their "no false down" target to this one count.

    ``phases`` (name -> wall-clock start, in order) says when: each logged miss is counted
    under the last phase begun before its timestamp, and under the server that logged it,
    because a count alone does not tell a registration burst from a failover."""
    by_log: set[str] = set()
    by_phase: Counter[str] = Counter()
    # Seconds into its phase of each phase's first and last logged miss: a burst at its start
    # (TTLs granted to a small cluster) reads differently from one all through it.
    spans: dict[str, list[float]] = {}
    by_server: Counter[str] = Counter()
    starts = sorted((phases or {}).items(), key=lambda kv: kv[1])
    for i, server in enumerate(cluster.server_names):
        for line in cluster.log(i).splitlines():
            if "heartbeat_missed" not in line:
                continue
            missed = [w[len("node_id=") :] for w in line.split() if w.startswith("node_id=")]
            if not missed or missed[0] not in watched:
                continue
            by_log.add(missed[0])
            by_server[server] += 1
            if starts:
                at = _log_time(line)
                phase = _phase_of(at, starts)
                by_phase[phase] += 1
                if at is not None and phase in dict(starts):
                    into = round(at - dict(starts)[phase], 1)
                    span = spans.setdefault(phase, [into, into])
                    span[0], span[1] = min(span[0], into), max(span[1], into)
    by_event = {
        n.id
        for n in api.list_nodes().nodes
        if n.id in watched and any("heartbeat missed" in e.message for e in n.events)
    }
    by_poll = {nid for nid in poller.non_ready_seen if nid in watched}
    union = by_log | by_event | by_poll
    out: dict[str, Any] = {
        "count": len(union),
        "by_leader_log": len(by_log),
        "by_node_event": len(by_event),
        "by_status_poll": len(by_poll),
        "examples": sorted(union)[:10],
        "logged_by_server": dict(by_server),
    }
    if starts:
        out["logged_by_phase"] = {name: by_phase.get(name, 0) for name, _ in starts} | dict(by_phase)
        out["logged_seconds_into_phase"] = spans
    return out


def _log_time(line: str) -> float | None:
    """A log line's wall-clock time: drover's key=value lines begin with an ISO timestamp
    (drover.common.logs)."""
    first = line.split(maxsplit=1)[0] if line.strip() else ""
    try:
        return datetime.fromisoformat(first).timestamp()
    except ValueError:
        return None


def _phase_of(t: float | None, starts: Sequence[tuple[str, float]]) -> str:
    if t is None:
        return "unknown"
    name = "before_" + starts[0][0]
    for phase, start in starts:
        if t < start:
            break
        name = phase
    return name


def _measure(run: _Run) -> dict[str, Any]:
    cfg = run.cfg
    api = run.api
    out: dict[str, Any] = {}
    all_ids = [node_id(run.nonce, i) for i in range(cfg.clients)]

    # 1. Registration.
    t_reg = run.mark("registration_start")
    _spawn_sims(run)
    _, reg_s = _phase_wait(
        run,
        lambda: run.sims_registered() >= cfg.clients,
        f"{cfg.clients} nodes to register",
        cfg.registration_timeout_s,
    )
    ready_ids: set[str] = set()

    def all_ready() -> bool:
        nodes = api.list_nodes().nodes
        ready_ids.clear()
        ready_ids.update(n.id for n in nodes if n.status == "ready")
        return len(ready_ids) >= cfg.clients

    _phase_wait(run, all_ready, "every node ready")
    out["registration"] = {
        "nodes": cfg.clients,
        "seconds": reg_s,
        "per_s": round(cfg.clients / reg_s, 1) if reg_s else None,
    }
    leader_index = run.cluster.leader_index(CLUSTER_WAIT_S)
    follower = next(i for i in range(len(run.cluster.server_names)) if i != leader_index)
    poller = StatusPoller(run.cluster.grpc_addresses[follower])
    reporter = FleetReporter(run.cluster.grpc_addresses, run.nonce)
    with poller, reporter:
        # Let every node reach its steady TTL (registration changed the node count) before
        # measuring: one full TTL. Then, if asked, wait for other work to leave the CPU.
        time.sleep(cfg.max_ttl_s() / 2)
        pids = run.server_pids()
        out["others_busy_percent_before"] = _wait_others_quiet(pids, cfg.wait_quiet_s)

        # 2. Steady window, with the job scheduled inside it.
        probe = CpuProbe(pids, threads_of="leader")
        t_steady = run.mark("steady_start")
        probe.start(time.monotonic())
        time.sleep(min(2.0, cfg.window_s / 10))
        run.mark("job_register")
        api.register_job(job_proto(cfg.job_count))
        _, placed_s = _phase_wait(
            run,
            lambda: (s := _job_state(api, cfg.job_count))["converged"] and s,
            f"{cfg.job_count} allocs running",
        )
        remaining = t_steady + cfg.window_s - time.time()
        if remaining > 0:
            time.sleep(remaining)
        t_steady_end = run.mark("steady_end")
        steady_cpu = probe.stop(time.monotonic())
        out["job"] = {"count": cfg.job_count, "register_to_all_running_s": placed_s}
        out["steady_leader_threads_percent"] = _top_threads(probe.thread_percent)
        out["steady_cpu_percent_of_one_core"] = steady_cpu
        out["leader_rss_mb"] = rss_mb(pids["leader"])
        non_ready_now = [nid for nid, s in poller.snapshot().items() if s != "ready"]
        out["steady_non_ready_nodes"] = len(non_ready_now)

        # 3. Partition: pick nodes with and without allocs, at random.
        rng = random.Random(run.nonce)
        partitioned = set(rng.sample(all_ids, cfg.partition))
        with_allocs = {a.node_id for a in api.list_allocs(job_id=JOB_ID).allocs if a.desired_status == "run"}
        probe = CpuProbe(pids, threads_of="leader")
        probe.start(time.monotonic())
        reporter.paused = frozenset(partitioned)
        t_cut = run.mark("partition")
        run.set_control(paused=sorted(node_index(n) for n in partitioned))

        def all_gone() -> dict[str, str] | None:
            statuses = {n.id: n.status for n in api.list_nodes().nodes}
            gone = {nid: statuses.get(nid, "") for nid in partitioned}
            return gone if all(s in ("down", "disconnected") for s in gone.values()) else None

        gone, _ = _phase_wait(
            run,
            all_gone,
            f"{cfg.partition} partitioned nodes down or disconnected",
            cfg.phase_timeout_s + cfg.max_ttl_s(),
        )
        t_gone = run.mark("partition_detected")
        replaced, replaced_s = _phase_wait(
            run,
            lambda: (
                (s := _job_state(api, cfg.job_count))["evals_settled"]
                and s["client_status"].get("running", 0)
                >= cfg.job_count - s["client_status"].get("unknown", 0)
                and s
            ),
            "the replacements to run",
        )
        t_replaced = run.mark("replacements_running")
        partition_cpu = probe.stop(time.monotonic())
        out["partition"] = {
            "nodes": cfg.partition,
            "with_allocs": len(partitioned & with_allocs),
            "statuses": dict(Counter(gone.values())),
            "cut_to_all_detected_s": round(t_gone - t_cut, 2),
            "detected_to_replacements_running_s": replaced_s,
            "job_during": replaced,
            "detection_bound_s": round(cfg.max_ttl_s() + GRACE_S, 1),
            "cpu_percent_of_one_core": partition_cpu,
        }

        # 4. Heal.
        probe = CpuProbe(pids, threads_of="leader")
        probe.start(time.monotonic())
        t_heal = run.mark("heal")
        run.set_control(paused=[])
        reporter.paused = frozenset()
        _, ready_s = _phase_wait(run, all_ready, "every node ready again")
        settled, _ = _phase_wait(
            run,
            lambda: (s := _job_state(api, cfg.job_count))["converged"] and s,
            "the job's plan to converge",
        )
        t_converged = run.mark("converged")
        heal_cpu = probe.stop(time.monotonic())
        out["heal"] = {
            "heal_to_all_ready_s": ready_s,
            "heal_to_converged_s": round(t_converged - t_heal, 2),
            "job_after": settled,
            "cpu_percent_of_one_core": heal_cpu,
        }
        # A last look: nothing moved while we measured.
        poller.poll()
        out["false_downs"] = _false_downs(run, poller, partitioned)
        out["reporter"] = {
            "alloc_reports": reporter.reports,
            "refused_while_unresponsive": reporter.refused,
            "errors": dict(reporter.errors),
        }
        out["status_polls"] = poller.polls

    records, errors, samples = _collect_sims(run)
    leader = frozenset({leader_index})
    followers = frozenset(range(len(run.cluster.server_names))) - leader
    out["heartbeats"] = {
        "steady": heartbeat_stats(records, t_steady, t_steady_end),
        "steady_sent_to_leader": heartbeat_stats(records, t_steady, t_steady_end, leader),
        "steady_sent_to_a_follower": heartbeat_stats(records, t_steady, t_steady_end, followers),
        "steady_p99_every_5s": p99_series(records, t_steady, t_steady_end, 5.0),
        "partition": heartbeat_stats(records, t_cut, t_replaced),
        "heal": heartbeat_stats(records, t_heal, t_converged),
        "planned_per_s": round(cfg.planned_per_s(), 1),
    }
    out["registrations"] = _register_stats(records, t_reg, t_converged + 1)
    out["sim_errors"] = errors
    if samples:
        out["sim_error_samples"] = samples[:MAX_ERROR_SAMPLES]
    out["leader"] = run.cluster.server_names[leader_index]
    leader_now = run.cluster.leader_index(CLUSTER_WAIT_S)
    if leader_now != leader_index:
        out["leader_changed_to"] = run.cluster.server_names[leader_now]
    out["marks_s"] = {k: round(v - t_reg, 2) for k, v in run.marks.items()}
    return out


@contextlib.contextmanager
def bench_cluster(
    prefix: str, budget_s: float, server_args: Sequence[str]
) -> Iterator[tuple[Path, LocalCluster, list[_procs.Child]]]:
    """A fresh 3-server cluster with a leader, in a temp dir, and a list to put simulator
    children in; all of it is stopped and removed when the block ends, however (a child
    left behind ends itself past ``budget_s``). Shared by the heartbeat and fleet benches."""
    env = {_procs.PARENT_PID_ENV: str(os.getpid()), _procs.MAX_SECONDS_ENV: f"{budget_s:.0f}"}
    with (
        tempfile.TemporaryDirectory(prefix=prefix) as tmp,
        _procs.children_stopped_on_exit() as children,
    ):
        base = Path(tmp)
        cluster = LocalCluster(
            base / "cluster", servers=3, extra_args=server_args, env=env, agent_module=AGENT_MODULE
        )
        with cluster:
            cluster.wait_for_leader(CLUSTER_WAIT_S)
            yield base, cluster, children


def failure_record(exc: BaseException) -> tuple[dict[str, Any], str]:
    """A measurement that raised: the results that say so (with the traceback), and the
    one line for the document's ``errors``."""
    detail = "".join(traceback.format_exception_only(exc)).strip()
    return {"error": detail[:4000], "traceback": traceback.format_exc()[-4000:]}, detail.splitlines()[0][:300]


def run_heartbeats(cfg: HeartbeatsConfig) -> dict[str, Any]:
    """The whole benchmark on one fresh cluster; failures are recorded, not raised."""
    errors: list[str] = []
    results: dict[str, Any] = {}
    nonce = os.urandom(3).hex()
    try:
        with bench_cluster("drover-bench-hb-", cfg.budget_s(), SERVER_ARGS) as (base, cluster, children):
            _wait_peers(cluster)
            control = base / "control.json"
            _procs.write_json(control, {"paused": []})
            with DroverClient(
                cluster.grpc_addresses, timeout=RPC_TIMEOUT_S, retry_deadline=CLUSTER_WAIT_S
            ) as api:
                run = _Run(cfg, base, nonce, cluster, children, control, api)
                try:
                    results = _measure(run)
                except Exception as exc:
                    results, line = failure_record(exc)
                    results["marks"] = {k: round(v, 2) for k, v in run.marks.items()}
                    errors.append(line)
    except _procs.BenchError as exc:
        errors.append(str(exc).splitlines()[0][:300])
        results.setdefault("error", str(exc)[:4000])
    steady = results.get("heartbeats", {}).get("steady", {})
    p99 = steady.get("latency_ms", {}).get("p99")
    false_downs = results.get("false_downs", {}).get("count")
    targets_met = {
        "heartbeat_p99_ms": p99 is not None and steady.get("heartbeats", 0) > 0 and p99 < TARGET_P99_MS,
        "no_false_down": false_downs == 0,
        # Every configured client stayed ready through the steady window.
        "clients_held": results.get("steady_non_ready_nodes") == 0,
        "at_target_scale": cfg.clients >= TARGET_CLIENTS,
    }
    return {
        "config": {
            "clients": cfg.clients,
            "processes": cfg.processes,
            "channels_per_process": cfg.channels_per_process,
            "partition": cfg.partition,
            "job_count": cfg.job_count,
            "window_s": cfg.window_s,
            "server_args": list(SERVER_ARGS),
            "ttl_range_s": [round(cfg.max_ttl_s() / 2, 1), round(cfg.max_ttl_s(), 1)],
            "heartbeat_every": "TTL/2 (as the client agent)",
        },
        "results": results,
        "targets": {
            "clients": TARGET_CLIENTS,
            "heartbeat_p99_ms_max": TARGET_P99_MS,
            "false_downs": 0,
        },
        "targets_met": targets_met,
        "errors": errors,
    }


def summary_lines(doc: dict[str, Any]) -> list[str]:
    res = doc.get("results", {})
    if res.get("error") and "heartbeats" not in res:
        return [f"  ERROR {str(res['error']).splitlines()[0][:300]}"]
    lines: list[str] = []
    hb = res.get("heartbeats", {})
    cfg = doc.get("config", {})
    reg = res.get("registration", {})
    lines.append(
        f"  {cfg.get('clients')} clients in {cfg.get('processes')} processes; registered in "
        f"{reg.get('seconds')} s ({reg.get('per_s')}/s); TTL {cfg.get('ttl_range_s')} s"
    )
    for phase in ("steady", "partition", "heal"):
        s = hb.get(phase)
        if not s:
            continue
        ms = s["latency_ms"]
        lines.append(
            f"  {phase:<9} {s['per_s']:7.1f} heartbeats/s  p50 {ms['p50']:7.2f} ms  p99 {ms['p99']:7.2f} ms  "
            f"max {ms['max']:8.2f} ms  errors {s['errors']}"
        )
    direct, forwarded = hb.get("steady_sent_to_leader"), hb.get("steady_sent_to_a_follower")
    if direct and forwarded:
        lines.append(
            f"  steady p99 sent to the leader {direct['latency_ms']['p99']} ms, to a follower (forwarded) "
            f"{forwarded['latency_ms']['p99']} ms; planned {hb.get('planned_per_s')}/s"
        )
    series = [b for b in hb.get("steady_p99_every_5s", []) if b["n"]]
    if series:
        worst = max(series, key=lambda b: b["p99_ms"])
        lines.append(
            f"  steady p99 per 5 s: worst {worst['p99_ms']} ms at +{worst['from_s']} s "
            f"(the job was registered at +2 s), best {min(b['p99_ms'] for b in series)} ms"
        )
    cpu = res.get("steady_cpu_percent_of_one_core", {})
    if cpu:
        lines.append(
            "  steady cpu % of a core: "
            + ", ".join(f"{k} {v}" for k, v in cpu.items() if not k.startswith("sim"))
        )
    part, heal = res.get("partition", {}), res.get("heal", {})
    if part:
        lines.append(
            f"  partition of {part.get('nodes')} ({part.get('with_allocs')} with allocs): all detected in "
            f"{part.get('cut_to_all_detected_s')} s {part.get('statuses')}; replacements running "
            f"{part.get('detected_to_replacements_running_s')} s later"
        )
    if heal:
        lines.append(
            f"  heal: all ready in {heal.get('heal_to_all_ready_s')} s, plan converged in "
            f"{heal.get('heal_to_converged_s')} s"
        )
    fd = res.get("false_downs", {})
    lines.append(f"  false downs: {fd.get('count')}   targets met: {doc.get('targets_met')}")
    return lines


def sim_or_usage(name: str, sim: Callable[[Sequence[str]], int], argv: Sequence[str] | None) -> int:
    """A simulator bench run as a module: only its simulator children start it so (``sim
    ...``); the bench itself runs under tests.bench.run, which the usage line says."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["sim"]:
        return sim(args[1:])
    print(f"usage: python -m tests.bench.run --only {name} [--quick]", file=sys.stderr)
    return 2


def main(argv: Sequence[str] | None = None) -> int:
    return sim_or_usage(NAME, sim_main, argv)


if __name__ == "__main__":
    sys.exit(main())
