"""``drover operator``: raft peers, snapshots, per-server state digests and invariant
checks, and offline tools that read a stopped server's raft data."""

from __future__ import annotations

import argparse
import contextlib
import os
from collections.abc import Callable, Sequence
from typing import Final, TypeVar

from google.protobuf.message import DecodeError, Message

from drover.cli import _scheduler_config as scheduler_config
from drover.cli._args import Subcommands, add_command, add_group, address, conn_flags, flag, read_flags
from drover.cli._connect import connect, connect_to
from drover.cli._errors import CLIError, fail
from drover.cli._format import print_json, print_kv, print_table
from drover.sdk import DroverClient, DroverError, parse_addresses
from drover.v1 import api_pb2, raft_pb2

__all__ = ["register"]

_Answer = TypeVar("_Answer", bound=Message)

_RAFT_OFFLINE_EPILOG: Final = """\
Reads the raft journal and snapshot in DIR/raft of a STOPPED server, without contacting any
server. While a server runs on DIR this refuses (the data dir is locked). Replaying uses the
server's own FSM, so the state printed is the state the server had at that index.
"""


_REMOVE_PEER_EPILOG: Final = """\
Forwarded to the leader, which commits the change before answering. The leader itself can
not be removed: run transfer-leadership first. A removed server that still runs is
refused by the others; stop it and wipe its data dir before it joins again (-join).
"""


def register(top: Subcommands) -> None:
    operator = add_group(top, "operator", "cluster operations")
    scheduler_config.register(operator)
    raft = add_group(operator, "raft", "raft peers, and offline tools for a stopped server's raft data")
    p = add_command(raft, "list-peers", _cmd_raft_peers, "list the raft peers")
    read_flags(p)
    p = add_command(
        raft,
        "remove-peer",
        _cmd_raft_remove_peer,
        "remove a server from the raft configuration (a failed host, before its replacement joins)",
        _REMOVE_PEER_EPILOG,
    )
    conn_flags(p)
    flag(p, "peer-address", metavar="HOST:PORT", help="the server's raft address")
    flag(p, "peer-id", metavar="NAME", help="the server's name (as server members lists it)")
    p = add_command(
        raft,
        "transfer-leadership",
        _cmd_raft_transfer_leadership,
        "hand leadership to another server (the one named, or the most caught-up)",
    )
    conn_flags(p)
    flag(p, "peer-id", metavar="NAME", help="the server to lead next (default: the most caught-up)")
    flag(p, "peer-address", metavar="HOST:PORT", help="the same, by raft address")
    p = add_command(
        raft,
        "logs",
        _cmd_raft_logs,
        "print a stopped server's raft log: one JSON object per entry",
        _RAFT_OFFLINE_EPILOG,
    )
    flag(p, "data-dir", required=True, metavar="DIR", help="the server's data dir")
    flag(p, "pretty", action="store_true", help="indent each object (several lines per entry)")
    p = add_command(
        raft,
        "state",
        _cmd_raft_state,
        "print a stopped server's state at a raft index, every table as JSON",
        _RAFT_OFFLINE_EPILOG,
    )
    flag(p, "data-dir", required=True, metavar="DIR", help="the server's data dir")
    flag(
        p,
        "last-index",
        type=int,
        default=None,
        metavar="N",
        help="replay up to raft index N (default: the whole log; negative: N entries before the end)",
    )
    snapshot = add_group(operator, "snapshot", "save and restore the state")
    p = add_command(snapshot, "save", _cmd_snapshot_save, "write the cluster state to FILE")
    p.add_argument("file")
    conn_flags(p)
    flag(p, "stale", action="store_true")
    p = add_command(snapshot, "restore", _cmd_snapshot_restore, "replace the cluster state with FILE")
    p.add_argument("file")
    conn_flags(p)
    p = add_command(
        snapshot, "inspect", _cmd_snapshot_inspect, "show the index, size and tables of a snapshot FILE"
    )
    p.add_argument("file", help="a `snapshot save` file, or a data dir's raft/snapshot.pb")
    flag(p, "json", action="store_true")
    p = add_command(operator, "state", _cmd_operator_state, "state digest of each addressed server")
    conn_flags(p)
    flag(p, "json", action="store_true")
    p = add_command(
        operator,
        "invariants",
        _cmd_operator_invariants,
        "check each addressed server's own state: system allocs per node within count, "
        "job summaries equal to a recount",
    )
    conn_flags(p)
    flag(p, "json", action="store_true")


def peer_state(peer: api_pb2.RaftPeer) -> str:
    """The State column: a peer the answering leader has no connection to is shown as
    unreachable, not as a follower, since nothing says it still follows (a killed server)."""
    if peer.leader:
        return "leader"
    return "follower" if peer.connected else "unreachable"


