"""Node identity on the leader (server/endpoints.py): every node call needs the node's own
secret; Register is trust-on-first-use; a node touches only its own allocs; only the
secret's hash is ever stored. A real FSM and state store behind an in-process proposer."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import pytest

from drover.common.secrets import hash_secret
from drover.scheduler.structs import Node
from drover.scheduler.validate import ValidationError as FieldsInvalid
from drover.server.endpoints import Endpoints
from drover.server.errors import PermissionDeniedError, ValidationError
from drover.server.fsm import FSM, ApplyResult
from drover.server.snapshot import snapshot_bytes, state_digest
from drover.server.state_store import StateStore
from drover.v1 import structs_pb2
from tests.fixtures import mock


@dataclass
class _Clock:
    now: int = mock.NOW

    def now_ns(self) -> int:
        return self.now


@dataclass
class _Raft:
    store: StateStore = field(default_factory=StateStore)
    index: int = 0

    def __post_init__(self) -> None:
        self.fsm = FSM(self.store)

    def propose(self, data: bytes, timeout: float = 0.0) -> ApplyResult:
        self.index += 1
        return self.fsm.apply(data, self.index)


@dataclass
class Leader:
    raft: _Raft = field(default_factory=_Raft)

    def __post_init__(self) -> None:
        self.endpoints = Endpoints(self.raft, self.raft.store, _Clock(), mock.Counter("id"))

    def digest(self) -> str:
        return state_digest(self.raft.store.snapshot().tables)


def node(node_id: str, secret: str) -> Node:
    return replace(mock.node(id=node_id), secret_id=secret)


@pytest.fixture
def leader() -> Leader:
    lead = Leader()
    lead.endpoints.register_node(node("n1", "secret-1"))
    lead.endpoints.register_node(node("n2", "secret-2"))
    return lead


def report(alloc_id: str, status: str = "running") -> structs_pb2.Allocation:
    return structs_pb2.Allocation(id=alloc_id, client_status=status)


def test_register__stores_only_the_hash(leader: Leader) -> None:
    stored = leader.raft.store.snapshot().node("n1")
    assert stored is not None
    assert stored.secret_id == ""
    assert stored.secret_hash == hash_secret("secret-1")
    dump = snapshot_bytes(leader.raft.store.snapshot().tables)
    assert b"secret-1" not in dump and b"secret-2" not in dump


def test_register__empty_secret__permission_denied_nothing_written() -> None:
    lead = Leader()
    before = lead.digest()
    with pytest.raises(PermissionDeniedError, match=r"Permission denied: node\.secret_id"):
        lead.endpoints.register_node(node("n9", ""))
    assert lead.digest() == before


def test_register__bad_fields_first__invalid_argument_names_the_field() -> None:
    with pytest.raises(FieldsInvalid, match=r"node\.name"):
        Leader().endpoints.register_node(replace(node("n9", ""), name="x" * 1_000_000))


def test_register__same_secret_again__accepted(leader: Leader) -> None:
    leader.endpoints.register_node(node("n1", "secret-1"))


def test_register__existing_id_other_secret__permission_denied_nothing_written(leader: Leader) -> None:
    before = leader.digest()
    with pytest.raises(PermissionDeniedError, match="registered with a different secret"):
        leader.endpoints.register_node(node("n1", "secret-2"))
    assert leader.digest() == before


@pytest.mark.parametrize(
    ("node_id", "secret"),
    [("n1", ""), ("n1", "secret-2"), ("n1", hash_secret("secret-1")), ("n9", "secret-1"), ("", "secret-1")],
    ids=["empty", "other-nodes-secret", "the-stored-hash", "unknown-node", "no-node-id"],
)
def test_update_status__not_the_nodes_secret__permission_denied(
    leader: Leader, node_id: str, secret: str
) -> None:
    before = leader.digest()
    with pytest.raises(PermissionDeniedError, match=r"^Permission denied"):
        leader.endpoints.update_node_status(node_id, "down", secret_id=secret)
    assert leader.digest() == before


def test_update_status__own_secret__changes_the_status(leader: Leader) -> None:
    leader.endpoints.update_node_status("n1", "down", secret_id="secret-1")
    stored = leader.raft.store.snapshot().node("n1")
    assert stored is not None and stored.status == "down"


def _place(leader: Leader, node_id: str, alloc_id: str) -> None:
    job = mock.job()
    leader.raft.propose(mock.register_job_entry(job))
    target = leader.raft.store.snapshot().node(node_id)
    assert target is not None
    result = leader.raft.propose(mock.plan_entry([mock.alloc(job, target, id=alloc_id)]))
    assert not result.error


def test_update_allocs__own_allocs__reported(leader: Leader) -> None:
    _place(leader, "n1", "a1")
    leader.endpoints.update_allocs([report("a1")], node_id="n1", secret_id="secret-1")
    alloc = leader.raft.store.snapshot().alloc("a1")
    assert alloc is not None and alloc.client_status == "running"


@pytest.mark.parametrize(
    ("node_id", "secret", "why"),
    [
        ("n2", "secret-2", "is not on node"),  # n2's own secret, n1's alloc
        ("n1", "secret-2", "wrong node secret"),  # n2's secret, claiming to be n1
        ("n1", "", "are required"),
        ("", "", "are required"),
    ],
    ids=["another-nodes-alloc", "another-nodes-secret", "empty-secret", "anonymous"],
)
def test_update_allocs__not_the_allocs_node__permission_denied_nothing_written(
    leader: Leader, node_id: str, secret: str, why: str
) -> None:
    _place(leader, "n1", "a1")
    before = leader.digest()
    with pytest.raises(PermissionDeniedError, match=why):
        leader.endpoints.update_allocs([report("a1", "failed")], node_id=node_id, secret_id=secret)
    assert leader.digest() == before


def test_update_allocs__one_foreign_alloc__refuses_the_whole_report(leader: Leader) -> None:
    _place(leader, "n1", "a1")
    _place(leader, "n2", "b1")
    before = leader.digest()
    with pytest.raises(PermissionDeniedError):
        leader.endpoints.update_allocs([report("b1"), report("a1")], node_id="n2", secret_id="secret-2")
    assert leader.digest() == before


@pytest.mark.parametrize(
    ("alloc", "field_name"),
    [
        (structs_pb2.Allocation(id="a" * 200), "allocs[0].id"),
        (structs_pb2.Allocation(id="a1", client_description="d" * 5000), "allocs[0].client_description"),
        (structs_pb2.Allocation(id="a1", client_status="sleepy"), "allocs[0].client_status"),
    ],
    ids=["long-id", "long-description", "bad-status"],
)
def test_update_allocs__oversized_fields__invalid_argument(
    leader: Leader, alloc: structs_pb2.Allocation, field_name: str
) -> None:
    with pytest.raises(ValidationError, match=field_name.replace("[", r"\[").replace("]", r"\]")):
        leader.endpoints.update_allocs([alloc], node_id="n1", secret_id="secret-1")


def test_update_allocs__too_many_task_events__invalid_argument(leader: Leader) -> None:
    alloc = structs_pb2.Allocation(id="a1")
    alloc.task_states["t"].events.extend(structs_pb2.TaskEvent(type="x") for _ in range(257))
    with pytest.raises(ValidationError, match="events: at most 256"):
        leader.endpoints.update_allocs([alloc], node_id="n1", secret_id="secret-1")


def test_authenticate__unknown_node_and_wrong_secret__same_answer(leader: Leader) -> None:
    snap = leader.raft.store.snapshot()
    answers = []
    for node_id, secret in (("n9", "secret-1"), ("n1", "nope")):
        with pytest.raises(PermissionDeniedError) as err:
            leader.endpoints.authenticate_node(snap, node_id, secret)
        answers.append(str(err.value).replace(node_id, "ID"))
    assert answers[0] == answers[1]
