"""deploy/cluster.py: the pure parts, plus the process handling against a stand-in agent.

The stand-in (written to tmp_path, run as ``python -m fake_agent``) speaks just enough of
the agent's command line and Operator.StateDigest for the launcher, so these tests do not
depend on the real server.
"""

from __future__ import annotations

import base64
import os
import signal
import socket
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import deploy.cluster as cluster_mod
from deploy.cluster import (
    ClusterError,
    ClusterRecord,
    LocalCluster,
    ProcessRecord,
    ServerSpec,
    peer_addresses,
    pick_free_ports,
    process_cmdline,
    server_argv,
    stop_recorded,
    wait_for,
    write_raft_key,
)


def _record(pid: int, argv: list[str], name: str = "s1") -> ProcessRecord:
    return ProcessRecord(
        name=name,
        pid=pid,
        argv=tuple(argv),
        data_dir=f"/tmp/x/{name}",
        log=f"/tmp/x/{name}.log",
        grpc_address="127.0.0.1:4001",
        raft_address="127.0.0.1:4002",
        grpc_port=4001,
        raft_port=4002,
    )


def test_pick_free_ports__distinct_and_bindable() -> None:
    ports = pick_free_ports(8)
    assert len(set(ports)) == 8
    for port in ports:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", port))


def test_pick_free_ports__below_the_ephemeral_range_so_no_outgoing_connection_takes_one() -> None:
    low = cluster_mod._ephemeral_low()
    assert low > cluster_mod.PICK_PORT_FLOOR  # this machine's range leaves room to pick from
    for port in pick_free_ports(16):
        assert cluster_mod.PICK_PORT_FLOOR <= port < low


def test_pick_free_ports__never_a_port_already_handed_out() -> None:
    """A cluster passes the ports its agents hold or are about to bind; all but ten of the
    block are excluded here, so ignoring ``exclude`` would almost surely pick one of them."""
    low = cluster_mod._ephemeral_low()
    excluded = set(range(cluster_mod.PICK_PORT_FLOOR, low - 10))
    ports = pick_free_ports(8, exclude=excluded)
    assert len(set(ports)) == 8
    assert not excluded & set(ports)


