"""What an event is, the topic and type names (Nomad's), and the one error of the package."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

import grpc

from drover.scheduler.structs import Allocation, Deployment, Evaluation, Job, Node
from drover.server.errors import DroverError

__all__ = [
    "TOPICS",
    "TOPIC_ALLOCATION",
    "TOPIC_DEPLOYMENT",
    "TOPIC_EVALUATION",
    "TOPIC_JOB",
    "TOPIC_NODE",
    "Event",
    "EventsOutOfRangeError",
    "Payload",
]

TOPIC_JOB: Final = "Job"
TOPIC_ALLOCATION: Final = "Allocation"
TOPIC_NODE: Final = "Node"
TOPIC_EVALUATION: Final = "Evaluation"
TOPIC_DEPLOYMENT: Final = "Deployment"
TOPICS: Final = (TOPIC_JOB, TOPIC_ALLOCATION, TOPIC_NODE, TOPIC_EVALUATION, TOPIC_DEPLOYMENT)

Payload = Job | Allocation | Node | Evaluation | Deployment


@dataclass(frozen=True, slots=True)
class Event:
    """One object's change at one raft index.

    ``payload`` is the object after the change (before it, for a deletion): the state's own
    immutable value, shared, never copied. ``filter_keys`` are the other IDs a subscriber
    may filter this event by (an alloc's job and deployment), as Nomad's ``FilterKeys``.
    ``namespace`` is "" for nodes, which belong to no namespace.
    """

    index: int
    topic: str
    type: str
    key: str
    namespace: str
    payload: Payload
    filter_keys: tuple[str, ...] = ()


class EventsOutOfRangeError(DroverError):
    """The events asked for are no longer (or not yet, after a restore) in this server's
    buffer. ``oldest`` is the lowest index a stream may start from here now."""

    code = grpc.StatusCode.OUT_OF_RANGE

    def __init__(self, message: str, *, oldest: int) -> None:
        super().__init__(message)
        self.oldest = oldest
