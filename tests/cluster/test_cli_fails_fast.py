"""The CLI against a real server that answers but has no leader (its two peers never
start): that is an election, so it is retried until ``-retry-deadline``, unlike an address
where nothing answers, which fails after ``-connect-timeout`` (tests/unit/test_sdk_connect.py).
The error says which happened; no test here times anything.
"""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from deploy.cluster import (
    ServerSpec,
    pick_free_ports,
    query_state_digest,
    server_argv,
    wait_for,
    write_raft_key,
)
from tests.cluster.cli import drover_cli, one_error_line


@pytest.fixture
def leaderless_server(tmp_path: Path) -> Iterator[str]:
    """One server of a three-server cluster whose other two never start: it serves gRPC
    and answers every call with "no cluster leader yet". Its gRPC address."""
    grpc_port, raft_port, *absent = pick_free_ports(4)
    spec = ServerSpec("s1", grpc_port, raft_port)
    peers = [spec.raft_address, *(f"{spec.host}:{port}" for port in absent)]
    key = write_raft_key(tmp_path / "raft.key")
    argv = server_argv(spec, tmp_path / "s1", peers, raft_key_file=key)
    log_path = tmp_path / "s1.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:

        def answering() -> bool:
            if proc.poll() is not None:
                raise AssertionError(f"the server exited {proc.returncode}:\n{log_path.read_text()}")
            return query_state_digest(spec.grpc_address) is not None

        wait_for(answering, 60, message="the server to answer")
        yield spec.grpc_address
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def test_cli__server_without_a_leader__retried_until_the_retry_deadline(leaderless_server: str) -> None:
    result = drover_cli(
        "job",
        "status",
        "-address",
        leaderless_server,
        "-connect-timeout",
        "1",
        "-retry-deadline",
        "4",
        timeout=60,
    )

    line = one_error_line(result)
    # Retried for the 4 s retry deadline, not given up after the 1 s connect timeout.
    assert line.startswith("Error: no server answered after "), line
    assert f" attempt(s) in 4s ({leaderless_server}): no cluster leader yet" in line, line


def test_cli__a_dead_address_beside_a_leaderless_server__still_an_election(leaderless_server: str) -> None:
    [port] = pick_free_ports(1)
    addresses = f"127.0.0.1:{port},{leaderless_server}"

    result = drover_cli(
        "job", "status", "-address", addresses, "-connect-timeout", "1", "-retry-deadline", "4", timeout=60
    )

    line = one_error_line(result)
    assert line.startswith("Error: no server answered after "), line
    assert f" in 4s (127.0.0.1:{port}, {leaderless_server}): " in line, line
