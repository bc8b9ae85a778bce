"""Evals and Allocs services: read-only views (the schedulers write them)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import grpc

from drover.scheduler.structs import DEFAULT_NAMESPACE
from drover.server.api._base import get_by_id, query, rpc
from drover.server.codec import to_proto
from drover.server.errors import ValidationError
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


class AllocsServicer(api_pb2_grpc.AllocsServicer):
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
