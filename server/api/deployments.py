"""Deployments service: list, get and the allocs of deployments; promote, pause, resume,
fail and manual alloc health (server/deployments/actions.py does the writing).

The write requests name a deployment, not a namespace, so the rights table can only ask
for the capability in some namespace; the deployment's own namespace is checked here, once
it is found (``_authorize_target``), before anything is written.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import grpc

from drover.scheduler.structs import DEFAULT_NAMESPACE
from drover.server.acl import rights
from drover.server.acl.resolve import caller
from drover.server.api._base import get_by_id, query, rpc, write_meta
from drover.server.codec import to_proto
from drover.server.core import job_limits
from drover.server.deployments.actions import DeploymentActions, WriteOutcome
from drover.server.errors import NotFoundError, PermissionDeniedError, ValidationError
from drover.server.state_store import Snapshot
from drover.v1 import api_pb2, api_pb2_grpc

if TYPE_CHECKING:
    from drover.server.core import ServerCore

__all__ = ["DeploymentsServicer", "actions_for"]

S = "Deployments"
_ALL_NAMESPACES = ("", "*")


def actions_for(core: ServerCore) -> DeploymentActions:
    """The deployment and job-version writes of ``core`` (a light object: made per call)."""
    return DeploymentActions(core.raft, core.store, core.clock, core.ids, job_limits(core.cfg))


def _authorize_target(core: ServerCore, service: str, method: str, deployment_id: str) -> None:
    """Refuse a write to a deployment of a namespace the caller's token may not write."""
    identity = caller()
    deployment = core.store.snapshot().deployment(deployment_id) if deployment_id else None
    if identity is None or deployment is None or identity.acl.management:
        return  # ACLs off, or nothing to write to (the write itself says NOT_FOUND)
    need = rights.need_for(service, method)
    if not identity.acl.allows_namespace(deployment.namespace, need.any_of):
        raise PermissionDeniedError(
            f"Permission denied: {service}.{method} needs {' or '.join(need.any_of)}"
            f" on namespace {deployment.namespace!r}"
        )


def _write_response(outcome: WriteOutcome) -> api_pb2.DeploymentWriteResponse:
    return api_pb2.DeploymentWriteResponse(
        meta=write_meta(outcome.index),
        eval_id=outcome.eval_id,
        reverted=outcome.reverted_version is not None,
        reverted_job_version=outcome.reverted_version or 0,
    )


class DeploymentsServicer(api_pb2_grpc.DeploymentsServicer):
    def __init__(self, core: ServerCore) -> None:
        self.core = core

    @rpc(S, "read")
    def List(
        self, request: api_pb2.DeploymentListRequest, context: grpc.ServicerContext
    ) -> api_pb2.DeploymentListResponse:
        snap, meta = query(self.core, request.options, ("deployments",))
        if request.job_id:
            found = snap.deployments_by_job(request.namespace or DEFAULT_NAMESPACE, request.job_id)
        else:
            found = sorted(
                (
                    d
                    for d in snap.deployments()
                    if request.namespace in _ALL_NAMESPACES or d.namespace == request.namespace
                ),
                key=lambda d: (-d.create_index, d.id),
            )
        response = api_pb2.DeploymentListResponse(meta=meta)
        for deployment in found:
            to_proto(deployment, response.deployments.add())
        return response

    @rpc(S, "read")
    def Get(
        self, request: api_pb2.DeploymentGetRequest, context: grpc.ServicerContext
    ) -> api_pb2.DeploymentGetResponse:
        deployment, meta = get_by_id(
            self.core,
            request.options,
            "deployments",
            "deployment",
            request.deployment_id,
            Snapshot.deployment,
        )
        response = api_pb2.DeploymentGetResponse(meta=meta)
        to_proto(deployment, response.deployment)
        return response

    @rpc(S, "read")
    def Allocations(
        self, request: api_pb2.DeploymentGetRequest, context: grpc.ServicerContext
    ) -> api_pb2.AllocListResponse:
        if not request.deployment_id:
            raise ValidationError("deployment_id: required")
        snap, meta = query(self.core, request.options, ("deployments", "allocs"))
        deployment = snap.deployment(request.deployment_id)
        if deployment is None:
            raise NotFoundError(f"deployment {request.deployment_id!r} not found")
        response = api_pb2.AllocListResponse(meta=meta)
        allocs = snap.allocs_by_job(deployment.namespace, deployment.job_id)
        for alloc in sorted(
            (a for a in allocs if a.deployment_id == deployment.id), key=lambda a: (a.name, a.id)
        ):
            to_proto(alloc, response.allocs.add())
        return response

    @rpc(S, "write")
    def Promote(
        self, request: api_pb2.DeploymentPromoteRequest, context: grpc.ServicerContext
    ) -> api_pb2.DeploymentWriteResponse:
        _authorize_target(self.core, S, "Promote", request.deployment_id)
        return _write_response(actions_for(self.core).promote(request.deployment_id, list(request.groups)))

    @rpc(S, "write")
    def Pause(
        self, request: api_pb2.DeploymentPauseRequest, context: grpc.ServicerContext
    ) -> api_pb2.DeploymentWriteResponse:
        _authorize_target(self.core, S, "Pause", request.deployment_id)
        return _write_response(actions_for(self.core).pause(request.deployment_id, request.pause))

    @rpc(S, "write")
    def Fail(
        self, request: api_pb2.DeploymentFailRequest, context: grpc.ServicerContext
    ) -> api_pb2.DeploymentWriteResponse:
        _authorize_target(self.core, S, "Fail", request.deployment_id)
        return _write_response(actions_for(self.core).fail(request.deployment_id))

    @rpc(S, "write")
    def SetAllocHealth(
        self, request: api_pb2.DeploymentAllocHealthRequest, context: grpc.ServicerContext
    ) -> api_pb2.DeploymentWriteResponse:
        _authorize_target(self.core, S, "SetAllocHealth", request.deployment_id)
        outcome = actions_for(self.core).set_alloc_health(
            request.deployment_id, list(request.healthy_alloc_ids), list(request.unhealthy_alloc_ids)
        )
        return _write_response(outcome)
