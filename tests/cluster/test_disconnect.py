"""Disconnected clients, with real processes and really cut connections
(docs/field-reports.md#field-report-3).

Three real server processes run with short heartbeat settings (``SERVER_ARGS``). Every
client agent is a real ``drover agent -client`` process whose ``-servers`` are its own
``TcpProxy`` instances, one in front of each server's gRPC port: ``Rig.cut("c1")`` resets
c1's connections and refuses new ones, which is what a partition looks like to the agent
(UNAVAILABLE on every call), while the other clients and the servers go on as before.

Tests that only cut client links share the module's servers (``rig``), each with agents,
nodes and jobs of its own; a test that kills or stops a server has its own (``fresh_rig``,
``patient_rig``), since what it does to them would outlast it.

The tasks are ``raw_exec`` ``sleep`` processes, so "not restarted" is checked on the OS
process itself: the PID the client reported in the task state, and psutil's
``create_time`` of that PID (a reused PID would not match).

Every wait has a deadline and fails with the agents' log tails. Whatever happens, the rig
kills the client agents (SIGKILL), then every process still running inside the test's
directory (the ``sleep`` tasks the agents leave behind by design), closes the proxies and
stops the servers it owns (shared ones: purges the jobs and makes its nodes ineligible).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import psutil
import pytest

from deploy.cluster import LocalCluster, client_argv, wait_for
from drover.scheduler.structs import NODE_INELIGIBLE
from drover.sdk import DroverClient, DroverError
from drover.v1 import structs_pb2
from tests.cluster.conftest import kill_tasks_under, wait_settled
from tests.cluster.jobs import RAW_EXEC_TASK, raw_exec_sleep_job
from tests.cluster.proxy import BLACKHOLE, REFUSE, TcpProxy, proxies_for

T = TypeVar("T")

# Client TTL in [1s, 2s), the server waits TTL + 1s: a cut client is marked within ~3s.
# A new leader gives every node 8s before judging it (failover TTL).
SERVER_ARGS = (
    "-min-heartbeat-ttl",
    "1s",
    "-heartbeat-grace",
    "1s",
    "-failover-heartbeat-ttl",
    "8s",
)
WAIT_S = 60.0
TASK = RAW_EXEC_TASK


# --- job files --------------------------------------------------------------------------


def raw_exec_job(job_id: str, *, disconnect: str, count: int = 1, affinity_to: str = "") -> structs_pb2.Job:
    """A service job of ``count`` raw_exec ``sleep`` tasks in dc1, with ``disconnect`` as
    its group's disconnect block and, with ``affinity_to``, a preference for that node."""
    return raw_exec_sleep_job(job_id, disconnect=disconnect, count=count, preferring=affinity_to)


# --- a client agent process behind its own proxies ---------------------------------------


