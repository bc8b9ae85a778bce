"""What every servicer shares: error mapping, leader forwarding, and query plumbing.

Writes run on the leader: a follower forwards the call, unchanged, to the leader's gRPC
address (at most one hop: a forwarded call that lands on a non-leader is UNAVAILABLE, and
the SDK retries). Reads run on the leader too, unless the caller set ``stale``, in which
case any server answers from its own state; a default read is answered only once a
majority has confirmed the leader since it arrived (``ServerCore.confirm_leadership``), so
a deposed leader that does not know it yet answers UNAVAILABLE, not a stale state. A
blocking query is confirmed when it starts, not again when its wait ends.

ACLs (server/acl/, on with ``-acl-enabled``): the server that runs a method authorizes it,
against its own state, just before running it; a forwarded call carries the caller's
token (metadata ``x-drover-token``) and the leader authorizes it there. What each RPC needs
is server/acl/rights.py's table, looked up when the method is decorated, so a method
without an entry fails at import, not open at run time.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import time
from collections.abc import AsyncIterator, Callable, Iterable
from typing import TYPE_CHECKING, Any, Final, TypeVar, cast

import grpc
import structlog
from google.protobuf.message import Message

from drover.common.secrets import TOKEN_METADATA_KEY
from drover.scheduler import validate
from drover.server.acl import rights
from drover.server.acl.resolve import acting_as, resolve
from drover.server.api._aio import Aborted, SyncContext
from drover.server.api._limits import (
    CALLER_CHECK_S,
    CALLER_METADATA_KEY,
    FORWARDED_KEY,
    caller_limits,
    caller_waiting,
    current_caller,
    is_blocking,
)
from drover.server.api._park import (
    ConfirmRequest,
    ForwardRequest,
    ParkRequest,
    current_parking,
    mark_rpc_kind,
)
from drover.server.errors import DroverError, NoLeaderError, NotFoundError, ValidationError
from drover.server.inline import in_inline
from drover.server.state_store import Snapshot
from drover.v1 import api_pb2

if TYPE_CHECKING:
    from drover.server.core import ServerCore

log = structlog.get_logger("drover.api")

DEFAULT_WAIT_S: Final = 300.0
MAX_WAIT_S: Final = 600.0
LEADER_READY_WAIT_S: Final = 3.0
FORWARD_TIMEOUT_S: Final = MAX_WAIT_S + 30.0

F = TypeVar("F", bound=Callable[..., Any])
T = TypeVar("T")


def _abort(context: grpc.ServicerContext, code: grpc.StatusCode, message: str) -> None:
    context.abort(code, message)


def _response_class(service: str, method: str) -> type[Message]:
    desc = api_pb2.DESCRIPTOR.services_by_name[service].methods_by_name[method]
    return getattr(api_pb2, desc.output_type.name)  # type: ignore[no-any-return]


def _is_forwarded(context: grpc.ServicerContext) -> bool:
    return any(key == FORWARDED_KEY for key, _ in context.invocation_metadata() or ())


def call_token(context: grpc.ServicerContext) -> str:
    """The ACL token secret the caller sent ("" for none)."""
    for key, value in context.invocation_metadata() or ():
        if key == TOKEN_METADATA_KEY:
            return value if isinstance(value, str) else ""
    return ""


def _authorized(
    core: ServerCore,
    rpc_name: str,
    need: rights.Need,
    request: Message,
    context: grpc.ServicerContext,
    call: Callable[[], Any],
) -> Any:
    """Run ``call`` if the caller's token allows ``rpc_name``; filter what it returns."""
    if not core.cfg.acl_enabled:
        return call()
    identity = resolve(core.store.snapshot(), call_token(context))
    rights.check_request(rpc_name, need, identity.acl, request, anonymous=identity.anonymous)
    with acting_as(identity):
        response = call()
    return rights.check_response(rpc_name, need, identity.acl, response)


