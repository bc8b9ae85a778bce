"""How a sync handler asks the event loop to wait for it, instead of waiting in its thread.

The API serves on grpc.aio (server/api/grpc_server.py); plain handlers stay sync and run
in a small thread pool (server/api/_aio.py). A blocking query must not hold one of those
threads for its wait, so when the bridge runs a handler it sets a ``Parking`` for it, and
the query, finding nothing new yet, raises ``ParkRequest`` with what it waits for. The
bridge then waits on the loop (server/api/_notify.py) while holding the caller's parking
place (server/api/_limits.py), and runs the handler again once ``ready`` holds or the
deadline passes; the second run answers at once. A handler run outside the bridge (no
``Parking``) waits in its thread as before.

A blocking read on a follower is forwarded the same way: ``ForwardRequest`` carries the
call, and the bridge makes it on an aio channel, so the follower holds no thread either.
A default read's leadership confirmation (server/raft/read_confirm.py: one round trip to
a majority) is awaited the same way: ``ConfirmRequest`` hands the round to the loop, which
runs the handler again once it is confirmed. Under load the reads waiting for their round
would otherwise fill the pool and queue every other call (heartbeats, writes) behind them.
Only reads take these exits: running a read twice is harmless.
"""

from __future__ import annotations

import contextvars
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from drover.server.state_store import Snapshot

__all__ = [
    "ConfirmRequest",
    "ForwardRequest",
    "ParkRequest",
    "Parking",
    "current_parking",
    "each_request_as",
    "node_caller",
    "parking_scope",
    "rpc_each",
    "rpc_inline",
]


@dataclass(slots=True)
class Parking:
    """One RPC's wait, kept across the runs of its handler: the deadline is fixed by the
    first run, so a handler woken by an unrelated change does not wait its full time again."""

    deadline: float | None = None
    runs: int = field(default=0)
    # Set once the loop has confirmed this server's leadership for the call (ConfirmRequest).
    confirmed: bool = False
    # What the query saw on its first run, for a readiness that is "changed since" (a
    # node's own alloc index: server/api/nodes.py): a later run must not see it afresh.
    baseline: int | None = None

    def deadline_after(self, timeout: float) -> float:
        if self.deadline is None:
            self.deadline = time.monotonic() + timeout
        return self.deadline


class ParkRequest(Exception):
    """Wait until ``ready(snapshot)`` (checked when one of ``tables`` changes) or
    ``deadline`` (monotonic), holding one parking place of ``caller``; then run again."""

    def __init__(
        self, tables: tuple[str, ...], ready: Callable[[Snapshot], bool], deadline: float, caller: str
    ) -> None:
        super().__init__("blocking query parked")
        self.tables = tables
        self.ready = ready
        self.deadline = deadline
        self.caller = caller


class ConfirmRequest(Exception):
    """Await ``confirm()`` (it raises when leadership is not confirmed), then run again."""

    def __init__(self, confirm: Callable[[], Awaitable[None]]) -> None:
        super().__init__("read waits for its leadership confirmation")
        self.confirm = confirm


class ForwardRequest(Exception):
    """Make this (blocking, read) call on ``address`` and answer with its answer."""

    def __init__(
        self,
        address: str,
        path: str,
        request: Any,
        response_cls: Any,
        timeout: float,
        metadata: tuple[tuple[str, str | bytes], ...],
    ) -> None:
        super().__init__(f"forward {path} to {address}")
        self.address = address
        self.path = path
        self.request = request
        self.response_cls = response_cls
        self.timeout = timeout
        self.metadata = metadata


_PARKING: contextvars.ContextVar[Parking | None] = contextvars.ContextVar("drover_parking", default=None)


def current_parking() -> Parking | None:
    """The Parking of the handler this thread runs for the bridge (None: wait in place)."""
    return _PARKING.get()


def parking_scope(parking: Parking) -> contextvars.Context:
    """A context whose handler runs see ``parking``."""
    context = contextvars.copy_context()
    context.run(_PARKING.set, parking)
    return context


def node_caller(node_id: str) -> str:
    """Who parks a node's alloc watch: the node (it proved its secret), not its host, so
    many nodes behind one address (NAT, a simulator, a test) are many callers."""
    return f"node {node_id}"


_RPC_KIND_ATTR = "drover_rpc_kind"
_RPC_INLINE_ATTR = "drover_rpc_inline"


def mark_rpc_kind(handler: Callable[..., Any], kind: str, *, inline: bool = False) -> None:
    """Say on a servicer method what ``rpc(service, kind)`` made it ("write", "read",
    "local"), for the bridge to choose where it runs by: ``inline`` on the loop itself
    (server/inline.py), otherwise in a pool (writes wait for a commit in theirs)."""
    setattr(handler, _RPC_KIND_ATTR, kind)
    setattr(handler, _RPC_INLINE_ATTR, inline)


_RPC_EACH_ATTR = "drover_rpc_each"


def each_request_as(unary_name: str) -> Callable[..., Iterator[Any]]:
    """A stream-stream servicer method that serves every request on it as one call of the
    servicer's unary method ``unary_name``, answered in order; the first error ends the
    stream with that call's status.

    A caller that would make the same call again and again (a heartbeat) keeps one stream
    open instead: grpc.aio's server accepts new calls one at a time, each a hand-off between
    its poller thread and the loop, and under load a fleet's calls waited there for seconds,
    where the messages of open streams are read together. The bridge (server/api/_aio.py)
    runs each request exactly as that unary call runs (limits, ACL or node secret, inline
    write, forwarding to the leader); the body here is what a sync grpc server runs."""

    def stream(self: Any, request_iterator: Iterator[Any], context: Any) -> Iterator[Any]:
        unary = getattr(self, unary_name)
        for request in request_iterator:
            yield unary(request, context)

    setattr(stream, _RPC_EACH_ATTR, unary_name)
    return stream


def rpc_each(handler: Callable[..., Any]) -> str:
    """The unary method ``each_request_as`` serves ``handler``'s requests as, or ""."""
    return str(getattr(handler, _RPC_EACH_ATTR, ""))


def rpc_inline(handler: Callable[..., Any]) -> bool:
    """Whether ``mark_rpc_kind`` said ``handler`` runs on the loop (server/inline.py)."""
    return bool(getattr(handler, _RPC_INLINE_ATTR, False))


def rpc_kind(handler: Callable[..., Any]) -> str:
    """The kind ``mark_rpc_kind`` gave ``handler`` (a bound method sees its function's), or ""."""
    return str(getattr(handler, _RPC_KIND_ATTR, ""))
