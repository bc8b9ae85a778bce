"""TLS and mTLS on the gRPC port, over real processes: servers, a client agent and the CLI.

Each cluster gets its own CA (``LocalCluster(tls=True)``); "another CA" is a second one made
here. What is checked is what an operator would see: plaintext refused, the CLI working
with ``-ca-cert``, a foreign certificate refused, a follower forwarding a write to the
leader over mTLS, a client agent registering and running a job over mTLS.
"""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from deploy.cluster import LocalCluster, wait_for
from drover.common import certs
from drover.common.tls import TLSFiles
from drover.sdk import DroverClient, DroverError
from drover.v1 import structs_pb2
from tests.cluster.cli import drover_cli, lone_server_args, one_error_line
from tests.cluster.conftest import wait_settled
from tests.cluster.jobs import service_job


def _plaintext_health(address: str) -> grpc.StatusCode:
    with grpc.insecure_channel(address) as channel:
        try:
            health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
        except grpc.RpcError as exc:
            return exc.code()  # type: ignore[no-any-return]
    return grpc.StatusCode.OK


def _foreign_cli_files(tmp_path: Path, cluster: LocalCluster) -> TLSFiles:
    """A CLI certificate from a CA the cluster does not trust (the cluster's CA to check it)."""
    assert cluster.tls is not None
    other = certs.create_ca()
    cert, key = str(tmp_path / "foreign.pem"), str(tmp_path / "foreign-key.pem")
    certs.write_pair(certs.create_cert(other, "cli"), cert, key)
    return TLSFiles(str(cluster.tls.ca_file), cert, key)


def test_tls__server_refuses_plaintext_and_serves_the_cli_with_ca_cert(tmp_path: Path) -> None:
    with LocalCluster(tmp_path / "c", servers=1, tls=True, verify_clients=False) as cluster:
        assert cluster.tls is not None
        address = cluster.grpc_addresses[0]
        cluster.wait_for_leader(60)

        assert _plaintext_health(address) == grpc.StatusCode.UNAVAILABLE
        refused = drover_cli("operator", "raft", "list-peers", "-address", address, "-retry-deadline", "1")
        assert one_error_line(refused).startswith(f"Error: no drover server at {address}: socket closed")

        served = drover_cli(
            "operator", "raft", "list-peers", "-address", address, "-ca-cert", str(cluster.tls.ca_file)
        )
        assert served.returncode == 0, served.stderr
        assert "leader" in served.stdout and "s1" in served.stdout
        from_env = drover_cli(
            "job", "status", "-address", address, env={"DROVER_CACERT": str(cluster.tls.ca_file)}
        )
        assert from_env.returncode == 0 and "No jobs" in from_env.stdout, from_env.stderr


def test_mtls__a_certificate_from_another_ca_is_refused_and_the_clusters_is_accepted(tmp_path: Path) -> None:
    with LocalCluster(tmp_path / "c", servers=1, tls=True) as cluster:
        assert cluster.tls is not None
        cluster.wait_for_leader(60)
        address = cluster.grpc_addresses[0]
        foreign = _foreign_cli_files(tmp_path, cluster)
        for files in (foreign, TLSFiles(str(cluster.tls.ca_file))):
            with (
                DroverClient(address, retry_deadline=1, tls=files) as client,
                pytest.raises(DroverError) as err,
            ):
                client.list_jobs()
            assert err.value.code == grpc.StatusCode.UNAVAILABLE

        with DroverClient(address, retry_deadline=30, tls=cluster.tls.cli_files) as client:
            assert list(client.list_jobs().jobs) == []

        foreign_cli = drover_cli(
            "job", "status", "-address", address, "-retry-deadline", "1",
            "-ca-cert", foreign.ca_file, "-client-cert", foreign.cert_file, "-client-key", foreign.key_file,
        )  # fmt: skip
        one_error_line(foreign_cli)
        own_cli = drover_cli("job", "status", "-address", address, env=cluster.tls.cli_env)
        assert own_cli.returncode == 0 and "No jobs" in own_cli.stdout, own_cli.stderr


