"""Argument parsing shared by every command group: the flag spellings, the common flag
sets, adding commands and groups, and reading the flags every command has.

Flags are Nomad-style single-dash words (``-address``); :func:`flag` adds the double-dash
spelling too, so both work, as does ``-flag=value``.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from typing import Any, Final, TypeAlias

from drover.cli._errors import CLIError, Handler
from drover.cli._format import short_id
from drover.common.secrets import TOKEN_ENV
from drover.common.tls import CA_ENV, CERT_ENV, KEY_ENV, TLSFiles, files_from_env
from drover.sdk import DEFAULT_CONNECT_TIMEOUT_S

__all__ = [
    "ADDRESS_ENV",
    "DEFAULT_ADDRESS",
    "DEFAULT_MONITOR_TIMEOUT_S",
    "Subcommands",
    "acl_token",
    "add_command",
    "add_group",
    "address",
    "client_tls",
    "conn_flags",
    "display_id",
    "flag",
    "is_verbose",
    "parse_meta",
    "read_flags",
    "write_flags",
]

DEFAULT_ADDRESS: Final = "127.0.0.1:4646"
ADDRESS_ENV: Final = "DROVER_ADDR"
DEFAULT_MONITOR_TIMEOUT_S: Final = 60.0

Subcommands: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"


def add_command(
    group: Subcommands, name: str, handler: Handler, help_: str, epilog: str | None = None
) -> argparse.ArgumentParser:
    """A command whose ``-h`` shows ``epilog`` as written (exit statuses, tables)."""
    p: argparse.ArgumentParser = group.add_parser(
        name,
        help=help_,
        description=help_[:1].upper() + help_[1:] + "." if epilog else None,
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    p.set_defaults(handler=handler)
    return p


def add_group(parent: Subcommands, name: str, help_: str) -> Subcommands:
    """A group (``job``, ``operator raft``): it needs a subcommand to do anything."""
    p = parent.add_parser(name, help=help_, allow_abbrev=False)
    return p.add_subparsers(dest=f"{name}_command", required=True, metavar="SUBCOMMAND")


def flag(parser: argparse.ArgumentParser, name: str, **kwargs: Any) -> None:
    """Add ``-name`` and ``--name``; the dest is the snake_case name."""
    parser.add_argument(f"-{name}", f"--{name}", dest=name.replace("-", "_"), **kwargs)


def conn_flags(p: argparse.ArgumentParser) -> None:
    flag(
        p,
        "address",
        metavar="ADDR",
        help=f"server gRPC address(es), comma-separated (env {ADDRESS_ENV}, default {DEFAULT_ADDRESS})",
    )
    flag(
        p,
        "retry-deadline",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="keep retrying while the servers have no leader (an election, a restart) for this long",
    )
    flag(
        p,
        "connect-timeout",
        type=float,
        default=DEFAULT_CONNECT_TIMEOUT_S,
        metavar="SECONDS",
        help="give up after this long when no server at the address(es) answers at all",
    )
    flag(p, "token", metavar="SECRET", help=f"ACL token secret, for servers with ACLs on (env {TOKEN_ENV})")
    # A CA means TLS to the same addresses; the cert and key when the servers verify clients.
    flag(p, "ca-cert", metavar="FILE", help=f"CA that signs the servers' certificates (env {CA_ENV})")
    flag(p, "client-cert", metavar="FILE", help=f"certificate to present to the servers (env {CERT_ENV})")
    flag(p, "client-key", metavar="FILE", help=f"the client certificate's private key (env {KEY_ENV})")


def read_flags(p: argparse.ArgumentParser) -> None:
    conn_flags(p)
    flag(p, "stale", action="store_true", help="let any server answer from its own state")
    flag(p, "json", action="store_true", help="print JSON (proto field names)")
    flag(p, "verbose", action="store_true", help="print full IDs")


def write_flags(p: argparse.ArgumentParser, *, monitor: bool = False) -> None:
    conn_flags(p)
    flag(p, "json", action="store_true", help="print the response as JSON (implies -detach)")
    flag(p, "verbose", action="store_true", help="print full IDs")
    if monitor:
        flag(p, "detach", action="store_true", help="return after registering, do not monitor")
        flag(
            p,
            "monitor-timeout",
            type=float,
            default=DEFAULT_MONITOR_TIMEOUT_S,
            metavar="SECONDS",
            help=f"stop monitoring the evaluation after this long (default {DEFAULT_MONITOR_TIMEOUT_S:g})",
        )


def parse_meta(pairs: Sequence[str]) -> dict[str, str]:
    """``-meta KEY=VALUE`` flags (agent and job dispatch) as a dict; the last repeat wins."""
    out: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise CLIError(f"flag -meta: expected KEY=VALUE, got {pair!r}")
        out[key] = value
    return out


def address(args: argparse.Namespace) -> str:
    given: str | None = args.address
    return given or os.environ.get(ADDRESS_ENV) or DEFAULT_ADDRESS


def client_tls(args: argparse.Namespace) -> TLSFiles | None:
    """The TLS files from ``-ca-cert``/``-client-cert``/``-client-key`` or the environment."""
    return files_from_env(os.environ, args.ca_cert, args.client_cert, args.client_key)


def acl_token(args: argparse.Namespace) -> str | None:
    """The ACL token from ``-token`` or the environment; None for none."""
    given: str | None = getattr(args, "token", None)
    return given or os.environ.get(TOKEN_ENV) or None


def is_verbose(args: argparse.Namespace) -> bool:
    """Commands without ``-verbose`` show short IDs."""
    verbose: bool = getattr(args, "verbose", False)
    return verbose


def display_id(value: str, args: argparse.Namespace) -> str:
    return short_id(value, is_verbose(args))
