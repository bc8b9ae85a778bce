"""Bad periodic and dispatch input against a real server: INVALID_ARGUMENT naming the field,
and nothing written (the state digest and applied index do not move)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import grpc
import pytest

from deploy.cluster import LocalCluster, wait_for
from drover.sdk import DroverClient, DroverError
from drover.v1 import structs_pb2
from tests.cluster.conftest import wait_settled
from tests.cluster.jobs import batch_job, periodic_job, service_job


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path_factory.mktemp("periodic-bad-input"), servers=1) as c:
        wait_settled(c)
        with DroverClient(c.grpc_addresses[0]) as client:
            client.register_job(batch_job("plain-batch"))
            encode = structs_pb2.ParameterizedConfig(
                payload="forbidden", meta_required=["file"], meta_optional=["codec"]
            )
            client.register_job(batch_job("encode", encode))
            client.register_job(batch_job("upload", structs_pb2.ParameterizedConfig(payload="required")))
            # The plain batch job's eval is processed (blocked: there are no nodes) before any
            # test takes its "before" state; after that nothing writes on its own.
            wait_for(
                lambda: all(e.status != "pending" for e in client.list_evals().evals),
                30,
                0.1,
                "the registration's eval to be processed",
            )
        yield c


def _periodic(spec: str = "*/5 * * * *", time_zone: str = "UTC", job_type: str = "batch") -> structs_pb2.Job:
    job = periodic_job("bad-cron")
    job.type = job_type
    job.periodic.spec = spec
    job.periodic.time_zone = time_zone
    return job


def _with(job: structs_pb2.Job, *, specs: list[str]) -> structs_pb2.Job:
    job.periodic.specs.extend(specs)
    return job


def _dispatched_child() -> structs_pb2.Job:
    job = service_job("fake-child", count=1)
    job.type = "batch"
    job.dispatched = True
    return job


Call = Callable[[DroverClient], object]

BAD_CALLS: list[tuple[str, Call, str, str]] = [
    (
        "invalid-cron-range",
        lambda c: c.register_job(_periodic("61 * * * *")),
        "job.periodic.spec",
        "minute field: 61 is out of range 0-59",
    ),
    (
        "invalid-cron-fields",
        lambda c: c.register_job(_periodic("* * *")),
        "job.periodic.spec",
        "has 3 fields",
    ),
    (
        "invalid-cron-in-list",
        lambda c: c.register_job(_with(_periodic(""), specs=["@daily", "@fortnightly"])),
        "job.periodic.specs[1]",
        "unknown macro",
    ),
    (
        "unknown-time-zone",
        lambda c: c.register_job(_periodic(time_zone="Mars/Olympus_Mons")),
        "job.periodic.time_zone",
        "unknown time zone",
    ),
    (
        "periodic-service-job",
        lambda c: c.register_job(_periodic(job_type="service")),
        "job.periodic",
        "only batch and sysbatch jobs can be periodic",
    ),
    (
        "dispatch-not-parameterized",
        lambda c: c.dispatch_job("plain-batch", meta={"file": "a"}),
        "job_id",
        "is not a parameterized job",
    ),
    (
        "dispatch-missing-required-meta",
        lambda c: c.dispatch_job("encode", meta={"codec": "h264"}),
        "meta.file",
        "required by job",
    ),
    (
        "dispatch-unknown-meta",
        lambda c: c.dispatch_job("encode", meta={"file": "a", "colour": "red"}),
        "meta.colour",
        "not a meta key",
    ),
    (
        "dispatch-forbidden-payload",
        lambda c: c.dispatch_job("encode", meta={"file": "a"}, payload=b"data"),
        "payload",
        "forbids a payload",
    ),
    (
        "dispatch-missing-payload",
        lambda c: c.dispatch_job("upload"),
        "payload",
        "requires a payload",
    ),
    (
        "dispatch-oversized-payload",
        lambda c: c.dispatch_job("upload", payload=b"x" * (64 * 1024)),
        "payload",
        "must be at most",
    ),
    (
        "dispatch-oversized-idempotency-token",
        lambda c: c.dispatch_job("encode", meta={"file": "a"}, idempotency_token="t" * 300),
        "idempotency_token",
        "longer than 256",
    ),
    (
        "force-not-periodic",
        lambda c: c.periodic_force("plain-batch"),
        "job_id",
        "is not an enabled periodic job",
    ),
    (
        "register-dispatched-child",
        lambda c: c.register_job(_dispatched_child()),
        "job.dispatched",
        "set by `job dispatch`",
    ),
]


def _state(server: LocalCluster) -> tuple[str, int]:
    answer = server.query_digest(0)
    assert answer is not None
    return answer.digest, answer.applied_index


@pytest.mark.parametrize(
    ("call", "field", "message"), [(c, f, m) for _, c, f, m in BAD_CALLS], ids=[n for n, *_ in BAD_CALLS]
)
def test_bad_input__periodic_and_dispatch__invalid_argument_names_field_and_writes_nothing(
    server: LocalCluster, call: Call, field: str, message: str
) -> None:
    before = _state(server)
    with DroverClient(server.grpc_addresses[0]) as client, pytest.raises(DroverError) as err:
        call(client)
    assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert f"{field}: " in str(err.value)
    assert message in str(err.value)
    assert _state(server) == before


def test_bad_input__dispatch_or_force_unknown_job__not_found_and_writes_nothing(server: LocalCluster) -> None:
    before = _state(server)
    with DroverClient(server.grpc_addresses[0]) as client:
        for call in (lambda: client.dispatch_job("nope"), lambda: client.periodic_force("nope")):
            with pytest.raises(DroverError) as err:
                call()
            assert err.value.code == grpc.StatusCode.NOT_FOUND
    assert _state(server) == before
