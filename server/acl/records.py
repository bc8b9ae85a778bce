"""The ACL records the state store keeps: policies, and tokens without their secrets.

They mirror ``ACLPolicy`` and ``ACLTokenRecord`` in proto/drover/v1/raft.proto field for
field, so server/codec.py converts them as it converts scheduler/structs.py's records. A
token record has a ``secret_hash`` and no secret field at all: nothing that holds a record
(raft entries, snapshots, ``operator raft state``) can hold a credential.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

__all__ = [
    "ANONYMOUS_POLICY",
    "TOKEN_CLIENT",
    "TOKEN_MANAGEMENT",
    "TOKEN_TYPES",
    "ACLPolicy",
    "ACLTokenRecord",
]

TOKEN_CLIENT: Final = "client"
TOKEN_MANAGEMENT: Final = "management"
TOKEN_TYPES: Final = (TOKEN_CLIENT, TOKEN_MANAGEMENT)
# A policy with this name, if an operator creates one, is what calls without a token get
# (Nomad's anonymous token); without it they get nothing.
ANONYMOUS_POLICY: Final = "anonymous"


@dataclass(frozen=True, slots=True)
class ACLPolicy:
    name: str
    description: str = ""
    # The policy HCL as the operator wrote it; checked by server/acl/policy.py before it is
    # proposed, compiled again (cached) when a token that names it is resolved.
    rules: str = ""
    create_index: int = 0
    modify_index: int = 0


@dataclass(frozen=True, slots=True)
class ACLTokenRecord:
    accessor_id: str
    # drover.common.secrets.hash_secret of the secret; the secret itself is never stored.
    secret_hash: str = ""
    name: str = ""
    type: str = TOKEN_CLIENT
    policies: tuple[str, ...] = ()
    create_time_ns: int = 0
    create_index: int = 0
    modify_index: int = 0

    @property
    def management(self) -> bool:
        return self.type == TOKEN_MANAGEMENT
