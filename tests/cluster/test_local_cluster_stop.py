"""LocalCluster's stop ends what the cluster started, the client agents' raw_exec tasks
included: an agent leaves its tasks running when it stops (a restarted agent re-attaches),
so without this every cluster test that runs a real task would leave a ``sleep 600``
behind it on the machine."""

from __future__ import annotations

from pathlib import Path

import psutil

from deploy.cluster import LocalCluster, wait_for
from drover.sdk import DroverClient
from tests.cluster.cli import run_cli
from tests.cluster.jobs import raw_exec_hcl, running_allocs


def _tasks_under(data_dir: Path) -> list[psutil.Process]:
    """The processes working inside ``data_dir``: that agent's tasks."""
    found = []
    for proc in psutil.process_iter(["pid"]):
        try:
            cwd = Path(proc.cwd())
        except psutil.Error:
            continue
        if data_dir in cwd.parents:
            found.append(proc)
    return found


def test_local_cluster__stop_all__ends_the_clients_raw_exec_tasks(tmp_path: Path) -> None:
    job_file = tmp_path / "sleeper.hcl"
    job_file.write_text(raw_exec_hcl("sleeper", "exec sleep 600"))
    with LocalCluster(tmp_path / "cluster", servers=1, clients=1) as cluster:
        cluster.wait_for_leader(60)
        data_dir = cluster.client_data_dir(0)
        result = run_cli(cluster, "job", "run", "-detach", str(job_file))
        assert result.returncode == 0, result.stderr
        with DroverClient(cluster.grpc_addresses, retry_deadline=30) as client:
            wait_for(
                lambda: running_allocs(client, "sleeper"),
                60,
                0.2,
                lambda: "the sleeper running\n" + cluster.logs_tail(),
            )
        tasks = wait_for(lambda: _tasks_under(data_dir), 30, 0.1, "the sleeper's process")
    gone, alive = psutil.wait_procs(tasks, timeout=0)
    assert not alive, [p.cmdline() for p in alive]
    assert len(gone) == len(tasks)
