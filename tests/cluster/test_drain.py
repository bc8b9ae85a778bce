"""``drover node drain -enable`` follows the drain through: real server, two real client
agents running ``raw_exec`` processes, the CLI as an operator runs it.

The CLI returns only once the leader has marked the drain complete (every service alloc
moved to the other node) and the moved allocs' processes have stopped; with
``-ignore-system`` a system job's alloc stays on the drained node. Afterwards the node is
no longer draining but stays ineligible until an operator re-enables it, as in Nomad.
"""

from __future__ import annotations

from pathlib import Path

from deploy.cluster import LocalCluster, wait_for
from drover.sdk import DroverClient
from drover.v1 import structs_pb2
from tests.cluster.cli import run_cli
from tests.cluster.jobs import running_allocs

_TASK = """
    task "t" {
      driver = "raw_exec"
      config {
        command = "/bin/sleep"
        args    = ["600"]
      }
      resources {
        cpu    = 50
        memory = 32
      }
    }"""

SERVICE = f"""
job "web" {{
  datacenters = ["dc1"]
  group "g" {{
    count = 4
    {_TASK}
  }}
}}
"""

SYSTEM = f"""
job "agent" {{
  type        = "system"
  datacenters = ["dc1"]
  group "g" {{
    {_TASK}
  }}
}}
"""


def _running(client: DroverClient, job_id: str, n: int) -> list[structs_pb2.Allocation] | None:
    allocs = running_allocs(client, job_id)
    return allocs if len(allocs) == n else None


def test_drain__follows_until_every_alloc_moved_and_stopped(
    two_clients: LocalCluster, tmp_path: Path
) -> None:
    cluster = two_clients
    for name, text in (("web", SERVICE), ("agent", SYSTEM)):
        path = tmp_path / f"{name}.hcl"
        path.write_text(text)
        ran = run_cli(cluster, "job", "run", "-detach", str(path))
        assert ran.returncode == 0, ran.stderr
    with DroverClient(cluster.grpc_addresses, retry_deadline=60) as client:
        nodes = wait_for(
            lambda: (
                ns if len(ns := [n for n in client.list_nodes().nodes if n.status == "ready"]) == 2 else None
            ),
            60,
            0.2,
            lambda: "2 ready nodes\n" + cluster.logs_tail(),
        )
        assert nodes is not None
        web = wait_for(
            lambda: _running(client, "web", 4), 60, 0.2, lambda: "4 web allocs\n" + cluster.logs_tail()
        )
        assert wait_for(lambda: _running(client, "agent", 2), 60, 0.2, "2 system allocs") is not None
        assert web is not None
        # Drain the node holding the most web allocs (binpacking may put all four on one).
        target = max(nodes, key=lambda n: sum(a.node_id == n.id for a in web))
        other = next(n for n in nodes if n.id != target.id)
        on_target = {a.id for a in web if a.node_id == target.id}
        assert on_target

        drained = run_cli(cluster, "node", "drain", "-enable", "-ignore-system", target.id, timeout=120)
        assert drained.returncode == 0, drained.stdout + drained.stderr
        out = drained.stdout
        assert "allocation(s) to move" in out, out
        assert "drain complete: every allocation has moved" in out, out
        assert out.rstrip().endswith("have stopped"), out

        # The CLI returned: the state already says what it printed.
        node = client.get_node(target.id).node
        assert not node.HasField("drain_strategy")
        assert node.scheduling_eligibility == "ineligible"
        assert node.events[-1].message == "Node drain complete"
        web_now = _running(client, "web", 4)
        assert web_now is not None and all(a.node_id == other.id for a in web_now), web_now
        for alloc_id in on_target:
            moved = client.get_alloc(alloc_id).alloc
            assert moved.desired_status == "stop" and moved.client_status == "complete", moved
        agents = _running(client, "agent", 2)
        assert agents is not None and target.id in {a.node_id for a in agents}


def test_drain__detach_returns_at_once_and_the_leader_still_completes_it(two_clients: LocalCluster) -> None:
    cluster = two_clients
    with DroverClient(cluster.grpc_addresses, retry_deadline=60) as client:
        node = wait_for(
            lambda: next((n for n in client.list_nodes().nodes if n.status == "ready"), None),
            60,
            0.2,
            "a node",
        )
        assert node is not None
        detached = run_cli(cluster, "node", "drain", "-enable", "-detach", "-yes", node.id)
        assert detached.returncode == 0, detached.stderr
        assert "to move" not in detached.stdout

        def completed() -> bool:
            got = client.get_node(node.id).node
            return not got.HasField("drain_strategy") and got.events[-1].message == "Node drain complete"

        wait_for(completed, 30, 0.2, "the leader to complete the drain of an empty node")
