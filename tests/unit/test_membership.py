"""Membership's pure parts and its joiner: autopilot's choice (server/autopilot.py), the
health rule and reporter (server/api/health.py), the saved peer set
(server/raft/peers_file.py), address checks, and ``join_cluster`` retrying until in, against
an in-process fake Operator servicer on a loopback port (labelled: no real server)."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2

from drover.common.secrets import TOKEN_METADATA_KEY
from drover.server.api.health import HealthReporter, service_names, serving
from drover.server.autopilot import AutopilotSettings, dead_server_to_remove, quorum
from drover.server.errors import ConflictError, ValidationError
from drover.server.membership import JoinRefusedError, check_raft_address, join_cluster, transfer_leadership
from drover.server.raft.peers_file import PEERS_FILE, PeerSet, load_peer_set, save_peer_set
from drover.v1 import api_pb2, api_pb2_grpc
from tests.fixtures.fake_grpc import serving as serving_fakes

A, B, C, D, E = (f"10.0.0.{i}:4647" for i in range(1, 6))
ON = AutopilotSettings(cleanup_dead_servers=True, dead_server_threshold_s=30.0)

# -- autopilot -----------------------------------------------------------------------------


def test_quorum__is_a_majority() -> None:
    assert [quorum(n) for n in (1, 2, 3, 4, 5)] == [1, 2, 2, 3, 3]


@pytest.mark.parametrize(
    ("case", "settings", "members", "silent", "configured", "expected"),
    [
        ("off", AutopilotSettings(), (A, B, C, D), {B: 99.0}, 3, None),
        ("silent past the threshold goes", ON, (A, B, C, D), {B: 31.0, C: 0.1, D: 0.1}, 3, B),
        ("silent within the threshold stays", ON, (A, B, C, D), {B: 29.0, C: 0.1, D: 0.1}, 3, None),
        ("never heard of is not judged", ON, (A, B, C, D), {C: 0.1, D: 0.1}, 3, None),
        ("the longest silent first", ON, (A, B, C, D, E), {B: 40.0, C: 90.0, D: 0.1, E: 0.1}, 5, C),
        ("never below a quorum of the configured size", ON, (A, B, C), {B: 99.0, C: 0.1}, 5, None),
        ("down to exactly that quorum", ON, (A, B, C, D), {B: 99.0, C: 0.1, D: 0.1}, 5, B),
        ("three of three configured: 3 -> 2 keeps quorum 2", ON, (A, B, C), {B: 99.0, C: 0.1}, 3, B),
        ("two of three configured: no further", ON, (A, C), {C: 99.0}, 3, None),
        ("never the leader itself", ON, (A, B, C, D), {A: 99.0, B: 0.1, C: 0.1, D: 0.1}, 3, None),
    ],
)
def test_autopilot__dead_server_to_remove(
    case: str,
    settings: AutopilotSettings,
    members: tuple[str, ...],
    silent: dict[str, float],
    configured: int,
    expected: str | None,
) -> None:
    chosen = dead_server_to_remove(
        settings, leader=A, members=members, silent_for_s=silent, configured_size=configured
    )
    assert chosen == expected, case


# -- health --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("leader_known", "voters", "reachable", "expected"),
    [
        (True, 1, 1, True),
        (True, 3, 2, True),
        (True, 3, 1, False),
        (False, 3, 3, False),
        (True, 4, 2, False),
        (True, 4, 3, True),
        (True, 5, 3, True),
    ],
)
def test_health__serving_needs_a_leader_and_a_majority(
    leader_known: bool, voters: int, reachable: int, expected: bool
) -> None:
    assert serving(leader_known=leader_known, voters=voters, reachable_voters=reachable) is expected


class FakeRaftView:
    """What HealthReporter reads from a RaftNode (in-process fake)."""

    def __init__(self) -> None:
        self.leader: str | None = A
        self.connected = {B: True, C: True}

    def leader_address(self) -> str | None:
        return self.leader

    def peers(self) -> list[tuple[str, bool]]:
        return sorted(self.connected.items())

    def members(self) -> list[str]:
        return sorted([A, *self.connected])


def _statuses(reporter: HealthReporter) -> set[int]:
    request = health_pb2.HealthCheckRequest
    return {reporter.servicer.Check(request(service=name), None).status for name in service_names()}


def test_health_reporter__every_name_follows_quorum_both_ways() -> None:
    reporter = HealthReporter()
    raft: Any = FakeRaftView()
    assert "drover.v1.Jobs" in service_names() and "" in service_names()
    assert _statuses(reporter) == {health_pb2.HealthCheckResponse.NOT_SERVING}, "not serving before a look"

    assert reporter.refresh(raft) is True
    assert _statuses(reporter) == {health_pb2.HealthCheckResponse.SERVING}

    raft.connected = {B: False, C: False}
    assert reporter.refresh(raft) is False
    assert _statuses(reporter) == {health_pb2.HealthCheckResponse.NOT_SERVING}

    raft.connected = {B: True, C: False}
    raft.leader = None
    assert reporter.refresh(raft) is False
    raft.leader = B
    assert reporter.refresh(raft) is True
    assert _statuses(reporter) == {health_pb2.HealthCheckResponse.SERVING}


# -- the saved peer set --------------------------------------------------------------------


def test_peer_set__round_trip_and_replace(tmp_path: Path) -> None:
    assert load_peer_set(str(tmp_path)) is None
    save_peer_set(str(tmp_path), PeerSet(members=(C, A, B), configured_size=3))
    save_peer_set(str(tmp_path), PeerSet(members=(A, B, C, D), configured_size=4))
    assert load_peer_set(str(tmp_path)) == PeerSet(members=(A, B, C, D), configured_size=4)
    assert sorted(os.listdir(tmp_path)) == [PEERS_FILE], "no temporary file left behind"
    assert os.stat(tmp_path / PEERS_FILE).st_mode & 0o077 == 0


@pytest.mark.parametrize(
    "body", ["{", json.dumps({"members": "a"}), json.dumps({"members": [A], "configured_size": 0})]
)
def test_peer_set__a_damaged_file_is_refused_naming_it(tmp_path: Path, body: str) -> None:
    (tmp_path / PEERS_FILE).write_text(body)
    with pytest.raises(ValueError, match=PEERS_FILE):
        load_peer_set(str(tmp_path))


@pytest.mark.parametrize("text", ["", "host", "host:", ":4647", "host:0", "host:65536", "host:x"])
def test_check_raft_address__refuses_naming_the_field(text: str) -> None:
    with pytest.raises(ValidationError, match=r"^raft_address: "):
        check_raft_address("raft_address", text)


def test_check_raft_address__accepts_host_port() -> None:
    assert check_raft_address("raft_address", "10.0.0.1:4647") == "10.0.0.1:4647"


class _OneVoterRaft:
    """A one-server cluster's raft (in-process fake): a transfer must not even be tried."""

    def members(self) -> list[str]:
        return [A]

    def transfer_leadership_to(self, address: str | None, timeout: float) -> str:
        raise AssertionError(f"tried to transfer to {address} for {timeout}s on a one-voter cluster")


