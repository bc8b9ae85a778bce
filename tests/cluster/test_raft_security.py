"""The raft port, attacked from a socket: real server processes on loopback.

pysyncobj's transport unpickles what a peer sends. What stands between the raft port and
running code is the listener's address (only ``-bind``), the cluster key (a frame not
sealed with it is dropped before anything is unpickled) and the frame bound (a declared
length over it closes the connection before the frame is buffered). Each test attacks
one of them and checks that nothing ran and nothing changed.
"""

from __future__ import annotations

import socket
from pathlib import Path

import psutil
import pytest

from deploy.cluster import LocalCluster


def _listening_addresses(pid: int, port: int) -> set[str]:
    process = psutil.Process(pid)
    return {
        conn.laddr.ip
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
