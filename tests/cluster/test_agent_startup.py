"""Starting agents for real: the raft key rule, and what grpcurl needs (health, reflection)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from deploy.cluster import LocalCluster, pick_free_ports, wait_for
from tests.cluster.cli import drover_cli, lone_server_args


def _start_server(tmp_path: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    grpc_port, raft_port = pick_free_ports(2)
    argv = lone_server_args(
        tmp_path / "s1", "-grpc-port", str(grpc_port), "-raft-port", str(raft_port), *extra
    )
    return drover_cli(*argv, timeout=60)


@pytest.mark.parametrize("bind", ["127.0.0.1", "0.0.0.0"], ids=["loopback", "any"])
def test_agent__peers_without_raft_key__refuses_to_start_in_one_line_that_says_why(
    tmp_path: Path, bind: str
) -> None:
    # Loopback is no exemption: anyone on the host could reach the raft port.
    result = _start_server(tmp_path, "-bind", bind, "-peers", "127.0.0.1:1,127.0.0.1:2")
    assert result.returncode == 1
    output = result.stdout + result.stderr
    assert "raft-key-file" in output and "unpickles" in output
    (line,) = result.stdout.splitlines()
    assert line.startswith("Error: ") and "head -c 32 /dev/urandom | base64 > raft.key" in line
    assert "Traceback" not in output
    assert not (tmp_path / "s1").exists(), "refused before touching the data dir"


def test_agent__raft_key_too_short__refuses_to_start(tmp_path: Path) -> None:
    key = tmp_path / "raft.key"
    key.write_text("short")
    result = _start_server(tmp_path, "-bind", "0.0.0.0", "-raft-key-file", str(key))
    assert result.returncode == 1
    assert "too short" in result.stdout + result.stderr


def test_agent__second_server_on_same_data_dir__refuses_to_start(tmp_path: Path) -> None:
    with LocalCluster(tmp_path / "c", servers=1) as cluster:
        cluster.wait_for_leader(timeout=60)
        result = _start_server(tmp_path / "c")
        assert result.returncode == 1
        assert "in use by a running server" in result.stdout + result.stderr


def test_agent__health_and_reflection__serve_what_grpcurl_needs(tmp_path: Path) -> None:
    with LocalCluster(tmp_path / "c", servers=1) as cluster:
        cluster.wait_for_leader(timeout=60)
        with grpc.insecure_channel(cluster.grpc_addresses[0]) as channel:
            # Health says SERVING once its watcher has seen the leader and a quorum
            # (server/api/health.py), a moment after the election that wait_for_leader saw.
            def serving() -> bool:
                check = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
                return bool(check.status == health_pb2.HealthCheckResponse.SERVING)

            wait_for(serving, 30, 0.1, "health to say SERVING")
            stub = reflection_pb2_grpc.ServerReflectionStub(channel)
            request = reflection_pb2.ServerReflectionRequest(list_services="")
            (answer,) = list(stub.ServerReflectionInfo(iter([request]), timeout=10))
            services = {s.name for s in answer.list_services_response.service}
        assert {
            "drover.v1.Jobs",
            "drover.v1.Nodes",
            "drover.v1.Operator",
            "grpc.health.v1.Health",
        } <= services