def test_transfer_leadership__one_voter__refused_at_once() -> None:
    core: Any = type("Core", (), {"raft": _OneVoterRaft()})()
    with pytest.raises(ConflictError, match=r"^peer_address: .*only voter"):
        transfer_leadership(core, "", "")


# -- joining -------------------------------------------------------------------------------


class FakeJoinOperator(api_pb2_grpc.OperatorServicer):
    """Refuses with ``codes`` in turn, then adds the joiner (in-process fake)."""

    def __init__(self, codes: list[grpc.StatusCode]) -> None:
        self.codes = codes
        self.calls: list[tuple[str, str, str]] = []

    def RaftJoin(
        self, request: api_pb2.RaftJoinRequest, context: grpc.ServicerContext
    ) -> api_pb2.RaftJoinResponse:
        token = dict(context.invocation_metadata()).get(TOKEN_METADATA_KEY, "")
        self.calls.append((request.name, request.raft_address, token))
        if self.codes:
            context.abort(self.codes.pop(0), "not now")
        return api_pb2.RaftJoinResponse(raft_addresses=sorted([A, B, request.raft_address]))


def test_join_cluster__retries_until_in_across_addresses() -> None:
    fake = FakeJoinOperator([grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.ABORTED])
    waits: list[float] = []
    with serving_fakes((api_pb2_grpc.add_OperatorServicer_to_server, fake), max_workers=2) as address:
        members = join_cluster(
            [address, address],
            "s4",
            D,
            None,
            "mgmt-secret",
            threading.Event(),
            sleep=lambda s: waits.append(s) is not None,
        )
    assert members == sorted([A, B, D])
    assert fake.calls == [("s4", D, "mgmt-secret")] * 3
    assert waits == [0.5, 1.0], "backs off between attempts"


def test_join_cluster__a_final_refusal_stops_with_the_servers_reason() -> None:
    fake = FakeJoinOperator([grpc.StatusCode.PERMISSION_DENIED])
    with (
        serving_fakes((api_pb2_grpc.add_OperatorServicer_to_server, fake), max_workers=2) as address,
        pytest.raises(JoinRefusedError, match="not now"),
    ):
        join_cluster([address], "s4", D, None, "", threading.Event(), sleep=lambda s: False)
    assert len(fake.calls) == 1
