"""``drover agent-info`` (the answering agent's own facts) and ``drover version``."""

from __future__ import annotations

import argparse

from drover.cli._args import Subcommands, add_command, conn_flags, flag
from drover.cli._connect import connect
from drover.cli._format import print_json
from drover.common.version import drover_version

__all__ = ["register", "version_line"]


def version_line() -> str:
    """What ``drover version`` and ``drover -version`` print (Nomad's "Nomad v1.7.2")."""
    return f"drover v{drover_version()}"


def register(top: Subcommands) -> None:
    p = add_command(
        top, "agent-info", _cmd_agent_info, "show the answering agent's version, raft and runtime"
    )
    conn_flags(p)
    flag(p, "json", action="store_true", help="print JSON (proto field names)")
    p = add_command(top, "version", _cmd_version, "print this CLI's version")
    flag(p, "json", action="store_true", help='print {"version": ...}')


def _cmd_agent_info(args: argparse.Namespace) -> int:
    with connect(args) as client:
        resp = client.agent_info()
    if args.json:
        print_json(resp)
        return 0
    # Nomad's layout: a section name, then its values indented, keys sorted.
    for section in resp.sections:
        print(section.name)
        width = max((len(k) for k in section.values), default=0)
        for key in sorted(section.values):
            print(f"  {key.ljust(width)} = {section.values[key]}")
    return 0


def _cmd_version(args: argparse.Namespace) -> int:
    if args.json:
        print_json({"version": drover_version()})
    else:
        print(version_line())
    return 0
