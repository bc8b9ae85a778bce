"""``drover acl``: bootstrap, policies and tokens, for servers started with ``-acl-enabled``.

Every command here sends the token of ``-token`` (or ``DROVER_TOKEN``); all but
``bootstrap`` need one, most a management token. A secret is printed only when it is made
(``bootstrap``, ``token create``): the servers keep only its hash and can not show it again.
"""

from __future__ import annotations

import argparse
import sys

from drover.cli._args import Subcommands, add_command, add_group, conn_flags, flag, read_flags
from drover.cli._connect import connect
from drover.cli._errors import CLIError
from drover.cli._format import fmt_time, print_json, print_kv, print_table
from drover.v1 import api_pb2, raft_pb2

__all__ = ["register"]


def register(top: Subcommands) -> None:
    acl = add_group(top, "acl", "ACL bootstrap, policies and tokens")
    p = add_command(acl, "bootstrap", _cmd_bootstrap, "create the first management token (works once)")
    p.add_argument(
        "file",
        nargs="?",
        default="",
        help="a file holding the secret the token gets (a UUID; '-' for stdin); default: a new one",
    )
    conn_flags(p)
    flag(p, "json", action="store_true", help="print the token as JSON (with secret_id)")

    policy = add_group(acl, "policy", "ACL policies")
    p = add_command(
        policy, "apply", _cmd_policy_apply, "create or replace policy NAME with the rules in FILE"
    )
    p.add_argument("name")
    p.add_argument("file", help="policy HCL; '-' for stdin")
    flag(p, "description", default="", help="what the policy is for")
    conn_flags(p)
    p = add_command(policy, "list", _cmd_policy_list, "list policies")
    read_flags(p)
    p = add_command(policy, "info", _cmd_policy_info, "show one policy and its rules")
    p.add_argument("name")
    read_flags(p)
    p = add_command(policy, "delete", _cmd_policy_delete, "delete policy NAME")
    p.add_argument("name")
    conn_flags(p)

    token = add_group(acl, "token", "ACL tokens")
    p = add_command(token, "create", _cmd_token_create, "create a token (its secret is shown only now)")
    flag(p, "name", default="", help="a name for people (at most 256 characters)")
    flag(p, "type", default="client", choices=("client", "management"), help="client (default) or management")
    flag(p, "policy", action="append", default=[], metavar="NAME", help="a policy it holds (repeatable)")
    conn_flags(p)
    flag(p, "json", action="store_true", help="print the token as JSON (with secret_id)")
    p = add_command(token, "list", _cmd_token_list, "list tokens (never their secrets)")
    read_flags(p)
    p = add_command(token, "info", _cmd_token_info, "show one token by accessor ID")
    p.add_argument("accessor_id")
    read_flags(p)
    p = add_command(token, "self", _cmd_token_self, "show the token this command sends")
    read_flags(p)
    p = add_command(token, "delete", _cmd_token_delete, "delete a token by accessor ID: it stops working")
    p.add_argument("accessor_id")
    conn_flags(p)


def _read_text(path: str) -> str:
    try:
        if path == "-":
            return sys.stdin.read()
        with open(path, encoding="utf-8") as fh:
            return fh.read()
    except UnicodeDecodeError as exc:
        raise CLIError(f"{path}: not valid UTF-8 (byte offset {exc.start})") from exc


def _print_token(token: api_pb2.ACLToken) -> None:
    pairs = [("Accessor ID", token.accessor_id)]
    if token.secret_id:
        pairs.append(("Secret ID", token.secret_id))
    pairs += [
        ("Name", token.name),
        ("Type", token.type),
        ("Policies", ", ".join(token.policies) or "n/a"),
        ("Create Time", fmt_time(token.create_time_ns)),
        ("Create Index", str(token.create_index)),
        ("Modify Index", str(token.modify_index)),
    ]
    print_kv(pairs)


def _print_policy(policy: raft_pb2.ACLPolicy) -> None:
    print_kv(
        [
            ("Name", policy.name),
            ("Description", policy.description),
            ("Create Index", str(policy.create_index)),
            ("Modify Index", str(policy.modify_index)),
        ]
    )
    print("\nRules\n")
    print(policy.rules.rstrip("\n"))


def _cmd_bootstrap(args: argparse.Namespace) -> int:
    secret = _read_text(args.file).strip() if args.file else ""
    if args.file and not secret:
        raise CLIError(f"{args.file}: no secret in it")
    with connect(args) as client:
        token = client.acl_bootstrap(bootstrap_secret=secret).token
    if args.json:
        print_json(token)
    else:
        _print_token(token)
    return 0


def _cmd_policy_apply(args: argparse.Namespace) -> int:
    rules = _read_text(args.file)
    with connect(args) as client:
        client.acl_upsert_policy(args.name, rules, description=args.description)
    print(f'Successfully wrote "{args.name}" ACL policy!')
    return 0


def _cmd_policy_list(args: argparse.Namespace) -> int:
    with connect(args) as client:
        policies = client.acl_list_policies(stale=args.stale).policies
    if args.json:
        print_json(policies)
        return 0
    print_table(
        ["Name", "Description"], [[p.name, p.description] for p in policies], empty="No policies found"
    )
    return 0


def _cmd_policy_info(args: argparse.Namespace) -> int:
    with connect(args) as client:
        policy = client.acl_get_policy(args.name, stale=args.stale).policy
    if args.json:
        print_json(policy)
    else:
        _print_policy(policy)
    return 0


def _cmd_policy_delete(args: argparse.Namespace) -> int:
    with connect(args) as client:
        client.acl_delete_policy(args.name)
    print(f'Successfully deleted "{args.name}" ACL policy!')
    return 0


def _cmd_token_create(args: argparse.Namespace) -> int:
    with connect(args) as client:
        token = client.acl_create_token(name=args.name, token_type=args.type, policies=args.policy).token
    if args.json:
        print_json(token)
    else:
        _print_token(token)
    return 0


def _cmd_token_list(args: argparse.Namespace) -> int:
    with connect(args) as client:
        tokens = client.acl_list_tokens(stale=args.stale).tokens
    if args.json:
        print_json(tokens)
        return 0
    rows = [[t.name, t.type, t.accessor_id, ", ".join(t.policies) or "n/a"] for t in tokens]
    print_table(["Name", "Type", "Accessor ID", "Policies"], rows, empty="No tokens found")
    return 0


def _cmd_token_info(args: argparse.Namespace) -> int:
    with connect(args) as client:
        token = client.acl_get_token(args.accessor_id, stale=args.stale).token
    if args.json:
        print_json(token)
    else:
        _print_token(token)
    return 0


def _cmd_token_self(args: argparse.Namespace) -> int:
    with connect(args) as client:
        token = client.acl_token_self(stale=args.stale).token
    if args.json:
        print_json(token)
    else:
        _print_token(token)
    return 0


def _cmd_token_delete(args: argparse.Namespace) -> int:
    with connect(args) as client:
        client.acl_delete_token(args.accessor_id)
    print(f"Token {args.accessor_id} successfully deleted")
    return 0
