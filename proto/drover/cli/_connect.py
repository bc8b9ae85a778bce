"""Reaching the servers: the SDK client built from the connection flags, and finding a
record by a unique prefix of its ID, as Nomad's commands accept one.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, Generic, NoReturn, TypeVar

import grpc

from drover.cli._args import acl_token, address, client_tls
from drover.cli._errors import CLIError
from drover.sdk import DroverClient, DroverError
from drover.v1 import structs_pb2

__all__ = ["ALLOCS", "EVALS", "UUID_LEN", "RecordKind", "connect", "connect_to", "find", "no_unique_match"]

# A reference this long is a whole ID, never a prefix.
UUID_LEN: Final = 36

T = TypeVar("T")


def connect(args: argparse.Namespace) -> DroverClient:
    """A client for ``-address`` (or the environment's): it gives up after
    ``-connect-timeout`` when nothing there answers, and retries an answering cluster
    without a leader for ``-retry-deadline``."""
    return connect_to(args, address(args))


def connect_to(args: argparse.Namespace, addresses: str) -> DroverClient:
    """A client for ``addresses`` with every other connection flag (TLS, ACL token) of ``args``:
    the one place the CLI builds a client, so no command can forget one."""
    try:
        return DroverClient(
            addresses,
            retry_deadline=args.retry_deadline,
            connect_timeout=args.connect_timeout,
            tls=client_tls(args),
            token=acl_token(args),
        )
    except ValueError as exc:
        raise CLIError(str(exc)) from exc


def no_unique_match(kind: str, ref: str, matches: list[str], exc: DroverError | None) -> NoReturn:
    """Raise why ``ref`` named no one record: several matches, or else the lookup's own
    error (``exc``) when there is one, so a NOT_FOUND from the server reads as it did."""
    if len(matches) > 1:
        shown = ", ".join(sorted(matches)[:5]) + (", ..." if len(matches) > 5 else "")
        raise CLIError(f'prefix "{ref}" matched {len(matches)} {kind}s: {shown}')
    if exc is not None:
        raise exc
    raise CLIError(f'no {kind} matches "{ref}"')


@dataclass(frozen=True)
class RecordKind(Generic[T]):
    """A kind of record :func:`find` looks up: its name in messages, how to get one by ID
    and how to list every ID (``stale``: any server may answer from its own state)."""

    name: str
    get: Callable[[DroverClient, str, bool], T]
    list_ids: Callable[[DroverClient, bool], list[str]]


EVALS: Final[RecordKind[structs_pb2.Evaluation]] = RecordKind(
    "evaluation",
    lambda client, eval_id, stale: client.get_eval(eval_id, stale=stale).eval,
    lambda client, stale: [e.id for e in client.list_evals(stale=stale).evals],
)
ALLOCS: Final[RecordKind[structs_pb2.Allocation]] = RecordKind(
    "allocation",
    lambda client, alloc_id, stale: client.get_alloc(alloc_id, stale=stale).alloc,
    lambda client, stale: [a.id for a in client.list_allocs(stale=stale).allocs],
)


def find(client: DroverClient, kind: RecordKind[T], ref: str, *, stale: bool) -> T:
    """The record with ID ``ref``, else the only one whose ID starts with ``ref``."""
    try:
        return kind.get(client, ref, stale)
    except DroverError as exc:
        if exc.code != grpc.StatusCode.NOT_FOUND or len(ref) >= UUID_LEN:
            raise
        matches = [i for i in kind.list_ids(client, stale) if i.startswith(ref)]
        if len(matches) != 1:
            no_unique_match(kind.name, ref, matches, exc)
        return kind.get(client, matches[0], stale)
