"""Nodes.GetClientAllocs as a node's blocking watch (server/api/nodes.py), on a real FSM and
store, the servicer called without gRPC (in-process stand-ins for raft and the core): a node
with no allocs is told an index it can block on, so its next ask parks instead of being
answered at once, and the first placement on it answers that ask."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from drover.common.secrets import hash_secret
from drover.server.api._notify import IndexNotifier, attach_notifier
from drover.server.api._park import Parking, ParkRequest, parking_scope
from drover.server.api.nodes import NO_ALLOCS_INDEX, NodesServicer, _allocs_news
from drover.server.endpoints import Endpoints
from drover.v1 import api_pb2
from tests.fixtures import mock
from tests.fixtures.fsm_log import FsmLog


def _servicer(log: FsmLog) -> NodesServicer:
    raft = SimpleNamespace(leader_address=lambda: "127.0.0.1:4647")
    clock, ids = SimpleNamespace(now_ns=lambda: mock.NOW), mock.Counter("id")
    endpoints = Endpoints(raft, log.store, clock, ids)  # type: ignore[arg-type]
    fsm = SimpleNamespace(restored_index=0)
    core = SimpleNamespace(store=log.store, raft=raft, name="s1", endpoints=endpoints, fsm=fsm)
    return NodesServicer(core)  # type: ignore[arg-type]


def _ask(servicer: NodesServicer, min_index: int, parking: Parking | None = None, node_id: str = "n1") -> Any:
    request = api_pb2.ClientAllocsRequest(
        node_id=node_id,
        secret_id=f"{node_id}-secret",
        options=api_pb2.QueryOptions(min_index=min_index, wait_ns=30 * 10**9),
    )
    handler = type(servicer).GetClientAllocs.__wrapped__  # the servicer method, without rpc's wrapper
    if parking is None:
        return handler(servicer, request, None)
    parking.runs += 1
    return parking_scope(parking).run(handler, servicer, request, None)


def test_idle_node__told_an_index_it_can_block_on__parks__the_first_placement_wakes_it() -> None:
    log = FsmLog()
    node = mock.node(id="n1", secret_id="", secret_hash=hash_secret("n1-secret"))
    log.apply(mock.register_node_entry(node))
    log.apply(mock.register_job_entry(mock.job(id="web")))
    servicer = _servicer(log)

    first = _ask(servicer, 0)
    assert (list(first.allocs), first.meta.index) == ([], NO_ALLOCS_INDEX)
    assert NO_ALLOCS_INDEX > 0  # 0 would mean "do not wait"

    # Asked again at that index, with nothing new: it parks (under the aio bridge) ...
    parking = Parking()
    with pytest.raises(ParkRequest) as parked:
        _ask(servicer, first.meta.index, parking)
    assert not parked.value.ready(log.snap)

    # ... until an alloc is placed on the node: that state is what wakes it.
    job = log.snap.job("default", "web")
    assert job is not None
    log.apply(mock.plan_entry([mock.alloc(job, node, id="a1")]))
    assert parked.value.ready(log.snap)
    answer = _ask(servicer, first.meta.index, parking)
    assert [a.id for a in answer.allocs] == ["a1"] and answer.meta.index == log.index


class _Core:
    """A core the API's per-server registries (weak-keyed, by identity) can hold."""

    def __init__(self, **parts: Any) -> None:
        self.__dict__.update(parts)


class _Context:
    async def abort(self, code: object, details: str) -> None:
        raise AssertionError(f"aborted {code}: {details}")


