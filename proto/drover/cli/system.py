"""``drover system``: cluster-wide maintenance (garbage collection, recomputing job summaries)."""

from __future__ import annotations

import argparse

from drover.cli._args import Subcommands, add_command, add_group, conn_flags, flag
from drover.cli._connect import connect
from drover.cli._format import print_json

__all__ = ["register"]


def register(top: Subcommands) -> None:
    system = add_group(top, "system", "cluster-wide maintenance")
    gc = add_command(
        system, "gc", _cmd_gc, "collect every terminal eval, alloc, job, node and deployment now"
    )
    conn_flags(gc)
    flag(gc, "json", action="store_true")
    reconcile = add_group(system, "reconcile", "recompute derived state")
    p = add_command(
        reconcile, "summaries", _cmd_reconcile_summaries, "recompute every job summary and report corrections"
    )
    conn_flags(p)
    flag(p, "json", action="store_true")


def _cmd_gc(args: argparse.Namespace) -> int:
    with connect(args) as client:
        resp = client.garbage_collect()
    if args.json:
        print_json(resp)
        return 0
    print(
        f"Garbage collected at index {resp.meta.index}: {resp.jobs} job(s), {resp.evals} eval(s),"
        f" {resp.allocs} alloc(s), {resp.deployments} deployment(s), {resp.nodes} node(s)"
    )
    return 0


def _cmd_reconcile_summaries(args: argparse.Namespace) -> int:
    with connect(args) as client:
        resp = client.reconcile_summaries()
    if args.json:
        print_json(resp)
        return 0
    if not resp.corrections:
        print(f"Job summaries reconciled at index {resp.meta.index}: all were exact, nothing corrected")
        return 0
    print(f"Job summaries reconciled at index {resp.meta.index}: corrected {len(resp.corrections)} job(s)")
    for correction in resp.corrections:
        print(f'  Job "{correction.job_id}" ({correction.namespace})')
        for change in correction.changes:
            print(f"    {change}")
    return 0
