"""``drover job`` commands over a job's versions and rollouts: ``history``, ``revert``,
``scale``, ``inspect``, ``validate`` and ``deployments``, in Nomad's shapes and exit codes.
:mod:`drover.cli.job` registers them with the rest of the group."""

from __future__ import annotations

import argparse
import itertools
from typing import Final

import grpc

from drover.cli._args import (
    Subcommands,
    add_command,
    conn_flags,
    display_id,
    flag,
    is_verbose,
    read_flags,
    write_flags,
)
from drover.cli._connect import connect
from drover.cli._deployments import print_deployment_list
from drover.cli._errors import CLIError
from drover.cli._format import fmt_time, print_json, print_kv, print_table
from drover.cli._jobdiff import diff_jobs, fmt_value
from drover.cli._jobs import (
    JobFileProblems,
    get_job,
    job_file_flags,
    job_proto,
    local_errors,
    parse_job_file,
    with_lines,
)
from drover.cli._monitor import monitor_eval
from drover.sdk import DroverClient, DroverError
from drover.v1 import api_pb2, structs_pb2

__all__ = ["register"]

_HISTORY_EPILOG: Final = """\
Versions newest first. With -p, each version is shown with what changed from the version
before it: one line per field path, old -> new ("(none)" where a side has no such field).
A version is stable once a deployment of it succeeded.
"""

_ROLLOUT_EXIT: Final = """\
Unless -detach (or -json) is given, the evaluation is monitored, then the deployment it
starts, if any, until it ends.

Exit status:
  0  done; the evaluation completed and the deployment, if any, succeeded
     (or -monitor-timeout passed while the evaluation was pending)
  1  an error, a failed evaluation, or a deployment that did not succeed
     (also when an automatic rollback then succeeded)
  2  some allocations could not be placed (a successful deployment clears this),
     or a usage error
"""

_REVERT_EPILOG: Final = (
    """\
Registers the spec of an older VERSION again as a new version (not stable until a
deployment of it succeeds). Reverting to the current version is refused.

"""
    + _ROLLOUT_EXIT
)

_SCALE_EXIT: Final = (
    """\
Sets the count of GROUP (which may be left out when the job has one group) as a new job
version. Refused while the job's latest deployment is active.

"""
    + _ROLLOUT_EXIT
)

_VALIDATE_EPILOG: Final = """\
Reads the job file as "job run" does, checks it locally, then asks a server to validate
it (the server knows what the file alone does not say). Every problem is listed at once,
each with the place it is at: a file position (web.hcl:3,5) for a file that cannot be
read, a field path (job.groups[0].count) for an invalid job. Nothing is registered.

Exit status:
  0  the job is valid
  1  the job is invalid (every problem listed on stdout), or an error
  2  usage error
"""


def register(jobs: Subcommands) -> None:
    p = add_command(
        jobs, "history", _cmd_history, "list a job's versions, with -p their changes", _HISTORY_EPILOG
    )
    p.add_argument("job")
    read_flags(p)
    flag(p, "p", action="store_true", help="show what changed in each version from the one before")
    flag(p, "namespace", default="")
    p = add_command(jobs, "revert", _cmd_revert, "register an older version of a job again", _REVERT_EPILOG)
    p.add_argument("job")
    p.add_argument("version", help="the job version to revert to")
    write_flags(p, monitor=True)
    flag(p, "namespace", default="")
    p = add_command(jobs, "scale", _cmd_scale, "change the count of a job's task group", _SCALE_EXIT)
    p.add_argument("job")
    p.add_argument("group", nargs="?", help="the task group (may be left out when the job has one)")
    p.add_argument("count")
    write_flags(p, monitor=True)
    flag(p, "namespace", default="")
    p = add_command(jobs, "inspect", _cmd_inspect, "print a job's stored spec as JSON")
    p.add_argument("job")
    conn_flags(p)
    flag(p, "stale", action="store_true", help="let any server answer from its own state")
    flag(p, "version", type=int, metavar="N", help="that version of the job (default: the current one)")
    flag(p, "namespace", default="")
    p = add_command(
        jobs, "validate", _cmd_validate, "check a job file, listing every problem", _VALIDATE_EPILOG
    )
    p.add_argument("file")
    conn_flags(p)
    job_file_flags(p)
    p = add_command(jobs, "deployments", _cmd_deployments, "list a job's deployments, newest first")
    p.add_argument("job")
    read_flags(p)
    flag(p, "namespace", default="")


def _versions(args: argparse.Namespace) -> list[structs_pb2.Job]:
    """The job's stored versions, newest first (the job by ID prefix too)."""
    with connect(args) as client:
        job = get_job(client, args).job
        versions = client.job_versions(job.id, namespace=job.namespace, stale=args.stale).versions
    return sorted(versions, key=lambda v: v.version, reverse=True)


