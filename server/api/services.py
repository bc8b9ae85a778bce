"""Services service: the registrations of ``service { provider = "nomad" }`` blocks.

Reads only: the FSM writes a registration with the alloc it belongs to
(server/services/registrations.py). ``ClientInfo`` is the client agent's read for its
templates' ``nomadService`` lookups: authenticated by the node's secret like the client's
other calls, and held to the namespace of an alloc on that node, so one node can read only
what its own allocs could. It answers only the instances whose checks all pass (an instance
with no checks passes), as Consul's health filter does for its templates: a template lists
where to send traffic, and a failing instance should get none. ``Info`` answers every
instance with its health, for the operator.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

import grpc

from drover.scheduler.structs import DEFAULT_NAMESPACE
from drover.server.api._base import query, rpc
from drover.server.codec import to_proto
from drover.server.errors import NotFoundError, PermissionDeniedError, ValidationError
from drover.server.services.registrations import is_passing
from drover.v1 import api_pb2, api_pb2_grpc

if TYPE_CHECKING:
    from drover.server.core import ServerCore

__all__ = ["ServicesServicer"]

S: Final = "Services"
_ALL_NAMESPACES: Final = "*"
_TABLES: Final = ("services",)


class ServicesServicer(api_pb2_grpc.ServicesServicer):
    def __init__(self, core: ServerCore) -> None:
        self.core = core

    @rpc(S, "read")
    def List(
        self, request: api_pb2.ServiceListRequest, context: grpc.ServicerContext
    ) -> api_pb2.ServiceListResponse:
        snap, meta = query(self.core, request.options, _TABLES)
        wanted = request.namespace or DEFAULT_NAMESPACE
        response = api_pb2.ServiceListResponse(meta=meta)
        for namespace, name in snap.service_names():
            if wanted != _ALL_NAMESPACES and namespace != wanted:
                continue
            registrations = snap.service_registrations(namespace, name)
            tags = sorted({tag for reg in registrations for tag in reg.tags})
            response.services.add(
                namespace=namespace,
                service_name=name,
                tags=tags,
                registrations=len(registrations),
                passing=sum(is_passing(reg) for reg in registrations),
            )
        return response

    @rpc(S, "read")
    def Info(
        self, request: api_pb2.ServiceInfoRequest, context: grpc.ServicerContext
    ) -> api_pb2.ServiceInfoResponse:
        if not request.service_name:
            raise ValidationError("service_name: required")
        snap, meta = query(self.core, request.options, _TABLES)
        namespace = request.namespace or DEFAULT_NAMESPACE
        registrations = snap.service_registrations(namespace, request.service_name)
        if not registrations and request.options.min_index == 0:
            raise NotFoundError(f"service {request.service_name[:64]!r} not found in namespace {namespace!r}")
        response = api_pb2.ServiceInfoResponse(meta=meta)
        for registration in registrations:
            to_proto(registration, response.registrations.add())
        return response

    @rpc(S, "read")
    def ClientInfo(
        self, request: api_pb2.ServiceClientInfoRequest, context: grpc.ServicerContext
    ) -> api_pb2.ServiceInfoResponse:
        if not request.node_id:
            raise ValidationError("node_id: required")
        if not request.alloc_id:
            raise ValidationError("alloc_id: required")
        self.core.endpoints.authenticate_node(self.core.store.snapshot(), request.node_id, request.secret_id)
        snap, meta = query(self.core, request.options, _TABLES)
        alloc = snap.alloc(request.alloc_id)
        if alloc is None or alloc.node_id != request.node_id:
            raise PermissionDeniedError(
                f"Permission denied: alloc {request.alloc_id[:64]!r} is not on this node"
            )
        response = api_pb2.ServiceInfoResponse(meta=meta)
        for name in sorted(set(request.service_names)):
            for registration in snap.service_registrations(alloc.namespace, name):
                if is_passing(registration):
                    to_proto(registration, response.registrations.add())
        return response
