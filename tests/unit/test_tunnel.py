"""The client tunnel's pure parts: log tail offsets, signal names, node meta changes, and
the server's per-node request routing (server/tunnel/, client_agent/tunnel.py)."""

from __future__ import annotations

import asyncio
import signal
import threading
from dataclasses import replace
from pathlib import Path

import grpc
import pytest

from drover.client.tunnel import TunnelRequestError, apply_meta_change, merge_meta, send_file, tail_offset
from drover.common.signals import SignalNameError, parse_signal
from drover.server.api.tunnel import validate_meta_apply
from drover.server.errors import ValidationError
from drover.server.state_store import StateStore, Txn
from drover.server.tunnel import NodeSession, TunnelError, TunnelRegistry
from drover.v1 import api_pb2
from tests.fixtures import mock


def _offset(data: bytes, *, lines: int = 0, nbytes: int = 0, block: int = 4) -> int:
    def read_at(offset: int, n: int) -> bytes:
        return data[offset : offset + n]

    return tail_offset(len(data), read_at, lines=lines, nbytes=nbytes, block=block)


# ---------------------------------------------------------------------------------------
# tail offsets


@pytest.mark.parametrize(
    ("data", "lines", "expected"),
    [
        (b"a\nb\nc\n", 2, b"b\nc\n"),
        (b"a\nb\nc\n", 1, b"c\n"),
        (b"a\nb\nc", 1, b"c"),
        (b"a\nb\nc", 2, b"b\nc"),
        (b"a\nb\nc\n", 3, b"a\nb\nc\n"),
        (b"a\nb\nc\n", 10, b"a\nb\nc\n"),
        (b"one long line without newline", 1, b"one long line without newline"),
        (b"\n\n\n", 2, b"\n\n"),
        (b"", 3, b""),
    ],
)
def test_tail_offset__lines__starts_at_the_last_n_lines(data: bytes, lines: int, expected: bytes) -> None:
    assert data[_offset(data, lines=lines) :] == expected


def test_tail_offset__lines_across_blocks__same_as_one_block() -> None:
    data = b"".join(f"line {i}\n".encode() for i in range(100))
    for lines in (1, 7, 50, 99, 100, 200):
        assert _offset(data, lines=lines, block=5) == _offset(data, lines=lines, block=1 << 20)
    assert data[_offset(data, lines=3, block=5) :] == b"line 97\nline 98\nline 99\n"


def test_tail_offset__bytes__last_n_bytes_or_all() -> None:
    assert _offset(b"0123456789", nbytes=3) == 7
    assert _offset(b"0123456789", nbytes=30) == 0


def test_tail_offset__neither__whole_file() -> None:
    assert _offset(b"a\nb\n") == 0


# ---------------------------------------------------------------------------------------
# following a file


def test_send_file__not_following__sends_from_start_in_chunks(tmp_path: Path) -> None:
    path = tmp_path / "stdout.log"
    path.write_bytes(b"x" * 10 + b"tail")
    got: list[bytes] = []
    send_file(
        path, 10, follow=False, finished=lambda: False, cancelled=threading.Event(), send=got.append, chunk=3
    )
    assert b"".join(got) == b"tail"
    assert all(len(c) <= 3 for c in got)


def test_send_file__following__sends_appended_bytes_until_finished(tmp_path: Path) -> None:
    path = tmp_path / "stdout.log"
    path.write_bytes(b"first\n")
    got: list[bytes] = []
    finished = threading.Event()
    seen_first = threading.Event()

    def send(data: bytes) -> None:
        got.append(data)
        seen_first.set()

    worker = threading.Thread(
        target=send_file,
        args=(path, 0),
        kwargs={
            "follow": True,
            "finished": finished.is_set,
            "cancelled": threading.Event(),
            "send": send,
            "poll_s": 0.01,
        },
    )
    worker.start()
    assert seen_first.wait(5)
    with open(path, "ab") as fh:
        fh.write(b"second\n")
    finished.set()
    worker.join(5)
    assert not worker.is_alive()
    # finished() is read before the last read, so what was written before it is sent.
    assert b"".join(got) == b"first\nsecond\n"


