"""The client agent's heartbeat stream (client_agent/rpc.py ``HeartbeatStream``) against the
in-process fake Nodes service (tests/unit/test_client_fake_server.py): beats share one
open stream, and every way a beat fails (refused, unanswered in time, server gone) ends
that stream, is translated as the unary call's failure was, and the next beat opens a
fresh one, on the server the pool moved to."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import grpc
import pytest

from drover.client.errors import NotFound, Refused, ServerUnreachable
from drover.client.rpc import NodesRpc, ServerPool
from drover.v1 import api_pb2, api_pb2_grpc, structs_pb2
from tests.unit.test_client_fake_server import FakeServer, fake_server, wait_until


@contextmanager
def _registered(*addresses_of: str) -> Iterator[tuple[FakeServer, NodesRpc, ServerPool]]:
    """A fake server with node n1 (secret "s") registered, and the agent's NodesRpc on a
    pool of its address spelled each of ``addresses_of`` ways ("127.0.0.1", "localhost"):
    two pool entries that are one server, so a failover can be seen in the pool."""
    with fake_server() as server:
        with grpc.insecure_channel(server.address) as channel:
            node = structs_pb2.Node(id="n1", name="n1", datacenter="dc1", secret_id="s")
            api_pb2_grpc.NodesStub(channel).Register(api_pb2.NodeRegisterRequest(node=node))
        pool = ServerPool([f"{host}:{server.port}" for host in addresses_of or ("127.0.0.1",)])
        rpc = NodesRpc(pool, timeout_s=5.0)
        try:
            yield server, rpc, pool
        finally:
            rpc.close()
            pool.close()


def test_heartbeat__beats__share_one_stream_and_return_the_ttl() -> None:
    with _registered() as (server, rpc, _pool):
        ttls = [rpc.heartbeat("n1", "s", timeout_s=5.0) for _ in range(3)]
        assert ttls == [server.nodes.ttl_ns] * 3
        assert [h.node_id for h in server.nodes.heartbeats] == ["n1"] * 3
        assert server.nodes.heartbeat_streams == 1


def test_heartbeat__wrong_secret__refused_and_the_next_beat_opens_a_new_stream() -> None:
    with _registered() as (server, rpc, _pool):
        rpc.heartbeat("n1", "s", timeout_s=5.0)
        with pytest.raises(Refused) as refused:
            rpc.heartbeat("n1", "not-the-secret", timeout_s=5.0)
        assert refused.value.code == "PERMISSION_DENIED"
        assert rpc.heartbeat("n1", "s", timeout_s=5.0) == server.nodes.ttl_ns
        assert server.nodes.heartbeat_streams == 2
        assert server.nodes.calls[-3:] == [
            ("UpdateStatus", "OK"),
            ("UpdateStatus", "PERMISSION_DENIED"),
            ("UpdateStatus", "OK"),
        ]


def test_heartbeat__stream_ended_while_idle__the_next_beat_goes_on_a_new_one() -> None:
    with _registered() as (server, rpc, _pool):
        server.nodes.beats_per_stream = 1
        for _ in range(3):
            assert rpc.heartbeat("n1", "s", timeout_s=5.0) == server.nodes.ttl_ns
            # White-box: beats come seconds apart, so the end has arrived before the next;
            # here the next would race it, so wait until the agent's reader has it.
            wait_until(lambda: _open_stream_has_ended(rpc), 5.0, "the stream's end seen by the agent")
        assert server.nodes.heartbeat_streams == 3
        assert [c for c in server.nodes.calls if c[0] == "UpdateStatus"] == [("UpdateStatus", "OK")] * 3


def test_heartbeat__unknown_node__not_found() -> None:
    with _registered() as (_server, rpc, _pool), pytest.raises(NotFound):
        rpc.heartbeat("n9", "s", timeout_s=5.0)


def test_heartbeat__unanswered_in_time__fails_over_and_the_late_answer_is_not_taken() -> None:
    with _registered("127.0.0.1", "localhost") as (server, rpc, pool):
        first = pool.current()
        server.nodes.heartbeat_delay_s = 1.0
        with pytest.raises(ServerUnreachable) as late:
            rpc.heartbeat("n1", "s", timeout_s=0.2)
        assert late.value.code == "DEADLINE_EXCEEDED"
        assert pool.current() != first, "an unanswered beat moves the pool on, as a call's timeout did"
        server.nodes.heartbeat_delay_s = 0.0
        # The next beat goes on a stream of its own: the first one's answer, late, arrives on
        # a stream that was closed, and can never be taken for this beat's.
        assert rpc.heartbeat("n1", "s", timeout_s=5.0) == server.nodes.ttl_ns
        assert server.nodes.heartbeat_streams == 2
        assert len(server.nodes.heartbeats) == 2


def test_heartbeat__server_unavailable__server_unreachable_then_recovers() -> None:
    with _registered("127.0.0.1", "localhost") as (server, rpc, pool):
        rpc.heartbeat("n1", "s", timeout_s=5.0)
        first = pool.current()
        server.nodes.set_unavailable(True)
        with pytest.raises(ServerUnreachable) as gone:
            rpc.heartbeat("n1", "s", timeout_s=5.0)
        assert gone.value.code == "UNAVAILABLE"
        assert pool.current() != first
        server.nodes.set_unavailable(False)
        wait_until(lambda: _beats(rpc), 10.0, "a heartbeat answered once the server is back")
        assert server.nodes.heartbeat_streams == 2  # the one the refusal ended, and a new one


def test_heartbeat__after_close__refused_at_once() -> None:
    with _registered() as (_server, rpc, _pool):
        rpc.close()
        with pytest.raises(ServerUnreachable) as closed:
            rpc.heartbeat("n1", "s", timeout_s=5.0)
        assert closed.value.code == "CANCELLED"


def _beats(rpc: NodesRpc) -> bool:
    try:
        rpc.heartbeat("n1", "s", timeout_s=5.0)
    except ServerUnreachable:
        return False
    return True


def _open_stream_has_ended(rpc: NodesRpc) -> bool:
    stream = rpc._heartbeats._open
    return stream is not None and not stream.answers.empty()