def _cmd_history(args: argparse.Namespace) -> int:
    versions = _versions(args)
    # Each version against the one before it in the history (older ones may be trimmed).
    previous = {newer.version: older for newer, older in itertools.pairwise(versions)}
    if args.json:
        out = []
        for v in versions:
            entry = {"version": v.version, "stable": v.stable, "submit_time_ns": v.submit_time_ns, "job": v}
            if args.p and v.version in previous:
                entry["diff"] = [
                    {"path": c.path, "old": fmt_value(c.old), "new": fmt_value(c.new)}
                    for c in diff_jobs(previous[v.version], v)
                ]
            out.append(entry)
        print_json(out)
        return 0
    if not args.p:
        rows = [[str(v.version), str(v.stable).lower(), fmt_time(v.submit_time_ns)] for v in versions]
        print_table(["Version", "Stable", "Submit Date"], rows, empty="No versions")
        return 0
    for i, v in enumerate(versions):
        if i:
            print()
        pairs = [("Version", str(v.version)), ("Stable", str(v.stable).lower())]
        pairs.append(("Submit Date", fmt_time(v.submit_time_ns)))
        older = previous.get(v.version)
        if older is not None:
            pairs.append(("Diff", f"(from version {older.version})"))
        print_kv(pairs)
        if older is not None:
            changes = diff_jobs(older, v)
            for change in changes:
                print(f"  {change.path}: {fmt_value(change.old)} -> {fmt_value(change.new)}")
            if not changes:
                print("  (no spec changes)")
    return 0


def _non_negative_int(text: str, what: str) -> int:
    try:
        value = int(text, 10)
    except ValueError:
        value = -1
    if value < 0:
        raise CLIError(f'{what} must be a non-negative integer, got "{text}"')
    return value


def _report_new_version(
    client: DroverClient,
    args: argparse.Namespace,
    resp: api_pb2.JobRevertResponse | api_pb2.JobScaleResponse,
    headline: str,
) -> int:
    """What revert and scale say once the server has written a new job version: both then
    monitor the eval and the deployment of that version exactly as ``job run`` does, so
    their exit statuses are the same."""
    if args.json:
        print_json(resp)
        return 0
    print(headline)
    if not resp.eval_id:
        print("No evaluation was created: nothing to monitor")
        return 0
    print(f"Evaluation {display_id(resp.eval_id, args)}")
    if args.detach:
        return 0
    return monitor_eval(client, args, resp.eval_id, follow_deployment=True, job_version=resp.job_version)


def _cmd_revert(args: argparse.Namespace) -> int:
    version = _non_negative_int(args.version, "VERSION")
    with connect(args) as client:
        job = get_job(client, args).job
        resp = client.revert_job(job.id, version, namespace=job.namespace)
        headline = f'Job "{job.id}" reverted to version {version} as version {resp.job_version}'
        return _report_new_version(client, args, resp, headline)


def _cmd_scale(args: argparse.Namespace) -> int:
    count = _non_negative_int(args.count, "COUNT")
    with connect(args) as client:
        job = get_job(client, args).job
        if args.group is not None:
            group: str = args.group
        elif len(job.groups) == 1:
            group = job.groups[0].name
        else:
            names = ", ".join(g.name for g in job.groups)
            raise CLIError(f'job "{job.id}" has {len(job.groups)} task groups ({names}): name one')
        if group not in {g.name for g in job.groups}:
            raise CLIError(f'job "{job.id}" has no task group "{group}"')
        resp = client.scale_job(job.id, group, count, namespace=job.namespace)
        headline = f'Job "{job.id}" group "{group}" scaled to {count} (version {resp.job_version})'
        return _report_new_version(client, args, resp, headline)


def _cmd_inspect(args: argparse.Namespace) -> int:
    with connect(args) as client:
        job = get_job(client, args).job
        if args.version is not None and args.version != job.version:
            versions = client.job_versions(job.id, namespace=job.namespace, stale=args.stale).versions
            matching = [v for v in versions if v.version == args.version]
            if not matching:
                raise CLIError(f'job "{job.id}" has no version {args.version}')
            job = matching[0]
    print_json(job)
    return 0


def _cmd_validate(args: argparse.Namespace) -> int:
    try:
        job = parse_job_file(args.file, args)
    except JobFileProblems as exc:
        if len(exc.errors) <= 1:
            raise  # one problem (say, a syntax error) is its own one-line answer
        # Every problem of the file, each with its line: nothing to ask a server about.
        print("Job validation errors:")
        for error in exc.errors:
            print(f"  * {error}")
        raise CLIError(f"{args.file}: job validation failed: {len(exc.errors)} problem(s)") from exc
    errors = local_errors(job)
    with connect(args) as client:
        try:
            resp = client.validate_job(job_proto(job))
        except DroverError as exc:
            # A job the server cannot even take apart is one more problem, not a crash.
            if exc.code != grpc.StatusCode.INVALID_ARGUMENT:
                raise
            resp = api_pb2.JobValidateResponse(errors=[exc.message])
    # The local check and the server's overlap: each problem once, local ones first, each
    # with the line of its field in the file, as a parse error has.
    errors += [e for e in resp.errors if e not in errors]
    errors = with_lines(errors, args.file)
    if resp.warnings:
        print("Job Warnings:")
        for warning in resp.warnings:
            print(f"  * {warning}")
    if errors:
        print("Job validation errors:")
        for error in errors:
            print(f"  * {error}")
        raise CLIError(f"{args.file}: job validation failed: {len(errors)} problem(s)")
    print("Job validation successful")
    return 0


def _cmd_deployments(args: argparse.Namespace) -> int:
    with connect(args) as client:
        job = get_job(client, args).job
        # The server lists only this job's deployments.
        listing = client.list_deployments(job_id=job.id, namespace=job.namespace, stale=args.stale)
    print_deployment_list(listing.deployments, verbose=is_verbose(args), as_json=args.json)
    return 0
