"""The client agent against an in-process fake of the servers (tests/unit/test_client_fake_server).

Grouped by situation: registration and heartbeats; allocs arriving and leaving through the
blocking query; status reports; the restart policy; losing the servers (offline queueing,
re-register before resend, failover, stop_on_client_after); and agent restarts
(re-attaching to the same processes). Every process a test starts is killed afterwards.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import psutil
import pytest
from prometheus_client import REGISTRY

from drover.client.agent import AgentTuning, ClientAgent
from drover.client.config import EmbeddedSettings
from drover.client.drivers import raw_exec
from drover.v1 import structs_pb2
from tests.unit.test_client_fake_server import (
    FakeNodes,
    FakeServer,
    alive,
    alloc,
    fake_server,
    job,
    task,
    wait_until,
)

S = 1_000_000_000
REPO = Path(__file__).resolve().parents[2]

FAST = AgentTuning(
    sync_interval_s=0.2,
    watch_wait_s=2.0,
    rpc_timeout_s=2.0,
    backoff_base_s=0.05,
    backoff_cap_s=0.3,
    watchdog_interval_s=0.05,
)


def settings(data_dir: Path, *servers: FakeServer) -> EmbeddedSettings:
    # These tests run raw_exec tasks: an agent offers the driver only when it is enabled.
    return EmbeddedSettings(
        node_name="c1",
        data_dir=str(data_dir),
        servers=tuple(s.address for s in servers),
        enable_raw_exec=True,
    )


@contextmanager
def running_agent(data_dir: Path, *servers: FakeServer, tuning: AgentTuning = FAST) -> Iterator[ClientAgent]:
    agent = ClientAgent(settings(data_dir, *servers), tuning=tuning)
    agent.start()
    try:
        yield agent
    finally:
        agent.stop(timeout_s=10)


@contextmanager
def agent_running_a1(data_dir: Path, server: FakeServer, j: structs_pb2.Job) -> Iterator[ClientAgent]:
    """A registered agent whose alloc "a1" of ``j`` the servers placed and it reports running."""
    with running_agent(data_dir, server) as agent:
        agent.wait_registered(10)
        server.nodes.place(alloc("a1", j, agent.node_id), j)
        wait_until(lambda: status_is(server.nodes, "a1", "running"), 10, "a1 running")
        yield agent


@pytest.fixture
def server() -> Iterator[FakeServer]:
    with fake_server() as s:
        yield s


def processes_of(alloc_id: str) -> list[int]:
    """Live processes started for ``alloc_id`` (raw_exec sets DROVER_ALLOC_ID)."""
    found = []
    for proc in psutil.process_iter(["pid"]):
        try:
            if proc.environ().get("DROVER_ALLOC_ID") == alloc_id and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc.pid)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return sorted(found)


def status_is(nodes: FakeNodes, alloc_id: str, expected: str) -> bool:
    return nodes.client_status(alloc_id) == expected


def event_types(nodes: FakeNodes, alloc_id: str, task_name: str = "main") -> list[str]:
    ts = nodes.task_state(alloc_id, task_name)
    return [e.type for e in ts.events] if ts else []


def sleep_task(seconds: int = 30) -> structs_pb2.Task:
    return task(driver="raw_exec", config=f'{{"command": "sleep", "args": ["{seconds}"]}}')


def task_pid(server: FakeServer, alloc_id: str, pids: list[int]) -> int:
    """The PID the agent reported for the alloc's task, once it has; added to ``pids``."""
    pid = wait_until(lambda: (server.nodes.task_state(alloc_id) or structs_pb2.TaskState()).pid, 10, "a pid")
    pids.append(pid)
    return pid


@contextmanager
def agent_leaving_tasks(data_dir: Path, server: FakeServer) -> Iterator[ClientAgent]:
    """A registered agent that, when the block ends, stops and leaves its tasks running (as
    ``drover agent`` does on SIGTERM) for the next agent on the same data dir."""
    agent = ClientAgent(settings(data_dir, server), tuning=FAST)
    agent.start()
    try:
        agent.wait_registered(10)
        yield agent
    finally:
        agent.stop(leave_tasks_running=True, timeout_s=10)


# --- registration and heartbeats ---------------------------------------------------------------


