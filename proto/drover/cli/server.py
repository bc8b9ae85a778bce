"""``drover server members``: every server of the cluster as the answering server sees it."""

from __future__ import annotations

import argparse

from drover.cli._args import Subcommands, add_command, add_group, conn_flags, flag
from drover.cli._connect import connect
from drover.cli._format import print_json, print_table

__all__ = ["register"]

_MEMBERS_EPILOG = """\
Status is "alive" if the server answered a probe from the server asked (within a second),
"failed" if not, "left" if it is no longer in the raft configuration (operator raft
remove-peer, or autopilot). Answered by the first server that answers, from its own view (no leader
needed). Columns: Name, Address (gRPC), Raft Address, Status, Leader, Applied Index, Version.
"""


def register(top: Subcommands) -> None:
    servers = add_group(top, "server", "the cluster's servers")
    p = add_command(
        servers, "members", _cmd_members, "list the servers and whether each answers", _MEMBERS_EPILOG
    )
    conn_flags(p)
    flag(p, "json", action="store_true", help="print JSON (proto field names)")


def _cmd_members(args: argparse.Namespace) -> int:
    with connect(args) as client:
        resp = client.server_members()
    if args.json:
        print_json(resp)
        return 0
    rows = [
        [
            m.name,
            m.grpc_address,
            m.raft_address,
            m.status,
            "true" if m.leader else "false",
            str(m.raft_applied_index) if m.raft_applied_index else "-",
            m.version or "-",
        ]
        for m in resp.members
    ]
    print_table(
        ["Name", "Address", "Raft Address", "Status", "Leader", "Applied Index", "Version"],
        rows,
        empty="No servers known",
    )
    return 0
