"""The raft port, attacked from a socket: real server processes on loopback.

pysyncobj's transport unpickles what a peer sends. What stands between the raft port and
running code is the listener's address (only ``-bind``), the cluster key (a frame not
sealed with it is dropped before anything is unpickled) and the frame bound (a declared
length over it closes the connection before the frame is buffered). Each test attacks
one of them and checks that nothing ran and nothing changed.
"""

from __future__ import annotations

import base64
import ipaddress
import os
import pickle
import socket
import stat
import struct
import subprocess
import sys
import time
import zlib
from pathlib import Path

import psutil
import pytest
from cryptography.fernet import Fernet
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.pbkdf2 import PBKDF2HMAC

from deploy.cluster import LocalCluster, wait_for
from drover.sdk import DroverClient
from tests.cluster.conftest import DevAgentFactory
from tests.cluster.jobs import service_job, wait_one_running
from tests.raft_wire import MakeDir, frame


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
def test_dev_agent__starts_with_no_key_flag_and_listens_on_loopback_only(
    dev_agent_factory: DevAgentFactory,
) -> None:
    agent = dev_agent_factory(http_port=0)
    agent.wait_leading()
    listening = {
        (_ip(conn.laddr.ip), conn.laddr.port)
        for conn in psutil.Process(agent.pid).net_connections(kind="tcp")
        if conn.status == psutil.CONN_LISTEN
    }
    assert ("127.0.0.1", agent.grpc_port) in listening
    assert len(listening) >= 2, f"a raft listener besides gRPC: {listening}"
    assert {ip for ip, _ in listening} == {"127.0.0.1"}
    assert agent.stop() == 0, agent.log()


# --- attacks from a socket ----------------------------------------------------------------

REFUSED = "raft.frame_refused"


def _pickle_frame(marker: Path) -> bytes:
    """What an unkeyed pysyncobj peer sends: the message pickled and compressed."""
    return frame(zlib.compress(pickle.dumps(MakeDir(marker), protocol=2)))


# pysyncobj.encryptor's key derivation, restated: importing pysyncobj here would replace
# socket.inet_ntop with its Windows-only stand-in, which psutil (above) needs. The right-key
# control below proves the two derive the same key.
_PYSYNCOBJ_SALT = b"\x15%q\xe6\xbb\x02\xa6\xf8\x13q\x90\xcf6+\x1e\xeb"


def _fernet(key: str) -> Fernet:
    kdf = PBKDF2HMAC(algorithm=hashes.SHA256(), length=32, salt=_PYSYNCOBJ_SALT, iterations=100000)
    return Fernet(base64.urlsafe_b64encode(kdf.derive(key.encode())))


def _sealed_frame(marker: Path, key: str) -> bytes:
    """The same message sealed as a keyed pysyncobj peer seals it, with ``key``."""
    body = zlib.compress(pickle.dumps(MakeDir(marker), protocol=2))
    return frame(_fernet(key).encrypt_at_time(body, 1))


def _address(raft_address: str) -> tuple[str, int]:
    host, _, port = raft_address.rpartition(":")
    return host, int(port)


def _send_until_closed(raft_address: str, data: bytes, timeout: float = 30.0) -> None:
    """Send ``data`` and return once the server has closed the connection."""
    with socket.create_connection(_address(raft_address), timeout=timeout) as sock:
        sock.sendall(data)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if not sock.recv(65536):
                    return
            except ConnectionResetError:
                return
    raise AssertionError(f"{raft_address} kept the connection open for {timeout:g}s")


def _wait_refused(cluster: LocalCluster, i: int, reason: str) -> str:
    """Server ``i``'s log, once it holds a refusal for ``reason``."""

    def logged() -> str | None:
        text = cluster.log(i)
        return text if reason in text else None

    return wait_for(logged, 30, message=f"{cluster.server_names[i]} to log {reason!r}")


