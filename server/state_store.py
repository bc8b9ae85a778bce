"""The replicated state: tables, secondary indexes and O(1) snapshots.

Theory of operation
-------------------
The whole state is one immutable ``Tables`` value made of persistent maps (``immutables``).
The FSM (server/fsm.py) builds the next ``Tables`` through a ``Txn`` and the store swaps
its reference under a lock, so:

* a snapshot is just the current reference: O(1), and it never changes under a reader (a
  scheduler plans on a frozen view while the FSM moves on);
* an apply that fails half way leaves nothing behind: an unfinished ``Txn`` is dropped;
* blocking queries wait on one condition variable for a table's index to pass theirs.

Only the thread that applies raft entries writes; every other thread reads snapshots.
Secondary indexes (allocs by job/node/eval, evals by job, jobs by type) and the per-job
counters behind job status and summaries are maintained by ``Txn`` on every write, so
they can never disagree with the primary tables.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any, Final, TypeVar

import immutables

from drover.scheduler.structs import (
    ALLOC_CLIENT_COMPLETE,
    ALLOC_CLIENT_FAILED,
    ALLOC_CLIENT_LOST,
    ALLOC_CLIENT_PENDING,
    ALLOC_CLIENT_RUNNING,
    ALLOC_CLIENT_UNKNOWN,
    JOB_STATUS_DEAD,
    JOB_STATUS_PENDING,
    JOB_STATUS_RUNNING,
    JOB_TYPE_SYSTEM,
    Allocation,
    Deployment,
    Evaluation,
    Job,
    JobChildrenSummary,
    JobSummary,
    Node,
    PeriodicLaunch,
    SchedulerConfig,
    ServerMember,
    ServiceRegistration,
    TaskGroupSummary,
)
from drover.server.acl.records import ACLPolicy, ACLTokenRecord
from drover.server.services.registrations import registrations_for

JobKey = tuple[str, str]  # (namespace, job id)
K = TypeVar("K")
V = TypeVar("V")

TABLES: Final = (
    "nodes",
    "jobs",
    "job_versions",
    "evals",
    "allocs",
    "job_summaries",
    "periodic_launches",
    "scheduler_config",
    "servers",
    "acl_policies",
    "acl_tokens",
    "deployments",
    "services",
)

# Nomad keeps this many versions of a job (JobTrackedVersions).
TRACKED_JOB_VERSIONS: Final = 6

_EMPTY: immutables.Map[Any, Any] = immutables.Map()


def job_key(namespace: str, job_id: str) -> JobKey:
    return (namespace, job_id)


# (namespace, parent job ID, idempotency token) of a dispatched child.
TokenKey = tuple[str, str, str]


def dispatch_token_key(job: Job) -> TokenKey | None:
    """Where the dispatch idempotency index files ``job`` (None: not a dispatched child
    with a token)."""
    if job.dispatched and job.parent_id and job.dispatch_idempotency_token:
        return (job.namespace, job.parent_id, job.dispatch_idempotency_token)
    return None


@dataclass(frozen=True, slots=True)
class Tables:
    """One immutable version of the whole state."""

    index: int = 0
    nodes: immutables.Map[str, Node] = _EMPTY
    jobs: immutables.Map[JobKey, Job] = _EMPTY
    # Newest first, at most TRACKED_JOB_VERSIONS.
    job_versions: immutables.Map[JobKey, tuple[Job, ...]] = _EMPTY
    jobs_by_type: immutables.Map[str, immutables.Map[JobKey, None]] = _EMPTY
    # Jobs with a periodic block (enabled or not): what the periodic dispatcher scans.
    periodic_jobs: immutables.Map[JobKey, None] = _EMPTY
    # Child jobs (periodic launches, dispatches) by their parent's key, parent present or not.
    children_by_parent: immutables.Map[JobKey, immutables.Map[JobKey, None]] = _EMPTY
    # The dispatched child that answers for an idempotency token: a lookup, not a scan of
    # every child (a parameterized parent may have dispatched thousands). A collected child
    # leaves it, so the token may be used again, as in Nomad.
    dispatch_tokens: immutables.Map[TokenKey, JobKey] = _EMPTY
    evals: immutables.Map[str, Evaluation] = _EMPTY
    evals_by_job: immutables.Map[JobKey, immutables.Map[str, None]] = _EMPTY
    allocs: immutables.Map[str, Allocation] = _EMPTY
    allocs_by_job: immutables.Map[JobKey, immutables.Map[str, None]] = _EMPTY
    allocs_by_node: immutables.Map[str, immutables.Map[str, None]] = _EMPTY
    allocs_by_eval: immutables.Map[str, immutables.Map[str, None]] = _EMPTY
    # Allocs of a job that still hold resources (desired run, client not terminal).
    live_allocs_by_job: immutables.Map[JobKey, int] = _EMPTY
    job_summaries: immutables.Map[JobKey, JobSummary] = _EMPTY
    periodic_launches: immutables.Map[JobKey, PeriodicLaunch] = _EMPTY
    scheduler_config: SchedulerConfig = field(default_factory=SchedulerConfig)
    servers: immutables.Map[str, ServerMember] = _EMPTY
    # ACLs (server/acl/): policies by name, tokens by accessor ID, and the one way a presented
    # secret finds its token: by its hash (no table holds a secret).
    acl_policies: immutables.Map[str, ACLPolicy] = _EMPTY
    acl_tokens: immutables.Map[str, ACLTokenRecord] = _EMPTY
    acl_tokens_by_hash: immutables.Map[str, str] = _EMPTY
    # The raft index of the ACL bootstrap; 0 until it happens (it happens once).
    acl_bootstrap_index: int = 0
    deployments: immutables.Map[str, Deployment] = _EMPTY
    deployments_by_job: immutables.Map[JobKey, immutables.Map[str, None]] = _EMPTY
    # Service registrations by alloc ID (server/services/registrations.py derives them as
    # the alloc changes), and the allocs registering each (namespace, service name).
    services: immutables.Map[str, tuple[ServiceRegistration, ...]] = _EMPTY
    services_by_name: immutables.Map[tuple[str, str], immutables.Map[str, None]] = _EMPTY
    table_index: immutables.Map[str, int] = _EMPTY


class Snapshot:
    """A read-only, frozen view of the state at one index (the scheduler's ``State``)."""

    __slots__ = ("_t",)

    def __init__(self, tables: Tables) -> None:
        self._t = tables

    @property
    def tables(self) -> Tables:
        return self._t

    @property
    def index(self) -> int:
        return self._t.index

    def table_index(self, *names: str) -> int:
        """The highest modify index among ``names`` (all tables when none given)."""
        names = names or TABLES
        return max((self._t.table_index.get(n, 0) for n in names), default=0)

    # nodes
    def node(self, node_id: str) -> Node | None:
        return self._t.nodes.get(node_id)

    def nodes(self) -> Iterator[Node]:
        return iter(self._t.nodes.values())

    # jobs
    def job(self, namespace: str, job_id: str) -> Job | None:
        return self._t.jobs.get((namespace, job_id))

    def jobs(self) -> Iterator[Job]:
        return iter(self._t.jobs.values())

    def jobs_by_type(self, job_type: str) -> Iterator[Job]:
        for key in self._t.jobs_by_type.get(job_type, _EMPTY):
            yield self._t.jobs[key]

    def periodic_jobs(self) -> Iterator[Job]:
        """Jobs with a periodic block, enabled or not, stopped or not."""
        for key in self._t.periodic_jobs:
            yield self._t.jobs[key]

    def job_versions(self, namespace: str, job_id: str) -> tuple[Job, ...]:
        return self._t.job_versions.get((namespace, job_id), ())

    def job_version(self, namespace: str, job_id: str, version: int) -> Job | None:
        for job in self.job_versions(namespace, job_id):
            if job.version == version:
                return job
        current = self.job(namespace, job_id)
        return current if current is not None and current.version == version else None

    def job_summary(self, namespace: str, job_id: str) -> JobSummary | None:
        return self._t.job_summaries.get((namespace, job_id))

    def children(self, namespace: str, parent_id: str) -> list[Job]:
        """The jobs whose ``parent_id`` is this job (periodic launches, dispatches)."""
        keys = self._t.children_by_parent.get((namespace, parent_id), _EMPTY)
        return [self._t.jobs[k] for k in keys]

    def dispatched_child(self, namespace: str, parent_id: str, token: str) -> Job | None:
        """The child of ``parent_id`` dispatched with idempotency ``token`` (none without one)."""
        key = self._t.dispatch_tokens.get((namespace, parent_id, token)) if token else None
        return self._t.jobs.get(key) if key is not None else None

    def periodic_launch(self, namespace: str, job_id: str) -> PeriodicLaunch | None:
        return self._t.periodic_launches.get((namespace, job_id))

    def periodic_launches(self) -> Iterator[PeriodicLaunch]:
        return iter(self._t.periodic_launches.values())

    # evals
    def eval(self, eval_id: str) -> Evaluation | None:
        return self._t.evals.get(eval_id)

    def evals(self) -> Iterator[Evaluation]:
        return iter(self._t.evals.values())

    def evals_by_job(self, namespace: str, job_id: str) -> list[Evaluation]:
        ids = self._t.evals_by_job.get((namespace, job_id), _EMPTY)
        return [self._t.evals[i] for i in ids]

    # allocs
    def alloc(self, alloc_id: str) -> Allocation | None:
        return self._t.allocs.get(alloc_id)

    def allocs(self) -> Iterator[Allocation]:
        return iter(self._t.allocs.values())

    def allocs_by_job(self, namespace: str, job_id: str) -> list[Allocation]:
        return self._collect(self._t.allocs_by_job.get((namespace, job_id), _EMPTY))

    def allocs_by_node(self, node_id: str) -> list[Allocation]:
        return self._collect(self._t.allocs_by_node.get(node_id, _EMPTY))

    def allocs_by_eval(self, eval_id: str) -> list[Allocation]:
        return self._collect(self._t.allocs_by_eval.get(eval_id, _EMPTY))

    def _collect(self, ids: Iterable[str]) -> list[Allocation]:
        allocs = self._t.allocs
        return [allocs[i] for i in ids]

    def scheduler_config(self) -> SchedulerConfig:
        return self._t.scheduler_config

    # service registrations
    def service_names(self) -> Iterator[tuple[str, str]]:
        """Every (namespace, service name) with at least one registration, sorted."""
        return iter(sorted(self._t.services_by_name.keys()))

    def service_registrations(self, namespace: str, name: str) -> list[ServiceRegistration]:
        """The registrations of one service, by alloc ID then registration ID."""
        allocs = self._t.services_by_name.get((namespace, name), _EMPTY)
        found = [
            reg
            for alloc_id in sorted(allocs.keys())
            for reg in self._t.services.get(alloc_id, ())
            if reg.service_name == name
        ]
        return sorted(found, key=lambda r: (r.alloc_id, r.id))

    def alloc_services(self, alloc_id: str) -> tuple[ServiceRegistration, ...]:
        return self._t.services.get(alloc_id, ())

    def servers(self) -> Iterator[ServerMember]:
        return iter(self._t.servers.values())

    # ACLs
    def acl_policy(self, name: str) -> ACLPolicy | None:
        return self._t.acl_policies.get(name)

    def acl_policies(self) -> Iterator[ACLPolicy]:
        return iter(self._t.acl_policies.values())

    def acl_token(self, accessor_id: str) -> ACLTokenRecord | None:
        return self._t.acl_tokens.get(accessor_id)

    def acl_tokens(self) -> Iterator[ACLTokenRecord]:
        return iter(self._t.acl_tokens.values())

    def acl_token_by_hash(self, secret_hash: str) -> ACLTokenRecord | None:
        accessor = self._t.acl_tokens_by_hash.get(secret_hash)
        return self._t.acl_tokens.get(accessor) if accessor is not None else None

    @property
    def acl_bootstrap_index(self) -> int:
        return self._t.acl_bootstrap_index

    def deployment(self, deployment_id: str) -> Deployment | None:
        return self._t.deployments.get(deployment_id)

    def deployments(self) -> Iterator[Deployment]:
        return iter(self._t.deployments.values())

    def deployments_by_job(self, namespace: str, job_id: str) -> list[Deployment]:
        """The job's deployments, newest first (by create index, then ID)."""
        table = self._t.deployments
        ids = self._t.deployments_by_job.get((namespace, job_id), _EMPTY)
        return sorted((table[i] for i in ids), key=lambda d: (-d.create_index, d.id))

    def latest_deployment(self, namespace: str, job_id: str) -> Deployment | None:
        """The job's newest deployment (Nomad's LatestDeploymentByJobID), active or not."""
        newest = self.deployments_by_job(namespace, job_id)
        return newest[0] if newest else None


@dataclass(slots=True)
class Changes:
    """What one committed write changed, for the leader's services (not part of the state).

    ``evals``: IDs of evals written. ``capacity``: something may now fit that did not before
    (a node became ready or eligible, an alloc stopped or finished, a job was stopped), which
    is what releases blocked evals. ``rescan``: everything changed (a snapshot restore).
    """

    evals: set[str] = field(default_factory=set)
    capacity: bool = False
    rescan: bool = False


CHANGE_FEED_LENGTH: Final = 8192


class StateStore:
    """Holds the current ``Tables``; one writer (the raft apply thread), many readers."""

    def __init__(self, tables: Tables | None = None) -> None:
        self._tables = tables or Tables()
        self._changed = threading.Condition(threading.Lock())
        self._feed: deque[tuple[int, Changes]] = deque(maxlen=CHANGE_FEED_LENGTH)
        # Changes at or below this index have fallen off the feed.
        self._feed_floor = 0
        self._closed = False

    def snapshot(self) -> Snapshot:
        # A reference read is atomic in CPython: no lock needed for an O(1) snapshot.
        return Snapshot(self._tables)

    @property
    def index(self) -> int:
        return self._tables.index

    def commit(self, tables: Tables, changes: Changes | None = None) -> None:
        with self._changed:
            self._tables = tables
            if len(self._feed) == self._feed.maxlen:
                self._feed_floor = self._feed[0][0]
            self._feed.append((tables.index, changes if changes is not None else Changes(rescan=True)))
            self._changed.notify_all()

    def changes_since(self, index: int) -> tuple[list[Changes], int]:
        """Changes committed after ``index`` and the newest index; a gap means "rescan"."""
        with self._changed:
            newest = self._tables.index
            # Newest first, stopping at ``index``: callers keep up, so this reads a few entries.
            feed: list[Changes] = []
            for i, change in reversed(self._feed):
                if i <= index:
                    break
                feed.append(change)
            feed.reverse()
            if index < self._feed_floor:
                # Changes the reader has not seen fell off the feed: it must rescan the state.
                feed.insert(0, Changes(rescan=True))
        return feed, newest

    def wait_for(self, tables: Iterable[str], min_index: int, timeout: float) -> Snapshot:
        """Blocking query: a snapshot once any of ``tables`` moves past ``min_index``.

        Returns the current snapshot after ``timeout`` either way; the caller compares
        indexes (a timeout is not an error, as in Nomad's blocking queries).
        """
        names = tuple(tables) or TABLES
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                snap = Snapshot(self._tables)
                if snap.table_index(*names) > min_index:
                    return snap
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self._closed:
                    return snap
                self._changed.wait(remaining)

    def wait_for_index(self, min_index: int, timeout: float) -> bool:
        """Wait until the store has applied ``min_index``; False on timeout."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while self._tables.index < min_index:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self._closed:
                    return False
                self._changed.wait(remaining)
        return True

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Wake every blocking query now and answer new ones at once: the server is stopping,
        and a parked handler thread would otherwise keep the process alive until it times out."""
        with self._changed:
            self._closed = True
            self._changed.notify_all()


# ---------------------------------------------------------------------------------------
# Writing


def _keep_indexes(old: ServiceRegistration | None, new: ServiceRegistration) -> ServiceRegistration:
    """``new`` as stored: the old value itself when nothing but the indexes differ, else
    ``new`` with the old create index."""
    if old is None:
        return new
    if replace(old, create_index=new.create_index, modify_index=new.modify_index) == new:
        return old
    return replace(new, create_index=old.create_index)


def _alloc_bucket(alloc: Allocation) -> str:
    return _CLIENT_STATUS_BUCKET.get(alloc.client_status, "starting")


_CLIENT_STATUS_BUCKET: Final = {
    ALLOC_CLIENT_PENDING: "starting",
    ALLOC_CLIENT_RUNNING: "running",
    ALLOC_CLIENT_COMPLETE: "complete",
    ALLOC_CLIENT_FAILED: "failed",
    ALLOC_CLIENT_LOST: "lost",
    ALLOC_CLIENT_UNKNOWN: "unknown",
}


_SUMMARY_COUNTERS: Final = ("queued", "starting", "running", "failed", "complete", "lost", "unknown")


def _bump(summary: TaskGroupSummary, bucket: str, delta: int) -> TaskGroupSummary:
    return replace(summary, **{bucket: getattr(summary, bucket) + delta})


class Txn:
    """Builds the next ``Tables`` from the current one; nothing is visible until ``commit``.

    Every write goes through a method here so that secondary indexes, per-job counters,
    job status, job summaries and table indexes are updated in one place.
    """

    def __init__(self, base: Tables, index: int) -> None:
        self.base = base
        self.index = index
        self._maps: dict[str, Any] = {}
        self._scalars: dict[str, Any] = {}
        self._touched_tables: set[str] = set()
        self._status_dirty: set[JobKey] = set()
        self.changes = Changes()
        # The keys this transaction wrote in the tables events are made of, in write order
        # (server/events/ derives the entry's events from them). Dicts, not sets: the order
        # must be the same on every server, and str hashes differ between processes.
        self.written: dict[str, dict[Any, None]] = {}

    # -- low level ---------------------------------------------------------------------
    def _m(self, name: str) -> Any:
        """The mutation of table ``name`` (created on first use)."""
        mut = self._maps.get(name)
        if mut is None:
            mut = getattr(self.base, name).mutate()
            self._maps[name] = mut
        return mut

    def _touch(self, *tables: str) -> None:
        self._touched_tables.update(tables)

    def _wrote(self, table: str, key: Any) -> None:
        keys = self.written.get(table)
        if keys is None:
            keys = self.written[table] = {}
        keys[key] = None

    def _index_add(self, name: str, key: Any, member: Any) -> None:
        m = self._m(name)
        m[key] = m.get(key, _EMPTY).set(member, None)

    def _index_remove(self, name: str, key: Any, member: Any) -> None:
        m = self._m(name)
        members = m.get(key)
        if members is None or member not in members:
            return
        members = members.delete(member)
        if len(members):
            m[key] = members
        else:
            del m[key]

    # -- reads through the transaction -------------------------------------------------
    def node(self, node_id: str) -> Node | None:
        return self._m("nodes").get(node_id)  # type: ignore[no-any-return]

    def job(self, key: JobKey) -> Job | None:
        return self._m("jobs").get(key)  # type: ignore[no-any-return]

    def alloc(self, alloc_id: str) -> Allocation | None:
        return self._m("allocs").get(alloc_id)  # type: ignore[no-any-return]

    def eval(self, eval_id: str) -> Evaluation | None:
        return self._m("evals").get(eval_id)  # type: ignore[no-any-return]

    def summary(self, key: JobKey) -> JobSummary | None:
        return self._m("job_summaries").get(key)  # type: ignore[no-any-return]

    def periodic_launch(self, key: JobKey) -> PeriodicLaunch | None:
        return self._m("periodic_launches").get(key)  # type: ignore[no-any-return]

    def children_of(self, key: JobKey) -> list[Job]:
        jobs = self._m("jobs")
        return [jobs[k] for k in self._m("children_by_parent").get(key, _EMPTY) if k in jobs]

    def job_versions(self, key: JobKey) -> tuple[Job, ...]:
        return self._m("job_versions").get(key, ())  # type: ignore[no-any-return]

    def dispatched_child(self, namespace: str, parent_id: str, token: str) -> Job | None:
        key = self._m("dispatch_tokens").get((namespace, parent_id, token)) if token else None
        return self.job(key) if key is not None else None

    def allocs_of_job(self, key: JobKey) -> list[Allocation]:
        allocs = self._m("allocs")
        return [allocs[i] for i in self._m("allocs_by_job").get(key, _EMPTY)]

    def evals_of_job(self, key: JobKey) -> list[Evaluation]:
        evals = self._m("evals")
        return [evals[i] for i in self._m("evals_by_job").get(key, _EMPTY)]

    def deployment(self, deployment_id: str) -> Deployment | None:
        return self._m("deployments").get(deployment_id)  # type: ignore[no-any-return]

    def deployments_of_job(self, key: JobKey) -> list[Deployment]:
        table = self._m("deployments")
        return [table[i] for i in self._m("deployments_by_job").get(key, _EMPTY)]

    def scheduler_config(self) -> SchedulerConfig:
        return self._scalars.get("scheduler_config", self.base.scheduler_config)  # type: ignore[no-any-return]

    # -- nodes -------------------------------------------------------------------------
    def put_node(self, node: Node) -> None:
        old = self.node(node.id)
        if node.ready_for_placement() and (old is None or not old.ready_for_placement()):
            self.changes.capacity = True
        elif (
            node.ready_for_placement()
            and old is not None
            and (old.meta, old.attributes, old.node_class, old.node_pool)
            != (node.meta, node.attributes, node.node_class, node.node_pool)
        ):
            # What constraints (or the node pool filter) read changed (``node meta apply``, a
            # client restarted in another pool): a blocked job may fit now.
            self.changes.capacity = True
        self._m("nodes")[node.id] = node
        self._wrote("nodes", node.id)
        self._touch("nodes")

    def delete_node(self, node_id: str) -> None:
        nodes = self._m("nodes")
        if node_id in nodes:
            del nodes[node_id]
            self._wrote("nodes", node_id)
            self._touch("nodes")

    # -- jobs --------------------------------------------------------------------------
    def put_job(self, job: Job) -> None:
        key = (job.namespace, job.id)
        old = self.job(key)
        if job.stop and (old is None or not old.stop):
            self.changes.capacity = True
        if old is not None and old.type != job.type:
            self._index_remove("jobs_by_type", old.type, key)
        self._m("jobs")[key] = job
        self._wrote("jobs", key)
        self._index_add("jobs_by_type", job.type, key)
        periodic = self._m("periodic_jobs")
        if job.periodic is not None:
            periodic[key] = None
        elif key in periodic:
            del periodic[key]
        self._status_dirty.add(key)
        self._index_token(old, job)
        if old is None or old.parent_id != job.parent_id:
            if old is not None and old.parent_id:
                self._index_remove("children_by_parent", (old.namespace, old.parent_id), key)
                self._children_delta(old.namespace, old.parent_id, old.status or JOB_STATUS_PENDING, None)
            if job.parent_id:
                self._index_add("children_by_parent", (job.namespace, job.parent_id), key)
                self._children_delta(job.namespace, job.parent_id, None, job.status or JOB_STATUS_PENDING)
        self._touch("jobs")

    def _index_token(self, old: Job | None, new: Job | None) -> None:
        """Keep ``dispatch_tokens`` naming the first child dispatched with each token."""
        ref = new if new is not None else old
        if ref is None:
            return
        key = (ref.namespace, ref.id)
        tokens = self._m("dispatch_tokens")
        old_token = dispatch_token_key(old) if old is not None else None
        new_token = dispatch_token_key(new) if new is not None else None
        if old_token is not None and old_token != new_token and tokens.get(old_token) == key:
            del tokens[old_token]
        if new_token is not None and new_token not in tokens:
            tokens[new_token] = key

    def put_job_version(self, job: Job) -> None:
        """Record ``job`` as its newest version. Trimming to TRACKED_JOB_VERSIONS never
        drops the newest stable version: it is what auto-revert goes back to."""
        key = (job.namespace, job.id)
        versions = (job, *(v for v in self.job_versions(key) if v.version != job.version))
        kept = versions[:TRACKED_JOB_VERSIONS]
        stable = next((v for v in versions if v.stable), None)
        if stable is not None and stable not in kept:
            kept = (*kept[: TRACKED_JOB_VERSIONS - 1], stable)
        self._m("job_versions")[key] = kept
        self._touch("job_versions")

    def mark_version_stable(self, key: JobKey, version: int) -> None:
        """Mark one tracked version stable where it stands in the history."""
        versions = self.job_versions(key)
        if any(v.version == version and not v.stable for v in versions):
            self._m("job_versions")[key] = tuple(
                replace(v, stable=True) if v.version == version else v for v in versions
            )
            self._touch("job_versions")

    def delete_job(self, key: JobKey) -> None:
        job = self.job(key)
        if job is None:
            return
        del self._m("jobs")[key]
        self._wrote("jobs", key)
        self.changes.capacity = True
        self._index_remove("jobs_by_type", job.type, key)
        self._index_token(job, None)
        periodic = self._m("periodic_jobs")
        if key in periodic:
            del periodic[key]
        for name in ("job_versions", "job_summaries", "periodic_launches"):
            table = self._m(name)
            if key in table:
                del table[key]
                self._touch(name)
        if job.parent_id:
            self._index_remove("children_by_parent", (job.namespace, job.parent_id), key)
            self._children_delta(job.namespace, job.parent_id, job.status or JOB_STATUS_PENDING, None)
        self._status_dirty.discard(key)
        self._touch("jobs")

    def put_summary(self, summary: JobSummary) -> None:
        self._m("job_summaries")[(summary.namespace, summary.job_id)] = summary
        self._touch("job_summaries")

    def delete_summary(self, key: JobKey) -> None:
        table = self._m("job_summaries")
        if key in table:
            del table[key]
            self._touch("job_summaries")

    def ensure_summary(self, job: Job) -> None:
        """Every job has a summary with a row per group (rows are kept for removed groups)."""
        key = (job.namespace, job.id)
        summary = self.summary(key)
        if summary is None:
            # Allocs of a purged job with the same ID may still exist: count them, so the
            # summary equals a recount from the allocs from its first index.
            rows: dict[str, TaskGroupSummary] = {}
            for alloc in self.allocs_of_job(key):
                row = rows.get(alloc.task_group, TaskGroupSummary())
                rows[alloc.task_group] = _bump(row, _alloc_bucket(alloc), +1)
            # A purged parent registered again still has its children: count them.
            summary = JobSummary(
                job_id=job.id,
                namespace=job.namespace,
                summary=rows,
                children=self._count_children(key),
                create_index=self.index,
                modify_index=self.index,
            )
        missing = [g.name for g in job.groups if g.name not in summary.summary]
        if missing or summary.create_index == self.index:
            merged = dict(summary.summary)
            for name in missing:
                merged[name] = TaskGroupSummary()
            self.put_summary(replace(summary, summary=merged, modify_index=self.index))

    def _count_children(self, key: JobKey) -> JobChildrenSummary:
        """The children that exist, by status: Nomad's rule, so a child garbage collected
        (server/gc/) leaves its parent's counts, and the counts stay a recount of the state
        at every index (no count is kept of children no longer in the state)."""
        counts = {JOB_STATUS_PENDING: 0, JOB_STATUS_RUNNING: 0, JOB_STATUS_DEAD: 0}
        for child in self.children_of(key):
            status = child.status or JOB_STATUS_PENDING
            counts[status] = counts.get(status, 0) + 1
        return JobChildrenSummary(**counts)

    def _children_delta(self, namespace: str, parent_id: str, old: str | None, new: str | None) -> None:
        """Move one child between the parent's pending/running/dead counts
        (docs/field-reports.md#field-report-2)."""
        if old == new:
            return
        key = (namespace, parent_id)
        summary = self.summary(key)
        if summary is None:
            return
        children = summary.children or JobChildrenSummary()
        if old is not None:
            children = replace(children, **{old: max(0, getattr(children, old) - 1)})
        if new is not None:
            children = replace(children, **{new: getattr(children, new) + 1})
        self.put_summary(replace(summary, children=children, modify_index=self.index))

    def put_periodic_launch(self, launch: PeriodicLaunch) -> None:
        self._m("periodic_launches")[(launch.namespace, launch.job_id)] = launch
        self._touch("periodic_launches")

    # -- evals -------------------------------------------------------------------------
    def put_eval(self, ev: Evaluation) -> None:
        old = self.eval(ev.id)
        key = (ev.namespace, ev.job_id)
        if old is not None:
            ev = replace(
                ev, create_index=old.create_index, create_time_ns=old.create_time_ns or ev.create_time_ns
            )
        else:
            ev = replace(ev, create_index=self.index)
        ev = replace(ev, modify_index=self.index)
        self._m("evals")[ev.id] = ev
        self._wrote("evals", ev.id)
        self.changes.evals.add(ev.id)
        if old is not None and old.job_id and (old.namespace, old.job_id) != key:
            self._index_remove("evals_by_job", (old.namespace, old.job_id), ev.id)
            self._status_dirty.add((old.namespace, old.job_id))
        if ev.job_id:
            self._index_add("evals_by_job", key, ev.id)
            self._status_dirty.add(key)
            if ev.queued_allocations and ev.terminal():
                self._set_queued(key, ev.queued_allocations)
        self._touch("evals")

    def delete_eval(self, eval_id: str) -> None:
        ev = self.eval(eval_id)
        if ev is None:
            return
        del self._m("evals")[eval_id]
        self._wrote("evals", eval_id)
        key = (ev.namespace, ev.job_id)
        self._index_remove("evals_by_job", key, eval_id)
        self._status_dirty.add(key)
        self._touch("evals")

    def _set_queued(self, key: JobKey, queued: Any) -> None:
        summary = self.summary(key)
        if summary is None:
            return
        rows = dict(summary.summary)
        for group, row in rows.items():
            rows[group] = replace(row, queued=max(0, int(queued.get(group, 0))))
        self.put_summary(replace(summary, summary=rows, modify_index=self.index))

    # -- allocs ------------------------------------------------------------------------
    def put_alloc(self, alloc: Allocation) -> None:
        old = self.alloc(alloc.id)
        key = (alloc.namespace, alloc.job_id)
        if old is not None and not old.terminal() and alloc.terminal():
            self.changes.capacity = True
        if old is not None and (old.namespace, old.job_id) != key:
            # Moving to another job: leave the old job's index and summary as a delete would.
            self._index_remove("allocs_by_job", (old.namespace, old.job_id), alloc.id)
            self._account(old, None)
            old_for_account = None
        else:
            old_for_account = old
        self._m("allocs")[alloc.id] = alloc
        self._wrote("allocs", alloc.id)
        if old is None or old_for_account is None:
            self._index_add("allocs_by_job", key, alloc.id)
        if old is None:
            self._index_add("allocs_by_eval", alloc.eval_id, alloc.id)
        elif old.eval_id != alloc.eval_id:
            self._index_remove("allocs_by_eval", old.eval_id, alloc.id)
            self._index_add("allocs_by_eval", alloc.eval_id, alloc.id)
        if old is None or old.node_id != alloc.node_id:
            if old is not None:
                self._index_remove("allocs_by_node", old.node_id, alloc.id)
            self._index_add("allocs_by_node", alloc.node_id, alloc.id)
        self._account(old_for_account, alloc)
        self._touch("allocs")
        self._sync_services(alloc.id, alloc)

    def delete_alloc(self, alloc_id: str) -> None:
        old = self.alloc(alloc_id)
        if old is None:
            return
        del self._m("allocs")[alloc_id]
        self._wrote("allocs", alloc_id)
        if not old.terminal():
            self.changes.capacity = True
        self._index_remove("allocs_by_job", (old.namespace, old.job_id), alloc_id)
        self._index_remove("allocs_by_node", old.node_id, alloc_id)
        self._index_remove("allocs_by_eval", old.eval_id, alloc_id)
        self._account(old, None)
        self._touch("allocs")
        self._sync_services(alloc_id, None)

    def _alloc_job(self, alloc: Allocation) -> Job | None:
        """The job version ``alloc`` runs (the current job when that version is no longer
        tracked: its services are the best known)."""
        key = (alloc.namespace, alloc.job_id)
        for version in self.job_versions(key):
            if version.version == alloc.job_version:
                return version
        return self.job(key)

    def _sync_services(self, alloc_id: str, alloc: Allocation | None) -> None:
        """Make the alloc's service registrations what it now has: written in the same
        transaction as the alloc, so they can never disagree with it. An unchanged
        registration keeps its indexes (a blocking query on "services" wakes only for a
        real change)."""
        old = self._m("services").get(alloc_id, ())
        if alloc is None:
            new: tuple[ServiceRegistration, ...] = ()
        else:
            derived = registrations_for(alloc, self._alloc_job(alloc), self.node(alloc.node_id), self.index)
            kept = {reg.id: reg for reg in old}
            new = tuple(_keep_indexes(kept.get(reg.id), reg) for reg in derived)
        if new == old:
            return
        old_names = {(r.namespace, r.service_name) for r in old}
        new_names = {(r.namespace, r.service_name) for r in new}
        for name in old_names - new_names:
            self._index_remove("services_by_name", name, alloc_id)
        for name in new_names - old_names:
            self._index_add("services_by_name", name, alloc_id)
        if new:
            self._m("services")[alloc_id] = new
        else:
            del self._m("services")[alloc_id]
        self._touch("services")

    def _account(self, old: Allocation | None, new: Allocation | None) -> None:
        """Move one alloc's contribution in its job's summary and live-alloc count.

        Counting deltas (remove the old contribution, add the new one) keeps the summary
        equal to a recount from the allocs at every index, and never negative.
        """
        ref = new or old
        assert ref is not None
        key = (ref.namespace, ref.job_id)
        live_delta = (1 if new is not None and not new.terminal() else 0) - (
            1 if old is not None and not old.terminal() else 0
        )
        if live_delta:
            live = self._m("live_allocs_by_job")
            count = live.get(key, 0) + live_delta
            if count:
                live[key] = count
            else:
                del live[key]
            self._status_dirty.add(key)
        old_slot = (old.task_group, _alloc_bucket(old)) if old is not None else None
        new_slot = (new.task_group, _alloc_bucket(new)) if new is not None else None
        if old_slot == new_slot:
            return
        summary = self.summary(key)
        if summary is None:
            return
        rows = dict(summary.summary)
        if old_slot is not None:
            rows[old_slot[0]] = _bump(rows.get(old_slot[0], TaskGroupSummary()), old_slot[1], -1)
        if new_slot is not None:
            rows[new_slot[0]] = _bump(rows.get(new_slot[0], TaskGroupSummary()), new_slot[1], +1)
        self.put_summary(replace(summary, summary=rows, modify_index=self.index))

    # -- reconciliation ----------------------------------------------------------------
    def reconcile_summaries(self) -> list[tuple[JobKey, tuple[str, ...]]]:
        """Recompute every job's status and summary from its allocs, evals and children.

        Counters are maintained incrementally on every write, so this should find nothing;
        it is the operator's check (`drover system reconcile summaries`) and repair. Queued
        counts come from evals, not allocs, so they are kept. Returns, per corrected job,
        what changed ("web.running: 3 -> 2", "children.pending: 1 -> 0").
        """
        # Runs alone in its transaction (one raft entry): the base tables are the state.
        keys = sorted(self.base.jobs.keys())
        corrections: dict[JobKey, list[str]] = {}
        self._status_dirty.update(keys)
        self._settle_job_status()
        for key in keys:
            job = self.job(key)
            assert job is not None
            before = self.base.jobs[key].status
            if job.status != before:
                corrections.setdefault(key, []).append(f"status: {before or '(none)'} -> {job.status}")
            changes = self._reconcile_summary(key, job)
            if changes:
                corrections.setdefault(key, []).extend(changes)
        for key in sorted(k for k in self.base.job_summaries if k not in self.base.jobs):
            self.delete_summary(key)
            corrections.setdefault(key, []).append("summary of a job that no longer exists: removed")
        return [(key, tuple(changes)) for key, changes in sorted(corrections.items())]

    def _reconcile_summary(self, key: JobKey, job: Job) -> list[str]:
        old = self.summary(key)
        old_rows = dict(old.summary) if old is not None else {}
        rows = {name: TaskGroupSummary(queued=row.queued) for name, row in old_rows.items()}
        for group in job.groups:
            rows.setdefault(group.name, TaskGroupSummary())
        for alloc in self.allocs_of_job(key):
            row = rows.get(alloc.task_group, TaskGroupSummary())
            rows[alloc.task_group] = _bump(row, _alloc_bucket(alloc), +1)
        children = self._count_children(key)
        if old is not None and old_rows == rows and old.children == children:
            return []
        changes: list[str] = [] if old is not None else ["summary missing: created"]
        for name in sorted(set(old_rows) | set(rows)):
            have, want = old_rows.get(name), rows[name]
            if have is None:
                changes.append(f"{name}: row added")
                continue
            for counter in _SUMMARY_COUNTERS:
                if getattr(have, counter) != getattr(want, counter):
                    changes.append(f"{name}.{counter}: {getattr(have, counter)} -> {getattr(want, counter)}")
        old_children = (old.children if old is not None else None) or JobChildrenSummary()
        for bucket in (JOB_STATUS_PENDING, JOB_STATUS_RUNNING, JOB_STATUS_DEAD):
            if getattr(old_children, bucket) != getattr(children, bucket):
                changes.append(
                    f"children.{bucket}: {getattr(old_children, bucket)} -> {getattr(children, bucket)}"
                )
        base = old or JobSummary(job_id=job.id, namespace=job.namespace, create_index=self.index)
        self.put_summary(replace(base, summary=rows, children=children, modify_index=self.index))
        return changes

    # -- the rest ----------------------------------------------------------------------
    def set_scheduler_config(self, config: SchedulerConfig) -> None:
        self._scalars["scheduler_config"] = config
        self._touch("scheduler_config")

    def put_server(self, member: ServerMember) -> None:
        self._m("servers")[member.name] = member
        self._touch("servers")

    # -- ACLs --------------------------------------------------------------------------
    def acl_policy(self, name: str) -> ACLPolicy | None:
        return self._m("acl_policies").get(name)  # type: ignore[no-any-return]

    def acl_token(self, accessor_id: str) -> ACLTokenRecord | None:
        return self._m("acl_tokens").get(accessor_id)  # type: ignore[no-any-return]

    def acl_token_by_hash(self, secret_hash: str) -> ACLTokenRecord | None:
        accessor = self._m("acl_tokens_by_hash").get(secret_hash)
        return self.acl_token(accessor) if accessor is not None else None

    def acl_bootstrap_index(self) -> int:
        return self._scalars.get("acl_bootstrap_index", self.base.acl_bootstrap_index)  # type: ignore[no-any-return]

    def put_acl_policy(self, policy: ACLPolicy) -> None:
        self._m("acl_policies")[policy.name] = policy
        self._touch("acl_policies")

    def delete_acl_policy(self, name: str) -> None:
        table = self._m("acl_policies")
        if name in table:
            del table[name]
            self._touch("acl_policies")

    def put_acl_token(self, token: ACLTokenRecord) -> None:
        """Store ``token`` and index it by its secret's hash (its old hash, if the secret
        changed, stops finding it in the same transaction)."""
        old = self.acl_token(token.accessor_id)
        by_hash = self._m("acl_tokens_by_hash")
        if old is not None and old.secret_hash != token.secret_hash:
            del by_hash[old.secret_hash]
        self._m("acl_tokens")[token.accessor_id] = token
        by_hash[token.secret_hash] = token.accessor_id
        self._touch("acl_tokens")

    def delete_acl_token(self, accessor_id: str) -> None:
        old = self.acl_token(accessor_id)
        if old is None:
            return
        del self._m("acl_tokens")[accessor_id]
        del self._m("acl_tokens_by_hash")[old.secret_hash]
        self._touch("acl_tokens")

    # -- deployments -------------------------------------------------------------------
    def put_deployment(self, deployment: Deployment) -> None:
        self._m("deployments")[deployment.id] = deployment
        self._wrote("deployments", deployment.id)
        self._index_add("deployments_by_job", (deployment.namespace, deployment.job_id), deployment.id)
        self._touch("deployments")

    def delete_deployment(self, deployment_id: str) -> None:
        old = self.deployment(deployment_id)
        if old is None:
            return
        del self._m("deployments")[deployment_id]
        self._wrote("deployments", deployment_id)
        self._index_remove("deployments_by_job", (old.namespace, old.job_id), deployment_id)
        self._touch("deployments")

    def set_acl_bootstrap_index(self, index: int) -> None:
        self._scalars["acl_bootstrap_index"] = index
        self._touch("acl_tokens")

    # -- commit ------------------------------------------------------------------------
    def _job_status(self, key: JobKey, job: Job) -> str:
        """Nomad's getJobStatus, from counters instead of a scan of the job's allocs.

        The status is always derived here from state, never taken from the submitted job:
        a child registered with a stale "running" status (docs/field-reports.md#field-report-2)
        cannot skew counts.
        """
        if job.type == JOB_TYPE_SYSTEM or job.is_template():
            return JOB_STATUS_DEAD if job.stop else JOB_STATUS_RUNNING
        if self._m("live_allocs_by_job").get(key, 0) > 0:
            return JOB_STATUS_RUNNING
        evals = self.evals_of_job(key)
        if any(not ev.terminal() for ev in evals):
            return JOB_STATUS_PENDING
        if job.stop or evals or key in self._m("allocs_by_job"):
            return JOB_STATUS_DEAD
        return JOB_STATUS_PENDING

    def _settle_job_status(self) -> None:
        for key in sorted(self._status_dirty):
            job = self.job(key)
            if job is None:
                continue
            status = self._job_status(key, job)
            if status != job.status:
                self._m("jobs")[key] = replace(job, status=status, modify_index=self.index)
                self._wrote("jobs", key)
                self._touch("jobs")
                if job.parent_id:
                    self._children_delta(
                        job.namespace, job.parent_id, job.status or JOB_STATUS_PENDING, status
                    )

    def commit(self) -> Tables:
        self._settle_job_status()
        updates: dict[str, Any] = {name: mut.finish() for name, mut in self._maps.items()}
        updates.update(self._scalars)
        if self._touched_tables:
            ti = self.base.table_index.mutate()
            for name in self._touched_tables:
                ti[name] = self.index
            updates["table_index"] = ti.finish()
        return replace(self.base, index=self.index, **updates)
