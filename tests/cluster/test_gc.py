"""Garbage collection on real processes (issue 13). A periodic job forced 50 times, its
children finished on a real client, `drover system gc` collects the dead children, the
parent's children counts are exact before and after (Nomad's rule: they count the children
that exist), and the offline replay of every raft index still finds every summary equal to
a recount, GC entries included. And with every threshold at a second, the leader's own
timer collects a dead batch job, a stopped service job and a down node unasked.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from deploy.cluster import LocalCluster, wait_for
from drover.sdk import DroverClient
from drover.server.raft_tools import log_entries, open_data_dir
from drover.v1 import structs_pb2
from tests.cluster.cli import run_cli
from tests.cluster.conftest import ready_cluster, wait_ready_nodes, wait_settled
from tests.cluster.jobs import batch_job, child_jobs, service_job
from tests.cluster.replay import check_every_index

FORCED = 50


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    """One server and one client agent (mock driver), always stopped afterwards."""
    with ready_cluster(tmp_path / "cluster", servers=1, clients=1) as c:
        yield c


def _children_counts(cluster: LocalCluster, parent: str) -> tuple[int, int, int]:
    """The parent's children summary as `drover job status -json` prints it."""
    result = run_cli(cluster, "job", "status", "-json", parent)
    assert result.returncode == 0, result.stderr
    children = json.loads(result.stdout)["summary"].get("children", {})
    return (children.get("pending", 0), children.get("running", 0), children.get("dead", 0))


def test_gc__periodic_forced_50_times__system_gc_collects_the_dead_children__counts_exact(
    cluster: LocalCluster,
) -> None:
    with DroverClient(cluster.grpc_addresses, retry_deadline=60) as client:
        job = service_job("yearly", count=1)
        job.type = "batch"
        job.groups[0].tasks[0].config_json = '{"run_for": "10ms"}'
        # Once a year: every launch in this test is a forced one.
        job.periodic.CopyFrom(structs_pb2.PeriodicConfig(enabled=True, spec="0 0 1 1 *", time_zone="UTC"))
        client.register_job(job)
        launched = {client.periodic_force("yearly").child_job_id for _ in range(FORCED)}
        assert len(launched) == FORCED
        wait_for(
            lambda: (
                len(child_jobs(client, "yearly")) == FORCED
                and all(c.status == "dead" for c in child_jobs(client, "yearly"))
            ),
            120,
            0.2,
            f"{FORCED} forced children to finish",
        )
        assert _children_counts(cluster, "yearly") == (0, 0, FORCED)

        result = run_cli(cluster, "system", "gc", "-json")
        assert result.returncode == 0, result.stderr
        collected = json.loads(result.stdout)
        assert collected["jobs"] == FORCED
        assert collected["allocs"] >= FORCED and collected["evals"] >= FORCED

        # Every child is gone with its evals and allocs; the parent stays (it is not stopped).
        assert child_jobs(client, "yearly") == []
        assert client.get_job("yearly").job.id == "yearly"
        assert [a for a in client.list_allocs().allocs if a.job_id.startswith("yearly/")] == []
        # Nomad's rule: the summary counts the children that exist, and a recount agrees.
        assert _children_counts(cluster, "yearly") == (0, 0, 0)
        reconciled = run_cli(cluster, "system", "reconcile", "summaries")
        assert reconciled.returncode == 0, reconciled.stderr
        assert "all were exact, nothing corrected" in reconciled.stdout

        # Nothing left to collect: a second run writes no entry.
        again = run_cli(cluster, "system", "gc")
        assert again.returncode == 0, again.stderr
        assert "0 job(s), 0 eval(s), 0 alloc(s)" in again.stdout

        # The parent launches again after its children were collected.
        relaunched = client.periodic_force("yearly").child_job_id
        assert relaunched not in launched
        wait_for(
            lambda: [c.status for c in child_jobs(client, "yearly")] == ["dead"],
            60,
            0.2,
            "the relaunched child to finish",
        )
        assert _children_counts(cluster, "yearly") == (0, 0, 1)

    cluster.stop_all()
    data_dir = cluster.base_dir / cluster.server_names[0]
    with open_data_dir(str(data_dir)) as data:
        kinds = [entry.get("type") for entry in log_entries(data)]
    assert "ENTRY_TYPE_GC" in kinds, sorted(set(map(str, kinds)))
    report = check_every_index(data_dir, ["yearly"])
    assert set(report.children_seen) == {*launched, relaunched}


# Every threshold and the interval at one second: the leader's own timer, not `system gc`,
# has to collect what this test leaves behind. A client misses heartbeats for two seconds
# before its node is down.
TIMED_GC_ARGS = (
    *("-eval-gc-threshold", "1s", "-batch-eval-gc-threshold", "1s", "-job-gc-threshold", "1s"),
    *("-node-gc-threshold", "1s", "-deployment-gc-threshold", "1s", "-gc-interval", "1s"),
    *("-min-heartbeat-ttl", "1s", "-heartbeat-grace", "1s"),
)


def test_gc__leader_collects_on_its_own_timer__dead_batch_job_stopped_service_down_node(
    tmp_path: Path,
) -> None:
    with LocalCluster(tmp_path / "cluster", servers=1, clients=2, extra_args=TIMED_GC_ARGS) as cluster:
        wait_settled(cluster)
        wait_ready_nodes(cluster, 2)
        with DroverClient(cluster.grpc_addresses, retry_deadline=60) as client:
            batch = batch_job("once")
            batch.groups[0].tasks[0].config_json = '{"run_for": "10ms"}'
            client.register_job(batch)
            client.register_job(service_job("web", count=1))
            wait_for(
                lambda: any(
                    a.job_id == "web" and a.client_status == "running" for a in client.list_allocs().allocs
                ),
                60,
                0.2,
                "the service alloc to run",
            )
            client.deregister_job("web")

            def job_ids() -> set[str]:
                return {j.id for j in client.list_jobs().jobs}

            # The batch job finishes and the service job is stopped: both go, with their
            # allocs and evals, with no one asking.
            wait_for(
                lambda: job_ids() == set(), 60, 0.2, "the dead batch job and the stopped job to be collected"
            )
            wait_for(lambda: not client.list_allocs().allocs, 30, 0.2, "their allocs to be collected")
            wait_for(lambda: not client.list_evals().evals, 30, 0.2, "their evals to be collected")

            # A node whose agent is gone is marked down, then collected; the live one stays.
            names = {n.name: n.id for n in client.list_nodes().nodes}
            gone = cluster.client_names[1]
            cluster.kill_client(1)
            wait_for(
                lambda: {n.id for n in client.list_nodes().nodes} == set(names.values()) - {names[gone]},
                60,
                0.2,
                "the down node to be collected",
            )
            assert {n.status for n in client.list_nodes().nodes} == {"ready"}
