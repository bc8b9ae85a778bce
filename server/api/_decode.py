"""Requests that do not decode: INVALID_ARGUMENT and one rate-limited WARN line.

gRPC decodes a request before any servicer sees it; when the bytes are not the method's
message (truncated, bad UTF-8 in a string, a wrong wire type) grpc itself logs a full
traceback ("Exception deserializing request!") and answers INTERNAL. Anyone who reaches
the port can send such bytes in a loop, filling the log and reading as a server bug. The
interceptor here wraps every method's deserializer: an undecodable request becomes a
marker, the method answers INVALID_ARGUMENT naming the message type it expected, and the
log gets one WARN line per ``WARN_INTERVAL_S`` with how many were suppressed since.
``AioDecodeGuard`` is for the API's grpc.aio server, whose handlers are all coroutines or
async generators by then (server/api/_aio.py).
"""

from __future__ import annotations

import inspect
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, Final, NoReturn

import grpc
import structlog

from drover.common.grpc_handlers import HandlerRewriter, Kind, rebuild_handler
from drover.server.api._limits import peer_host

__all__ = ["WARN_INTERVAL_S", "AioDecodeGuard", "RateLimitedWarning"]

log = structlog.get_logger("drover.api")

WARN_INTERVAL_S: Final = 10.0


class RateLimitedWarning:
    """At most one WARN line per ``interval_s``; the next one says how many were dropped."""

    def __init__(
        self, event: str, interval_s: float = WARN_INTERVAL_S, clock: Callable[[], float] = time.monotonic
    ):
        self._event = event
        self._interval_s = interval_s
        self._clock = clock
        self._lock = threading.Lock()
        self._last = float("-inf")
        self._suppressed = 0

    def warn(self, **fields: Any) -> bool:
        """Log unless one was logged within the interval; True if this one was."""
        now = self._clock()
        with self._lock:
            if now - self._last < self._interval_s:
                self._suppressed += 1
                return False
            suppressed, self._suppressed, self._last = self._suppressed, 0, now
        log.warning(self._event, suppressed=suppressed, **fields)
        return True


@dataclass(frozen=True, slots=True)
class _Undecodable:
    """What the wrapped deserializer returns for bytes that are not the expected message."""

    reason: str


_WARNING: Final = RateLimitedWarning("api.undecodable_request")


def _guarded(deserialize: Callable[[bytes], Any] | None) -> Callable[[bytes], Any] | None:
    if deserialize is None:
        return None

    def safe(data: bytes) -> Any:
        try:
            return deserialize(data)
        except Exception as exc:  # protobuf's DecodeError, and anything else a parser raises
            return _Undecodable(" ".join(str(exc).split())[:200] or type(exc).__name__)

    return safe


async def _refuse_aio(
    request: _Undecodable, context: grpc.aio.ServicerContext[Any, Any], method: str
) -> NoReturn:
    _WARNING.warn(method=method, peer=peer_host(context.peer() or ""), reason=request.reason)
    await context.abort(
        grpc.StatusCode.INVALID_ARGUMENT, f"request: does not decode as {method}'s request message"
    )
    raise AssertionError("abort returned")  # aio abort always raises


class AioDecodeGuard(HandlerRewriter):
    def rewrite(
        self, handler: grpc.RpcMethodHandler[Any, Any], method: str
    ) -> grpc.RpcMethodHandler[Any, Any]:
        deserialize = _guarded(handler.request_deserializer)

        def one(behavior: Callable[..., Any]) -> Callable[..., Any]:
            if inspect.isasyncgenfunction(behavior):

                async def checked_stream(
                    request: Any, context: grpc.aio.ServicerContext[Any, Any]
                ) -> AsyncIterator[Any]:
                    if isinstance(request, _Undecodable):
                        await _refuse_aio(request, context, method)
                    async for response in behavior(request, context):
                        yield response

                return checked_stream

            async def checked_call(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
                if isinstance(request, _Undecodable):
                    await _refuse_aio(request, context, method)
                return await behavior(request, context)

            return checked_call

        def many(behavior: Callable[..., Any]) -> Callable[..., Any]:
            async def checked(
                requests: AsyncIterator[Any], context: grpc.aio.ServicerContext[Any, Any]
            ) -> AsyncIterator[Any]:
                async for request in requests:
                    if isinstance(request, _Undecodable):
                        await _refuse_aio(request, context, method)
                    yield request

            if inspect.isasyncgenfunction(behavior):

                async def stream_of_many(
                    requests: AsyncIterator[Any], context: grpc.aio.ServicerContext[Any, Any]
                ) -> AsyncIterator[Any]:
                    async for response in behavior(checked(requests, context), context):
                        yield response

                return stream_of_many

            async def call_of_many(
                requests: AsyncIterator[Any], context: grpc.aio.ServicerContext[Any, Any]
            ) -> Any:
                return await behavior(checked(requests, context), context)

            return call_of_many

        def checked(kind: Kind, behavior: Callable[..., Any]) -> Callable[..., Any]:
            return one(behavior) if kind.startswith("unary_") else many(behavior)

        return rebuild_handler(handler, checked, request_deserializer=deserialize)