@dataclass
class AgentProc:
    name: str
    data_dir: Path
    log_path: Path
    proxies: list[TcpProxy]
    argv: list[str]
    proc: subprocess.Popen[bytes] | None = None
    node_id: str = ""

    def start(self, env: dict[str, str]) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=Path(__file__).resolve().parents[2],
                env=env,
                start_new_session=True,
            )

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout: float = 20.0) -> int | None:
        """SIGTERM: the agent exits and leaves its tasks running (an agent restart)."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        if self.proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=10)

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""


@dataclass
class StatusRecorder:
    """Polls the node list in a thread and keeps every status each of ``rig``'s nodes was
    seen in, under the name the test gave it (``Rig.add_client``)."""

    rig: Rig
    seen: dict[str, list[str]] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __enter__(self) -> StatusRecorder:
        self._thread = threading.Thread(target=self._run, name="status-recorder", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)

    def wait_seen(self, name: str, status: str, timeout: float = WAIT_S) -> None:
        """Until the last status recorded for ``name`` is ``status`` (the poller may lag)."""

        def last() -> bool:
            history = self.seen.get(name) or []
            return bool(history) and history[-1] == status

        wait_for(last, timeout, 0.05, lambda: f"the recorder to see {name} {status}: {self.seen.get(name)}")

    def _run(self) -> None:
        prefix = self.rig.node_prefix
        with DroverClient(self.rig.cluster.grpc_addresses, timeout=2, retry_deadline=2) as api:
            while not self._stop.wait(0.05):
                try:
                    # stale: any live server answers, even with no leader (mid election).
                    nodes = api.list_nodes(stale=True).nodes
                except DroverError:
                    continue
                for n in nodes:
                    if not n.name.startswith(prefix):
                        continue  # an earlier test's node, on servers shared with it
                    history = self.seen.setdefault(n.name.removeprefix(prefix), [])
                    if not history or history[-1] != n.status:
                        history.append(n.status)


class Rig:
    """Three servers (LocalCluster) and client agents, each behind its own proxies.

    The rig owns its client agents (data dirs under ``base``) and, unless it is lent a
    started ``cluster``, the servers. On a lent cluster a test sees only its own nodes:
    each is named ``node_prefix`` + the name the test gave it, the rig's methods take the
    latter, and ``close`` leaves the servers with no job and none of its nodes eligible.
    """

    def __init__(
        self,
        base: Path,
        servers: int = 3,
        server_args: Sequence[str] = SERVER_ARGS,
        *,
        cluster: LocalCluster | None = None,
        node_prefix: str = "",
    ) -> None:
        self.base = base.resolve()
        self._owns_cluster = cluster is None
        self.cluster = (
            LocalCluster(self.base / "cluster", servers=servers, extra_args=server_args)
            if cluster is None
            else cluster
        )
        self.node_prefix = node_prefix
        self.clients: dict[str, AgentProc] = {}
        self.api: DroverClient | None = None
        self._env = {**os.environ, "PYTHONUNBUFFERED": "1"}

    # -- lifecycle ------------------------------------------------------------------------

    def start(self) -> None:
        if self._owns_cluster:
            self.cluster.start()
        wait_settled(self.cluster, WAIT_S)
        self.api = DroverClient(self.cluster.grpc_addresses, retry_deadline=WAIT_S)
        if not self._owns_cluster:
            left = [j.id for j in self.client.list_jobs().jobs]
            assert not left, f"an earlier test left jobs on the shared servers: {left}"

    def close(self) -> None:
        errors: list[BaseException] = []
        steps = [self._kill_clients, self._kill_tasks, self._close_proxies, self._close_api]
        if not self._owns_cluster:
            steps.insert(0, self._leave_the_servers_clean)
        for step in steps:
            try:
                step()
            except BaseException as exc:  # every step runs, whatever the previous did
                errors.append(exc)
        if self._owns_cluster:
            self.cluster.stop_all()
        if errors:
            raise errors[0]

    def _leave_the_servers_clean(self) -> None:
        """Purge every job (this test's only: the one before purged its own) and make this
        rig's nodes ineligible: once killed, they still look ready to the servers for up to
        TTL + grace, and the next test's jobs must not be placed on them meanwhile."""
        for job in self.client.list_jobs().jobs:
            self.client.deregister_job(job.id, purge=True)
        # By name, not by the agents' node ids: an agent whose wait for ready timed out
        # registered all the same.
        for node in self.client.list_nodes().nodes:
            if node.name.startswith(self.node_prefix):
                self.client.update_eligibility(node.id, NODE_INELIGIBLE)

    def _kill_clients(self) -> None:
        for agent in self.clients.values():
            agent.kill()

    def _kill_tasks(self) -> None:
        """Every process whose working directory is inside this rig: the raw_exec tasks."""
        kill_tasks_under([self.base])

    def _close_proxies(self) -> None:
        for agent in self.clients.values():
            for proxy in agent.proxies:
                proxy.close()
            assert all(p.threads_alive() == 0 for p in agent.proxies), "a proxy thread outlived close()"

    def _close_api(self) -> None:
        if self.api is not None:
            self.api.close()

    # -- clients --------------------------------------------------------------------------

    def add_client(self, name: str, meta: dict[str, str] | None = None) -> AgentProc:
        """Start client agent ``name`` behind fresh proxies; returns once it is ready."""
        proxies = proxies_for(self.cluster.grpc_addresses, name=f"{name}-proxy")
        data_dir = self.base / name
        extra: list[str] = []
        for key, value in (meta or {}).items():
            extra += ["-meta", f"{key}={value}"]
        argv = client_argv(self.node_name(name), data_dir, [p.address for p in proxies], extra)
        agent = AgentProc(name, data_dir, self.base / f"{name}.log", proxies, argv)
        self.clients[name] = agent
        agent.start(self._env)
        node = self.wait_node(name, lambda n: n.status == "ready", "ready")
        agent.node_id = node.id
        return agent

    def restart_client(self, name: str) -> None:
        """Stop agent ``name`` (tasks keep running) and start a new one on its data dir."""
        agent = self.clients[name]
        assert agent.stop() == 0, f"{name} did not exit cleanly\n{self.logs()}"
        agent.start(self._env)

    def cut(self, name: str, mode: str = REFUSE) -> None:
        for proxy in self.clients[name].proxies:
            proxy.cut(mode)

    def heal(self, name: str) -> None:
        for proxy in self.clients[name].proxies:
            proxy.heal()

    # -- asking the servers ---------------------------------------------------------------

    @property
    def client(self) -> DroverClient:
        assert self.api is not None, "rig not started"
        return self.api

    def logs(self) -> str:
        parts = [self.cluster.logs_tail(20)]
        for agent in self.clients.values():
            tail = "\n".join(agent.log().splitlines()[-25:])
            state = "running" if agent.alive() else f"exited {agent.proc.returncode if agent.proc else '-'}"
            parts.append(f"--- {agent.log_path} ({state}) ---\n{tail}")
        return "\n".join(parts)

    def wait(self, predicate: Callable[[], T | None], what: str, timeout: float = WAIT_S) -> T:
        def check() -> T | None:
            for agent in self.clients.values():
                if agent.proc is not None and not agent.alive():
                    raise AssertionError(f"client agent {agent.name} exited\n{self.logs()}")
            return predicate()

        result = wait_for(check, timeout, 0.1, lambda: f"{what}\n{self.logs()}")
        assert result is not None
        return result

    def node_name(self, name: str) -> str:
        """The servers' name for the node of client agent ``name`` (what a job's
        ``${node.unique.name}`` sees)."""
        return self.node_prefix + name

    def node_by_name(self, name: str) -> structs_pb2.Node | None:
        node_name = self.node_name(name)
        return next((n for n in self.client.list_nodes().nodes if n.name == node_name), None)

    def full_node(self, name: str) -> structs_pb2.Node:
        node = self.node_by_name(name)
        assert node is not None, f"no node {name}"
        return self.client.get_node(node.id).node

    def wait_node(
        self, name: str, cond: Callable[[structs_pb2.Node], bool], what: str, timeout: float = WAIT_S
    ) -> structs_pb2.Node:
        def check() -> structs_pb2.Node | None:
            node = self.node_by_name(name)
            return node if node is not None and cond(node) else None

        return self.wait(check, f"node {name} {what}", timeout)

    def wait_status(self, name: str, status: str, timeout: float = WAIT_S) -> structs_pb2.Node:
        return self.wait_node(name, lambda n: n.status == status, status, timeout)

    def allocs(self, job_id: str) -> list[structs_pb2.Allocation]:
        return list(self.client.list_allocs(job_id=job_id).allocs)

    def alloc(self, alloc_id: str) -> structs_pb2.Allocation:
        return self.client.get_alloc(alloc_id).alloc

    def wait_alloc(
        self,
        alloc_id: str,
        cond: Callable[[structs_pb2.Allocation], bool],
        what: str,
        timeout: float = WAIT_S,
    ) -> structs_pb2.Allocation:
        def check() -> structs_pb2.Allocation | None:
            a = self.alloc(alloc_id)
            return a if cond(a) else None

        return self.wait(check, f"alloc {alloc_id[:8]} {what}", timeout)

    def running(self, job_id: str) -> list[structs_pb2.Allocation]:
        return [a for a in self.allocs(job_id) if a.desired_status == "run" and a.client_status == "running"]

    def wait_running(self, job_id: str, n: int, timeout: float = WAIT_S) -> list[structs_pb2.Allocation]:
        def check() -> list[structs_pb2.Allocation] | None:
            found = self.running(job_id)
            return found if len(found) == n and all(pid_of(a) for a in found) else None

        return self.wait(check, f"{n} running alloc(s) of {job_id} with a pid", timeout)

    def wait_evals_done(self, job_id: str, timeout: float = WAIT_S) -> None:
        """No eval of the job pending (blocked ones may stay: they wait for capacity)."""

        def check() -> bool:
            evals = self.client.list_evals(job_id=job_id).evals
            return bool(evals) and all(e.status != "pending" for e in evals)

        self.wait(check, f"every eval of {job_id} processed", timeout)

    def heartbeat_verdicts(self, node_id: str) -> list[str]:
        """The leaders' "heartbeat missed" log lines about ``node_id``, from every server."""
        lines = []
        for i in range(len(self.cluster.server_names)):
            lines += [
                ln for ln in self.cluster.log(i).splitlines() if "heartbeat_missed" in ln and node_id in ln
            ]
        return lines


@contextlib.contextmanager
def _started(rig: Rig) -> Iterator[Rig]:
    try:
        rig.start()
        yield rig
    finally:
        rig.close()


@pytest.fixture(scope="module")
def shared_servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """The three servers (``SERVER_ARGS``) that ``rig`` lends to each test of the module."""
    with LocalCluster(tmp_path_factory.mktemp("shared") / "cluster", servers=3, extra_args=SERVER_ARGS) as c:
        yield c


_rigs_lent = itertools.count(1)


@pytest.fixture
def rig(shared_servers: LocalCluster, tmp_path: Path) -> Iterator[Rig]:
    """Client agents of the test's own on servers shared by the module, for tests that
    leave the servers alone (they cut only the clients' links): a cluster start and stop
    saved per test. The test's nodes and jobs are its own (``Rig``); ``fresh_rig`` is
    for a test that kills or stops a server."""
    with _started(Rig(tmp_path / "rig", cluster=shared_servers, node_prefix=f"t{next(_rigs_lent)}-")) as r:
        yield r


@pytest.fixture
def fresh_rig(tmp_path: Path) -> Iterator[Rig]:
    """A rig with servers of its own, started and stopped around the test."""
    with _started(Rig(tmp_path / "rig")) as r:
        yield r


@pytest.fixture
def patient_rig(tmp_path: Path) -> Iterator[Rig]:
    """Like ``rig``, but the servers wait TTL + 4s: room for a cut that must go unnoticed."""
    args = ("-min-heartbeat-ttl", "1s", "-heartbeat-grace", "4s", "-failover-heartbeat-ttl", "10s")
    with _started(Rig(tmp_path / "rig", server_args=args)) as r:
        yield r


# --- helpers about the task process -------------------------------------------------------


def pid_of(alloc: structs_pb2.Allocation) -> int:
    return int(alloc.task_states[TASK].pid) if TASK in alloc.task_states else 0


def events_of(alloc: structs_pb2.Allocation) -> list[str]:
    return [e.type for e in alloc.task_states[TASK].events] if TASK in alloc.task_states else []


def history_of(alloc: structs_pb2.Allocation) -> list[str]:
    return [c.value for c in alloc.state_history if c.field == "client_status"]


def process_identity(pid: int) -> tuple[int, float] | None:
    """(pid, create_time) of a live process (zombies count as gone), else None."""
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return None
        return pid, proc.create_time()
    except psutil.Error:
        return None


def assert_same_process(pid: int, identity: tuple[int, float] | None) -> None:
    assert identity is not None
    assert process_identity(pid) == identity, f"pid {pid} is not the original task process any more"


# --- the proxy on its own -------------------------------------------------------------------


@contextlib.contextmanager
def _echo_server() -> Iterator[str]:
    import socket

    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)
    stop = threading.Event()
    conns: list[socket.socket] = []

    def serve(c: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := c.recv(4096):
                c.sendall(data)

    def loop() -> None:
        srv.settimeout(0.05)
        while not stop.is_set():
            try:
                c, _ = srv.accept()
            except (TimeoutError, OSError):
                continue
            conns.append(c)
            threading.Thread(target=serve, args=(c,), daemon=True).start()

    t = threading.Thread(target=loop, daemon=True)
    t.start()
    try:
        yield f"127.0.0.1:{srv.getsockname()[1]}"
    finally:
        stop.set()
        t.join(5)
        for c in conns:
            with contextlib.suppress(OSError):
                c.shutdown(socket.SHUT_RDWR)
            c.close()
        srv.close()


def _roundtrip(address: str, payload: bytes = b"ping", timeout: float = 1.0) -> bytes:
    import socket

    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=timeout) as s:
        s.sendall(payload)
        return s.recv(4096)


