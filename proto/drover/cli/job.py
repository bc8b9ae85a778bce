"""``drover job``: register (``run``), dry-run (``plan``), inspect, stop and dispatch jobs,
and force a periodic job's launch. The commands over versions and rollouts (``history``,
``revert``, ``scale``, ``inspect``, ``validate``, ``deployments``) live in
:mod:`drover.cli._job_lifecycle` and are registered here with the rest."""

from __future__ import annotations

import argparse
import sys
import time
from typing import Final

import grpc

from drover.cli import _job_lifecycle
from drover.cli._args import (
    Subcommands,
    add_command,
    add_group,
    conn_flags,
    flag,
    is_verbose,
    parse_meta,
    read_flags,
    write_flags,
)
from drover.cli._connect import connect
from drover.cli._format import (
    fmt_duration,
    fmt_time,
    plan_header,
    plan_table,
    print_allocs_table,
    print_json,
    print_kv,
    print_table,
)
from drover.cli._jobs import get_job as _get_job
from drover.cli._jobs import job_file_flags
from drover.cli._jobs import load_job_file as _load_job_file
from drover.cli._monitor import answer_then_monitor, monitor_eval
from drover.cli._placement import failed_group_lines
from drover.cli._reschedule import awaiting_rows
from drover.sdk import DroverClient, DroverError
from drover.v1 import api_pb2, structs_pb2

__all__ = ["register"]

_JOB_RUN_EPILOG: Final = """\
Unless -detach (or -json) is given, the registration's evaluation is monitored: each
allocation it creates is printed as it appears, until the evaluation completes, fails or
blocks, or -monitor-timeout passes. Then the deployment the new version starts, if any,
is followed until it ends: its status and per-group table (Desired, Placed, Healthy,
Unhealthy, Progress Deadline) each time they change. A failed deployment that rolled the
job back is said so, and the rollback's deployment is followed too.

Periodic and parameterized jobs get no evaluation at registration: there is nothing to
monitor.

Exit status:
  0  registered; the evaluation completed and the deployment, if any, succeeded (or the
     evaluation is still pending after -monitor-timeout)
  1  an error, a failed evaluation, or a deployment that did not end successful (also
     when its automatic rollback then succeeded)
  2  some allocations could not be placed (queued until capacity frees up; the blocked
     evaluation's ID is printed), unless a deployment then succeeded; or a usage error
"""

_PLAN_EPILOG: Final = """\
The server runs the scheduler against a private copy of the cluster state and reports,
per task group, how many allocations it would place, update (destructively or in
place), stop, migrate, mark lost or leave alone, and how many could not be placed now
(they would be queued). Nothing is registered or changed.

Exit status:
  0  nothing would change: no allocation would be created, destroyed or updated
  1  allocations would be created, destroyed or updated; or an error (bad job file,
     invalid job, server error: then with one "Error:" line on stderr)
  2  usage error
"""


_DISPATCH_EPILOG: Final = """\
The parameterized job's payload setting decides whether a payload file is required,
optional or forbidden; -meta keys must be among its meta_required and meta_optional keys,
and every meta_required key must be given. The child job is named
<job>/dispatch-<unix time>-<8 hex> and gets an evaluation, monitored unless -detach.
"""


