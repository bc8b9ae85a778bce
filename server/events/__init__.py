"""The event stream: what each raft entry changed, as events, on every server.

Map of the package:

- ``_model``: ``Event`` (index, topic, type, key, namespace, the object), the topic names
  (Job, Allocation, Node, Evaluation, Deployment) and ``EventsOutOfRangeError``
  (``OUT_OF_RANGE``: the index asked for is no longer held here).
- ``derive``: the pure rule from one applied entry (its type, the keys its transaction
  wrote, the state before and after) to its events, with the entry type -> event type
  table in Nomad's vocabulary (``JobRegistered``, ``PlanResult``, ``NodeDrain``...).
- ``buffer``: ``EventBuffer``, the bounded ring of recent batches (one per raft index) that
  the FSM feeds (server/fsm.py calls ``entry_applied`` after each committed entry and
  ``state_replaced`` when a snapshot replaces the state) and streams wait on.
- ``filter``: ``Subscription`` (topics, keys, namespace of one stream) and ``readable``,
  the per-event ACL check.

The servicer is server/api/events.py; it answers from its own server's buffer and is never
forwarded: the log, hence the events, are the same on every server. Why that holds, the
resume contract and the buffer's bounds are in derive.py and buffer.py; docs/events.md is
the user's view.
"""

from __future__ import annotations

from drover.server.events._model import (
    TOPICS,
    Event,
    EventsOutOfRangeError,
    Payload,
)
from drover.server.events.buffer import DEFAULT_MAX_EVENTS, Batch, EventBuffer
from drover.server.events.derive import ENTRY_EVENT_TYPES, EVENTLESS_ENTRIES, derive_events
from drover.server.events.filter import ALL, Subscription, readable, subscription_from

__all__ = [
    "ALL",
    "DEFAULT_MAX_EVENTS",
    "ENTRY_EVENT_TYPES",
    "EVENTLESS_ENTRIES",
    "TOPICS",
    "Batch",
    "Event",
    "EventBuffer",
    "EventsOutOfRangeError",
    "Payload",
    "Subscription",
    "derive_events",
    "readable",
    "subscription_from",
]