def test_proxy__forwards_cuts_refuses_blackholes_and_heals() -> None:
    import socket

    with _echo_server() as target, TcpProxy(target) as proxy:
        assert _roundtrip(proxy.address) == b"ping"

        live = socket.create_connection((proxy.host, proxy.port), timeout=2)
        live.sendall(b"a")
        assert live.recv(16) == b"a"
        # The first round trip's link ends on its own (EOF); wait until only ``live`` is left.
        wait_for(lambda: proxy.stats().live == 1, 5, 0.01, "the finished link to go")
        proxy.cut()  # REFUSE
        # The live connection was reset, and a new one is reset on arrival.
        with pytest.raises(OSError):
            live.sendall(b"b")
            if not live.recv(16):
                raise ConnectionResetError("closed")
        live.close()
        with pytest.raises(OSError):
            _roundtrip(proxy.address)
        assert proxy.stats().refused >= 1 and proxy.stats().aborted == 1

        proxy.cut(BLACKHOLE)
        with pytest.raises(TimeoutError):
            _roundtrip(proxy.address, timeout=0.3)  # accepted, never answered
        assert proxy.stats().blackholed >= 1

        proxy.heal()
        assert _roundtrip(proxy.address) == b"ping"
        assert proxy.mode is None
    assert proxy.threads_alive() == 0