def register(top: Subcommands) -> None:
    jobs = add_group(top, "job", "register, inspect and stop jobs")
    p = add_command(
        jobs,
        "run",
        _cmd_job_run,
        "register a job from a job file and monitor its evaluation",
        _JOB_RUN_EPILOG,
    )
    p.add_argument("file")
    write_flags(p, monitor=True)
    job_file_flags(p)
    p = add_command(
        jobs, "plan", _cmd_job_plan, "dry run: show what registering a job file would do", _PLAN_EPILOG
    )
    p.add_argument("file")
    conn_flags(p)
    job_file_flags(p)
    flag(p, "json", action="store_true", help="print the plan response as JSON")
    p = add_command(jobs, "status", _cmd_job_status, "list jobs, or show one job")
    p.add_argument("job", nargs="?")
    read_flags(p)
    flag(p, "namespace", default="")
    p = add_command(jobs, "stop", _cmd_job_stop, "stop (deregister) a job")
    p.add_argument("job")
    write_flags(p, monitor=True)
    flag(p, "purge", action="store_true", help="also remove the job from the state")
    flag(p, "namespace", default="")
    p = add_command(jobs, "allocs", _cmd_job_allocs, "list a job's allocations")
    p.add_argument("job")
    read_flags(p)
    flag(p, "namespace", default="")
    p = add_command(
        jobs,
        "dispatch",
        _cmd_job_dispatch,
        "run a parameterized job: create a child job with metadata and a payload",
        _DISPATCH_EPILOG,
    )
    p.add_argument("job")
    p.add_argument("payload", nargs="?", help="file whose contents are the payload ('-' reads stdin)")
    write_flags(p, monitor=True)
    flag(p, "meta", action="append", metavar="KEY=VALUE", help="dispatch metadata (repeatable)")
    flag(
        p,
        "idempotency-token",
        default="",
        help="if a child was already dispatched with this token, return it instead of dispatching again",
    )
    flag(p, "namespace", default="")
    _job_lifecycle.register(jobs)
    periodic = add_group(jobs, "periodic", "periodic job operations")
    p = add_command(periodic, "force", _cmd_job_periodic_force, "launch a periodic job's child now")
    p.add_argument("job")
    write_flags(p, monitor=True)
    flag(p, "namespace", default="")


def _cmd_job_run(args: argparse.Namespace) -> int:
    job_pb = _load_job_file(args.file, args)
    with connect(args) as client:
        resp = client.register_job(job_pb)
        if args.json:
            print_json(resp)
            return 0
        if not resp.eval_id:
            print(f'Job "{job_pb.id}" registered (version {resp.version})')
            _print_register_warnings(resp.warnings)
            kind = _template_kind(job_pb)
            if kind == "periodic":
                print("Job is periodic: each run it launches is evaluated then; nothing to monitor now")
            elif kind == "parameterized":
                print("Job is parameterized: each dispatch is evaluated then; nothing to monitor now")
            else:
                print("No evaluation was created: nothing to monitor")
            return 0
        print(f'Job "{job_pb.id}" registered (version {resp.version}), evaluation {resp.eval_id}')
        _print_register_warnings(resp.warnings)
        if args.detach:
            return 0
        return monitor_eval(client, args, resp.eval_id, follow_deployment=True, job_version=resp.version)


def _print_register_warnings(warnings: str) -> None:
    if warnings:
        print(f"Warnings: {warnings}")


def _template_kind(job: structs_pb2.Job) -> str:
    """What kind of template the job is ("periodic", "parameterized"), or "" for neither.

    The server registers a template without an evaluation: its children get the evals."""
    if job.HasField("periodic"):
        return "periodic"
    if job.HasField("parameterized") and not job.dispatched:
        return "parameterized"
    return ""


def _cmd_job_plan(args: argparse.Namespace) -> int:
    job_pb = _load_job_file(args.file, args)
    with connect(args) as client:
        plan = client.plan_job(job_pb)
        if args.json:
            print_json(plan)
            return _plan_exit_status(plan)
        # current_version is 0 both for a new job and for an existing job at version 0.
        new = not _job_exists(client, job_pb.id, job_pb.namespace)
    print(plan_header(job_pb.id, new=new, changed=plan.job_changed, current_version=plan.current_version))
    if plan.warnings:
        print("Warnings:")
        for warning in plan.warnings:
            print(f"  - {warning}")
    kind = _template_kind(job_pb)
    if kind and not plan.groups:
        print(
            f"\nJob is {kind}: registering it places no allocations by itself;"
            " each child job it launches is scheduled then."
        )
        return 0
    group_order = [g.name for g in job_pb.groups]
    # Every group of the job gets a row (all zeros if the scheduler reported nothing for it).
    groups: dict[str, dict[str, int]] = {g: {} for g in group_order}
    groups.update((g, dict(gp.buckets)) for g, gp in plan.groups.items())
    headers, rows = plan_table(groups, group_order)
    print()
    print_table(headers, rows, empty="No task groups to schedule")
    queued = {g: n for g, n in plan.queued.items() if n > 0}
    print()
    if queued:
        order = [g for g in group_order if g in queued] + sorted(g for g in queued if g not in group_order)
        print(
            f"Scheduler dry-run: {sum(queued.values())} allocation(s) could not be placed now (would be queued):"
        )
        print_table(["Group", "Queued"], [[g, str(queued[g])] for g in order])
        if plan.failed_tg_metrics:
            print()
            print("\n".join(failed_group_lines(plan.failed_tg_metrics, group_order)))
    else:
        print("Scheduler dry-run: all allocations can be placed.")
    return _plan_exit_status(plan)


