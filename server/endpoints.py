"""The leader's write operations: check the request, decide IDs and times, propose one entry.

Each function validates completely before proposing, so bad input changes nothing; the
entry carries everything the FSM needs (docs/design.md, "FSM determinism"). The servicers in
server/api/ only convert messages and call one function here.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Final, Protocol

from google.protobuf.message import Message

from drover.common.secrets import hash_secret, secret_matches
from drover.scheduler import validate
from drover.scheduler.periodic import derive_dispatched_child, dispatched_child_id
from drover.scheduler.reconciler import next_reschedule
from drover.scheduler.structs import (
    ALLOC_CLIENT_FAILED,
    ALLOC_CLIENT_RUNNING,
    ALLOC_DESIRED_RUN,
    CHECK_STATUSES,
    HEALTH_HEALTHY,
    HEALTH_UNHEALTHY,
    JOB_TYPE_SYSBATCH,
    JOB_TYPE_SYSTEM,
    NODE_STATUS_DISCONNECTED,
    NODE_STATUS_DOWN,
    NODE_STATUS_INIT,
    NODE_STATUS_READY,
    TRIGGER_DEPLOYMENT_WATCHER,
    TRIGGER_JOB_DEREGISTER,
    TRIGGER_JOB_REGISTER,
    TRIGGER_NODE_DRAIN,
    TRIGGER_NODE_UPDATE,
    TRIGGER_RETRY_FAILED_ALLOC,
    Allocation,
    AllocMetric,
    Deployment,
    DrainStrategy,
    Evaluation,
    Job,
    Node,
    TaskState,
    all_checks_passing,
    job_eval,
)
from drover.server.clock import Clock, IdSource
from drover.server.codec import from_proto, to_proto
from drover.server.drainer import drain_complete
from drover.server.errors import ConflictError, NotFoundError, PermissionDeniedError, ValidationError
from drover.server.fsm import ApplyResult, apply_job_register, encode_entry
from drover.server.heartbeat import HeartbeatTimers
from drover.server.periodic import force_launch_ns, launch_entry
from drover.server.snapshot import from_snapshot
from drover.server.state_store import Snapshot, StateStore, Txn
from drover.v1 import raft_pb2, structs_pb2

ET = raft_pb2.EntryType
# Looked up once: an EntryType attribute goes through the enum wrapper's __getattr__.
_JOB_REGISTER: Final = ET.ENTRY_TYPE_JOB_REGISTER

# A job larger than this is almost certainly a mistake (Nomad caps job payloads too).
MAX_JOB_BYTES: Final = 1 << 20
HEARTBEAT_TTL_NS: Final = 10_000_000_000
DEFAULT_WRITE_TIMEOUT: Final = 10.0
MAX_IDEMPOTENCY_TOKEN: Final = 256


@dataclass(frozen=True, slots=True)
class PlanPreview:
    groups: dict[str, dict[str, int]]
    queued: dict[str, int]
    current_version: int
    changed: bool
    new_job: bool = False
    # group -> why it would not place all its allocs (the eval's failed_tg_metrics)
    failed_tg_metrics: Mapping[str, AllocMetric] = field(default_factory=dict)


class Proposer(Protocol):
    def propose(self, data: bytes, timeout: float) -> ApplyResult: ...


def propose_write(raft: Proposer, entry_type: int, payload: Message) -> ApplyResult:
    """One raft write for every writer (job endpoints, deployment actions), so a rejected
    entry maps to the same error everywhere: NotFoundError when the FSM found nothing to
    change, ConflictError for any other refusal."""
    result = raft.propose(encode_entry(entry_type, payload), DEFAULT_WRITE_TIMEOUT)
    if result.error:
        raise (NotFoundError if result.not_found else ConflictError)(result.error)
    return result


class Writer:
    """What every leader-side writer (job and node endpoints, deployment actions, ACL
    endpoints) works with: raft to propose to, the store to read, the clock and ID source
    that stamp an entry before it is proposed, and the limits its input is checked against."""

    def __init__(
        self,
        raft: Proposer,
        store: StateStore,
        clock: Clock,
        ids: IdSource,
        limits: validate.Limits = validate.DEFAULT_LIMITS,
    ) -> None:
        self._raft = raft
        self._store = store
        self._clock = clock
        self._ids = ids
        self._limits = limits

    def _propose(self, entry_type: int, payload: Message) -> ApplyResult:
        return propose_write(self._raft, entry_type, payload)


def deployment_eval(eval_id: str, job: Job, deployment: Deployment, now_ns: int) -> Evaluation:
    """A ``deployment-watcher`` eval of ``job`` for ``deployment``, at the deployment's
    priority (Nomad's EvalPriority): what every writer that moves a deployment (a client's
    health report, the watcher, an operator) adds so the scheduler acts on the change."""
    ev = job_eval(eval_id, job, TRIGGER_DEPLOYMENT_WATCHER, now_ns)
    return replace(ev, deployment_id=deployment.id, priority=deployment.eval_priority or job.priority)


class Endpoints(Writer):
    def __init__(
        self,
        raft: Proposer,
        store: StateStore,
        clock: Clock,
        ids: IdSource,
        heartbeats: HeartbeatTimers | None = None,
        limits: validate.Limits = validate.DEFAULT_LIMITS,
    ) -> None:
        super().__init__(raft, store, clock, ids, limits)
        self._heartbeats = heartbeats

    def _new_eval(self, job: Job, trigger: str, now: int, node_id: str = "") -> Evaluation:
        return job_eval(self._ids.new(), job, trigger, now, node_id)

    # -- jobs --------------------------------------------------------------------------
    def register_job(
        self, job: Job, *, enforce_index: bool = False, job_modify_index: int = 0
    ) -> tuple[ApplyResult, str]:
        job = validate.canonicalize_job(job)
        validate.validate_job(job, self._limits)
        snap = self._store.snapshot()
        existing = snap.job(job.namespace, job.id)
        if enforce_index:
            current = existing.job_modify_index if existing is not None else 0
            if current != job_modify_index:
                raise ConflictError(
                    f"enforcing job modify index {job_modify_index}: job exists with index {current}"
                )
        if existing is not None and existing.type != job.type:
            raise ValidationError(f"job.type: can not change the type of job {job.id!r} from {existing.type}")
        if job.dispatched:
            raise ValidationError(
                "job.dispatched: set by `job dispatch` on the child it creates, not by register"
            )
        if existing is not None and (existing.periodic is None) != (job.periodic is None):
            was, now_is = ("periodic", "non-periodic") if existing.periodic else ("non-periodic", "periodic")
            raise ValidationError(
                f"job.periodic: can not change job {job.id!r} from {was} to {now_is}; stop and purge it first"
            )
        now = self._clock.now_ns()
        entry = raft_pb2.JobRegisterEntry()
        job_msg = to_proto(job, entry.job)
        # What ``to_proto(replace(job, submit_time_ns=now), ...)`` writes, without the copy
        # (a zero clears the field, as an unset one would leave it).
        job_msg.submit_time_ns = now
        size = job_msg.ByteSize()
        if size > MAX_JOB_BYTES:
            raise ValidationError(f"job: encoded size {size} exceeds {MAX_JOB_BYTES} bytes")
        eval_id = ""
        # Periodic and parameterized parents are templates: their children get evals.
        if not job.is_template():
            ev = self._new_eval(job, TRIGGER_JOB_REGISTER, now)
            to_proto(ev, entry.eval)
            eval_id = ev.id
        return self._propose(_JOB_REGISTER, entry), eval_id

    def dispatch_job(
        self,
        namespace: str,
        job_id: str,
        meta: dict[str, str],
        payload: bytes,
        idempotency_token: str = "",
    ) -> tuple[ApplyResult, str, str]:
        """Run a parameterized job: a fresh child ``<parent>/dispatch-<unix>-<8 hex>`` with
        its eval, in one entry. Returns the write, the child's ID and the eval's ID.

        With ``idempotency_token``, a child already dispatched with it is returned instead
        (its first eval; the index is the state's, nothing is written), so a retried
        dispatch whose first answer was lost never runs the work twice."""
        if not job_id:
            raise ValidationError("job_id: required")
        if len(idempotency_token) > MAX_IDEMPOTENCY_TOKEN:
            raise ValidationError(f"idempotency_token: longer than {MAX_IDEMPOTENCY_TOKEN} characters")
        snap = self._store.snapshot()
        parent = snap.job(namespace, job_id)
        if parent is None:
            raise NotFoundError(f"job {job_id!r} not found")
        validate.validate_dispatch(parent, meta, payload)
        if parent.stop:
            raise ConflictError(f"job {job_id!r} is stopped; register it again before dispatching")
        twin = snap.dispatched_child(namespace, job_id, idempotency_token)
        if twin is not None:
            return ApplyResult(index=snap.index), twin.id, self._first_eval_id(snap, twin)
        now = self._clock.now_ns()
        suffix = self._ids.new().replace("-", "")[:8]
        child = derive_dispatched_child(
            parent, dispatched_child_id(parent.id, now, suffix), now, meta, payload, idempotency_token
        )
        entry = raft_pb2.JobRegisterEntry()
        to_proto(child, entry.job)
        ev = self._new_eval(child, TRIGGER_JOB_REGISTER, now)
        to_proto(ev, entry.eval)
        result = self._propose(ET.ENTRY_TYPE_JOB_REGISTER, entry)
        existing = result.value.get("existing_job_id") if isinstance(result.value, dict) else None
        if existing:
            after = self._store.snapshot()
            twin = after.job(namespace, existing)
            return result, existing, self._first_eval_id(after, twin) if twin else ""
        return result, child.id, ev.id

    @staticmethod
    def _first_eval_id(snap: Snapshot, job: Job) -> str:
        evals = sorted(snap.evals_by_job(job.namespace, job.id), key=lambda e: e.create_index)
        return evals[0].id if evals else ""

    def force_periodic(self, namespace: str, job_id: str) -> tuple[ApplyResult, str, str]:
        """Launch a periodic job's child now, outside its schedule (``prohibit_overlap`` is
        not consulted, as in Nomad). Returns the write, the child's ID and the eval's ID."""
        if not job_id:
            raise ValidationError("job_id: required")
        snap = self._store.snapshot()
        parent = snap.job(namespace, job_id)
        if parent is None:
            raise NotFoundError(f"job {job_id!r} not found")
        if parent.stop:
            raise ConflictError(f"job {job_id!r} is stopped; register it again before forcing a launch")
        if not parent.is_periodic_active():
            raise ValidationError(
                f"job_id: job {job_id!r} is not an enabled periodic job; it can not be forced"
            )
        now = self._clock.now_ns()
        eval_id = self._ids.new()
        entry = launch_entry(parent, force_launch_ns(snap, parent, now), now, eval_id)
        return self._propose(ET.ENTRY_TYPE_JOB_REGISTER, entry), entry.job.id, eval_id

    def reconcile_summaries(self) -> ApplyResult:
        """Recompute every job summary in the FSM; ``value`` lists the corrections."""
        return self._propose(ET.ENTRY_TYPE_RECONCILE_SUMMARIES, raft_pb2.ReconcileSummariesEntry())

    def plan_job(self, job: Job) -> PlanPreview:
        """Dry run of a registration: the scheduler's buckets on a private copy of the state."""
        job = validate.canonicalize_job(job)
        validate.validate_job(job, self._limits)
        snap = self._store.snapshot()
        existing = snap.job(job.namespace, job.id)
        now = self._clock.now_ns()
        entry = raft_pb2.JobRegisterEntry()
        to_proto(replace(job, submit_time_ns=now), entry.job)
        index = snap.index + 1
        txn = Txn(snap.tables, index)
        apply_job_register(txn, entry, index)
        view = Snapshot(txn.commit())
        planned = view.job(job.namespace, job.id)
        assert planned is not None
        changed = existing is None or planned.version != existing.version
        if job.is_template():
            return PlanPreview(
                groups={}, queued={}, current_version=existing.version if existing else 0, changed=changed
            )
        from drover.scheduler.interfaces import SchedulerContext, seed_from
        from drover.server.worker import scheduler_for

        ev = replace(self._new_eval(planned, TRIGGER_JOB_REGISTER, now), annotate_plan=True)
        seed = seed_from(ev.id, view.index)
        ctx = SchedulerContext(now_ns=now, new_id=self._ids.new, seed=seed, rng=random.Random(seed))
        result = scheduler_for(job.type)(ev, view, ctx)
        return PlanPreview(
            groups={g: dict(b) for g, b in result.annotations.items()},
            queued=dict(result.queued),
            current_version=existing.version if existing else 0,
            changed=changed,
            new_job=existing is None,
            failed_tg_metrics=dict(result.eval_update.failed_tg_metrics),
        )

    def deregister_job(self, namespace: str, job_id: str, purge: bool) -> tuple[ApplyResult, str]:
        if not job_id:
            raise ValidationError("job_id: required")
        job = self._store.snapshot().job(namespace, job_id)
        if job is None:
            raise NotFoundError(f"job {job_id!r} not found")
        now = self._clock.now_ns()
        entry = raft_pb2.JobDeregisterEntry(
            namespace=namespace, job_id=job_id, purge=purge, submit_time_ns=now
        )
        eval_id = ""
        if not job.is_template():
            ev = self._new_eval(job, TRIGGER_JOB_DEREGISTER, now)
            to_proto(ev, entry.eval)
            eval_id = ev.id
        return self._propose(ET.ENTRY_TYPE_JOB_DEREGISTER, entry), eval_id

    # -- nodes -------------------------------------------------------------------------
    def node_evals(self, snap: Snapshot, node_id: str, now: int) -> list[Evaluation]:
        """Evals for every job with allocs on the node and every system job (Nomad's createNodeEvals)."""
        seen: set[tuple[str, str]] = set()
        evals: list[Evaluation] = []
        candidates: list[Job] = []
        for alloc in snap.allocs_by_node(node_id):
            job = snap.job(alloc.namespace, alloc.job_id)
            if job is not None:
                candidates.append(job)
        for job_type in (JOB_TYPE_SYSTEM, JOB_TYPE_SYSBATCH):
            candidates.extend(snap.jobs_by_type(job_type))
        for job in candidates:
            key = (job.namespace, job.id)
            if key in seen or job.stop or job.is_template():
                continue
            seen.add(key)
            evals.append(self._new_eval(job, TRIGGER_NODE_UPDATE, now, node_id=node_id))
        return evals

    def register_node(self, node: Node) -> tuple[ApplyResult, list[str], int]:
        """Trust on first use (Nomad's): a new node ID registers with the secret it brings,
        and from then on every call for that node needs the same secret. Only the secret's
        hash enters the log."""
        if not node.status:
            node = replace(node, status=NODE_STATUS_READY)
        validate.validate_node(node, self._limits)
        if not node.secret_id:
            raise PermissionDeniedError(
                "Permission denied: node.secret_id: a node registers with a secret of its own"
            )
        now = self._clock.now_ns()
        snap = self._store.snapshot()
        existing = snap.node(node.id)
        if (
            existing is not None
            and existing.secret_hash
            and not secret_matches(node.secret_id, existing.secret_hash)
        ):
            raise PermissionDeniedError(
                f"Permission denied: node {node.id!r} is registered with a different secret"
            )
        node = replace(node, secret_id="", secret_hash=hash_secret(node.secret_id))
        if existing is not None:
            node = replace(
                node,
                status=self._next_status(snap, existing, node.status),
                last_missed_heartbeat_index=existing.last_missed_heartbeat_index,
                last_alloc_update_index=existing.last_alloc_update_index,
            )
        entry = raft_pb2.NodeRegisterEntry()
        to_proto(replace(node, status_updated_at_ns=now), entry.node)
        evals: list[Evaluation] = []
        if node.status == NODE_STATUS_READY and (existing is None or existing.status != NODE_STATUS_READY):
            evals = self.node_evals(snap, node.id, now)
        for ev in evals:
            to_proto(ev, entry.evals.add())
        self._heard_from(node.id)
        result = self._propose(ET.ENTRY_TYPE_NODE_REGISTER, entry)
        # Armed from the commit, when the client hears its TTL (not from ``now``, before the
        # write, which under load came seconds earlier).
        return result, [e.id for e in evals], self._arm_heartbeat(node.id, node.status, self._clock.now_ns())

    def authenticate_node(self, snap: Snapshot, node_id: str, secret_id: str) -> Node:
        """The node ``secret_id`` proves to be; PermissionDeniedError for anything else
        (no ID, no secret, an unknown node, another node's secret), said the same way for
        an unknown node as for a wrong secret, so the answer reveals no node IDs."""
        if not node_id or not secret_id:
            raise PermissionDeniedError("Permission denied: node_id and the node's secret_id are required")
        node = snap.node(node_id)
        if node is None or not secret_matches(secret_id, node.secret_hash):
            raise PermissionDeniedError(
                f"Permission denied: unknown node {node_id[:64]!r} or wrong node secret (register first)"
            )
        return node

    def _node(self, node_id: str) -> tuple[Snapshot, Node]:
        if not node_id:
            raise ValidationError("node_id: required")
        snap = self._store.snapshot()
        node = snap.node(node_id)
        if node is None:
            raise NotFoundError(f"node {node_id!r} not found")
        return snap, node

    def _next_status(self, snap: Snapshot, node: Node, requested: str) -> str:
        """Nomad's status gate (#15808): a node back from disconnected is "initializing" until
        it has re-sent its allocs' states; only then "ready"."""
        if requested != NODE_STATUS_READY:
            return requested
        if node.status == NODE_STATUS_DISCONNECTED:
            return NODE_STATUS_INIT
        if node.status == NODE_STATUS_INIT and node.last_missed_heartbeat_index:
            live = any(not a.terminal() for a in snap.allocs_by_node(node.id))
            if live and node.last_alloc_update_index <= node.last_missed_heartbeat_index:
                return NODE_STATUS_INIT
        return requested

    def _arm_heartbeat(self, node_id: str, status: str, now: int) -> int:
        if self._heartbeats is None:
            return HEARTBEAT_TTL_NS
        if status == NODE_STATUS_DOWN:
            self._heartbeats.remove(node_id)
            return 0
        return self._heartbeats.reset(node_id, now)

    def _heard_from(self, node_id: str) -> None:
        """The node called (server/heartbeat.py HeartbeatTimers.heard_from)."""
        if self._heartbeats is not None:
            self._heartbeats.heard_from(node_id, self._clock.now_ns())

    def update_node_status(
        self, node_id: str, status: str, *, secret_id: str
    ) -> tuple[ApplyResult | None, list[str], int]:
        """A node's own status change, or its heartbeat (status "ready" again: no raft
        write), authenticated by its secret.

        Returns the write (None when nothing changed), the evals created, and the TTL to
        tell the client.
        """
        validate.validate_node_status(status, "status")
        self.authenticate_node(self._store.snapshot(), node_id, secret_id)
        self._heard_from(node_id)
        return self._set_node_status(node_id, status)

    def _set_node_status(
        self, node_id: str, status: str, *, event: str = ""
    ) -> tuple[ApplyResult | None, list[str], int]:
        snap, node = self._node(node_id)
        now = self._clock.now_ns()
        new_status = self._next_status(snap, node, status)
        result: ApplyResult | None = None
        evals: list[Evaluation] = []
        if new_status != node.status or event:
            entry = raft_pb2.NodeUpdateStatusEntry(node_id=node_id, status=new_status, updated_at_ns=now)
            entry.event.message = event or f"Node status changed to {new_status}"
            entry.event.subsystem = "Cluster"
            entry.event.timestamp_ns = now
            if new_status != node.status and _transition_needs_evals(node.status, new_status):
                evals = self.node_evals(snap, node_id, now)
            for ev in evals:
                to_proto(ev, entry.evals.add())
            result = self._propose(ET.ENTRY_TYPE_NODE_UPDATE_STATUS, entry)
        return result, [e.id for e in evals], self._arm_heartbeat(node_id, new_status, self._clock.now_ns())

    def heartbeat_missed(self, node_id: str) -> str:
        """The leader's verdict on a node whose heartbeat timer ran out: "disconnected" while
        one of its running allocs may wait for it (a group with ``disconnect.lost_after``
        that has not expired), else "down". Returns the new status ("" if the node is gone)."""
        snap = self._store.snapshot()
        node = snap.node(node_id)
        if node is None or node.status == NODE_STATUS_DOWN:
            return ""
        now = self._clock.now_ns()
        status = NODE_STATUS_DOWN
        if node.status != NODE_STATUS_INIT and self._awaits_reconnect(snap, node_id, now):
            status = NODE_STATUS_DISCONNECTED
        self._set_node_status(node_id, status, event="Node heartbeat missed")
        return status

    def _awaits_reconnect(self, snap: Snapshot, node_id: str, now: int) -> bool:
        for alloc in snap.allocs_by_node(node_id):
            if alloc.desired_status != "run" or alloc.client_terminal():
                continue
            job = snap.job_version(alloc.namespace, alloc.job_id, alloc.job_version)
            group = job.lookup_group(alloc.task_group) if job is not None else None
            if group is None or group.disconnect is None or group.disconnect.lost_after_ns <= 0:
                continue
            unknown_since = (
                next(
                    (
                        c.time_ns
                        for c in reversed(alloc.state_history)
                        if c.field == "client_status" and c.value == "unknown"
                    ),
                    now,
                )
                if alloc.client_status == "unknown"
                else now
            )
            if unknown_since + group.disconnect.lost_after_ns > now:
                return True
        return False

    def update_drain(
        self, node_id: str, strategy: DrainStrategy | None, mark_eligible: bool
    ) -> tuple[ApplyResult, list[str]]:
        snap, _node = self._node(node_id)
        now = self._clock.now_ns()
        entry = raft_pb2.NodeUpdateDrainEntry(node_id=node_id, mark_eligible=mark_eligible, updated_at_ns=now)
        evals: list[Evaluation] = []
        if strategy is not None:
            if strategy.deadline_ns < 0:
                raise ValidationError("drain_strategy.deadline_ns: must be >= 0")
            force_at = now + strategy.deadline_ns if strategy.deadline_ns > 0 else 0
            to_proto(
                replace(strategy, started_at_ns=now, force_deadline_at_ns=force_at), entry.drain_strategy
            )
            entry.event.message = "Node drain strategy set"
            evals = [replace(e, triggered_by=TRIGGER_NODE_DRAIN) for e in self.node_evals(snap, node_id, now)]
        else:
            entry.event.message = "Node drain disabled"
        entry.event.subsystem = "Drain"
        entry.event.timestamp_ns = now
        for ev in evals:
            to_proto(ev, entry.evals.add())
        return self._propose(ET.ENTRY_TYPE_NODE_UPDATE_DRAIN, entry), [e.id for e in evals]

    def complete_drain(self, node_id: str) -> bool:
        """End ``node_id``'s drain if nothing it must move is still live (server/drainer.py);
        the node stays ineligible. False: not draining, or not done yet."""
        snap = self._store.snapshot()
        node = snap.node(node_id)
        if node is None or node.drain_strategy is None:
            return False
        allocs = snap.allocs_by_node(node_id)
        job_types = {(a.namespace, a.job_id): _job_type(snap, a.namespace, a.job_id) for a in allocs}
        if not drain_complete(node, allocs, job_types):
            return False
        now = self._clock.now_ns()
        entry = raft_pb2.NodeUpdateDrainEntry(
            node_id=node_id,
            mark_eligible=False,
            updated_at_ns=now,
            completes_drain_started_at_ns=node.drain_strategy.started_at_ns,
        )
        entry.event.message = "Node drain complete"
        entry.event.subsystem = "Drain"
        entry.event.timestamp_ns = now
        self._propose(ET.ENTRY_TYPE_NODE_UPDATE_DRAIN, entry)
        return True

    def update_eligibility(self, node_id: str, eligibility: str) -> tuple[ApplyResult, list[str]]:
        validate.validate_eligibility(eligibility, "eligibility")
        snap, node = self._node(node_id)
        if node.drain_strategy is not None and eligibility == "eligible":
            raise ConflictError("can not set node eligible while it is draining")
        now = self._clock.now_ns()
        entry = raft_pb2.NodeUpdateEligibilityEntry(
            node_id=node_id, eligibility=eligibility, updated_at_ns=now
        )
        evals: list[Evaluation] = []
        if eligibility != node.scheduling_eligibility:
            entry.event.message = f"Node marked as {eligibility}"
            entry.event.subsystem = "Cluster"
            entry.event.timestamp_ns = now
            if eligibility == "eligible":
                evals = self.node_evals(snap, node_id, now)
        for ev in evals:
            to_proto(ev, entry.evals.add())
        return self._propose(ET.ENTRY_TYPE_NODE_UPDATE_ELIGIBILITY, entry), [e.id for e in evals]

    # -- allocs ------------------------------------------------------------------------
    def update_allocs(
        self, allocs: list[structs_pb2.Allocation], *, node_id: str, secret_id: str
    ) -> ApplyResult:
        """A node's report on its own allocs, authenticated by its secret: an alloc placed on
        another node refuses the whole report."""
        if not allocs:
            raise ValidationError("allocs: at least one alloc required")
        _check_alloc_updates(allocs, self._limits)
        snap = self._store.snapshot()
        node = self.authenticate_node(snap, node_id, secret_id)
        if node.status in (NODE_STATUS_DOWN, NODE_STATUS_DISCONNECTED):
            # Nomad #15068: a node back from a partition heartbeats (re-registers) first.
            raise ConflictError(f"node {node_id!r} is {node.status}: heartbeat before reporting allocs")
        entry = raft_pb2.AllocClientUpdateEntry(updated_at_ns=self._clock.now_ns(), node_id=node_id)
        # alloc ID -> the stored alloc each reported one updates, read once for the evals too
        stored: dict[str, Allocation] = {}
        for i, alloc in enumerate(allocs):
            existing = snap.alloc(alloc.id)
            if existing is None:
                continue  # garbage-collected meanwhile: nothing to update, the rest still counts
            if existing.node_id != node_id:
                raise PermissionDeniedError(
                    f"Permission denied: allocs[{i}]: alloc {alloc.id!r} is not on node {node_id!r}"
                )
            stored[alloc.id] = existing
            slim = entry.allocs.add(
                id=alloc.id, client_status=alloc.client_status, client_description=alloc.client_description
            )
            for name, state in alloc.task_states.items():
                slim.task_states[name].CopyFrom(state)
            slim.check_statuses.extend(alloc.check_statuses)
            if alloc.HasField("deployment_status") and alloc.deployment_status.health:
                if alloc.deployment_status.health not in (HEALTH_HEALTHY, HEALTH_UNHEALTHY):
                    raise ValidationError(
                        f"allocs[{i}].deployment_status.health: must be {HEALTH_HEALTHY!r} or "
                        f"{HEALTH_UNHEALTHY!r}, not {alloc.deployment_status.health!r}"
                    )
                # Only the verdict and its time are the client's; the canary flag is ours.
                slim.deployment_id = alloc.deployment_id
                slim.deployment_status.health = alloc.deployment_status.health
                slim.deployment_status.timestamp_ns = alloc.deployment_status.timestamp_ns
        failure_evals = self._failure_evals(snap, entry, stored)
        for ev in failure_evals:
            to_proto(ev, entry.evals.add())
        covered = {(e.namespace, e.job_id) for e in failure_evals}
        deployment_evals = self._deployment_evals(snap, entry, stored, covered)
        covered |= {(e.namespace, e.job_id) for e in deployment_evals}
        # A replacement that starts running, or whose checks all pass now, may settle a
        # drain's batch (migrate.health_check "task_states" or "checks").
        started = [
            stored[m.id]
            for m in entry.allocs
            if (
                m.client_status == ALLOC_CLIENT_RUNNING and stored[m.id].client_status != ALLOC_CLIENT_RUNNING
            )
            or _checks_now_passing(stored[m.id], m)
        ]
        for ev in [*deployment_evals, *self._drain_evals(snap, started, entry.updated_at_ns, covered)]:
            to_proto(ev, entry.evals.add())
        return self._propose(ET.ENTRY_TYPE_ALLOC_CLIENT_UPDATE, entry)

    def _drain_evals(
        self, snap: Snapshot, started: list[Allocation], now: int, covered: set[Key]
    ) -> list[Evaluation]:
        """One ``node-drain`` eval per job with an alloc that just started running while its
        group, under a ``migrate`` block, still has allocs waiting on a draining node: a
        running replacement may open room for the next to leave (migrate.max_parallel,
        scheduler/reconciler/migrate.py), and the scheduler must look again to know."""
        evals: dict[Key, Evaluation] = {}
        for alloc in started:
            key = (alloc.namespace, alloc.job_id)
            job = snap.job(*key) if key not in covered and key not in evals else None
            group = job.lookup_group(alloc.task_group) if job is not None and not job.stop else None
            if job is None or group is None or group.migrate is None:
                continue
            if any(
                a.task_group == group.name and not a.terminal() and _draining(snap, a.node_id)
                for a in snap.allocs_by_job(*key)
            ):
                evals[key] = self._new_eval(job, TRIGGER_NODE_DRAIN, now)
        return list(evals.values())

    def _deployment_evals(
        self,
        snap: Snapshot,
        entry: raft_pb2.AllocClientUpdateEntry,
        stored: Mapping[str, Allocation],
        covered: set[tuple[str, str]],
    ) -> list[Evaluation]:
        """One ``deployment-watcher`` eval per job whose active deployment just learned an
        alloc's health, in the same entry as the verdict: a healthy alloc opens room for the
        next batch, and without an eval the rollout would wait for something else to
        evaluate the job. A job that already gets a failure eval needs no second one."""
        now = entry.updated_at_ns
        evals: dict[tuple[str, str], Evaluation] = {}
        for msg in entry.allocs:
            if not msg.deployment_status.health:
                continue
            existing = stored[msg.id]
            if not existing.deployment_id or msg.deployment_id != existing.deployment_id:
                continue
            before = existing.deployment_status.health if existing.deployment_status is not None else ""
            key = (existing.namespace, existing.job_id)
            if before == msg.deployment_status.health or key in covered or key in evals:
                continue
            deployment = snap.deployment(existing.deployment_id)
            job = snap.job(existing.namespace, existing.job_id)
            if deployment is None or not deployment.active() or job is None or job.stop:
                continue
            evals[key] = deployment_eval(self._ids.new(), job, deployment, now)
        return list(evals.values())

    def _failure_evals(
        self, snap: Snapshot, entry: raft_pb2.AllocClientUpdateEntry, stored: Mapping[str, Allocation]
    ) -> list[Evaluation]:
        """One ``alloc-failure`` eval per job with a newly failed alloc its policy may
        reschedule, written in the same entry as the failure: without it a crashed service
        stays dead until something else happens to evaluate its job.

        Nomad's rule (Node.UpdateAlloc): only allocs still desired running, not already
        given a follow-up eval, of a job and group that still exist. Whether the
        replacement goes now or after the policy's delay is the scheduler's decision.
        """
        now = entry.updated_at_ns
        evals: dict[tuple[str, str], Evaluation] = {}
        for msg in entry.allocs:
            if msg.client_status != ALLOC_CLIENT_FAILED:
                continue
            existing = stored[msg.id]
            if (
                existing.client_status == ALLOC_CLIENT_FAILED
                or existing.desired_status != ALLOC_DESIRED_RUN
                or existing.followup_eval_id
            ):
                continue
            job = snap.job(existing.namespace, existing.job_id)
            if job is None or job.stop or (existing.namespace, job.id) in evals:
                continue
            group = job.lookup_group(existing.task_group)
            if group is None:
                continue
            task_states = {name: from_proto(ts, TaskState) for name, ts in msg.task_states.items()}
            now_failed = replace(
                existing,
                client_status=ALLOC_CLIENT_FAILED,
                task_states=task_states or existing.task_states,
                modify_time_ns=now,
            )
            if next_reschedule(now_failed, group.reschedule).eligible:
                evals[(existing.namespace, job.id)] = self._new_eval(job, TRIGGER_RETRY_FAILED_ALLOC, now)
        return list(evals.values())

    # -- operator ----------------------------------------------------------------------
    def restore_snapshot(self, snapshot: raft_pb2.StateSnapshot) -> ApplyResult:
        try:
            from_snapshot(snapshot)  # refuse what would not load, before it is in the log
        except Exception as exc:
            raise ValidationError(f"snapshot: does not load: {exc}") from exc
        entry = raft_pb2.SnapshotRestoreEntry(snapshot=snapshot)
        return self._propose(ET.ENTRY_TYPE_SNAPSHOT_RESTORE, entry)


