"""Fixtures for tests that run real server processes on loopback."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from deploy.cluster import LocalCluster, wait_for
from drover.sdk import DroverClient


def wait_settled(cluster: LocalCluster, timeout: float = 60) -> None:
    """A leader, and every server's gRPC address announced: the state stops changing."""
    cluster.wait_for_leader(timeout=timeout)

    def announced() -> bool:
        tls = cluster.tls.cli_files if cluster.tls is not None else None
        with DroverClient(cluster.grpc_addresses, retry_deadline=5, tls=tls) as client:
            peers = client.raft_peers().peers
        return len(peers) == len(cluster.server_names) and all(p.grpc_address for p in peers)

    wait_for(announced, timeout, 0.1, "every server to announce its gRPC address")
    cluster.wait_converged(timeout=timeout)


@pytest.fixture
def two_clients(tmp_path: Path) -> Iterator[LocalCluster]:
    """One server and client agents c1 and c2, real processes, always stopped afterwards."""
    with LocalCluster(tmp_path / "cluster", servers=1, clients=2) as c:
        c.wait_for_leader(60)
        yield c


def wait_ready_nodes(cluster: LocalCluster, count: int, timeout: float = 60) -> None:
    """At least ``count`` nodes ready: the client agents registered and heartbeating."""
    with DroverClient(cluster.grpc_addresses, retry_deadline=30) as client:
        wait_for(
            lambda: sum(n.status == "ready" for n in client.list_nodes().nodes) >= count,
            timeout,
            0.2,
            lambda: f"{count} ready nodes\n" + cluster.logs_tail(),
        )


@pytest.fixture
def two_ready_clients(two_clients: LocalCluster) -> LocalCluster:
    """``two_clients``, once both agents are ready nodes: a job run now can use either."""
    wait_ready_nodes(two_clients, 2)
    return two_clients


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    """Three real server processes (free ports, temp data dirs), always stopped afterwards."""
    with LocalCluster(tmp_path / "cluster", servers=3) as c:
        wait_settled(c)
        yield c


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/cluster/" in str(item.fspath):
            item.add_marker(pytest.mark.cluster)
