"""Membership changes on a running cluster, and health that tells the truth: real server
processes on loopback, one cluster shared by the module (the tests run in file order and
each leaves the cluster with a leader and a quorum, except the last).

* grown from 3 to 4 with ``agent -server -join``, then a host "replaced": removed with
  ``operator raft remove-peer`` and stopped, while writes keep being acknowledged; every
  live server ends on the same state digest; the joiner restarts from its saved peer set
  (it has no -peers) and catches up.
* ``operator raft transfer-leadership -peer-id`` moves the leader there.
* bad input: one ``Error:`` line and exit 1, INVALID_ARGUMENT naming the field over gRPC.
* the gRPC health service says NOT_SERVING (overall and per service) within 10 s of a
  server losing its quorum, and SERVING again once the quorum is back.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from deploy.cluster import LocalCluster, wait_for
from drover.sdk import DroverClient
from drover.v1 import api_pb2, api_pb2_grpc
from tests.cluster.cli import one_error_line, run_cli
from tests.cluster.conftest import wait_settled
from tests.cluster.writer import Writer

pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path_factory.mktemp("membership") / "cluster", servers=3) as c:
        wait_settled(c)
        yield c


def _caught_up(cluster: LocalCluster, i: int, timeout: float = 60) -> None:
    """Server ``i`` has applied what the leader had applied when this was called (the
    writes go on, so the digests can only be compared once they stop)."""
    leader = cluster.query_digest(cluster.leader_index())
    assert leader is not None
    wait_for(
        lambda: (d := cluster.query_digest(i)) is not None and d.applied_index >= leader.applied_index,
        timeout,
        0.1,
        lambda: f"{cluster.server_names[i]} to apply index {leader.applied_index}\n" + cluster.logs_tail(),
    )


def _peers(client: DroverClient) -> dict[str, tuple[str, bool]]:
    return {p.name: (p.raft_address, p.connected) for p in client.raft_peers().peers}


def test_membership__grow_to_four_with_join_then_replace_a_host__writes_continue_and_digests_agree(
    cluster: LocalCluster,
) -> None:
    originals = list(cluster.grpc_addresses)
    with DroverClient(originals, retry_deadline=30) as client, Writer(originals) as writer:
        writer.wait_more(5)
        s4 = cluster.add_server("s4")

        def four_announced() -> bool:
            peers = client.raft_peers().peers
            return len(peers) == 4 and all(p.grpc_address and p.connected for p in peers)

        wait_for(four_announced, 60, 0.1, lambda: "s4 to join\n" + cluster.logs_tail())
        writer.wait_more(5)
        _caught_up(cluster, s4)

        # Replace a host: any original but the leader goes, as a failed host would.
        leader = cluster.wait_for_leader()
        victim = next(n for n in cluster.server_names[:3] if n != leader)
        result = run_cli(cluster, "operator", "raft", "remove-peer", "-peer-id", victim)
        assert result.returncode == 0, result.stderr
        assert f"Removed peer {victim}" in result.stdout
        cluster.stop(cluster.server_names.index(victim))
        assert victim not in _peers(client)
        writer.wait_more(5)

        members = {m.name: m for m in client.server_members().members}
        assert members[victim].status == "left"
        assert {n: members[n].status for n in members if n != victim} == {
            n: "alive" for n in cluster.server_names if n != victim
        }
        assert sum(m.leader for m in members.values()) == 1
        assert all(m.raft_applied_index > 0 for n, m in members.items() if n != victim)

        # The joiner has no -peers: it restarts from the peer set it saved.
        cluster.kill(s4)
        writer.wait_more(5)
        cluster.restart(s4)
        writer.wait_more(5)
        _caught_up(cluster, s4)
    assert not writer.errors, writer.errors
    _digest, applied = cluster.wait_converged(timeout=60)
    assert len(cluster.digests()) == 3 and applied > 0, cluster.digests()
    with DroverClient([cluster.grpc_addresses[s4]], retry_deadline=30) as only_s4:
        stored = {j.id for j in only_s4.list_jobs(stale=True).jobs}
    assert set(writer.acked) <= stored, sorted(set(writer.acked) - stored)[:5]
    assert len(writer.acked) >= 30


def test_transfer_leadership__to_the_server_named(cluster: LocalCluster) -> None:
    leader = cluster.wait_for_leader()
    live = [n for i, n in enumerate(cluster.server_names) if cluster.is_alive(i)]
    target = next(n for n in live if n != leader)

    result = run_cli(cluster, "operator", "raft", "transfer-leadership", "-peer-id", target)

    assert result.returncode == 0, result.stderr
    assert f"Leadership transferred to {target}" in result.stdout
    assert cluster.wait_for_leader() == target


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("remove-peer",), "Error: give exactly one of -peer-address and -peer-id"),
        (("remove-peer", "-peer-address", "nowhere"), "Error: peer_address: 'nowhere' is not host:port"),
        (("remove-peer", "-peer-id", "no-such-server"), "Error: peer_id: no server named 'no-such-server'"),
        (("transfer-leadership", "-peer-id", "x", "-peer-address", "h:1"), "Error: give at most one of"),
    ],
)
def test_membership_cli__bad_input__one_error_line(
    cluster: LocalCluster, args: tuple[str, ...], message: str
) -> None:
    line = one_error_line(run_cli(cluster, "operator", "raft", *args))
    assert line.startswith(message), line


def test_raft_join__bad_address__invalid_argument_naming_the_field(cluster: LocalCluster) -> None:
    live = next(a for i, a in enumerate(cluster.grpc_addresses) if cluster.is_alive(i))
    with grpc.insecure_channel(live) as channel, pytest.raises(grpc.RpcError) as caught:
        api_pb2_grpc.OperatorStub(channel).RaftJoin(
            api_pb2.RaftJoinRequest(name="s9", raft_address="no-port"), timeout=30
        )
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert caught.value.details().startswith("raft_address: "), caught.value.details()


def _health(address: str, service: str) -> int:
    with grpc.insecure_channel(address) as channel:
        answer = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=service), timeout=5
        )
    return int(answer.status)


def test_health__not_serving_within_10s_of_losing_quorum__serving_again_after(
    cluster: LocalCluster,
) -> None:
    live = [i for i in range(len(cluster.server_names)) if cluster.is_alive(i)]
    assert len(live) == 3
    survivor, *others = live
    address = cluster.grpc_addresses[survivor]
    services = ("", "drover.v1.Jobs", "drover.v1.Operator")
    serving = health_pb2.HealthCheckResponse.SERVING
    not_serving = health_pb2.HealthCheckResponse.NOT_SERVING
    wait_for(lambda: all(_health(address, s) == serving for s in services), 30, 0.1, "SERVING to begin with")

    for i in others:
        cluster.kill(i)
    lost_at = time.monotonic()
    wait_for(
        lambda: all(_health(address, s) == not_serving for s in services),
        10,
        0.1,
        lambda: "NOT_SERVING within 10 s of losing quorum\n" + cluster.logs_tail(),
    )
    assert time.monotonic() - lost_at < 10

    for i in others:
        cluster.restart(i)
    wait_for(
        lambda: all(_health(address, s) == serving for s in services),
        60,
        0.1,
        lambda: "SERVING again once the quorum is back\n" + cluster.logs_tail(),
    )
