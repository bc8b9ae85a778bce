"""gRPC options that both ends of a drover connection must agree on.

gRPC refuses a message over 4 MiB by default, on whichever side receives it: a node's or a
job's allocation list, a large plan or a state dump outgrows that, and a limit raised on
one side only fails on the other. So every drover server, client agent, SDK and CLI
channel uses ``MESSAGE_SIZE_OPTIONS``.
"""

from __future__ import annotations

from typing import Final

__all__ = ["MAX_MESSAGE_BYTES", "MESSAGE_SIZE_OPTIONS", "fast_reconnect_options"]

MAX_MESSAGE_BYTES: Final = 64 * 1024 * 1024
MESSAGE_SIZE_OPTIONS: Final[tuple[tuple[str, int], ...]] = (
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
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