def _forward(
    core: ServerCore, service: str, method: str, request: Message, context: grpc.ServicerContext
) -> Any:
    if _is_forwarded(context):
        raise NoLeaderError("forwarded to a server that is no longer the leader")
    address = core.leader_grpc_address()
    if address is None:
        raise NoLeaderError("no cluster leader yet")
    response_cls = _response_class(service, method)
    call: grpc.UnaryUnaryMultiCallable[Message, Any] = core.channel_to(address).unary_unary(
        f"/drover.v1.{service}/{method}",
        request_serializer=lambda m: m.SerializeToString(),
        response_deserializer=response_cls.FromString,
    )
    # Without a client deadline grpc reports an enormous remaining time, which grpc then
    # refuses as a deadline: cap it (blocking reads carry their own wait).
    remaining = context.time_remaining()
    timeout = FORWARD_TIMEOUT_S if remaining is None else max(0.1, min(remaining - 0.05, FORWARD_TIMEOUT_S))
    # The caller's token goes with the call: the leader authorizes it (Nomad forwards the
    # auth token the same way), so a follower never decides for the leader.
    token = call_token(context)
    metadata: tuple[tuple[str, str | bytes], ...] = (
        (FORWARDED_KEY, core.name),
        (CALLER_METADATA_KEY, current_caller()),
    )
    if token:
        metadata += ((TOKEN_METADATA_KEY, token),)
    if in_inline() or (is_blocking(request) and current_parking() is not None):
        # A blocking read may wait minutes at the leader, and a write run on the loop
        # (server/inline.py) must not wait in place: the aio bridge makes the call on the
        # loop, so this server holds no thread for it (server/api/_park.py).
        path = f"/drover.v1.{service}/{method}"
        raise ForwardRequest(address, path, request, response_cls, timeout, metadata)
    try:
        return call(request, timeout=timeout, metadata=metadata)
    except grpc.RpcError as exc:
        _abort(context, exc.code(), exc.details() or "forwarded call failed")


def _wait_leader_ready(core: ServerCore) -> None:
    deadline = time.monotonic() + LEADER_READY_WAIT_S
    while not core.raft.leader_ready():
        if not core.raft.is_leader() or time.monotonic() > deadline:
            raise NoLeaderError("leader is still catching up")
        time.sleep(0.005)


# What a handler raises to end its call with a status of its own choosing (status_of).
OWN_ERRORS: Final = (validate.ValidationError, DroverError)


def status_of(exc: validate.ValidationError | DroverError) -> tuple[grpc.StatusCode, str]:
    """The status a call ends with when its handler raises one of OWN_ERRORS: the job
    validator's error is INVALID_ARGUMENT naming its fields; a DroverError carries its code."""
    if isinstance(exc, validate.ValidationError):
        return grpc.StatusCode.INVALID_ARGUMENT, str(exc)
    return exc.code, str(exc)


