"""Following an evaluation after a write (``job run``, ``job stop``, ``job dispatch``,
``job periodic force``): print each allocation it creates as it appears, then how it ended.
"""

from __future__ import annotations

import argparse
import time
from typing import Final

from drover.cli._args import display_id
from drover.cli._errors import CLIError
from drover.sdk import DroverClient
from drover.v1 import structs_pb2

__all__ = ["monitor_eval"]

# While an eval is pending, one blocking query on the job's allocs waits at most this long
# before the eval is read again.
_MONITOR_WAIT_S: Final = 1.0
# How long to pause when the server answers a blocking query without blocking.
_MONITOR_POLL_S: Final = 0.2


def monitor_eval(client: DroverClient, args: argparse.Namespace, eval_id: str) -> int:
    """Follow an eval until it leaves "pending" or -monitor-timeout passes, printing each
    allocation it creates as it appears; then report queued allocations, a blocked eval and a
    follow-up eval. Returns the exit status; a failed eval raises :class:`CLIError`."""
    timeout_s: float = args.monitor_timeout
    deadline = time.monotonic() + timeout_s
    print(f'==> Monitoring evaluation "{display_id(eval_id, args)}"')
    ev = client.get_eval(eval_id).eval
    if ev.job_id:
        print(f'    Evaluation triggered by job "{ev.job_id}"')
    elif ev.node_id:
        print(f'    Evaluation triggered by node "{display_id(ev.node_id, args)}"')
    print(f'    Evaluation status "{ev.status}"')
    watcher = _AllocWatcher(client, ev, args)
    while ev.status == "pending":
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            watcher.poll(0)
            print(
                f'==> Evaluation "{display_id(eval_id, args)}" still "pending" after {timeout_s:g}s; stopped monitoring'
            )
            print(f'    Run "drover eval status {eval_id}" to check on it')
            return 0
        # Blocks until the job's allocs change (or a short wait passes), then re-reads the eval.
        watcher.poll(min(remaining, _MONITOR_WAIT_S))
        latest = client.get_eval(eval_id).eval
        if latest.status != ev.status:
            print(f'    Evaluation status changed: "{ev.status}" -> "{latest.status}"')
        ev = latest
    # The eval's allocs are committed before the eval is marked done: one last look.
    watcher.poll(0)
    return _report_eval_outcome(ev, args)


class _AllocWatcher:
    """Prints each allocation of one eval the first time it shows up in the job's allocs,
    read with blocking queries on the alloc table's index."""

    def __init__(self, client: DroverClient, ev: structs_pb2.Evaluation, args: argparse.Namespace) -> None:
        self.client = client
        self.ev = ev
        self.args = args
        self.index = 0
        self.seen: set[str] = set()

    def poll(self, wait_s: float) -> None:
        """Read the job's allocs, blocking up to ``wait_s`` for a change (0: do not block)."""
        start = time.monotonic()
        if not self.ev.job_id:
            time.sleep(min(max(wait_s, 0.0), _MONITOR_POLL_S))
            return
        blocking = wait_s > 0 and self.index > 0
        resp = self.client.list_allocs(
            job_id=self.ev.job_id,
            namespace=self.ev.namespace,
            min_index=self.index if blocking else 0,
            wait_ns=max(int(wait_s * 1e9), 1) if blocking else 0,
        )
        for alloc in sorted(resp.allocs, key=lambda a: (a.create_index, a.name, a.id)):
            if alloc.eval_id != self.ev.id or alloc.id in self.seen:
                continue
            self.seen.add(alloc.id)
            where = f'node "{display_id(alloc.node_id, self.args)}", group "{alloc.task_group}"'
            if alloc.create_index and alloc.create_index < self.ev.create_index:
                # Older than the eval: an existing alloc this eval updated in place.
                print(f'    Allocation "{display_id(alloc.id, self.args)}" modified: {where}')
            elif alloc.desired_status == "run":
                print(f'    Allocation "{display_id(alloc.id, self.args)}" created: {where}')
        if wait_s > 0 and resp.meta.index <= self.index:
            # The server answered without blocking (or the wait ran out): do not spin.
            time.sleep(max(min(_MONITOR_POLL_S, wait_s - (time.monotonic() - start)), 0.0))
        self.index = max(self.index, resp.meta.index)


def _report_eval_outcome(ev: structs_pb2.Evaluation, args: argparse.Namespace) -> int:
    queued = {g: n for g, n in ev.queued_allocations.items() if n > 0}
    incomplete = bool(queued or ev.failed_tg_allocs)
    suffix = " but failed to place all allocations:" if incomplete else ""
    print(f'==> Evaluation "{display_id(ev.id, args)}" finished with status "{ev.status}"{suffix}')
    for group in sorted(set(queued) | set(ev.failed_tg_allocs)):
        count = queued.get(group, 0)
        what = f": {count} allocation(s) queued, could not be placed now" if count else ""
        print(f'    Task Group "{group}"{what}')
        if reason := ev.failed_tg_allocs.get(group, ""):
            print(f"      * {reason}")
    if ev.status_description:
        print(f"    {ev.status_description}")
    if ev.blocked_eval:
        print(
            f'    Evaluation "{display_id(ev.blocked_eval, args)}" waiting for additional capacity'
            " to place the remainder"
        )
    elif ev.status == "blocked":
        print("    Evaluation is blocked: queued allocations are placed when capacity frees up")
    if ev.next_eval:
        print(f'    Follow-up evaluation "{display_id(ev.next_eval, args)}" created')
    if ev.status == "failed":
        detail = f": {ev.status_description}" if ev.status_description else ""
        raise CLIError(f'evaluation "{display_id(ev.id, args)}" failed{detail}')
    return 0
