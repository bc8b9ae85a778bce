"""``drover node meta apply|read``: a node's dynamic metadata, kept by its client agent.

As Nomad's:

    node meta apply [-node-id ID] [-unset k1,k2] key1=value1 ... keyN=valueN
    node meta read  [-node-id ID] [-json]

The client stores the change, merges it over its config's static meta and registers
again, so the servers and the scheduler see it (``meta.<key>`` in constraints). Without
``-node-id`` the cluster's only node is meant; with several, naming one is required (the
CLI talks to servers, not to a client agent of its own).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from drover.cli._args import Subcommands, add_command, conn_flags, flag
from drover.cli._connect import UUID_LEN, connect, no_unique_match
from drover.cli._errors import CLIError
from drover.cli._format import print_json, print_kv
from drover.sdk import DroverClient

__all__ = ["parse_meta_args", "register_meta"]


def register_meta(nodes: Subcommands) -> None:
    meta = nodes.add_parser("meta", help="read or change a node's dynamic metadata", allow_abbrev=False)
    group = meta.add_subparsers(dest="node_meta_command", required=True, metavar="SUBCOMMAND")
    p = add_command(group, "apply", _cmd_meta_apply, "set or unset dynamic metadata on a node")
    p.add_argument("pairs", nargs="*", metavar="KEY=VALUE", help="keys to set (KEY alone sets it empty)")
    conn_flags(p)
    flag(p, "node-id", default="", metavar="ID", help="the node (ID, unique prefix or name)")
    flag(p, "unset", default="", metavar="K1,K2", help="comma-separated keys to unset")
    flag(p, "json", action="store_true", help="print the node's meta afterwards as JSON")
    p = add_command(group, "read", _cmd_meta_read, "show a node's static, dynamic and merged metadata")
    conn_flags(p)
    flag(p, "node-id", default="", metavar="ID", help="the node (ID, unique prefix or name)")
    flag(p, "json", action="store_true", help="print JSON")


def parse_meta_args(pairs: Sequence[str], unset: str) -> tuple[dict[str, str], list[str]]:
    """``key=value`` arguments and ``-unset a,b`` as (set, unset), as Nomad parses them:
    ``key`` alone sets an empty value; empty names in ``-unset`` are skipped."""
    meta: dict[str, str] = {}
    for pair in pairs:
        key, _, value = pair.partition("=")
        if not key:
            raise CLIError(f"expected KEY=VALUE, got {pair!r}")
        meta[key] = value
    keys = [k for k in unset.split(",") if k]
    both = sorted(set(meta) & set(keys))
    if both:
        raise CLIError(f"{', '.join(both)}: both set and in -unset")
    if not meta and not keys:
        raise CLIError("Must specify -unset or at least 1 key=value pair")
    return meta, keys


def _node_id(client: DroverClient, ref: str) -> str:
    """The node ``ref`` names (full ID, unique prefix or exact name); none: the only node."""
    if len(ref) == UUID_LEN:
        return ref
    nodes = client.list_nodes().nodes
    if not ref:
        if len(nodes) != 1:
            raise CLIError(f"-node-id: required, the cluster has {len(nodes)} nodes")
        return str(nodes[0].id)
    matches = [n.id for n in nodes if n.id.startswith(ref)] or [n.id for n in nodes if n.name == ref]
    if len(matches) != 1:
        no_unique_match("node", ref, matches, None)
    return str(matches[0])


def _print_meta(title: str, meta: dict[str, str]) -> None:
    print(f"{title}:")
    if meta:
        print_kv(sorted(meta.items()))
    else:
        print("<none>")


def _cmd_meta_apply(args: argparse.Namespace) -> int:
    meta, unset = parse_meta_args(args.pairs, args.unset)
    with connect(args) as client:
        response = client.node_meta_apply(_node_id(client, args.node_id), meta, unset=unset)
    if args.json:
        print_json(response)
    return 0


def _cmd_meta_read(args: argparse.Namespace) -> int:
    with connect(args) as client:
        response = client.node_meta_read(_node_id(client, args.node_id))
    if args.json:
        print_json(response)
        return 0
    _print_meta("All Meta", dict(response.meta))
    print()
    _print_meta("Dynamic Meta", dict(response.dynamic))
    print()
    _print_meta("Static Meta", dict(response.static))
    return 0
