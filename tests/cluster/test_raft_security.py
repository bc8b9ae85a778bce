"""The raft port, attacked from a socket: real server processes on loopback.

pysyncobj's transport unpickles what a peer sends. What stands between the raft port and
running code is the listener's address (only ``-bind``), the cluster key (a frame not
sealed with it is dropped before anything is unpickled) and the frame bound (a declared
length over it closes the connection before the frame is buffered). Each test attacks
one of them and checks that nothing ran and nothing changed.
"""

from __future__ import annotations

import ipaddress
import signal
import socket
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from deploy.cluster import LocalCluster, pick_free_ports, query_state_digest, wait_for


def _ip(text: str) -> str:
    """IPv4 as IPv4 even when a dual-stack socket (gRPC's) reports it IPv4-mapped."""
    address = ipaddress.ip_address(text)
    mapped = getattr(address, "ipv4_mapped", None)
    return str(mapped or address)


def _listening_addresses(pid: int, port: int) -> set[str]:
    process = psutil.Process(pid)
    return {
        _ip(conn.laddr.ip)
        for conn in process.net_connections(kind="tcp")
        if conn.status == psutil.CONN_LISTEN and conn.laddr.port == port
    }


def _port(address: str) -> int:
    return int(address.rpartition(":")[2])


@pytest.mark.timeout(120)
def test_raft_listener__binds_only_the_bind_address(tmp_path: Path) -> None:
    with LocalCluster(tmp_path / "c", servers=1) as cluster:
        cluster.wait_for_leader(timeout=60)
        pid = cluster.pid(0)
        assert pid is not None
        raft_port = _port(cluster.raft_addresses[0])

        assert _listening_addresses(pid, raft_port) == {"127.0.0.1"}
        # 127.0.0.2 is loopback too: a listener on every interface would take it.
        with socket.socket() as sock, pytest.raises(ConnectionRefusedError):
            sock.connect(("127.0.0.2", raft_port))


@pytest.mark.timeout(120)
def test_dev_agent__starts_with_no_key_flag_and_listens_on_loopback_only(tmp_path: Path) -> None:
    (grpc_port,) = pick_free_ports(1)
    address = f"127.0.0.1:{grpc_port}"
    argv = [sys.executable, "-m", "drover.cli", "agent", "-dev", "-grpc-port", str(grpc_port)]
    argv += ["-data-dir", str(tmp_path / "dev")]
    log_path = tmp_path / "dev.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:

        def leading() -> bool:
            if proc.poll() is not None:
                raise AssertionError(f"the dev agent exited {proc.returncode}:\n{log_path.read_text()}")
            answer = query_state_digest(address)
            return answer is not None and answer.leader

        wait_for(leading, 60, message="the dev agent to lead")
        listening = {
            (_ip(conn.laddr.ip), conn.laddr.port)
            for conn in psutil.Process(proc.pid).net_connections(kind="tcp")
            if conn.status == psutil.CONN_LISTEN
        }
        assert ("127.0.0.1", grpc_port) in listening
        assert len(listening) >= 2, f"a raft listener besides gRPC: {listening}"
        assert {ip for ip, _ in listening} == {"127.0.0.1"}
    finally:
        proc.send_signal(signal.SIGTERM)
        returncode = proc.wait(timeout=30)
    assert returncode == 0, log_path.read_text()
