"""Evals and Allocs services: read-only views (the schedulers write them), and
``Allocs.Stop``, the operator's request that the scheduler replace one alloc.

Stop names an alloc, not a namespace, so the rights table can only ask for
alloc-lifecycle in some namespace; the alloc's own namespace is checked here once it is
found, before anything is written (as server/api/deployments.py does).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import grpc

from drover.scheduler.structs import DEFAULT_NAMESPACE
from drover.server.acl import rights
from drover.server.acl.resolve import caller
from drover.server.api._base import get_by_id, query, rpc, write_meta
from drover.server.api.tunnel import AllocTunnelMixin
from drover.server.cluster_ops import stop_alloc
from drover.server.codec import to_proto
from drover.server.errors import NotFoundError, PermissionDeniedError, ValidationError
from drover.server.state_store import Snapshot
from drover.v1 import api_pb2, api_pb2_grpc

if TYPE_CHECKING:
    from drover.server.core import ServerCore


class EvalsServicer(api_pb2_grpc.EvalsServicer):
    def __init__(self, core: ServerCore) -> None:
        self.core = core

    @rpc("Evals", "read")
    def List(
        self, request: api_pb2.EvalListRequest, context: grpc.ServicerContext
    ) -> api_pb2.EvalListResponse:
        snap, meta = query(self.core, request.options, ("evals",))
        if request.job_id:
            evals = snap.evals_by_job(request.namespace or DEFAULT_NAMESPACE, request.job_id)
        else:
            evals = list(snap.evals())
        response = api_pb2.EvalListResponse(meta=meta)
        for ev in sorted(evals, key=lambda e: (e.create_index, e.id)):
            if request.status and ev.status != request.status:
                continue
            to_proto(ev, response.evals.add())
        return response

    @rpc("Evals", "read")
    def Get(self, request: api_pb2.EvalGetRequest, context: grpc.ServicerContext) -> api_pb2.EvalGetResponse:
        ev, meta = get_by_id(self.core, request.options, "evals", "eval", request.eval_id, Snapshot.eval)
        response = api_pb2.EvalGetResponse(meta=meta)
        to_proto(ev, response.eval)
        return response


def authorize_alloc(service: str, method: str, namespace: str) -> None:
    """Refuse a call about an alloc of a namespace the caller's token may not act on."""
    identity = caller()
    if identity is None or identity.acl.management:
        return  # ACLs off, or a management token
    need = rights.need_for(service, method)
    if not identity.acl.allows_namespace(namespace, need.any_of):
        raise PermissionDeniedError(
            f"Permission denied: {service}.{method} needs {' or '.join(need.any_of)} on namespace {namespace!r}"
        )


class AllocsServicer(AllocTunnelMixin, api_pb2_grpc.AllocsServicer):
    def __init__(self, core: ServerCore) -> None:
        self.core = core

    @rpc("Allocs", "read")
    def List(
        self, request: api_pb2.AllocListRequest, context: grpc.ServicerContext
    ) -> api_pb2.AllocListResponse:
        if request.job_id and request.node_id:
            raise ValidationError("job_id, node_id: give at most one")
        snap, meta = query(self.core, request.options, ("allocs",))
        if request.job_id:
            allocs = snap.allocs_by_job(request.namespace or DEFAULT_NAMESPACE, request.job_id)
        elif request.node_id:
            allocs = snap.allocs_by_node(request.node_id)
        else:
            allocs = list(snap.allocs())
        response = api_pb2.AllocListResponse(meta=meta)
        for alloc in sorted(allocs, key=lambda a: (a.name, a.create_index, a.id)):
            to_proto(alloc, response.allocs.add())
        return response

    @rpc("Allocs", "read")
    def Get(
        self, request: api_pb2.AllocGetRequest, context: grpc.ServicerContext
    ) -> api_pb2.AllocGetResponse:
        alloc, meta = get_by_id(
            self.core, request.options, "allocs", "alloc", request.alloc_id, Snapshot.alloc
        )
        response = api_pb2.AllocGetResponse(meta=meta)
        to_proto(alloc, response.alloc)
        return response

    @rpc("Allocs", "write")
    def Stop(
        self, request: api_pb2.AllocStopRequest, context: grpc.ServicerContext
    ) -> api_pb2.AllocStopResponse:
        if not request.alloc_id:
            raise ValidationError("alloc_id: required")
        core = self.core
        alloc = core.store.snapshot().alloc(request.alloc_id)
        if alloc is None:
            raise NotFoundError(f"alloc {request.alloc_id!r} not found")
        authorize_alloc("Allocs", "Stop", alloc.namespace)
        stopped = stop_alloc(core.raft, core.store, core.clock, core.ids, alloc)
        return api_pb2.AllocStopResponse(meta=write_meta(stopped.index), eval_id=stopped.eval_id)
