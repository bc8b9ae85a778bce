"""A drain honours the group's ``migrate`` block, the whole loop: real server, two real
client agents running ``raw_exec`` processes, the CLI as an operator runs it.

With ``max_parallel = 1`` the allocs leave the drained node one at a time: each
replacement is placed only after the one before it has run for ``min_healthy_time`` (its
client's report that it runs brings the eval, the scheduler's own follow-up the next).
What the operator sees afterwards is read from the allocs: every replacement's creation
time against its predecessor's start.
"""

from __future__ import annotations

import itertools
from pathlib import Path

from deploy.cluster import LocalCluster, wait_for
from drover.sdk import DroverClient
from drover.v1 import structs_pb2
from tests.cluster.cli import run_cli
from tests.cluster.jobs import running_allocs

COUNT = 3
MIN_HEALTHY_S = 1

JOB = f"""
job "moving" {{
  datacenters = ["dc1"]
  group "g" {{
    count = {COUNT}
    migrate {{
      max_parallel     = 1
      health_check     = "task_states"
      min_healthy_time = "{MIN_HEALTHY_S}s"
      healthy_deadline = "1m"
    }}
    task "t" {{
      driver = "raw_exec"
      config {{
        command = "/bin/sleep"
        args    = ["600"]
      }}
      resources {{
        cpu    = 50
        memory = 32
      }}
    }}
  }}
}}
"""


def _started_ns(alloc: structs_pb2.Allocation) -> int:
    return max(ts.started_at_ns for ts in alloc.task_states.values())


def test_drain__migrate_max_parallel_1__replacements_one_after_another(
    two_ready_clients: LocalCluster, tmp_path: Path
) -> None:
    cluster = two_ready_clients
    with DroverClient(cluster.grpc_addresses, retry_deadline=60) as client:
        target, other = sorted(client.list_nodes().nodes, key=lambda n: n.name)
        # Every alloc on the node to drain: the other takes no placements until then.
        client.update_eligibility(other.id, "ineligible")
        path = tmp_path / "moving.hcl"
        path.write_text(JOB)
        ran = run_cli(cluster, "job", "run", "-detach", str(path))
        assert ran.returncode == 0, ran.stderr
        first = wait_for(
            lambda: r if len(r := running_allocs(client, "moving")) == COUNT else None,
            60,
            0.2,
            lambda: f"{COUNT} allocs running\n" + cluster.logs_tail(),
        )
        assert first is not None and {a.node_id for a in first} == {target.id}
        client.update_eligibility(other.id, "eligible")

        drained = run_cli(cluster, "node", "drain", "-enable", "-deadline", "5m", target.id, timeout=120)
        assert drained.returncode == 0, drained.stdout + drained.stderr
        assert "drain complete: every allocation has moved" in drained.stdout, drained.stdout

        moved = running_allocs(client, "moving")
        assert len(moved) == COUNT and {a.node_id for a in moved} == {other.id}, moved
        replacements = sorted(moved, key=lambda a: a.create_time_ns)
        for before, after in itertools.pairwise(replacements):
            # The next one was placed only once the one before had settled.
            waited_ns = after.create_time_ns - _started_ns(before)
            assert waited_ns >= MIN_HEALTHY_S * 1_000_000_000, (before, after)
        for alloc in first:
            gone = client.get_alloc(alloc.id).alloc
            assert gone.desired_status == "stop", gone
