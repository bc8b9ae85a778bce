"""gRPC options that both ends of a drover connection must agree on.

gRPC refuses a message over 4 MiB by default, on whichever side receives it: a node's or a
job's allocation list, a large plan or a state dump outgrows that, and a limit raised on
one side only fails on the other. So every drover server, client agent, SDK and CLI
channel uses ``MESSAGE_SIZE_OPTIONS``.
"""

from __future__ import annotations

from typing import Final

__all__ = [
    "MAX_MESSAGE_BYTES",
    "MAX_REQUEST_BYTES",
    "MESSAGE_SIZE_OPTIONS",
    "SERVER_MESSAGE_SIZE_OPTIONS",
    "fast_reconnect_options",
]

MAX_MESSAGE_BYTES: Final = 64 * 1024 * 1024
MESSAGE_SIZE_OPTIONS: Final[tuple[tuple[str, int], ...]] = (
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
)

# What a server accepts in one request. Answers (a state dump, a node's allocs) may be
# large, but no request needs to be: a job is at most 1 MiB, a client's status batch far
# less. Anyone who reaches the port could otherwise make each of the 256 gRPC threads hold
# 64 MiB. gRPC refuses a larger request itself (RESOURCE_EXHAUSTED, "Received message
# larger than max") before it reaches drover; only ``Operator.SnapshotRestore`` of a state
# over this size is affected, and says so.
MAX_REQUEST_BYTES: Final = 16 * 1024 * 1024
SERVER_MESSAGE_SIZE_OPTIONS: Final[tuple[tuple[str, int], ...]] = (
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_REQUEST_BYTES),
)


def fast_reconnect_options(max_backoff_ms: int) -> tuple[tuple[str, int], ...]:
    """Reconnect within ``max_backoff_ms`` of a server coming back.

    Servers restart on the same port (an upgrade, a crash, a chaos run); grpc's default
    reconnect backoff grows to 120 s, which would keep a cached channel failing fast long
    after its server is back.
    """
    return (
        ("grpc.initial_reconnect_backoff_ms", 100),
        ("grpc.min_reconnect_backoff_ms", 100),
        ("grpc.max_reconnect_backoff_ms", max_backoff_ms),
    )