def test_mtls__three_servers__a_follower_forwards_a_write_to_the_leader(tmp_path: Path) -> None:
    with LocalCluster(tmp_path / "c", servers=3, tls=True) as cluster:
        assert cluster.tls is not None
        wait_settled(cluster)
        leader = cluster.leader_index()
        follower = next(i for i in range(3) if i != leader)
        with DroverClient(
            cluster.grpc_addresses[follower], retry_deadline=30, tls=cluster.tls.cli_files
        ) as at:
            resp = at.register_job(service_job("web"))
            assert resp.eval_id
        with DroverClient(cluster.grpc_addresses[leader], retry_deadline=30, tls=cluster.tls.cli_files) as at:
            assert at.get_job("web").job.id == "web"
        assert all(_plaintext_health(a) == grpc.StatusCode.UNAVAILABLE for a in cluster.grpc_addresses)


def _running(client: DroverClient, job_id: str) -> list[structs_pb2.Allocation] | None:
    allocs = [a for a in client.list_allocs(job_id=job_id).allocs if a.client_status == "running"]
    return allocs if len(allocs) == 2 else None


def test_mtls__a_client_agent_registers_and_runs_a_job(tmp_path: Path) -> None:
    with LocalCluster(tmp_path / "c", servers=1, clients=1, tls=True) as cluster:
        assert cluster.tls is not None
        cluster.wait_for_leader(60)
        with DroverClient(cluster.grpc_addresses, retry_deadline=60, tls=cluster.tls.cli_files) as client:
            wait_for(
                lambda: [n for n in client.list_nodes().nodes if n.name == "c1" and n.status == "ready"],
                60,
                0.2,
                lambda: "c1 ready over mTLS\n" + cluster.logs_tail(),
            )
            client.register_job(service_job("web", count=2))
            wait_for(
                lambda: _running(client, "web"), 60, 0.2, lambda: "two running allocs\n" + cluster.logs_tail()
            )


def _server_argv(tmp_path: Path, *tls_args: str) -> list[str]:
    return lone_server_args(tmp_path / "s1", "-grpc-port", "0", *tls_args)


@pytest.mark.parametrize(
    ("tls_args", "message"),
    [
        (
            ["-tls-ca-file", "ca.pem", "-tls-cert-file", "s.pem"],
            "-tls-cert-file was given without -tls-key-file",
        ),
        (["-tls-cert-file", "s.pem", "-tls-key-file", "k.pem"], "was given without -tls-ca-file"),
        (["-tls-ca-file", "ca.pem"], "needs -tls-cert-file and -tls-key-file"),
        (["-tls-verify-client"], "-tls-verify-client needs -tls-ca-file"),
    ],
    ids=["cert-without-key", "cert-without-ca", "ca-without-identity", "verify-without-files"],
)
def test_tls__agent_with_half_a_tls_setting__one_line_exit_1(
    tmp_path: Path, tls_args: list[str], message: str
) -> None:
    assert message in one_error_line(drover_cli(*_server_argv(tmp_path, *tls_args)))


def test_tls__agent_with_a_missing_file__exit_1_naming_flag_and_file(tmp_path: Path) -> None:
    pair = certs.create_cert(certs.create_ca(), "server")
    certs.write_pair(pair, str(tmp_path / "s.pem"), str(tmp_path / "s-key.pem"))
    argv = _server_argv(
        tmp_path, "-tls-ca-file", str(tmp_path / "nope.pem"),
        "-tls-cert-file", str(tmp_path / "s.pem"), "-tls-key-file", str(tmp_path / "s-key.pem"),
    )  # fmt: skip
    result = drover_cli(*argv)
    assert result.returncode == 1
    assert (
        f"Error: -tls-ca-file {tmp_path / 'nope.pem'}: No such file or directory"
        in result.stdout + result.stderr
    )
    client = drover_cli(
        "agent", "-client", "-node-name", "c1", "-data-dir", str(tmp_path / "c1"), "-servers", "127.0.0.1:1",
        "-tls-ca-file", str(tmp_path / "nope.pem"),
    )  # fmt: skip
    assert client.returncode == 1
    assert (
        f"Error: -tls-ca-file {tmp_path / 'nope.pem'}: No such file or directory"
        in client.stdout + client.stderr
    )


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (
            ["-ca-cert", "ca.pem", "-client-cert", "c.pem"],
            "-client-cert (or DROVER_CLIENT_CERT) was given without",
        ),
        (["-ca-cert", "/nonexistent/ca.pem"], "/nonexistent/ca.pem: No such file or directory"),
    ],
    ids=["cert-without-key", "missing-ca"],
)
def test_tls__cli_with_bad_tls_flags__one_line_exit_1(flags: list[str], message: str) -> None:
    assert message in one_error_line(drover_cli("job", "status", "-address", "127.0.0.1:1", *flags))
