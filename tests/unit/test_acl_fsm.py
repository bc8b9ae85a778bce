"""ACL entries in the FSM: applied deterministically, refused deterministically, restorable,
and never holding a secret (server/fsm.py apply_acl_*, server/state_store.py, server/snapshot.py).

The property tests follow tests/unit/test_fsm_determinism.py: random logs over a small
fixed world (3 policies, 3 tokens with fixed secrets) mixed with that file's core entries.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from drover.common.secrets import hash_secret
from drover.server.acl.records import ACLPolicy, ACLTokenRecord
from drover.server.codec import to_proto
from drover.server.fsm import FSM, encode_entry
from drover.server.snapshot import from_snapshot, snapshot_bytes, state_digest, to_snapshot
from drover.server.state_store import StateStore, Tables
from drover.v1 import raft_pb2
from tests.unit.test_fsm_determinism import PROPERTY_SETTINGS, Entry
from tests.unit.test_fsm_determinism import entries as core_entries

ET = raft_pb2.EntryType

# The fixed world: secrets are fixed strings so a shrunk log reads as a story.
SECRETS = {
    "tok-1": "11111111-1111-4111-8111-111111111111",
    "tok-2": "22222222-2222-4222-8222-222222222222",
    "tok-3": "33333333-3333-4333-8333-333333333333",
}
POLICIES = {
    "readonly": 'namespace "default" { policy = "read" }',
    "deployer": 'namespace "default" { policy = "write" }',
    "ops": 'operator { policy = "write" }',
}


def token(
    accessor: str, secret_of: str | None = None, token_type: str = "client", *policies: str
) -> ACLTokenRecord:
    return ACLTokenRecord(
        accessor_id=accessor,
        secret_hash=hash_secret(SECRETS[secret_of or accessor]),
        name=f"name of {accessor}",
        type=token_type,
        policies=policies,
        create_time_ns=1_700_000_000_000_000_000,
    )


def bootstrap_entry(record: ACLTokenRecord) -> bytes:
    entry = raft_pb2.ACLBootstrapEntry()
    to_proto(record, entry.token)
    return encode_entry(ET.ENTRY_TYPE_ACL_BOOTSTRAP, entry)


def policy_entry(name: str, rules: str | None = None, description: str = "") -> bytes:
    entry = raft_pb2.ACLPolicyUpsertEntry()
    to_proto(
        ACLPolicy(name=name, description=description, rules=rules or POLICIES[name]), entry.policies.add()
    )
    return encode_entry(ET.ENTRY_TYPE_ACL_POLICY_UPSERT, entry)


def policy_delete_entry(*names: str) -> bytes:
    return encode_entry(ET.ENTRY_TYPE_ACL_POLICY_DELETE, raft_pb2.ACLPolicyDeleteEntry(names=names))


def token_entry(*records: ACLTokenRecord) -> bytes:
    entry = raft_pb2.ACLTokenUpsertEntry()
    for record in records:
        to_proto(record, entry.tokens.add())
    return encode_entry(ET.ENTRY_TYPE_ACL_TOKEN_UPSERT, entry)


def token_delete_entry(*accessors: str) -> bytes:
    return encode_entry(ET.ENTRY_TYPE_ACL_TOKEN_DELETE, raft_pb2.ACLTokenDeleteEntry(accessor_ids=accessors))


def apply_all(*entries: bytes) -> tuple[StateStore, list[Any]]:
    store = StateStore()
    fsm = FSM(store)
    results = [fsm.apply(data, i) for i, data in enumerate(entries, start=1)]
    return store, results


def round_trip(tables: Tables) -> Tables:
    return from_snapshot(raft_pb2.StateSnapshot.FromString(to_snapshot(tables).SerializeToString()))


# ---------------------------------------------------------------------------------------
# One entry at a time


def test_bootstrap__first__stores_the_management_token_and_the_index() -> None:
    store, (result,) = apply_all(bootstrap_entry(token("tok-1", token_type="management")))

    snap = store.snapshot()
    assert result.error == ""
    assert snap.acl_bootstrap_index == 1
    found = snap.acl_token_by_hash(hash_secret(SECRETS["tok-1"]))
    assert found is not None and found.accessor_id == "tok-1" and found.management
    assert found.create_index == found.modify_index == 1
    assert snap.table_index("acl_tokens") == 1


def test_bootstrap__second__refused_and_changes_nothing() -> None:
    store = StateStore()
    fsm = FSM(store)
    fsm.apply(bootstrap_entry(token("tok-1", token_type="management")), 1)
    before = state_digest(store.snapshot().tables)

    result = fsm.apply(bootstrap_entry(token("tok-2", token_type="management")), 2)

    assert result.error == "ACL bootstrap already done (reset index: 1)"
    assert state_digest(store.snapshot().tables) == before
    assert store.snapshot().acl_token("tok-2") is None


def test_bootstrap__client_token__refused() -> None:
    _, (result,) = apply_all(bootstrap_entry(token("tok-1", token_type="client")))
    assert "management" in result.error


def test_token_upsert__again__keeps_create_index_and_time() -> None:
    first = token("tok-1", None, "client", "readonly")
    renamed = ACLTokenRecord(**{**_fields(first), "name": "renamed", "create_time_ns": 5})
    store, results = apply_all(token_entry(first), token_entry(renamed))

    assert [r.error for r in results] == ["", ""]
    stored = store.snapshot().acl_token("tok-1")
    assert stored is not None
    assert (stored.name, stored.create_index, stored.modify_index) == ("renamed", 1, 2)
    assert stored.create_time_ns == first.create_time_ns


def test_token_upsert__secret_of_another_token__refused() -> None:
    store, results = apply_all(token_entry(token("tok-1")), token_entry(token("tok-2", "tok-1")))

    assert "another token's" in results[1].error
    assert store.snapshot().acl_token("tok-2") is None


def test_token_upsert__without_hash_or_type__refused() -> None:
    no_hash = ACLTokenRecord(accessor_id="tok-1", type="client")
    bad_type = ACLTokenRecord(**{**_fields(token("tok-2")), "type": "root"})
    no_id = ACLTokenRecord(**{**_fields(token("tok-3")), "accessor_id": ""})

    _, results = apply_all(token_entry(no_hash), token_entry(bad_type), token_entry(no_id))

    assert [bool(r.error) for r in results] == [True, True, True]


def test_token_delete__stops_the_hash_lookup() -> None:
    store, results = apply_all(token_entry(token("tok-1")), token_delete_entry("tok-1"))

    assert results[1].error == ""
    snap = store.snapshot()
    assert snap.acl_token("tok-1") is None
    assert snap.acl_token_by_hash(hash_secret(SECRETS["tok-1"])) is None
    assert len(snap.tables.acl_tokens_by_hash) == 0


def test_token_delete__unknown__not_found() -> None:
    _, (result,) = apply_all(token_delete_entry("tok-9"))
    assert result.not_found and "tok-9" in result.error


def test_policy_upsert_then_delete() -> None:
    store, results = apply_all(policy_entry("readonly"), policy_entry("readonly", description="v2"))
    assert [r.error for r in results] == ["", ""]
    policy = store.snapshot().acl_policy("readonly")
    assert policy is not None and (policy.description, policy.create_index, policy.modify_index) == (
        "v2",
        1,
        2,
    )

    fsm = FSM(store)
    assert fsm.apply(policy_delete_entry("readonly"), 3).error == ""
    assert store.snapshot().acl_policy("readonly") is None
    assert fsm.apply(policy_delete_entry("readonly"), 4).not_found


def test_snapshot__acl_tables__round_trip_with_the_hash_index_rebuilt() -> None:
    store, _ = apply_all(
        bootstrap_entry(token("tok-1", token_type="management")),
        policy_entry("readonly"),
        token_entry(token("tok-2", None, "client", "readonly")),
    )
    tables = store.snapshot().tables

    restored = round_trip(tables)

    assert restored == tables
    assert restored.acl_bootstrap_index == 1
    assert dict(restored.acl_tokens_by_hash) == {
        hash_secret(SECRETS["tok-1"]): "tok-1",
        hash_secret(SECRETS["tok-2"]): "tok-2",
    }


def test_snapshot_and_log__hold_no_secret() -> None:
    log = [
        bootstrap_entry(token("tok-1", token_type="management")),
        token_entry(token("tok-2", None, "client", "readonly")),
    ]
    store, _ = apply_all(*log)
    blob = snapshot_bytes(store.snapshot().tables) + b"".join(log)

    for secret in (SECRETS["tok-1"], SECRETS["tok-2"]):
        assert secret.encode() not in blob
    # The hash is there (that is how a secret finds its token): the test looks in the right place.
    assert hash_secret(SECRETS["tok-2"]).encode() in blob


def _fields(record: ACLTokenRecord) -> dict[str, Any]:
    return {name: getattr(record, name) for name in ACLTokenRecord.__dataclass_fields__}


# ---------------------------------------------------------------------------------------
# Random logs


P = itertools.product
ACL_ENTRIES = [
    *(Entry(f"bootstrap({a})", bootstrap_entry(token(a, token_type="management"))) for a in sorted(SECRETS)),
    *(Entry(f"policy({n})", policy_entry(n)) for n in sorted(POLICIES)),
    Entry("policy(readonly=ops rules)", policy_entry("readonly", POLICIES["ops"])),
    *(Entry(f"policy-delete({n})", policy_delete_entry(n)) for n in sorted(POLICIES)),
    *(
        Entry(f"token({a} secret-of-{s} {t} {ps})", token_entry(token(a, s, t, *ps)))
        for a, s, (t, ps) in P(
            sorted(SECRETS),
            sorted(SECRETS),
            [("client", ("readonly",)), ("client", ("deployer", "ops")), ("management", ())],
        )
    ),
    *(Entry(f"token-delete({a})", token_delete_entry(a)) for a in sorted(SECRETS)),
    Entry("token-delete(tok-1 tok-2)", token_delete_entry("tok-1", "tok-2")),
]
acl_entries = st.sampled_from(ACL_ENTRIES)
mixed_entries = st.one_of(acl_entries, acl_entries, acl_entries, core_entries)


@st.composite
def acl_logs(draw: st.DrawFn, max_size: int = 40) -> list[Entry]:
    runs = draw(st.lists(st.lists(mixed_entries, max_size=8), max_size=max_size // 8))
    return [entry for run in runs for entry in run]


def replay(log: Sequence[Entry], store: StateStore | None = None, first_index: int = 1) -> StateStore:
    store = store or StateStore()
    fsm = FSM(store)
    for i, entry in enumerate(log, start=first_index):
        fsm.apply(entry.data, i)
    return store


def _hash_index_agrees(tables: Tables) -> None:
    assert dict(tables.acl_tokens_by_hash) == {t.secret_hash: a for a, t in tables.acl_tokens.items()}


@PROPERTY_SETTINGS
@given(log=acl_logs())
def test_acl_fsm__same_log_on_two_stores__same_state_at_every_index(log: list[Entry]) -> None:
    a, b = StateStore(), StateStore()
    fsm_a, fsm_b = FSM(a), FSM(b)
    for i, entry in enumerate(log, start=1):
        assert fsm_a.apply(entry.data, i) == fsm_b.apply(entry.data, i), f"entry {i} {entry}"
        assert a.snapshot().tables == b.snapshot().tables, f"entry {i} {entry}"
        _hash_index_agrees(a.snapshot().tables)
    assert state_digest(a.snapshot().tables) == state_digest(b.snapshot().tables)


@PROPERTY_SETTINGS
@given(log=acl_logs())
def test_acl_fsm__log_then_snapshot_round_trip__same_tables(log: list[Entry]) -> None:
    tables = replay(log).snapshot().tables
    assert round_trip(tables) == tables


@PROPERTY_SETTINGS
@given(log=acl_logs(), data=st.data())
def test_acl_fsm__restored_mid_log_then_rest_applied__same_state_as_full_replay(
    log: list[Entry], data: Any
) -> None:
    cut = data.draw(st.integers(0, len(log)), label="cut")
    full = replay(log).snapshot().tables
    follower = StateStore()
    FSM(follower).restore_tables(round_trip(replay(log[:cut]).snapshot().tables))

    replay(log[cut:], follower, first_index=cut + 1)

    assert follower.snapshot().tables == full


@PROPERTY_SETTINGS
@given(log=acl_logs())
def test_acl_fsm__bootstrap__applies_at_most_once_per_log(log: list[Entry]) -> None:
    store = StateStore()
    fsm = FSM(store)
    applied = 0
    for i, entry in enumerate(log, start=1):
        result = fsm.apply(entry.data, i)
        if entry.desc.startswith("bootstrap(") and not result.error:
            applied += 1
            assert store.snapshot().acl_bootstrap_index == i
    assert applied <= 1
