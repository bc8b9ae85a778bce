"""proto/drover/common/grpc_handlers.py: a handler rebuilt keeps its kind, and an interceptor
rewrites each method's handler once, not on every call (pure: no server, fake continuations)."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc

from drover.common.grpc_handlers import HandlerRewriter, Kind, rebuild_handler


class _Counting(HandlerRewriter):
    def __init__(self) -> None:
        super().__init__()
        self.rewrites: list[str] = []

    def rewrite(
        self, handler: grpc.RpcMethodHandler[Any, Any], method: str
    ) -> grpc.RpcMethodHandler[Any, Any]:
        self.rewrites.append(method)
        return rebuild_handler(handler, lambda _kind, behaviour: behaviour)


class _Details:
    def __init__(self, method: str) -> None:
        self.method = method


def _handler() -> grpc.RpcMethodHandler[Any, Any]:
    return grpc.unary_unary_rpc_method_handler(lambda request, context: request)


def test_rebuild_handler__keeps_the_kind_and_wraps_the_behaviour() -> None:
    seen: list[Kind] = []

    def wrap(kind: Kind, behaviour: Any) -> Any:
        seen.append(kind)
        return lambda request, context: ("wrapped", behaviour(request, context))

    stream = grpc.unary_stream_rpc_method_handler(lambda request, context: iter([request]))
    rebuilt = rebuild_handler(stream, wrap)
    assert seen == ["unary_stream"]
    assert rebuilt.unary_stream is not None and rebuilt.unary_unary is None
    tag, responses = rebuilt.unary_stream("x", None)
    assert (tag, list(responses)) == ("wrapped", ["x"])


def test_rewriter__rewrites_a_method_once_while_its_handler_stays_the_same() -> None:
    interceptor = _Counting()
    jobs, nodes = _handler(), _handler()
    by_method = {"/drover.v1.Jobs/Get": jobs, "/drover.v1.Nodes/List": nodes}

    async def continuation(details: Any) -> grpc.RpcMethodHandler[Any, Any] | None:
        return by_method.get(details.method)

    async def calls() -> list[Any]:
        out = []
        for method in ["/drover.v1.Jobs/Get"] * 3 + ["/drover.v1.Nodes/List", "/drover.v1.Nope/X"]:
            out.append(await interceptor.intercept_service(continuation, _Details(method)))
        by_method["/drover.v1.Jobs/Get"] = _handler()  # a new handler under it: rewritten again
        out.append(await interceptor.intercept_service(continuation, _Details("/drover.v1.Jobs/Get")))
        return out

    got = asyncio.run(calls())
    assert interceptor.rewrites == ["/drover.v1.Jobs/Get", "/drover.v1.Nodes/List", "/drover.v1.Jobs/Get"]
    assert got[0] is got[1] is got[2]  # the same rewritten handler for each call
    assert got[4] is None  # an unknown method stays unknown
    assert got[5] is not got[0]
