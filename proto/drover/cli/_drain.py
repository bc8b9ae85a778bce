"""Following a node drain (``drover node drain -enable`` without ``-detach``).

The leader ends a drain once nothing it must move is live on the node
(server/drainer.py); this follower prints the allocations still to move whenever that set
changes (rewritten in place on a terminal, one line per change otherwise), then waits for
the moved allocations' processes to stop on the client, as Nomad's drain monitor does.
It reads with blocking queries on the node's allocs, so a quiet drain costs one request a
second. Ctrl-C stops following; the drain itself goes on.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Final

from drover.cli._args import display_id
from drover.scheduler.structs import Allocation, Node
from drover.sdk import DroverClient, DroverError
from drover.server.codec import from_proto
from drover.server.drainer import drain_remaining

__all__ = ["follow_drain"]

_WAIT_NS: Final = 1_000_000_000
_POLL_S: Final = 0.2
_DRAIN_COMPLETE: Final = "Node drain complete"


class _Line:
    """One status line: rewritten in place on a terminal, printed when it changes otherwise."""

    def __init__(self) -> None:
        self.tty = sys.stdout.isatty()
        self.last = ""

    def show(self, text: str) -> None:
        if text == self.last:
            return
        if self.tty:
            sys.stdout.write("\r\033[K" + text)
            sys.stdout.flush()
        else:
            print(text, flush=True)
        self.last = text

    def done(self, text: str) -> None:
        if self.tty and self.last:
            sys.stdout.write("\r\033[K")
        print(text, flush=True)
        self.last = ""


def _stamp(text: str) -> str:
    return f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}: {text}"


def _names(allocs: list[Allocation], limit: int = 5) -> str:
    shown = ", ".join(f"{a.name} ({a.client_status})" for a in allocs[:limit])
    more = len(allocs) - limit
    return shown + (f" and {more} more" if more > 0 else "")


class _JobTypes(dict[tuple[str, str], str]):
    """Job types by (namespace, id), fetched once each; a purged job has none."""

    def __init__(self, client: DroverClient) -> None:
        super().__init__()
        self.client = client

    def fill(self, allocs: list[Allocation]) -> None:
        for a in allocs:
            key = (a.namespace, a.job_id)
            if key in self:
                continue
            try:
                self[key] = self.client.get_job(a.job_id, namespace=a.namespace).job.type
            except DroverError:
                self[key] = ""


def follow_drain(client: DroverClient, args: argparse.Namespace, node_id: str) -> int:
    """Follow ``node_id``'s drain to its end; the exit status (1 if it was disabled first)."""
    shown_id = display_id(node_id, args)
    print(_stamp(f'Ctrl-C stops following; the drain of node "{shown_id}" goes on'))
    types = _JobTypes(client)
    line = _Line()
    index = 0
    try:
        while True:
            node = client.get_node(node_id).node
            resp = client.list_allocs(node_id=node_id, min_index=index, wait_ns=_WAIT_NS if index else 0)
            allocs = [from_proto(a, Allocation) for a in resp.allocs]
            if not node.HasField("drain_strategy"):
                events = sorted(node.events, key=lambda e: (e.timestamp_ns, e.create_index))
                if not events or events[-1].message != _DRAIN_COMPLETE:
                    line.done(_stamp(f'Drain of node "{shown_id}" was disabled before it completed'))
                    return 1
                line.done(_stamp(f'Node "{shown_id}" drain complete: every allocation has moved'))
                return _wait_stopped(client, args, node_id, line)
            if node.drain_strategy.ignore_system_jobs:
                types.fill(allocs)  # only that rule needs job types: one lookup per job, once
            remaining = drain_remaining(from_proto(node, Node), allocs, types)
            line.show(_stamp(f"{len(remaining)} allocation(s) to move: {_names(remaining)}"))
            if resp.meta.index <= index:
                time.sleep(_POLL_S)  # answered without blocking: do not spin
            index = max(index, resp.meta.index)
    except KeyboardInterrupt:
        line.done(_stamp(f'Stopped following; the drain of node "{shown_id}" goes on'))
        return 130


def _wait_stopped(client: DroverClient, args: argparse.Namespace, node_id: str, line: _Line) -> int:
    """Until every alloc told to leave the node has stopped running there."""
    index = 0
    while True:
        resp = client.list_allocs(node_id=node_id, min_index=index, wait_ns=_WAIT_NS if index else 0)
        stopping = [
            a for a in resp.allocs if a.desired_status != "run" and a.client_status in ("pending", "running")
        ]
        if not stopping:
            line.done(
                _stamp(f'All allocations told to leave node "{display_id(node_id, args)}" have stopped')
            )
            return 0
        line.show(_stamp(f"{len(stopping)} allocation(s) stopping"))
        if resp.meta.index <= index:
            time.sleep(_POLL_S)
        index = max(index, resp.meta.index)
