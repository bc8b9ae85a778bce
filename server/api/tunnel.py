"""The RPCs only a node can answer, served through its tunnel (server/tunnel/).

``Nodes.Connect`` is the client's end: its first message names the node and carries the
node's secret, checked as every node-secret RPC checks it (``Endpoints.authenticate_node``);
from then on this server holds the node's session. ``Allocs.Logs/Restart/Signal`` and
``Nodes.MetaRead/MetaApply`` find the node (the alloc's, for the alloc calls), send the
request down the node's tunnel if this server holds it, and relay the answer.

A server that does not hold the tunnel asks each other server in the state's servers
table, once, with the same forwarding marks as a leader-forwarded call (server/api/_base.py)
and the caller's token: the server that holds it authorizes the call again on its own
state. A forwarded call is never forwarded again, so no call loops. If no server holds the
node's tunnel the answer is UNAVAILABLE "node X is not connected" (the SDK retries
UNAVAILABLE, so a client that is reconnecting is waited for).

Rights (server/acl/rights.py): the alloc calls name an alloc, not a namespace, so the gate
asks for the capability in some namespace and ``_authorize_alloc`` then on the alloc's own,
once it is found, before anything is sent to the node.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, TypeVar

import grpc
import structlog
from google.protobuf.message import Message

from drover.common.secrets import TOKEN_METADATA_KEY
from drover.common.signals import SignalNameError, parse_signal
from drover.scheduler.structs import Allocation
from drover.server.acl import rights
from drover.server.acl.resolve import Identity, acting_as, caller, resolve
from drover.server.api._base import call_token, rpc
from drover.server.api._limits import CALLER_METADATA_KEY, FORWARDED_KEY, current_caller
from drover.server.errors import DroverError, NotFoundError, PermissionDeniedError, ValidationError
from drover.server.tunnel import NodeSession, TunnelError, tunnels_for
from drover.v1 import api_pb2

if TYPE_CHECKING:
    from drover.server.core import ServerCore

__all__ = ["AllocTunnelMixin", "NodeTunnelMixin"]

log = structlog.get_logger("drover.api.tunnel")

# How long a unary call (restart, signal, meta) waits for the node's answer.
NODE_ANSWER_TIMEOUT_S: Final = 30.0
# How often a waiting call looks whether its caller is still there.
_POLL_S: Final = 0.25
_MAX_META_KEYS: Final = 256
_MAX_META_TEXT: Final = 1024

F = TypeVar("F", bound=Callable[..., Any])


def _not_connected(node_id: str) -> TunnelError:
    return TunnelError(grpc.StatusCode.UNAVAILABLE, f"node {node_id} is not connected")


def _is_forwarded(context: grpc.ServicerContext) -> bool:
    return any(key == FORWARDED_KEY for key, _ in context.invocation_metadata() or ())


def _forward_metadata(core: ServerCore, context: grpc.ServicerContext) -> tuple[tuple[str, str], ...]:
    metadata: tuple[tuple[str, str], ...] = ((FORWARDED_KEY, core.name),)
    if current_caller():
        metadata += ((CALLER_METADATA_KEY, current_caller()),)
    token = call_token(context)
    if token:
        metadata += ((TOKEN_METADATA_KEY, token),)
    return metadata


def _other_servers(core: ServerCore) -> list[str]:
    return sorted(
        m.grpc_address
        for m in core.store.snapshot().servers()
        if m.grpc_address and m.name != core.name and m.grpc_address != core.grpc_address
    )


def _find_alloc(core: ServerCore, alloc_id: str) -> Allocation:
    if not alloc_id:
        raise ValidationError("alloc_id: required")
    snap = core.store.snapshot()
    alloc = snap.alloc(alloc_id)
    if alloc is None:
        raise NotFoundError(f"alloc {alloc_id!r} not found")
    if not alloc.node_id or snap.node(alloc.node_id) is None:
        raise NotFoundError(f"node {alloc.node_id!r} of alloc {alloc_id!r} not found")
    return alloc


def _authorize_alloc(identity: Identity | None, alloc: Allocation, service: str, method: str) -> None:
    """Refuse a call on an alloc of a namespace the caller's token may not use so."""
    if identity is None or identity.acl.management:
        return  # ACLs off
    need = rights.need_for(service, method)
    if not identity.acl.allows_namespace(alloc.namespace, need.any_of):
        raise PermissionDeniedError(
            f"Permission denied: {service}.{method} needs {' or '.join(need.any_of)}"
            f" on namespace {alloc.namespace!r}"
        )