@pytest.mark.timeout(180)
def test_raft_port__raw_pickle_runs_nothing_changes_nothing_and_is_logged_once(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    marker = tmp_path / "ran"
    before = cluster.digests()
    leader = cluster.leader_index()

    for _ in range(3):  # three connections, one after the other, from one address
        _send_until_closed(cluster.raft_addresses[leader], _pickle_frame(marker))

    log = _wait_refused(cluster, leader, "not sealed with this cluster's raft key")
    assert not marker.exists(), "the pickle was unpickled"
    assert log.count(REFUSED) == 1, "one line per peer address per minute"
    assert "Traceback" not in log
    assert cluster.digests() == before
    assert cluster.leader_index() == leader


@pytest.mark.timeout(180)
def test_raft_port__wrong_key_frame_runs_nothing_the_right_key_would(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    key_file = cluster.raft_key_file
    assert key_file is not None
    marker = tmp_path / "ran"
    before = cluster.digests()
    target = 1

    _send_until_closed(cluster.raft_addresses[target], _sealed_frame(marker, "not-the-cluster-key-at-all"))

    log = _wait_refused(cluster, target, "not sealed with this cluster's raft key")
    assert not marker.exists(), "a frame sealed with the wrong key was unpickled"
    assert "Traceback" not in log
    assert cluster.digests() == before
    # The control: the very same frame sealed with the cluster's key is unpickled (key
    # holders are members), so it is the key, not a malformed frame, that stopped it.
    with socket.create_connection(_address(cluster.raft_addresses[target]), timeout=30) as sock:
        sock.sendall(_sealed_frame(marker, key_file.read_text().strip()))
        wait_for(marker.exists, 30, message="the right key's frame to be unpickled")


@pytest.mark.timeout(180)
def test_raft_port__oversized_frame_is_cut_off_and_the_leader_stays(cluster: LocalCluster) -> None:
    leader = cluster.leader_index()
    answer = cluster.query_digest(leader)
    assert answer is not None and answer.leader
    term = answer.term
    declared = 64 * 1024 * 1024
    chunk = b"\0" * (1024 * 1024)
    sent = 0
    with socket.create_connection(_address(cluster.raft_addresses[leader]), timeout=30) as sock:
        sock.sendall(struct.pack("i", declared))
        with pytest.raises((BrokenPipeError, ConnectionResetError)):
            while sent < declared:
                sock.sendall(chunk)
                sent += len(chunk)
    # The kernel's buffers take a few MiB before the reset lands; the server read none of it.
    assert sent < declared // 4, f"the server took {sent} bytes of a frame over the bound"
    log = _wait_refused(cluster, leader, "frame over the size bound")
    assert "Traceback" not in log

    with DroverClient(cluster.grpc_addresses, retry_deadline=30) as client:
        client.register_job(service_job("after-the-flood", count=1))
    after = cluster.query_digest(leader)
    assert after is not None and after.leader, "the leader was deposed"
    assert after.term == term
    assert cluster.wait_for_leader(timeout=30) == cluster.server_names[leader]


# --- at rest ------------------------------------------------------------------------------


def _modes(root: Path) -> dict[str, int]:
    """Every path under ``root`` (itself included) -> its permission bits."""
    paths = [root, *root.rglob("*")]
    return {str(p.relative_to(root.parent)): stat.S_IMODE(p.lstat().st_mode) for p in paths}


def _not_private(modes: dict[str, int], root: Path) -> dict[str, str]:
    return {
        path: oct(mode)
        for path, mode in modes.items()
        if mode != (0o700 if (root.parent / path).is_dir() else 0o600)
    }


@pytest.mark.timeout(240)
def test_at_rest__data_dirs_journal_snapshots_client_state_and_saved_snapshot_are_the_owners_alone(
    tmp_path: Path,
) -> None:
    old_umask = os.umask(0o022)  # what a default shell gives: the agents must not rely on it
    try:
        with LocalCluster(tmp_path / "c", servers=1, clients=1) as cluster:
            cluster.wait_for_leader(timeout=60)
            with DroverClient(cluster.grpc_addresses, retry_deadline=60) as client:
                client.register_job(service_job("at-rest", count=1))
                wait_one_running(cluster, client, "at-rest", timeout=90)
            saved = tmp_path / "state.snap"
            result = subprocess.run(
                [sys.executable, "-m", "drover.cli", "operator", "snapshot", "save", str(saved)],
                env={**os.environ, "DROVER_ADDR": ",".join(cluster.grpc_addresses)},
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert result.returncode == 0, result.stdout + result.stderr
            server_dir = tmp_path / "c" / cluster.server_names[0]
            client_dir = cluster.client_data_dir(0)
    finally:
        os.umask(old_umask)

    server_modes = _modes(server_dir)
    assert any(path.endswith("journal.bin") for path in server_modes), server_modes
    assert _not_private(server_modes, server_dir) == {}
    # The client's own state: its dirs and records (task dirs belong to the drivers).
    state = [client_dir, client_dir / "client", client_dir / "client" / "allocs"]
    records = sorted((client_dir / "client").rglob("*.json"))
    assert len(records) >= 2, records  # node.json and the alloc's record
    assert {str(p): oct(stat.S_IMODE(p.stat().st_mode)) for p in state} == {str(p): "0o700" for p in state}
    assert {str(p): oct(stat.S_IMODE(p.stat().st_mode)) for p in records} == {
        str(p): "0o600" for p in records
    }
    assert stat.S_IMODE(saved.stat().st_mode) == 0o600
