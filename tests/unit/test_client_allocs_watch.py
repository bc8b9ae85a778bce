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
from drover.server.api.nodes import NO_ALLOCS_INDEX, NodesServicer
from drover.server.endpoints import Endpoints
from drover.v1 import api_pb2
from tests.fixtures import mock
from tests.fixtures.fsm_log import FsmLog


def _servicer(log: FsmLog) -> NodesServicer:
    raft = SimpleNamespace(leader_address=lambda: "127.0.0.1:4647")
    clock, ids = SimpleNamespace(now_ns=lambda: mock.NOW), mock.Counter("id")
    endpoints = Endpoints(raft, log.store, clock, ids)  # type: ignore[arg-type]
    core = SimpleNamespace(store=log.store, raft=raft, name="s1", endpoints=endpoints)
    return NodesServicer(core)  # type: ignore[arg-type]


def _ask(servicer: NodesServicer, min_index: int, parking: Parking | None = None) -> Any:
    request = api_pb2.ClientAllocsRequest(
        node_id="n1",
        secret_id="n1-secret",
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
    core = _Core(store=log.store, raft=plain.raft, name="s1", endpoints=plain.endpoints)
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
