"""Fixtures for tests that run real server processes on loopback."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import psutil
import pytest

from deploy.cluster import (
    TASK_REAP_TIMEOUT,
    LocalCluster,
    pick_free_ports,
    query_state_digest,
    wait_for,
)
from drover.sdk import DroverClient


def _working_under(proc: psutil.Process, roots: list[Path]) -> bool:
    with suppress(psutil.Error, OSError):
        cwd = Path(proc.cwd())
        return any(cwd == root or root in cwd.parents for root in roots)
    return False


def _dead(proc: psutil.Process) -> bool:
    """Gone, its pid reused, or a zombie: in every case nothing of it runs any more."""
    try:
        return not proc.is_running() or proc.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def kill_tasks_under(roots: Iterable[Path], timeout: float = TASK_REAP_TIMEOUT) -> None:
    """SIGKILL every process whose working directory is one of ``roots`` (resolved) or
    below one, the raw_exec tasks a stopped agent leaves behind, and wait until each is dead.

    Dead, not reaped: ``deploy.cluster.kill_processes_working_under`` waits for the reaping
    too (psutil.wait_procs), but an orphaned task is init's to reap, and this machine's init
    reaps ~1.7 s after the kill; a zombie runs nothing and holds no port or file, so that
    wait only cost every rig's teardown those seconds. A task that outlives SIGKILL by
    ``timeout`` fails the caller."""
    resolved = list(roots)
    victims = [proc for proc in psutil.process_iter() if _working_under(proc, resolved)]
    for proc in victims:
        with suppress(psutil.Error):
            proc.kill()
    wait_for(
        lambda: all(_dead(proc) for proc in victims),
        timeout,
        0.01,
        lambda: f"SIGKILLed tasks to die: {[p.pid for p in victims if not _dead(p)]}",
    )


def wait_settled(cluster: LocalCluster, timeout: float = 60) -> None:
    """A leader, and every server's gRPC address announced: the state stops changing."""
    cluster.wait_for_leader(timeout=timeout)

    def announced() -> bool:
        tls = cluster.tls.cli_files if cluster.tls is not None else None
        with DroverClient(
            cluster.grpc_addresses, retry_deadline=5, tls=tls, token=cluster.management_token
        ) as client:
            peers = client.raft_peers().peers
        return len(peers) == len(cluster.server_names) and all(p.grpc_address for p in peers)

    wait_for(announced, timeout, 0.1, "every server to announce its gRPC address")
    cluster.wait_converged(timeout=timeout)


def stop_clients_then_tasks(cluster: LocalCluster) -> None:
    """Stop the client agents, then their raw_exec tasks (``kill_tasks_under``): what
    ``stop_all`` does on the way out, minus its wait for init to reap the tasks (~1.7 s a
    cluster here), since ``stop_all`` then finds only zombies, which it skips. The servers
    are left to ``stop_all``."""
    for j in range(len(cluster.client_names)):
        cluster.stop_client(j)
    kill_tasks_under([cluster.client_data_dir(j).resolve() for j in range(len(cluster.client_names))])


@contextmanager
def _clients_stopped_first(cluster: LocalCluster) -> Iterator[LocalCluster]:
    """``cluster``, with ``stop_clients_then_tasks`` run before it is stopped, even when the
    test failed (``stop_all`` still follows if that raises)."""
    try:
        yield cluster
    finally:
        stop_clients_then_tasks(cluster)


@pytest.fixture
def two_clients(tmp_path: Path) -> Iterator[LocalCluster]:
    """One server and client agents c1 and c2, real processes, always stopped afterwards."""
    with LocalCluster(tmp_path / "cluster", servers=1, clients=2) as c, _clients_stopped_first(c):
        c.wait_for_leader(60)
        yield c


