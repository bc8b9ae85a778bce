"""``drover alloc``: show one allocation (its addresses, resources, task states with their
recent events, and status history, and with ``-verbose`` how its node was chosen), and
``alloc stop``: have the scheduler replace one."""

from __future__ import annotations

import argparse
import time
from typing import Final

from drover.cli._alloc_control import register_control
from drover.cli._args import (
    Subcommands,
    add_command,
    add_group,
    display_id,
    is_verbose,
    read_flags,
    write_flags,
)
from drover.cli._connect import ALLOCS, connect, find
from drover.cli._format import fmt_duration, fmt_time, print_json, print_kv, print_table
from drover.cli._monitor import answer_then_monitor
from drover.cli._placement import metric_lines, score_table
from drover.cli._reschedule import attempts_text, eligibility_text
from drover.sdk import DroverClient, DroverError
from drover.v1 import structs_pb2

__all__ = ["register"]


def register(top: Subcommands) -> None:
    allocs = add_group(top, "alloc", "inspect allocations")
    p = add_command(allocs, "status", _cmd_alloc_status, "show one allocation")
    p.add_argument("alloc")
    read_flags(p)
    register_control(allocs)
    p = add_command(allocs, "stop", _cmd_alloc_stop, "stop an allocation and let the scheduler replace it")
    p.add_argument("alloc")
    write_flags(p, monitor=True)


def _cmd_alloc_status(args: argparse.Namespace) -> int:
    with connect(args) as client:
        alloc = find(client, ALLOCS, args.alloc, stale=args.stale)
        if args.json:
            print_json(alloc)
            return 0
        print_kv(
            [
                ("ID", alloc.id),
                ("Eval ID", display_id(alloc.eval_id, args)),
                ("Name", alloc.name),
                ("Node ID", display_id(alloc.node_id, args)),
                ("Node Name", alloc.node_name),
                ("Job ID", alloc.job_id),
                ("Job Version", str(alloc.job_version)),
                ("Task Group", alloc.task_group),
                ("Client Status", alloc.client_status),
                ("Client Description", alloc.client_description or "<none>"),
                ("Desired Status", alloc.desired_status),
                ("Desired Description", alloc.desired_description or "<none>"),
                ("Created", fmt_time(alloc.create_time_ns)),
                ("Modified", fmt_time(alloc.modify_time_ns)),
                ("Previous Allocation", alloc.previous_allocation or "<none>"),
                ("Next Allocation", alloc.next_allocation or "<none>"),
                *_reschedule_lines(client, alloc),
                *_deployment_lines(alloc, args),
            ]
        )
        _print_addresses_and_resources(alloc, _node_address(client, alloc))
        for name, state in sorted(alloc.task_states.items()):
            print(f'\nTask "{name}" is "{state.state}"' + (" (failed)" if state.failed else ""))
            print(
                f"Restarts: {state.restarts}  Started: {fmt_time(state.started_at_ns) or '-'}"
                f"  Finished: {fmt_time(state.finished_at_ns) or '-'}"
            )
            print("\nRecent Events:")
            rows = [[fmt_time(e.time_ns), e.type, e.message] for e in recent_events(state, args)]
            print_table(["Time", "Type", "Description"], rows, empty="No events")
        if alloc.reschedule_events:
            print("\nReschedule Attempts")
            rows = [
                [
                    fmt_time(e.reschedule_time_ns),
                    display_id(e.prev_alloc_id, args),
                    display_id(e.prev_node_id, args),
                    fmt_duration(e.delay_ns),
                ]
                for e in alloc.reschedule_events
            ]
            print_table(["Time", "Previous Alloc", "Previous Node", "Delay"], rows)
        if alloc.state_history:
            print("\nClient Status History")
            rows = [[fmt_time(c.time_ns), c.field, c.value] for c in alloc.state_history]
            print_table(["Time", "Field", "Value"], rows)
        if is_verbose(args):
            _print_placement_metrics(alloc)
    return 0


