"""Following a write: the evaluation it created (``job run``, ``job stop``, ``job
dispatch``, ``job periodic force``, ``job revert``, ``job scale``, the ``deployment``
writes), printing each allocation it creates as it appears and how it ended; then, for the
writes that start or move a rollout, the deployment, with its per-group table each time it
changes, until it ends.

Exit statuses, as Nomad's monitor (>= 1.2.4): 0 when the eval completed and the
deployment, if any, succeeded; 2 when placements failed (a successful deployment clears
it); 1 for a failed eval or a deployment that ended any other way than successful, even
one whose automatic rollback then succeeded. Every wait is a blocking query or bounded by a
deadline, never a bare sleep.
"""

from __future__ import annotations

import argparse
import time
from typing import Final

import grpc

from drover.cli._args import display_id
from drover.cli._deployments import deployment_kv, group_table, is_active
from drover.cli._errors import CLIError
from drover.cli._format import format_kv, format_table, oldest_allocs_first, print_json
from drover.scheduler.structs import DEPLOYMENT_STATUS_FAILED, DEPLOYMENT_STATUS_SUCCESSFUL
from drover.sdk import DroverClient, DroverError
from drover.v1 import structs_pb2

__all__ = ["EXIT_PLACEMENT_FAILED", "answer_then_monitor", "monitor_deployment", "monitor_eval"]

EXIT_PLACEMENT_FAILED: Final = 2
# While an eval is pending, one blocking query on the job's allocs waits at most this long
# before the eval is read again.
_MONITOR_WAIT_S: Final = 1.0
# How long to pause when the server answers a blocking query without blocking.
_MONITOR_POLL_S: Final = 0.2
# One blocking query on a deployment waits at most this long before it is asked again.
_DEPLOYMENT_WAIT_S: Final = 5.0
# What the deployment watcher appends when a failure rolls the job back (DEPLOY.md, 5).
_ROLLBACK_MARKER: Final = " - rolling back to job version "


def answer_then_monitor(
    client: DroverClient, args: argparse.Namespace, response: object, said: str, eval_id: str
) -> int:
    """The answer of a write that made one eval (alloc stop, job dispatch, periodic force):
    with -json the response alone; otherwise ``said`` with the eval's ID, and then the eval
    followed to its end unless -detach. One place, so each such command prints, detaches
    and exits the same way."""
    if args.json:
        print_json(response)
        return 0
    print(f"{said}, evaluation {display_id(eval_id, args)}")
    if args.detach:
        return 0
    return monitor_eval(client, args, eval_id)


def monitor_eval(
    client: DroverClient,
    args: argparse.Namespace,
    eval_id: str,
    *,
    follow_deployment: bool = False,
    job_version: int | None = None,
) -> int:
    """Follow an eval until it leaves "pending" or -monitor-timeout passes, printing each
    allocation it creates as it appears; then report queued allocations, a blocked eval and a
    follow-up eval. With ``follow_deployment``, then follow the deployment the eval names
    (or, with ``job_version``, the one the eval made for that version of its job) until it
    ends. Returns the exit status (module docstring); a failed eval, or a deployment that
    did not succeed, raises :class:`CLIError`."""
    ev = _follow_eval(client, args, eval_id)
    if ev is None:
        return 0
    placement_failed = _report_eval_outcome(ev, args)
    code = EXIT_PLACEMENT_FAILED if placement_failed else 0
    if not follow_deployment:
        return code
    deployment_id = ev.deployment_id or _deployment_made_by(client, ev, job_version)
    if not deployment_id:
        return code
    deployment = monitor_deployment(client, args, deployment_id)
    if deployment.status == DEPLOYMENT_STATUS_SUCCESSFUL:
        return 0
    raise CLIError(_deployment_failure(client, args, deployment))


def _follow_eval(
    client: DroverClient, args: argparse.Namespace, eval_id: str
) -> structs_pb2.Evaluation | None:
    """The eval once it left "pending"; None when -monitor-timeout passed first."""
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
            return None
        # Blocks until the job's allocs change (or a short wait passes), then re-reads the eval.
        watcher.poll(min(remaining, _MONITOR_WAIT_S))
        latest = client.get_eval(eval_id).eval
        if latest.status != ev.status:
            print(f'    Evaluation status changed: "{ev.status}" -> "{latest.status}"')
        ev = latest
    # The eval's allocs are committed before the eval is marked done: one last look.
    watcher.poll(0)
    if ev.deployment_id:
        print(f'    Evaluation within deployment: "{display_id(ev.deployment_id, args)}"')
    return ev


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
        for alloc in oldest_allocs_first(resp.allocs):
            if alloc.eval_id != self.ev.id or alloc.id in self.seen:
                continue
            self.seen.add(alloc.id)
            where = f'node "{display_id(alloc.node_id, self.args)}", group "{alloc.task_group}"'
            if alloc.create_index and alloc.create_index < self.ev.create_index:
                # Older than the eval: an existing alloc this eval updated in place.
                print(f'    Allocation "{display_id(alloc.id, self.args)}" modified: {where}')
            elif alloc.desired_status == "run":
                print(f'    Allocation "{display_id(alloc.id, self.args)}" created: {where}')
        _pause_if_unblocked(start, self.index, resp.meta.index, budget_s=wait_s)
        self.index = max(self.index, resp.meta.index)


