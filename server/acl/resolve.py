"""From the secret a call presents to the ``Identity`` it acts as, read from one snapshot.

Decision order (Nomad's ``Authenticator.Authenticate``, without JWTs):

1. no secret: anonymous, with the rights of the policy named ``anonymous`` if an operator
   created one, else none at all;
2. a secret whose hash names a stored token: that token (management: every right; client:
   its policies, compiled; a policy it names that does not exist grants nothing);
3. anything else: refused, "ACL token not found". An unknown secret never falls back to
   anonymous, so a typo in a token is an error, not a silent downgrade.

Compiled ACLs are cached by the policies' text (Nomad caches them by content too), so a
call pays for parsing HCL only the first time a policy version is used.
"""

from __future__ import annotations

import contextvars
import functools
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Final

from drover.common.secrets import hash_secret
from drover.server.acl.acl import ACL, DENY_ALL, MANAGEMENT, compile_acl
from drover.server.acl.policy import parse_policy
from drover.server.acl.records import ANONYMOUS_POLICY, ACLTokenRecord
from drover.server.errors import PermissionDeniedError
from drover.server.state_store import Snapshot

__all__ = ["Identity", "acting_as", "caller", "resolve"]

# Secrets are UUIDs (36 characters); anything much longer is not one of ours.
MAX_SECRET_LENGTH: Final = 128
_CACHE_SIZE: Final = 512


@dataclass(frozen=True, slots=True)
class Identity:
    """Who a call acts as: a stored token, or anonymous (``token`` None)."""

    acl: ACL
    token: ACLTokenRecord | None = None

    @property
    def anonymous(self) -> bool:
        return self.token is None


# The identity of the call this thread is serving, for the few servicers that need more
# than the rights table (ACL.TokenSelf; the policies a client token may read).
_CALLER: contextvars.ContextVar[Identity | None] = contextvars.ContextVar("acl_caller", default=None)


def caller() -> Identity | None:
    """Who the current call acts as; None when ACLs are off (or outside a call)."""
    return _CALLER.get()


@contextmanager
def acting_as(identity: Identity) -> Iterator[None]:
    reset = _CALLER.set(identity)
    try:
        yield
    finally:
        _CALLER.reset(reset)


def resolve(snap: Snapshot, secret: str) -> Identity:
    """The identity ``secret`` proves in ``snap``; ``PermissionDeniedError`` when none."""
    if not secret:
        anonymous = snap.acl_policy(ANONYMOUS_POLICY)
        return Identity(acl=_compiled((anonymous.rules,)) if anonymous is not None else DENY_ALL)
    token = _token_for(snap, secret)
    if token is None:
        raise PermissionDeniedError("Permission denied: ACL token not found")
    if token.management:
        return Identity(acl=MANAGEMENT, token=token)
    rules = []
    for name in token.policies:
        policy = snap.acl_policy(name)
        if policy is not None:
            rules.append(policy.rules)
    return Identity(acl=_compiled(tuple(rules)), token=token)


def _token_for(snap: Snapshot, secret: str) -> ACLTokenRecord | None:
    if len(secret) > MAX_SECRET_LENGTH:
        return None
    # An exact lookup by the secret's hash: finding it is the match (hashing it again to
    # compare would only repeat the work).
    return snap.acl_token_by_hash(hash_secret(secret))


@functools.lru_cache(maxsize=_CACHE_SIZE)
def _compiled(rules: tuple[str, ...]) -> ACL:
    # Stored rules were parsed on the way in; one that no longer parses (a newer server's
    # policy read by an older one) grants nothing rather than failing every call.
    policies = []
    for text in rules:
        try:
            policies.append(parse_policy(text))
        except ValueError:
            continue
    return compile_acl(policies) if policies else DENY_ALL