def test_pick_free_ports__falls_back_to_the_kernel_when_the_block_is_empty(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(cluster_mod, "_ephemeral_low", lambda: cluster_mod.PICK_PORT_FLOOR)
    ports = pick_free_ports(3)
    assert len(set(ports)) == 3
    assert all(port >= cluster_mod.PICK_PORT_FLOOR for port in ports)


def test_peers__exclude_self() -> None:
    specs = [ServerSpec(f"s{i + 1}", 5000 + 2 * i, 5001 + 2 * i) for i in range(3)]
    assert peer_addresses(specs, 0) == ["127.0.0.1:5003", "127.0.0.1:5005"]
    assert peer_addresses(specs, 1) == ["127.0.0.1:5001", "127.0.0.1:5005"]
    argv = server_argv(specs[2], Path("/d/s3"), peer_addresses(specs, 2))
    assert argv[1:3] == ["-m", "drover.cli"]
    assert argv[argv.index("-peers") + 1] == "127.0.0.1:5001,127.0.0.1:5003"
    assert argv[argv.index("-raft-port") + 1] == "5005"
    assert argv[argv.index("-grpc-port") + 1] == "5004"


def test_peers__single_server_has_no_peers_flag() -> None:
    spec = ServerSpec("s1", 5000, 5001)
    assert "-peers" not in server_argv(spec, Path("/d/s1"), peer_addresses([spec], 0))


def test_server_argv__passes_the_cluster_key_file() -> None:
    spec = ServerSpec("s1", 5000, 5001)
    argv = server_argv(spec, Path("/d/s1"), ["127.0.0.1:5003"], raft_key_file=Path("/d/raft.key"))
    assert argv[argv.index("-raft-key-file") + 1] == "/d/raft.key"
    assert "-raft-key-file" not in server_argv(spec, Path("/d/s1"), [])


def test_write_raft_key__fresh_base64_key_readable_by_its_owner_only(tmp_path: Path) -> None:
    old = os.umask(0)  # the file's mode must not depend on the caller's umask
    try:
        first = write_raft_key(tmp_path / "raft.key").read_bytes()
        path = write_raft_key(tmp_path / "raft.key")
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert len(base64.b64decode(path.read_bytes().strip(), validate=True)) == 32
    assert path.read_bytes() != first, "every start makes a fresh key"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["raft.key"]


def test_cluster_json__round_trip(tmp_path: Path) -> None:
    record = ClusterRecord(
        base_dir=str(tmp_path),
        servers=(_record(11, ["py", "-m", "drover.cli"]), _record(12, ["py"], name="s2")),
        clients=(ProcessRecord(name="c1", pid=13, argv=("py",), data_dir="/d/c1", log="/d/c1.log"),),
    )
    path = tmp_path / "cluster.json"
    record.save(path)
    assert ClusterRecord.load(path) == record
    assert record.grpc_addresses == ["127.0.0.1:4001", "127.0.0.1:4001"]


def test_cluster_json__unknown_version_is_refused() -> None:
    with pytest.raises(ValueError, match="version"):
        ClusterRecord.from_json('{"version": 99, "base_dir": "/", "servers": []}')


def test_wait_for__returns_the_truthy_value_or_times_out() -> None:
    calls = iter([None, 0, "leader"])
    assert wait_for(lambda: next(calls), timeout=5, interval=0.001) == "leader"
    with pytest.raises(TimeoutError, match="the moon"):
        wait_for(lambda: False, timeout=0.05, interval=0.01, message=lambda: "the moon")


def test_stop__refuses_a_pid_that_runs_something_else(tmp_path: Path) -> None:
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        wait_for(lambda: process_cmdline(sleeper.pid) == ["sleep", "30"], timeout=10, message="sleep to exec")
        path = tmp_path / "cluster.json"
        argv = [sys.executable, "-m", "drover.cli", "agent", "-server", "-data-dir", "/tmp/x/s1"]
        ClusterRecord(base_dir=str(tmp_path), servers=(_record(sleeper.pid, argv),)).save(path)
        assert stop_recorded(path, timeout=1.0) == {"s1": "foreign"}
        assert sleeper.poll() is None, "a pid whose cmdline does not match must not be signalled"
        assert not path.exists()
    finally:
        sleeper.kill()
        sleeper.wait()


def test_stop__ends_a_matching_process(tmp_path: Path) -> None:
    argv = [sys.executable, "-c", "import time; time.sleep(30)", "drover.cli"]
    proc = subprocess.Popen(argv)
    try:
        wait_for(lambda: process_cmdline(proc.pid) == argv, timeout=10, message="the child to exec")
        path = tmp_path / "cluster.json"
        ClusterRecord(base_dir=str(tmp_path), servers=(_record(proc.pid, argv),)).save(path)
        assert stop_recorded(path, timeout=5.0) == {"s1": "stopped"}
        assert proc.wait(timeout=5) == -signal.SIGTERM
    finally:
        proc.kill()
        proc.wait()


FAKE_AGENT = '''
"""Stand-in agent: parses the agent flags; a server answers StateDigest (s1 leads)."""
import argparse, signal, threading
from concurrent import futures

import grpc
from drover.v1 import api_pb2, api_pb2_grpc

p = argparse.ArgumentParser()
p.add_argument("cmd")
p.add_argument("-server", action="store_true")
p.add_argument("-client", action="store_true")
p.add_argument("-enable-raw-exec", action="store_true")
for flag in ("-node-name", "-data-dir", "-bind", "-grpc-port", "-raft-port", "-http-port", "-peers", "-servers",
             "-raft-key-file"):
    p.add_argument(flag)
args = p.parse_args()
done = threading.Event()
signal.signal(signal.SIGTERM, lambda *_: done.set())
server = None
if args.server:
    class Operator(api_pb2_grpc.OperatorServicer):
        def StateDigest(self, request, context):
            return api_pb2.StateDigestResponse(
                digest="d1", applied_index=7, server=args.node_name, leader=args.node_name == "s1"
            )
    server = grpc.server(futures.ThreadPoolExecutor(2))
    api_pb2_grpc.add_OperatorServicer_to_server(Operator(), server)
    server.add_insecure_port(f"{args.bind}:{args.grpc_port}")
    server.start()
print("fake agent up", args.node_name, flush=True)
done.wait()
if server is not None:
    server.stop(0).wait()
print("fake agent stopped", flush=True)
'''


@pytest.mark.timeout(120)
def test_local_cluster__lifecycle_against_a_stand_in_agent(tmp_path: Path) -> None:
    (tmp_path / "fake_agent.py").write_text(textwrap.dedent(FAKE_AGENT))
    cluster = LocalCluster(
        tmp_path / "c",
        servers=3,
        clients=1,
        env={"PYTHONPATH": str(tmp_path)},
        agent_module="fake_agent",
    )
    with cluster:
        assert cluster.server_names == ["s1", "s2", "s3"]
        key_file = cluster.raft_key_file
        assert key_file is not None and stat.S_IMODE(key_file.stat().st_mode) == 0o600
        for server in cluster.record().servers:
            assert server.argv[server.argv.index("-raft-key-file") + 1] == str(key_file)
        assert len(set(cluster.grpc_addresses + cluster.raft_addresses)) == 6
        assert cluster.wait_for_leader(30) == "s1"
        assert cluster.leader_index() == 0
        assert cluster.wait_converged(30) == ("d1", 7)

        cluster.kill(1)
        assert not cluster.is_alive(1)
        assert set(cluster.digests()) == {"s1", "s3"}
        with pytest.raises(ClusterError, match="still running"):
            cluster.restart(0)
        cluster.restart(1)
        assert cluster.wait_converged(30) == ("d1", 7)
        assert set(cluster.digests()) == {"s1", "s2", "s3"}

        cluster.pause(2)
        assert cluster.is_alive(2)
        assert cluster.stop(2) == 0, "a paused agent still gets its SIGTERM"
        assert cluster.log(1).count("launcher: starting") == 2
        assert "fake agent up c1" in cluster.client_log(0)
        pids = [p.pid for p in (*cluster.record().servers, *cluster.record().clients)]
    assert not any(cluster.is_alive(i) for i in range(3))
    assert not cluster.client_alive(0)
    assert all(process_cmdline(pid) is None for pid in pids)


@pytest.mark.timeout(60)
def test_local_cluster__an_agent_that_crashes_fails_the_wait_fast(tmp_path: Path) -> None:
    (tmp_path / "fake_agent.py").write_text("import sys\nprint('bad flag -grpc-port')\nsys.exit(3)\n")
    with (
        LocalCluster(
            tmp_path / "c", servers=1, env={"PYTHONPATH": str(tmp_path)}, agent_module="fake_agent"
        ) as cluster,
        pytest.raises(ClusterError, match="bad flag"),
    ):
        cluster.wait_for_leader(30)
