"""``drover node pool list|info``: the node pools the cluster's nodes are in.

Nomad keeps node pools as objects of their own (with a description, meta and a
scheduler configuration); drover has only what its nodes say: a pool exists while a node
registers in it, and ``default`` and ``all`` always exist (as Nomad's built-in pools).
A job's ``node_pool`` places it on its pool's nodes only; ``all`` means any node.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterable, Sequence
from typing import Final

from drover.cli._args import Subcommands, add_command, display_id, read_flags
from drover.cli._connect import connect
from drover.cli._errors import CLIError
from drover.cli._format import print_kv, print_table
from drover.scheduler.structs import NODE_POOL_ALL, NODE_POOL_DEFAULT
from drover.v1 import structs_pb2

__all__ = ["node_pools", "register_pool"]

_BUILT_IN: Final = {
    NODE_POOL_ALL: "Node pool with all nodes in the cluster.",
    NODE_POOL_DEFAULT: "Default node pool.",
}


def register_pool(nodes: Subcommands) -> None:
    pool = nodes.add_parser("pool", help="list node pools, or show one", allow_abbrev=False)
    group = pool.add_subparsers(dest="node_pool_command", required=True, metavar="SUBCOMMAND")
    p = add_command(group, "list", _cmd_pool_list, "list the node pools and how many nodes each has")
    read_flags(p)
    p = add_command(group, "info", _cmd_pool_info, "show one node pool and its nodes")
    p.add_argument("pool", help="the pool's name")
    read_flags(p)


def node_pools(nodes: Iterable[structs_pb2.Node]) -> dict[str, list[structs_pb2.Node]]:
    """Each pool's nodes (a node naming none is in "default"; "all" holds every node)."""
    pools: dict[str, list[structs_pb2.Node]] = {NODE_POOL_ALL: [], NODE_POOL_DEFAULT: []}
    for node in nodes:
        pools[NODE_POOL_ALL].append(node)
        pools.setdefault(node.node_pool or NODE_POOL_DEFAULT, []).append(node)
    return pools


def _description(name: str) -> str:
    return _BUILT_IN.get(name, "Pool of the nodes registered in it.")


def _cmd_pool_list(args: argparse.Namespace) -> int:
    with connect(args) as client:
        pools = node_pools(client.list_nodes(stale=args.stale).nodes)
    names = sorted(pools)
    if args.json:
        print(
            json.dumps([{"Name": n, "Description": _description(n), "Nodes": len(pools[n])} for n in names])
        )
        return 0
    print_table(["Name", "Nodes", "Description"], [[n, str(len(pools[n])), _description(n)] for n in names])
    return 0


def _cmd_pool_info(args: argparse.Namespace) -> int:
    with connect(args) as client:
        pools = node_pools(client.list_nodes(stale=args.stale).nodes)
    members: Sequence[structs_pb2.Node] | None = pools.get(args.pool)
    if members is None:
        raise CLIError(f"node pool {args.pool[:64]!r} not found (no node is in it)")
    if args.json:
        print(
            json.dumps(
                {"Name": args.pool, "Description": _description(args.pool), "Nodes": [n.id for n in members]}
            )
        )
        return 0
    print_kv([("Name", args.pool), ("Description", _description(args.pool)), ("Nodes", str(len(members)))])
    print()
    print_table(
        ["ID", "Name", "DC", "Status"],
        [
            [display_id(n.id, args), n.name, n.datacenter, n.status]
            for n in sorted(members, key=lambda n: n.name)
        ],
        empty="No nodes",
    )
    return 0
