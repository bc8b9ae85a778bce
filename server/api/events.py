"""Events service: the stream of what each raft entry changed, from this server's buffer.

Never forwarded: every server derives the same events from the same log
(server/events/), so any server answers from its own buffer, a follower as well as the
leader, and a stream resumed on another server after a failure neither skips nor repeats.

A stream is a loop over the buffer: whole batches (every event of one index) go out in
one response, filtered by the request's topics, keys and namespace and, with ACLs on, by
what the token may read (``readable``: read-job on the event's namespace, node read for
Node events). The token is resolved again whenever the ACL tables change, so a deleted
token ends its streams (PERMISSION_DENIED) and a changed policy applies to the next event.
A response's ``index`` is the stream's position: every event up to it that the stream
wants has been sent, so a resume from ``index + 1`` is exact. When nothing is sent for
``HEARTBEAT_S`` an empty response (a heartbeat) says the stream is alive; the first message
is one too, sent as the stream opens.

A stream is a coroutine on the API loop (server/api/_aio.py): an open one holds no thread,
only one of its caller's parking places (server/api/_limits.py) for as long as it is open,
like ``Nodes.WatchClientAllocs``, and a published index wakes it
(``EventBuffer.read_async``). A caller that goes away cancels it.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Final

import grpc

from drover.scheduler.structs import Allocation, Deployment, Evaluation, Job, Node
from drover.server.acl.acl import ACL, MANAGEMENT
from drover.server.acl.resolve import resolve
from drover.server.api._base import call_token, rpc
from drover.server.api._limits import caller_limits
from drover.server.codec import to_proto
from drover.server.events import Batch, Event, Payload, Subscription, readable, subscription_from
from drover.v1 import api_pb2, api_pb2_grpc

if TYPE_CHECKING:
    from drover.server.core import ServerCore

__all__ = ["HEARTBEAT_S", "EventsServicer", "WireCache", "event_to_proto"]

S = "Events"
HEARTBEAT_S: Final = 10.0
# Events in one response, unless one index alone has more (an index is never split).
MAX_EVENTS_PER_RESPONSE: Final = 1024
_ACL_TABLES: Final = ("acl_tokens", "acl_policies")

# The Event.payload field each kind of object goes in.
_PAYLOAD_FIELD: Final[dict[type, str]] = {
    Job: "job",
    Allocation: "alloc",
    Node: "node",
    Evaluation: "eval",
    Deployment: "deployment",
}


def event_to_proto(event: Event, msg: api_pb2.Event) -> api_pb2.Event:
    """``event`` on the wire; a node's secret (and its hash) never leaves the server."""
    msg.index = event.index
    msg.topic = event.topic
    msg.type = event.type
    msg.key = event.key
    msg.namespace = event.namespace
    payload: Payload = event.payload
    field = _PAYLOAD_FIELD[type(payload)]
    to_proto(payload, getattr(msg, field))
    if field == "node":
        msg.node.ClearField("secret_id")
        msg.node.ClearField("secret_hash")
    return msg


class WireCache:
    """Each event's wire form, made once for all the streams that send it: converting an
    object costs a stream about six times what copying the made message does. Keyed by
    the event's identity; an entry holds its event, so the id is not reused while cached.
    Bounded (oldest out first); a race makes one conversion twice, never a wrong one."""

    def __init__(self, size: int) -> None:
        self._size = size
        self._lock = threading.Lock()
        self._items: dict[int, tuple[Event, api_pb2.Event]] = {}

    def wire(self, event: Event) -> api_pb2.Event:
        key = id(event)
        with self._lock:
            hit = self._items.get(key)
        if hit is not None and hit[0] is event:
            return hit[1]
        msg = event_to_proto(event, api_pb2.Event())
        with self._lock:
            self._items[key] = (event, msg)
            while len(self._items) > self._size:
                del self._items[next(iter(self._items))]
        return msg


class EventsServicer(api_pb2_grpc.EventsServicer):
    # How long a stream may stay silent before a heartbeat (tests shorten it).
    heartbeat_s: float = HEARTBEAT_S

    def __init__(self, core: ServerCore) -> None:
        self.core = core
        self._wire = WireCache(core.events.max_events)

    @rpc(S, "local")
    async def Stream(
        self, request: api_pb2.EventStreamRequest, context: grpc.ServicerContext
    ) -> AsyncIterator[api_pb2.EventStreamResponse]:
        """``context`` is the call's SyncContext, made on the loop by the rpc wrapper."""
        core = self.core
        # Checked before the first message, so a bad filter or a forgotten index is the
        # call's status (INVALID_ARGUMENT, OUT_OF_RANGE), raised through the rpc wrapper.
        subscription = subscription_from(((t.topic, t.key) for t in request.topics), request.namespace)
        start = core.events.start_index(request.index)
        limits = caller_limits(core)
        who = limits.caller(core, context)
        limits.acquire(who)
        try:
            acl, acl_index = self._acl(context)
            # An empty first message: the stream is open, and its position (the index
            # before the first it may send) is known to the caller before any event.
            yield api_pb2.EventStreamResponse(index=start - 1)
            loop = asyncio.get_running_loop()
            next_index = start
            last_sent = loop.time()
            while not core.store.closed and not core.events.closed:
                wait = max(0.0, last_sent + self.heartbeat_s - loop.time())
                batches, covered = await core.events.read_async(
                    next_index, wait, max_events=MAX_EVENTS_PER_RESPONSE
                )
                if core.cfg.acl_enabled and core.store.snapshot().table_index(*_ACL_TABLES) != acl_index:
                    acl, acl_index = self._acl(context)
                next_index = covered + 1
                response = _response(batches, covered, subscription, acl, self._wire)
                if response.events or loop.time() - last_sent >= self.heartbeat_s:
                    yield response
                    last_sent = loop.time()
        finally:
            limits.release(who)

    def _acl(self, context: grpc.ServicerContext) -> tuple[ACL, int]:
        """The token's ACL now, and the index of the ACL tables it was read at."""
        if not self.core.cfg.acl_enabled:
            return MANAGEMENT, 0
        snap = self.core.store.snapshot()
        return resolve(snap, call_token(context)).acl, snap.table_index(*_ACL_TABLES)


def _response(
    batches: list[Batch], covered: int, subscription: Subscription, acl: ACL, cache: WireCache
) -> api_pb2.EventStreamResponse:
    response = api_pb2.EventStreamResponse(index=covered)
    for _index, events in batches:
        for event in events:
            if subscription.matches(event) and readable(acl, event):
                response.events.append(cache.wire(event))
    return response
