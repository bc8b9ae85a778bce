"""``drover node``: list and show client nodes, drain them, and toggle their eligibility."""

from __future__ import annotations

import argparse
import sys
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
from drover.cli._connect import UUID_LEN, connect, no_unique_match
from drover.cli._drain import follow_drain
from drover.cli._errors import CLIError
from drover.cli._format import (
    fmt_duration,
    fmt_time,
    parse_duration_ns,
    print_allocs_table,
    print_json,
    print_kv,
    print_table,
)
from drover.cli._node_meta import register_meta
from drover.cli.node_pool import register_pool
from drover.sdk import DroverClient
from drover.v1 import structs_pb2

__all__ = ["register"]

# The server rejects negative drain deadlines, so "-force" is the smallest positive one:
# the force deadline has passed as soon as the drain starts.
_FORCE_DRAIN_DEADLINE_NS: Final = 1
_NODE_EVENTS_SHOWN: Final = 10


def register(top: Subcommands) -> None:
    nodes = add_group(top, "node", "inspect and drain client nodes")
    p = add_command(nodes, "status", _cmd_node_status, "list nodes, or show one node")
    p.add_argument("node", nargs="?")
    read_flags(p)
    p = add_command(nodes, "drain", _cmd_node_drain, "start or stop draining a node")
    p.add_argument("node", help="node ID, unique ID prefix, or node name")
    write_flags(p)
    _enable_or_disable(p)
    flag(p, "deadline", metavar="DURATION", help="drain deadline, e.g. 30m, 1h (default 1h)")
    flag(p, "no-deadline", action="store_true", help="no deadline: wait for allocs to migrate")
    flag(p, "force", action="store_true", help="stop all allocs at once")
    flag(p, "ignore-system", action="store_true", help="leave system job allocs running")
    flag(p, "keep-ineligible", action="store_true", help="with -disable: keep the node ineligible")
    flag(p, "detach", action="store_true", help="return once the drain is set; do not follow it")
    flag(p, "yes", action="store_true", help="do not ask for confirmation (asked only on a terminal)")
    p = add_command(nodes, "eligibility", _cmd_node_eligibility, "toggle a node's scheduling eligibility")
    p.add_argument("node", help="node ID, unique ID prefix, or node name")
    write_flags(p)
    _enable_or_disable(p)
    register_meta(nodes)
    register_pool(nodes)


def _enable_or_disable(p: argparse.ArgumentParser) -> None:
    """Exactly one of ``-enable`` / ``-disable``, read as ``args.enable``."""
    toggle = p.add_mutually_exclusive_group(required=True)
    toggle.add_argument("-enable", "--enable", dest="enable", action="store_const", const=True)
    toggle.add_argument("-disable", "--disable", dest="enable", action="store_const", const=False)


def _cmd_node_status(args: argparse.Namespace) -> int:
    with connect(args) as client:
        if not args.node:
            nodes = client.list_nodes(stale=args.stale).nodes
            if args.json:
                for n in nodes:
                    n.ClearField("secret_id")
                print_json(nodes)
                return 0
            rows = [
                [
                    display_id(n.id, args),
                    n.datacenter,
                    n.name,
                    n.node_class or "<none>",
                    str(n.HasField("drain_strategy")).lower(),
                    n.scheduling_eligibility,
                    n.status,
                ]
                for n in sorted(nodes, key=lambda n: (n.name, n.id))
            ]
            print_table(
                ["ID", "DC", "Name", "Class", "Drain", "Eligibility", "Status"], rows, empty="No nodes"
            )
            return 0
        node = client.get_node(_resolve_node(client, args.node, args.stale), stale=args.stale).node
        allocs = client.list_allocs(node_id=node.id, stale=args.stale).allocs
        if args.json:
            # The secret authenticates the node's client agent: never print it.
            node.ClearField("secret_id")
            print_json({"node": node, "allocations": allocs})
            return 0
        drain = "false"
        if node.HasField("drain_strategy"):
            ds = node.drain_strategy
            drain = f"true; deadline {_drain_deadline(ds.deadline_ns)}"
            if ds.force_deadline_at_ns:
                drain += f" (at {fmt_time(ds.force_deadline_at_ns)})"
        res = node.resources
        print_kv(
            [
                ("ID", node.id),
                ("Name", node.name),
                ("Class", node.node_class or "<none>"),
                ("DC", node.datacenter),
                ("Address", node.address),
                ("Drain", drain),
                ("Eligibility", node.scheduling_eligibility),
                ("Status", node.status),
                ("Status Description", node.status_description or "<none>"),
                ("Status Updated", fmt_time(node.status_updated_at_ns)),
                ("Resources", f"cpu {res.cpu_mhz} MHz, memory {res.memory_mb} MiB, disk {res.disk_mb} MiB"),
            ]
        )
        print("\nNode Events")
        events = sorted(node.events, key=lambda e: (e.timestamp_ns, e.create_index), reverse=True)
        shown = events if args.verbose else events[:_NODE_EVENTS_SHOWN]
        rows = [[fmt_time(e.timestamp_ns), e.subsystem, e.message] for e in shown]
        print_table(["Time", "Subsystem", "Message"], rows, empty="No events")
        if len(shown) < len(events):
            print(f"({len(events) - len(shown)} older events not shown; -verbose shows all)")
        print("\nAllocations")
        print_allocs_table(allocs, is_verbose(args))
    return 0


