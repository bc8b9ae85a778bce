"""How a deployment reads on the command line: the status header, the per-group table that
``deployment status`` and ``job run``'s monitor both print, the allocation table of
``deployment status -verbose``, and the ``-json`` shape.

Nothing here talks to a server. The table's columns are Nomad's, optional ones only when
some group uses them, so a plain rolling update reads as plainly as it is and a canary
rollout shows what it waits on.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Final

from drover.cli._format import (
    ALLOC_LEAD_HEADERS,
    alloc_lead_cells,
    fmt_time,
    jsonable,
    oldest_allocs_first,
    print_json,
    print_table,
    short_id,
)
from drover.scheduler.structs import DEPLOYMENT_ACTIVE
from drover.v1 import structs_pb2

__all__ = [
    "DEPLOYMENT_ALLOC_HEADERS",
    "LIST_HEADERS",
    "deployment_alloc_rows",
    "deployment_json",
    "deployment_kv",
    "deployment_list_rows",
    "group_table",
    "is_active",
]

LIST_HEADERS: Final = ("ID", "Job ID", "Job Version", "Status", "Description")
DEPLOYMENT_ALLOC_HEADERS: Final = (*ALLOC_LEAD_HEADERS, "Health", "Canary", "Created")


def is_active(deployment: structs_pb2.Deployment) -> bool:
    """Running or paused: it may still place allocations and change state."""
    return deployment.status in DEPLOYMENT_ACTIVE


def deployment_kv(deployment: structs_pb2.Deployment, verbose: bool) -> list[tuple[str, str]]:
    return [
        ("ID", short_id(deployment.id, verbose)),
        ("Job ID", deployment.job_id),
        ("Job Version", str(deployment.job_version)),
        ("Status", deployment.status),
        ("Description", deployment.status_description),
    ]


def group_table(deployment: structs_pb2.Deployment) -> tuple[list[str], list[list[str]]]:
    """Headers and rows of the per-group state, groups by name.

    Task Group, [Auto Revert], [Promoted], Desired, [Canaries], Placed, Healthy, Unhealthy,
    [Progress Deadline]: a bracketed column appears only when some group uses it (auto
    revert on, canaries desired, a progress deadline set), as in Nomad."""
    states = sorted(deployment.task_groups.items())
    auto_revert = any(s.auto_revert for _, s in states)
    canaries = any(s.desired_canaries > 0 for _, s in states)
    deadline = any(s.progress_deadline_ns != 0 for _, s in states)
    headers = ["Task Group"]
    headers += ["Auto Revert"] if auto_revert else []
    headers += ["Promoted"] if canaries else []
    headers += ["Desired"]
    headers += ["Canaries"] if canaries else []
    headers += ["Placed", "Healthy", "Unhealthy"]
    headers += ["Progress Deadline"] if deadline else []
    rows: list[list[str]] = []
    for name, state in states:
        row = [name]
        if auto_revert:
            row.append(str(state.auto_revert).lower())
        if canaries:
            row.append(str(state.promoted).lower() if state.desired_canaries > 0 else "N/A")
        row.append(str(state.desired_total))
        if canaries:
            row.append(str(state.desired_canaries))
        row += [str(state.placed_allocs), str(state.healthy_allocs), str(state.unhealthy_allocs)]
        if deadline:
            row.append(fmt_time(state.require_progress_by_ns) or "N/A")
        rows.append(row)
    return headers, rows


def _newest_first(deployments: Iterable[structs_pb2.Deployment]) -> list[structs_pb2.Deployment]:
    """Every deployment listing's order, in both its forms: by creation, the ID for a tie."""
    return sorted(deployments, key=lambda d: (d.create_index, d.id), reverse=True)


def deployment_list_rows(deployments: Iterable[structs_pb2.Deployment], verbose: bool) -> list[list[str]]:
    """Rows for :data:`LIST_HEADERS`, newest first."""
    return [
        [short_id(d.id, verbose), d.job_id, str(d.job_version), d.status, d.status_description]
        for d in _newest_first(deployments)
    ]


def print_deployment_list(
    deployments: Sequence[structs_pb2.Deployment], *, verbose: bool, as_json: bool
) -> None:
    """``deployment list`` and ``job deployments`` print one listing, newest first in
    both forms, so the two commands cannot disagree on its shape."""
    if as_json:
        print_json([deployment_json(d) for d in _newest_first(deployments)])
        return
    print_table(LIST_HEADERS, deployment_list_rows(deployments, verbose), empty="No deployments found")


def deployment_alloc_rows(allocs: Sequence[structs_pb2.Allocation], verbose: bool) -> list[list[str]]:
    """Rows for :data:`DEPLOYMENT_ALLOC_HEADERS`, oldest first; Health is the deployment
    health the client (or an operator) set, "unset" while undecided."""
    return [
        [
            *alloc_lead_cells(a, verbose),
            a.deployment_status.health or "unset",
            str(a.deployment_status.canary).lower(),
            fmt_time(a.create_time_ns),
        ]
        for a in oldest_allocs_first(allocs)
    ]


def deployment_json(deployment: structs_pb2.Deployment) -> dict[str, object]:
    """The record as ``-json`` prints every message (every field, zeros included), plus per
    group the short names the table uses: ``desired``, ``placed``, ``healthy``,
    ``unhealthy``, ``canaries`` (desired canaries) and ``promoted``."""
    out = jsonable(deployment)
    assert isinstance(out, dict)
    out.update(
        id=deployment.id,
        job_id=deployment.job_id,
        job_version=deployment.job_version,
        status=deployment.status,
        status_description=deployment.status_description,
    )
    groups: dict[str, object] = {}
    for name, state in sorted(deployment.task_groups.items()):
        group = jsonable(state)
        assert isinstance(group, dict)
        group.update(
            desired=state.desired_total,
            placed=state.placed_allocs,
            healthy=state.healthy_allocs,
            unhealthy=state.unhealthy_allocs,
            canaries=state.desired_canaries,
            promoted=state.promoted,
        )
        groups[name] = group
    out["task_groups"] = groups
    return out
