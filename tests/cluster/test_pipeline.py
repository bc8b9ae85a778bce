"""The scheduling pipeline on a real cluster: placement, blocked evals, and a leader kill.

The broker and the blocked-eval tracker live only in the leader's memory; a new leader must
rebuild both from the replicated state and carry on.
"""

from __future__ import annotations

import signal

from deploy.cluster import LocalCluster, wait_for
from drover.sdk import DroverClient
from drover.v1 import structs_pb2
from tests.cluster.jobs import service_job
from tests.cluster.nodes import simulated_node


def _live(client: DroverClient, job_id: str) -> list[structs_pb2.Allocation]:
    return [
        a
        for a in client.list_allocs(job_id=job_id).allocs
        if a.desired_status == "run" and a.client_status not in ("complete", "failed", "lost")
    ]


def test_pipeline__blocked_eval_survives_leader_kill__new_capacity_places_the_rest(
    cluster: LocalCluster,
) -> None:
    with DroverClient(cluster.grpc_addresses, retry_deadline=60) as client:
        # Room for 5 allocs of 100 MHz / 64 MB.
        client.register_node(simulated_node("small-1", cpu=500, memory=4096))
        ev_id = client.register_job(service_job("web", count=8)).eval_id

        def finished() -> structs_pb2.Evaluation | None:
            ev = client.get_eval(ev_id).eval
            return ev if ev.status in ("complete", "failed") else None

        ev = wait_for(finished, 60, 0.1, "the registration eval to finish")
        assert ev is not None and ev.status == "complete"
        assert ev.blocked_eval, "3 allocs did not fit: a blocked eval must exist"
        assert len(_live(client, "web")) == 5
        assert client.get_eval(ev.blocked_eval).eval.status == "blocked"
        summary = client.job_summary("web").summary.summary["web"]
        assert summary.queued == 3

        leader = cluster.leader_index()
        cluster.kill(leader, signal.SIGKILL)
        cluster.leader_index(timeout=60)

        # New capacity: the new leader's rebuilt blocked tracker releases the eval.
        client.register_node(simulated_node("small-2", cpu=500, memory=4096))
        assert wait_for(lambda: len(_live(client, "web")) == 8, 60, 0.2, "all 8 allocs placed")
        assert wait_for(
            lambda: client.get_eval(ev.blocked_eval).eval.status == "complete", 60, 0.2, "blocked eval done"
        )
        names = sorted(a.name for a in _live(client, "web"))
        assert names == [f"web.web[{i}]" for i in range(8)]


def test_pipeline__one_plan_per_node_never_overcommits_under_concurrent_jobs(cluster: LocalCluster) -> None:
    with DroverClient(cluster.grpc_addresses, retry_deadline=60) as client:
        for n in range(3):
            client.register_node(simulated_node(f"n{n}", cpu=1000, memory=8192))
        # 12 jobs x 3 allocs x 100 MHz = 3,600 MHz asked, 3,000 MHz available.
        for j in range(12):
            client.register_job(service_job(f"svc-{j}", count=3))

        def settled() -> bool:
            evals = client.list_evals().evals
            return bool(evals) and all(e.status not in ("pending",) for e in evals)

        assert wait_for(settled, 90, 0.2, "every eval processed")
        allocs = [a for a in client.list_allocs().allocs if a.desired_status == "run"]
        per_node: dict[str, int] = {}
        for alloc in allocs:
            per_node[alloc.node_id] = per_node.get(alloc.node_id, 0) + alloc.resources.cpu_mhz
        assert per_node and all(cpu <= 1000 for cpu in per_node.values()), per_node
        assert len(allocs) == 30
