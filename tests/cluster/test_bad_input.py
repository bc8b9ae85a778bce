"""Bad input against a real server: INVALID_ARGUMENT naming the field, nothing written."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest

from deploy.cluster import LocalCluster
from drover.sdk import DroverClient, DroverError
from drover.v1 import structs_pb2
from tests.cluster.cli import run_cli
from tests.cluster.conftest import wait_settled
from tests.cluster.jobs import service_job


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path_factory.mktemp("bad-input"), servers=1) as c:
        wait_settled(c)
        yield c


def _system_job_count_2() -> structs_pb2.Job:
    job = service_job("sys")
    job.type = "system"
    return job


def _mutated(mutate: Callable[[structs_pb2.Job], None]) -> structs_pb2.Job:
    job = service_job("bad")
    mutate(job)
    return job


BAD_JOBS = [
    ("unknown-type", _mutated(lambda j: setattr(j, "type", "daemon")), "job.type"),
    ("negative-count", _mutated(lambda j: setattr(j.groups[0], "count", -1)), "job.groups[0].count"),
    ("system-count-2", _system_job_count_2(), "job.groups[0].count"),
    ("empty-id", _mutated(lambda j: setattr(j, "id", "")), "job.id"),
    ("empty-group-name", _mutated(lambda j: setattr(j.groups[0], "name", "")), "job.groups[0].name"),
    (
        "empty-task-name",
        _mutated(lambda j: setattr(j.groups[0].tasks[0], "name", "")),
        "job.groups[0].tasks[0].name",
    ),
    ("no-groups", _mutated(lambda j: j.ClearField("groups")), "job.groups"),
    (
        "config-not-json",
        _mutated(lambda j: setattr(j.groups[0].tasks[0], "config_json", "{oops")),
        "config_json",
    ),
    ("oversized-payload", _mutated(lambda j: setattr(j, "payload", b"x" * (64 * 1024))), "job.payload"),
    ("oversized-job", _mutated(lambda j: j.meta.update({f"k{i}": "v" * 1024 for i in range(1100)})), "job"),
    ("priority-out-of-range", _mutated(lambda j: setattr(j, "priority", 1000)), "job.priority"),
]


def _state(server: LocalCluster) -> tuple[str, int]:
    answer = server.query_digest(0)
    assert answer is not None
    return answer.digest, answer.applied_index


@pytest.mark.parametrize(("job", "field"), [(j, f) for _, j, f in BAD_JOBS], ids=[n for n, _, _ in BAD_JOBS])
def test_bad_input__job_register__invalid_argument_names_field_and_writes_nothing(
    server: LocalCluster, job: structs_pb2.Job, field: str
) -> None:
    before = _state(server)
    with DroverClient(server.grpc_addresses[0]) as client, pytest.raises(DroverError) as err:
        client.register_job(job)
    assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert field in str(err.value)
    assert _state(server) == before


BAD_NODE_CALLS: list[tuple[str, Callable[[DroverClient], object], str]] = [
    ("node-empty-id", lambda c: c.register_node(structs_pb2.Node(name="n", datacenter="dc1")), "node.id"),
    (
        "node-empty-datacenter",
        lambda c: c.register_node(structs_pb2.Node(id="n1", name="n1", datacenter="")),
        "node.datacenter",
    ),
    (
        "node-bad-status",
        lambda c: c.register_node(structs_pb2.Node(id="n1", name="n1", datacenter="dc1", status="sleepy")),
        "node.status",
    ),
    ("eligibility-bogus", lambda c: c.update_eligibility("n1", "maybe"), "eligibility"),
    ("status-bogus", lambda c: c.update_node_status("n1", "sleepy"), "status"),
    ("alloc-update-empty", lambda c: c.update_allocs([]), "allocs"),
]


@pytest.mark.parametrize(
    ("call", "field"), [(c, f) for _, c, f in BAD_NODE_CALLS], ids=[n for n, _, _ in BAD_NODE_CALLS]
)
def test_bad_input__node_calls__invalid_argument_names_field_and_writes_nothing(
    server: LocalCluster, call: Callable[[DroverClient], object], field: str
) -> None:
    before = _state(server)
    with DroverClient(server.grpc_addresses[0]) as client, pytest.raises(DroverError) as err:
        call(client)
    assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert field in str(err.value)
    assert _state(server) == before


BAD_FILES = [
    ("syntax-error", 'job "web" {\n  group "g" {\n'),
    (
        "count-wrong-type",
        'job "web" {\n group "g" {\n count = "three"\n task "t" { driver = "mock" }\n }\n}\n',
    ),
    ("unknown-key", 'job "web" {\n group "g" {\n cout = 3\n task "t" { driver = "mock" }\n }\n}\n'),
    ("unknown-type", 'job "web" {\n type = "daemon"\n group "g" {\n task "t" { driver = "mock" }\n }\n}\n'),
    (
        "system-count-2",
        'job "web" {\n type = "system"\n group "g" {\n count = 2\n task "t" { driver = "mock" }\n }\n}\n',
    ),
    ("negative-count", 'job "web" {\n group "g" {\n count = -1\n task "t" { driver = "mock" }\n }\n}\n'),
    ("json-garbage", '{"job": '),
]


@pytest.mark.parametrize("text", [t for _, t in BAD_FILES], ids=[n for n, _ in BAD_FILES])
def test_bad_input__cli_job_run__exit_1_one_line_and_writes_nothing(
    server: LocalCluster, tmp_path: Path, text: str
) -> None:
    path = tmp_path / "job.hcl"
    path.write_text(text)
    before = _state(server)
    result = run_cli(server, "job", "run", "-detach", str(path))
    assert result.returncode == 1, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.stderr
    assert _state(server) == before
