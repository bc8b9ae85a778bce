"""Protobuf job builders for tests that talk to real servers over gRPC."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from deploy.cluster import LocalCluster, wait_for
from drover.sdk import DroverClient
from drover.server.codec import to_proto
from drover.server.jobspec import parse_jobspec
from drover.v1 import structs_pb2

# The one task of ``raw_exec_sleep_job``: the name the tests look its task state up by.
RAW_EXEC_TASK: Final = "sleep"


def service_job(job_id: str, count: int = 2, **meta: str) -> structs_pb2.Job:
    return structs_pb2.Job(
        id=job_id,
        type="service",
        datacenters=["dc1"],
        meta=meta,
        groups=[
            structs_pb2.TaskGroup(
                name="web",
                count=count,
                tasks=[
                    structs_pb2.Task(
                        name="server",
                        driver="mock",
                        config_json='{"run_for": "1h"}',
                        resources=structs_pb2.Resources(cpu_mhz=100, memory_mb=64),
                    )
                ],
            )
        ],
    )


def batch_job(job_id: str, parameterized: structs_pb2.ParameterizedConfig | None = None) -> structs_pb2.Job:
    """A one-alloc batch job; with ``parameterized``, a dispatchable template."""
    job = service_job(job_id, count=1)
    job.type = "batch"
    if parameterized is not None:
        job.parameterized.CopyFrom(parameterized)
    return job


def periodic_job(job_id: str, **meta: str) -> structs_pb2.Job:
    """A periodic batch parent: a template, so registering it creates no evaluation."""
    job = service_job(job_id, count=1, **meta)
    job.type = "batch"
    job.periodic.CopyFrom(structs_pb2.PeriodicConfig(enabled=True, spec="*/5 * * * *", time_zone="UTC"))
    return job


def raw_exec_sleep_job(
    job_id: str,
    *,
    disconnect: str,
    datacenter: str = "dc1",
    count: int = 1,
    pinned_to: str = "",
    preferring: str = "",
    sleep_s: int = 600,
    cpu: int = 100,
    memory_mb: int = 32,
) -> structs_pb2.Job:
    """A service job of ``count`` raw_exec ``sleep`` tasks, written in HCL as a user would
    and parsed by the server's own jobspec parser, so the disconnect tests and the chaos
    run's real clients submit what an operator would. ``disconnect`` is the body of the
    group's disconnect block; ``pinned_to`` constrains the group to that node name and
    ``preferring`` gives that node name an affinity, so a test decides where it lands."""
    placement = ""
    if pinned_to:
        placement += f"""
    constraint {{
      attribute = "${{node.unique.name}}"
      value     = "{pinned_to}"
    }}
"""
    if preferring:
        placement += f"""
    affinity {{
      attribute = "${{node.unique.name}}"
      value     = "{preferring}"
      weight    = 100
    }}
"""
    text = f"""
job "{job_id}" {{
  type        = "service"
  datacenters = ["{datacenter}"]

  group "g" {{
    count = {count}
{placement}
    disconnect {{
      {disconnect}
    }}

    task "{RAW_EXEC_TASK}" {{
      driver = "raw_exec"

      config {{
        command = "sleep"
        args    = ["{sleep_s}"]
      }}

      resources {{
        cpu    = {cpu}
        memory = {memory_mb}
      }}
    }}
  }}
}}
"""
    return to_proto(parse_jobspec(text, filename=f"{job_id}.hcl"), structs_pb2.Job())


# A group restart block that never restarts: the first exit fails the alloc, so a test
# sees the reschedule or the unhealthy verdict at once.
NO_RESTARTS: Final = """restart {
      attempts = 0
      mode     = "fail"
    }"""


def raw_exec_hcl(
    job_id: str,
    script: str = "",
    *,
    job_type: str = "service",
    count: int = 1,
    update: str = "",
    job_update: str = "",
    restart: str = "",
    reschedule: str = "",
    services: str = "",
    group: str = "g",
    task: str = "t",
    command: str = "/bin/sh",
    args: Sequence[str] = (),
    memory_mb: int = 32,
) -> str:
    """The HCL of a job of one group of ``count`` raw_exec tasks, as an operator would write
    it for ``drover job run``: the task runs ``/bin/sh -c script`` (or ``command args``).
    ``update`` is the body of the group's update block and ``job_update`` of the job's;
    ``restart``, ``reschedule`` and ``services`` are whole group blocks (say
    :data:`NO_RESTARTS`, or a network and service block), left out when empty."""
    argv = ["-c", script] if script else list(args)
    quoted = ", ".join(f'"{a}"' for a in argv)
    job_blocks = f"\n  update {{\n{job_update}\n  }}" if job_update else ""
    group_update = f"update {{\n{update}\n    }}" if update else ""
    group_blocks = "".join(
        f"\n    {block}" for block in (group_update, restart, reschedule, services) if block
    )
    return f"""
job "{job_id}" {{
  type        = "{job_type}"
  datacenters = ["dc1"]{job_blocks}
  group "{group}" {{
    count = {count}{group_blocks}
    task "{task}" {{
      driver = "raw_exec"
      config {{
        command = "{command}"
        args    = [{quoted}]
      }}
      resources {{
        cpu    = 50
        memory = {memory_mb}
      }}
    }}
  }}
}}
"""


def child_jobs(client: DroverClient, parent: str) -> list[structs_pb2.Job]:
    """The jobs a periodic or parameterized ``parent`` launched that still exist."""
    return [j for j in client.list_jobs(prefix=f"{parent}/").jobs if j.parent_id == parent]


def running_allocs(client: DroverClient, job_id: str) -> list[structs_pb2.Allocation]:
    """The job's allocs that are meant to run and do."""
    return [
        a
        for a in client.list_allocs(job_id=job_id).allocs
        if a.desired_status == "run" and a.client_status == "running"
    ]


def wait_one_running(cluster: LocalCluster, client: DroverClient, job_id: str, timeout: float = 60) -> None:
    """Until some alloc of ``job_id`` is running on its client; on a timeout the failure
    carries the servers' log tail, which says why nothing was placed or started."""
    wait_for(
        lambda: any(a.client_status == "running" for a in client.list_allocs(job_id=job_id).allocs),
        timeout,
        0.2,
        lambda: f"an alloc of {job_id} to run\n" + cluster.logs_tail(),
    )


def deployment_of_version(client: DroverClient, job_id: str, version: int) -> structs_pb2.Deployment | None:
    """The deployment of version ``version`` of the job, if one was made."""
    return next(
        (d for d in client.list_deployments(job_id=job_id).deployments if d.job_version == version), None
    )
