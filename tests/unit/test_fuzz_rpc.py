"""Fuzzing every RPC of the API through a real gRPC channel: random bytes as the raw
request body, and generated (well-typed, hostile-valued) request messages.

The server is a real single-server ``ServerCore`` in this process (its own raft, state
store, servicers and gRPC server on loopback), with its leader services (workers, timers,
periodic dispatch) left out by the test: then a write is complete when its answer comes
back, so "a refused call changed nothing" can be checked exactly, by the state digest
before and after each call.

Every call must end in a status other than INTERNAL and UNKNOWN (those mean a bug or an
unmapped exception); a refused call must leave the digest as it was; no server log record
carries a traceback; undecodable requests log at most one WARN per interval. Budgets:
tests/fuzz.py.
"""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import grpc
import pytest
import structlog
from google.protobuf import descriptor as pb_descriptor
from google.protobuf.message import Message
from hypothesis import given
from hypothesis import strategies as st

from drover.server import core as server_core
from drover.server.api import _decode
from drover.server.config import ServerConfig
from drover.server.core import ServerCore
from drover.server.snapshot import state_digest
from drover.v1 import api_pb2
from tests.cluster.nodes import simulated_node
from tests.fuzz import budgets, fuzz_settings

BAD_CODES: Final = frozenset({grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN})
CALL_TIMEOUT_S: Final = 2.0


@dataclass(frozen=True)
class Method:
    service: str
    name: str
    request: type[Message]
    streaming: bool

    @property
    def path(self) -> str:
        return f"/drover.v1.{self.service}/{self.name}"


METHODS: Final = tuple(
    Method(svc.name, m.name, getattr(api_pb2, m.input_type.name), m.server_streaming)
    for svc in api_pb2.DESCRIPTOR.services_by_name.values()
    for m in svc.methods
)


class _NoLeaderServices:
    """Stands in for LeaderServices: nothing runs behind the API's back."""

    def start(self) -> None: ...
    def shutdown(self) -> None: ...
    def on_leadership_change(self, is_leader: bool) -> None: ...