# (namespace, job id)
Key = tuple[str, str]


def _checks_now_passing(existing: Allocation, msg: structs_pb2.Allocation) -> bool:
    """The update reports every check of the alloc passing, where the stored alloc had one
    not passing (or no status yet)."""
    statuses = msg.check_statuses
    return all_checks_passing(statuses, max(1, len(statuses))) and not all_checks_passing(
        existing.check_statuses, len(statuses)
    )


def _draining(snap: Snapshot, node_id: str) -> bool:
    node = snap.node(node_id)
    return node is not None and node.drain_strategy is not None


_CLIENT_STATUSES: Final = ("pending", "running", "complete", "failed", "lost", "unknown")
# One report covers at most this many allocs (a client sends what changed since its last
# report, every 200 ms), and each alloc's task states this many events.
MAX_ALLOCS_PER_UPDATE: Final = 4096
MAX_TASK_EVENTS: Final = 256


def _check_alloc_updates(allocs: list[structs_pb2.Allocation], limits: validate.Limits) -> None:
    """The request's own shape: every field the entry copies, bounded, before any lookup."""
    if len(allocs) > MAX_ALLOCS_PER_UPDATE:
        raise ValidationError(f"allocs: at most {MAX_ALLOCS_PER_UPDATE} per report, got {len(allocs)}")
    for i, alloc in enumerate(allocs):
        if not alloc.id:
            raise ValidationError(f"allocs[{i}].id: required")
        if len(alloc.id) > limits.max_name_length:
            raise ValidationError(f"allocs[{i}].id: must be at most {limits.max_name_length} characters")
        if alloc.client_status and alloc.client_status not in _CLIENT_STATUSES:
            raise ValidationError(
                f"allocs[{i}].client_status: {alloc.client_status[:64]!r} is not one of {', '.join(_CLIENT_STATUSES)}"
            )
        if len(alloc.client_description) > limits.max_string_length:
            raise ValidationError(
                f"allocs[{i}].client_description: must be at most {limits.max_string_length} characters"
            )
        if len(alloc.task_states) > limits.max_list_items:
            raise ValidationError(f"allocs[{i}].task_states: at most {limits.max_list_items} tasks")
        for name, state in alloc.task_states.items():
            where = f"allocs[{i}].task_states[{name[:64]!r}]"
            if len(name) > limits.max_name_length or len(state.state) > limits.max_name_length:
                raise ValidationError(
                    f"{where}: names and states are at most {limits.max_name_length} characters"
                )
            if len(state.events) > MAX_TASK_EVENTS:
                raise ValidationError(f"{where}.events: at most {MAX_TASK_EVENTS}, got {len(state.events)}")
            for event in state.events:
                if len(event.type) > limits.max_name_length or len(event.message) > limits.max_string_length:
                    raise ValidationError(f"{where}.events: a type or message over its length bound")
        if len(alloc.check_statuses) > limits.max_list_items:
            raise ValidationError(f"allocs[{i}].check_statuses: at most {limits.max_list_items} checks")
        for j, check in enumerate(alloc.check_statuses):
            where = f"allocs[{i}].check_statuses[{j}]"
            if check.status not in CHECK_STATUSES:
                raise ValidationError(
                    f"{where}.status: {check.status[:64]!r} is not one of {', '.join(CHECK_STATUSES)}"
                )
            names = (check.task, check.service, check.check)
            if (
                any(len(n) > limits.max_name_length for n in names)
                or len(check.output) > limits.max_string_length
            ):
                raise ValidationError(f"{where}: a name or the output over its length bound")


def _job_type(snap: Snapshot, namespace: str, job_id: str) -> str:
    job = snap.job(namespace, job_id)
    return job.type if job is not None else ""


def _transition_needs_evals(old: str, new: str) -> bool:
    """Nomad's nodeStatusTransitionRequiresEval, plus down (which drains the node)."""
    return (
        new == NODE_STATUS_DOWN
        or (old, new) in ((NODE_STATUS_INIT, NODE_STATUS_READY), (NODE_STATUS_DOWN, NODE_STATUS_READY))
        or NODE_STATUS_DISCONNECTED in (old, new)
    )


def decode_drain(msg: Any) -> DrainStrategy | None:
    return from_proto(msg.drain_strategy, DrainStrategy) if msg.HasField("drain_strategy") else None
