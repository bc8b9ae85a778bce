"""``server members``' probes (server/members.py): a member that answers is alive with its
version and applied index, one that refuses the caller's token is alive too (it answered),
one that does not answer is failed; the leader is marked by raft address; the probe carries
the caller's token. Members are served by in-process gRPC fakes on loopback ports."""

from __future__ import annotations

import socket
from contextlib import ExitStack
from types import SimpleNamespace
from typing import Any

import grpc

from drover.common.secrets import TOKEN_METADATA_KEY
from drover.common.version import drover_version
from drover.scheduler.structs import ServerMember
from drover.server.members import agent_info, server_members
from drover.v1 import api_pb2, api_pb2_grpc
from tests.fixtures.fake_grpc import serving


class FakeOperator(api_pb2_grpc.OperatorServicer):
    def __init__(self, version: str, applied: int, *, refuse: bool = False) -> None:
        self.version, self.applied, self.refuse = version, applied, refuse
        self.tokens: list[str] = []

    def AgentInfo(
        self, request: api_pb2.AgentInfoRequest, context: grpc.ServicerContext
    ) -> api_pb2.AgentInfoResponse:
        self.tokens.append(dict(context.invocation_metadata()).get(TOKEN_METADATA_KEY, ""))
        if self.refuse:
            context.abort(grpc.StatusCode.PERMISSION_DENIED, "Permission denied")
        response = api_pb2.AgentInfoResponse(version=self.version)
        response.sections.add(name="raft", values={"applied_index": str(self.applied)})
        return response


class FakeRaft:
    def __init__(self, leader: str, voters: tuple[str, ...] = ()) -> None:
        self.leader = leader
        # The raft configuration; by default every member of the table is a voter.
        self.voters = voters

    def leader_address(self) -> str:
        return self.leader

    def applied_index(self) -> int:
        return 41

    def is_leader(self) -> bool:
        return False

    def term(self) -> int:
        return 3

    def commit_index(self) -> int:
        return 42

    def peers(self) -> list[tuple[str, bool]]:
        return [("127.0.0.1:9002", True), ("127.0.0.1:9003", False)]

    def self_address(self) -> str:
        return "127.0.0.1:9001"

    def members(self) -> list[str]:
        return sorted(self.voters)


def _closed_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


def _core(members: list[ServerMember], leader: str, voters: tuple[str, ...] | None = None) -> Any:
    """A ServerCore as server/members.py reads it: its name, its state's servers table,
    raft's view, and its TLS (none: the fakes are plaintext)."""
    return SimpleNamespace(
        name="s1",
        store=SimpleNamespace(snapshot=lambda: SimpleNamespace(servers=lambda: iter(members))),
        raft=FakeRaft(leader, tuple(m.raft_address for m in members) if voters is None else voters),
        tls=None,
        grpc_address="127.0.0.1:8001",
        cfg=SimpleNamespace(acl_enabled=True),
        agent_info_sections={},
    )


def test_members__answering_refusing_and_silent() -> None:
    answering = FakeOperator("9.9.9", 40)
    refusing = FakeOperator("9.9.9", 40, refuse=True)
    with ExitStack() as stack:
        a = stack.enter_context(
            serving((api_pb2_grpc.add_OperatorServicer_to_server, answering), max_workers=2)
        )
        r = stack.enter_context(
            serving((api_pb2_grpc.add_OperatorServicer_to_server, refusing), max_workers=2)
        )
        members = [
            ServerMember(name="s1", raft_address="127.0.0.1:9001", grpc_address="127.0.0.1:8001"),
            ServerMember(name="s2", raft_address="127.0.0.1:9002", grpc_address=a),
            ServerMember(name="s3", raft_address="127.0.0.1:9003", grpc_address=r),
            ServerMember(name="s4", raft_address="127.0.0.1:9004", grpc_address=_closed_port()),
            ServerMember(name="s5", raft_address="127.0.0.1:9005", grpc_address=""),
        ]
        core = _core(members, leader="127.0.0.1:9002")

        response = server_members(core, "the-callers-secret")

    by_name = {m.name: m for m in response.members}
    assert response.served_by == "s1"
    assert [(n, m.status, m.leader) for n, m in sorted(by_name.items())] == [
        ("s1", "alive", False),
        ("s2", "alive", True),
        ("s3", "alive", False),
        ("s4", "failed", False),
        ("s5", "failed", False),
    ]
    assert (by_name["s1"].version, by_name["s1"].raft_applied_index) == (drover_version(), 41)
    assert (by_name["s2"].version, by_name["s2"].raft_applied_index) == ("9.9.9", 40)
    assert (by_name["s3"].version, by_name["s3"].raft_applied_index) == ("", 0)
    assert answering.tokens == refusing.tokens == ["the-callers-secret"]


def test_members__a_server_out_of_the_raft_configuration__is_left_and_not_probed() -> None:
    answering = FakeOperator("9.9.9", 40)
    with serving((api_pb2_grpc.add_OperatorServicer_to_server, answering), max_workers=2) as a:
        members = [
            ServerMember(name="s1", raft_address="127.0.0.1:9001", grpc_address="127.0.0.1:8001"),
            ServerMember(name="s2", raft_address="127.0.0.1:9002", grpc_address=a),
            ServerMember(name="s3", raft_address="127.0.0.1:9003", grpc_address=_closed_port()),
        ]
        core = _core(members, leader="127.0.0.1:9001", voters=("127.0.0.1:9001", "127.0.0.1:9003"))

        response = server_members(core, "")

    assert [(m.name, m.status) for m in response.members] == [
        ("s1", "alive"),
        ("s2", "left"),
        ("s3", "failed"),
    ]
    assert answering.tokens == [], "a server that left is not asked"


def test_agent_info__sections_of_this_agent_only() -> None:
    core = _core([], leader="127.0.0.1:9002")
    core.agent_info_sections["client"] = lambda: {"node_id": "n1"}

    info = agent_info(core)

    sections = {s.name: dict(s.values) for s in info.sections}
    assert [s.name for s in info.sections] == ["client", "drover", "raft", "runtime"]
    assert info.version == sections["drover"]["version"] == drover_version()
    assert sections["raft"] == {
        "state": "follower",
        "term": "3",
        "applied_index": "41",
        "commit_index": "42",
        "leader": "127.0.0.1:9002",
        "num_peers": "2",
        "address": "127.0.0.1:9001",
    }
    assert sections["client"] == {"node_id": "n1"}
    assert int(sections["runtime"]["rss_bytes"]) > 0