def _cmd_raft_peers(args: argparse.Namespace) -> int:
    with connect(args) as client:
        resp = client.raft_peers(stale=args.stale)
        if args.json:
            print_json(resp)
            return 0
        rows = [
            [
                p.name,
                p.raft_address,
                p.grpc_address,
                peer_state(p),
                str(p.voter).lower(),
                str(p.connected).lower(),
            ]
            for p in resp.peers
        ]
        print_table(["Node", "Raft Address", "gRPC Address", "State", "Voter", "Connected"], rows)
    return 0


def _named_peer(args: argparse.Namespace, *, required: bool) -> tuple[str, str]:
    """(raft address, server name) of the peer the command names: by one of -peer-address
    and -peer-id, never both; with ``required`` false, neither leaves the choice to raft."""
    peer_address: str = args.peer_address or ""
    peer_id: str = args.peer_id or ""
    if (peer_address and peer_id) or (required and not (peer_address or peer_id)):
        raise CLIError(f"give {'exactly' if required else 'at most'} one of -peer-address and -peer-id")
    return peer_address, peer_id


def _cmd_raft_remove_peer(args: argparse.Namespace) -> int:
    peer_address, peer_id = _named_peer(args, required=True)
    with connect(args) as client:
        resp = client.raft_remove_peer(raft_address=peer_address, name=peer_id)
    print(
        f"Removed peer {peer_id or resp.raft_address} ({resp.raft_address}) at raft index {resp.meta.index}"
    )
    return 0


def _cmd_raft_transfer_leadership(args: argparse.Namespace) -> int:
    peer_address, peer_id = _named_peer(args, required=False)
    with connect(args) as client:
        resp = client.raft_transfer_leadership(raft_address=peer_address, name=peer_id)
    print(
        f"Leadership transferred to {resp.leader_name or resp.leader_raft_address} ({resp.leader_raft_address})"
    )
    return 0


def _cmd_snapshot_save(args: argparse.Namespace) -> int:
    path: str = args.file
    with connect(args) as client:
        resp = client.snapshot_save(stale=args.stale)
    data = resp.snapshot.SerializeToString()
    _write_file_atomically(path, data)
    print(f"State file written to {path} (index {resp.snapshot.index}, {len(data)} bytes)")
    return 0


def _write_file_atomically(path: str, data: bytes) -> None:
    """Write beside the target and rename, so a failed save never leaves a truncated file;
    the file is its owner's alone (0600).

    Only for regular files: renaming over a device or a FIFO (``/dev/stdout``) would replace
    the device node itself, so those are written in place.
    """
    if os.path.exists(path) and not os.path.isfile(path):
        with open(path, "wb") as fh:
            fh.write(data)
        return
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        # The whole cluster state: 0600 whatever the umask.
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as fh:
            os.fchmod(fd, 0o600)
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def _cmd_snapshot_restore(args: argparse.Namespace) -> int:
    with open(args.file, "rb") as fh:
        data = fh.read()
    snapshot = raft_pb2.StateSnapshot()
    try:
        snapshot.ParseFromString(data)
    except DecodeError as exc:
        raise CLIError(f"{args.file}: not a drover snapshot ({exc})") from exc
    with connect(args) as client:
        resp = client.snapshot_restore(snapshot)
    print(
        f"Snapshot restored from {args.file} (snapshot index {snapshot.index}, raft index {resp.meta.index})"
    )
    return 0


def _offline(fn: Callable[[], int]) -> int:
    """Run an offline tool: its errors are one-line CLI errors; logs go to stderr."""
    from drover.common.logs import configure_logging
    from drover.server.raft_tools import OfflineError

    configure_logging(level="error")
    try:
        return fn()
    except OfflineError as exc:
        raise CLIError(str(exc)) from exc


def _cmd_raft_logs(args: argparse.Namespace) -> int:
    import json

    from drover.server.raft_tools import log_entries, open_data_dir

    def run() -> int:
        with open_data_dir(args.data_dir) as data:
            for entry in log_entries(data):
                print(json.dumps(entry, indent=2 if args.pretty else None, sort_keys=False))
        return 0

    return _offline(run)


def _cmd_raft_state(args: argparse.Namespace) -> int:
    import json

    from drover.server.raft_tools import open_data_dir, state_json

    def run() -> int:
        with open_data_dir(args.data_dir) as data:
            doc = state_json(data, args.last_index)
        print(json.dumps(doc, indent=2))
        return 0

    return _offline(run)