# Buckets of allocations the plan would leave as they are: every other bucket creates,
# stops or changes an allocation.
_UNCHANGED_BUCKETS: Final = frozenset({"ignore", "reschedule_later"})


def _plan_exit_status(plan: api_pb2.JobPlanResponse) -> int:
    """Nomad's: 1 when allocations would be created, destroyed or updated (placements that
    would be queued count: they are created once there is room), else 0."""
    changes = any(
        count > 0
        for group in plan.groups.values()
        for bucket, count in group.buckets.items()
        if bucket not in _UNCHANGED_BUCKETS
    )
    return 1 if changes or any(n > 0 for n in plan.queued.values()) else 0


def _job_exists(client: DroverClient, job_id: str, namespace: str) -> bool:
    try:
        client.get_job(job_id, namespace=namespace)
    except DroverError as exc:
        if exc.code == grpc.StatusCode.NOT_FOUND:
            return False
        raise
    return True


def _cmd_job_status(args: argparse.Namespace) -> int:
    with connect(args) as client:
        if not args.job:
            listing = client.list_jobs(namespace=args.namespace, stale=args.stale)
            if args.json:
                print_json(listing.jobs)
                return 0
            rows = [
                [j.id, j.type, str(j.priority), j.status, fmt_time(j.submit_time_ns)]
                for j in sorted(listing.jobs, key=lambda j: j.id)
            ]
            print_table(["ID", "Type", "Priority", "Status", "Submit Date"], rows, empty="No jobs")
            return 0
        got = _get_job(client, args)
        job = got.job
        allocs = client.list_allocs(job_id=job.id, namespace=job.namespace, stale=args.stale).allocs
        if args.json:
            print_json({"job": got.job, "summary": got.summary, "allocations": allocs})
            return 0
        print_kv(
            [
                ("ID", job.id),
                ("Name", job.name),
                ("Namespace", job.namespace),
                ("Type", job.type),
                ("Priority", str(job.priority)),
                ("Datacenters", ",".join(job.datacenters)),
                ("Status", job.status),
                ("Version", str(job.version)),
                ("Stop", str(job.stop).lower()),
                ("Submit Date", fmt_time(job.submit_time_ns)),
            ]
        )
        kind = _template_kind(job)
        if kind:
            _print_parent_status(client, args, job, got.summary, kind)
            return 0
        print("\nSummary")
        states = ("queued", "starting", "running", "failed", "complete", "lost", "unknown")
        summary_rows = [
            [name, *(str(getattr(tg, state)) for state in states)]
            for name, tg in sorted(got.summary.summary.items())
        ]
        print_table(["Task Group", *(s.capitalize() for s in states)], summary_rows, empty="No summary")
        children = got.summary.children
        if children.pending or children.running or children.dead:
            print("\nChildren Job Summary")
            print_table(
                ["Pending", "Running", "Dead"],
                [[str(children.pending), str(children.running), str(children.dead)]],
            )
        awaiting = awaiting_rows(client, allocs, time.time_ns(), short=not is_verbose(args))
        if awaiting:
            print("\nFailed Allocations Awaiting Reschedule")
            print_table(["ID", "Name", "Node", "Reschedule"], awaiting)
        print("\nAllocations")
        print_allocs_table(allocs, is_verbose(args))
    return 0


_RECENT_CHILDREN: Final = 10


