"""``drover tls``: a private CA and the certificates of servers, client agents and the CLI,
written as PEM files in the current directory (Nomad's ``tls ca create`` / ``tls cert create``).

Files (never overwritten; keys 0600, certificates 0644):

- ``tls ca create``: ``drover-agent-ca.pem`` and ``drover-agent-ca-key.pem``.
- ``tls cert create -server``: ``global-server-drover.pem`` and ``global-server-drover-key.pem``;
  ``-client`` and ``-cli`` the same with their role. The certificate names
  ``<role>.global.drover``; what else it names is in ``drover.common.certs``.

``-json`` prints ``{"cert_file": ..., "key_file": ...}`` and nothing else on stdout.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Final

from drover.cli._args import Subcommands, add_command, add_group, flag
from drover.cli._errors import CLIError
from drover.common.certs import (
    CA_DAYS,
    CA_FILE,
    CA_KEY_FILE,
    CERT_DAYS,
    ROLES,
    CertError,
    Role,
    cert_file_names,
    create_ca,
    create_cert,
    read_pair,
    write_pair,
)

__all__ = ["register"]

_SERVER_WARNING: Final = (
    "A server certificate grants its holder authority to become a server and read all state, "
    "node secrets included: keep its key on the servers only."
)


def register(top: Subcommands) -> None:
    tls = add_group(top, "tls", "make a private CA and the cluster's certificates")
    ca = add_group(tls, "ca", "the certificate authority")
    p = add_command(ca, "create", _cmd_ca_create, f"write {CA_FILE} and {CA_KEY_FILE} here")
    flag(p, "days", type=int, default=CA_DAYS, help=f"validity in days (default {CA_DAYS})")
    flag(p, "json", action="store_true", help='print {"cert_file": ..., "key_file": ...}')
    cert = add_group(tls, "cert", "certificates signed by the CA")
    p = add_command(cert, "create", _cmd_cert_create, "write a server, client or CLI certificate here")
    role = p.add_mutually_exclusive_group(required=True)
    for name in ROLES:
        role.add_argument(f"-{name}", f"--{name}", dest="role", action="store_const", const=name)
    flag(p, "ca", metavar="FILE", default=CA_FILE, help=f"the CA certificate (default {CA_FILE})")
    flag(p, "key", metavar="FILE", default=CA_KEY_FILE, help=f"the CA key (default {CA_KEY_FILE})")
    flag(
        p,
        "additional-dnsname",
        action="append",
        default=[],
        metavar="NAME",
        help="extra DNS SAN (repeatable)",
    )
    flag(
        p, "additional-ipaddress", action="append", default=[], metavar="IP", help="extra IP SAN (repeatable)"
    )
    flag(p, "days", type=int, default=CERT_DAYS, help=f"validity in days (default {CERT_DAYS})")
    flag(p, "json", action="store_true", help='print {"cert_file": ..., "key_file": ...}')


def _cmd_ca_create(args: argparse.Namespace) -> int:
    try:
        write_pair(create_ca(days=args.days), CA_FILE, CA_KEY_FILE)
    except CertError as exc:
        raise CLIError(str(exc)) from exc
    _report(args, "CA certificate", CA_FILE, CA_KEY_FILE)
    return 0


def _cmd_cert_create(args: argparse.Namespace) -> int:
    role: Role = args.role
    cert_file, key_file = cert_file_names(role)
    try:
        ca = read_pair(args.ca, args.key)
        pair = create_cert(
            ca,
            role,
            dns_names=args.additional_dnsname,
            ip_addresses=args.additional_ipaddress,
            days=args.days,
        )
        write_pair(pair, cert_file, key_file)
    except CertError as exc:
        hint = (
            " (make one with: drover tls ca create)"
            if args.ca == CA_FILE and "No such file" in str(exc)
            else ""
        )
        raise CLIError(f"{exc}{hint}") from exc
    if role == "server":
        print(f"WARNING: {_SERVER_WARNING}", file=sys.stderr)
    _report(args, f"{role} certificate", cert_file, key_file, ca=(args.ca, args.key))
    return 0


def _report(
    args: argparse.Namespace, what: str, cert_file: str, key_file: str, ca: tuple[str, str] | None = None
) -> None:
    if args.json:
        print(json.dumps({"cert_file": cert_file, "key_file": key_file}))
        return
    if ca is not None:
        print(f"==> Using CA file {ca[0]} and CA key {ca[1]}")
    print(f"==> {what[:1].upper()}{what[1:]} saved to: {cert_file}")
    print(f"==> {what[:1].upper()}{what[1:]} key saved to: {key_file}")