def _map_errors(context: grpc.ServicerContext, fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except OWN_ERRORS as exc:
        _abort(context, *status_of(exc))


def rpc(service: str, kind: str, *, inline: bool = True) -> Callable[[F], F]:
    """Wrap a servicer method: ``kind`` is "write", "read" (honours ``stale``) or "local".

    A write runs on the API loop (server/inline.py) unless ``inline`` is False: a write
    handler that can wait in any way but ``RaftNode.propose`` and forwarding must say so,
    or it stalls every call while it waits."""

    def deco(method: F) -> F:
        name = method.__name__
        rpc_name = f"{service}.{name}"
        need = rights.need_for(service, name)
        if inspect.isasyncgenfunction(method):
            return _async_stream(method, rpc_name, need, kind)  # type: ignore[return-value]

        @functools.wraps(method)
        def wrapper(self: Any, request: Any, context: grpc.ServicerContext) -> Any:
            core: ServerCore = self.core

            def here() -> Any:
                return _authorized(
                    core, rpc_name, need, request, context, lambda: method(self, request, context)
                )

            def run() -> Any:
                if kind == "local":
                    return here()
                stale = (
                    kind == "read"
                    and "options" in request.DESCRIPTOR.fields_by_name
                    and request.HasField("options")
                    and request.options.stale
                )
                if stale:
                    return here()
                if not core.raft.is_leader():
                    return _forward(core, service, name, request, context)
                if kind == "read":
                    _wait_leader_ready(core)
                    # Once per call: a blocking query woken from its wait runs again, and
                    # what it then reads is newer than the state confirmed when it began.
                    # Under the aio bridge the round is awaited on the loop, not in this
                    # thread (server/api/_park.py).
                    parking = current_parking()
                    if parking is None:
                        core.confirm_leadership()
                    elif not parking.confirmed:
                        raise ConfirmRequest(core.confirm_leadership_async)
                return here()

            # Rate and parking limits per caller come first (server/api/_limits.py).
            return _map_errors(
                context, lambda: caller_limits(core).admit(core, rpc_name, request, context, run)
            )

        mark_rpc_kind(wrapper, kind, inline=kind == "write" and inline)
        return wrapper  # type: ignore[return-value]

    return deco


def _async_stream(
    method: Callable[..., AsyncIterator[Any]], rpc_name: str, need: rights.Need, kind: str
) -> Callable[..., AsyncIterator[Any]]:
    """``rpc`` for a stream written as an async generator, which runs on the API loop and
    holds no thread while it waits (server/api/_aio.py): the caller's rate limit and the
    ACL check run first, as for any call; then a ``DroverError`` the stream raises ends the
    call with its status. Served by the server called, never forwarded. The generator gets
    the call's ``SyncContext`` (what it reads of the call was read on the loop), the one
    the limits and the ACL check saw, not grpc.aio's context."""
    if kind != "local":
        raise TypeError(f"{rpc_name}: an async stream is served locally, not as a {kind!r} call")
    if need.results:
        raise TypeError(f"{rpc_name}: an async stream filters what it sends itself (no results to check)")

    @functools.wraps(method)
    async def wrapper(
        self: Any, request: Any, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[Any]:
        core: ServerCore = self.core
        sync = cast(grpc.ServicerContext, SyncContext(context, asyncio.get_running_loop()))
        try:
            stream = _map_errors(
                sync,
                lambda: caller_limits(core).admit(
                    core,
                    rpc_name,
                    request,
                    sync,
                    lambda: _authorized(
                        core, rpc_name, need, request, sync, lambda: method(self, request, sync)
                    ),
                ),
            )
        except Aborted as aborted:
            await context.abort(aborted.code, aborted.details)
        try:
            async for response in stream:
                yield response
        except OWN_ERRORS as exc:
            await context.abort(*status_of(exc))

    mark_rpc_kind(wrapper, kind)
    return wrapper


def query(
    core: ServerCore, options: api_pb2.QueryOptions, tables: Iterable[str]
) -> tuple[Snapshot, api_pb2.QueryMeta]:
    """Run a (possibly blocking) query: wait until ``tables`` pass ``options.min_index``."""
    names = tuple(tables)
    if options.min_index:
        wait = options.wait_ns / 1e9 if options.wait_ns > 0 else DEFAULT_WAIT_S
        snap = wait_while_caller_waits(core, names, options.min_index, min(wait, MAX_WAIT_S))
    else:
        snap = core.store.snapshot()
    return snap, meta_for(core, snap.table_index(*names))


def wait_while_caller_waits(
    core: ServerCore, names: tuple[str, ...], min_index: int, timeout: float
) -> Snapshot:
    """``store.wait_for``, in slices: a caller that went away frees its parked thread (and
    its place under the parking limit, server/api/_limits.py) within a slice. Under the aio
    bridge it parks on the loop instead (``ParkRequest``, server/api/_park.py)."""
    parking = current_parking()
    if parking is not None:
        snap = core.store.snapshot()
        until = parking.deadline_after(timeout)
        if snap.table_index(*names) > min_index or core.store.closed or time.monotonic() >= until:
            return snap
        raise ParkRequest(names, lambda s: s.table_index(*names) > min_index, until, current_caller())
    deadline = time.monotonic() + timeout
    while True:
        remaining = deadline - time.monotonic()
        snap = core.store.wait_for(names, min_index, max(0.0, min(remaining, CALLER_CHECK_S)))
        if (
            snap.table_index(*names) > min_index
            or remaining <= CALLER_CHECK_S
            or core.store.closed
            or not caller_waiting()
        ):
            return snap


def get_by_id(
    core: ServerCore,
    options: api_pb2.QueryOptions,
    table: str,
    kind: str,
    object_id: str,
    find: Callable[[Snapshot, str], T | None],
) -> tuple[T, api_pb2.QueryMeta]:
    """The one object a Get RPC asks for, read as ``query`` reads.

    Every Get answers the same two mistakes the same way: an empty ID is
    ``<kind>_id: required`` (INVALID_ARGUMENT), an unknown one ``<kind> '<id>' not found``
    (NOT_FOUND).
    """
    if not object_id:
        raise ValidationError(f"{kind}_id: required")
    snap, meta = query(core, options, (table,))
    found = find(snap, object_id)
    if found is None:
        raise NotFoundError(f"{kind} {object_id!r} not found")
    return found, meta


def meta_for(core: ServerCore, index: int) -> api_pb2.QueryMeta:
    return api_pb2.QueryMeta(
        index=index, known_leader=core.raft.leader_address() is not None, served_by=core.name
    )


def write_meta(index: int) -> api_pb2.WriteMeta:
    return api_pb2.WriteMeta(index=index)
