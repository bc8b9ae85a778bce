"""The live checker on a real cluster: ``Operator.Invariants`` and ``drover operator invariants``.

A broken state is reached the way an operator could reach it, by restoring a crafted
backup (a job summary that disagrees with its allocs); every server then reports it, the
CLI exits 1 naming it, and ``drover system reconcile summaries`` repairs it.
"""

from __future__ import annotations

from pathlib import Path

from deploy.cluster import LocalCluster, wait_for
from drover.sdk import DroverClient
from drover.v1 import raft_pb2
from tests.cluster.cli import run_cli
from tests.cluster.jobs import service_job
from tests.cluster.nodes import register_nodes


def _violations(cluster: LocalCluster, i: int) -> list[str]:
    with DroverClient(cluster.grpc_addresses[i], retry_deadline=30) as client:
        return list(client.invariants().violations)


def test_invariants_rpc__restored_bad_summary__every_server_reports_it_until_reconciled(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    with DroverClient(cluster.grpc_addresses, retry_deadline=60) as client:
        register_nodes(client, ["n1"])
        client.register_job(service_job("web", count=2))
        wait_for(lambda: len(client.list_allocs(job_id="web").allocs) == 2, 60, 0.2, "two allocs placed")
        clean = run_cli(cluster, "operator", "invariants", timeout=120)
        assert clean.returncode == 0, clean.stdout + clean.stderr
        assert clean.stdout.count("no violations") == 3

        snap = client.snapshot_save().snapshot
        summary = next(s for s in snap.job_summaries if s.job_id == "web")
        summary.summary["web"].starting = -1
        client.snapshot_restore(raft_pb2.StateSnapshot.FromString(snap.SerializeToString()))

    for i in range(3):
        found = wait_for(lambda i=i: _violations(cluster, i), 30, 0.2, f"s{i + 1} to report the violation")
        assert found == [
            "job-summaries: job 'web' (default): web.starting is negative (-1)",
            "job-summaries: job 'web' (default): web.starting is -1, a recount of the allocs gives 2",
        ]
    broken = run_cli(cluster, "operator", "invariants", timeout=120)
    assert broken.returncode == 1
    assert broken.stdout.count("2 violation(s)") == 3 and "web.starting is negative (-1)" in broken.stdout

    fixed = run_cli(cluster, "system", "reconcile", "summaries", timeout=120)
    assert fixed.returncode == 0, fixed.stderr
    for i in range(3):
        assert wait_for(lambda i=i: not _violations(cluster, i), 30, 0.2, f"s{i + 1} clean again")
