"""What the client answers through its tunnel (client_agent/tunnel.py ``TunnelService``), on a
real agent running mock tasks against the in-process fake servers: restart in place
without spending the restart policy, signals, the refusals, and dynamic node meta kept
across an agent restart and registered."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from drover.client.agent import ClientAgent
from drover.client.tunnel import TunnelRequestError, TunnelService
from drover.v1 import api_pb2, structs_pb2
from tests.unit.test_client_agent import FAST, agent_running_a1, running_agent, settings
from tests.unit.test_client_fake_server import FakeServer, fake_server, job, task, wait_until

NO_RESTARTS = structs_pb2.RestartPolicy(attempts=0, interval_ns=60_000_000_000, mode="fail")


@pytest.fixture
def server() -> Iterator[FakeServer]:
    with fake_server() as s:
        yield s


def _service(agent: ClientAgent) -> TunnelService:
    return TunnelService(agent.node_id, agent.runner, agent.read_meta, agent.apply_meta)


def _ask(agent: ClientAgent, down: api_pb2.ClientTunnelDown) -> tuple[api_pb2.NodeMetaResponse | None, bytes]:
    sent: list[bytes] = []
    meta = _service(agent).answer(down, threading.Event(), sent.append)
    return meta, b"".join(sent)


def _refused(agent: ClientAgent, down: api_pb2.ClientTunnelDown) -> TunnelRequestError:
    with pytest.raises(TunnelRequestError) as caught:
        _ask(agent, down)
    return caught.value


def _two_task_job() -> structs_pb2.Job:
    return job(
        tasks=[task("main", config='{"run_for": "1h"}'), task("side", config='{"run_for": "1h"}')],
        restart=NO_RESTARTS,
    )


def test_restart__mock_task__started_again_and_the_policy_window_untouched(
    tmp_path: Path, server: FakeServer
) -> None:
    with agent_running_a1(tmp_path, server, _two_task_job()) as agent:
        runner = agent.runner("a1")
        assert runner is not None
        windows = {name: t.snapshot().window for name, t in runner.task_runners().items()}
        _ask(agent, api_pb2.ClientTunnelDown(restart=api_pb2.AllocRestartRequest(alloc_id="a1", task="main")))

        def restarted() -> bool:
            state = runner.task_runners()["main"].snapshot().state
            return state.restarts == 1 and state.state == "running"

        wait_until(restarted, 10, "main restarted and running")
        records = runner.task_runners()
        assert records["side"].snapshot().state.restarts == 0
        assert {name: t.snapshot().window for name, t in records.items()} == windows
        assert "Restart Signaled" in [e.type for e in records["main"].snapshot().state.events]
        # No task named: every running task; a policy of no attempts still fails nobody.
        _ask(agent, api_pb2.ClientTunnelDown(restart=api_pb2.AllocRestartRequest(alloc_id="a1")))
        wait_until(
            lambda: (
                all(t.snapshot().state.restarts >= 1 and t.running for t in runner.task_runners().values())
                and records["main"].snapshot().state.restarts == 2
            ),
            10,
            "both tasks restarted",
        )
        assert not any(t.snapshot().state.failed for t in runner.task_runners().values())


def test_signal__mock_task__recorded_as_a_task_event(tmp_path: Path, server: FakeServer) -> None:
    with agent_running_a1(tmp_path, server, job(restart=NO_RESTARTS)) as agent:
        _ask(agent, api_pb2.ClientTunnelDown(signal=api_pb2.AllocSignalRequest(alloc_id="a1", signal="hup")))
        runner = agent.runner("a1")
        assert runner is not None
        events = runner.task_runners()["main"].snapshot().state.events
        assert [e.message for e in events if e.type == "Signaling"] == ["Task being sent signal SIGHUP"]
        assert runner.task_runners()["main"].running


def test_refusals__unknown_alloc_task_or_signal__named_with_their_codes(
    tmp_path: Path, server: FakeServer
) -> None:
    with agent_running_a1(tmp_path, server, _two_task_job()) as agent:
        unknown_alloc = _refused(
            agent, api_pb2.ClientTunnelDown(logs=api_pb2.AllocLogsRequest(alloc_id="zz"))
        )
        assert unknown_alloc.code == "NOT_FOUND" and "'zz'" in unknown_alloc.message
        unknown_task = _refused(
            agent, api_pb2.ClientTunnelDown(restart=api_pb2.AllocRestartRequest(alloc_id="a1", task="nope"))
        )
        assert unknown_task.code == "NOT_FOUND" and "task 'nope' not found" in unknown_task.message
        which = _refused(agent, api_pb2.ClientTunnelDown(logs=api_pb2.AllocLogsRequest(alloc_id="a1")))
        assert which.code == "INVALID_ARGUMENT" and which.message.startswith("task: ")
        bad_signal = _refused(
            agent, api_pb2.ClientTunnelDown(signal=api_pb2.AllocSignalRequest(alloc_id="a1", signal="NOPE"))
        )
        assert bad_signal.code == "INVALID_ARGUMENT" and bad_signal.message.startswith("signal: ")
        other_node = _refused(
            agent, api_pb2.ClientTunnelDown(meta_read=api_pb2.NodeMetaReadRequest(node_id="x"))
        )
        assert other_node.code == "NOT_FOUND"
        # A mock task writes no log: empty, not an error.
        _, data = _ask(
            agent, api_pb2.ClientTunnelDown(logs=api_pb2.AllocLogsRequest(alloc_id="a1", task="side"))
        )
        assert data == b""


def test_meta__applied__registered_and_kept_across_an_agent_restart(
    tmp_path: Path, server: FakeServer
) -> None:
    with running_agent(tmp_path, server) as agent:
        assert agent.wait_registered(10)
        before = len(server.nodes.registrations)
        apply = api_pb2.NodeMetaApplyRequest(node_id=agent.node_id, meta={"foo": "bar", "gone": "x"})
        meta, _ = _ask(agent, api_pb2.ClientTunnelDown(meta_apply=apply))
        assert meta is not None and dict(meta.dynamic) == {"foo": "bar", "gone": "x"}
        # Answered only once a Register carrying it succeeded.
        assert len(server.nodes.registrations) > before
        assert server.nodes.registrations[-1].meta["foo"] == "bar"
        unset = api_pb2.NodeMetaApplyRequest(node_id=agent.node_id, unset=["gone"])
        meta, _ = _ask(agent, api_pb2.ClientTunnelDown(meta_apply=unset))
        assert meta is not None and dict(meta.meta) == {"foo": "bar"}
    # The same settings and data dir: the next agent of this node.
    restarted = ClientAgent(settings(tmp_path, server), tuning=FAST)
    restarted.start()
    try:
        assert restarted.wait_registered(10)
        assert dict(restarted.read_meta().dynamic) == {"foo": "bar"}
        assert server.nodes.registrations[-1].meta["foo"] == "bar"
    finally:
        restarted.stop(timeout_s=10)
