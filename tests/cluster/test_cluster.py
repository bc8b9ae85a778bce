"""A real 3-server cluster: acknowledged writes survive leader kills and full restarts."""

from __future__ import annotations

import signal

from deploy.cluster import LocalCluster, wait_for
from drover.sdk import DroverClient
from tests.cluster.jobs import service_job

JOBS = 50


def _job_ids_on(cluster: LocalCluster, i: int) -> set[str]:
    with DroverClient(cluster.grpc_addresses[i], retry_deadline=30) as client:
        return {job.id for job in client.list_jobs(stale=True).jobs}


def test_cluster__leader_killed__acknowledged_jobs_survive_and_killed_server_catches_up(
    cluster: LocalCluster,
) -> None:
    leader = cluster.leader_index()
    follower = (leader + 1) % 3
    acked: set[str] = set()
    with DroverClient(cluster.grpc_addresses[follower], retry_deadline=30) as client:
        for n in range(JOBS):
            response = client.register_job(service_job(f"job-{n:02d}"))
            assert response.eval_id, "a service job registration creates its evaluation"
            acked.add(f"job-{n:02d}")

    cluster.kill(leader, signal.SIGKILL)
    survivors = [i for i in range(3) if i != leader]
    new_leader = cluster.leader_index(timeout=60)
    assert new_leader in survivors
    for i in survivors:
        # Stale reads show each survivor's own state, not the new leader's.
        assert wait_for(lambda i=i: acked <= _job_ids_on(cluster, i), 30, 0.2, f"all jobs on s{i + 1}")

    with DroverClient(cluster.grpc_addresses[survivors[0]], retry_deadline=30) as client:
        for n in range(10):
            client.register_job(service_job(f"after-{n}"))
            acked.add(f"after-{n}")

    cluster.restart(leader)
    digest, index = cluster.wait_converged(timeout=60)
    assert acked <= _job_ids_on(cluster, leader)
    assert len(cluster.digests()) == 3

    # Stop everything and start it again from the data dirs: the same state comes back.
    cluster.stop_all()
    for i in range(3):
        cluster.restart(i)
    cluster.wait_for_leader(timeout=60)
    assert cluster.wait_converged(timeout=60) == (digest, index)
    for i in range(3):
        assert acked <= _job_ids_on(cluster, i)


def test_cluster__reads_through_follower_see_leaders_writes(cluster: LocalCluster) -> None:
    leader = cluster.leader_index()
    follower = (leader + 2) % 3
    with DroverClient(cluster.grpc_addresses[leader]) as at_leader:
        written = at_leader.register_job(service_job("read-your-writes")).meta.index
    with DroverClient(cluster.grpc_addresses[follower]) as at_follower:
        # A default (non-stale) read is answered by the leader, so it sees the write.
        response = at_follower.get_job("read-your-writes")
        assert response.job.id == "read-your-writes"
        assert response.meta.index >= written
        assert response.meta.served_by == cluster.server_names[leader]
        peers = at_follower.raft_peers()
        assert sum(p.leader for p in peers.peers) == 1
        assert {p.name for p in peers.peers} == set(cluster.server_names)