# --- seed case 1: no replacement possible; the same alloc and process come back -------------


def test_seed1__reconnect_without_replacement_keeps_alloc_and_process(rig: Rig) -> None:
    agent = rig.add_client("c1")
    rig.client.register_job(raw_exec_job("seed1", disconnect='lost_after = "10m"\n      replace = true'))
    (alloc,) = rig.wait_running("seed1", 1)
    pid = pid_of(alloc)
    identity = process_identity(pid)
    assert identity is not None, f"task process {pid} not found"

    with StatusRecorder(rig) as recorder:
        rig.cut("c1")
        rig.wait_status("c1", "disconnected")
        rig.wait_alloc(alloc.id, lambda a: a.client_status == "unknown", "unknown")
        # The only node is away: the replacement cannot be placed anywhere.
        rig.wait_evals_done("seed1")
        assert [a.id for a in rig.allocs("seed1")] == [alloc.id]
        assert_same_process(pid, identity)  # the client keeps its work while cut off

        rig.heal("c1")
        rig.wait_status("c1", "ready")
        rig.wait_alloc(alloc.id, lambda a: a.client_status == "running", "running again")
        rig.wait_evals_done("seed1")
        recorder.wait_seen("c1", "ready")
    assert [a.id for a in rig.allocs("seed1")] == [alloc.id], "a second alloc appeared"
    back = rig.alloc(alloc.id)
    assert back.desired_status == "run" and back.client_status == "running"
    assert pid_of(back) == pid
    assert_same_process(pid, identity)
    events = events_of(back)
    assert events.count("Started") == 1, events  # never restarted
    assert "Reconnected" in events, events
    assert back.task_states[TASK].restarts == 0
    assert history_of(back)[-2:] == ["unknown", "running"], history_of(back)
    assert not [e.id for e in rig.client.list_evals(job_id="seed1").evals if e.status == "blocked"]
    summary = rig.client.job_summary("seed1").summary.summary["g"]
    assert (summary.running, summary.unknown, summary.lost, summary.queued) == (1, 0, 0, 0), summary
    # The node came back through "initializing" (alloc states resent) before "ready".
    assert recorder.seen["c1"] == ["ready", "disconnected", "initializing", "ready"], recorder.seen["c1"]
    assert agent.log().count("client.registered") == 2  # once at start, once on reconnect


