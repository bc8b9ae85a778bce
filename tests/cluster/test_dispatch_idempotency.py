"""Dispatch idempotency on a real server through the CLI and the SDK.

A scripted dispatch that is retried after a lost answer must not run the work twice: the
same ``-idempotency-token`` returns the child already dispatched, and the SDK gives every
call its own token so that its own retries are safe.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from deploy.cluster import LocalCluster
from drover.sdk import DroverClient
from drover.v1 import structs_pb2
from tests.cluster.cli import run_cli
from tests.cluster.conftest import wait_settled
from tests.cluster.jobs import batch_job


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path_factory.mktemp("dispatch-idempotency"), servers=1) as c:
        wait_settled(c)
        with DroverClient(c.grpc_addresses[0]) as client:
            client.register_job(batch_job("resize", structs_pb2.ParameterizedConfig(payload="optional")))
        yield c


def _children(server: LocalCluster) -> list[str]:
    with DroverClient(server.grpc_addresses[0]) as client:
        return sorted(j.id for j in client.list_jobs(prefix="resize/").jobs)


def _cli_dispatch(server: LocalCluster, *extra: str) -> dict[str, object]:
    result = run_cli(server, "job", "dispatch", "-detach", "-json", *extra, "resize")
    assert result.returncode == 0, result.stderr
    parsed: dict[str, object] = json.loads(result.stdout)
    return parsed


@pytest.mark.cluster
def test_cli_dispatch__same_token_twice__one_child_returned_both_times(server: LocalCluster) -> None:
    before = _children(server)
    first = _cli_dispatch(server, "-idempotency-token", "batch-2026-11-30")
    second = _cli_dispatch(server, "-idempotency-token", "batch-2026-11-30")

    assert second["dispatched_job_id"] == first["dispatched_job_id"]
    assert second["eval_id"] == first["eval_id"]
    assert _children(server) == sorted([*before, str(first["dispatched_job_id"])])


@pytest.mark.cluster
def test_sdk_dispatch__separate_calls_without_token__separate_children(server: LocalCluster) -> None:
    before = _children(server)
    with DroverClient(server.grpc_addresses[0]) as client:
        a = client.dispatch_job("resize").dispatched_job_id
        b = client.dispatch_job("resize").dispatched_job_id

    assert a != b
    assert _children(server) == sorted([*before, a, b])
