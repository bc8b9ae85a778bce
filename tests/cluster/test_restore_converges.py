"""``operator snapshot restore`` on a live cluster converges to what the clients really run.

The scenario of the report: a job of count 5 runs on a real client, the state is saved,
the job is stopped and purged (the client stops every alloc), the state is restored. The
restored state holds the five allocs as running, but nothing runs them: the client sees its
allocs' index go backwards and resends their real status, and the leader then evaluates
the restored job, which gets five new allocs. In the end the job has exactly its count
running, none of the five phantoms is held as running, and the live checker is clean.
"""

from __future__ import annotations

from pathlib import Path

from deploy.cluster import wait_for
from drover.sdk import DroverClient
from tests.cluster.cli import run_cli
from tests.cluster.conftest import ready_cluster
from tests.cluster.jobs import service_job

COUNT = 5


def _running(client: DroverClient) -> set[str]:
    return {a.id for a in client.list_allocs(job_id="demo").allocs if a.client_status == "running"}


def test_restore__after_stop_purge__converges_to_count_without_phantoms(tmp_path: Path) -> None:
    with ready_cluster(tmp_path / "cluster", servers=3, clients=1) as cluster:
        with DroverClient(cluster.grpc_addresses, retry_deadline=60) as client:
            client.register_job(service_job("demo", count=COUNT))
            wait_for(lambda: len(_running(client)) == COUNT, 60, 0.2, f"{COUNT} running")
            before = _running(client)
            snap = client.snapshot_save().snapshot
            client.deregister_job("demo", purge=True)
            wait_for(lambda: not _running(client), 60, 0.2, "every alloc stopped by the purge")
            client.snapshot_restore(snap)

            def converged() -> bool:
                running = _running(client)
                return len(running) == COUNT and not running & before

            wait_for(converged, 60, 0.3, lambda: f"{COUNT} new allocs running\n" + cluster.logs_tail())
            phantoms = {
                a.id: a.client_status for a in client.list_allocs(job_id="demo").allocs if a.id in before
            }
            assert set(phantoms) == before
            assert all(status in ("complete", "lost") for status in phantoms.values()), phantoms
        checked = run_cli(cluster, "operator", "invariants", timeout=120)
        assert checked.returncode == 0, checked.stdout + checked.stderr
        assert checked.stdout.count("no violations") == 3
