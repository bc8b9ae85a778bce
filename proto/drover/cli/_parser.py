"""The whole ``drover`` argument parser: each command group adds its own commands."""

from __future__ import annotations

import argparse

from drover.cli import (
    acl,
    agent,
    alloc,
    deployment,
    event,
    info,
    job,
    node,
    operator,
    server,
    service,
    system,
    tls,
)
from drover.cli import eval as eval_group

__all__ = ["build_parser"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="drover", description="drover cluster scheduler", allow_abbrev=False
    )
    parser.add_argument("-version", "--version", action="version", version=info.version_line())
    top = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    # The order here is the order ``drover -h`` lists the groups in.
    for group in (
        agent,
        job,
        deployment,
        node,
        eval_group,
        alloc,
        service,
        server,
        system,
        operator,
        acl,
        tls,
        info,
    ):
        group.register(top)
    event.register(top)
    return parser
