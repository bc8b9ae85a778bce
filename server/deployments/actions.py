"""The leader's writes about deployments and job versions: check, decide IDs and times, propose.

What the operator RPCs (server/api/deployments.py, and Jobs.Revert/Scale in
server/api/jobs.py) and the deployment watcher (server/deployments/watcher.py) write goes
through here, so an operator's ``deployment fail`` and the watcher's failure revert alike
(``decide.failure``). As in server/endpoints.py, each function validates completely
before proposing (bad input changes nothing), and the entry carries every ID and time the
FSM needs. Refusals are Nomad's words: an operator scripting against drover greps for them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Final

from google.protobuf.message import Message

from drover.scheduler import validate
from drover.scheduler.deployments import running_description
from drover.scheduler.structs import (
    DEFAULT_NAMESPACE,
    DEPLOYMENT_DESC_MARKED_FAILED,
    DEPLOYMENT_DESC_PAUSED,
    DEPLOYMENT_DESC_UNHEALTHY,
    DEPLOYMENT_STATUS_FAILED,
    DEPLOYMENT_STATUS_PAUSED,
    DEPLOYMENT_STATUS_RUNNING,
    TRIGGER_JOB_REGISTER,
    TRIGGER_JOB_SCALING,
    Deployment,
    DeploymentStatusUpdate,
    Evaluation,
    Job,
    job_eval,
)
from drover.server.codec import to_proto
from drover.server.deployments.decide import Failure, failure
from drover.server.deployments.state import (
    TERMINAL_NO_FAIL,
    TERMINAL_NO_PAUSE,
    TERMINAL_NO_PROMOTE,
    TERMINAL_NO_RESUME,
    TERMINAL_NO_SET_HEALTH,
)
from drover.server.endpoints import Writer, deployment_eval
from drover.server.errors import ConflictError, NotFoundError, ValidationError
from drover.server.state_store import Snapshot
from drover.v1 import raft_pb2

__all__ = ["DeploymentActions", "WriteOutcome"]

ET = raft_pb2.EntryType
SCALING_BLOCKED: Final = "job scaling blocked due to active deployment"


@dataclass(frozen=True, slots=True)
class WriteOutcome:
    """What a write committed: its raft index, the eval it created ("" for none), the
    stable version an auto-revert went back to, and for job writes the new job version."""

    index: int
    eval_id: str = ""
    reverted_version: int | None = None
    job_version: int = 0


class DeploymentActions(Writer):
    # -- plumbing ----------------------------------------------------------------------
    def _deployment(self, snap: Snapshot, deployment_id: str) -> Deployment:
        if not deployment_id:
            raise ValidationError("deployment_id: required")
        if len(deployment_id) > self._limits.max_name_length:
            raise ValidationError(f"deployment_id: must be at most {self._limits.max_name_length} characters")
        deployment = snap.deployment(deployment_id)
        if deployment is None:
            raise NotFoundError(f"deployment {deployment_id!r} not found")
        return deployment

    def _eval(self, snap: Snapshot, deployment: Deployment, now: int) -> Evaluation | None:
        """The deployment's eval, or none once its job is gone (nothing left to schedule)."""
        job = snap.job(deployment.namespace, deployment.job_id)
        if job is None:
            return None
        return deployment_eval(self._ids.new(), job, deployment, now)

    def _failure(self, snap: Snapshot, deployment: Deployment, description: str) -> Failure:
        job = snap.job(deployment.namespace, deployment.job_id)
        return failure(
            deployment, job, snap.job_versions(deployment.namespace, deployment.job_id), description
        )

    @staticmethod
    def _fill(entry: Message, ev: Evaluation | None, revert: Job | None, now: int) -> None:
        """The eval and the auto-revert job (stamped with this submit time) of ``entry``."""
        if ev is not None:
            to_proto(ev, entry.eval)  # type: ignore[attr-defined]
        if revert is not None:
            to_proto(replace(revert, submit_time_ns=now), entry.job)  # type: ignore[attr-defined]

    def _status_write(
        self,
        deployment: Deployment,
        status: str,
        description: str,
        ev: Evaluation | None,
        fail: Failure | None,
    ) -> WriteOutcome:
        now = self._clock.now_ns()
        entry = raft_pb2.DeploymentStatusUpdateEntry(updated_at_ns=now)
        to_proto(DeploymentStatusUpdate(deployment.id, status, description), entry.update)
        self._fill(entry, ev, fail.revert_job if fail else None, now)
        result = self._propose(ET.ENTRY_TYPE_DEPLOYMENT_STATUS_UPDATE, entry)
        return WriteOutcome(result.index, ev.id if ev else "", fail.reverted_version if fail else None)

    # -- deployments -------------------------------------------------------------------
    def fail(self, deployment_id: str, description: str = DEPLOYMENT_DESC_MARKED_FAILED) -> WriteOutcome:
        """Fail an active deployment, reverting to the latest stable version when any
        group has auto_revert (``description`` is the base: the watcher's reason, or an
        operator's "Deployment marked as failed")."""
        snap = self._store.snapshot()
        deployment = self._deployment(snap, deployment_id)
        if not deployment.active():
            raise ConflictError(TERMINAL_NO_FAIL)
        fail = self._failure(snap, deployment, description)
        ev = self._eval(snap, deployment, self._clock.now_ns())
        return self._status_write(deployment, DEPLOYMENT_STATUS_FAILED, fail.description, ev, fail)

    def pause(self, deployment_id: str, pause: bool) -> WriteOutcome:
        """Pause (no new placements) or resume; a resume adds an eval so rolling goes on."""
        snap = self._store.snapshot()
        deployment = self._deployment(snap, deployment_id)
        if not deployment.active():
            raise ConflictError(TERMINAL_NO_PAUSE if pause else TERMINAL_NO_RESUME)
        if pause:
            return self._status_write(
                deployment, DEPLOYMENT_STATUS_PAUSED, DEPLOYMENT_DESC_PAUSED, None, None
            )
        ev = self._eval(snap, deployment, self._clock.now_ns())
        return self._status_write(
            deployment, DEPLOYMENT_STATUS_RUNNING, running_description(deployment.task_groups), ev, None
        )

    def promote(self, deployment_id: str, groups: Sequence[str] = ()) -> WriteOutcome:
        """Promote the canaries of ``groups`` (all when empty). Whether they are healthy
        enough is the FSM's check, against the state the entry lands on."""
        snap = self._store.snapshot()
        deployment = self._deployment(snap, deployment_id)
        if len(groups) > self._limits.max_list_items:
            raise ValidationError(f"groups: at most {self._limits.max_list_items}")
        for i, name in enumerate(groups):
            if name not in deployment.task_groups:
                raise ValidationError(
                    f"groups[{i}]: deployment {deployment.id} has no task group {name[:64]!r}"
                )
        if not deployment.active():
            raise ConflictError(TERMINAL_NO_PROMOTE)
        now = self._clock.now_ns()
        ev = self._eval(snap, deployment, now)
        entry = raft_pb2.DeploymentPromoteEntry(deployment_id=deployment.id, groups=groups, updated_at_ns=now)
        self._fill(entry, ev, None, now)
        result = self._propose(ET.ENTRY_TYPE_DEPLOYMENT_PROMOTE, entry)
        return WriteOutcome(result.index, ev.id if ev else "")

    def set_alloc_health(
        self, deployment_id: str, healthy: Sequence[str], unhealthy: Sequence[str]
    ) -> WriteOutcome:
        """Health set by hand (any active deployment, whatever its health_check); one
        unhealthy alloc fails the deployment, reverting as the watcher would."""
        if not healthy and not unhealthy:
            raise ValidationError("healthy_alloc_ids: at least one alloc ID, healthy or unhealthy, required")
        snap = self._store.snapshot()
        deployment = self._deployment(snap, deployment_id)
        if not deployment.active():
            raise ConflictError(TERMINAL_NO_SET_HEALTH)
        self._check_allocs(snap, deployment, "healthy_alloc_ids", healthy, ())
        self._check_allocs(snap, deployment, "unhealthy_alloc_ids", unhealthy, healthy)
        now = self._clock.now_ns()
        entry = raft_pb2.DeploymentAllocHealthEntry(
            deployment_id=deployment.id,
            healthy_alloc_ids=healthy,
            unhealthy_alloc_ids=unhealthy,
            updated_at_ns=now,
        )
        fail: Failure | None = None
        if unhealthy:
            fail = self._failure(snap, deployment, DEPLOYMENT_DESC_UNHEALTHY)
            to_proto(
                DeploymentStatusUpdate(deployment.id, DEPLOYMENT_STATUS_FAILED, fail.description),
                entry.update,
            )
        ev = self._eval(snap, deployment, now)
        self._fill(entry, ev, fail.revert_job if fail else None, now)
        result = self._propose(ET.ENTRY_TYPE_DEPLOYMENT_ALLOC_HEALTH, entry)
        return WriteOutcome(result.index, ev.id if ev else "", fail.reverted_version if fail else None)

    def _check_allocs(
        self, snap: Snapshot, deployment: Deployment, field: str, ids: Sequence[str], other: Sequence[str]
    ) -> None:
        if len(ids) > self._limits.max_list_items:
            raise ValidationError(f"{field}: at most {self._limits.max_list_items} alloc IDs")
        for i, alloc_id in enumerate(ids):
            if not alloc_id:
                raise ValidationError(f"{field}[{i}]: required")
            alloc = snap.alloc(alloc_id)
            if alloc is None:
                raise NotFoundError(f"alloc {alloc_id[:64]!r} not found")
            if alloc.deployment_id != deployment.id:
                raise ValidationError(
                    f"{field}[{i}]: alloc {alloc_id!r} is not part of deployment {deployment.id}"
                )
            if alloc_id in other:
                raise ValidationError(f"{field}[{i}]: alloc {alloc_id!r} is also listed as healthy")

    # -- job versions ------------------------------------------------------------------
    def revert_job(
        self,
        namespace: str,
        job_id: str,
        version: int,
        *,
        enforce_prior: bool = False,
        prior_version: int = 0,
    ) -> WriteOutcome:
        """Register an older version's spec as a new version (Nomad's Job.Revert): the copy
        is not stable, its deployment has to prove it again."""
        snap, current = self._job(namespace, job_id)
        if version == current.version:
            raise ConflictError("can't revert to current version")
        old = snap.job_version(current.namespace, job_id, version)
        if old is None:
            raise NotFoundError(
                f"job {job_id!r} in namespace {current.namespace!r} at version {version} not found"
            )
        if enforce_prior and current.version != prior_version:
            raise ConflictError(
                f"current job has version {current.version}; enforcing version {prior_version}"
            )
        return self._register_version(replace(old, stable=False), TRIGGER_JOB_REGISTER)

    def scale_job(
        self, namespace: str, job_id: str, group: str, count: int, message: str = ""
    ) -> WriteOutcome:
        """Change one group's count as a new version with a ``job-scaling`` eval (Nomad's
        Job.Scale); refused while the job's latest deployment is active."""
        if len(message) > self._limits.max_string_length:
            raise ValidationError(f"message: must be at most {self._limits.max_string_length} characters")
        snap, job = self._job(namespace, job_id)
        if not group:
            if len(job.groups) != 1:
                raise ValidationError(f"group: required, job {job_id!r} has {len(job.groups)} groups")
            group = job.groups[0].name
        if job.lookup_group(group) is None:
            raise ValidationError(
                f"group: task group {group[:64]!r} specified for scaling does not exist in job"
            )
        latest = snap.latest_deployment(job.namespace, job.id)
        if latest is not None and latest.active() and latest.job_create_index == job.create_index:
            raise ConflictError(SCALING_BLOCKED)
        scaled = replace(
            job, groups=tuple(replace(g, count=count) if g.name == group else g for g in job.groups)
        )
        return self._register_version(scaled, TRIGGER_JOB_SCALING)

    def _job(self, namespace: str, job_id: str) -> tuple[Snapshot, Job]:
        if not job_id:
            raise ValidationError("job_id: required")
        snap = self._store.snapshot()
        job = snap.job(namespace or DEFAULT_NAMESPACE, job_id)
        if job is None:
            raise NotFoundError(f"job {job_id[:64]!r} not found")
        return snap, job

    def _register_version(self, job: Job, trigger: str) -> WriteOutcome:
        """Register ``job`` (a stored spec, changed) as a job register does: checked in its
        canonical form first, with an eval unless it is a template (periodic,
        parameterized), in one entry."""
        job = validate.canonicalize_job(job)
        validate.validate_job(job, self._limits)
        now = self._clock.now_ns()
        entry = raft_pb2.JobRegisterEntry()
        to_proto(replace(job, submit_time_ns=now), entry.job)
        eval_id = ""
        if not job.is_template():
            ev = job_eval(self._ids.new(), job, trigger, now)
            to_proto(ev, entry.eval)
            eval_id = ev.id
        result = self._propose(ET.ENTRY_TYPE_JOB_REGISTER, entry)
        value = result.value if isinstance(result.value, dict) else {}
        return WriteOutcome(result.index, eval_id, job_version=int(value.get("version", 0)))
