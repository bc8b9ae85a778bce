"""Simulated nodes for cluster tests: registered through the API like a client would."""

from __future__ import annotations

from drover.sdk import DroverClient
from drover.v1 import structs_pb2


def simulated_secret(node_id: str) -> str:
    """The secret a simulated node registers with (and authenticates its later calls by)."""
    return f"{node_id}-secret"


def simulated_node(node_id: str, *, cpu: int = 4000, memory: int = 8192) -> structs_pb2.Node:
    """A ready node announcing the ``mock`` driver, the one the tests' jobs use: the
    scheduler places a task only on a node that announces its driver."""
    return structs_pb2.Node(
        id=node_id,
        secret_id=simulated_secret(node_id),
        name=node_id,
        datacenter="dc1",
        status="ready",
        scheduling_eligibility="eligible",
        attributes={"kernel.name": "linux", "unique.name": node_id, "driver.mock": "1"},
        resources=structs_pb2.NodeResources(
            cpu_mhz=cpu, memory_mb=memory, disk_mb=100_000, min_dynamic_port=20000, max_dynamic_port=32000
        ),
    )


def register_nodes(client: DroverClient, node_ids: list[str]) -> None:
    for node_id in node_ids:
        client.register_node(simulated_node(node_id))