# --- seed case 2: a replacement ran meanwhile; the strategy picks the survivor --------------


@pytest.mark.parametrize(
    ("reconcile", "affinity_to", "survivor"),
    [
        # The seed: the original's node has the affinity, so the original stays.
        ("best_score", "ca", "original"),
        # The replacement landed on the node the job prefers: it stays, the original goes.
        ("best_score", "cb", "replacement"),
        ("keep_original", "cb", "original"),
        ("keep_replacement", "ca", "replacement"),
        # The original started first, even though the replacement's node scores better.
        ("longest_running", "cb", "original"),
    ],
)
def test_seed2__reconnect_with_a_replacement_keeps_one_per_strategy(
    rig: Rig, reconcile: str, affinity_to: str, survivor: str
) -> None:
    # ca first and alone, so the original is on ca whatever the affinity says; cb joins
    # afterwards and can take the replacement.
    a = rig.add_client("ca")
    job_id = f"seed2-{reconcile}-{affinity_to}"  # one per case: the servers are shared
    job = raw_exec_job(
        job_id,
        disconnect=f'lost_after = "10m"\n      replace = true\n      reconcile = "{reconcile}"',
        affinity_to=rig.node_name(affinity_to),
    )
    rig.client.register_job(job)
    (original,) = rig.wait_running(job_id, 1)
    assert original.node_id == a.node_id
    original_proc = process_identity(pid_of(original))
    b = rig.add_client("cb")

    rig.cut("ca")
    rig.wait_status("ca", "disconnected")
    rig.wait_alloc(original.id, lambda x: x.client_status == "unknown", "unknown")
    replacement = rig.wait(
        lambda: next((x for x in rig.running(job_id) if x.node_id == b.node_id and pid_of(x)), None),
        "a replacement running on cb",
    )
    assert replacement.previous_allocation == original.id
    replacement_proc = process_identity(pid_of(replacement))
    # Both copies run now, as in the seed: the servers only know about one of them.
    assert_same_process(pid_of(original), original_proc)
    assert_same_process(pid_of(replacement), replacement_proc)

    rig.heal("ca")
    rig.wait_status("ca", "ready")
    keep, drop = (original, replacement) if survivor == "original" else (replacement, original)
    keep_proc, drop_proc = (
        (original_proc, replacement_proc) if survivor == "original" else (replacement_proc, original_proc)
    )
    rig.wait_alloc(drop.id, lambda x: x.desired_status == "stop", "stopped (the reconnect loser)")
    rig.wait(lambda: process_identity(pid_of(drop)) is None, f"the loser's process {pid_of(drop)} to exit")
    rig.wait_evals_done(job_id)
    running = rig.wait_running(job_id, 1)
    assert [x.id for x in running] == [keep.id]
    kept = rig.alloc(keep.id)
    assert pid_of(kept) == pid_of(keep)
    assert_same_process(pid_of(kept), keep_proc)
    assert events_of(kept).count("Started") == 1, events_of(kept)
    assert [x.id for x in rig.allocs(job_id) if x.desired_status == "run"] == [keep.id]
    assert drop_proc is not None


