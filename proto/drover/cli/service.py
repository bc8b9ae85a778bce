"""``drover service list|info``: native service discovery (``service { provider = "nomad" }``).

A service is registered while an alloc that declares it runs; the servers write and remove
registrations with the alloc (server/services/registrations.py), so what these commands
show is what the allocs say, not what a client last remembered to send. ``info`` shows
each instance's health (its checks' worst status, as its client last reported them);
``-passing`` keeps only the instances a template's ``nomadService`` would be given, and
``-verbose`` adds each instance's checks with their status and output.
"""

from __future__ import annotations

import argparse
import json

from drover.cli._args import Subcommands, add_command, add_group, display_id, flag, read_flags
from drover.cli._connect import connect
from drover.cli._format import message_json, print_kv, print_table

__all__ = ["register"]

_PASSING = "passing"


def register(top: Subcommands) -> None:
    services = add_group(top, "service", "list services registered by running allocs, or show one")
    p = add_command(services, "list", _cmd_list, "list the registered services and their tags")
    read_flags(p)
    flag(
        p,
        "namespace",
        default="",
        help='the namespace ("*": every one the token may read; default "default")',
    )
    p = add_command(services, "info", _cmd_info, "show the registrations of one service")
    p.add_argument("name", help="the service's name")
    read_flags(p)
    flag(p, "namespace", default="", help='the namespace (default "default")')
    flag(p, "passing", action="store_true", help="only the instances whose checks all pass")


def _cmd_list(args: argparse.Namespace) -> int:
    with connect(args) as client:
        services = client.list_services(namespace=args.namespace, stale=args.stale).services
    if args.json:
        print(json.dumps([message_json(s) for s in services]))
        return 0
    print_table(
        ["Service Name", "Namespace", "Registrations", "Passing", "Tags"],
        [
            [s.service_name, s.namespace, str(s.registrations), str(s.passing), ",".join(s.tags)]
            for s in services
        ],
        empty="No services registered",
    )
    return 0


def _cmd_info(args: argparse.Namespace) -> int:
    with connect(args) as client:
        registrations = list(
            client.get_service(args.name, namespace=args.namespace, stale=args.stale).registrations
        )
    if args.passing:
        # "" is a registration written before health was recorded: it had no say, so it passes.
        registrations = [r for r in registrations if r.health in (_PASSING, "")]
    if args.json:
        print(json.dumps([message_json(r) for r in registrations]))
        return 0
    print_kv([("Service Name", args.name), ("Registrations", str(len(registrations)))])
    print()
    print_table(
        ["Job ID", "Alloc ID", "Node ID", "Task", "Address", "Health", "Tags"],
        [
            [
                r.job_id,
                display_id(r.alloc_id, args),
                display_id(r.node_id, args),
                r.task or "-",
                f"{r.address}:{r.port}" if r.port else r.address,
                r.health or _PASSING,
                ",".join(r.tags),
            ]
            for r in registrations
        ],
    )
    if args.verbose:
        for r in registrations:
            if not r.checks:
                continue
            print()
            print(f"Checks of alloc {display_id(r.alloc_id, args)}")
            print_table(
                ["Check", "Status", "Output"],
                [[c.check, c.status, c.output.replace("\n", " ")[:120]] for c in r.checks],
            )
    return 0
