"""``drover deployment``: list deployments, show one, and steer one (promote its canaries,
pause, resume, fail it, set its allocations' health by hand), in Nomad's shapes.

Every command takes a deployment ID or a unique prefix of one. The writes monitor the
evaluation they create, then the deployment, unless -detach; their exit statuses are
``job run``'s (:mod:`drover.cli._monitor`).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Final

from drover.cli._args import (
    Subcommands,
    add_command,
    add_group,
    display_id,
    flag,
    is_verbose,
    read_flags,
    write_flags,
)
from drover.cli._connect import RecordKind, connect, find, no_unique_match
from drover.cli._deployments import (
    DEPLOYMENT_ALLOC_HEADERS,
    deployment_alloc_rows,
    deployment_json,
    deployment_kv,
    group_table,
    print_deployment_list,
)
from drover.cli._errors import CLIError, Handler
from drover.cli._format import print_json, print_kv, print_table
from drover.cli._monitor import monitor_eval
from drover.sdk import DroverClient
from drover.v1 import api_pb2, structs_pb2

__all__ = ["DEPLOYMENTS", "register"]

DEPLOYMENTS: Final[RecordKind[structs_pb2.Deployment]] = RecordKind(
    "deployment",
    lambda client, deployment_id, stale: client.get_deployment(deployment_id, stale=stale).deployment,
    lambda client, stale: [d.id for d in client.list_deployments(stale=stale).deployments],
)

_STATUS_EPILOG: Final = """\
Shows the deployment's ID, job, job version, status and description, and per task group:
Desired, Placed, Healthy and Unhealthy allocations, and, when some group uses them, Auto
Revert, Promoted, Canaries (desired) and Progress Deadline (the time by which the group
must make progress). -verbose adds full IDs and the deployment's allocations with their
health.

-json prints the deployment record with, always present: id, job_id, job_version, status
(running, paused, failed, successful or cancelled), status_description, and per group
(task_groups.<name>) desired, placed, healthy, unhealthy, canaries and promoted.
"""

_WRITE_EXIT: Final = """\
Unless -detach (or -json) is given, the evaluation the change creates is monitored, then
the deployment, until it ends.

Exit status:
  0  done (and the deployment, when monitored, succeeded)
  1  an error, a failed evaluation, or a deployment that did not succeed
  2  some allocations could not be placed, or a usage error
"""

_ALLOC_HEALTH_EPILOG: Final = (
    """\
Sets the deployment health of allocations by hand: with health_check = "manual" this is
the only way they get one; otherwise it overrides the client's. Allocation IDs (or unique
prefixes of the deployment's allocations) are comma-separated, and each flag may be
repeated. One unhealthy allocation fails the deployment (rolling back with auto_revert).

