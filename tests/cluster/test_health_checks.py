"""Deployment health through the whole loop (docs/deployments-health.md): a service job
with ``update { health_check = "checks" }`` and an http check is registered from an HCL
file with the ``drover`` CLI; the scheduler places its alloc into a deployment; the real
client agent runs the ``raw_exec`` task and the check against the port the alloc was
given, decides, and reports; the server stores the verdict, which the SDK then shows on
the alloc as an operator would see it (``deployment_status.health``).

Two jobs side by side: one whose task serves HTTP on its port (``python -m http.server``)
becomes healthy; one whose task runs but serves nothing becomes unhealthy once its
``healthy_deadline`` passes. Ports are static, picked free on loopback by the test: a task
cannot learn a dynamic port from its environment in drover yet.

Whatever happens, the jobs are stopped, and the cluster fixture, once its agents are
down, kills every raw_exec task still running in their data dirs (``LocalCluster.stop_all``).
"""

from __future__ import annotations

import sys
from pathlib import Path

from deploy.cluster import LocalCluster, pick_free_ports, wait_for
from drover.sdk import DroverClient
from drover.v1 import structs_pb2
from tests.cluster.cli import run_cli, run_job_file
from tests.cluster.jobs import NO_RESTARTS, raw_exec_hcl


def _job(job_id: str, port: int, command: str, args: list[str], healthy_deadline: str) -> str:
    """A job of one task serving (or not) on a static port, checked over HTTP each second."""
    job_update = f"""    max_parallel     = 1
    health_check     = "checks"
    min_healthy_time = "1s"
    healthy_deadline = "{healthy_deadline}\""""
    services = f"""network {{
      port "http" {{
        static = {port}
      }}
    }}

    service {{
      name = "{job_id}"
      port = "http"

      check {{
        type     = "http"
        path     = "/"
        interval = "1s"
        timeout  = "1s"
      }}
    }}"""
    return raw_exec_hcl(
        job_id,
        job_update=job_update,
        restart=NO_RESTARTS,
        services=services,
        group="web",
        task="server",
        command=command,
        args=args,
        memory_mb=64,
    )


def _health(client: DroverClient, job_id: str) -> tuple[str, structs_pb2.Allocation] | None:
    """The first verdict on one of the job's allocs, with that alloc (None: none yet)."""
    for listed in client.list_allocs(job_id=job_id).allocs:
        alloc = client.get_alloc(listed.id).alloc
        if alloc.HasField("deployment_status") and alloc.deployment_status.health:
            return alloc.deployment_status.health, alloc
    return None


def test_http_check__serving_task_healthy__silent_task_unhealthy(
    two_ready_clients: LocalCluster, tmp_path: Path
) -> None:
    cluster = two_ready_clients
    serving_port, silent_port = pick_free_ports(2)
    with DroverClient(cluster.grpc_addresses, retry_deadline=30) as client:
        serving = ["-m", "http.server", str(serving_port), "--bind", "127.0.0.1"]
        silent = ["-c", "import time; time.sleep(600)"]
        try:
            run_job_file(
                cluster, tmp_path, "serving", _job("serving", serving_port, sys.executable, serving, "60s")
            )
            run_job_file(
                cluster, tmp_path, "silent", _job("silent", silent_port, sys.executable, silent, "8s")
            )
            healthy = wait_for(
                lambda: _health(client, "serving"),
                90,
                0.3,
                lambda: "a verdict on serving\n" + cluster.logs_tail(),
            )
            unhealthy = wait_for(
                lambda: _health(client, "silent"),
                90,
                0.3,
                lambda: "a verdict on silent\n" + cluster.logs_tail(),
            )
        finally:
            for job_id in ("serving", "silent"):
                run_cli(cluster, "job", "stop", "-detach", job_id)

    assert healthy is not None and unhealthy is not None
    health, alloc = healthy
    assert health == "healthy"
    assert alloc.deployment_id
    assert alloc.client_status == "running"
    started = alloc.task_states["server"].started_at_ns
    # Healthy only after the check passed for min_healthy_time (1 s) with the task up.
    assert alloc.deployment_status.timestamp_ns >= started + 1_000_000_000

    health, alloc = unhealthy
    assert health == "unhealthy"
    assert alloc.deployment_id
    # The task kept running: only the check (nothing listens) made it unhealthy, at the deadline.
    assert alloc.task_states["server"].state == "running"
    assert alloc.deployment_status.timestamp_ns >= alloc.task_states["server"].started_at_ns + 4_000_000_000