def _require_node(core: ServerCore, node_id: str) -> None:
    if not node_id:
        raise ValidationError("node_id: required")
    if core.store.snapshot().node(node_id) is None:
        raise NotFoundError(f"node {node_id!r} not found")


def _ask_node(
    core: ServerCore, context: grpc.ServicerContext, node_id: str, rpc_name: str, request: Message
) -> Any:
    """The node's one answer to ``request`` of ``rpc_name`` (a key of ``_RELAYED``): through
    its tunnel here, or relayed by the server that holds it."""
    session = tunnels_for(core).get(node_id)
    if session is None:
        return _forward_unary(core, context, rpc_name, request, node_id)
    deadline = time.monotonic() + NODE_ANSWER_TIMEOUT_S
    down = api_pb2.ClientTunnelDown()
    getattr(down, _RELAYED[rpc_name].down_field).CopyFrom(request)
    with session.open(down) as pending:
        while True:
            answer = pending.next_answer(_POLL_S)
            if answer is not None and answer.done:
                return _RELAYED[rpc_name].convert(answer)
            if not context.is_active():
                raise TunnelError(grpc.StatusCode.CANCELLED, "the caller went away")
            if time.monotonic() > deadline:
                raise TunnelError(
                    grpc.StatusCode.DEADLINE_EXCEEDED,
                    f"node {node_id} did not answer within {NODE_ANSWER_TIMEOUT_S:g}s",
                )


def _forward_timeout(context: grpc.ServicerContext) -> float:
    remaining = context.time_remaining()
    cap = NODE_ANSWER_TIMEOUT_S + 5.0
    return cap if remaining is None else max(0.1, min(remaining - 0.05, cap))


def _forward_unary(
    core: ServerCore, context: grpc.ServicerContext, rpc_name: str, request: Message, node_id: str
) -> Any:
    if _is_forwarded(context):
        raise _not_connected(node_id)
    service, _, method = rpc_name.partition(".")
    for address in _other_servers(core):
        call: grpc.UnaryUnaryMultiCallable[Message, Any] = core.channel_to(address).unary_unary(
            f"/drover.v1.{service}/{method}",
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=_RELAYED[rpc_name].response.FromString,
        )
        try:
            return call(request, timeout=_forward_timeout(context), metadata=_forward_metadata(core, context))
        except grpc.RpcError as exc:
            code = exc.code() if isinstance(exc, grpc.Call) else grpc.StatusCode.UNKNOWN
            if code == grpc.StatusCode.UNAVAILABLE:
                continue  # not held there either, or that server is down: ask the next
            details = exc.details() if isinstance(exc, grpc.Call) else None
            raise TunnelError(code, details or "relayed call failed") from exc
    raise _not_connected(node_id)


def _control_response(_answer: api_pb2.ClientTunnelUp) -> api_pb2.AllocControlResponse:
    return api_pb2.AllocControlResponse()


def _meta_response(answer: api_pb2.ClientTunnelUp) -> api_pb2.NodeMetaResponse:
    return answer.meta


@dataclass(frozen=True, slots=True)
class _Relayed:
    """How one unary RPC's answer comes back: from the node's tunnel (``convert``), or from
    the server that holds the tunnel (``response``, the message it sends)."""

    down_field: str  # the request's field of ClientTunnelDown
    response: type[Message]
    convert: Callable[[api_pb2.ClientTunnelUp], Message]


_RELAYED: Final[dict[str, _Relayed]] = {
    "Allocs.Restart": _Relayed("restart", api_pb2.AllocControlResponse, _control_response),
    "Allocs.Signal": _Relayed("signal", api_pb2.AllocControlResponse, _control_response),
    "Nodes.MetaRead": _Relayed("meta_read", api_pb2.NodeMetaResponse, _meta_response),
    "Nodes.MetaApply": _Relayed("meta_apply", api_pb2.NodeMetaResponse, _meta_response),
}


def validate_meta_apply(request: api_pb2.NodeMetaApplyRequest) -> None:
    """Refuse a meta change no node should be asked to make; names the field."""
    if not request.meta and not request.unset:
        raise ValidationError("meta: give at least one key to set or unset")
    both = sorted(set(request.meta) & set(request.unset))
    if both:
        raise ValidationError(f"meta: key(s) {', '.join(both)} both set and unset")
    if len(request.meta) + len(request.unset) > _MAX_META_KEYS:
        raise ValidationError(f"meta: at most {_MAX_META_KEYS} keys in one change")
    for key in [*request.meta, *request.unset]:
        if not key or len(key) > _MAX_META_TEXT or any(c.isspace() or c == "=" for c in key):
            raise ValidationError(f"meta: key {key[:64]!r} must be non-empty, without spaces or '='")
    for key, value in request.meta.items():
        if len(value) > _MAX_META_TEXT:
            raise ValidationError(f"meta: value of {key!r} is longer than {_MAX_META_TEXT} characters")