# --- leader failover: healthy clients are never marked down ---------------------------------


def _no_verdicts(rig: Rig, name: str, seen: dict[str, list[str]]) -> None:
    agent = rig.clients[name]
    assert seen.get(name) == ["ready"], f"{name} was seen as {seen.get(name)}"
    assert rig.heartbeat_verdicts(agent.node_id) == []
    messages = [e.message for e in rig.full_node(name).events]
    assert not any("missed" in m or "down" in m for m in messages), messages


def test_leader_killed_while_a_client_is_cut_off(fresh_rig: Rig) -> None:
    rig = fresh_rig
    rig.add_client("c1")
    rig.client.register_job(raw_exec_job("lk", disconnect='lost_after = "10m"\n      replace = false'))
    (alloc,) = rig.wait_running("lk", 1)
    identity = process_identity(pid_of(alloc))
    rig.add_client("c2")
    with StatusRecorder(rig) as recorder:
        rig.cut("c1")
        # At once, before the old leader's timer for c1 runs out: the new leader must
        # still notice c1 (failover TTL), and must not judge c2 on stale timers.
        old = rig.cluster.leader_index(WAIT_S)
        rig.cluster.kill(old)
        rig.cluster.wait_for_leader(WAIT_S)
        rig.wait_status("c1", "disconnected")
        rig.wait_alloc(alloc.id, lambda a: a.client_status == "unknown", "unknown")
        rig.heal("c1")
        rig.wait_status("c1", "ready")
        rig.wait_alloc(alloc.id, lambda a: a.client_status == "running", "running again")
        rig.cluster.restart(old)
        wait_settled(rig.cluster, WAIT_S)
    _no_verdicts(rig, "c2", recorder.seen)
    assert "down" not in recorder.seen["c1"], recorder.seen["c1"]
    assert "disconnected" in recorder.seen["c1"], recorder.seen["c1"]
    back = rig.alloc(alloc.id)
    assert pid_of(back) == pid_of(alloc)
    assert_same_process(pid_of(back), identity)
    assert events_of(back).count("Started") == 1


def test_leader_killed_while_every_client_is_healthy(fresh_rig: Rig) -> None:
    rig = fresh_rig
    rig.add_client("c1")
    rig.add_client("c2")
    with StatusRecorder(rig) as recorder:
        for _ in range(2):
            old = rig.cluster.leader_index(WAIT_S)
            rig.cluster.kill(old)
            rig.cluster.wait_for_leader(WAIT_S)
            elected = time.monotonic()
            # The new leader judges a node no earlier than the failover TTL (8s) after it
            # took over, and later only TTL + grace (< 3s) after the node's last heartbeat:
            # watch a window that covers both.
            window_ends = elected + 8.0 + 3.0 + 2.0

            def window_over(end: float = window_ends) -> bool:
                return time.monotonic() > end

            rig.wait(window_over, "the failover window to pass", window_ends - time.monotonic() + 5)
            rig.cluster.restart(old)
            wait_settled(rig.cluster, WAIT_S)
    for name in ("c1", "c2"):
        _no_verdicts(rig, name, recorder.seen)


# --- lost_after, replace = false, stop_on_client_after ----------------------------------------


def test_lost_after_expiry__alloc_lost_replaced_node_down(rig: Rig) -> None:
    rig.add_client("c1")
    lost_after_s = 5
    rig.client.register_job(
        raw_exec_job("expiry", disconnect=f'lost_after = "{lost_after_s}s"\n      replace = false')
    )
    (alloc,) = rig.wait_running("expiry", 1)
    pid = pid_of(alloc)
    rig.add_client("c2")

    rig.cut("c1")
    rig.wait_status("c1", "disconnected")
    unknown = rig.wait_alloc(alloc.id, lambda a: a.client_status == "unknown", "unknown")
    unknown_at = max(c.time_ns for c in unknown.state_history if c.value == "unknown")
    # replace = false: nothing is placed while the original may come back...
    rig.wait_evals_done("expiry")
    assert [a.id for a in rig.allocs("expiry")] == [alloc.id]
    # ...and once lost_after has passed, the original is lost, replaced, and c1 is down.
    lost = rig.wait_alloc(
        alloc.id, lambda a: a.client_status == "lost", "lost", timeout=lost_after_s + WAIT_S
    )
    assert lost.desired_status == "stop"
    assert history_of(lost)[-2:] == ["unknown", "lost"], history_of(lost)
    rig.wait_status("c1", "down")
    (replacement,) = rig.wait_running("expiry", 1)
    assert replacement.node_id == rig.clients["c2"].node_id
    assert replacement.previous_allocation == alloc.id
    assert replacement.create_time_ns >= unknown_at + lost_after_s * 1_000_000_000
    assert process_identity(pid) is not None  # c1 cannot be told: its copy still runs

    # Back: c1 learns its alloc was stopped and kills it; the replacement stays.
    rig.heal("c1")
    rig.wait_status("c1", "ready")
    rig.wait(lambda: process_identity(pid) is None, f"the lost alloc's process {pid} to be stopped by c1")
    rig.wait_evals_done("expiry")
    assert [a.id for a in rig.running("expiry")] == [replacement.id]
    # c1 resent "running" for the lost alloc before it learnt to stop it: counted running
    # until it reports the stop. Then the summary counts the replacement alone.
    rig.wait_alloc(alloc.id, lambda a: a.client_status in ("lost", "complete"), "terminal again")

    def one_running() -> bool:
        summary = rig.client.job_summary("expiry").summary.summary["g"]
        return (summary.running, summary.unknown) == (1, 0)

    rig.wait(one_running, "the job summary to count one running alloc")