@pytest.fixture(scope="module")
def shared_two_clients(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """``two_clients`` shared by a module's tests: for tests that only add jobs of their
    own (distinct job ids) and leave the servers and agents as they found them, so the
    cluster is started once per file rather than once per test."""
    with (
        LocalCluster(tmp_path_factory.mktemp("shared") / "cluster", servers=1, clients=2) as c,
        _clients_stopped_first(c),
    ):
        c.wait_for_leader(60)
        yield c


def wait_ready_nodes(cluster: LocalCluster, count: int, timeout: float = 60) -> None:
    """At least ``count`` nodes ready: the client agents registered and heartbeating."""
    with DroverClient(cluster.grpc_addresses, retry_deadline=30) as client:
        wait_for(
            lambda: sum(n.status == "ready" for n in client.list_nodes().nodes) >= count,
            timeout,
            0.2,
            lambda: f"{count} ready nodes\n" + cluster.logs_tail(),
        )


@contextmanager
def ready_cluster(data_dir: Path, *, servers: int, clients: int) -> Iterator[LocalCluster]:
    """A LocalCluster settled (``wait_settled``) with all ``clients`` agents ready nodes, stopped
    on the way out: what a test that runs jobs needs before its first call, so none of them
    starts placing while an agent is still registering or a server has not announced itself."""
    with LocalCluster(data_dir, servers=servers, clients=clients) as cluster, _clients_stopped_first(cluster):
        wait_settled(cluster)
        wait_ready_nodes(cluster, clients)
        yield cluster


@pytest.fixture
def two_ready_clients(two_clients: LocalCluster) -> LocalCluster:
    """``two_clients``, once both agents are ready nodes: a job run now can use either."""
    wait_ready_nodes(two_clients, 2)
    return two_clients


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    """Three real server processes (free ports, temp data dirs), always stopped afterwards."""
    with LocalCluster(tmp_path / "cluster", servers=3) as c:
        wait_settled(c)
        yield c


class DevAgent:
    """One ``drover agent -dev`` process (server and embedded client) with its data under
    ``directory/dev`` and its output in ``directory/dev.log``.

    ``stop()`` ends it by its pid (SIGTERM, then SIGKILL to its session if it hangs) and
    then SIGKILLs every process still working under its data dir (``kill_tasks_under``):
    a dev agent's SIGTERM leaves its raw_exec tasks running by design (a restarted client
    re-attaches to them), and a test must not leave them behind.
    """

    def __init__(
        self,
        directory: Path,
        *args: str,
        grpc_port: int | None = None,
        http_port: int | None = None,
        port_flags: bool = True,
    ) -> None:
        """``args`` go after ``agent -dev -data-dir``; with ``port_flags`` (the default) the
        gRPC and HTTP ports (free ones unless given; ``http_port=0``: none) are passed as
        flags, without it they are the test's to set (say in a ``-config`` file)."""
        directory.mkdir(parents=True, exist_ok=True)
        # Picked together, so the two can not be one port.
        free = iter(pick_free_ports(2))
        grpc_port = next(free) if grpc_port is None else grpc_port
        http_port = next(free) if http_port is None else http_port
        self.grpc_port, self.http_port = grpc_port, http_port
        self.address = f"127.0.0.1:{grpc_port}"
        self.data_dir = directory / "dev"
        self.log_path = directory / "dev.log"
        argv = [sys.executable, "-m", "drover.cli", "agent", "-dev", "-data-dir", str(self.data_dir), *args]
        if port_flags:
            argv += ["-grpc-port", str(grpc_port), "-http-port", str(http_port)]
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self.returncode: int | None = None

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def alive(self) -> bool:
        """Still running; a dev agent that exited fails the caller at once, with its log."""
        if self.proc.poll() is not None:
            raise AssertionError(f"the dev agent exited {self.proc.returncode}:\n{self.log()}")
        return True

    def wait_leading(self, timeout: float = 60) -> None:
        def leading() -> bool:
            answer = query_state_digest(self.address) if self.alive() else None
            return answer is not None and answer.leader

        wait_for(leading, timeout, message=lambda: f"the dev agent to lead\n{self.log()[-2000:]}")

    def wait_node_ready(self, timeout: float = 60) -> None:
        with DroverClient(self.address, retry_deadline=timeout, connect_timeout=timeout) as client:
            wait_for(
                lambda: self.alive() and any(n.status == "ready" for n in client.list_nodes().nodes),
                timeout,
                0.2,
                lambda: f"the dev agent's node to be ready\n{self.log()[-2000:]}",
            )

    def stop(self) -> int:
        """End the agent and its tasks; its exit code (again on a second call). An agent
        that does not exit within 30 s of SIGTERM is killed and the call fails."""
        if self.returncode is not None:
            return self.returncode
        try:
            if self.proc.poll() is None:
                self.proc.send_signal(signal.SIGTERM)
                try:
                    self.proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                    self.proc.wait(timeout=10)
                    raise
        finally:
            kill_tasks_under([self.data_dir.resolve()])
        self.returncode = self.proc.returncode
        return self.returncode


# Starts a dev agent under a fresh directory; the fixture stops every one it started.
DevAgentFactory = Callable[..., DevAgent]


@pytest.fixture
def dev_agent_factory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevAgentFactory]:
    """``start(*args, **kwargs)`` -> a started ``DevAgent`` (``DevAgent``'s arguments after
    the directory); each one still running at teardown is stopped, its tasks with it."""
    started: list[DevAgent] = []

    def start(
        *args: str, grpc_port: int | None = None, http_port: int | None = None, port_flags: bool = True
    ) -> DevAgent:
        agent = DevAgent(
            tmp_path_factory.mktemp("dev-agent"),
            *args,
            grpc_port=grpc_port,
            http_port=http_port,
            port_flags=port_flags,
        )
        started.append(agent)
        return agent

    yield start
    for agent in reversed(started):
        agent.stop()  # a hung agent is killed, and its TimeoutExpired fails the teardown


@pytest.fixture(scope="module")
def dev_agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevAgent]:
    """One dev agent shared by a module's tests, once it leads and its node is ready. Each
    test uses jobs of its own, so sharing costs nothing but a startup per module."""
    agent = DevAgent(tmp_path_factory.mktemp("dev-agent"))
    try:
        agent.wait_leading()
        agent.wait_node_ready()
        yield agent
    finally:
        agent.stop()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/cluster/" in str(item.fspath):
            item.add_marker(pytest.mark.cluster)