def _cmd_node_drain(args: argparse.Namespace) -> int:
    strategy: structs_pb2.DrainStrategy | None = None
    if args.enable:
        if args.keep_ineligible:
            raise CLIError("-keep-ineligible only applies with -disable")
        chosen = [
            f
            for f, on in (
                ("-deadline", args.deadline is not None),
                ("-no-deadline", args.no_deadline),
                ("-force", args.force),
            )
            if on
        ]
        if len(chosen) > 1:
            raise CLIError(f"{' and '.join(chosen)} can not be combined")
        if args.force:
            deadline_ns = _FORCE_DRAIN_DEADLINE_NS
        elif args.no_deadline:
            deadline_ns = 0
        else:
            deadline_ns = parse_duration_ns(args.deadline or "1h")
            if deadline_ns <= 0:
                raise CLIError(
                    f'-deadline must be positive, got "{args.deadline}" (see -no-deadline, -force)'
                )
        strategy = structs_pb2.DrainStrategy(deadline_ns=deadline_ns, ignore_system_jobs=args.ignore_system)
    else:
        unused = [
            f
            for f, on in (
                ("-deadline", args.deadline is not None),
                ("-no-deadline", args.no_deadline),
                ("-force", args.force),
                ("-ignore-system", args.ignore_system),
                ("-detach", args.detach),
            )
            if on
        ]
        if unused:
            raise CLIError(f"{', '.join(unused)} only appl{'ies' if len(unused) == 1 else 'y'} with -enable")
    with connect(args) as client:
        node_id = _resolve_node(client, args.node, False)
        if not _confirmed(args, node_id):
            print("Cancelled: the node is unchanged")
            return 1
        if strategy is not None:
            resp = client.update_drain(node_id, strategy)
        else:
            resp = client.update_drain(node_id, None, mark_eligible=not args.keep_ineligible)
        if args.json:
            print_json(resp)
            return 0
        if strategy is None:
            still = " (still ineligible for scheduling)" if args.keep_ineligible else ""
            print(f'Node "{display_id(node_id, args)}" drain strategy unset{still}')
        else:
            print(
                f'Node "{display_id(node_id, args)}" drain strategy set'
                f" (deadline {_drain_deadline(strategy.deadline_ns)});"
                " the node is ineligible for scheduling until the drain is disabled"
            )
        if resp.eval_ids:
            print(f"Evaluations created: {', '.join(display_id(e, args) for e in resp.eval_ids)}")
        if strategy is not None and not args.detach:
            return follow_drain(client, args, node_id)
    return 0


def _confirmed(args: argparse.Namespace, node_id: str) -> bool:
    """Nomad's "Are you sure?" before a drain changes, asked only of a person at a terminal:
    scripts (no terminal on stdin) and ``-yes`` go ahead."""
    if args.yes or not sys.stdin.isatty():
        return True
    what = "enable" if args.enable else "disable"
    try:
        answer = input(
            f'Are you sure you want to {what} drain mode for node "{display_id(node_id, args)}"? [y/N] '
        )
    except EOFError:
        return False
    return answer.strip().lower() in ("y", "yes")


def _drain_deadline(deadline_ns: int) -> str:
    if deadline_ns < 0 or deadline_ns == _FORCE_DRAIN_DEADLINE_NS:
        return "force"
    return fmt_duration(deadline_ns)


def _cmd_node_eligibility(args: argparse.Namespace) -> int:
    eligibility = "eligible" if args.enable else "ineligible"
    with connect(args) as client:
        node_id = _resolve_node(client, args.node, False)
        resp = client.update_eligibility(node_id, eligibility)
        if args.json:
            print_json(resp)
            return 0
        print(f'Node "{display_id(node_id, args)}" scheduling eligibility set: {eligibility} for scheduling')
    return 0


def _resolve_node(client: DroverClient, ref: str, stale: bool) -> str:
    """A node ID from a full ID, a unique ID prefix or an exact node name."""
    if len(ref) == UUID_LEN:
        return ref
    nodes = client.list_nodes(stale=stale).nodes
    matches = [n.id for n in nodes if n.id.startswith(ref)] or [n.id for n in nodes if n.name == ref]
    if len(matches) != 1:
        no_unique_match("node", ref, matches, None)
    return matches[0]
