"""Which events one stream wants, and which of them its ACL token may read.

A stream names topics, each with an optional key, and a namespace (Nomad's
``/v1/event/stream?topic=Job:web&namespace=prod``). A key matches an event's own key (the
object's ID) or one of its ``filter_keys``: ``Allocation:web`` is every alloc of job
``web``, as in Nomad. Node events belong to no namespace and pass every namespace filter.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Final

from drover.scheduler.structs import DEFAULT_NAMESPACE
from drover.server.acl.acl import ACL
from drover.server.acl.policy import POLICY_READ
from drover.server.errors import ValidationError
from drover.server.events._model import TOPIC_NODE, TOPICS, Event

__all__ = ["ALL", "Subscription", "readable", "subscription_from"]

# Every topic, every key or every namespace.
ALL: Final = "*"
_TOPIC_NAMES: Final = frozenset((*TOPICS, ALL))


@dataclass(frozen=True, slots=True)
class Subscription:
    """``topics``: topic (or ``ALL``) -> the keys wanted, None for every key; empty: every
    topic. ``namespace``: one namespace, or ``ALL``."""

    topics: Mapping[str, frozenset[str] | None]
    namespace: str

    def matches(self, event: Event) -> bool:
        if event.namespace and self.namespace != ALL and event.namespace != self.namespace:
            return False
        if not self.topics:
            return True
        for topic in (event.topic, ALL):
            if topic not in self.topics:
                continue
            keys = self.topics[topic]
            if keys is None or event.key in keys or any(k in keys for k in event.filter_keys):
                return True
        return False


def subscription_from(topics: Iterable[tuple[str, str]], namespace: str) -> Subscription:
    """The subscription of a request's ``(topic, key)`` filters; ValidationError names the
    bad field (``topics[1].topic``)."""
    wanted: dict[str, frozenset[str] | None] = {}
    for i, (topic, key) in enumerate(topics):
        if topic not in _TOPIC_NAMES:
            raise ValidationError(
                f"topics[{i}].topic: unknown topic {topic!r} (one of {', '.join(TOPICS)}, or {ALL})"
            )
        if topic in wanted and wanted[topic] is None:
            continue
        if not key or key == ALL:
            wanted[topic] = None
        else:
            wanted[topic] = (wanted.get(topic) or frozenset()) | {key}
    return Subscription(topics=wanted, namespace=namespace or DEFAULT_NAMESPACE)


def readable(acl: ACL, event: Event) -> bool:
    """What the rights table (server/acl/rights.py, ``Events.Stream``) lets a token read:
    node read for Node events, read-job on the event's namespace for the others."""
    if acl.management:
        return True
    if event.topic == TOPIC_NODE:
        return acl.allows_level("node", POLICY_READ)
    return acl.allows_namespace(event.namespace, ("read-job",))
