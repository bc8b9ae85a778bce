"""``drover alloc``: show one allocation, its task states and status history."""

from __future__ import annotations

import argparse

from server.cli._args import (
    Subcommands,
    add_command,
    add_group,
    display_id,
    read_flags,
)
from server.cli._connect import connect, get_by_prefix
from server.cli._format import (
    fmt_time,
    print_json,
    print_kv,
    print_table,
)

__all__ = ["register"]


def register(top: Subcommands) -> None:
    allocs = add_group(top, "alloc", "inspect allocations")
    p = add_command(allocs, "status", _cmd_alloc_status, "show one allocation")
    p.add_argument("alloc")
    read_flags(p)


def _cmd_alloc_status(args: argparse.Namespace) -> int:
    with connect(args) as client:
        alloc = get_by_prefix(
            "allocation",
            args.alloc,
            lambda i: client.get_alloc(i, stale=args.stale).alloc,
            lambda: [a.id for a in client.list_allocs(stale=args.stale).allocs],
        )
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
            ]
        )
        for name, state in sorted(alloc.task_states.items()):
            print(f'\nTask "{name}" is "{state.state}"' + (" (failed)" if state.failed else ""))
            print(
                f"Restarts: {state.restarts}  Started: {fmt_time(state.started_at_ns) or '-'}"
                f"  Finished: {fmt_time(state.finished_at_ns) or '-'}"
            )
            rows = [[fmt_time(e.time_ns), e.type, e.message] for e in state.events]
            print_table(["Time", "Type", "Description"], rows, empty="No events")
        if alloc.state_history:
            print("\nClient Status History")
            rows = [[fmt_time(c.time_ns), c.field, c.value] for c in alloc.state_history]
            print_table(["Time", "Field", "Value"], rows)
    return 0
