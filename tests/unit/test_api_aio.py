"""The API's grpc.aio plumbing (server/api/_aio.py, _notify.py, the aio interceptors) on a
real grpc.aio server in this process, on the API's own loop, with sync handlers as the
servicers are: calls counted by code, undecodable requests refused, a parked query that
holds a parking place but no thread and answers when the state moves, the parking bound.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import threading
from collections.abc import Iterator
from concurrent import futures
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from prometheus_client import REGISTRY

from deploy.cluster import wait_for
from drover.server.api import _limits
from drover.server.api._aio import SyncBridge, SyncContext
from drover.server.api._decode import AioDecodeGuard
from drover.server.api._limits import CallerLimits
from drover.server.api._notify import IndexNotifier
from drover.server.api._park import ParkRequest, current_parking, mark_rpc_kind
from drover.server.api.grpc_server import API_SERVER_OPTIONS, api_loop
from drover.server.inline import await_inline
from drover.server.state_store import StateStore
from drover.server.telemetry.rpc import AioRpcMetrics

PARK_METHOD = "/test.Park/Wait"


@dataclasses.dataclass
class _Rig:
    address: str
    store: StateStore
    limits: CallerLimits
    runs: list[str]
    committed: threading.Event
    held: list[int]


def _count(method: str, code: str) -> float:
    return REGISTRY.get_sample_value("drover_rpc_requests_total", {"method": method, "code": code}) or 0.0


def _parked_handler(
    store: StateStore, runs: list[str], committed: threading.Event, held: list[int]
) -> grpc.GenericRpcHandler:
    """``/test.Park/Wait``: answers the store's index once it is at least 5, parking (as a
    blocking query does) until then; ``/test.Park/Write``: a write RPC that returns once
    ``committed`` is set (both record each run's thread); ``/test.Park/Hold``: an async
    handler held until then (counted in ``held``)."""

    def wait(request: bytes, context: grpc.ServicerContext) -> bytes:
        runs.append(threading.current_thread().name)
        snap = store.snapshot()
        parking = current_parking()
        if snap.index < 5 and parking is not None:
            raise ParkRequest((), lambda s: s.index >= 5, parking.deadline_after(30.0), "tester")
        return str(snap.index).encode()

    def write(request: bytes, context: grpc.ServicerContext) -> bytes:
        """A write waiting for its commit, here until the test lets it go."""
        runs.append(threading.current_thread().name)
        assert committed.wait(30)
        return b"written"

    async def hold(request: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> bytes:
        """Held on the loop, as a parked query is, until ``committed`` is set."""
        held.append(1)
        while not committed.is_set():
            await asyncio.sleep(0.05)
        return b"held"

    def inline_write(request: bytes, context: grpc.ServicerContext) -> bytes:
        """A write run on the loop (server/inline.py): its commit is a future another thread
        resolves once ``committed`` is set, awaited through ``await_inline``."""
        runs.append(threading.current_thread().name)
        commit: futures.Future[bytes] = futures.Future()
        threading.Thread(
            target=lambda: committed.wait(30) and commit.set_result(b"inline"), daemon=True
        ).start()
        return await_inline(asyncio.wrap_future(commit))

    mark_rpc_kind(write, "write")
    mark_rpc_kind(inline_write, "write", inline=True)
    handlers = {
        "InlineWrite": grpc.unary_unary_rpc_method_handler(inline_write),
        "Hold": grpc.unary_unary_rpc_method_handler(hold),
        "Wait": grpc.unary_unary_rpc_method_handler(wait),
        "Write": grpc.unary_unary_rpc_method_handler(write),
    }
    return grpc.method_handlers_generic_handler("test.Park", handlers)


@pytest.fixture
def rig() -> Iterator[_Rig]:
    store = StateStore()
    limits = CallerLimits()
    runs: list[str] = []
    pool = futures.ThreadPoolExecutor(4, thread_name_prefix="test-pool")
    write_pool = futures.ThreadPoolExecutor(2, thread_name_prefix="test-write")
    committed = threading.Event()
    held: list[int] = []

    async def build() -> tuple[grpc.aio.Server, IndexNotifier, SyncBridge, int]:
        notifier = IndexNotifier(store, asyncio.get_running_loop())
        bridge = SyncBridge(pool, notifier, limits, None, write_pool=write_pool)
        server = grpc.aio.server(
            migration_thread_pool=pool,
            interceptors=[AioRpcMetrics(), AioDecodeGuard(), bridge],
            options=list(API_SERVER_OPTIONS),
        )
        servicer = health.HealthServicer()
        servicer.set("", health_pb2.HealthCheckResponse.SERVING)
        health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
        server.add_generic_rpc_handlers((_parked_handler(store, runs, committed, held),))
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        return server, notifier, bridge, port

    loop = api_loop()
    server, notifier, bridge, port = asyncio.run_coroutine_threadsafe(build(), loop).result(10)
    try:
        yield _Rig(f"127.0.0.1:{port}", store, limits, runs, committed, held)
    finally:
        committed.set()
        notifier.stop()
        asyncio.run_coroutine_threadsafe(server.stop(0), loop).result(10)
        asyncio.run_coroutine_threadsafe(bridge.close(), loop).result(10)
        store.close()
        pool.shutdown(wait=False)
        write_pool.shutdown(wait=False)


def test_aio__sync_unary_handler__counted_by_method_and_code(rig: _Rig) -> None:
    ok_before, missing_before = _count("Health.Check", "OK"), _count("Health.Check", "NOT_FOUND")
    with grpc.insecure_channel(rig.address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        stub.Check(health_pb2.HealthCheckRequest(), timeout=5)
        stub.Check(health_pb2.HealthCheckRequest(), timeout=5)
        with pytest.raises(grpc.RpcError) as caught:
            stub.Check(health_pb2.HealthCheckRequest(service="no.such.Service"), timeout=5)
        assert caught.value.code() == grpc.StatusCode.NOT_FOUND
    assert _count("Health.Check", "OK") - ok_before == 2
    assert _count("Health.Check", "NOT_FOUND") - missing_before == 1


def test_aio__sync_stream_the_caller_cancels__counted_cancelled(rig: _Rig) -> None:
    before = _count("Health.Watch", "CANCELLED")
    with grpc.insecure_channel(rig.address) as channel:
        watch = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest(), timeout=10)
        assert next(watch).status == health_pb2.HealthCheckResponse.SERVING
        watch.cancel()
        wait_for(lambda: _count("Health.Watch", "CANCELLED") > before, 10, message="the cancel counted")
    assert _count("Health.Watch", "CANCELLED") - before == 1


def test_aio__undecodable_request__invalid_argument_naming_the_method(rig: _Rig) -> None:
    with grpc.insecure_channel(rig.address) as channel:
        check: Any = channel.unary_unary("/grpc.health.v1.Health/Check")
        with pytest.raises(grpc.RpcError) as caught:
            check(b"\xff\xff\xff", timeout=5)  # a truncated varint: not a HealthCheckRequest
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "/grpc.health.v1.Health/Check" in (caught.value.details() or "")


def test_aio__parked_query__holds_a_place_not_a_thread__answers_when_the_state_moves(rig: _Rig) -> None:
    with grpc.insecure_channel(rig.address) as channel:
        wait: Any = channel.unary_unary(PARK_METHOD)
        call = wait.future(b"", timeout=30)
        wait_for(lambda: rig.limits.parked_total() == 1, 10, message="the query parked")
        # Parked: its first run gave its pool thread back (nothing runs it now).
        assert not call.done() and len(rig.runs) == 1
        tables = dataclasses.replace(rig.store.snapshot().tables, index=5)
        rig.store.commit(tables)
        assert call.result(timeout=10) == b"5"
    assert rig.limits.parked_total() == 0
    assert len(rig.runs) == 2 and all(name.startswith("test-pool") for name in rig.runs)


def test_aio__parked_query_past_the_callers_bound__resource_exhausted(
    rig: _Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_limits, "MAX_PARKED_PER_CALLER", 1)
    with grpc.insecure_channel(rig.address) as channel:
        wait: Any = channel.unary_unary(PARK_METHOD)
        first = wait.future(b"", timeout=30)
        wait_for(lambda: rig.limits.parked_total() == 1, 10, message="the first query parked")
        with pytest.raises(grpc.RpcError) as caught:
            wait(b"", timeout=10)
        assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "tester has 1 blocking queries waiting" in (caught.value.details() or "")
        first.cancel()
    wait_for(lambda: rig.limits.parked_total() == 0, 10, message="the cancelled query's place given back")


def test_aio__writes_waiting_for_their_commit__fill_their_own_pool_not_the_readers(rig: _Rig) -> None:
    """Every write thread waits for a commit (two here); a read still answers at once, on
    the other pool, and the writes answer once committed."""
    with grpc.insecure_channel(rig.address) as channel:
        write = channel.unary_unary("/test.Park/Write")
        pending = [write.future(b"", timeout=30) for _ in range(2)]
        wait_for(lambda: len(rig.runs) == 2, 10, 0.02, "both writes running")
        assert sorted(name.split("_")[0] for name in rig.runs) == ["test-write", "test-write"]

        health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
        assert not any(f.done() for f in pending)

        rig.committed.set()
        assert [f.result(10) for f in pending] == [b"written", b"written"]


def test_aio__inline_writes_waiting_for_their_commit__run_on_the_loop_and_hold_no_thread(rig: _Rig) -> None:
    """Ten writes wait for their commit at once, more than the write pool's two threads:
    each ran on the loop's own thread, a read still answers meanwhile, and every write
    answers once committed."""
    with grpc.insecure_channel(rig.address) as channel:
        write = channel.unary_unary("/test.Park/InlineWrite")
        pending = [write.future(b"", timeout=30) for _ in range(10)]
        wait_for(lambda: len(rig.runs) == 10, 10, 0.02, "all ten writes waiting")
        assert set(rig.runs) == {"api-loop"}

        health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
        assert not any(f.done() for f in pending)

        rig.committed.set()
        assert [f.result(10) for f in pending] == [b"inline"] * 10


def test_aio__a_burst_past_grpcs_default_pending_queue__every_call_is_served(rig: _Rig) -> None:
    """4,000 calls at once, each held until every one has arrived or ended: grpc core
    cancels the calls past 3,000 that the aio server has not taken yet, unless
    API_SERVER_OPTIONS raise its pending queue (a fleet's watches re-issued together after
    a failover are such a burst)."""
    burst = 4_000

    async def calls() -> collections.Counter[str]:
        ended: list[str] = []
        async with grpc.aio.insecure_channel(rig.address) as channel:
            hold = channel.unary_unary("/test.Park/Hold")

            async def one() -> None:
                try:
                    await hold(b"", timeout=60)
                    ended.append("OK")
                except grpc.aio.AioRpcError as exc:
                    ended.append(exc.code().name)

            pending = [asyncio.ensure_future(one()) for _ in range(burst)]
            while len(rig.held) + len(ended) < burst:
                await asyncio.sleep(0.05)
            rig.committed.set()
            await asyncio.gather(*pending)
        return collections.Counter(ended)

    assert asyncio.run(asyncio.wait_for(calls(), 90)) == collections.Counter({"OK": burst})


class _EndingAioContext:
    """Stands in for grpc.aio's context (in-process fake): answers while the call lives and
    raises once it has ended, as reading a freed call must never be tried."""

    def __init__(self) -> None:
        self.ended = False

    def _live(self, value: Any) -> Any:
        if self.ended:
            raise AssertionError("the aio context was read after its call ended")
        return value

    def peer(self) -> str:
        return str(self._live("ipv4:127.0.0.1:5555"))

    def invocation_metadata(self) -> Any:
        return self._live((("x-drover-token", "t"),))

    def auth_context(self) -> Any:
        return self._live({})

    def peer_identities(self) -> Any:
        return self._live(None)

    def peer_identity_key(self) -> Any:
        return self._live(None)

    def time_remaining(self) -> float | None:
        return float(self._live(30.0))


def test_sync_context__what_a_handler_reads__read_on_the_loop_at_the_start() -> None:
    fake = _EndingAioContext()

    async def make() -> SyncContext:
        return SyncContext(fake, asyncio.get_running_loop())  # type: ignore[arg-type]

    sync = asyncio.run(make())
    fake.ended = True
    # A pool thread reading the call now must not touch grpc's context.
    assert sync.peer() == "ipv4:127.0.0.1:5555"
    assert dict(sync.invocation_metadata()) == {"x-drover-token": "t"}
    assert sync.auth_context() == {}
    remaining = sync.time_remaining()
    assert remaining is not None and 0 < remaining <= 30.0
    assert sync.is_active()
    sync.end()
    assert not sync.is_active()