def test_send_file__cancelled__stops_following(tmp_path: Path) -> None:
    cancelled = threading.Event()
    worker = threading.Thread(
        target=send_file,
        args=(tmp_path / "missing.log", 0),
        kwargs={
            "follow": True,
            "finished": lambda: False,
            "cancelled": cancelled,
            "send": print,
            "poll_s": 0.01,
        },
    )
    worker.start()
    cancelled.set()
    worker.join(5)
    assert not worker.is_alive()


# ---------------------------------------------------------------------------------------
# signal names


@pytest.mark.parametrize(
    ("name", "expected"),
    [("SIGHUP", signal.SIGHUP), ("HUP", signal.SIGHUP), ("usr1", signal.SIGUSR1), ("", signal.SIGKILL)],
)
def test_parse_signal__names__as_kill_takes_them(name: str, expected: signal.Signals) -> None:
    assert parse_signal(name) is expected


@pytest.mark.parametrize("name", ["SIGNOPE", "9", "SIG_IGN", "_DFL", "USR 1"])
def test_parse_signal__not_a_signal__refused_naming_the_field(name: str) -> None:
    with pytest.raises(SignalNameError, match=r"^signal: unknown signal"):
        parse_signal(name)


# ---------------------------------------------------------------------------------------
# node meta


def test_merge_meta__dynamic_wins() -> None:
    assert merge_meta({"rack": "r1", "zone": "a"}, {"zone": "b", "foo": "bar"}) == {
        "rack": "r1",
        "zone": "b",
        "foo": "bar",
    }


def test_apply_meta_change__sets_and_unsets_dynamic_keys() -> None:
    assert apply_meta_change({"a": "1", "b": "2"}, {"c": "3", "a": "9"}, ["b", "absent"]) == {
        "a": "9",
        "c": "3",
    }


def test_apply_meta_change__key_set_and_unset__refused() -> None:
    with pytest.raises(TunnelRequestError) as caught:
        apply_meta_change({}, {"a": "1"}, ["a"])
    assert caught.value.code == "INVALID_ARGUMENT"


@pytest.mark.parametrize(
    ("request_msg", "match"),
    [
        (api_pb2.NodeMetaApplyRequest(node_id="n"), "at least one key"),
        (api_pb2.NodeMetaApplyRequest(node_id="n", meta={"a": "1"}, unset=["a"]), "both set and unset"),
        (api_pb2.NodeMetaApplyRequest(node_id="n", meta={"a b": "1"}), "without spaces"),
        (api_pb2.NodeMetaApplyRequest(node_id="n", unset=[""]), "non-empty"),
    ],
)
def test_validate_meta_apply__bad_change__refused_naming_meta(
    request_msg: api_pb2.NodeMetaApplyRequest, match: str
) -> None:
    with pytest.raises(ValidationError, match=rf"^meta: .*{match}"):
        validate_meta_apply(request_msg)


# ---------------------------------------------------------------------------------------
# the server's session: routing, cancel, bounds, a broken tunnel


def _logs_down() -> api_pb2.ClientTunnelDown:
    return api_pb2.ClientTunnelDown(logs=api_pb2.AllocLogsRequest(alloc_id="a"))


def test_session__answers__reach_the_request_that_asked() -> None:
    session = NodeSession("n1")
    out = session.outgoing()
    with session.open(_logs_down()) as first, session.open(_logs_down()) as second:
        sent = [next(out), next(out)]
        assert [d.request_id for d in sent] == [first.request_id, second.request_id]
        session.deliver(api_pb2.ClientTunnelUp(request_id=second.request_id, data=b"two"))
        session.deliver(api_pb2.ClientTunnelUp(request_id=first.request_id, data=b"one"))
        session.deliver(api_pb2.ClientTunnelUp(request_id=first.request_id, done=True))
        got_first = [first.next_answer(1), first.next_answer(1)]
        got_second = second.next_answer(1)
        assert got_first[0] is not None and got_first[0].data == b"one"
        assert got_first[1] is not None and got_first[1].done
        assert got_second is not None and got_second.data == b"two"
    # The second left before its done: the client is told to stop.
    cancel = next(out)
    assert cancel.WhichOneof("op") == "cancel" and cancel.request_id == second.request_id
    assert session.in_flight() == 0