"""
    + _WRITE_EXIT
)


def register(top: Subcommands) -> None:
    deployments = add_group(top, "deployment", "list, inspect and steer deployments")
    p = add_command(deployments, "list", _cmd_list, "list deployments, newest first")
    read_flags(p)
    p = add_command(deployments, "status", _cmd_status, "show one deployment", _STATUS_EPILOG)
    p.add_argument("deployment")
    read_flags(p)
    p = _steering_command(
        deployments, "promote", _cmd_promote, "promote a deployment's canaries so rolling goes on"
    )
    flag(p, "group", action="append", default=[], metavar="G", help="promote only this group (repeatable)")
    p = add_command(deployments, "pause", _cmd_pause, "pause a running deployment: no new placements")
    p.add_argument("deployment")
    write_flags(p)
    _steering_command(deployments, "resume", _cmd_resume, "resume a paused deployment")
    _steering_command(
        deployments, "fail", _cmd_fail, "mark a deployment failed (rolling back with auto_revert)"
    )
    p = _steering_command(
        deployments,
        "alloc-health",
        _cmd_alloc_health,
        "set allocations' deployment health by hand",
        _ALLOC_HEALTH_EPILOG,
    )
    flag(p, "healthy", action="append", default=[], metavar="A,B", help="allocations to mark healthy")
    flag(p, "unhealthy", action="append", default=[], metavar="A,B", help="allocations to mark unhealthy")


def _steering_command(
    deployments: Subcommands, name: str, handler: Handler, help_: str, epilog: str = _WRITE_EXIT
) -> argparse.ArgumentParser:
    """A write on one deployment that is monitored after (promote, resume, fail,
    alloc-health): its ID or a unique prefix as the argument, the write flags with -detach,
    and the exit statuses in its help, so each such command takes the deployment the same way."""
    p = add_command(deployments, name, handler, help_, epilog)
    p.add_argument("deployment")
    write_flags(p, monitor=True)
    return p


def _cmd_list(args: argparse.Namespace) -> int:
    with connect(args) as client:
        deployments = client.list_deployments(stale=args.stale).deployments
    print_deployment_list(deployments, verbose=is_verbose(args), as_json=args.json)
    return 0


def _cmd_status(args: argparse.Namespace) -> int:
    with connect(args) as client:
        deployment = find(client, DEPLOYMENTS, args.deployment, stale=args.stale)
        allocs = (
            client.deployment_allocs(deployment.id, stale=args.stale).allocs
            if is_verbose(args) and not args.json
            else ()
        )
    if args.json:
        print_json(deployment_json(deployment))
        return 0
    print_kv(deployment_kv(deployment, is_verbose(args)))
    headers, rows = group_table(deployment)
    print("\nDeployed")
    print_table(headers, rows, empty="No task groups")
    if is_verbose(args):
        print("\nAllocations")
        print_table(
            DEPLOYMENT_ALLOC_HEADERS,
            deployment_alloc_rows(allocs, verbose=True),
            empty="No allocations placed",
        )
    return 0


def _after_write(
    client: DroverClient,
    args: argparse.Namespace,
    resp: api_pb2.DeploymentWriteResponse,
    done: str,
) -> int:
    """Print what the write did, then monitor its eval (and the deployment) unless told not to."""
    if args.json:
        print_json(resp)
        return 0
    print(done)
    if resp.reverted:
        print(f"Job rolled back to version {resp.reverted_job_version} (as a new version)")
    if not resp.eval_id:
        return 0
    print(f"Evaluation {display_id(resp.eval_id, args)}")
    if getattr(args, "detach", True):
        return 0
    return monitor_eval(client, args, resp.eval_id, follow_deployment=True)


def _cmd_promote(args: argparse.Namespace) -> int:
    with connect(args) as client:
        deployment = find(client, DEPLOYMENTS, args.deployment, stale=False)
        groups = _split(args.group)
        resp = client.promote_deployment(deployment.id, groups=groups)
        which = f"groups {', '.join(groups)} of deployment" if groups else "deployment"
        return _after_write(client, args, resp, f'Promoted {which} "{display_id(deployment.id, args)}"')


def _cmd_pause(args: argparse.Namespace) -> int:
    with connect(args) as client:
        deployment = find(client, DEPLOYMENTS, args.deployment, stale=False)
        resp = client.pause_deployment(deployment.id, pause=True)
        return _after_write(client, args, resp, f'Deployment "{display_id(deployment.id, args)}" paused')


def _cmd_resume(args: argparse.Namespace) -> int:
    with connect(args) as client:
        deployment = find(client, DEPLOYMENTS, args.deployment, stale=False)
        resp = client.pause_deployment(deployment.id, pause=False)
        return _after_write(client, args, resp, f'Deployment "{display_id(deployment.id, args)}" resumed')


def _cmd_fail(args: argparse.Namespace) -> int:
    with connect(args) as client:
        deployment = find(client, DEPLOYMENTS, args.deployment, stale=False)
        resp = client.fail_deployment(deployment.id)
        return _after_write(client, args, resp, f'Deployment "{display_id(deployment.id, args)}" failed')


def _cmd_alloc_health(args: argparse.Namespace) -> int:
    healthy, unhealthy = _split(args.healthy), _split(args.unhealthy)
    if not healthy and not unhealthy:
        raise CLIError("give at least one allocation with -healthy or -unhealthy")
    both = sorted(set(healthy) & set(unhealthy))
    if both:
        raise CLIError(f"allocation {both[0]} is given as both healthy and unhealthy")
    with connect(args) as client:
        deployment = find(client, DEPLOYMENTS, args.deployment, stale=False)
        ids = [a.id for a in client.deployment_allocs(deployment.id).allocs]
        healthy = [_alloc_of(ids, ref, deployment.id) for ref in healthy]
        unhealthy = [_alloc_of(ids, ref, deployment.id) for ref in unhealthy]
        resp = client.set_alloc_health(deployment.id, healthy=healthy, unhealthy=unhealthy)
        parts = [f"{len(healthy)} healthy"] * bool(healthy) + [f"{len(unhealthy)} unhealthy"] * bool(
            unhealthy
        )
        done = f'Deployment "{display_id(deployment.id, args)}": marked {" and ".join(parts)}'
        return _after_write(client, args, resp, done)


def _split(values: Sequence[str]) -> list[str]:
    """``-flag a,b -flag c`` as ``[a, b, c]``: empty parts dropped, first occurrence kept."""
    return list(dict.fromkeys(part.strip() for value in values for part in value.split(",") if part.strip()))


def _alloc_of(ids: Sequence[str], ref: str, deployment_id: str) -> str:
    """The deployment's allocation ``ref`` names (its ID or a unique prefix of it)."""
    if ref in ids:
        return ref
    matches = [i for i in ids if i.startswith(ref)]
    if len(matches) == 1:
        return matches[0]
    if not matches:
        raise CLIError(f'no allocation of deployment "{deployment_id[:8]}" matches "{ref}"')
    no_unique_match("allocation", ref, matches, None)
