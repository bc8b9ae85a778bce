"""Deployments, whole: a job file run with the ``drover`` CLI, real servers rolling it out
batch by batch as real client agents report their allocs healthy, the leader's watcher
failing and reverting a bad version, canaries promoted by an operator, and a leader killed
mid-rollout whose successor carries the same deployment on.

Real server processes, real client agents running ``raw_exec`` tasks (``sh``). Every wait
is for a condition with a deadline; timings are never asserted.
"""

from __future__ import annotations

import json
from pathlib import Path

from deploy.cluster import LocalCluster, wait_for
from drover.cli._format import short_id
from drover.sdk import DroverClient, DroverError
from drover.v1 import structs_pb2
from tests.cluster.cli import run_cli, run_job_file
from tests.cluster.conftest import ready_cluster
from tests.cluster.jobs import NO_RESTARTS, deployment_of_version, raw_exec_hcl

# A deployment needs health verdicts (min_healthy_time each) and evals per batch: generous
# on a loaded 2-core machine.
ROLLOUT_TIMEOUT = 120


def _job(job_id: str, script: str, update: str, *, count: int = 2) -> str:
    return raw_exec_hcl(job_id, script, count=count, update=update, restart=NO_RESTARTS)


def _client(cluster: LocalCluster) -> DroverClient:
    return DroverClient(cluster.grpc_addresses, retry_deadline=30)


def _wait_status(
    cluster: LocalCluster, client: DroverClient, job_id: str, version: int, status: str
) -> structs_pb2.Deployment:
    def reached() -> structs_pb2.Deployment | None:
        d = deployment_of_version(client, job_id, version)
        return d if d is not None and d.status == status else None

    found: structs_pb2.Deployment = wait_for(
        reached,
        ROLLOUT_TIMEOUT,
        0.25,
        lambda: (
            f"deployment of {job_id} v{version} {status}: {client.list_deployments(job_id=job_id)}\n"
            + cluster.logs_tail()
        ),
    )
    return found


def _allocs(client: DroverClient, job_id: str) -> list[structs_pb2.Allocation]:
    return [client.get_alloc(a.id).alloc for a in client.list_allocs(job_id=job_id).allocs]


def _running(client: DroverClient, job_id: str, version: int) -> list[structs_pb2.Allocation]:
    return [
        a
        for a in _allocs(client, job_id)
        if a.desired_status == "run" and a.client_status == "running" and a.job_version == version
    ]


GOOD = "echo up; exec sleep 600"
HEALTH_FAST = """      max_parallel     = 1
      min_healthy_time = "1s"
      healthy_deadline = "30s\""""


def test_deployment__failing_version__auto_reverts_to_stable_spec(
    two_ready_clients: LocalCluster, tmp_path: Path
) -> None:
    """v0 deploys and becomes stable; v1 fails at start; its first unhealthy alloc fails
    the deployment (progress_deadline 0) and auto_revert registers v0's spec as v2, which
    deploys and becomes stable. Never more than max_parallel (1) v1 allocs ran."""
    update = HEALTH_FAST + '\n      progress_deadline = "0"\n      auto_revert = true'
    with _client(two_ready_clients) as client:
        run_job_file(two_ready_clients, tmp_path, "v0", _job("rev", GOOD, update))
        first = _wait_status(two_ready_clients, client, "rev", 0, "successful")
        assert first.task_groups["g"].healthy_allocs == 2
        assert client.get_job("rev").job.stable

        run_job_file(two_ready_clients, tmp_path, "v1", _job("rev", "echo broken; exit 1", update))
        failed = _wait_status(two_ready_clients, client, "rev", 1, "failed")
        assert failed.status_description.startswith("Failed due to unhealthy allocations")
        assert "rolling back to job version 0" in failed.status_description

        reverted = _wait_status(two_ready_clients, client, "rev", 2, "successful")
        assert reverted.id != first.id
        job = client.get_job("rev").job
        assert job.version == 2 and job.stable
        assert json.loads(job.groups[0].tasks[0].config_json)["args"] == ["-c", GOOD]
        wait_for(
            lambda: len(_running(client, "rev", 2)) == 2,
            ROLLOUT_TIMEOUT,
            0.25,
            lambda: f"two v2 allocs running: {_allocs(client, 'rev')}",
        )
        # The bad version never ran wider than max_parallel.
        v1_allocs = [a for a in _allocs(client, "rev") if a.job_version == 1]
        assert len(v1_allocs) == 1, v1_allocs
        assert v1_allocs[0].deployment_status.health == "unhealthy"


