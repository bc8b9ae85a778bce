"""The leader's ACL writes: check the request, mint IDs, secrets and times, propose one entry.

Everything the FSM needs is decided here, before proposing (docs/design.md, "FSM
determinism"): the accessor ID, the secret (of which only ``hash_secret`` goes into the
entry) and the creation time. The secret is returned to the caller once and never stored.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Final

from drover.common.secrets import hash_secret, new_secret
from drover.server.acl.policy import PolicyError, check_policy_name, parse_policy
from drover.server.acl.records import TOKEN_CLIENT, TOKEN_MANAGEMENT, TOKEN_TYPES, ACLPolicy, ACLTokenRecord
from drover.server.codec import to_proto
from drover.server.endpoints import Writer
from drover.server.errors import ConflictError, NotFoundError, ValidationError
from drover.server.fsm import ApplyResult
from drover.v1 import raft_pb2

__all__ = ["ACLEndpoints", "MintedToken"]

ET = raft_pb2.EntryType
# Nomad's bound on a token name; the others keep one request (and one entry) small.
MAX_TOKEN_NAME: Final = 256
MAX_DESCRIPTION: Final = 1024
MAX_TOKEN_POLICIES: Final = 64
BOOTSTRAP_TOKEN_NAME: Final = "Bootstrap Token"


@dataclass(frozen=True, slots=True)
class MintedToken:
    """A token just written, with the secret the caller gets this one time."""

    result: ApplyResult
    record: ACLTokenRecord
    secret: str


class ACLEndpoints(Writer):
    def bootstrap(self, secret: str = "") -> MintedToken:
        """The first management token; a ConflictError once the cluster has one."""
        done = self._store.snapshot().acl_bootstrap_index
        if done:
            raise ConflictError(f"ACL bootstrap already done (reset index: {done})")
        if secret:
            try:
                if str(uuid.UUID(secret)) != secret:
                    raise ValueError(secret)
            except ValueError as exc:
                raise ValidationError(
                    "bootstrap_secret: must be a UUID in lower-case 8-4-4-4-12 form"
                ) from exc
        else:
            secret = new_secret()
        record = self._record(BOOTSTRAP_TOKEN_NAME, TOKEN_MANAGEMENT, (), secret)
        entry = raft_pb2.ACLBootstrapEntry()
        to_proto(record, entry.token)
        return MintedToken(self._propose(ET.ENTRY_TYPE_ACL_BOOTSTRAP, entry), record, secret)

    def upsert_policy(self, name: str, description: str, rules: str) -> ApplyResult:
        try:
            check_policy_name(name)
            parse_policy(rules)
        except PolicyError as exc:
            message = str(exc)
            raise ValidationError(message if message.startswith("name:") else f"rules: {message}") from exc
        if len(description) > MAX_DESCRIPTION:
            raise ValidationError(f"description: longer than {MAX_DESCRIPTION} characters")
        entry = raft_pb2.ACLPolicyUpsertEntry()
        to_proto(ACLPolicy(name=name, description=description, rules=rules), entry.policies.add())
        return self._propose(ET.ENTRY_TYPE_ACL_POLICY_UPSERT, entry)

    def delete_policy(self, name: str) -> ApplyResult:
        if not name:
            raise ValidationError("name: required")
        if self._store.snapshot().acl_policy(name) is None:
            raise NotFoundError(f"ACL policy {name!r} not found")
        return self._propose(ET.ENTRY_TYPE_ACL_POLICY_DELETE, raft_pb2.ACLPolicyDeleteEntry(names=[name]))

    def create_token(self, name: str, token_type: str, policies: tuple[str, ...]) -> MintedToken:
        token_type = token_type or TOKEN_CLIENT
        if token_type not in TOKEN_TYPES:
            raise ValidationError(
                f"type: must be one of {', '.join(TOKEN_TYPES)}, got {json.dumps(token_type[:40])}"
            )
        if len(name) > MAX_TOKEN_NAME:
            raise ValidationError(f"name: longer than {MAX_TOKEN_NAME} characters")
        if token_type == TOKEN_MANAGEMENT and policies:
            raise ValidationError("policies: a management token takes none (it may do anything)")
        if token_type == TOKEN_CLIENT and not policies:
            raise ValidationError("policies: a client token needs at least one policy")
        if len(policies) > MAX_TOKEN_POLICIES:
            raise ValidationError(f"policies: more than {MAX_TOKEN_POLICIES}")
        snap = self._store.snapshot()
        for policy in policies:
            if snap.acl_policy(policy) is None:
                raise ValidationError(f"policies: no ACL policy named {json.dumps(policy[:128])}")
        secret = new_secret()
        record = self._record(name, token_type, tuple(dict.fromkeys(policies)), secret)
        entry = raft_pb2.ACLTokenUpsertEntry()
        to_proto(record, entry.tokens.add())
        return MintedToken(self._propose(ET.ENTRY_TYPE_ACL_TOKEN_UPSERT, entry), record, secret)

    def delete_token(self, accessor_id: str) -> ApplyResult:
        if not accessor_id:
            raise ValidationError("accessor_id: required")
        if self._store.snapshot().acl_token(accessor_id) is None:
            raise NotFoundError(f"ACL token {accessor_id!r} not found")
        entry = raft_pb2.ACLTokenDeleteEntry(accessor_ids=[accessor_id])
        return self._propose(ET.ENTRY_TYPE_ACL_TOKEN_DELETE, entry)

    def _record(self, name: str, token_type: str, policies: tuple[str, ...], secret: str) -> ACLTokenRecord:
        return ACLTokenRecord(
            accessor_id=self._ids.new(),
            secret_hash=hash_secret(secret),
            name=name,
            type=token_type,
            policies=policies,
            create_time_ns=self._clock.now_ns(),
        )