# Nomad's "Recent Events:" shows the last 10; -verbose shows every event the client kept.
RECENT_EVENTS: Final = 10


def recent_events(state: structs_pb2.TaskState, args: argparse.Namespace) -> list[structs_pb2.TaskEvent]:
    """The task's events oldest first, newest last (as Nomad prints them), the last
    ``RECENT_EVENTS`` unless -verbose."""
    events = sorted(state.events, key=lambda e: e.time_ns)
    return events if is_verbose(args) else events[-RECENT_EVENTS:]


def _node_address(client: DroverClient, alloc: structs_pb2.Allocation) -> str:
    """Where the alloc's ports listen when the port names no host IP: its node's address."""
    if not any(not p.host_ip for p in alloc.resources.ports):
        return ""
    try:
        return client.get_node(alloc.node_id).node.address
    except DroverError:
        return ""  # the node is gone (or not readable with this token): the port still shows


def _print_addresses_and_resources(alloc: structs_pb2.Allocation, node_address: str) -> None:
    """Nomad's "Allocation Addresses" and the resources the scheduler reserved for it."""
    resources = alloc.resources
    print("\nAllocation Addresses:")
    rows = [
        [p.label, f"{p.host_ip or node_address or '<node>'}:{p.value}", str(p.to) if p.to else "-"]
        for p in resources.ports
    ]
    print_table(["Label", "Address", "To"], rows, empty="No ports")
    print("\nAllocated Resources:")
    print_table(
        ["CPU", "Memory", "Disk"],
        [[f"{resources.cpu_mhz} MHz", f"{resources.memory_mb} MiB", f"{resources.disk_mb} MiB"]],
    )


def _cmd_alloc_stop(args: argparse.Namespace) -> int:
    with connect(args) as client:
        alloc = find(client, ALLOCS, args.alloc, stale=False)
        resp = client.stop_alloc(alloc.id)
        return answer_then_monitor(
            client, args, resp, f'Alloc "{display_id(alloc.id, args)}" is stopping', resp.eval_id
        )


def _print_placement_metrics(alloc: structs_pb2.Allocation) -> None:
    """How the scheduler chose the alloc's node (Nomad's ``alloc status -verbose``)."""
    print("\nPlacement Metrics")
    if not alloc.HasField("metrics"):
        print("  <none: placed before allocations kept their placement metrics>")
        return
    for line in metric_lines(alloc.metrics):
        print(line)
    headers, rows = score_table(alloc.metrics, full_ids=True)
    if rows:
        print()
        print_table(headers, rows)


def _deployment_lines(alloc: structs_pb2.Allocation, args: argparse.Namespace) -> list[tuple[str, str]]:
    """Nomad's "Deployment ID", "Deployment Health" and "Canary" lines, for an alloc of a
    deployment: health is unset until its client has decided."""
    if not alloc.deployment_id:
        return []
    status = alloc.deployment_status
    lines = [
        ("Deployment ID", display_id(alloc.deployment_id, args)),
        ("Deployment Health", status.health or "unset"),
    ]
    if status.canary:
        lines.append(("Canary", "true"))
    return lines


def _reschedule_lines(client: DroverClient, alloc: structs_pb2.Allocation) -> list[tuple[str, str]]:
    """Nomad's "Reschedule Attempts" and "Reschedule Eligibility" lines, where they apply."""
    now = time.time_ns()
    lines = []
    if alloc.reschedule_events or alloc.client_status == "failed":
        try:
            job: structs_pb2.Job | None = client.get_job(alloc.job_id, namespace=alloc.namespace).job
        except DroverError:
            job = None  # purged: the attempts are still worth showing
        lines.append(("Reschedule Attempts", attempts_text(alloc, job, now)))
    when = eligibility_text(client, alloc, now)
    if when is not None:
        lines.append(("Reschedule Eligibility", when))
    return lines
