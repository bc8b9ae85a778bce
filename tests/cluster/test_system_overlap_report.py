"""docs/field-reports.md#field-report-1 on a real 3-server cluster: overlapping live system allocs are
reconciled in one
eval without a "plan for node rejected" loop, and a persistent scheduler/applier
disagreement ends with the node marked ineligible.

The overlapping state is reached the way an operator would reach it: by restoring an old,
crafted backup with `drover operator snapshot restore`.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from deploy.cluster import LocalCluster, wait_for
from drover.sdk import DroverClient
from drover.v1 import raft_pb2, structs_pb2
from tests.chaos.disagreement import ENV as DISAGREE_ENV
from tests.chaos.disagreement import DisagreementControl
from tests.cluster.cli import run_cli
from tests.cluster.conftest import wait_settled
from tests.cluster.jobs import service_job
from tests.cluster.nodes import register_nodes

NODES = ["node-a", "node-b", "node-c"]
FAULT_AGENT = "tests.chaos.fault_agent"
PORT = 9100


def system_job(job_id: str, port: int) -> structs_pb2.Job:
    job = service_job(job_id, count=1)
    job.type = "system"
    job.groups[0].network.reserved_ports.add(label="metrics", value=port)
    return job


def _live_by_node(client: DroverClient, job_id: str) -> Counter[str]:
    allocs = client.list_allocs(job_id=job_id).allocs
    return Counter(
        a.node_id
        for a in allocs
        if a.desired_status == "run" and a.client_status not in ("complete", "failed", "lost")
    )


def _wait_eval_terminal(client: DroverClient, eval_id: str, timeout: float = 60) -> structs_pb2.Evaluation:
    def done() -> structs_pb2.Evaluation | None:
        ev = client.get_eval(eval_id).eval
        return ev if ev.status in ("complete", "failed", "canceled") else None

    result = wait_for(done, timeout, 0.1, f"eval {eval_id} to finish")
    assert result is not None
    return result


def _rejections(cluster: LocalCluster) -> int:
    return sum(cluster.log(i).count("plan.node_rejected") for i in range(3) if cluster.pid(i) is not None)


def test_field_report_1__restored_overlapping_system_allocs__one_eval_reconciles_without_rejection_loop(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    with DroverClient(cluster.grpc_addresses) as client:
        register_nodes(client, NODES)
        ev_id = client.register_job(system_job("node-exporter", PORT)).eval_id
        assert _wait_eval_terminal(client, ev_id).status == "complete"
        assert _live_by_node(client, "node-exporter") == Counter(dict.fromkeys(NODES, 1))

        # An operator's old backup: every node runs the system job twice on the same static
        # port, and an eval for the job is pending.
        backup = tmp_path / "backup.snap"
        saved = run_cli(cluster, "operator", "snapshot", "save", str(backup), timeout=120)
        assert saved.returncode == 0, saved.stderr
        snap = raft_pb2.StateSnapshot.FromString(backup.read_bytes())
        originals = [a for a in snap.allocs if a.job_id == "node-exporter"]
        assert len(originals) == 3
        duplicates = []
        for n, alloc in enumerate(originals):
            alloc.client_status = "running"
            dup = snap.allocs.add()
            dup.CopyFrom(alloc)
            dup.id = f"dup-{n}"
            dup.create_index = alloc.create_index + 1000
            duplicates.append(dup.id)
        pending = snap.evals.add()
        pending.CopyFrom(next(e for e in snap.evals if e.id == ev_id))
        pending.id = "restored-eval"
        pending.status = "pending"
        pending.triggered_by = "job-register"
        crafted = tmp_path / "crafted.snap"
        crafted.write_bytes(snap.SerializeToString())

        rejections_before = _rejections(cluster)
        restored = run_cli(cluster, "operator", "snapshot", "restore", str(crafted), timeout=120)
        assert restored.returncode == 0, restored.stderr

        ev = _wait_eval_terminal(client, "restored-eval")
        assert ev.status == "complete", ev.status_description
        live = _live_by_node(client, "node-exporter")
        assert live == Counter(dict.fromkeys(NODES, 1)), live
        # The newest alloc of each (job, group, node) is the one kept.
        kept = {a.id for a in client.list_allocs(job_id="node-exporter").allocs if a.desired_status == "run"}
        assert kept == set(duplicates)
        # Reconciled within that one eval: no plan was rejected, no follow-up was needed.
        assert _rejections(cluster) == rejections_before
        assert not [
            e for e in client.list_evals(job_id="node-exporter").evals if e.status in ("pending", "blocked")
        ]


def test_field_report_1__applier_disagrees_about_a_node__tracker_marks_it_ineligible_and_eval_ends(
    tmp_path: Path,
) -> None:
    # The disagreement is injected from the test side: the servers run the test-only agent
    # module, whose plan applier sees node-b shrunk to almost nothing while the state (and so
    # the scheduler) still has what node-b registered (tests/chaos/disagreement.py).
    control = DisagreementControl(tmp_path / "disagreement.json", ["node-b"])
    env = {DISAGREE_ENV: str(control.path)}
    with LocalCluster(tmp_path / "cluster", servers=3, env=env, agent_module=FAULT_AGENT) as cluster:
        wait_settled(cluster)
        with DroverClient(cluster.grpc_addresses) as client:
            register_nodes(client, NODES)
            ev_id = client.register_job(system_job("node-exporter", PORT)).eval_id
            ev = _wait_eval_terminal(client, ev_id, timeout=120)
            assert ev.status == "complete", ev.status_description
            node_b = client.get_node("node-b").node
            assert node_b.scheduling_eligibility == "ineligible"
            assert any("plans rejected" in e.message for e in node_b.events)
            assert _live_by_node(client, "node-exporter") == Counter({"node-a": 1, "node-c": 1})
            # Bounded: the tracker's threshold (5) plus the rejection that crossed it.
            assert _rejections(cluster) <= 6
