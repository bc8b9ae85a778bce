"""Bearer secrets (ACL token secrets, node secrets): made, stored and compared one way.

Only a secret's hash is ever stored (raft state, snapshots, ``operator raft state`` dumps),
so what those hold cannot be replayed as a credential. The secrets are 128 random bits,
not passwords: a plain SHA-256 is enough (nothing to brute-force), and it keeps a lookup
by hash an O(1) index read. Comparisons go through ``hmac.compare_digest``.
"""

from __future__ import annotations

import hashlib
import hmac
import uuid
from typing import Final

__all__ = ["TOKEN_ENV", "TOKEN_METADATA_KEY", "hash_secret", "new_secret", "secret_matches"]

# How an ACL token travels: in this gRPC metadata key on every call, and from this
# environment variable for the CLI and a joining server (never on a command line).
TOKEN_METADATA_KEY: Final = "x-drover-token"
TOKEN_ENV: Final = "DROVER_TOKEN"

_PREFIX = "sha256:"


def new_secret() -> str:
    """A fresh secret, UUID-shaped as Nomad's are (it is the bearer credential)."""
    return str(uuid.uuid4())


def hash_secret(secret: str) -> str:
    """What is stored for ``secret``; stable across processes and versions."""
    return _PREFIX + hashlib.sha256(secret.encode("utf-8")).hexdigest()


def secret_matches(secret: str, stored_hash: str) -> bool:
    """``secret`` is the one ``stored_hash`` was made from (an empty secret never is)."""
    if not secret or not stored_hash:
        return False
    return hmac.compare_digest(hash_secret(secret), stored_hash)
