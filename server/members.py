"""``server members`` and ``agent-info``: who is in the cluster, and what this agent is.

A member is "alive" if it answered an ``Operator.AgentInfo`` probe within
``PROBE_TIMEOUT_S`` (or is the answering server), "failed" if not: raft's view of a peer
says only whether this server's raft connection to it is up, not whether it serves the API
an operator uses, and a killed server must not be listed as a follower. The probes run in
parallel, so a dead member costs one timeout, not one per member. A probe carries the
caller's token: with ACLs on, a member that refuses it (PERMISSION_DENIED) still answered,
so it is alive, but its version and applied index stay unknown to that caller.

A member of the table whose raft address is no longer in the answering server's raft
configuration (removed by ``operator raft remove-peer`` or autopilot) is "left", whether or
not it still answers: it takes no part in the quorum.
"""

from __future__ import annotations

import os
import platform
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Final

import grpc
import psutil

from drover.common.grpc_options import MESSAGE_SIZE_OPTIONS
from drover.common.secrets import TOKEN_METADATA_KEY
from drover.common.tls import open_channel
from drover.common.version import drover_version
from drover.scheduler.structs import ServerMember
from drover.v1 import api_pb2, api_pb2_grpc

if TYPE_CHECKING:
    from drover.server.core import ServerCore

__all__ = ["PROBE_TIMEOUT_S", "STATUS_ALIVE", "STATUS_FAILED", "STATUS_LEFT", "agent_info", "server_members"]

PROBE_TIMEOUT_S: Final = 1.0
STATUS_ALIVE: Final = "alive"
STATUS_FAILED: Final = "failed"
STATUS_LEFT: Final = "left"


def _probe(core: ServerCore, member: ServerMember, token: str) -> api_pb2.ServerMemberStatus:
    status = api_pb2.ServerMemberStatus(
        name=member.name, grpc_address=member.grpc_address, raft_address=member.raft_address
    )
    if not member.grpc_address:
        status.status = STATUS_FAILED  # never announced where it listens: nothing to ask
        return status
    metadata = ((TOKEN_METADATA_KEY, token),) if token else ()
    try:
        # A channel of its own, not the cached forwarding one: a cached channel to a member
        # that was down keeps failing fast for as long as grpc's reconnect backoff (up to
        # 120 s) after the member is back, and it would be listed failed all that time.
        with open_channel(member.grpc_address, core.tls, MESSAGE_SIZE_OPTIONS) as channel:
            stub = api_pb2_grpc.OperatorStub(channel)
            info = stub.AgentInfo(api_pb2.AgentInfoRequest(), timeout=PROBE_TIMEOUT_S, metadata=metadata)
    except grpc.RpcError as exc:
        answered = exc.code() == grpc.StatusCode.PERMISSION_DENIED
        status.status = STATUS_ALIVE if answered else STATUS_FAILED
        return status
    status.status = STATUS_ALIVE
    status.version = info.version
    raft: dict[str, str] = next((dict(s.values) for s in info.sections if s.name == "raft"), {})
    status.raft_applied_index = int(raft.get("applied_index", "0") or 0)
    return status


def server_members(core: ServerCore, token: str) -> api_pb2.ServerMembersResponse:
    """Every server of the state's servers table, probed; the leader marked by raft address."""
    members = sorted(core.store.snapshot().servers(), key=lambda m: m.name)
    leader = core.raft.leader_address()
    voters = set(core.raft.members())
    others = [m for m in members if m.name != core.name and m.raft_address in voters]
    with ThreadPoolExecutor(max_workers=max(1, len(others)), thread_name_prefix="members-probe") as pool:
        probed = dict(
            zip((m.name for m in others), pool.map(lambda m: _probe(core, m, token), others), strict=True)
        )
    response = api_pb2.ServerMembersResponse(served_by=core.name)
    for member in members:
        if member.name != core.name and member.name not in probed:
            status = api_pb2.ServerMemberStatus(
                name=member.name, grpc_address=member.grpc_address, raft_address=member.raft_address
            )
        elif member.name == core.name:
            status = api_pb2.ServerMemberStatus(
                name=member.name,
                grpc_address=member.grpc_address,
                raft_address=member.raft_address,
                status=STATUS_ALIVE,
                raft_applied_index=core.raft.applied_index(),
                version=drover_version(),
            )
        else:
            status = probed[member.name]
        status.leader = leader is not None and member.raft_address == leader
        if member.raft_address not in voters:
            status.status = STATUS_LEFT
        response.members.append(status)
    return response


def _raft_state(core: ServerCore) -> str:
    if core.raft.is_leader():
        return "leader"
    return "follower" if core.raft.leader_address() is not None else "candidate"


def agent_info(core: ServerCore) -> api_pb2.AgentInfoResponse:
    """This agent's own facts, in Nomad's agent-info sections (never another server's)."""
    raft = core.raft
    process = psutil.Process()
    sections: dict[str, dict[str, str]] = {
        "drover": {
            "name": core.name,
            "version": drover_version(),
            "server": "true",
            "grpc_address": core.grpc_address,
            "acl_enabled": str(core.cfg.acl_enabled).lower(),
        },
        "raft": {
            "state": _raft_state(core),
            "term": str(raft.term()),
            "applied_index": str(raft.applied_index()),
            "commit_index": str(raft.commit_index()),
            "leader": raft.leader_address() or "",
            "num_peers": str(len(raft.peers())),
            "address": raft.self_address(),
        },
        "runtime": {
            "python": platform.python_version(),
            "implementation": sys.implementation.name,
            "os": sys.platform,
            "arch": platform.machine(),
            "pid": str(os.getpid()),
            "threads": str(threading.active_count()),
            "cpu_count": str(os.cpu_count() or 0),
            "rss_bytes": str(process.memory_info().rss),
        },
    }
    for name, section in core.agent_info_sections.items():
        sections[name] = dict(section())
    response = api_pb2.AgentInfoResponse(name=core.name, version=drover_version())
    for name in sorted(sections):
        response.sections.add(name=name, values=sections[name])
    return response
