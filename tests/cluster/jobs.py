"""Protobuf job builders for tests that talk to real servers over gRPC."""

from __future__ import annotations

from typing import Final

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


def running_allocs(client: DroverClient, job_id: str) -> list[structs_pb2.Allocation]:
    """The job's allocs that are meant to run and do."""
    return [
        a
        for a in client.list_allocs(job_id=job_id).allocs
        if a.desired_status == "run" and a.client_status == "running"
    ]
