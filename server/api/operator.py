"""Operator service: raft peers, snapshots, the state digest the tests compare, server
members, this agent's own facts, and the scheduler configuration."""

from __future__ import annotations

from typing import TYPE_CHECKING

import grpc
from prometheus_client import generate_latest

from drover.scheduler.structs import SchedulerConfig
from drover.server import membership
from drover.server.api._base import call_token, meta_for, query, rpc, write_meta
from drover.server.cluster_ops import set_scheduler_config
from drover.server.codec import from_proto, to_proto
from drover.server.errors import ValidationError
from drover.server.gc.select import FORCE
from drover.server.invariants import check_invariants
from drover.server.members import agent_info, server_members
from drover.server.snapshot import state_digest, to_snapshot
from drover.v1 import api_pb2, api_pb2_grpc

if TYPE_CHECKING:
    from drover.server.core import ServerCore


class OperatorServicer(api_pb2_grpc.OperatorServicer):
    def __init__(self, core: ServerCore) -> None:
        self.core = core

    @rpc("Operator", "read")
    def RaftPeers(
        self, request: api_pb2.RaftPeersRequest, context: grpc.ServicerContext
    ) -> api_pb2.RaftPeersResponse:
        raft = self.core.raft
        snap = self.core.store.snapshot()
        members = {m.raft_address: m for m in snap.servers()}
        leader = raft.leader_address()
        response = api_pb2.RaftPeersResponse(
            meta=meta_for(self.core, snap.table_index("servers")),
            term=raft.term(),
            commit_index=raft.commit_index(),
        )
        peers = [(raft.self_address(), True), *raft.peers()]
        for address, connected in sorted(peers):
            member = members.get(address)
            response.peers.add(
                name=member.name if member else "",
                raft_address=address,
                grpc_address=member.grpc_address if member else "",
                leader=address == leader,
                voter=True,
                connected=connected,
            )
        return response

    @rpc("Operator", "read")
    def SnapshotSave(
        self, request: api_pb2.SnapshotSaveRequest, context: grpc.ServicerContext
    ) -> api_pb2.SnapshotSaveResponse:
        snap, meta = query(self.core, request.options, ())
        return api_pb2.SnapshotSaveResponse(meta=meta, snapshot=to_snapshot(snap.tables))

    # These writes keep the write pool (``inline=False``, server/inline.py): each spends
    # long on the CPU or waits otherwise than for one commit (a restore decodes a whole
    # state, a recount and a collection walk every table, a membership change polls raft),
    # and on the API loop that would stall every other call meanwhile.
    @rpc("Operator", "write", inline=False)
    def SnapshotRestore(
        self, request: api_pb2.SnapshotRestoreRequest, context: grpc.ServicerContext
    ) -> api_pb2.SnapshotRestoreResponse:
        if not request.HasField("snapshot"):
            raise ValidationError("snapshot: required")
        result = self.core.endpoints.restore_snapshot(request.snapshot)
        return api_pb2.SnapshotRestoreResponse(meta=write_meta(result.index))

    @rpc("Operator", "write", inline=False)
    def ReconcileSummaries(
        self, request: api_pb2.ReconcileSummariesRequest, context: grpc.ServicerContext
    ) -> api_pb2.ReconcileSummariesResponse:
        result = self.core.endpoints.reconcile_summaries()
        response = api_pb2.ReconcileSummariesResponse(meta=write_meta(result.index))
        for correction in result.value or ():
            response.corrections.add(
                namespace=correction.namespace, job_id=correction.job_id, changes=list(correction.changes)
            )
        return response

    @rpc("Operator", "write", inline=False)
    def GarbageCollect(
        self, request: api_pb2.SystemGCRequest, context: grpc.ServicerContext
    ) -> api_pb2.SystemGCResponse:
        # Forwarded to the leader like every write; it selects with every threshold 0.
        deleted, index = self.core.gc.collect(FORCE)
        return api_pb2.SystemGCResponse(meta=write_meta(index or self.core.store.index), **deleted)

    @rpc("Operator", "write", inline=False)
    def RaftJoin(
        self, request: api_pb2.RaftJoinRequest, context: grpc.ServicerContext
    ) -> api_pb2.RaftJoinResponse:
        index, members = membership.join(self.core, request.name, request.raft_address)
        return api_pb2.RaftJoinResponse(meta=write_meta(index), raft_addresses=members)

    @rpc("Operator", "write", inline=False)
    def RaftRemovePeer(
        self, request: api_pb2.RaftRemovePeerRequest, context: grpc.ServicerContext
    ) -> api_pb2.RaftRemovePeerResponse:
        index, address = membership.remove_peer(self.core, request.raft_address, request.name)
        return api_pb2.RaftRemovePeerResponse(meta=write_meta(index), raft_address=address)

    @rpc("Operator", "write", inline=False)
    def RaftTransferLeadership(
        self, request: api_pb2.RaftTransferLeadershipRequest, context: grpc.ServicerContext
    ) -> api_pb2.RaftTransferLeadershipResponse:
        address, name = membership.transfer_leadership(self.core, request.raft_address, request.name)
        return api_pb2.RaftTransferLeadershipResponse(leader_raft_address=address, leader_name=name)

    @rpc("Operator", "local")
    def Metrics(
        self, request: api_pb2.MetricsRequest, context: grpc.ServicerContext
    ) -> api_pb2.MetricsResponse:
        # The registry the HTTP port serves too (server/telemetry/http.py).
        return api_pb2.MetricsResponse(
            text=generate_latest(self.core.metrics).decode(), server=self.core.name
        )

    @rpc("Operator", "local")
    def StateDigest(
        self, request: api_pb2.StateDigestRequest, context: grpc.ServicerContext
    ) -> api_pb2.StateDigestResponse:
        raft = self.core.raft
        tables = self.core.store.snapshot().tables
        return api_pb2.StateDigestResponse(
            digest=state_digest(tables),
            applied_index=tables.index,
            commit_index=raft.commit_index(),
            server=self.core.name,
            leader=raft.is_leader(),
            term=raft.term(),
        )

    @rpc("Operator", "local")
    def Invariants(
        self, request: api_pb2.InvariantsRequest, context: grpc.ServicerContext
    ) -> api_pb2.InvariantsResponse:
        tables = self.core.store.snapshot().tables
        found = check_invariants(tables, self.core.restore_watch.mark(), self.core.clock.now_ns())
        return api_pb2.InvariantsResponse(
            violations=[str(v) for v in found], index=tables.index, server=self.core.name
        )

    @rpc("Operator", "local")
    def ServerMembers(
        self, request: api_pb2.ServerMembersRequest, context: grpc.ServicerContext
    ) -> api_pb2.ServerMembersResponse:
        # Answered by the server asked, as Nomad's gossip view is: it must work with no
        # leader (after the leader died), which is when an operator needs it most.
        return server_members(self.core, call_token(context))

    @rpc("Operator", "local")
    def AgentInfo(
        self, request: api_pb2.AgentInfoRequest, context: grpc.ServicerContext
    ) -> api_pb2.AgentInfoResponse:
        return agent_info(self.core)

    @rpc("Operator", "read")
    def SchedulerGetConfig(
        self, request: api_pb2.SchedulerGetConfigRequest, context: grpc.ServicerContext
    ) -> api_pb2.SchedulerConfigResponse:
        snap, meta = query(self.core, request.options, ("scheduler_config",))
        response = api_pb2.SchedulerConfigResponse(meta=meta)
        to_proto(snap.scheduler_config(), response.config)
        return response

    @rpc("Operator", "write")
    def SchedulerSetConfig(
        self, request: api_pb2.SchedulerSetConfigRequest, context: grpc.ServicerContext
    ) -> api_pb2.SchedulerSetConfigResponse:
        if not request.HasField("config"):
            raise ValidationError("config: required")
        index = set_scheduler_config(
            self.core.raft,
            from_proto(request.config, SchedulerConfig),
            cas_index=request.cas_index if request.use_cas else None,
        )
        return api_pb2.SchedulerSetConfigResponse(meta=write_meta(index), updated=True)