def test_session__outgoing_async__woken_from_a_callers_thread__ends_on_close() -> None:
    session = NodeSession("n1")
    opened: list[int] = []

    def caller() -> None:
        opened.append(session.open(_logs_down()).request_id)

    async def stream() -> list[int]:
        sent: list[int] = []
        async for down in session.outgoing_async():
            sent.append(down.request_id)
            if len(sent) == 1:
                threading.Thread(target=session.close).start()
        return sent

    async def scenario() -> list[int]:
        reading = asyncio.ensure_future(stream())
        await asyncio.sleep(0)
        threading.Thread(target=caller).start()
        return await asyncio.wait_for(reading, 10.0)

    assert asyncio.run(scenario()) == opened
    assert len(session._wakers) == 0


def test_session__try_deliver__full_queue__refused_without_waiting() -> None:
    session = NodeSession("n1")
    with session.open(_logs_down()) as pending:
        chunk = api_pb2.ClientTunnelUp(request_id=pending.request_id, data=b"x")
        while pending.answers.qsize() < pending.answers.maxsize:
            assert session.try_deliver(chunk)
        assert not session.try_deliver(chunk)
        assert pending.next_answer(1) is not None
        assert session.try_deliver(chunk)
    # Nobody waits for an unknown request: taken (dropped), never "full".
    assert session.try_deliver(api_pb2.ClientTunnelUp(request_id=999, data=b"x"))


def test_session__client_error__raised_with_its_code() -> None:
    session = NodeSession("n1")
    with session.open(_logs_down()) as pending:
        session.deliver(
            api_pb2.ClientTunnelUp(
                request_id=pending.request_id, done=True, error_code="NOT_FOUND", error="no task"
            )
        )
        with pytest.raises(TunnelError) as caught:
            pending.next_answer(1)
    assert caught.value.code == grpc.StatusCode.NOT_FOUND and str(caught.value) == "no task"


def test_session__closed__waiting_requests_end_unavailable_and_new_ones_are_refused() -> None:
    registry = TunnelRegistry()
    session = NodeSession("n1")
    registry.attach(session)
    pending = session.open(_logs_down())
    registry.detach(session)
    with pytest.raises(TunnelError) as caught:
        pending.next_answer(1)
    assert caught.value.code == grpc.StatusCode.UNAVAILABLE
    assert registry.get("n1") is None
    with pytest.raises(TunnelError, match="not connected"):
        session.open(_logs_down())


def test_session__too_many_in_flight__refused_before_sending() -> None:
    session = NodeSession("n1", max_requests=2)
    session.open(_logs_down())
    session.open(_logs_down())
    with pytest.raises(TunnelError) as caught:
        session.open(_logs_down())
    assert caught.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED


def test_registry__reconnect__replaces_and_closes_the_old_session() -> None:
    registry = TunnelRegistry()
    old, new = NodeSession("n1"), NodeSession("n1")
    registry.attach(old)
    registry.attach(new)
    assert old.closed and registry.get("n1") is new
    # The old stream's end must not take the new session with it.
    registry.detach(old)
    assert registry.get("n1") is new


# ---------------------------------------------------------------------------------------
# a node's meta change releases blocked evals (server/state_store.py)


@pytest.mark.parametrize(
    ("change", "capacity"),
    [
        ({"meta": {"zone": "blue"}}, True),
        ({"attributes": {"kernel.name": "linux", "extra": "1"}}, True),
        ({"node_class": "gpu"}, True),
        ({"status_description": "same placement facts"}, False),
    ],
)
def test_put_node__what_constraints_read_changed__marks_capacity(
    change: dict[str, object], capacity: bool
) -> None:
    node = mock.node()
    txn = Txn(StateStore().snapshot().tables, 1)
    txn.put_node(node)
    tables = txn.commit()
    again = Txn(tables, 2)
    again.put_node(replace(node, **change))  # type: ignore[arg-type]
    again.commit()
    assert again.changes.capacity is capacity
