"""Events.Stream over gRPC: the servicer on a real in-process server, and the SDK's resume
against scripted fake servers (a stream that breaks, a server that lost the index).
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from drover.sdk import Client, DroverError
from drover.server.api._limits import caller_limits
from drover.server.api.events import EventsServicer
from drover.server.config import ServerConfig
from drover.server.core import ServerCore
from drover.v1 import api_pb2, api_pb2_grpc
from tests.cluster.jobs import service_job
from tests.fixtures.fake_grpc import serving

BUFFER_EVENTS = 6


class _NoLeaderServices:
    """Stands in for LeaderServices: no scheduler writes behind the test's back."""

    def start(self) -> None: ...
    def shutdown(self) -> None: ...
    def on_leadership_change(self, is_leader: bool) -> None: ...


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def _running_core(data_dir: Path, **settings: Any) -> Iterator[ServerCore]:
    """A real single-server ServerCore in this process, leading and announced."""
    cfg = ServerConfig(
        node_name="ev", data_dir=str(data_dir), grpc_port=0, raft_port=_free_port(), **settings
    )
    server = ServerCore(cfg)
    server.leader = _NoLeaderServices()  # type: ignore[assignment]
    server.start()
    try:
        deadline = time.monotonic() + 30
        while not server.raft.leader_ready() or not list(server.store.snapshot().servers()):
            assert time.monotonic() < deadline, "the in-process server never became a ready leader"
            time.sleep(0.05)
        yield server
    finally:
        server.stop(grace=0.5)


@pytest.fixture(scope="module")
def core(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerCore]:
    with _running_core(tmp_path_factory.mktemp("events-api"), event_buffer_size=BUFFER_EVENTS) as server:
        yield server


@pytest.fixture
def stub(core: ServerCore) -> Iterator[api_pb2_grpc.EventsStub]:
    with grpc.insecure_channel(core.grpc_address) as channel:
        yield api_pb2_grpc.EventsStub(channel)


def test_stream__from_now__opens_with_its_position_then_sends_the_next_entrys_events(
    core: ServerCore, stub: api_pb2_grpc.EventsStub
) -> None:
    stream = stub.Stream(
        api_pb2.EventStreamRequest(topics=[api_pb2.EventTopicFilter(topic="Job")]), timeout=30
    )
    try:
        opened = next(stream)
        with Client(core.grpc_address) as client:
            written = client.register_job(service_job("from-now")).meta.index
        response = next(stream)
    finally:
        stream.cancel()

    assert not opened.events and opened.index < written
    assert [(e.index, e.topic, e.type, e.key) for e in response.events] == [
        (written, "Job", "JobRegistered", "from-now")
    ]
    assert response.index >= written
    assert response.events[0].job.id == "from-now"