def stream_rpc(service: str) -> Callable[[F], F]:
    """The ``rpc`` decorator's checks for a server-streaming method, which ``rpc`` can not
    wrap (it would authorize the generator, not its run): the token is checked before the
    first message, and the method runs acting as the caller (``caller()``; None with ACLs
    off). A streaming call keeps its worker thread to itself until it ends, so the identity
    set here is seen by no other call."""

    def deco(method: F) -> F:
        name = method.__name__
        rpc_name = f"{service}.{name}"
        need = rights.need_for(service, name)

        @functools.wraps(method)
        def wrapper(self: Any, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
            core: ServerCore = self.core
            try:
                if not core.cfg.acl_enabled:
                    yield from method(self, request, context)
                    return
                identity = resolve(core.store.snapshot(), call_token(context))
                rights.check_request(rpc_name, need, identity.acl, request, anonymous=identity.anonymous)
                with acting_as(identity):
                    yield from method(self, request, context)
            except DroverError as exc:
                context.abort(exc.code, str(exc))

        return wrapper  # type: ignore[return-value]

    return deco


class AllocTunnelMixin:
    """Allocs.Restart, Signal and Logs (mixed into AllocsServicer)."""

    core: ServerCore

    @rpc("Allocs", "local")
    def Restart(
        self, request: api_pb2.AllocRestartRequest, context: grpc.ServicerContext
    ) -> api_pb2.AllocControlResponse:
        alloc = _find_alloc(self.core, request.alloc_id)
        _authorize_alloc(caller(), alloc, "Allocs", "Restart")
        return _ask_node(self.core, context, alloc.node_id, "Allocs.Restart", request)  # type: ignore[no-any-return]

    @rpc("Allocs", "local")
    def Signal(
        self, request: api_pb2.AllocSignalRequest, context: grpc.ServicerContext
    ) -> api_pb2.AllocControlResponse:
        try:
            signum = parse_signal(request.signal)
        except SignalNameError as exc:
            raise ValidationError(str(exc)) from None
        alloc = _find_alloc(self.core, request.alloc_id)
        _authorize_alloc(caller(), alloc, "Allocs", "Signal")
        named = api_pb2.AllocSignalRequest()
        named.CopyFrom(request)
        named.signal = signum.name
        return _ask_node(self.core, context, alloc.node_id, "Allocs.Signal", named)  # type: ignore[no-any-return]

    @stream_rpc("Allocs")
    def Logs(
        self, request: api_pb2.AllocLogsRequest, context: grpc.ServicerContext
    ) -> Iterator[api_pb2.AllocLogsResponse]:
        if request.tail_lines < 0:
            raise ValidationError("tail_lines: must be >= 0")
        if request.tail_bytes < 0:
            raise ValidationError("tail_bytes: must be >= 0")
        if request.tail_lines and request.tail_bytes:
            raise ValidationError("tail_lines, tail_bytes: give at most one")
        alloc = _find_alloc(self.core, request.alloc_id)
        _authorize_alloc(caller(), alloc, "Allocs", "Logs")
        session = tunnels_for(self.core).get(alloc.node_id)
        if session is None:
            yield from _forward_logs(self.core, context, request, alloc.node_id)
            return
        yield from _logs_from(session, request, context)


def _logs_from(
    session: NodeSession, request: api_pb2.AllocLogsRequest, context: grpc.ServicerContext
) -> Iterator[api_pb2.AllocLogsResponse]:
    with session.open(api_pb2.ClientTunnelDown(logs=request)) as pending:
        last_heard = time.monotonic()
        while context.is_active():
            answer = pending.next_answer(_POLL_S)
            if answer is None:
                # A followed log may be quiet for ever; a plain read is sent without pause,
                # so a node silent that long is stuck, and the caller is told so.
                if not request.follow and time.monotonic() - last_heard > NODE_ANSWER_TIMEOUT_S:
                    raise TunnelError(
                        grpc.StatusCode.DEADLINE_EXCEEDED,
                        f"node {session.node_id} sent nothing for {NODE_ANSWER_TIMEOUT_S:g}s",
                    )
                continue
            last_heard = time.monotonic()
            if answer.data:
                yield api_pb2.AllocLogsResponse(data=answer.data)
            if answer.done:
                return


def _forward_logs(
    core: ServerCore, context: grpc.ServicerContext, request: api_pb2.AllocLogsRequest, node_id: str
) -> Iterator[api_pb2.AllocLogsResponse]:
    if _is_forwarded(context):
        raise _not_connected(node_id)
    for address in _other_servers(core):
        open_stream: Any = core.channel_to(address).unary_stream(
            "/drover.v1.Allocs/Logs",
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=api_pb2.AllocLogsResponse.FromString,
        )
        # A followed log may run for ever; a plain read is bounded, so a paused server that
        # accepts the connection and never answers can not hold the caller.
        timeout = None if request.follow else _forward_timeout(context) * 2
        stream: Any = open_stream(request, timeout=timeout, metadata=_forward_metadata(core, context))
        # The caller going away ends the relayed stream too (and so the node's follow).
        context.add_callback(stream.cancel)
        relayed = False
        try:
            for response in stream:
                relayed = True
                yield response
            return
        except grpc.RpcError as exc:
            code = exc.code() if isinstance(exc, grpc.Call) else grpc.StatusCode.UNKNOWN
            if code == grpc.StatusCode.UNAVAILABLE and not relayed:
                continue
            if code == grpc.StatusCode.CANCELLED and not context.is_active():
                return
            details = exc.details() if isinstance(exc, grpc.Call) else None
            raise TunnelError(code, details or "relayed call failed") from exc
        finally:
            stream.cancel()
    raise _not_connected(node_id)


class NodeTunnelMixin:
    """Nodes.Connect, MetaRead and MetaApply (mixed into NodesServicer)."""

    core: ServerCore

    async def Connect(
        self,
        request_iterator: AsyncIterator[api_pb2.ClientTunnelUp],
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> AsyncIterator[api_pb2.ClientTunnelDown]:
        """A node-secret RPC: no token; the hello's secret must be the node's.

        A coroutine on the API loop, as is the task reading the node's answers: every client
        holds its tunnel open for as long as it runs, so a thread per tunnel would be a
        thread per node of the fleet."""
        core = self.core
        answers = request_iterator.__aiter__()
        try:
            hello = await answers.__anext__()
        except (StopAsyncIteration, grpc.RpcError):
            return
        try:
            core.endpoints.authenticate_node(core.store.snapshot(), hello.node_id, hello.secret_id)
        except DroverError as exc:
            await context.abort(exc.code, str(exc))
        registry = tunnels_for(core)
        session = NodeSession(hello.node_id)
        registry.attach(session)
        reader = asyncio.create_task(_read_answers(answers, session, lambda: registry.detach(session)))
        log.info("tunnel.connected", node_id=hello.node_id, server=core.name)
        try:
            async for down in session.outgoing_async():
                yield down
        finally:
            reader.cancel()
            registry.detach(session)
            log.info("tunnel.closed", node_id=hello.node_id, server=core.name)

    @rpc("Nodes", "local")
    def MetaRead(
        self, request: api_pb2.NodeMetaReadRequest, context: grpc.ServicerContext
    ) -> api_pb2.NodeMetaResponse:
        _require_node(self.core, request.node_id)
        return _ask_node(self.core, context, request.node_id, "Nodes.MetaRead", request)  # type: ignore[no-any-return]

    @rpc("Nodes", "local")
    def MetaApply(
        self, request: api_pb2.NodeMetaApplyRequest, context: grpc.ServicerContext
    ) -> api_pb2.NodeMetaResponse:
        _require_node(self.core, request.node_id)
        validate_meta_apply(request)
        return _ask_node(self.core, context, request.node_id, "Nodes.MetaApply", request)  # type: ignore[no-any-return]


async def _read_answers(
    answers: AsyncIterator[api_pb2.ClientTunnelUp], session: NodeSession, on_end: Callable[[], None]
) -> None:
    """Route the client's answers until its half of the stream ends or breaks. An answer
    for a caller that reads slowly waits in a thread, never on the loop; the next one is
    read only after it, so the client is held back, not the server's memory grown."""
    try:
        async for up in answers:
            if up.request_id and not session.try_deliver(up):
                await asyncio.to_thread(session.deliver, up)
    except grpc.RpcError:
        pass  # the stream broke: the session ends below, and its callers with it
    except Exception:
        log.exception("tunnel.reader_crashed", node_id=session.node_id)
    finally:
        on_end()
