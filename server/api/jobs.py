"""Jobs service: register, deregister, dispatch, periodic force, and reads of jobs, versions
and summaries."""

from __future__ import annotations

from typing import TYPE_CHECKING

import grpc

from drover.scheduler import validate
from drover.scheduler.structs import DEFAULT_NAMESPACE, Job
from drover.server.api._base import meta_for, query, rpc, write_meta
from drover.server.api.deployments import actions_for
from drover.server.codec import from_proto, to_proto
from drover.server.core import job_limits
from drover.server.errors import NotFoundError, ValidationError
from drover.v1 import api_pb2, api_pb2_grpc, structs_pb2

if TYPE_CHECKING:
    from drover.server.core import ServerCore

S = "Jobs"


def _ns(namespace: str) -> str:
    return namespace or DEFAULT_NAMESPACE


class JobsServicer(api_pb2_grpc.JobsServicer):
    def __init__(self, core: ServerCore) -> None:
        self.core = core

    @rpc(S, "write")
    def Register(
        self, request: api_pb2.JobRegisterRequest, context: grpc.ServicerContext
    ) -> api_pb2.JobRegisterResponse:
        if not request.HasField("job"):
            raise ValidationError("job: required")
        result, eval_id = self.core.endpoints.register_job(
            from_proto(request.job, Job),
            enforce_index=request.enforce_index,
            job_modify_index=request.job_modify_index,
        )
        value = result.value or {}
        return api_pb2.JobRegisterResponse(
            meta=write_meta(result.index),
            eval_id=eval_id,
            job_modify_index=value.get("job_modify_index", 0),
            version=value.get("version", 0),
        )

    @rpc(S, "write")
    def Deregister(
        self, request: api_pb2.JobDeregisterRequest, context: grpc.ServicerContext
    ) -> api_pb2.JobDeregisterResponse:
        result, eval_id = self.core.endpoints.deregister_job(
            _ns(request.namespace), request.job_id, request.purge
        )
        return api_pb2.JobDeregisterResponse(meta=write_meta(result.index), eval_id=eval_id)

    @rpc(S, "write")
    def Dispatch(
        self, request: api_pb2.JobDispatchRequest, context: grpc.ServicerContext
    ) -> api_pb2.JobDispatchResponse:
        result, child_id, eval_id = self.core.endpoints.dispatch_job(
            _ns(request.namespace),
            request.job_id,
            dict(request.meta),
            request.payload,
            request.idempotency_token,
        )
        return api_pb2.JobDispatchResponse(
            meta=write_meta(result.index), dispatched_job_id=child_id, eval_id=eval_id
        )

    @rpc(S, "write")
    def PeriodicForce(
        self, request: api_pb2.JobPeriodicForceRequest, context: grpc.ServicerContext
    ) -> api_pb2.JobPeriodicForceResponse:
        result, child_id, eval_id = self.core.endpoints.force_periodic(_ns(request.namespace), request.job_id)
        return api_pb2.JobPeriodicForceResponse(
            meta=write_meta(result.index), child_job_id=child_id, eval_id=eval_id
        )

    @rpc(S, "read")
    def Get(self, request: api_pb2.JobGetRequest, context: grpc.ServicerContext) -> api_pb2.JobGetResponse:
        snap, meta = query(self.core, request.options, ("jobs", "job_summaries"))
        job = snap.job(_ns(request.namespace), request.job_id)
        if job is None:
            raise NotFoundError(f"job {request.job_id!r} not found")
        response = api_pb2.JobGetResponse(meta=meta)
        to_proto(job, response.job)
        summary = snap.job_summary(job.namespace, job.id)
        if summary is not None:
            to_proto(summary, response.summary)
        return response

    @rpc(S, "read")
    def List(self, request: api_pb2.JobListRequest, context: grpc.ServicerContext) -> api_pb2.JobListResponse:
        snap, meta = query(self.core, request.options, ("jobs", "job_summaries"))
        response = api_pb2.JobListResponse(meta=meta)
        for job in sorted(snap.jobs(), key=lambda j: (j.namespace, j.id)):
            if request.namespace and job.namespace != request.namespace:
                continue
            if request.prefix and not job.id.startswith(request.prefix):
                continue
            to_proto(job, response.jobs.add())
            summary = snap.job_summary(job.namespace, job.id)
            if summary is not None:
                to_proto(summary, response.summaries.add())
            else:
                response.summaries.add(job_id=job.id, namespace=job.namespace)
        return response

    @rpc(S, "read")
    def Versions(
        self, request: api_pb2.JobVersionsRequest, context: grpc.ServicerContext
    ) -> api_pb2.JobVersionsResponse:
        snap, meta = query(self.core, request.options, ("job_versions",))
        versions = snap.job_versions(_ns(request.namespace), request.job_id)
        if not versions:
            raise NotFoundError(f"job {request.job_id!r} not found")
        response = api_pb2.JobVersionsResponse(meta=meta)
        for job in versions:
            to_proto(job, response.versions.add())
        return response

    @rpc(S, "read")
    def Plan(self, request: api_pb2.JobPlanRequest, context: grpc.ServicerContext) -> api_pb2.JobPlanResponse:
        if not request.HasField("job"):
            raise ValidationError("job: required")
        preview = self.core.endpoints.plan_job(from_proto(request.job, Job))
        response = api_pb2.JobPlanResponse(
            meta=meta_for(self.core, self.core.store.index),
            current_version=preview.current_version,
            job_changed=preview.changed,
            new_job=preview.new_job,
            queued=preview.queued,
        )
        for group, buckets in preview.groups.items():
            response.groups[group].buckets.update(buckets)
        for group, metric in preview.failed_tg_metrics.items():
            to_proto(metric, response.failed_tg_metrics[group])
        return response

    @rpc(S, "read")
    def Summary(
        self, request: api_pb2.JobSummaryRequest, context: grpc.ServicerContext
    ) -> api_pb2.JobSummaryResponse:
        snap, meta = query(self.core, request.options, ("job_summaries",))
        summary = snap.job_summary(_ns(request.namespace), request.job_id)
        if summary is None:
            raise NotFoundError(f"job {request.job_id!r} not found")
        return api_pb2.JobSummaryResponse(meta=meta, summary=to_proto(summary, structs_pb2.JobSummary()))

    @rpc(S, "write")
    def Revert(
        self, request: api_pb2.JobRevertRequest, context: grpc.ServicerContext
    ) -> api_pb2.JobRevertResponse:
        outcome = actions_for(self.core).revert_job(
            _ns(request.namespace),
            request.job_id,
            request.job_version,
            enforce_prior=request.enforce_prior_version,
            prior_version=request.prior_version,
        )
        return api_pb2.JobRevertResponse(
            meta=write_meta(outcome.index), eval_id=outcome.eval_id, job_version=outcome.job_version
        )

    @rpc(S, "write")
    def Scale(
        self, request: api_pb2.JobScaleRequest, context: grpc.ServicerContext
    ) -> api_pb2.JobScaleResponse:
        outcome = actions_for(self.core).scale_job(
            _ns(request.namespace), request.job_id, request.group, request.count, request.message
        )
        return api_pb2.JobScaleResponse(
            meta=write_meta(outcome.index), eval_id=outcome.eval_id, job_version=outcome.job_version
        )

    @rpc(S, "local")
    def Validate(
        self, request: api_pb2.JobValidateRequest, context: grpc.ServicerContext
    ) -> api_pb2.JobValidateResponse:
        """Every problem at once, as the register path would find them (nothing is written)."""
        if not request.HasField("job"):
            raise ValidationError("job: required")
        try:
            validate.validate_job(
                validate.canonicalize_job(from_proto(request.job, Job)), job_limits(self.core.cfg)
            )
        except validate.ValidationError as exc:
            return api_pb2.JobValidateResponse(errors=[str(e) for e in exc.errors])
        return api_pb2.JobValidateResponse()