def test_stream__silence__heartbeats(
    core: ServerCore, stub: api_pb2_grpc.EventsStub, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(EventsServicer, "heartbeat_s", 0.2)
    request = api_pb2.EventStreamRequest(topics=[api_pb2.EventTopicFilter(topic="Job", key="no-such-job")])
    stream = stub.Stream(request, timeout=30)
    try:
        first, second, third = next(stream), next(stream), next(stream)
    finally:
        stream.cancel()

    assert not first.events and not second.events and not third.events
    assert third.index >= first.index


def test_stream__unknown_topic__invalid_argument_naming_the_field(stub: api_pb2_grpc.EventsStub) -> None:
    request = api_pb2.EventStreamRequest(topics=[api_pb2.EventTopicFilter(topic="Jobs")])

    with pytest.raises(grpc.RpcError) as caught:
        next(stub.Stream(request, timeout=10))

    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT  # type: ignore[attr-defined]
    assert "topics[0].topic: unknown topic 'Jobs'" in str(caught.value.details())  # type: ignore[attr-defined]


def test_stream__index_older_than_the_buffer__out_of_range_naming_the_oldest(
    core: ServerCore, stub: api_pb2_grpc.EventsStub
) -> None:
    with Client(core.grpc_address) as client:
        for n in range(BUFFER_EVENTS):
            client.register_job(service_job(f"filler-{n}"))
    floor, _ = core.events.bounds()
    assert floor > 0, "the buffer should have dropped its oldest batches"

    with pytest.raises(grpc.RpcError) as caught:
        next(stub.Stream(api_pb2.EventStreamRequest(index=1), timeout=10))

    assert caught.value.code() == grpc.StatusCode.OUT_OF_RANGE  # type: ignore[attr-defined]
    assert f"oldest index it can stream from is {floor + 1}" in str(caught.value.details())  # type: ignore[attr-defined]


def test_stream__open__counts_as_a_parked_query_until_closed(
    core: ServerCore, stub: api_pb2_grpc.EventsStub
) -> None:
    limits = caller_limits(core)
    before = limits.parked_total()
    stream = stub.Stream(api_pb2.EventStreamRequest(), timeout=30)
    next(stream)
    assert limits.parked_total() == before + 1
    stream.cancel()

    deadline = time.monotonic() + 10
    while limits.parked_total() != before:
        assert time.monotonic() < deadline, "the closed stream still holds its parking place"
        time.sleep(0.05)


@pytest.mark.timeout(60)
def test_stream__token_deleted_while_open__ends_permission_denied(tmp_path: Path) -> None:
    with _running_core(tmp_path / "acl", acl_enabled=True) as server:
        address = server.grpc_address
        with Client(address) as anonymous:
            admin_secret = anonymous.acl_bootstrap().token.secret_id
        with Client(address, token=admin_secret) as admin:
            admin.acl_upsert_policy("read", 'namespace "default" { policy = "read" }')
            token = admin.acl_create_token(name="reader", policies=["read"]).token
            with Client(address, token=token.secret_id, retry_deadline=5) as reader:
                written = admin.register_job(service_job("seen")).meta.index
                stream = reader.stream_events(["Job"], index=written)
                seen = [next(stream).key]
                admin.acl_delete_token(token.accessor_id)
                admin.register_job(service_job("after"))
                with pytest.raises(DroverError) as caught:
                    seen.extend(e.key for e in stream)

    assert caught.value.code == grpc.StatusCode.PERMISSION_DENIED
    assert seen == ["seen"]


# ---------------------------------------------------------------------------------------
# The SDK's resume, against scripted servers


def _job_event(index: int, key: str) -> api_pb2.Event:
    return api_pb2.Event(index=index, topic="Job", type="JobRegistered", key=key, namespace="default")


# What a scripted server answers one Stream with: its responses, then the status it ends with.
Script = tuple[list[api_pb2.EventStreamResponse], grpc.StatusCode | None]


class ScriptedEvents(api_pb2_grpc.EventsServicer):
    """Answers each Stream with the next script: (responses, then the status to end with)."""

    def __init__(
        self,
        *scripts: Script,
        queue: list[Script] | None = None,
        lock: threading.Lock | None = None,
    ) -> None:
        # ``queue``/``lock``: scripts shared with other servers, taken in the order the
        # streams arrive, whichever server each reaches.
        self.scripts = list(scripts) if queue is None else queue
        self.requests: list[int] = []
        self.lock = lock or threading.Lock()

    def Stream(
        self, request: api_pb2.EventStreamRequest, context: grpc.ServicerContext
    ) -> Iterator[api_pb2.EventStreamResponse]:
        with self.lock:
            self.requests.append(request.index)
            responses, end = self.scripts.pop(0) if self.scripts else ([], None)
        yield from responses
        if end is not None:
            context.abort(end, "scripted end")
        # No end: stay open (a live stream) until the caller goes.
        while context.is_active():
            time.sleep(0.05)


def _sharing(scripts: list[Script]) -> tuple[ScriptedEvents, ScriptedEvents]:
    """Two servers taking ``scripts`` from one queue, in the order the streams arrive."""
    lock = threading.Lock()
    return ScriptedEvents(queue=scripts, lock=lock), ScriptedEvents(queue=scripts, lock=lock)


@contextlib.contextmanager
def _client_of(*servers: ScriptedEvents) -> Iterator[Client]:
    """An SDK client whose addresses are ``servers``, each served on its own port, in order."""
    add = api_pb2_grpc.add_EventsServicer_to_server
    with contextlib.ExitStack() as stack:
        addresses = [stack.enter_context(serving((add, server), max_workers=4)) for server in servers]
        yield stack.enter_context(Client(addresses, retry_deadline=10))


def test_sdk__stream_broken__resumes_on_the_next_address_after_the_covered_index() -> None:
    # The scripts go by arrival, not by server: the client's first contact takes whichever
    # address connects first, so which server gets the first stream is not fixed.
    scripts: list[Script] = [
        (
            [
                api_pb2.EventStreamResponse(index=4),
                api_pb2.EventStreamResponse(events=[_job_event(5, "a"), _job_event(5, "b")], index=5),
                # Nothing this stream wants up to 8: the position moves on without events.
                api_pb2.EventStreamResponse(index=8),
            ],
            grpc.StatusCode.UNAVAILABLE,
        ),
        # The resumed stream repeats index 8 (as a server that resumed early would): dropped.
        ([api_pb2.EventStreamResponse(events=[_job_event(8, "x"), _job_event(9, "c")], index=9)], None),
    ]
    first, second = _sharing(scripts)
    with _client_of(first, second) as client:
        stream = client.stream_events(["Job"], index=5)
        got = [next(stream) for _ in range(3)]
        stream.close()

    assert [(e.index, e.key) for e in got] == [(5, "a"), (5, "b"), (9, "c")]
    # One server was asked from 5, the other (the next address) from 9.
    assert sorted([first.requests, second.requests]) == [[5], [9]]


def test_sdk__every_server_out_of_range__raised() -> None:
    servers = [ScriptedEvents(([], grpc.StatusCode.OUT_OF_RANGE)) for _ in range(2)]
    with _client_of(*servers) as client, pytest.raises(DroverError) as caught:
        next(client.stream_events(index=1))

    assert caught.value.code == grpc.StatusCode.OUT_OF_RANGE
    assert [s.requests for s in servers] == [[1], [1]]


def test_sdk__topic_with_key__sent_as_a_filter() -> None:
    server = ScriptedEvents(([api_pb2.EventStreamResponse(events=[_job_event(3, "web")], index=3)], None))
    seen: list[api_pb2.EventStreamRequest] = []
    original = ScriptedEvents.Stream

    def recording(
        self: ScriptedEvents, request: api_pb2.EventStreamRequest, context: grpc.ServicerContext
    ) -> Iterator[api_pb2.EventStreamResponse]:
        seen.append(request)
        return original(self, request, context)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ScriptedEvents, "Stream", recording)
        with _client_of(server) as client:
            stream = client.stream_events(["Job:web", "Node"], namespace="*")
            next(stream)
            stream.close()

    assert [(t.topic, t.key) for t in seen[0].topics] == [("Job", "web"), ("Node", "")]
    assert seen[0].namespace == "*"
    assert seen[0].index == 0


@pytest.mark.timeout(60)
def test_sdk__server_silent_past_the_stall_timeout__resumed_on_the_next_address() -> None:
    # The first stream opens, then says nothing, without closing: a paused server, or one
    # cut off. Scripts go by arrival (the first contact takes whichever address connects
    # first), so the silent one is whichever server the client reaches first.
    scripts: list[Script] = [
        ([api_pb2.EventStreamResponse(index=4)], None),
        ([api_pb2.EventStreamResponse(events=[_job_event(5, "a")], index=5)], None),
    ]
    silent, live = _sharing(scripts)
    with _client_of(silent, live) as client:
        stream = client.stream_events(index=5, stall_timeout=0.5)
        first = next(stream)
        stream.close()

    assert (first.index, first.key) == (5, "a")
    # Each server was asked once, from 5: the silent one, then the next address.
    assert (silent.requests, live.requests) == ([5], [5])