class _Tracebacks(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.exc_info or record.levelno >= logging.ERROR:
            self.records.append(record)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Server:
    core: ServerCore
    channel: grpc.Channel
    tracebacks: _Tracebacks

    def settle(self) -> None:
        """After an accepted call: wait until the server's own member row is back (an
        accepted SnapshotRestore replaces it; the announce loop writes it again)."""
        core = self.core
        deadline = time.monotonic() + 30
        while True:
            member = core.store.snapshot().tables.servers.get(core.name)
            if member is not None and member.grpc_address == core.grpc_address:
                return
            assert time.monotonic() < deadline, "the server never announced itself again"
            time.sleep(0.02)

    def call(self, method: Method, body: bytes) -> grpc.StatusCode:
        """Send ``body`` as ``method``'s request; the status it ended with."""
        try:
            if method.streaming:
                stream = self.channel.unary_stream(
                    method.path, request_serializer=_raw, response_deserializer=_raw
                )(body, timeout=CALL_TIMEOUT_S)
                try:
                    next(iter(stream), None)
                finally:
                    stream.cancel()
                return grpc.StatusCode.OK
            self.channel.unary_unary(method.path, request_serializer=_raw, response_deserializer=_raw)(
                body, timeout=CALL_TIMEOUT_S
            )
            return grpc.StatusCode.OK
        except grpc.RpcError as exc:
            code: grpc.StatusCode = exc.code()  # type: ignore[attr-defined]
            if code in BAD_CODES:
                raise AssertionError(f"{method.path}: {code.name}: {exc.details()}") from exc  # type: ignore[attr-defined]
            return code


def _raw(data: bytes) -> bytes:
    return data


# The in-process server's wait that only costs the fuzzer time (it is about input, not
# patience), shortened for it alone. A restored snapshot drops the server's own member row,
# and ``Server.settle`` waited for the announce loop's next turn (every 0.5 s) to write it
# back; the loop still runs the same code. (A RaftTransferLeadership on this one-server
# cluster is refused at once, FAILED_PRECONDITION, and checked like any answer.)
FUZZ_ANNOUNCE_INTERVAL_S: Final = 0.02


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(server_core, "ANNOUNCE_INTERVAL", FUZZ_ANNOUNCE_INTERVAL_S)
        yield from _started_server(tmp_path_factory.mktemp("fuzz-rpc"))


def _started_server(data_dir: Path) -> Iterator[Server]:
    cfg = ServerConfig(node_name="fuzz", data_dir=str(data_dir), grpc_port=0, raft_port=_free_port())
    core = ServerCore(cfg)
    core.leader = _NoLeaderServices()  # type: ignore[assignment]
    tracebacks = _Tracebacks()
    logging.getLogger().addHandler(tracebacks)
    core.start()
    channel = grpc.insecure_channel(core.grpc_address)
    try:
        deadline = time.monotonic() + 30
        while not core.raft.leader_ready() or not list(core.store.snapshot().servers()):
            assert time.monotonic() < deadline, "the in-process server never became a ready leader"
            time.sleep(0.05)
        _seed(channel)
        yield Server(core, channel, tracebacks)
    finally:
        channel.close()
        core.stop(grace=0.5)
        logging.getLogger().removeHandler(tracebacks)


def _seed(channel: grpc.Channel) -> None:
    """A node and a job, so that generated IDs sometimes name something real."""
    from drover.v1 import api_pb2_grpc
    from tests.cluster.jobs import service_job

    api_pb2_grpc.NodesStub(channel).Register(
        api_pb2.NodeRegisterRequest(node=simulated_node("n1")), timeout=10
    )
    api_pb2_grpc.JobsStub(channel).Register(
        api_pb2.JobRegisterRequest(job=service_job("web", count=1)), timeout=10
    )


# ---------------------------------------------------------------------------------------
# Generated messages: every field of the request type, hostile values included

WORDS: Final = ["n1", "n1-secret", "web", "default", "api", "ready", "down", "eligible", "*", ""]
STRINGS: Final = st.one_of(
    st.sampled_from(WORDS),
    st.text(max_size=12),
    st.integers(0, 300_000).map(lambda n: "x" * n),
)
INT_EDGES: Final = [0, 1, -1, 2**31 - 1, -(2**31), 2**32 - 1, 2**63 - 1, -(2**63), 2**64 - 1]
FD = pb_descriptor.FieldDescriptor


def _scalar(fd: Any) -> st.SearchStrategy[Any]:
    t = fd.type
    if t in (FD.TYPE_STRING,):
        return STRINGS
    if t == FD.TYPE_BYTES:
        return st.binary(max_size=64) | st.integers(0, 100_000).map(lambda n: b"\0" * n)
    if t == FD.TYPE_BOOL:
        return st.booleans()
    if t in (FD.TYPE_DOUBLE, FD.TYPE_FLOAT):
        return st.floats(width=32 if t == FD.TYPE_FLOAT else 64)
    if t == FD.TYPE_ENUM:
        return st.sampled_from([v.number for v in fd.enum_type.values])
    signed32 = t in (FD.TYPE_INT32, FD.TYPE_SINT32, FD.TYPE_SFIXED32)
    unsigned32 = t in (FD.TYPE_UINT32, FD.TYPE_FIXED32)
    signed64 = t in (FD.TYPE_INT64, FD.TYPE_SINT64, FD.TYPE_SFIXED64)
    low, high = (
        (-(2**31), 2**31 - 1)
        if signed32
        else (0, 2**32 - 1)
        if unsigned32
        else (-(2**63), 2**63 - 1)
        if signed64
        else (0, 2**64 - 1)
    )
    edges = [e for e in INT_EDGES if low <= e <= high]
    return st.one_of(st.sampled_from(edges), st.integers(max(low, -3), 20), st.integers(low, high))


@st.composite
def messages(draw: st.DrawFn, cls: type[Message], depth: int = 0) -> Message:
    msg = cls()
    for fd in cls.DESCRIPTOR.fields:
        if not draw(st.booleans()):
            continue
        if fd.message_type is not None and fd.message_type.GetOptions().map_entry:
            key_fd, value_fd = fd.message_type.fields_by_name["key"], fd.message_type.fields_by_name["value"]
            target = getattr(msg, fd.name)
            for _ in range(draw(st.integers(0, 3))):
                key = draw(_scalar(key_fd))
                if value_fd.message_type is not None:
                    if depth < 3:
                        target[key].CopyFrom(draw(messages(_message_class(value_fd), depth + 1)))
                else:
                    target[key] = draw(_scalar(value_fd))
        elif fd.is_repeated:
            items = draw(st.integers(0, 3 if depth < 3 else 0))
            if fd.message_type is not None:
                getattr(msg, fd.name).extend(
                    draw(messages(_message_class(fd), depth + 1)) for _ in range(items)
                )
            else:
                getattr(msg, fd.name).extend(draw(_scalar(fd)) for _ in range(items))
        elif fd.message_type is not None:
            if depth < 4:
                getattr(msg, fd.name).CopyFrom(draw(messages(_message_class(fd), depth + 1)))
        else:
            setattr(msg, fd.name, draw(_scalar(fd)))
    _keep_short(msg)
    return msg


def _message_class(fd: Any) -> type[Message]:
    from google.protobuf import message_factory

    return message_factory.GetMessageClass(fd.message_type)  # type: ignore[no-any-return]


def _keep_short(msg: Message) -> None:
    """Blocking reads wait at most a moment: the fuzzer is about input, not patience."""
    if "options" in msg.DESCRIPTOR.fields_by_name and msg.HasField("options"):  # type: ignore[attr-defined]
        options = msg.options  # type: ignore[attr-defined]
        if options.min_index:
            options.wait_ns = min(max(options.wait_ns, 1), 50_000_000)


METHOD_INDEXES: Final = st.integers(0, len(METHODS) - 1)


def requests() -> st.SearchStrategy[tuple[Method, bytes]]:
    return METHOD_INDEXES.flatmap(
        lambda i: messages(METHODS[i].request).map(lambda m, i=i: (METHODS[i], m.SerializeToString()))
    )


@st.composite
def raw_bodies(draw: st.DrawFn) -> tuple[Method, bytes]:
    """Random bytes, or a real request cut, flipped or spliced."""
    method = METHODS[draw(METHOD_INDEXES)]
    how = draw(st.sampled_from(["random", "truncate", "flip", "splice", "bad-utf8"]))
    if how == "random":
        return method, draw(st.binary(max_size=256))
    body = draw(messages(method.request)).SerializeToString()
    if how == "truncate":
        return method, body[: draw(st.integers(0, len(body)))]
    if how == "flip" and body:
        i = draw(st.integers(0, len(body) - 1))
        return method, body[:i] + bytes([body[i] ^ (1 << draw(st.integers(0, 7)))]) + body[i + 1 :]
    if how == "bad-utf8":
        # Field 1 as a length-delimited string of invalid UTF-8.
        return method, b"\x0a\x02\xff\xfe" + body
    return method, body + draw(st.binary(max_size=64))


def _fuzz(server: Server, strategy: st.SearchStrategy[tuple[Method, bytes]], budget: int) -> dict[str, int]:
    seen: dict[str, int] = {}

    @fuzz_settings(budget)
    @given(strategy)
    def one(sample: tuple[Method, bytes]) -> None:
        method, body = sample
        tables = server.core.store.snapshot().tables
        code = server.call(method, body)
        if code != grpc.StatusCode.OK:
            after = server.core.store.snapshot().tables
            # The state is one immutable value: untouched, it is the very same object.
            assert after is tables or state_digest(after) == state_digest(tables), (
                f"{method.path} refused with {code.name} but changed the state: "
                f"index {tables.index} -> {after.index}, {_changed_tables(tables, after)}"
            )
        else:
            server.settle()
        seen[code.name] = seen.get(code.name, 0) + 1

    one()
    assert sum(seen.values()) >= budget, seen
    assert not server.tracebacks.records, [r.getMessage() for r in server.tracebacks.records[:5]]
    return seen


def _changed_tables(before: Any, after: Any) -> dict[str, tuple[int, int]]:
    names = set(before.table_index) | set(after.table_index)
    return {
        n: (before.table_index.get(n, 0), after.table_index.get(n, 0))
        for n in sorted(names)
        if before.table_index.get(n, 0) != after.table_index.get(n, 0)
    }


@pytest.mark.parametrize("budget", budgets(4000))
def test_fuzz_rpc__random_bytes__no_internal_no_traceback_no_change_on_refusal(
    server: Server, budget: int
) -> None:
    started = time.monotonic()
    with structlog.testing.capture_logs() as logs:
        seen = _fuzz(server, raw_bodies(), budget)
    warnings = [e for e in logs if e.get("event") == "api.undecodable_request"]
    assert "INVALID_ARGUMENT" in seen, seen
    # Rate-limited: one WARN per interval, however many requests did not decode.
    assert 1 <= len(warnings) <= 1 + (time.monotonic() - started) / _decode.WARN_INTERVAL_S, len(warnings)


@pytest.mark.parametrize("budget", budgets(1500))
def test_fuzz_rpc__generated_messages__no_internal_no_traceback_no_change_on_refusal(
    server: Server, budget: int
) -> None:
    seen = _fuzz(server, requests(), budget)
    assert {"INVALID_ARGUMENT", "OK"} <= set(seen), seen


def test_fuzz_rpc__every_method_is_fuzzed() -> None:
    names = {m.path for m in METHODS}
    assert "/drover.v1.Nodes/UpdateAllocs" in names and "/drover.v1.Operator/SnapshotRestore" in names
    assert len(names) == sum(len(s.methods) for s in api_pb2.DESCRIPTOR.services_by_name.values())


def test_fuzz_budgets__ten_thousand_quick_and_two_hundred_thousand_under_chaos() -> None:
    import tests.unit.test_fuzz_jobspec  # noqa: F401  (registers its budgets)
    from tests.fuzz import CHAOS_FACTOR, QUICK_BUDGETS

    assert sum(QUICK_BUDGETS) >= 10_000, QUICK_BUDGETS
    assert sum(QUICK_BUDGETS) * CHAOS_FACTOR >= 200_000
