"""How large a raft frame may be, and how a refused one is reported. Pure: no pysyncobj.

Theory of operation. pysyncobj frames every message as a 4-byte length and a body: the
message pickled (protocol 2), zlib-compressed and, with a cluster key, sealed: with
AES-GCM where the peer offers it (seal.py), otherwise with Fernet (AES-CBC and an HMAC,
base64-encoded; a GCM frame is smaller, so Fernet's size bounds both). Its reader buffers whatever length a peer declares
before it checks anything, so one socket declaring 64 MiB kept a leader's tick thread busy
long enough to depose it. patches.py makes the reader refuse a frame whose declared length
is over a bound, before buffering more of it or decrypting any of it. The bound has to be
above every frame an honest member sends, or a follower would never catch up; this module
derives it from what the largest honest frame can be:

- an entry is at most ``max_entry_bytes`` (``RaftNode`` refuses larger proposals);
- an append_entries batch is cut so the entries' pickled sizes stay within the batch size
  (``batch_length``; pysyncobj's own cut lets the entry that crosses the size ride along,
  so a batch could be the batch size plus one whole entry);
- protocol-2 pickle writes ``bytes`` as latin-1 text in UTF-8: up to two bytes per byte;
- zlib never grows data by more than ``deflate_bound`` says, and Fernet adds a fixed
  header, padding and a third for base64 (``sealed_bound``).

Before a connection's session keys are exchanged (the first frame each way, a random
session key), nothing larger than ``HANDSHAKE_FRAME_BYTES`` is accepted at all: a peer without
the key never gets more than that buffered.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import Final

__all__ = [
    "ENTRY_PICKLE_OVERHEAD",
    "FRAME_HEADROOM",
    "HANDSHAKE_FRAME_BYTES",
    "MESSAGE_OVERHEAD",
    "RejectLog",
    "batch_length",
    "deflate_bound",
    "frame_limit",
    "pickled_bound",
    "sealed_bound",
]

# A sealed session key is ~190 bytes; the margin is for a longer pickle, not for data.
HANDSHAKE_FRAME_BYTES: Final = 4096
# Per entry in a pickled batch: the (command, index, term) tuple, memo and reduce opcodes.
ENTRY_PICKLE_OVERHEAD: Final = 64
# Per message: the dict of term, indexes and type, and the session key it travels with.
MESSAGE_OVERHEAD: Final = 4096
# Room above the largest honest frame, so the bound is never the thing a change trips on.
FRAME_HEADROOM: Final = 2 * 1024 * 1024


def pickled_bound(entry_bytes: int) -> int:
    """The most an entry of ``entry_bytes`` can take in a protocol-2 pickle."""
    return 2 * entry_bytes + ENTRY_PICKLE_OVERHEAD


def batch_length(entry_sizes: Iterable[int], budget: int) -> int:
    """How many leading entries one append_entries message carries: all whose pickled
    sizes fit in ``budget`` together, and always the first (it must go, whatever its size).
    Stops reading ``entry_sizes`` at the first that does not fit."""
    total = 0
    count = 0
    for size in entry_sizes:
        total += pickled_bound(size)
        if total > budget and count:
            break
        count += 1
    return count


def deflate_bound(size: int) -> int:
    """zlib's ``deflateBound`` for its default window and memory level: stored blocks cost
    5 bytes per 16 KiB, plus the stream's header and checksum."""
    return size + (size >> 12) + (size >> 14) + (size >> 25) + 13


def sealed_bound(size: int) -> int:
    """A Fernet token's length for ``size`` bytes of plaintext: version, timestamp, IV,
    AES-CBC with PKCS7 padding and an HMAC-SHA256, then base64 with padding."""
    raw = 1 + 8 + 16 + (size // 16 + 1) * 16 + 32
    return 4 * -(-raw // 3)


def frame_limit(batch_bytes: int, max_entry_bytes: int) -> int:
    """The largest frame length a member accepts once its session is established."""
    plaintext = max(batch_bytes, pickled_bound(max_entry_bytes)) + MESSAGE_OVERHEAD
    return sealed_bound(deflate_bound(plaintext)) + FRAME_HEADROOM


class RejectLog:
    """At most one line per peer per ``window_s``: a peer with the wrong key reconnects
    every half second, and a line each time would bury everything else.

    ``admit`` returns None to stay quiet, or how many rejections went unlogged since the
    peer's last line. Forgets the oldest peers past ``max_peers``, so many source
    addresses cannot grow it without bound.
    """

    def __init__(self, window_s: float = 60.0, max_peers: int = 4096) -> None:
        self._window_s = window_s
        self._max_peers = max_peers
        self._lock = threading.Lock()
        # peer -> (when its last line was logged, rejections since then)
        self._peers: dict[str, tuple[float, int]] = {}

    def admit(self, peer: str, now: float) -> int | None:
        with self._lock:
            seen = self._peers.get(peer)
            if seen is not None and now - seen[0] < self._window_s:
                self._peers[peer] = (seen[0], seen[1] + 1)
                return None
            self._peers.pop(peer, None)
            if len(self._peers) >= self._max_peers:
                del self._peers[next(iter(self._peers))]
            self._peers[peer] = (now, 0)
            return seen[1] if seen is not None else 0