def _pause_if_unblocked(
    started: float, asked_index: int, answered_index: int, *, budget_s: float = _MONITOR_POLL_S
) -> None:
    """After a blocking query that brought no newer index: if it came back at once (a
    server that did not block), wait out the rest of :data:`_MONITOR_POLL_S`, never more
    than ``budget_s``, so a follow loop cannot spin. A wait that ran its course has spent
    that time already and sleeps no more."""
    if answered_index <= asked_index:
        time.sleep(max(min(_MONITOR_POLL_S, budget_s) - (time.monotonic() - started), 0.0))


def _report_eval_outcome(ev: structs_pb2.Evaluation, args: argparse.Namespace) -> bool:
    """Print how the eval ended; whether some placements failed. A failed eval raises."""
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
    return incomplete


def _deployment_made_by(client: DroverClient, ev: structs_pb2.Evaluation, job_version: int | None) -> str:
    """The deployment of ``job_version`` created after ``ev`` (by its plan), for a server
    whose evals do not name their deployment; "" for none. A server without the
    Deployments service has none to follow."""
    if job_version is None or not ev.job_id:
        return ""
    try:
        listing = client.list_deployments(job_id=ev.job_id, namespace=ev.namespace).deployments
    except DroverError as exc:
        if exc.code == grpc.StatusCode.UNIMPLEMENTED:
            return ""
        raise
    made = [d for d in listing if d.job_version == job_version and d.create_index > ev.create_index]
    return max(made, key=lambda d: d.create_index).id if made else ""


def monitor_deployment(
    client: DroverClient, args: argparse.Namespace, deployment_id: str
) -> structs_pb2.Deployment:
    """Follow a deployment with blocking queries until it is no longer active, printing its
    status and per-group table each time they change; the deployment as it ended. Nomad's
    monitor follows a deployment for as long as it runs, and so does this: its progress
    deadline ends a stuck one (Ctrl-C stops watching, exit 130)."""
    print(f'==> Monitoring deployment "{display_id(deployment_id, args)}"')
    index = 0
    shown = ""
    while True:
        start = time.monotonic()
        resp = client.get_deployment(
            deployment_id, min_index=index, wait_ns=int(_DEPLOYMENT_WAIT_S * 1e9) if index else 0
        )
        deployment = resp.deployment
        text = _progress(deployment)
        if text != shown:
            # A blank line between updates: each is a whole status and table.
            print(f"\n{text}" if shown else text)
            shown = text
        if not is_active(deployment):
            detail = f": {deployment.status_description}" if deployment.status_description else ""
            print(f'==> Deployment "{display_id(deployment.id, args)}" {deployment.status}{detail}')
            return deployment
        _pause_if_unblocked(start, index, resp.meta.index)
        index = max(index, resp.meta.index)


def _progress(deployment: structs_pb2.Deployment) -> str:
    """The status lines and the per-group table, indented under the monitor's header."""
    text = format_kv(deployment_kv(deployment, verbose=False)[3:])
    headers, rows = group_table(deployment)
    if rows:
        text += "\n\n" + format_table(headers, rows)
    return "\n".join(f"    {line}".rstrip() for line in text.splitlines())


def _deployment_failure(
    client: DroverClient, args: argparse.Namespace, deployment: structs_pb2.Deployment
) -> str:
    """The one-line reason a deployment did not succeed. After a failure that rolled the job
    back, the rollback's own deployment is followed first (Nomad does the same), and how it
    ended is part of the line: the exit status stays 1 either way."""
    what = f'deployment "{display_id(deployment.id, args)}" {deployment.status}'
    if deployment.status_description:
        what += f": {deployment.status_description}"
    if deployment.status != DEPLOYMENT_STATUS_FAILED or _ROLLBACK_MARKER not in deployment.status_description:
        return what
    version = deployment.status_description.rsplit(_ROLLBACK_MARKER, 1)[1]
    rollback = _rollback_deployment(client, args, deployment)
    if rollback is None:
        print(f"==> Job rolled back to version {version}; it made no deployment")
        return what
    print(f'==> Job rolled back to version {version}: following deployment "{display_id(rollback, args)}"')
    ended = monitor_deployment(client, args, rollback)
    return f'{what}; the rollback\'s deployment "{display_id(ended.id, args)}" {ended.status}'


def _rollback_deployment(
    client: DroverClient, args: argparse.Namespace, failed: structs_pb2.Deployment
) -> str | None:
    """The deployment the scheduler makes for the rolled-back version: the job's first one
    of a newer version, waited for with blocking queries until -monitor-timeout."""
    deadline = time.monotonic() + float(args.monitor_timeout)
    index = 0
    while True:
        start = time.monotonic()
        remaining = deadline - start
        resp = client.list_deployments(
            job_id=failed.job_id,
            namespace=failed.namespace,
            min_index=index,
            wait_ns=max(int(min(remaining, _DEPLOYMENT_WAIT_S) * 1e9), 1) if index else 0,
        )
        # The rollback is a newer job version; the failed record's own indexes may have moved
        # on since (its counters keep counting), so they cannot date it.
        newer = [d for d in resp.deployments if d.job_version > failed.job_version and d.id != failed.id]
        if newer:
            return min(newer, key=lambda d: d.create_index).id
        if time.monotonic() >= deadline:
            return None
        _pause_if_unblocked(start, index, resp.meta.index, budget_s=remaining)
        index = max(index, resp.meta.index)
