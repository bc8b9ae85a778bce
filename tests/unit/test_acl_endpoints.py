"""The leader's ACL writes (server/acl/endpoints.py) and token resolution (server/acl/resolve.py),
on a real FSM and state store: the proposer applies each entry at the next index."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from drover.common.secrets import hash_secret
from drover.server.acl.endpoints import ACLEndpoints
from drover.server.acl.resolve import resolve
from drover.server.errors import ConflictError, NotFoundError, PermissionDeniedError, ValidationError
from drover.server.fsm import FSM, ApplyResult
from drover.server.state_store import StateStore


@dataclass
class _Clock:
    now: int = 1_700_000_000_000_000_000

    def now_ns(self) -> int:
        return self.now


@dataclass
class _Ids:
    n: int = 0

    def new(self) -> str:
        self.n += 1
        return f"accessor-{self.n}"


@dataclass
class _Raft:
    """Applies every proposal at once, and keeps the bytes it was given."""

    store: StateStore
    proposed: list[bytes] = field(default_factory=list)

    def propose(self, data: bytes, timeout: float) -> ApplyResult:
        self.proposed.append(data)
        return FSM(self.store).apply(data, self.store.index + 1)


@pytest.fixture
def raft() -> _Raft:
    return _Raft(StateStore())


@pytest.fixture
def acl(raft: _Raft) -> ACLEndpoints:
    return ACLEndpoints(raft, raft.store, _Clock(), _Ids())


READ = 'namespace "default" { policy = "read" }'


def test_bootstrap__mints_a_management_token_whose_secret_only_the_caller_gets(
    acl: ACLEndpoints, raft: _Raft
) -> None:
    minted = acl.bootstrap()

    stored = raft.store.snapshot().acl_token(minted.record.accessor_id)
    assert stored is not None and stored.management and stored.name == "Bootstrap Token"
    assert stored.secret_hash == hash_secret(minted.secret)
    assert all(minted.secret.encode() not in data for data in raft.proposed)


def test_bootstrap__twice__conflict_naming_the_reset_index(acl: ACLEndpoints) -> None:
    acl.bootstrap()

    with pytest.raises(ConflictError, match=r"^ACL bootstrap already done \(reset index: 1\)$"):
        acl.bootstrap()


def test_bootstrap__given_secret__is_the_tokens(acl: ACLEndpoints, raft: _Raft) -> None:
    secret = "0b9e7f3c-5d1a-4c2b-9f8e-7a6b5c4d3e2f"

    minted = acl.bootstrap(secret)

    assert minted.secret == secret
    assert resolve(raft.store.snapshot(), secret).acl.management


@pytest.mark.parametrize(
    "secret", ["not-a-uuid", "0B9E7F3C-5D1A-4C2B-9F8E-7A6B5C4D3E2F", "{0b9e7f3c5d1a4c2b9f8e7a6b5c4d3e2f}"]
)
def test_bootstrap__secret_not_a_canonical_uuid__refused(acl: ACLEndpoints, secret: str) -> None:
    with pytest.raises(ValidationError, match=r"^bootstrap_secret: "):
        acl.bootstrap(secret)


def test_upsert_policy__bad_rules__refused_naming_them_nothing_proposed(
    acl: ACLEndpoints, raft: _Raft
) -> None:
    with pytest.raises(ValidationError, match=r'^rules: namespace "default": unknown capability "fly"$'):
        acl.upsert_policy("p", "", 'namespace "default" { capabilities = ["fly"] }')
    with pytest.raises(ValidationError, match=r"^name: "):
        acl.upsert_policy("bad name", "", READ)
    assert raft.proposed == []


CREATE_REFUSALS = [
    ("client-without-policy", "client", (), "policies: a client token needs at least one policy"),
    ("management-with-policy", "management", ("readonly",), "policies: a management token takes none"),
    ("unknown-policy", "client", ("nope",), 'policies: no ACL policy named "nope"'),
    ("unknown-type", "root", ("readonly",), "type: must be one of client, management"),
]


@pytest.mark.parametrize(
    ("token_type", "policies", "message"),
    [c[1:] for c in CREATE_REFUSALS],
    ids=[c[0] for c in CREATE_REFUSALS],
)
def test_create_token__invalid__refused(
    acl: ACLEndpoints, token_type: str, policies: tuple[str, ...], message: str
) -> None:
    acl.upsert_policy("readonly", "", READ)

    with pytest.raises(ValidationError, match=f"^{message}"):
        acl.create_token("t", token_type, policies)


def test_create_token__client__resolves_to_its_policies(acl: ACLEndpoints, raft: _Raft) -> None:
    acl.upsert_policy("readonly", "", READ)

    minted = acl.create_token("reader", "", ("readonly", "readonly"))

    assert minted.record.policies == ("readonly",)
    identity = resolve(raft.store.snapshot(), minted.secret)
    assert identity.token is not None and identity.token.accessor_id == minted.record.accessor_id
    assert identity.acl.allows_namespace("default", ["read-job"])
    assert not identity.acl.allows_namespace("default", ["submit-job"])


def test_delete_token__it_stops_resolving(acl: ACLEndpoints, raft: _Raft) -> None:
    acl.upsert_policy("readonly", "", READ)
    minted = acl.create_token("reader", "client", ("readonly",))

    acl.delete_token(minted.record.accessor_id)

    with pytest.raises(PermissionDeniedError, match="ACL token not found"):
        resolve(raft.store.snapshot(), minted.secret)
    with pytest.raises(NotFoundError):
        acl.delete_token(minted.record.accessor_id)


def test_resolve__deleted_policy__grants_nothing(acl: ACLEndpoints, raft: _Raft) -> None:
    acl.upsert_policy("readonly", "", READ)
    minted = acl.create_token("reader", "client", ("readonly",))

    acl.delete_policy("readonly")

    assert not resolve(raft.store.snapshot(), minted.secret).acl.allows_some_namespace(["read-job"])


def test_resolve__no_secret__anonymous_policy_if_there_is_one(acl: ACLEndpoints, raft: _Raft) -> None:
    nobody = resolve(raft.store.snapshot(), "")
    assert nobody.anonymous and not nobody.acl.allows_some_namespace(["list-jobs"])

    acl.upsert_policy("anonymous", "", READ)

    anonymous = resolve(raft.store.snapshot(), "")
    assert anonymous.anonymous and anonymous.acl.allows_namespace("default", ["list-jobs"])


@pytest.mark.parametrize("secret", ["11111111-1111-4111-8111-111111111111", "x" * 10_000, "garbage"])
def test_resolve__unknown_secret__refused_never_anonymous(
    acl: ACLEndpoints, raft: _Raft, secret: str
) -> None:
    acl.upsert_policy("anonymous", "", READ)

    with pytest.raises(PermissionDeniedError, match=r"^Permission denied: ACL token not found$"):
        resolve(raft.store.snapshot(), secret)
