"""Count and time every gRPC call the server serves, by method and status code.

The outermost interceptor of the server (server/api/grpc_server.py), so a call refused by
an inner one (an undecodable request) is counted with its code too. Only methods the server
has are wrapped (an unknown method never reaches a handler), so ``method`` is a bounded
label: ``Jobs.Register``, ``Health.Check``.

``AioRpcMetrics`` is for the API's grpc.aio server, where every handler is a coroutine or
an async generator by the time it is seen (sync ones are bridged by the innermost
interceptor, server/api/_aio.py).
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc

from drover.common.grpc_handlers import HandlerRewriter, rebuild_handler
from drover.server.telemetry.metrics import RPC_REQUESTS, RPC_SECONDS

__all__ = ["AioRpcMetrics", "method_label", "observe_call"]


def method_label(full_method: str) -> str:
    """``/drover.v1.Jobs/Register`` -> ``Jobs.Register``."""
    service, _, method = full_method.lstrip("/").partition("/")
    return f"{service.rsplit('.', 1)[-1]}.{method}"


def _aio_code_of(context: grpc.aio.ServicerContext[Any, Any], ended: str) -> str:
    """The call's status code: the one the servicer set (abort, set_code), else what its
    ending implies (``ended``: OK, UNKNOWN for an exception, CANCELLED for a stream closed
    under it); a call that returned normally after the caller's deadline ran out answered
    no one: DEADLINE_EXCEEDED."""
    code = context.code()  # None when the servicer set none
    if isinstance(code, grpc.StatusCode):
        return code.name
    if ended == "OK":
        remaining = context.time_remaining()
        if remaining is not None and remaining <= 0:
            return "DEADLINE_EXCEEDED"
    return ended


def observe_call(label: str, code: str, seconds: float) -> None:
    """Count and time one call of ``label`` (``Nodes.UpdateStatus``) that ended with ``code``."""
    RPC_REQUESTS.labels(label, code).inc()
    RPC_SECONDS.labels(label, code).observe(seconds)


class AioRpcMetrics(HandlerRewriter):
    def rewrite(
        self, handler: grpc.RpcMethodHandler[Any, Any], method: str
    ) -> grpc.RpcMethodHandler[Any, Any]:
        label = method_label(method)

        def observe(context: grpc.aio.ServicerContext[Any, Any], started: float, ended: str) -> None:
            observe_call(label, _aio_code_of(context, ended), time.perf_counter() - started)

        def timed(behavior: Callable[..., Any]) -> Callable[..., Any]:
            if inspect.isasyncgenfunction(behavior):

                async def timed_stream(
                    request: Any, context: grpc.aio.ServicerContext[Any, Any]
                ) -> AsyncIterator[Any]:
                    started = time.perf_counter()
                    ended = "UNKNOWN"
                    try:
                        async for response in behavior(request, context):
                            yield response
                        ended = "OK"
                    except (asyncio.CancelledError, GeneratorExit):
                        ended = "CANCELLED"  # the caller went away
                        raise
                    finally:
                        observe(context, started, ended)

                return timed_stream

            async def timed_call(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
                started = time.perf_counter()
                ended = "UNKNOWN"
                try:
                    response = await behavior(request, context)
                    ended = "OK"
                    return response
                except asyncio.CancelledError:
                    ended = "CANCELLED"
                    raise
                finally:
                    observe(context, started, ended)

            return timed_call

        return rebuild_handler(handler, lambda _kind, behavior: timed(behavior))
