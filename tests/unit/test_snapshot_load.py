"""Decoding a whole state pauses the cyclic collector (server/snapshot.py,
``from_snapshot``): every object it makes is live, so a collection there is wasted work
that grows with the heap (tests/bench/state_load.py measures it)."""

from __future__ import annotations

import dataclasses
import gc
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import immutables
import pytest

from drover.server import snapshot
from drover.server.state_store import Tables
from drover.v1 import raft_pb2
from tests.fixtures import mock

ALLOCS = 3_000


@pytest.fixture(scope="module")
def state() -> raft_pb2.StateSnapshot:
    job = mock.job()
    nodes = [mock.node(id=f"node-{i:03d}", name=f"node-{i:03d}") for i in range(100)]
    allocs = {a.id: a for a in (mock.alloc(job, nodes[i % 100], index=i) for i in range(ALLOCS))}
    tables = dataclasses.replace(
        Tables(), allocs=immutables.Map(allocs), nodes=immutables.Map({n.id: n for n in nodes})
    )
    return snapshot.to_snapshot(tables)


@contextmanager
def collections_while_decoding(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """The generations of the collections that start while ``_decode_tables`` runs (the
    one that may follow as soon as the collector is back on is not the decode's)."""
    starts: list[int] = []
    decoding = [False]
    decode = snapshot._decode_tables

    def watched(state: raft_pb2.StateSnapshot) -> Tables:
        decoding[0] = True
        try:
            return decode(state)
        finally:
            decoding[0] = False

    def on_gc(phase: str, info: dict[str, Any]) -> None:
        if phase == "start" and decoding[0]:
            starts.append(int(info["generation"]))

    monkeypatch.setattr(snapshot, "_decode_tables", watched)
    gc.callbacks.append(on_gc)
    try:
        yield starts
    finally:
        gc.callbacks.remove(on_gc)


def _decode_counting(
    monkeypatch: pytest.MonkeyPatch,
    decode: Callable[[raft_pb2.StateSnapshot], Tables],
    state: raft_pb2.StateSnapshot,
) -> int:
    assert gc.isenabled()
    with collections_while_decoding(monkeypatch) as starts:
        tables = decode(state)
    assert len(tables.allocs) == ALLOCS
    return len(starts)


def test_the_decode_itself_would_start_collections(
    monkeypatch: pytest.MonkeyPatch, state: raft_pb2.StateSnapshot
) -> None:
    # What the pause is for: the same steps with the collector running do collect.
    assert _decode_counting(monkeypatch, lambda s: snapshot._decode_tables(s), state) > 0


def test_from_snapshot_runs_no_collection_and_turns_the_collector_back_on(
    monkeypatch: pytest.MonkeyPatch, state: raft_pb2.StateSnapshot
) -> None:
    assert _decode_counting(monkeypatch, snapshot.from_snapshot, state) == 0
    assert gc.isenabled()


def test_a_collector_paused_by_someone_else_stays_paused(state: raft_pb2.StateSnapshot) -> None:
    gc.disable()
    try:
        snapshot.from_snapshot(state)
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_the_collector_is_back_on_after_a_decode_that_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    def fails(_state: raft_pb2.StateSnapshot) -> Tables:
        raise ValueError("a state that does not decode")

    monkeypatch.setattr(snapshot, "_decode_tables", fails)
    with pytest.raises(ValueError, match="does not decode"):
        snapshot.from_snapshot(raft_pb2.StateSnapshot())
    assert gc.isenabled()
