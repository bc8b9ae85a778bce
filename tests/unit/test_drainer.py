"""drover.server.drainer: when a drain has nothing left to move (pure, on mock records)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from drover.scheduler.structs import (
    ALLOC_CLIENT_COMPLETE,
    ALLOC_CLIENT_RUNNING,
    ALLOC_DESIRED_STOP,
    DrainStrategy,
)
from drover.server.drainer import drain_complete, drain_remaining
from tests.fixtures import mock

NODE = replace(mock.node(id="n1"), drain_strategy=DrainStrategy())
SERVICE = mock.job(id="web")
SYSTEM = mock.system_job(id="agent")
TYPES = {("default", "web"): "service", ("default", "agent"): "system"}


@pytest.mark.parametrize(
    ("allocs", "ignore_system", "remaining"),
    [
        ([], False, 0),
        ([{"job": "web", "client_status": ALLOC_CLIENT_RUNNING}], False, 1),
        (
            [{"job": "web", "client_status": ALLOC_CLIENT_RUNNING, "desired_status": ALLOC_DESIRED_STOP}],
            False,
            0,
        ),
        ([{"job": "web", "client_status": ALLOC_CLIENT_COMPLETE}], False, 0),
        ([{"job": "agent", "client_status": ALLOC_CLIENT_RUNNING}], False, 1),
        ([{"job": "agent", "client_status": ALLOC_CLIENT_RUNNING}], True, 0),
        ([{"job": "web", "client_status": ALLOC_CLIENT_RUNNING}], True, 1),
        ([{"job": "web", "client_status": ALLOC_CLIENT_RUNNING, "node_id": "elsewhere"}], False, 0),
    ],
    ids=[
        "empty",
        "service-running",
        "service-told-to-stop",
        "service-finished",
        "system-running",
        "system-running-ignored",
        "ignore-system-still-moves-services",
        "another-node",
    ],
)
def test_drain_remaining(allocs: list[dict[str, str]], ignore_system: bool, remaining: int) -> None:
    node = replace(NODE, drain_strategy=DrainStrategy(ignore_system_jobs=ignore_system))
    records = []
    for i, spec in enumerate(allocs):
        job = SERVICE if spec["job"] == "web" else SYSTEM
        fields = {k: v for k, v in spec.items() if k != "job"}
        records.append(replace(mock.alloc(job, node), id=f"a{i}", **fields))
    assert len(drain_remaining(node, records, TYPES)) == remaining
    assert drain_complete(node, records, TYPES) is (remaining == 0)


def test_drain_complete__not_draining_is_never_complete() -> None:
    assert not drain_complete(replace(NODE, drain_strategy=None), [], TYPES)


def test_drain_remaining__unknown_job_is_waited_for() -> None:
    node = replace(NODE, drain_strategy=DrainStrategy(ignore_system_jobs=True))
    orphan = replace(mock.alloc(SYSTEM, node), id="o", client_status=ALLOC_CLIENT_RUNNING)
    assert drain_remaining(node, [orphan], {}) == [orphan]