def _print_parent_status(
    client: DroverClient,
    args: argparse.Namespace,
    job: structs_pb2.Job,
    summary: structs_pb2.JobSummary,
    kind: str,
) -> None:
    """A periodic or parameterized parent: its schedule or parameters, children counts and
    its most recent children (all of them with -verbose)."""
    from drover.scheduler.periodic import SECOND_NS, launch_ns_from_id, next_periodic_launch
    from drover.scheduler.structs import PeriodicConfig
    from drover.server.codec import from_proto

    if kind == "periodic":
        periodic = from_proto(job.periodic, PeriodicConfig)
        if job.stop:
            next_text = "none (job stopped)"
        elif not periodic.enabled:
            next_text = "none (periodic disabled)"
        else:
            now = time.time_ns()
            try:
                upcoming = next_periodic_launch(periodic, now)
            except ValueError as exc:
                upcoming, next_text = None, f"unknown ({exc})"
            else:
                next_text = "none"
            if upcoming is not None:
                next_text = f"{fmt_time(upcoming)} ({fmt_duration(upcoming - now - (upcoming - now) % SECOND_NS)} from now)"
        print("\nPeriodic")
        print_kv(
            [
                ("Cron", ", ".join(periodic.schedules())),
                ("Time Zone", periodic.time_zone),
                ("Prohibit Overlap", str(periodic.prohibit_overlap).lower()),
                ("Next Periodic Launch", next_text),
            ]
        )
    else:
        params = job.parameterized
        print("\nParameterized Job")
        print_kv(
            [
                ("Payload", params.payload or "optional"),
                ("Required Metadata", ", ".join(params.meta_required) or "<none>"),
                ("Optional Metadata", ", ".join(params.meta_optional) or "<none>"),
            ]
        )
    children = summary.children
    print("\nChildren Job Summary")
    print_table(
        ["Pending", "Running", "Dead"], [[str(children.pending), str(children.running), str(children.dead)]]
    )
    listing = client.list_jobs(prefix=f"{job.id}/", namespace=job.namespace, stale=args.stale).jobs
    mine = sorted(
        (c for c in listing if c.parent_id == job.id), key=lambda c: (c.create_index, c.id), reverse=True
    )
    shown = mine if args.verbose else mine[:_RECENT_CHILDREN]
    title = "Recent Launches" if kind == "periodic" else "Recent Dispatches"
    print(f"\n{title}")
    rows = []
    for child in shown:
        launched = launch_ns_from_id(child.id) if kind == "periodic" else None
        rows.append([child.id, child.status, fmt_time(launched or child.submit_time_ns)])
    empty = "No instances of periodic job found" if kind == "periodic" else "No dispatched instances found"
    print_table(["ID", "Status", "Launched"], rows, empty=empty)
    if len(shown) < len(mine):
        print(f"({len(mine) - len(shown)} older children not shown; -verbose lists all)")


def _cmd_job_stop(args: argparse.Namespace) -> int:
    with connect(args) as client:
        job = _get_job(client, args).job
        resp = client.deregister_job(job.id, namespace=job.namespace, purge=args.purge)
        if args.json:
            print_json(resp)
            return 0
        verb = "purged" if args.purge else "stopped"
        print(f'Job "{job.id}" {verb}, evaluation {resp.eval_id or "(none)"}')
        if not args.detach and resp.eval_id:
            return monitor_eval(client, args, resp.eval_id)
    return 0


def _cmd_job_allocs(args: argparse.Namespace) -> int:
    with connect(args) as client:
        job = _get_job(client, args).job
        allocs = client.list_allocs(job_id=job.id, namespace=job.namespace, stale=args.stale).allocs
        if args.json:
            print_json(allocs)
            return 0
        print_allocs_table(allocs, is_verbose(args))
    return 0


def _cmd_job_dispatch(args: argparse.Namespace) -> int:
    meta = parse_meta(args.meta or [])
    payload = b""
    if args.payload == "-":
        payload = sys.stdin.buffer.read()
    elif args.payload:
        with open(args.payload, "rb") as fh:
            payload = fh.read()
    with connect(args) as client:
        resp = client.dispatch_job(
            args.job,
            namespace=args.namespace,
            meta=meta,
            payload=payload,
            idempotency_token=args.idempotency_token,
        )
        return answer_then_monitor(
            client, args, resp, f'Dispatched job "{resp.dispatched_job_id}"', resp.eval_id
        )


def _cmd_job_periodic_force(args: argparse.Namespace) -> int:
    with connect(args) as client:
        resp = client.periodic_force(args.job, namespace=args.namespace)
        said = f'Force periodic successful: launched job "{resp.child_job_id}"'
        return answer_then_monitor(client, args, resp, said, resp.eval_id)
