"""What every servicer shares (server/api/_base.py), on a real state store without gRPC."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, cast

import pytest

from drover.server.api._base import get_by_id
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
