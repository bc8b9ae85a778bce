"""``drover event stream``: the cluster's event stream, one JSON object a line.

Each line is ``{"index", "topic", "type", "key", "namespace", "payload"}``, the payload
being the changed object as ``-json`` prints it. The stream runs until interrupted; when
its server goes away it resumes on another address of ``-address`` from the last index it
printed, with no event repeated or skipped (``Client.stream_events``).
"""

from __future__ import annotations

import argparse
import json
from typing import Final

from drover.cli._args import Subcommands, add_command, add_group, conn_flags, flag
from drover.cli._connect import connect
from drover.cli._errors import CLIError
from drover.cli._format import jsonable
from drover.v1 import api_pb2

__all__ = ["TOPICS", "event_line", "register"]

TOPICS: Final = ("Job", "Allocation", "Node", "Evaluation", "Deployment")
_ANY: Final = "*"

_EPILOG: Final = """\
Topics: Job, Allocation, Node, Evaluation, Deployment, or * for all; -topic Job:web keeps
the events of one object (or, for allocations, evaluations and deployments, of one job).
Repeat -topic for several. Without -topic: every topic.

Each line: {"index": N, "topic": ..., "type": ..., "key": ..., "namespace": ..., "payload": {...}}
-index N starts at raft index N (1: everything the server still holds); without it, from now.
An index older than the servers keep fails with the oldest index they can start from.
"""


def register(top: Subcommands) -> None:
    events = add_group(top, "event", "follow the cluster's event stream")
    p = add_command(
        events, "stream", _cmd_event_stream, "print events as they happen, one JSON object a line", _EPILOG
    )
    flag(
        p, "topic", action="append", default=[], metavar="TOPIC[:KEY]", help="a topic to follow (repeatable)"
    )
    flag(p, "index", type=int, default=0, metavar="N", help="start at this raft index (default: from now)")
    flag(p, "namespace", default="", metavar="NS", help='namespace (default "default"; "*" for all)')
    conn_flags(p)


def _check_topic(value: str) -> str:
    topic = value.partition(":")[0]
    if topic not in (*TOPICS, _ANY):
        raise CLIError(f"flag -topic: unknown topic {topic!r} (one of {', '.join(TOPICS)}, or {_ANY})")
    return value


def event_line(event: api_pb2.Event) -> str:
    """One event as the line ``drover event stream`` prints."""
    field = event.WhichOneof("payload")
    payload = jsonable(getattr(event, field)) if field else None
    return json.dumps(
        {
            "index": event.index,
            "topic": event.topic,
            "type": event.type,
            "key": event.key,
            "namespace": event.namespace,
            "payload": payload,
        },
        separators=(",", ":"),
    )


def _cmd_event_stream(args: argparse.Namespace) -> int:
    topics = [_check_topic(t) for t in args.topic]
    if args.index < 0:
        raise CLIError(f"flag -index: must be >= 0, got {args.index}")
    with connect(args) as client:
        for event in client.stream_events(topics, index=args.index, namespace=args.namespace):
            print(event_line(event), flush=True)
    return 0
