"""The operator's deployment RPCs on a real cluster: pause, resume, fail (with auto-revert),
promotion refused while the canary is not healthy and once the deployment is over, and
scaling refused while a deployment is active.

One server and two client agents, real processes, raw_exec tasks. v0 rolls out fast and
becomes stable; v1 asks for a canary whose health takes ten minutes, so its deployment
stays active (and its canary unhealthy-or-unset) for the whole test. Every wait is for a
condition with a deadline.
"""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

from deploy.cluster import LocalCluster, wait_for
from drover.sdk import DroverClient, DroverError
from drover.v1 import structs_pb2
from tests.cluster.cli import run_job_file
from tests.cluster.jobs import deployment_of_version, raw_exec_hcl

TIMEOUT = 120
FAST = """      max_parallel     = 1
      min_healthy_time = "1s"
      healthy_deadline = "30s\""""
# The canary is judged only after ten minutes: the deployment stays waiting for it.
SLOW_CANARY = """      max_parallel      = 1
      canary            = 1
      min_healthy_time  = "10m"
      healthy_deadline  = "15m"
      progress_deadline = "20m"
      auto_revert       = true"""


def _job(script: str, update: str) -> str:
    return raw_exec_hcl("ops", script, count=2, update=update)


def _wait(cluster: LocalCluster, client: DroverClient, version: int, status: str) -> structs_pb2.Deployment:
    def reached() -> structs_pb2.Deployment | None:
        d = deployment_of_version(client, "ops", version)
        return d if d is not None and d.status == status else None

    found: structs_pb2.Deployment = wait_for(
        reached,
        TIMEOUT,
        0.25,
        lambda: f"v{version} {status}: {client.list_deployments()}\n{cluster.logs_tail()}",
    )
    return found


def _refused(call: object, code: grpc.StatusCode, message: str) -> None:
    with pytest.raises(DroverError) as refused:
        call()  # type: ignore[operator]
    assert refused.value.code == code, refused.value
    assert message in refused.value.message


def test_deployment_rpcs__pause_resume_fail_and_refusals(
    two_ready_clients: LocalCluster, tmp_path: Path
) -> None:
    with DroverClient(two_ready_clients.grpc_addresses, retry_deadline=30) as client:
        run_job_file(two_ready_clients, tmp_path, "v0", _job("echo v0; exec sleep 600", FAST))
        _wait(two_ready_clients, client, 0, "successful")
        run_job_file(two_ready_clients, tmp_path, "v1", _job("echo v1; exec sleep 600", SLOW_CANARY))

        def canary_placed() -> structs_pb2.Deployment | None:
            d = deployment_of_version(client, "ops", 1)
            return d if d is not None and d.task_groups["g"].placed_canaries else None

        deployment = wait_for(canary_placed, TIMEOUT, 0.25, lambda: two_ready_clients.logs_tail())
        assert deployment.status == "running"

        # While it is active: no scaling, and no promotion of a canary not yet healthy.
        _refused(
            lambda: client.scale_job("ops", "g", 3),
            grpc.StatusCode.FAILED_PRECONDITION,
            "job scaling blocked due to active deployment",
        )
        _refused(
            lambda: client.promote_deployment(deployment.id),
            grpc.StatusCode.FAILED_PRECONDITION,
            'Task group "g" has 0/1 healthy allocations',
        )
        assert client.get_job("ops").job.version == 1, "a refused scale registered nothing"

        paused = client.pause_deployment(deployment.id, pause=True)
        assert paused.eval_id == ""
        got = client.get_deployment(deployment.id).deployment
        assert (got.status, got.status_description) == ("paused", "Deployment is paused")

        resumed = client.pause_deployment(deployment.id, pause=False)
        assert resumed.eval_id, "a resume evaluates the job again"
        got = client.get_deployment(deployment.id).deployment
        assert (got.status, got.status_description) == (
            "running",
            "Deployment is running but requires manual promotion",
        )

        failed = client.fail_deployment(deployment.id)
        assert (failed.reverted, failed.reverted_job_version) == (True, 0)
        got = client.get_deployment(deployment.id).deployment
        assert got.status == "failed"
        assert got.status_description == "Deployment marked as failed - rolling back to job version 0"
        job = client.get_job("ops").job
        assert job.version == 2 and not job.stable
        assert "echo v0" in job.groups[0].tasks[0].config_json

        # Over: nothing more may change it.
        _refused(
            lambda: client.promote_deployment(deployment.id),
            grpc.StatusCode.FAILED_PRECONDITION,
            "Cannot promote terminal deployment",
        )
        _refused(
            lambda: client.pause_deployment(deployment.id, pause=True),
            grpc.StatusCode.FAILED_PRECONDITION,
            "Cannot pause terminal deployment",
        )
        _refused(
            lambda: client.fail_deployment("no-such-deployment"),
            grpc.StatusCode.NOT_FOUND,
            "deployment 'no-such-deployment' not found",
        )

        # The reverted spec rolls out as its own deployment and becomes the stable version.
        _wait(two_ready_clients, client, 2, "successful")
        assert client.get_job("ops").job.stable
