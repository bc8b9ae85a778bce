"""What every servicer shares (server/api/_base.py), on a real state store without gRPC."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any, cast

import grpc
import pytest

from drover.scheduler import validate
from drover.server.api._base import get_by_id, rpc, status_of
from drover.server.api._park import ConfirmRequest, Parking, parking_scope
from drover.server.errors import NotFoundError, ValidationError
from drover.server.state_store import Snapshot
from drover.v1 import api_pb2
from tests.fixtures import mock
from tests.harness import Harness


@dataclass
class _Raft:
    def leader_address(self) -> str:
        return "127.0.0.1:4647"


@dataclass
class _Core:
    """The part of ServerCore a read uses: its store, its raft's leader, its name."""

    store: Any
    raft: _Raft = field(default_factory=_Raft)
    name: str = "s1"


@pytest.fixture
def core() -> Any:
    h = Harness()
    h.add_node(mock.node(id="n1"))
    return cast(Any, _Core(h.store))


def test_get_by_id__known__object_and_the_table_index(core: Any) -> None:
    node, meta = get_by_id(core, api_pb2.QueryOptions(), "nodes", "node", "n1", Snapshot.node)

    assert node.id == "n1"
    assert meta.index == core.store.snapshot().table_index("nodes")
    assert meta.served_by == "s1" and meta.known_leader


def test_get_by_id__unknown__not_found_naming_it(core: Any) -> None:
    with pytest.raises(NotFoundError, match=r"^node 'n9' not found$"):
        get_by_id(core, api_pb2.QueryOptions(), "nodes", "node", "n9", Snapshot.node)


def test_get_by_id__empty__required(core: Any) -> None:
    with pytest.raises(ValidationError, match=r"^node_id: required$"):
        get_by_id(core, api_pb2.QueryOptions(), "nodes", "node", "", Snapshot.node)


# --- leader-confirmed reads, once per call (in-process fakes of the core and context) -----


@dataclass
class _LeadingRaft:
    def is_leader(self) -> bool:
        return True

    def leader_ready(self) -> bool:
        return True


@dataclass
class _Cfg:
    acl_enabled: bool = False


@dataclass(eq=False)  # hashable by identity, as ServerCore (the limits are kept per core)
class _ConfirmingCore:
    raft: _LeadingRaft = field(default_factory=_LeadingRaft)
    cfg: _Cfg = field(default_factory=_Cfg)
    confirmations: int = 0

    def confirm_leadership(self) -> None:
        self.confirmations += 1

    async def confirm_leadership_async(self) -> None:
        self.confirmations += 1


class _Context:
    def peer(self) -> str:
        return "ipv4:127.0.0.1:5000"

    def invocation_metadata(self) -> tuple[()]:
        return ()


class _Jobs:
    def __init__(self, core: _ConfirmingCore) -> None:
        self.core = core

    @rpc("Jobs", "read")
    def Get(self, request: api_pb2.JobGetRequest, context: Any) -> str:
        return "answered"


def test_rpc_read__confirms_leadership_once_per_call_not_again_when_a_parked_query_reruns() -> None:
    core = _ConfirmingCore()
    jobs = _Jobs(core)
    request = api_pb2.JobGetRequest(job_id="web")

    assert jobs.Get(request, _Context()) == "answered"
    assert core.confirmations == 1

    # Under the aio bridge the first run hands the round to the loop instead of waiting in
    # its thread; the bridge awaits it, marks the call confirmed and runs it again.
    parking = Parking()
    parking.runs += 1
    with pytest.raises(ConfirmRequest) as handed:
        parking_scope(parking).run(jobs.Get, request, _Context())
    assert core.confirmations == 1
    asyncio.run(handed.value.confirm())
    assert core.confirmations == 2
    parking.confirmed = True
    for _run in range(3):  # the answering run, then two wakes of a blocking query
        parking.runs += 1
        assert parking_scope(parking).run(jobs.Get, request, _Context()) == "answered"
    assert core.confirmations == 2

    stale = api_pb2.JobGetRequest(job_id="web", options=api_pb2.QueryOptions(stale=True))
    assert jobs.Get(stale, _Context()) == "answered"
    assert core.confirmations == 2  # a stale read asks no one


def test_status_of__each_own_error_its_status_naming_the_field() -> None:
    """One mapping for unary calls (_map_errors) and async streams (the rpc wrapper)."""
    invalid = validate.ValidationError([validate.FieldError("job.count", "must be >= 0")])
    assert status_of(invalid) == (grpc.StatusCode.INVALID_ARGUMENT, "job.count: must be >= 0")
    assert status_of(NotFoundError("job web not found")) == (grpc.StatusCode.NOT_FOUND, "job web not found")
    assert status_of(ValidationError("namespace: unknown"))[0] == grpc.StatusCode.INVALID_ARGUMENT
