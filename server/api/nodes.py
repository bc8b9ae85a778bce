"""Nodes service: registration, status, drain and eligibility, and the client's alloc feed.

Node identity. The calls a client agent makes (Register, UpdateStatus and its stream
Heartbeat, GetClientAllocs, WatchClientAllocs, UpdateAllocs) authenticate with the node's
own secret, not with an ACL token: Register is trust-on-first-use, every later call needs
the secret whose hash the node was registered with, and a node reads and reports only its
own allocs (``Endpoints.authenticate_node``). No read answer carries a node's secret or
its hash.
"""

from __future__ import annotations

import functools
import time
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Final

import grpc

from drover.scheduler.structs import Node
from drover.server.api._base import DEFAULT_WAIT_S, MAX_WAIT_S, get_by_id, meta_for, query, rpc, write_meta
from drover.server.api._limits import CALLER_CHECK_S, caller_limits, caller_waiting
from drover.server.api._notify import notifier_for
from drover.server.api._park import ParkRequest, current_parking, each_request_as, node_caller
from drover.server.api.tunnel import NodeTunnelMixin
from drover.server.codec import from_proto, to_proto
from drover.server.endpoints import decode_drain
from drover.server.errors import DroverError, ValidationError
from drover.server.state_store import Snapshot
from drover.v1 import api_pb2, api_pb2_grpc, structs_pb2

if TYPE_CHECKING:
    from drover.server.core import ServerCore

S = "Nodes"


def _without_secret(node: structs_pb2.Node) -> structs_pb2.Node:
    """A node as readers see it: the secret authenticates the node's own client agent, and
    even its hash is not for readers."""
    node.ClearField("secret_id")
    node.ClearField("secret_hash")
    return node


# The index of a node with no allocs. Not 0: a query at min_index 0 does not wait, so a
# client told 0 could only poll. Every idle node of a fleet did (4,950 of 5,000 in the fleet
# bench, each re-asking as fast as it was answered). No alloc is written at raft index 1 (a
# leader's first entry is its no-op), so 1 is "none yet" and the first placement moves it.
NO_ALLOCS_INDEX: Final = 1


def _node_alloc_index(snap: Snapshot, node_id: str) -> int:
    """The newest change among the node's allocs (``NO_ALLOCS_INDEX`` with none): what a
    client blocks on."""
    return max((a.modify_index for a in snap.allocs_by_node(node_id)), default=NO_ALLOCS_INDEX)


def _node_allocs_past(node_id: str, index: int, snap: Snapshot) -> bool:
    """Moved either way: after a snapshot restore the node's index goes backwards, and the
    client must hear of it at once (it resends every status: client_agent/allocdiff.py)."""
    return _node_alloc_index(snap, node_id) != index


def _allocs_news(
    node_id: str, told: int, own_then: int, restored_index: Callable[[], int], snap: Snapshot
) -> bool:
    """Whether a GetClientAllocs asked at ``told`` has news. ``told`` is the alloc *table*
    index the node was last answered with, which is past its own index whenever another
    node's alloc changed since (always, for an idle node's NO_ALLOCS_INDEX): compared with
    ``!=`` to the node's own index, every such ask was answered at once, so after the first
    placement nearly every node's watch polled (the fleet bench's idle sims as fast as they
    were answered, the agent once per sync interval). News is a change of one of its allocs
    after ``told``; a state behind ``told`` (what it would be told now is lower: rewound,
    the client must hear it at once); or a snapshot restore, seen as its own index moving
    either way from ``own_then`` (what it was when the ask came) or as a restore after
    ``told`` (the FSM notes a restore's index only after its commit has woken the waiters,
    so that alone is late): its allocs may be older than what it runs and it must hear it
    at once (client_agent/allocdiff.py)."""
    own = _node_alloc_index(snap, node_id)
    return (
        own > told
        or own != own_then
        or max(own, snap.table_index("allocs")) < told
        or restored_index() > told
    )


