"""``drover eval``: list evaluations and show one with the allocations it created."""

from __future__ import annotations

import argparse

from drover.cli._args import Subcommands, add_command, add_group, display_id, flag, is_verbose, read_flags
from drover.cli._connect import EVALS, connect, find
from drover.cli._format import fmt_time, print_allocs_table, print_json, print_kv, print_table
from drover.cli._placement import failed_group_lines
from drover.v1 import structs_pb2

__all__ = ["register"]


def register(top: Subcommands) -> None:
    evals = add_group(top, "eval", "inspect evaluations")
    p = add_command(evals, "list", _cmd_eval_list, "list evaluations")
    read_flags(p)
    flag(p, "job", default="", help="only this job's evaluations")
    flag(p, "status", default="", help="only evaluations with this status")
    p = add_command(evals, "status", _cmd_eval_status, "show one evaluation and the allocations it created")
    p.add_argument("eval")
    read_flags(p)


def _cmd_eval_list(args: argparse.Namespace) -> int:
    with connect(args) as client:
        evals = client.list_evals(job_id=args.job, status=args.status, stale=args.stale).evals
        if args.json:
            print_json(evals)
            return 0
        rows = [
            [
                display_id(e.id, args),
                str(e.priority),
                e.triggered_by,
                e.job_id,
                display_id(e.node_id, args),
                e.status,
                str(bool(e.failed_tg_allocs)).lower(),
                fmt_time(e.wait_until_ns) if e.wait_until_ns else "-",
            ]
            for e in sorted(evals, key=lambda e: e.create_index, reverse=True)
        ]
        headers = [
            "ID",
            "Priority",
            "Triggered By",
            "Job ID",
            "Node ID",
            "Status",
            "Placement Failures",
            "Wait Until",
        ]
        print_table(headers, rows, empty="No evaluations")
    return 0


def _cmd_eval_status(args: argparse.Namespace) -> int:
    with connect(args) as client:
        ev = find(client, EVALS, args.eval, stale=args.stale)
        allocs: list[structs_pb2.Allocation] = []
        if ev.job_id:
            listing = client.list_allocs(job_id=ev.job_id, namespace=ev.namespace, stale=args.stale)
            allocs = [a for a in listing.allocs if a.eval_id == ev.id]
    if args.json:
        print_json({"eval": ev, "allocations": allocs})
        return 0
    none = "<none>"
    print_kv(
        [
            ("ID", ev.id),
            ("Status", ev.status),
            ("Status Description", ev.status_description or none),
            ("Type", ev.type),
            ("Triggered By", ev.triggered_by),
            ("Job ID", ev.job_id or none),
            ("Namespace", ev.namespace or none),
            ("Node ID", display_id(ev.node_id, args) if ev.node_id else none),
            ("Priority", str(ev.priority)),
            ("Create Time", fmt_time(ev.create_time_ns)),
            ("Modify Time", fmt_time(ev.modify_time_ns)),
            ("Wait Until", fmt_time(ev.wait_until_ns) if ev.wait_until_ns else none),
            ("Previous Eval", display_id(ev.previous_eval, args) if ev.previous_eval else none),
            ("Next Eval", display_id(ev.next_eval, args) if ev.next_eval else none),
            ("Blocked Eval", display_id(ev.blocked_eval, args) if ev.blocked_eval else none),
        ]
    )
    queued = {g: n for g, n in ev.queued_allocations.items() if n > 0}
    if queued:
        print("\nQueued Allocations (could not be placed)")
        print_table(["Task Group", "Queued"], [[g, str(n)] for g, n in sorted(queued.items())])
    if ev.failed_tg_allocs:
        print("\nFailed Placements")
        rows = [[g, reason] for g, reason in sorted(ev.failed_tg_allocs.items())]
        print_table(["Task Group", "Reason"], rows)
    if ev.failed_tg_metrics:
        print()
        for line in failed_group_lines(ev.failed_tg_metrics):
            print(line)
    print("\nAllocations")
    print_allocs_table(allocs, is_verbose(args))
    return 0