def test_agent__registers_with_fingerprint_and_persistent_identity(
    tmp_path: Path, server: FakeServer
) -> None:
    with running_agent(tmp_path, server) as agent:
        wait_until(lambda: server.nodes.registrations, 10, "a registration")
        node = server.nodes.registrations[0]
        assert (node.id, node.secret_id) == (agent.node_id, agent.secret_id)
        assert node.name == "c1" and node.datacenter == "dc1" and node.status == "ready"
        assert node.resources.cpu_mhz >= 1000 and node.resources.memory_mb > 0 and node.resources.disk_mb > 0
        assert (node.resources.min_dynamic_port, node.resources.max_dynamic_port) == (20000, 32000)
        attrs = node.attributes
        assert attrs["driver.mock"] == attrs["driver.raw_exec"] == "1"
        assert attrs["unique.name"] == "c1" and attrs["kernel.name"] == "linux"
        assert int(attrs["cpu.numcores"]) >= 1
        first_id = agent.node_id
    with running_agent(tmp_path, server) as again:
        assert again.node_id == first_id  # made once, kept in data_dir


def test_agent__heartbeats_every_half_ttl(tmp_path: Path) -> None:
    with fake_server(ttl_ns=400_000_000) as server, running_agent(tmp_path, server):
        wait_until(lambda: len(server.nodes.heartbeat_times()) >= 6, 10, "six heartbeats")
        times = server.nodes.heartbeat_times()
        gaps = sorted(b - a for a, b in itertools.pairwise(times))
        median = gaps[len(gaps) // 2]
        assert 0.15 <= median <= 0.35, gaps


def test_agent__a_slow_heartbeat_answer_is_waited_for_while_the_ttl_allows(tmp_path: Path) -> None:
    # A 3 s TTL: a heartbeat every 1.5 s, sent with 1.5 s of TTL left, so it waits up to
    # 1.5 - 0.5 = 1 s (client_agent/sync.py heartbeat_timeout_s) where the RPC timeout is
    # 0.5 s. Answers held 0.8 s would time out at 0.5 s, count as lost contact and make the
    # agent register again; waited for, they keep the node registered.
    tuning = dataclasses.replace(FAST, rpc_timeout_s=0.5)
    with fake_server(ttl_ns=3 * S) as server, running_agent(tmp_path, server, tuning=tuning) as agent:
        agent.wait_registered(10)
        registrations = server.nodes.methods().count("Register")
        server.nodes.heartbeat_delay_s = 0.8
        heard = len(server.nodes.heartbeat_times())
        # A timed-out heartbeat would be followed by a Register before the next one.
        wait_until(lambda: len(server.nodes.heartbeat_times()) >= heard + 3, 15, "three slow heartbeats")
        assert server.nodes.methods().count("Register") == registrations
        assert agent.registered


# --- allocs through the blocking query ------------------------------------------------------


def test_agent__alloc_placed_runs__desired_stop_stops_it(tmp_path: Path, server: FakeServer) -> None:
    with agent_running_a1(tmp_path, server, job()):
        assert event_types(server.nodes, "a1")[:2] == ["Received", "Started"]
        queries_before = server.nodes.methods().count("GetClientAllocs")
        server.nodes.set_desired("a1", "stop")
        wait_until(lambda: status_is(server.nodes, "a1", "complete"), 10, "a1 complete after desired stop")
        assert event_types(server.nodes, "a1")[-3:] == ["Killing", "Terminated", "Killed"]
        # Blocking queries, not polling: a handful of calls for the changes, not dozens.
        assert server.nodes.methods().count("GetClientAllocs") - queries_before <= 6


def test_agent__status_updates_are_batched_per_tick(tmp_path: Path, server: FakeServer) -> None:
    with running_agent(tmp_path, server) as agent:
        agent.wait_registered(10)
        j = job()
        ids = [f"a{i}" for i in range(5)]
        server.nodes.place_many([alloc(i, j, agent.node_id) for i in ids], j)
        wait_until(lambda: all(status_is(server.nodes, i, "running") for i in ids), 10, "all five running")
        requests = list(server.nodes.update_requests)
        # Ten changes (pending, running for each) went out in a few coalesced requests...
        assert max(len(r.allocs) for r in requests) >= 2
        assert len(requests) < 10
        # ...and never faster than the sync tick.
        times = server.nodes.update_times
        assert all(b - a >= 0.15 for a, b in itertools.pairwise(times)), times
        for r in requests:
            assert r.node_id == agent.node_id and r.secret_id == agent.secret_id


def test_agent__mock_run_for_exit_code__complete_or_failed(tmp_path: Path, server: FakeServer) -> None:
    no_restart = structs_pb2.RestartPolicy(attempts=0, interval_ns=60 * S, delay_ns=S, mode="fail")
    ok = job("ok", job_type="batch", tasks=[task(config='{"run_for": "200ms", "exit_code": 0}')])
    bad = job(
        "bad",
        job_type="batch",
        tasks=[task(config='{"run_for": "200ms", "exit_code": 2}')],
        restart=no_restart,
    )
    with running_agent(tmp_path, server) as agent:
        agent.wait_registered(10)
        server.nodes.place(alloc("ok1", ok, agent.node_id), ok)
        server.nodes.place(alloc("bad1", bad, agent.node_id), bad)
        wait_until(lambda: status_is(server.nodes, "ok1", "complete"), 10, "ok1 complete")
        wait_until(lambda: status_is(server.nodes, "bad1", "failed"), 10, "bad1 failed")
        ts = server.nodes.task_state("bad1")
        assert ts is not None and ts.state == "dead" and ts.failed
        terminated = [e for e in ts.events if e.type == "Terminated"]
        assert terminated and terminated[-1].exit_code == 2
        ok_state = server.nodes.task_state("ok1")
        assert (
            ok_state is not None and not ok_state.failed and ok_state.finished_at_ns >= ok_state.started_at_ns
        )


def test_agent__missing_job_or_driver__alloc_failed(tmp_path: Path, server: FakeServer) -> None:
    odd = job("odd", tasks=[task(driver="docker")])
    with running_agent(tmp_path, server) as agent:
        agent.wait_registered(10)
        server.nodes.place(alloc("odd1", odd, agent.node_id), odd)
        wait_until(lambda: status_is(server.nodes, "odd1", "failed"), 10, "unknown driver fails the alloc")
        assert "Driver Failure" in event_types(server.nodes, "odd1")


# --- restart policy ---------------------------------------------------------------------------


def test_agent__restart_policy__restarts_then_fails(tmp_path: Path, server: FakeServer) -> None:
    policy = structs_pb2.RestartPolicy(attempts=2, interval_ns=60 * S, delay_ns=50_000_000, mode="fail")
    flaky = job("flaky", tasks=[task(config='{"run_for": "50ms", "exit_code": 1}')], restart=policy)
    restarts_before, starts_before = _mock_restarts(), _mock_starts()
    with running_agent(tmp_path, server) as agent:
        agent.wait_registered(10)
        server.nodes.place(alloc("f1", flaky, agent.node_id), flaky)
        wait_until(lambda: status_is(server.nodes, "f1", "failed"), 10, "f1 failed after its restarts")
        ts = server.nodes.task_state("f1")
        assert ts is not None and ts.restarts == 2 and ts.state == "dead" and ts.failed
        types = [e.type for e in ts.events]
        assert types.count("Restarting") == 2 and types[-1] == "Not Restarting"
    # The client's metrics count what the task states say: 2 restarts, 3 driver starts.
    assert (_mock_restarts() - restarts_before, _mock_starts() - starts_before) == (2, 3)


def _mock_restarts() -> float:
    return REGISTRY.get_sample_value("drover_client_task_restarts_total", {"driver": "mock"}) or 0.0


def _mock_starts() -> float:
    return REGISTRY.get_sample_value("drover_client_driver_start_seconds_count", {"driver": "mock"}) or 0.0


def test_agent__restart_policy__service_restarts_a_crashed_process(
    tmp_path: Path, server: FakeServer, pids: list[int]
) -> None:
    policy = structs_pb2.RestartPolicy(attempts=3, interval_ns=60 * S, delay_ns=50_000_000, mode="fail")
    svc = job("svc", tasks=[sleep_task()], restart=policy)
    with running_agent(tmp_path, server) as agent:
        agent.wait_registered(10)
        server.nodes.place(alloc("s1", svc, agent.node_id), svc)
        first = task_pid(server, "s1", pids)
        os.killpg(first, signal.SIGKILL)

        def restarted() -> int:
            ts = server.nodes.task_state("s1")
            return ts.pid if ts and ts.state == "running" and ts.pid != first and ts.restarts == 1 else 0

        second = wait_until(restarted, 10, "the task restarted with a new process")
        pids.append(second)
        assert status_is(server.nodes, "s1", "running")


# --- raw_exec through the agent ---------------------------------------------------------------


def test_agent__raw_exec_ignoring_sigterm__killed_after_kill_timeout(
    tmp_path: Path, server: FakeServer, pids: list[int]
) -> None:
    stubborn = task(
        driver="raw_exec",
        config='{"command": "sh", "args": ["-c", "trap \\"\\" TERM; sleep 30"]}',
        kill_timeout_ns=500_000_000,
    )
    j = job("stubborn", tasks=[stubborn])
    with running_agent(tmp_path, server) as agent:
        agent.wait_registered(10)
        server.nodes.place(alloc("k1", j, agent.node_id), j)
        task_pid(server, "k1", pids)
        wait_until(lambda: len(processes_of("k1")) == 2, 5, "sh and its sleep")
        started = time.monotonic()
        server.nodes.set_desired("k1", "stop")
        wait_until(lambda: status_is(server.nodes, "k1", "complete"), 10, "k1 complete")
        assert time.monotonic() - started >= 0.5
        assert processes_of("k1") == []
        ts = server.nodes.task_state("k1")
        assert ts is not None
        terminated = [e for e in ts.events if e.type == "Terminated"]
        assert terminated and terminated[-1].exit_code == 128 + signal.SIGKILL


# --- losing the servers --------------------------------------------------------------------------


def test_agent__offline__tasks_keep_running__updates_delivered_after_reregister(
    tmp_path: Path, server: FakeServer, pids: list[int]
) -> None:
    svc = job("svc", tasks=[sleep_task()])
    short = job("short", job_type="batch", tasks=[task(config='{"run_for": "1s"}')])
    with running_agent(tmp_path, server) as agent:
        agent.wait_registered(10)
        server.nodes.place(alloc("svc1", svc, agent.node_id), svc)
        server.nodes.place(alloc("short1", short, agent.node_id), short)
        pid = task_pid(server, "svc1", pids)
        wait_until(lambda: status_is(server.nodes, "short1", "running"), 10, "short1 running")

        server.nodes.set_unavailable(True)
        wait_until(lambda: not agent.registered, 10, "the agent noticing the servers are gone")
        # While offline: the batch task finishes; the update waits in the queue.
        wait_until(
            lambda: (
                (q := agent.pending_updates().get("short1")) is not None and q.client_status == "complete"
            ),
            10,
            "short1 complete, queued",
        )
        assert status_is(server.nodes, "short1", "running")  # the servers have not heard yet
        assert alive(pid) and processes_of("svc1") == [pid]
        calls_before = len(server.nodes.calls)

        server.nodes.set_unavailable(False)
        wait_until(lambda: status_is(server.nodes, "short1", "complete"), 10, "the queued update delivered")
        after = [(m, o) for m, o in server.nodes.calls[calls_before:] if o == "OK"]
        assert after[0][0] == "Register", after  # registered again before anything else
        first_update = next(i for i, (m, _) in enumerate(after) if m == "UpdateAllocs")
        assert "Register" in [m for m, _ in after[:first_update]]
        # Everything is resent after the reconnect, the untouched service included.
        resent = {a.id for r in server.nodes.update_requests[-3:] for a in r.allocs}
        assert {"svc1", "short1"} <= resent
        assert status_is(server.nodes, "svc1", "running") and processes_of("svc1") == [pid]


def test_agent__marked_down__refused_updates__registers_again_then_resends(
    tmp_path: Path, server: FakeServer
) -> None:
    with agent_running_a1(tmp_path, server, job()) as agent:
        server.nodes.mark_down(agent.node_id)
        wait_until(lambda: len(server.nodes.registrations) >= 2, 10, "a second registration")
        n_updates = len(server.nodes.update_requests)
        wait_until(lambda: len(server.nodes.update_requests) > n_updates, 10, "states resent")
        assert "a1" in {a.id for a in server.nodes.update_requests[-1].allocs}
        assert agent.registrations >= 2


def test_agent__server_marked_alloc_unknown__reconnected_event_and_running_again(
    tmp_path: Path, server: FakeServer
) -> None:
    with agent_running_a1(tmp_path, server, job()):
        server.nodes.set_server_client_status("a1", "unknown")
        wait_until(lambda: status_is(server.nodes, "a1", "running"), 10, "a1 reported running again")
        wait_until(lambda: "Reconnected" in event_types(server.nodes, "a1"), 10, "a Reconnected event")
        assert event_types(server.nodes, "a1").count("Started") == 1  # not restarted


def test_agent__failover__rotates_to_the_next_server(tmp_path: Path) -> None:
    with fake_server() as first, fake_server() as second, running_agent(tmp_path, first, second) as agent:
        wait_until(lambda: first.nodes.registrations, 10, "registered with the first server")
        first.stop()
        wait_until(lambda: second.nodes.registrations, 10, "registered with the second server")
        j = job()
        second.nodes.place(alloc("a1", j, agent.node_id), j)
        wait_until(lambda: status_is(second.nodes, "a1", "running"), 10, "a1 running via the second")


def test_agent__stop_on_client_after__stops_only_those_allocs_when_heartbeats_fail(
    tmp_path: Path, server: FakeServer
) -> None:
    careful = job("careful", stop_on_client_after_ns=S)
    plain = job("plain")
    with running_agent(tmp_path, server) as agent:
        agent.wait_registered(10)
        server.nodes.place(alloc("c1", careful, agent.node_id), careful)
        server.nodes.place(alloc("p1", plain, agent.node_id), plain)
        wait_until(lambda: status_is(server.nodes, "c1", "running"), 10, "c1 running")
        wait_until(lambda: status_is(server.nodes, "p1", "running"), 10, "p1 running")
        server.nodes.set_unavailable(True)
        lost_at = time.monotonic()

        def careful_stopped() -> bool:
            st = agent.alloc_status("c1")
            return st is not None and st.client_status == "complete"

        wait_until(careful_stopped, 10, "c1 stopped by the client")
        assert time.monotonic() - lost_at >= 0.5
        plain_status = agent.alloc_status("p1")
        assert plain_status is not None and plain_status.client_status == "running"
        server.nodes.set_unavailable(False)
        wait_until(lambda: status_is(server.nodes, "c1", "complete"), 10, "the stop reported after reconnect")
        assert status_is(server.nodes, "p1", "running")


def test_agent__alloc_garbage_collected__stopped_and_forgotten(tmp_path: Path, server: FakeServer) -> None:
    with agent_running_a1(tmp_path, server, job()) as agent:
        record = tmp_path / "client" / "allocs" / "a1.json"
        assert record.exists()
        server.nodes.remove("a1")
        wait_until(lambda: agent.alloc_ids() == [], 10, "the runner dropped")
        wait_until(lambda: not record.exists(), 10, "the record removed")


# --- agent restarts -------------------------------------------------------------------------------


@pytest.fixture
def forget_children() -> Iterator[Callable[[], None]]:
    """Make raw_exec forget the children it started, as a freshly started agent process
    would not have them: the next agent must re-attach through psutil alone."""
    kept: list[subprocess.Popen[bytes]] = []

    def forget() -> None:
        with raw_exec._children_lock:
            kept.extend(proc for proc, _ in raw_exec._children.values())
            raw_exec._children.clear()

    yield forget
    for proc in kept:
        if proc.poll() is None:
            proc.kill()
        proc.wait(5)


@pytest.mark.parametrize("fresh_process", [False, True], ids=["same-interpreter", "fresh-agent-process"])
def test_agent__restart__reattaches_to_the_same_process(
    tmp_path: Path,
    server: FakeServer,
    pids: list[int],
    forget_children: Callable[[], None],
    fresh_process: bool,
) -> None:
    j = job("svc", tasks=[sleep_task()])
    with agent_leaving_tasks(tmp_path, server) as first:
        server.nodes.place(alloc("a1", j, first.node_id), j)
        pid = task_pid(server, "a1", pids)
        wait_until(lambda: status_is(server.nodes, "a1", "running"), 10, "a1 running")
    assert alive(pid) and processes_of("a1") == [pid]
    assert first.alloc_status("a1") is not None
    if fresh_process:
        forget_children()

    with running_agent(tmp_path, server) as second:
        assert second.node_id == first.node_id
        assert second.alloc_ids() == ["a1"]
        wait_until(lambda: len(server.nodes.registrations) >= 2, 10, "the new agent registered")
        status = wait_until(lambda: second.alloc_status("a1"), 5, "a1 restored")
        assert status is not None and status.client_status == "running"
        assert status.task_states["main"].pid == pid
        assert processes_of("a1") == [pid]  # no second process
        assert [e.type for e in status.task_states["main"].events].count("Started") == 1
        # It is really watched: a desired stop ends that very process.
        server.nodes.set_desired("a1", "stop")
        wait_until(lambda: status_is(server.nodes, "a1", "complete"), 10, "a1 complete")
        assert not alive(pid)


def test_agent__restart__mock_task_keeps_its_deadline(tmp_path: Path, server: FakeServer) -> None:
    j = job("b", job_type="batch", tasks=[task(config='{"run_for": "2s"}')])
    with agent_leaving_tasks(tmp_path, server) as first:
        server.nodes.place(alloc("m1", j, first.node_id), j)
        wait_until(lambda: status_is(server.nodes, "m1", "running"), 10, "m1 running")
    with running_agent(tmp_path, server):
        wait_until(lambda: status_is(server.nodes, "m1", "complete"), 10, "m1 completes on schedule")
        assert event_types(server.nodes, "m1").count("Started") == 1


def test_agent__restart__task_gone_meanwhile__unknown_exit_goes_through_restart_policy(
    tmp_path: Path, server: FakeServer, pids: list[int]
) -> None:
    policy = structs_pb2.RestartPolicy(attempts=1, interval_ns=60 * S, delay_ns=50_000_000, mode="fail")
    j = job("svc", tasks=[sleep_task()], restart=policy)
    with agent_leaving_tasks(tmp_path, server) as first:
        server.nodes.place(alloc("a1", j, first.node_id), j)
        pid = task_pid(server, "a1", pids)
    os.killpg(pid, signal.SIGKILL)
    wait_until(lambda: not alive(pid), 5, "the task gone while no agent runs")
    with running_agent(tmp_path, server) as second:

        def restarted() -> int:
            st = second.alloc_status("a1")
            ts = st.task_states["main"] if st else None
            return ts.pid if ts and ts.state == "running" and ts.pid != pid else 0

        new_pid = wait_until(restarted, 10, "a restart with a new process")
        pids.append(new_pid)
        status = second.alloc_status("a1")
        assert status is not None and status.task_states["main"].restarts == 1


def test_agent__stop__kills_tasks_by_default(tmp_path: Path, server: FakeServer, pids: list[int]) -> None:
    j = job("svc", tasks=[sleep_task()])
    with running_agent(tmp_path, server) as agent:
        agent.wait_registered(10)
        server.nodes.place(alloc("a1", j, agent.node_id), j)
        pid = task_pid(server, "a1", pids)
    assert not alive(pid)
    assert status_is(server.nodes, "a1", "complete")  # the final state was flushed


def test_run_client__sigterm__exits_zero_leaving_tasks(tmp_path: Path, server: FakeServer) -> None:
    script = textwrap.dedent(
        f"""
        from dataclasses import dataclass, field
        from drover.client.agent import run_client

        @dataclass(frozen=True)
        class Cfg:
            node_name: str = "proc"
            data_dir: str = {str(tmp_path)!r}
            servers: tuple = ({server.address!r},)
            datacenter: str = "dc1"
            node_class: str = ""
            meta: dict = field(default_factory=dict)
            log_json: bool = True
            log_level: str = "info"
            enable_raw_exec: bool = False
            tls: None = None
            bind: str = "127.0.0.1"
            http_port: int = 0
            node_pool: str = ""

        raise SystemExit(run_client(Cfg()))
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", script], cwd=REPO, stderr=subprocess.PIPE)
    try:
        wait_until(lambda: server.nodes.registrations, 20, "the client process registering")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(15) == 0
        assert proc.stderr is not None and b"client.stopped" in proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)
        if proc.stderr is not None:
            proc.stderr.close()