def test_replace_false__no_replacement_while_disconnected(rig: Rig) -> None:
    rig.add_client("c1")
    rig.client.register_job(raw_exec_job("norep", disconnect='lost_after = "10m"\n      replace = false'))
    (alloc,) = rig.wait_running("norep", 1)
    identity = process_identity(pid_of(alloc))
    rig.add_client("c2")  # room for a replacement, which must not be used

    rig.cut("c1", BLACKHOLE)  # silent this time: calls end by their deadline
    rig.wait_status("c1", "disconnected")
    rig.wait_alloc(alloc.id, lambda a: a.client_status == "unknown", "unknown")
    rig.wait_evals_done("norep")
    assert [a.id for a in rig.allocs("norep")] == [alloc.id]
    assert not [e for e in rig.client.list_evals(job_id="norep").evals if e.status == "blocked"]

    rig.heal("c1")
    rig.wait_status("c1", "ready")
    back = rig.wait_alloc(alloc.id, lambda a: a.client_status == "running", "running again")
    rig.wait_evals_done("norep")
    assert [a.id for a in rig.allocs("norep")] == [alloc.id]
    assert_same_process(pid_of(back), identity)
    assert events_of(back).count("Started") == 1


def test_stop_on_client_after__the_cut_off_client_stops_its_task(rig: Rig) -> None:
    agent = rig.add_client("c1")
    stop_after_s = 3
    rig.client.register_job(raw_exec_job("soca", disconnect=f'stop_on_client_after = "{stop_after_s}s"'))
    (alloc,) = rig.wait_running("soca", 1)
    pid = pid_of(alloc)
    assert process_identity(pid) is not None

    cut_at = time.monotonic()
    rig.cut("c1")
    rig.wait(lambda: process_identity(pid) is None, f"c1 to stop task process {pid} on its own")
    stopped_after = time.monotonic() - cut_at
    assert all(p.is_cut for p in agent.proxies), "the task must be stopped while still cut off"
    assert stopped_after >= stop_after_s - 1.0, f"stopped after {stopped_after:.1f}s, before the window"
    assert "client.stop_on_client_after" in agent.log()

    # Without lost_after the node goes down and the alloc is lost; back, the job runs again.
    rig.wait_status("c1", "down")
    rig.heal("c1")
    rig.wait_status("c1", "ready")
    (fresh,) = rig.wait_running("soca", 1)
    assert fresh.id != alloc.id and pid_of(fresh) != pid
    old = rig.alloc(alloc.id)
    assert old.desired_status == "stop" and old.client_status in ("lost", "complete", "failed")


# --- more ways to come back ------------------------------------------------------------------


def test_agent_restarted_while_cut_off_reattaches_and_reconnects(rig: Rig) -> None:
    agent = rig.add_client("c1")
    rig.client.register_job(raw_exec_job("rest", disconnect='lost_after = "10m"\n      replace = true'))
    (alloc,) = rig.wait_running("rest", 1)
    identity = process_identity(pid_of(alloc))

    rig.cut("c1")
    rig.wait_status("c1", "disconnected")
    rig.wait_alloc(alloc.id, lambda a: a.client_status == "unknown", "unknown")
    # Upgrade the agent while it cannot reach anyone: the task must survive both.
    rig.restart_client("c1")
    rig.wait(lambda: agent.log().count("client.started") == 2, "the new agent to start")
    assert_same_process(pid_of(alloc), identity)

    rig.heal("c1")
    rig.wait_status("c1", "ready")
    back = rig.wait_alloc(alloc.id, lambda a: a.client_status == "running", "running again")
    rig.wait_evals_done("rest")
    assert [a.id for a in rig.allocs("rest")] == [alloc.id]
    assert pid_of(back) == pid_of(alloc)
    assert_same_process(pid_of(back), identity)
    assert events_of(back).count("Started") == 1, events_of(back)


