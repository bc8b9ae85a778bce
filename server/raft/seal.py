"""The raft transport's seal: AES-256-GCM per session, offered in the key exchange.

Why
---
pysyncobj seals every frame with Fernet (AES-128-CBC, HMAC-SHA256 and base64, each a
Python-level step). At one writer that was about a quarter of raft's tick thread, the
thread every entry goes through (the foundation benchmark's profile,
tests/bench/foundation.py). AES-GCM seals and authenticates in one call.

Theory of operation
-------------------
*Offer.* pysyncobj's key exchange has each side of a connection send a fresh random
session key, sealed with Fernet, and the other side repeat it inside every later frame.
A drover node makes its session key ``SESSION_KEY_BYTES`` random bytes followed by
``OFFER``. A node of a release before this one takes the longer key as it is, repeats it,
and goes on with Fernet; a node that received a key ending in ``OFFER`` seals for it with
GCM. Every node opens both, so a rolling upgrade mixes releases without a partition.

*Keys.* The cluster's GCM key is derived from the raft key (PBKDF2-SHA256, as pysyncobj
derives its Fernet key, under a salt of its own). Each direction of each connection then
has a key of its own: HKDF of the cluster key over the receiving side's session key (the
one the sender repeats), so nothing sealed for one session opens in another.

*Nonces.* Each sealed frame carries its sender's counter (8 bytes, from 1); the nonce is
that counter, so it never repeats under one key, and the receiver refuses a counter not
above the last it took, as it refused an older Fernet timestamp (replay, reorder).

*Frame.* ``MAGIC``, the counter, then ciphertext and tag. A Fernet token is base64 and
starts with ``g`` (its version byte 0x80), so the first byte tells the two apart.
"""

from __future__ import annotations

import functools
import struct
from typing import Any, Final

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from cryptography.hazmat.primitives.kdf.pbkdf2 import PBKDF2HMAC

__all__ = [
    "MAGIC",
    "OFFER",
    "SESSION_KEY_BYTES",
    "SealError",
    "Session",
    "cluster_key",
    "is_sealed",
    "offered",
    "with_offer",
]

MAGIC: Final = b"\x01"
OFFER: Final = b"drover-gcm1"
SESSION_KEY_BYTES: Final = 32
_COUNTER: Final = struct.Struct(">Q")
_NONCE_PAD: Final = b"\0\0\0\0"
_HEADER: Final = len(MAGIC) + _COUNTER.size
_SALT: Final = b"drover raft seal: aes-256-gcm, v1"
# pysyncobj's own key stretching (pysyncobj/encryptor.py), so the two keys are as strong.
_PBKDF2_ITERATIONS: Final = 100_000


class SealError(Exception):
    """A frame that does not open: why, for the refusal's log line."""


@functools.cache
def cluster_key(password: str | bytes) -> bytes:
    """The cluster's GCM key for raft key ``password`` (once per process: PBKDF2 is slow)."""
    secret = password.encode() if isinstance(password, str) else password
    kdf = PBKDF2HMAC(algorithm=hashes.SHA256(), length=32, salt=_SALT, iterations=_PBKDF2_ITERATIONS)
    return kdf.derive(secret)


def with_offer(session_key: bytes) -> bytes:
    """``session_key`` as a node that opens GCM sends it."""
    return session_key + OFFER


def offered(session_key: Any) -> bool:
    """Whether a peer's session key says it opens GCM."""
    return (
        isinstance(session_key, bytes)
        and len(session_key) == SESSION_KEY_BYTES + len(OFFER)
        and session_key.endswith(OFFER)
    )


class Session:
    """One direction of one connection: the AEAD keyed for it and its counter."""

    __slots__ = ("_aead", "_counter", "session_key")

    def __init__(self, key: bytes, session_key: bytes) -> None:
        derived = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=session_key).derive(key)
        self._aead = AESGCM(derived)
        self._counter = 0
        # The receiving side's session key this direction was keyed on: a new key (the
        # connection was made again) needs a new Session.
        self.session_key = session_key

    def seal(self, data: bytes) -> bytes:
        self._counter += 1
        counter = _COUNTER.pack(self._counter)
        return MAGIC + counter + self._aead.encrypt(_NONCE_PAD + counter, data, MAGIC)

    def open(self, frame: bytes) -> bytes:
        """The plaintext of ``frame``; SealError if it is not sealed for this session, or
        its counter is not above the last one opened."""
        if len(frame) < _HEADER or frame[:1] != MAGIC:
            raise SealError("not sealed with this cluster's raft key")
        counter = frame[1:_HEADER]
        try:
            data = self._aead.decrypt(_NONCE_PAD + counter, frame[_HEADER:], MAGIC)
        except InvalidTag:
            raise SealError("not sealed with this cluster's raft key") from None
        (value,) = _COUNTER.unpack(counter)
        if value <= self._counter:
            raise SealError("replayed or reordered frame")
        self._counter = value
        return data


def is_sealed(frame: bytes) -> bool:
    """Whether ``frame`` is a GCM frame (else it is Fernet's, or garbage)."""
    return frame[:1] == MAGIC