def test_deployment__canary__waits_for_promotion_then_rolls(
    two_ready_clients: LocalCluster, tmp_path: Path
) -> None:
    """With canary = 1 the new version first runs one canary beside both old allocs and
    waits for an operator; `drover deployment promote` lets the rollout finish."""
    update = HEALTH_FAST + "\n      canary = 1"
    with _client(two_ready_clients) as client:
        run_job_file(two_ready_clients, tmp_path, "v0", _job("can", GOOD, update))
        _wait_status(two_ready_clients, client, "can", 0, "successful")

        run_job_file(two_ready_clients, tmp_path, "v1", _job("can", "echo v1; exec sleep 600", update))

        def canary_healthy() -> structs_pb2.Deployment | None:
            d = deployment_of_version(client, "can", 1)
            return d if d is not None and d.task_groups["g"].healthy_allocs >= 1 else None

        deployment = wait_for(canary_healthy, ROLLOUT_TIMEOUT, 0.25, lambda: two_ready_clients.logs_tail())
        assert deployment.status == "running"
        assert deployment.status_description == "Deployment is running but requires manual promotion"
        state = deployment.task_groups["g"]
        assert state.desired_canaries == 1 and len(state.placed_canaries) == 1 and not state.promoted
        assert len(_running(client, "can", 0)) == 2  # the old ones keep serving
        assert len(_running(client, "can", 1)) == 1
        shown = run_cli(two_ready_clients, "alloc", "status", state.placed_canaries[0])
        assert shown.returncode == 0, shown.stderr
        lines = {
            line.split("=")[0].strip(): line.split("=", 1)[1].strip()
            for line in shown.stdout.splitlines()
            if "=" in line
        }
        # Without -verbose the CLI shows short IDs (display_id).
        assert lines["Deployment ID"] == short_id(deployment.id, verbose=False)
        assert lines["Deployment Health"] == "healthy"
        assert lines["Canary"] == "true"

        promoted = run_cli(two_ready_clients, "deployment", "promote", deployment.id)
        assert promoted.returncode == 0, promoted.stderr
        done = _wait_status(two_ready_clients, client, "can", 1, "successful")
        assert done.id == deployment.id and done.task_groups["g"].promoted
        wait_for(
            lambda: len(_running(client, "can", 1)) == 2 and not _running(client, "can", 0),
            ROLLOUT_TIMEOUT,
            0.25,
            lambda: f"v1 everywhere: {_allocs(client, 'can')}",
        )
        assert client.get_job("can").job.stable


def test_deployment__leader_killed_mid_rollout__new_leader_finishes_it(tmp_path: Path) -> None:
    """Three servers: the leader is SIGKILLed once the first new alloc is healthy; the new
    leader carries the same deployment on to success (deployment state, counters and the
    next batch's eval are raft entries)."""
    update = """      max_parallel     = 1
      min_healthy_time = "2s"
      healthy_deadline = "60s\""""
    with ready_cluster(tmp_path / "cluster", servers=3, clients=2) as c, _client(c) as client:
        run_job_file(c, tmp_path, "v0", _job("lk", GOOD, update, count=3))
        _wait_status(c, client, "lk", 0, "successful")
        run_job_file(c, tmp_path, "v1", _job("lk", "echo v1; exec sleep 600", update, count=3))

        def first_batch_healthy() -> structs_pb2.Deployment | None:
            d = deployment_of_version(client, "lk", 1)
            return d if d is not None and d.task_groups["g"].healthy_allocs >= 1 else None

        midway = wait_for(first_batch_healthy, ROLLOUT_TIMEOUT, 0.25, lambda: c.logs_tail())
        assert midway.status == "running"
        c.kill(c.leader_index())

        def succeeded() -> structs_pb2.Deployment | None:
            try:
                d = deployment_of_version(client, "lk", 1)
            except DroverError:
                return None  # no leader yet
            return d if d is not None and d.status == "successful" else None

        done = wait_for(succeeded, ROLLOUT_TIMEOUT, 0.5, lambda: c.logs_tail())
        assert done.id == midway.id
        assert done.task_groups["g"].healthy_allocs == 3
        wait_for(
            lambda: len(_running(client, "lk", 1)) == 3,
            ROLLOUT_TIMEOUT,
            0.5,
            lambda: f"v1 on all three: {_allocs(client, 'lk')}",
        )