def _cmd_snapshot_inspect(args: argparse.Namespace) -> int:
    import json

    from drover.server.raft_tools import inspect_snapshot

    def run() -> int:
        info = inspect_snapshot(args.file)
        if args.json:
            print(json.dumps(info, indent=2))
            return 0
        pairs = [("File", info["file"]), ("Format", info["format"]), ("Index", str(info["index"]))]
        if "last_entry" in info:
            pairs.append(
                ("Raft Last Entry", f"index {info['last_entry']['index']}, term {info['last_entry']['term']}")
            )
        pairs.append(("Size", f"{info['size']} bytes"))
        print_kv(pairs)
        print()
        tables = sorted(info["tables"], key=lambda t: (-t["size"], t["name"]))
        rows = [[t["name"], str(t["count"]), str(t["size"])] for t in tables]
        rows.append(["Total", str(sum(t["count"] for t in tables)), str(sum(t["size"] for t in tables))])
        print_table(["Table", "Count", "Size"], rows)
        return 0

    return _offline(run)


def _cmd_operator_state(args: argparse.Namespace) -> int:
    """Ask each addressed server for its own digest (StateDigest is never forwarded)."""
    addresses = parse_addresses(address(args))
    if len(addresses) == 1:
        with connect(args) as client:
            resp = client.state_digest()
        if args.json:
            print_json(resp)
        else:
            print_kv(
                [
                    ("Server", resp.server),
                    ("Leader", str(resp.leader).lower()),
                    ("Term", str(resp.term)),
                    ("Applied Index", str(resp.applied_index)),
                    ("Commit Index", str(resp.commit_index)),
                    ("Digest", resp.digest),
                ]
            )
        return 0
    answers = _ask_each(addresses, args, lambda client: client.state_digest())
    if args.json:
        _print_answers_json(answers)
    else:
        rows = [
            [
                addr,
                a.server,
                str(a.leader).lower(),
                str(a.term),
                str(a.applied_index),
                str(a.commit_index),
                a.digest,
            ]
            if isinstance(a, api_pb2.StateDigestResponse)
            else [addr, "-", "-", "-", "-", "-", f"ERROR: {a}"]
            for addr, a in answers
        ]
        print_table(["Address", "Server", "Leader", "Term", "Applied", "Commit", "Digest"], rows)
    return _fail_unanswered(answers)


# What every server checks over its own state (server/invariants.py), named as its violations
# are; docs/design.md#invariant-1 and #invariant-2 state them.
_INVARIANTS_CHECKED: Final = (
    "Each server checks its own state (docs/design.md, invariants 1 and 2):\n"
    "  system-allocs-per-node: at most count live, desired-running allocs per system or sysbatch"
    " job, group and node\n"
    "  job-summaries: every job summary counter equals a recount of its allocs and child jobs,"
    " and none is negative"
)


def _cmd_operator_invariants(args: argparse.Namespace) -> int:
    """Ask each addressed server to check its own state (Invariants is never forwarded);
    exit 1 when any reports a violation or does not answer."""
    answers = _ask_each(parse_addresses(address(args)), args, lambda client: client.invariants())
    violations = sum(len(a.violations) for _, a in answers if isinstance(a, api_pb2.InvariantsResponse))
    if args.json:
        _print_answers_json(answers)
    else:
        print(_INVARIANTS_CHECKED)
        for addr, a in answers:
            if isinstance(a, DroverError):
                print(f"{addr}: ERROR: {a}")
                continue
            verdict = f"{len(a.violations)} violation(s)" if a.violations else "no violations"
            print(f"{a.server} ({addr}) at index {a.index}: {verdict}")
            for violation in a.violations:
                print(f"  {violation}")
    return _fail_unanswered(answers) or (1 if violations else 0)


def _ask_each(
    addresses: Sequence[str], args: argparse.Namespace, ask: Callable[[DroverClient], _Answer]
) -> list[tuple[str, _Answer | DroverError]]:
    """Ask every server itself, in address order (these RPCs are never forwarded): one that
    does not answer gets an error in its row instead of failing the whole command."""
    answers: list[tuple[str, _Answer | DroverError]] = []
    for addr in addresses:
        with connect_to(args, addr) as client:
            try:
                answers.append((addr, ask(client)))
            except DroverError as exc:
                answers.append((addr, exc))
    return answers


def _print_answers_json(answers: Sequence[tuple[str, Message | DroverError]]) -> None:
    print_json([a if isinstance(a, Message) else {"address": addr, "error": str(a)} for addr, a in answers])


def _fail_unanswered(answers: Sequence[tuple[str, Message | DroverError]]) -> int:
    """Exit status 1 with an ``Error:`` line when any server did not answer, else 0."""
    failed = sum(isinstance(a, DroverError) for _, a in answers)
    if failed:
        return fail(f"{failed} of {len(answers)} servers did not answer")
    return 0