def test_short_cut_inside_the_ttl_changes_nothing(patient_rig: Rig) -> None:
    rig = patient_rig
    agent = rig.add_client("c1")
    rig.client.register_job(raw_exec_job("blip", disconnect='lost_after = "10m"\n      replace = true'))
    (alloc,) = rig.wait_running("blip", 1)
    with StatusRecorder(rig) as recorder:
        rig.cut("c1")
        # Long enough for the agent to notice (its heartbeat every TTL/2 fails), far
        # shorter than TTL + grace (>= 5s) after its last good heartbeat.
        rig.wait(lambda: "client.servers_unreachable" in agent.log(), "c1 to notice the cut", 5)
        rig.heal("c1")
        rig.wait(lambda: agent.log().count("client.registered") == 2, "c1 to register again")
        rig.wait_evals_done("blip")
    assert recorder.seen["c1"] == ["ready"], recorder.seen["c1"]
    assert rig.heartbeat_verdicts(agent.node_id) == []
    back = rig.alloc(alloc.id)
    assert back.client_status == "running" and history_of(back)[-1] == "running"
    assert "unknown" not in history_of(back)
    assert [a.id for a in rig.allocs("blip")] == [alloc.id]


def test_losing_all_but_one_follower_is_not_a_partition(rig: Rig) -> None:
    agent = rig.add_client("c1")
    rig.client.register_job(raw_exec_job("half", disconnect='lost_after = "10m"\n      replace = true'))
    (alloc,) = rig.wait_running("half", 1)
    leader = rig.cluster.leader_index(WAIT_S)
    in_use = next(i for i, p in enumerate(agent.proxies) if p.stats().live > 0)
    # Cut the server c1 talks to and the leader (another server if that is the same one):
    # c1 must move to the one follower left, which forwards its calls to the leader.
    cut = {in_use, leader}
    if len(cut) == 1:
        cut.add((leader + 1) % len(agent.proxies))
    (left,) = set(range(len(agent.proxies))) - cut
    with StatusRecorder(rig) as recorder:
        for i in cut:
            agent.proxies[i].cut()
        rig.wait(lambda: agent.proxies[left].stats().live > 0, "c1 to move to the follower left")
        # Several TTL + grace periods (< 3s) on that follower alone.
        t_end = time.monotonic() + 8.0
        rig.wait(lambda: time.monotonic() > t_end, "8s through one follower", 15)
        for i in cut:
            agent.proxies[i].heal()
    _no_verdicts(rig, "c1", recorder.seen)
    assert rig.alloc(alloc.id).client_status == "running"
    assert [a.id for a in rig.allocs("half")] == [alloc.id]


def test_flapping_link_keeps_the_same_alloc_and_process(rig: Rig) -> None:
    agent = rig.add_client("c1")
    rig.client.register_job(raw_exec_job("flap", disconnect='lost_after = "10m"\n      replace = true'))
    (alloc,) = rig.wait_running("flap", 1)
    identity = process_identity(pid_of(alloc))
    for cycle in range(3):
        rig.cut("c1", REFUSE if cycle % 2 == 0 else BLACKHOLE)
        rig.wait_status("c1", "disconnected")
        rig.wait_alloc(alloc.id, lambda a: a.client_status == "unknown", f"unknown (cycle {cycle})")
        rig.heal("c1")
        rig.wait_status("c1", "ready")
        rig.wait_alloc(alloc.id, lambda a: a.client_status == "running", f"running (cycle {cycle})")
    rig.wait_evals_done("flap")
    back = rig.alloc(alloc.id)
    assert [a.id for a in rig.allocs("flap")] == [alloc.id]
    assert_same_process(pid_of(back), identity)
    assert events_of(back).count("Started") == 1, events_of(back)
    assert history_of(back)[-6:] == ["unknown", "running"] * 3, history_of(back)
    assert agent.log().count("client.registered") == 4


# --- shutdown ---------------------------------------------------------------------------------


def test_servers_exit_promptly_on_sigterm_while_a_client_watches(fresh_rig: Rig) -> None:
    rig = fresh_rig
    rig.add_client("c1")
    rig.client.register_job(raw_exec_job("watch", disconnect='lost_after = "10m"'))
    # Once its alloc runs, the agent is back in its blocking GetClientAllocs (30s wait).
    rig.wait_running("watch", 1)
    codes = {}
    for i, name in enumerate(rig.cluster.server_names):
        started = time.monotonic()
        codes[name] = (rig.cluster.stop(i, timeout=5.0), round(time.monotonic() - started, 1))
    assert all(code == 0 for code, _ in codes.values()), (
        f"(exit status, seconds) per server: {codes}\n{rig.cluster.logs_tail(150)}"
    )
