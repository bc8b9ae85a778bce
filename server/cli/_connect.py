"""Reaching the servers: the SDK client built from the connection flags, and finding a
record by a unique prefix of its ID, as Nomad's commands accept one.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Final, TypeVar

import grpc

from server.cli._args import address
from server.cli._errors import CLIError
from server.sdk import DroverClient, DroverError

__all__ = ["UUID_LEN", "connect", "get_by_prefix", "no_unique_match"]

# A reference this long is a whole ID, never a prefix.
UUID_LEN: Final = 36

T = TypeVar("T")


def connect(args: argparse.Namespace) -> DroverClient:
    """A client for ``-address`` (or the environment's), retrying for ``-retry-deadline``."""
    try:
        return DroverClient(address(args), retry_deadline=args.retry_deadline)
    except ValueError as exc:
        raise CLIError(str(exc)) from exc


def get_by_prefix(kind: str, ref: str, get: Callable[[str], T], list_ids: Callable[[], list[str]]) -> T:
    """Get by exact ID, else by the only ID that starts with ``ref``."""
    try:
        return get(ref)
    except DroverError as exc:
        if exc.code != grpc.StatusCode.NOT_FOUND or len(ref) >= UUID_LEN:
            raise
        matches = [i for i in list_ids() if i.startswith(ref)]
        if len(matches) != 1:
            no_unique_match(kind, ref, matches, exc)
        return get(matches[0])


def no_unique_match(kind: str, ref: str, matches: list[str], exc: DroverError | None) -> None:
    if len(matches) > 1:
        shown = ", ".join(sorted(matches)[:5]) + (", ..." if len(matches) > 5 else "")
        raise CLIError(f'prefix "{ref}" matched {len(matches)} {kind}s: {shown}')
    if exc is not None:
        raise exc
    raise CLIError(f'no {kind} matches "{ref}"')