def test_alloc_stream__idle_node_from_0__hears_its_empty_allocs_at_once__then_the_placement() -> None:
    log = FsmLog()
    node = mock.node(id="n1", secret_id="", secret_hash=hash_secret("n1-secret"))
    log.apply(mock.register_node_entry(node))
    log.apply(mock.register_job_entry(mock.job(id="web")))
    plain = _servicer(log).core
    core = _Core(store=log.store, raft=plain.raft, name="s1", endpoints=plain.endpoints, fsm=plain.fsm)
    servicer = NodesServicer(core)  # type: ignore[arg-type]
    request = api_pb2.ClientAllocsRequest(node_id="n1", secret_id="n1-secret")

    async def watch() -> list[Any]:
        attach_notifier(core, IndexNotifier(log.store, asyncio.get_running_loop()))  # type: ignore[arg-type]
        stream = servicer.WatchClientAllocs(request, _Context())  # type: ignore[arg-type]
        first = await asyncio.wait_for(anext(stream), 5.0)
        job = log.snap.job("default", "web")
        assert job is not None
        log.apply(mock.plan_entry([mock.alloc(job, node, id="a1")]))
        second = await asyncio.wait_for(anext(stream), 5.0)
        await stream.aclose()
        return [first, second]

    first, second = asyncio.run(watch())
    assert (list(first.allocs), first.meta.index) == ([], NO_ALLOCS_INDEX)
    assert [a.id for a in second.allocs] == ["a1"] and second.meta.index == log.index


def _two_nodes_one_placed() -> tuple[FsmLog, NodesServicer, Any]:
    """n1 idle, n2 given an alloc after it: the alloc table's index is past n1's own."""
    log = FsmLog()
    nodes = [mock.node(id=n, secret_id="", secret_hash=hash_secret(f"{n}-secret")) for n in ("n1", "n2")]
    for node in nodes:
        log.apply(mock.register_node_entry(node))
    log.apply(mock.register_job_entry(mock.job(id="web")))
    job = log.snap.job("default", "web")
    assert job is not None
    log.apply(mock.plan_entry([mock.alloc(job, nodes[1], id="b1")]))
    return log, _servicer(log), (job, nodes)


def test_idle_node__told_the_table_index__parks_through_other_nodes_placements__wakes_on_its_own() -> None:
    log, servicer, (job, (n1, n2)) = _two_nodes_one_placed()
    first = _ask(servicer, 0)
    assert first.meta.index == log.index > NO_ALLOCS_INDEX  # the table's index, not n1's own

    # Asked again at what it was told: nothing of n1's changed, so it parks (it used to be
    # answered at once, its own index 1 differing from the table's: every idle node polled).
    parking = Parking()
    with pytest.raises(ParkRequest) as parked:
        _ask(servicer, first.meta.index, parking)
    log.apply(mock.plan_entry([mock.alloc(job, n2, id="b2")]))
    assert not parked.value.ready(log.snap)  # another node's placement is not n1's news
    log.apply(mock.plan_entry([mock.alloc(job, n1, id="a1")]))
    assert parked.value.ready(log.snap)
    answer = _ask(servicer, first.meta.index, parking)
    assert [a.id for a in answer.allocs] == ["a1"] and answer.meta.index == log.index


def test_ask_past_the_state__rewound__or_after_a_restore__is_answered_at_once() -> None:
    _, servicer, _ = _two_nodes_one_placed()
    told = _ask(servicer, 0).meta.index
    # A state behind what the node was told (rebuilt servers): the client must hear it.
    behind = _ask(servicer, told + 100, Parking())
    assert behind.meta.index == told
    # A snapshot restore after ``told``: the node's allocs may be older than what it runs.
    with pytest.raises(ParkRequest):
        _ask(servicer, told, Parking())
    servicer.core.fsm.restored_index = told + 1
    restored = _ask(servicer, told, Parking())
    assert restored.meta.index == told


def test_restore_before_the_fsm_notes_it__the_node_index_moving_back_is_news() -> None:
    """A restore's commit wakes the parked ask before FSM.restored_index is set: the node's
    own index going back from what it was when the ask came must answer it by itself."""
    log, _, _ = _two_nodes_one_placed()
    own = log.index  # n2's alloc b1 is the newest write
    assert not _allocs_news("n2", own, own, lambda: 0, log.snap)
    assert _allocs_news("n2", own, own + 5, lambda: 0, log.snap)  # it was newer when the ask came
