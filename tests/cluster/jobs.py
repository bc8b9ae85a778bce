"""Protobuf job builders for tests that talk to real servers over gRPC."""

from __future__ import annotations

from drover.sdk import DroverClient
from drover.v1 import structs_pb2


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


def running_allocs(client: DroverClient, job_id: str) -> list[structs_pb2.Allocation]:
    """The job's allocs that are meant to run and do."""
    return [
        a
        for a in client.list_allocs(job_id=job_id).allocs
        if a.desired_status == "run" and a.client_status == "running"
    ]
