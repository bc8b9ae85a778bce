"""The bridge between grpc.aio and drover's sync servicers.

Theory of operation
-------------------
The server is a ``grpc.aio`` server on one event loop thread (server/api/grpc_server.py).
Most handlers are plain functions that read the state or propose a raft entry and return;
they stay sync and run in ``pool`` (a few dozen threads). The handlers that wait are
cheap on the loop instead:

* a write's handler runs on the loop's own thread, in a greenlet, and awaits its raft
  commit there (server/inline.py): no thread hand-off on the way in or out. The few
  writes declared ``inline=False`` run in the write pool and wait there;
* other unary handlers run in the pool; a default read awaits its leadership confirmation on
  the loop (``ConfirmRequest``), then runs again to answer; a blocking query inside one
  raises ``ParkRequest`` (server/api/_park.py) rather than waiting, and the bridge waits for it on the loop
  (server/api/_notify.py) while holding the caller's parking place (server/api/_limits.py),
  then runs it again. A blocking read a follower forwards is made on an aio channel.
  So a parked query holds no thread, only its bound under the parking limits;
* handlers written ``async`` (``Nodes.WatchClientAllocs``, the node tunnel
  ``Nodes.Connect``, ``Events.Stream``, the latter through ``rpc``'s async-stream wrapper
  in server/api/_base.py) run on the loop as they are: what every node holds open costs
  no thread;
* a stream of unary calls (``Nodes.Heartbeat``, declared with ``each_request_as``,
  server/api/_park.py) serves each request as its unary method's handler above, in turn,
  on the loop: a caller that would call again and again keeps one stream instead;
* sync streaming handlers (followed logs, health watches) each get a thread of their own
  for as long as they stream, never one of the pool's: a stream that waits can not starve
  the unary calls.

A sync handler sees ``SyncContext``, grpc's sync ``ServicerContext`` surface over the aio
call: ``abort`` raises ``Aborted``, which the bridge turns into the aio abort on the loop;
``is_active`` turns false once the call ended (cancelled, deadline, answered), so loops
that poll it end; ``add_callback`` callbacks run when the call ends.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import TYPE_CHECKING, Any, NoReturn, cast

import grpc
import structlog

from drover.common.grpc_handlers import HandlerRewriter, Kind, rebuild_handler
from drover.common.grpc_options import MESSAGE_SIZE_OPTIONS
from drover.common.tls import channel_options
from drover.server.api._limits import CallerLimits
from drover.server.api._notify import IndexNotifier
from drover.server.api._park import (
    ConfirmRequest,
    ForwardRequest,
    Parking,
    ParkRequest,
    parking_scope,
    rpc_each,
    rpc_inline,
    rpc_kind,
)
from drover.server.errors import DroverError
from drover.server.inline import run_inline
from drover.server.telemetry.rpc import method_label, observe_call

if TYPE_CHECKING:
    from drover.common.tls import TLSMaterial

__all__ = ["Aborted", "SyncBridge", "SyncContext"]

log = structlog.get_logger("drover.api")


class Aborted(Exception):
    """``SyncContext.abort``: the call ends with ``code`` (raised, as grpc's sync abort is)."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self.code = code
        self.details = details


class SyncContext:
    """grpc's sync ServicerContext, as a sync handler running off the loop sees it.

    Made on the loop, and what it reads of the call (peer, metadata, auth, deadline) is
    read then: grpc.aio's context belongs to its loop, and reading it from a pool thread
    after the call was cancelled dereferenced a freed call in cygrpc and killed the server
    (SIGSEGV in ``peer()``, under the C1M benchmark's load). What it changes on the call
    is done on the loop."""

    def __init__(self, context: grpc.aio.ServicerContext[Any, Any], loop: asyncio.AbstractEventLoop) -> None:
        self._context = context
        self._loop = loop
        self._ended = False
        self._callbacks: list[Callable[[], None]] = []
        self._lock = threading.Lock()
        self._peer = context.peer()
        self._metadata = context.invocation_metadata()
        self._auth_context = context.auth_context()
        self._peer_identities = context.peer_identities()
        self._peer_identity_key = context.peer_identity_key()
        remaining = context.time_remaining()
        self._deadline = None if remaining is None else time.monotonic() + remaining

    def is_active(self) -> bool:
        if self._ended:
            return False
        remaining = self.time_remaining()
        return remaining is None or remaining > 0

    def abort(self, code: grpc.StatusCode, details: str = "") -> NoReturn:
        raise Aborted(code, details)

    def abort_with_status(self, status: grpc.Status) -> NoReturn:
        raise Aborted(status.code, status.details)

    def time_remaining(self) -> float | None:
        return None if self._deadline is None else max(0.0, self._deadline - time.monotonic())

    def peer(self) -> str:
        return self._peer

    def peer_identities(self) -> Any:
        return self._peer_identities

    def peer_identity_key(self) -> Any:
        return self._peer_identity_key

    def auth_context(self) -> Any:
        return self._auth_context

    def invocation_metadata(self) -> Any:
        return self._metadata

    def code(self) -> Any:
        return self._on_loop(self._context.code)

    def set_code(self, code: grpc.StatusCode) -> None:
        self._on_loop(self._context.set_code, code)

    def set_details(self, details: str) -> None:
        self._on_loop(self._context.set_details, details)

    def details(self) -> Any:
        return self._on_loop(self._context.details)

    def set_trailing_metadata(self, metadata: Any) -> None:
        self._on_loop(self._context.set_trailing_metadata, metadata)

    def send_initial_metadata(self, metadata: Any) -> None:
        asyncio.run_coroutine_threadsafe(self._context.send_initial_metadata(metadata), self._loop).result()

    def _on_loop(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` on the call's loop (at once if this is its thread)."""
        try:
            here = asyncio.get_running_loop() is self._loop
        except RuntimeError:
            here = False
        if here:
            return fn(*args)
        done: concurrent.futures.Future[Any] = concurrent.futures.Future()

        def run() -> None:
            try:
                done.set_result(fn(*args))
            except BaseException as exc:  # handed back to the calling thread
                done.set_exception(exc)

        self._loop.call_soon_threadsafe(run)
        return done.result()

    def add_callback(self, callback: Callable[[], None]) -> bool:
        with self._lock:
            if not self._ended:
                self._callbacks.append(callback)
                return True
        return False

    def end(self) -> None:
        """The call is over: polling loops stop, and the callbacks run (here, on the loop)."""
        with self._lock:
            self._ended = True
            callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            try:
                callback()
            except Exception:
                log.exception("api.callback_failed")


def _sync_requests(requests: AsyncIterator[Any], loop: asyncio.AbstractEventLoop) -> Iterator[Any]:
    """An aio call's incoming messages, for a sync handler's thread. A broken or cancelled
    stream simply ends (what the tunnel's reader makes of a broken one anyway)."""
    iterator = requests.__aiter__()

    async def next_message() -> Any:
        return await iterator.__anext__()

    while True:
        try:
            message = asyncio.run_coroutine_threadsafe(next_message(), loop).result()
        except StopAsyncIteration:
            return
        except Exception:
            return
        yield message


def _in_thread(name: str, fn: Callable[[], Any]) -> concurrent.futures.Future[Any]:
    done: concurrent.futures.Future[Any] = concurrent.futures.Future()

    def run() -> None:
        # Running now: the awaiting side giving up (the call cancelled) no longer cancels
        # the future under the thread, so the outcome below always lands.
        if not done.set_running_or_notify_cancel():
            return
        try:
            done.set_result(fn())
        except BaseException as exc:  # handed to the awaiting coroutine, re-raised there
            done.set_exception(exc)

    threading.Thread(target=run, name=name, daemon=True).start()
    return done


class _Relay:
    """The requests of one caller's stream of unary calls that this server forwards, sent to
    the leader as messages on one stream of the same method (opened at the first, and again
    when the leader moves), answered in order as the leader serves them. The leader's
    stream ends at its first error, so the caller's ends with the same status: the stream
    relayed is the caller's own, never shared with another caller's requests."""

    def __init__(self, channel_to: Callable[[str], grpc.aio.Channel], method: str) -> None:
        self._channel_to = channel_to
        self._method = method
        self._address = ""
        self._up: asyncio.Queue[Any] = asyncio.Queue()
        self._call: grpc.aio.StreamStreamCall[Any, Any] | None = None
        # Whether the request being served went to the leader (``forward``) or was served
        # here: once this server serves them itself (it became the leader), a relay left
        # open would hold an idle stream on the old leader for as long as the caller's.
        self.forwarded = False

    async def forward(self, forward: ForwardRequest, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        if self._call is None or self._address != forward.address:
            self.close()
            self._up = asyncio.Queue()
            self._address = forward.address
            self._call = self._channel_to(forward.address).stream_stream(
                self._method,
                request_serializer=lambda m: m.SerializeToString(),
                response_deserializer=forward.response_cls.FromString,
            )(_drained(self._up), metadata=forward.metadata)
        self.forwarded = True
        call = self._call
        await self._up.put(forward.request)
        try:
            answer = await asyncio.wait_for(call.read(), forward.timeout)
        except TimeoutError:
            self.close()
            await context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, "the leader did not answer in time")
        except grpc.aio.AioRpcError as exc:
            self.close()
            await context.abort(exc.code(), exc.details() or "forwarded call failed")
        if answer is grpc.aio.EOF:
            self.close()
            await context.abort(grpc.StatusCode.UNAVAILABLE, "the leader ended the forwarded stream")
        return answer

    def close(self) -> None:
        if self._call is not None:
            self._up.put_nowait(None)
            self._call.cancel()
            self._call = None


async def _drained(queue: asyncio.Queue[Any]) -> AsyncIterator[Any]:
    """What is put on ``queue``, until a None."""
    while (item := await queue.get()) is not None:
        yield item


class SyncBridge(HandlerRewriter):
    """The innermost interceptor: every sync handler becomes a coroutine (see above)."""

    def __init__(
        self,
        pool: concurrent.futures.Executor,
        notifier: IndexNotifier,
        limits: CallerLimits,
        tls: TLSMaterial | None,
        *,
        write_pool: concurrent.futures.Executor | None = None,
    ) -> None:
        super().__init__()
        self._pool = pool
        # Write RPCs wait in their thread for the raft commit: their own pool, so reads and
        # heartbeats never queue behind them (server/api/grpc_server.py, WRITE_THREADS).
        self._write_pool = write_pool or pool
        self._notifier = notifier
        self._limits = limits
        self._tls = tls
        self._channels: dict[str, grpc.aio.Channel] = {}

    async def close(self) -> None:
        channels, self._channels = self._channels, {}
        for channel in channels.values():
            await channel.close()

    def rewrite(
        self, handler: grpc.RpcMethodHandler[Any, Any], method: str
    ) -> grpc.RpcMethodHandler[Any, Any]:

        def bridged(kind: Kind, behaviour: Callable[..., Any]) -> Callable[..., Any]:
            if _is_async(behaviour):
                return behaviour
            unary_name = rpc_each(behaviour)
            if kind == "stream_stream" and unary_name:
                servicer: Any = cast(Any, behaviour).__self__  # a bound method of the servicer
                unary = getattr(servicer, unary_name)
                label = method_label(f"{method.rsplit('/', 1)[0]}/{unary_name}")
                return self._each(method, label, self._unary(unary))
            if kind == "unary_unary":
                return self._unary(behaviour)
            if kind == "stream_unary":
                return self._client_stream(method, behaviour)
            return self._stream(method, behaviour, streaming_requests=kind == "stream_stream")

        return rebuild_handler(handler, bridged)

    # -- unary: the pool, with parking and async forwarding ---------------------------------

    def _unary(self, behaviour: Callable[[Any, Any], Any]) -> Callable[..., Awaitable[Any]]:
        pool = self._write_pool if rpc_kind(behaviour) == "write" else self._pool
        inline = rpc_inline(behaviour)

        async def handle(
            request: Any,
            context: grpc.aio.ServicerContext[Any, Any],
            relay: _Relay | None = None,
        ) -> Any:
            loop = asyncio.get_running_loop()
            sync = SyncContext(context, loop)
            parking = Parking()
            held: list[str] = []
            try:
                while True:
                    scope = parking_scope(parking)
                    parking.runs += 1
                    try:
                        if inline:
                            return await run_inline(behaviour, request, sync, context=scope)
                        return await loop.run_in_executor(pool, scope.run, behaviour, request, sync)
                    except ParkRequest as park:
                        if not held:
                            self._limits.acquire(park.caller)
                            held.append(park.caller)
                        await self._notifier.wait_until(park.tables, park.ready, park.deadline)
                    except ConfirmRequest as confirm:
                        await confirm.confirm()
                        parking.confirmed = True
                    except ForwardRequest as forward:
                        if relay is not None:
                            return await relay.forward(forward, context)
                        return await self._forward(forward, context)
            except Aborted as aborted:
                await context.abort(aborted.code, aborted.details)
            except DroverError as exc:  # the parking limit, refused before any wait
                await context.abort(exc.code, str(exc))
            finally:
                for caller in held:
                    self._limits.release(caller)
                sync.end()

        return handle

    # -- a stream of unary calls (server/api/_park.py each_request_as) ----------------------

    def _each(
        self, method: str, label: str, serve: Callable[..., Awaitable[Any]]
    ) -> Callable[..., AsyncIterator[Any]]:
        """Each request served by ``serve`` (the unary method's bridged handler) in turn, and
        counted and timed as one call of ``label``: the stream's own count says only that it
        was open, and an operator reads the unary call's latency (deploy/RUNBOOK.md). A
        request this server would forward goes to the leader on one stream of the same
        method (``_Relay``), not as a call each: the leader accepts calls one at a time too."""

        async def stream(
            request_iterator: AsyncIterator[Any], context: grpc.aio.ServicerContext[Any, Any]
        ) -> AsyncIterator[Any]:
            relay = _Relay(self._channel, method)
            try:
                async for request in request_iterator:
                    yield await self._each_one(label, serve, request, context, relay)
            finally:
                relay.close()

        return stream

    @staticmethod
    async def _each_one(
        label: str,
        serve: Callable[..., Awaitable[Any]],
        request: Any,
        context: grpc.aio.ServicerContext[Any, Any],
        relay: _Relay,
    ) -> Any:
        started = time.perf_counter()
        code = "UNKNOWN"
        relay.forwarded = False
        try:
            response = await serve(request, context, relay)
            if not relay.forwarded:
                relay.close()
            code = "OK"
        except asyncio.CancelledError:
            code = "CANCELLED"  # the caller went away
            raise
        except BaseException:
            ended = context.code()  # the abort's, when it was one
            code = ended.name if isinstance(ended, grpc.StatusCode) else code
            raise
        finally:
            observe_call(label, code, time.perf_counter() - started)
        return response

    def _channel(self, address: str) -> grpc.aio.Channel:
        """The aio channel this server forwards to ``address`` on (one per address)."""
        channel = self._channels.get(address)
        if channel is None:
            if self._tls is None:
                channel = grpc.aio.insecure_channel(address, options=list(MESSAGE_SIZE_OPTIONS))
            else:
                channel = grpc.aio.secure_channel(
                    address,
                    self._tls.channel_credentials(),
                    options=[*MESSAGE_SIZE_OPTIONS, *channel_options(self._tls)],
                )
            self._channels[address] = channel
        return channel

    async def _forward(self, forward: ForwardRequest, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        call: grpc.aio.UnaryUnaryMultiCallable[Any, Any] = self._channel(forward.address).unary_unary(
            forward.path,
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=forward.response_cls.FromString,
        )
        try:
            return await call(forward.request, timeout=forward.timeout, metadata=forward.metadata)
        except grpc.aio.AioRpcError as exc:
            await context.abort(exc.code(), exc.details() or "forwarded call failed")

    # -- streams: a thread each ----------------------------------------------------------

    def _stream(
        self, method: str, behaviour: Callable[[Any, Any], Iterator[Any]], *, streaming_requests: bool
    ) -> Callable[..., Awaitable[None]]:
        async def handle(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> None:
            loop = asyncio.get_running_loop()
            sync = SyncContext(context, loop)
            incoming = _sync_requests(request, loop) if streaming_requests else request

            def pump() -> None:
                responses = behaviour(incoming, sync)
                try:
                    for response in responses:
                        if not sync.is_active():
                            return
                        asyncio.run_coroutine_threadsafe(context.write(response), loop).result()
                finally:
                    # A generator's own finally (its parking place, its tunnel session) runs now.
                    close = getattr(responses, "close", None)
                    if close is not None:
                        close()

            try:
                await asyncio.wrap_future(_in_thread(f"grpc-stream {method}", pump))
            except Aborted as aborted:
                await context.abort(aborted.code, aborted.details)
            finally:
                sync.end()

        return handle

    def _client_stream(
        self, method: str, behaviour: Callable[[Any, Any], Any]
    ) -> Callable[..., Awaitable[Any]]:
        async def handle(requests: AsyncIterator[Any], context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            loop = asyncio.get_running_loop()
            sync = SyncContext(context, loop)
            incoming = _sync_requests(requests, loop)
            try:
                return await asyncio.wrap_future(
                    _in_thread(f"grpc-upload {method}", lambda: behaviour(incoming, sync))
                )
            except Aborted as aborted:
                await context.abort(aborted.code, aborted.details)
            finally:
                sync.end()

        return handle


def _is_async(behaviour: Callable[..., Any]) -> bool:
    return inspect.iscoroutinefunction(behaviour) or inspect.isasyncgenfunction(behaviour)