class NodesServicer(NodeTunnelMixin, api_pb2_grpc.NodesServicer):
    def __init__(self, core: ServerCore) -> None:
        self.core = core

    @rpc(S, "write")
    def Register(
        self, request: api_pb2.NodeRegisterRequest, context: grpc.ServicerContext
    ) -> api_pb2.NodeRegisterResponse:
        if not request.HasField("node"):
            raise ValidationError("node: required")
        result, eval_ids, ttl = self.core.endpoints.register_node(from_proto(request.node, Node))
        return api_pb2.NodeRegisterResponse(
            meta=write_meta(result.index), heartbeat_ttl_ns=ttl, eval_ids=eval_ids
        )

    @rpc(S, "write")
    def UpdateStatus(
        self, request: api_pb2.NodeUpdateStatusRequest, context: grpc.ServicerContext
    ) -> api_pb2.NodeUpdateStatusResponse:
        result, eval_ids, ttl = self.core.endpoints.update_node_status(
            request.node_id, request.status, secret_id=request.secret_id
        )
        index = result.index if result is not None else self.core.store.index
        return api_pb2.NodeUpdateStatusResponse(
            meta=write_meta(index), heartbeat_ttl_ns=ttl, eval_ids=eval_ids
        )

    # The client agent's heartbeat (client_agent/rpc.py): UpdateStatus, a message at a time
    # on one open stream; each is checked, forwarded and answered as an UpdateStatus call.
    Heartbeat = each_request_as("UpdateStatus")

    @rpc(S, "read")
    def List(
        self, request: api_pb2.NodeListRequest, context: grpc.ServicerContext
    ) -> api_pb2.NodeListResponse:
        snap, meta = query(self.core, request.options, ("nodes",))
        response = api_pb2.NodeListResponse(meta=meta)
        for node in sorted(snap.nodes(), key=lambda n: (n.name, n.id)):
            if request.prefix and not (
                node.id.startswith(request.prefix) or node.name.startswith(request.prefix)
            ):
                continue
            _without_secret(to_proto(node, response.nodes.add()))
        return response

    @rpc(S, "read")
    def Get(self, request: api_pb2.NodeGetRequest, context: grpc.ServicerContext) -> api_pb2.NodeGetResponse:
        node, meta = get_by_id(self.core, request.options, "nodes", "node", request.node_id, Snapshot.node)
        response = api_pb2.NodeGetResponse(meta=meta)
        _without_secret(to_proto(node, response.node))
        return response

    @rpc(S, "write")
    def UpdateDrain(
        self, request: api_pb2.NodeUpdateDrainRequest, context: grpc.ServicerContext
    ) -> api_pb2.NodeUpdateDrainResponse:
        result, eval_ids = self.core.endpoints.update_drain(
            request.node_id, decode_drain(request), request.mark_eligible
        )
        return api_pb2.NodeUpdateDrainResponse(meta=write_meta(result.index), eval_ids=eval_ids)

    @rpc(S, "write")
    def UpdateEligibility(
        self, request: api_pb2.NodeUpdateEligibilityRequest, context: grpc.ServicerContext
    ) -> api_pb2.NodeUpdateEligibilityResponse:
        result, eval_ids = self.core.endpoints.update_eligibility(request.node_id, request.eligibility)
        return api_pb2.NodeUpdateEligibilityResponse(meta=write_meta(result.index), eval_ids=eval_ids)

    def _client_allocs(self, snap: Snapshot, node_id: str, index: int) -> api_pb2.ClientAllocsResponse:
        # The alloc table's index, which never goes down (a GC'd alloc can lower the node's
        # own newest index); the client blocks on it and wakes on its node's next change.
        response = api_pb2.ClientAllocsResponse(
            meta=meta_for(self.core, max(index, snap.table_index("allocs")))
        )
        for alloc in sorted(snap.allocs_by_node(node_id), key=lambda a: a.id):
            to_proto(alloc, response.allocs.add())
            key = f"{alloc.job_id}@{alloc.job_version}"
            if key not in response.jobs:
                job = snap.job_version(alloc.namespace, alloc.job_id, alloc.job_version)
                if job is not None:
                    to_proto(job, response.jobs[key])
        return response

    def _wait_node_allocs(self, node_id: str, min_index: int, timeout: float) -> tuple[Snapshot, int]:
        fsm = self.core.fsm
        snap = self.core.store.snapshot()
        index = _node_alloc_index(snap, node_id)
        parking = current_parking()
        own_then = index
        if parking is not None:
            # The node's index when the ask came, kept across the handler's runs.
            parking.baseline = own_then = index if parking.baseline is None else parking.baseline
        news = functools.partial(_allocs_news, node_id, min_index, own_then, lambda: fsm.restored_index)
        if parking is not None:
            # Under the aio bridge: park on the loop, as the node (server/api/_park.py).
            until = parking.deadline_after(timeout)
            if news(snap) or time.monotonic() >= until or self.core.store.closed:
                return snap, index
            raise ParkRequest(("allocs",), news, until, node_caller(node_id))
        deadline = time.monotonic() + timeout
        seen = min_index
        while True:
            left = max(0.0, min(deadline - time.monotonic(), CALLER_CHECK_S))
            snap = self.core.store.wait_for(("allocs",), seen, left)
            index = _node_alloc_index(snap, node_id)
            if news(snap) or time.monotonic() >= deadline or self.core.store.closed or not caller_waiting():
                return snap, index
            # Something else changed: wait for the next change of the alloc table.
            seen = max(seen, snap.table_index("allocs"))

    @rpc(S, "read")
    def GetClientAllocs(
        self, request: api_pb2.ClientAllocsRequest, context: grpc.ServicerContext
    ) -> api_pb2.ClientAllocsResponse:
        if not request.node_id:
            raise ValidationError("node_id: required")
        self.core.endpoints.authenticate_node(self.core.store.snapshot(), request.node_id, request.secret_id)
        options = request.options
        wait = options.wait_ns / 1e9 if options.wait_ns > 0 else DEFAULT_WAIT_S
        if options.min_index:
            snap, index = self._wait_node_allocs(request.node_id, options.min_index, min(wait, MAX_WAIT_S))
        else:
            snap = self.core.store.snapshot()
            index = _node_alloc_index(snap, request.node_id)
        return self._client_allocs(snap, request.node_id, index)

    async def WatchClientAllocs(
        self, request: api_pb2.ClientAllocsRequest, context: grpc.aio.ServicerContext[object, object]
    ) -> AsyncIterator[api_pb2.ClientAllocsResponse]:
        """Served from this server's own state (like Nomad's AllowStale client queries).

        A coroutine on the API loop: an open stream holds no thread, only one of the node's
        parking places (server/api/_limits.py) for as long as it is open, and wakes when
        the alloc table changes (server/api/_notify.py)."""
        core = self.core
        if not request.node_id:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "node_id: required")
        limits = caller_limits(core)
        node_id = request.node_id
        who = node_caller(node_id)
        try:
            core.endpoints.authenticate_node(core.store.snapshot(), node_id, request.secret_id)
            limits.acquire(who)
        except DroverError as exc:
            await context.abort(exc.code, str(exc))
        try:
            notifier = notifier_for(core)
            # From 0 the node hears its allocs once even if it has none: its index is never 0
            # (NO_ALLOCS_INDEX), so the first pass always differs.
            index = request.options.min_index
            while not core.store.closed:
                snap = await notifier.wait_until(
                    ("allocs",), functools.partial(_node_allocs_past, node_id, index), time.monotonic() + 5.0
                )
                new_index = _node_alloc_index(snap, node_id)
                # ``index`` follows what was sent, so an unchanged node waits (never spins).
                if new_index != index:
                    index = new_index
                    yield self._client_allocs(snap, node_id, new_index)
        finally:
            limits.release(who)

    @rpc(S, "write")
    def UpdateAllocs(
        self, request: api_pb2.AllocUpdateRequest, context: grpc.ServicerContext
    ) -> api_pb2.AllocUpdateResponse:
        result = self.core.endpoints.update_allocs(
            list(request.allocs), node_id=request.node_id, secret_id=request.secret_id
        )
        return api_pb2.AllocUpdateResponse(meta=write_meta(result.index))
