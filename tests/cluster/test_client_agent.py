"""A real client agent process (``drover agent -client``) against a real server process.

It must register with its fingerprint, run the allocs the scheduler places on it (mock
driver), report them ``running``, and, when the agent process is restarted, come back to
the same allocs without restarting them (docs/design.md#invariant-5, docs/field-reports.md#field-report-3).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from deploy.cluster import LocalCluster, wait_for
from drover.sdk import DroverClient
from drover.v1 import structs_pb2
from tests.cluster.jobs import running_allocs, service_job


@pytest.fixture
def one_of_each(tmp_path: Path) -> Iterator[LocalCluster]:
    """One server and one client agent (``c1``), real processes, always stopped afterwards."""
    with LocalCluster(tmp_path / "cluster", servers=1, clients=1) as cluster:
        cluster.wait_for_leader(60)
        yield cluster


def _ready_node(client: DroverClient, name: str) -> structs_pb2.Node | None:
    return next((n for n in client.list_nodes().nodes if n.name == name and n.status == "ready"), None)


def _exactly(allocs: list[structs_pb2.Allocation], n: int) -> list[structs_pb2.Allocation] | None:
    return allocs if len(allocs) == n else None


def _two_web_allocs_running(
    client: DroverClient, cluster: LocalCluster, when: str = ""
) -> list[structs_pb2.Allocation]:
    allocs = wait_for(
        lambda: _exactly(running_allocs(client, "web"), 2),
        60,
        0.2,
        lambda: f"two running allocs{when}\n" + cluster.logs_tail(),
    )
    assert allocs is not None
    return allocs


def test_client_agent__registers_and_runs_a_mock_service(one_of_each: LocalCluster) -> None:
    cluster = one_of_each
    with DroverClient(cluster.grpc_addresses, retry_deadline=60) as client:
        node = wait_for(
            lambda: _ready_node(client, "c1"), 60, 0.2, lambda: "c1 ready\n" + cluster.logs_tail()
        )
        assert node is not None
        assert node.attributes["driver.mock"] == "1" and node.attributes["unique.name"] == "c1"
        assert node.resources.cpu_mhz > 0 and node.resources.memory_mb > 0
        assert not node.secret_id  # readers never see it

        client.register_job(service_job("web", count=2))
        for a in _two_web_allocs_running(client, cluster):
            assert a.node_id == node.id
            state = a.task_states["server"]
            assert state.state == "running" and state.started_at_ns > 0
            assert [e.type for e in state.events][:2] == ["Received", "Started"]


def test_client_agent__restarted_agent_keeps_the_same_allocs_running(one_of_each: LocalCluster) -> None:
    cluster = one_of_each
    with DroverClient(cluster.grpc_addresses, retry_deadline=60) as client:
        wait_for(lambda: _ready_node(client, "c1"), 60, 0.2, lambda: "c1 ready\n" + cluster.logs_tail())
        client.register_job(service_job("web", count=2))
        ids = sorted(a.id for a in _two_web_allocs_running(client, cluster))

        assert cluster.stop_client(0) == 0  # SIGTERM: the agent leaves its tasks running
        cluster.restart_client(0)
        wait_for(
            lambda: "client.registered" in cluster.client_log(0).split("client.stopped")[-1],
            60,
            0.2,
            lambda: "the restarted agent registering\n" + cluster.logs_tail(),
        )
        after = _two_web_allocs_running(client, cluster, " after the restart")
        assert sorted(a.id for a in after) == ids
        for a in after:
            events = [e.type for e in a.task_states["server"].events]
            assert events.count("Started") == 1, events  # re-attached, never restarted
