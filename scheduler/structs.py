"""drover's domain model: the values the schedulers reason about and the state store keeps.

Every record is a frozen, slotted dataclass: a snapshot of the state store shares these
objects with the live store, so nobody may change one in place; derive a new value with
``dataclasses.replace``. Field names match ``proto/drover/v1/structs.proto`` one for one
(``server/codec.py`` converts by reflection). Durations are nanoseconds, times are Unix
nanoseconds: the scheduler never reads a clock, the caller passes ``now``.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Final, Protocol

# The task state is the one record the client agent reports and the servers keep, defined
# once for both in a pure module the scheduler may import (tests/unit/test_purity.py).
from drover.common.taskstate import TaskEvent as TaskEvent
from drover.common.taskstate import TaskState as TaskState

# ---------------------------------------------------------------------------------------
# Vocabulary. Strings, as in Nomad's API, so logs and JSON read the same everywhere.

JOB_TYPE_SERVICE: Final = "service"
JOB_TYPE_BATCH: Final = "batch"
JOB_TYPE_SYSTEM: Final = "system"
JOB_TYPE_SYSBATCH: Final = "sysbatch"
JOB_TYPES: Final = (JOB_TYPE_SERVICE, JOB_TYPE_BATCH, JOB_TYPE_SYSTEM, JOB_TYPE_SYSBATCH)

JOB_STATUS_PENDING: Final = "pending"
JOB_STATUS_RUNNING: Final = "running"
JOB_STATUS_DEAD: Final = "dead"

NODE_STATUS_INIT: Final = "initializing"
NODE_STATUS_READY: Final = "ready"
NODE_STATUS_DOWN: Final = "down"
NODE_STATUS_DISCONNECTED: Final = "disconnected"
NODE_STATUSES: Final = (NODE_STATUS_INIT, NODE_STATUS_READY, NODE_STATUS_DOWN, NODE_STATUS_DISCONNECTED)

NODE_ELIGIBLE: Final = "eligible"
NODE_INELIGIBLE: Final = "ineligible"
NODE_ELIGIBILITIES: Final = (NODE_ELIGIBLE, NODE_INELIGIBLE)

ALLOC_DESIRED_RUN: Final = "run"
ALLOC_DESIRED_STOP: Final = "stop"
ALLOC_DESIRED_EVICT: Final = "evict"

ALLOC_CLIENT_PENDING: Final = "pending"
ALLOC_CLIENT_RUNNING: Final = "running"
ALLOC_CLIENT_COMPLETE: Final = "complete"
ALLOC_CLIENT_FAILED: Final = "failed"
ALLOC_CLIENT_LOST: Final = "lost"
ALLOC_CLIENT_UNKNOWN: Final = "unknown"
ALLOC_CLIENT_STATUSES: Final = (
    ALLOC_CLIENT_PENDING,
    ALLOC_CLIENT_RUNNING,
    ALLOC_CLIENT_COMPLETE,
    ALLOC_CLIENT_FAILED,
    ALLOC_CLIENT_LOST,
    ALLOC_CLIENT_UNKNOWN,
)
ALLOC_CLIENT_TERMINAL: Final = frozenset({ALLOC_CLIENT_COMPLETE, ALLOC_CLIENT_FAILED, ALLOC_CLIENT_LOST})

EVAL_STATUS_PENDING: Final = "pending"
EVAL_STATUS_COMPLETE: Final = "complete"
EVAL_STATUS_FAILED: Final = "failed"
EVAL_STATUS_BLOCKED: Final = "blocked"
EVAL_STATUS_CANCELED: Final = "canceled"
EVAL_TERMINAL: Final = frozenset({EVAL_STATUS_COMPLETE, EVAL_STATUS_FAILED, EVAL_STATUS_CANCELED})

TRIGGER_JOB_REGISTER: Final = "job-register"
TRIGGER_JOB_DEREGISTER: Final = "job-deregister"
TRIGGER_NODE_UPDATE: Final = "node-update"
TRIGGER_NODE_DRAIN: Final = "node-drain"
TRIGGER_RETRY_FAILED_ALLOC: Final = "alloc-failure"
TRIGGER_PERIODIC_JOB: Final = "periodic-job"
TRIGGER_ROLLING_UPDATE: Final = "rolling-update"
TRIGGER_QUEUED_ALLOCS: Final = "queued-allocs"
TRIGGER_FAILED_FOLLOW_UP: Final = "failed-eval-follow-up"
TRIGGER_DEPLOYMENT_WATCHER: Final = "deployment-watcher"
TRIGGER_JOB_SCALING: Final = "job-scaling"
TRIGGER_ALLOC_STOP: Final = "alloc-stop"

# How a client decides an alloc of a deployment is healthy (UpdateStrategy.health_check).
HEALTH_CHECK_TASK_STATES: Final = "task_states"  # every task running for min_healthy_time
HEALTH_CHECK_CHECKS: Final = "checks"  # the tasks, and every service check passing as long
HEALTH_CHECK_MANUAL: Final = "manual"  # an operator says (`drover deployment alloc-health`)
HEALTH_CHECK_MODES: Final = (HEALTH_CHECK_TASK_STATES, HEALTH_CHECK_CHECKS, HEALTH_CHECK_MANUAL)

# An alloc's deployment health (AllocDeploymentStatus.health): unset until the client decides.
HEALTH_UNSET: Final = ""
HEALTH_HEALTHY: Final = "healthy"
HEALTH_UNHEALTHY: Final = "unhealthy"

# Service check kinds the client runs (ServiceCheck.type).
CHECK_HTTP: Final = "http"
CHECK_TCP: Final = "tcp"
CHECK_SCRIPT: Final = "script"
CHECK_TYPES: Final = (CHECK_HTTP, CHECK_TCP, CHECK_SCRIPT)

DEPLOYMENT_STATUS_RUNNING: Final = "running"
DEPLOYMENT_STATUS_PAUSED: Final = "paused"
DEPLOYMENT_STATUS_FAILED: Final = "failed"
DEPLOYMENT_STATUS_SUCCESSFUL: Final = "successful"
DEPLOYMENT_STATUS_CANCELLED: Final = "cancelled"
DEPLOYMENT_STATUSES: Final = (
    DEPLOYMENT_STATUS_RUNNING,
    DEPLOYMENT_STATUS_PAUSED,
    DEPLOYMENT_STATUS_FAILED,
    DEPLOYMENT_STATUS_SUCCESSFUL,
    DEPLOYMENT_STATUS_CANCELLED,
)
# Active: the deployment still decides how its job's allocs roll (Nomad's Active()).
DEPLOYMENT_ACTIVE: Final = frozenset({DEPLOYMENT_STATUS_RUNNING, DEPLOYMENT_STATUS_PAUSED})
# Nomad's status descriptions, word for word: operators grep for them.
DEPLOYMENT_DESC_RUNNING: Final = "Deployment is running"
DEPLOYMENT_DESC_NEEDS_PROMOTION: Final = "Deployment is running but requires manual promotion"
DEPLOYMENT_DESC_AUTO_PROMOTION: Final = "Deployment is running pending automatic promotion"
DEPLOYMENT_DESC_PAUSED: Final = "Deployment is paused"
DEPLOYMENT_DESC_SUCCESSFUL: Final = "Deployment completed successfully"
DEPLOYMENT_DESC_STOPPED_JOB: Final = "Cancelled because job is stopped"
DEPLOYMENT_DESC_NEWER_JOB: Final = "Cancelled due to newer version of job"
DEPLOYMENT_DESC_UNHEALTHY: Final = "Failed due to unhealthy allocations"
DEPLOYMENT_DESC_PROGRESS_DEADLINE: Final = "Failed due to progress deadline"
DEPLOYMENT_DESC_MARKED_FAILED: Final = "Deployment marked as failed"

# How a reschedule's delay grows from one attempt to the next (ReschedulePolicy.delay_function).
DELAY_CONSTANT: Final = "constant"
DELAY_EXPONENTIAL: Final = "exponential"
DELAY_FIBONACCI: Final = "fibonacci"
DELAY_FUNCTION_NAMES: Final = (DELAY_CONSTANT, DELAY_EXPONENTIAL, DELAY_FIBONACCI)

# Which copy a reconnect keeps when an original and its replacement both run
# (DisconnectStrategy.reconcile).
RECONCILE_BEST_SCORE: Final = "best_score"
RECONCILE_KEEP_ORIGINAL: Final = "keep_original"
RECONCILE_KEEP_REPLACEMENT: Final = "keep_replacement"
RECONCILE_LONGEST_RUNNING: Final = "longest_running"
RECONCILE_MODES: Final = (
    RECONCILE_BEST_SCORE,
    RECONCILE_KEEP_ORIGINAL,
    RECONCILE_KEEP_REPLACEMENT,
    RECONCILE_LONGEST_RUNNING,
)

SCHEDULER_ALGORITHM_BINPACK: Final = "binpack"
SCHEDULER_ALGORITHM_SPREAD: Final = "spread"

DEFAULT_NAMESPACE: Final = "default"
# Node pools (Nomad 1.6): a node without one is in "default"; a job in "all" may use any node.
NODE_POOL_DEFAULT: Final = "default"
NODE_POOL_ALL: Final = "all"
DEFAULT_PRIORITY: Final = 50
MIN_PRIORITY: Final = 1
MAX_PRIORITY: Final = 100

# ---------------------------------------------------------------------------------------
# Jobs


@dataclass(frozen=True, slots=True)
class Resources:
    """``memory_max_mb`` (0: no oversubscription) is the hard limit a task may grow to; the
    scheduler places on ``memory_mb``. ``cores`` reserves whole cores: the scheduler counts
    them as ``cores`` times the node's per-core MHz, and a task sets cpu or cores, not both."""

    cpu_mhz: int = 100
    memory_mb: int = 300
    disk_mb: int = 0
    memory_max_mb: int = 0
    cores: int = 0


@dataclass(frozen=True, slots=True)
class Port:
    label: str = ""
    value: int = 0
    to: int = 0


@dataclass(frozen=True, slots=True)
class NetworkResource:
    reserved_ports: tuple[Port, ...] = ()
    dynamic_ports: tuple[Port, ...] = ()
    mbits: int = 0
    # Nomad's network mode: only "host" exists here ("" is the same); no network namespaces.
    mode: str = ""


@dataclass(frozen=True, slots=True)
class Constraint:
    attribute: str = ""
    operator: str = "="
    value: str = ""


@dataclass(frozen=True, slots=True)
class Affinity:
    attribute: str = ""
    operator: str = "="
    value: str = ""
    weight: int = 50


@dataclass(frozen=True, slots=True)
class SpreadTarget:
    """``target "x" { percent = N }``: N percent of the group's allocs on nodes whose
    attribute is x (Nomad's spread.go)."""

    value: str = ""
    percent: int = 0


@dataclass(frozen=True, slots=True)
class Spread:
    attribute: str = ""
    weight: int = 50
    targets: tuple[SpreadTarget, ...] = ()


@dataclass(frozen=True, slots=True)
class MigrateStrategy:
    """How a draining node's allocs of a group move (Nomad's ``migrate`` block): at most
    ``max_parallel`` at a time, the next once a replacement has settled: every task running
    for ``min_healthy_time`` (with ``health_check = "checks"``, every service check passing
    for as long too), a deployment verdict, or ``healthy_deadline`` passed
    (scheduler/reconciler/migrate.py)."""

    max_parallel: int = 1
    health_check: str = "checks"
    min_healthy_time_ns: int = 10_000_000_000
    healthy_deadline_ns: int = 300_000_000_000


@dataclass(frozen=True, slots=True)
class ScalingPolicy:
    """A group's ``scaling`` block: the bounds ``job scale`` keeps to. ``policy_json`` is
    kept for an autoscaler (there is none in drover)."""

    min: int = 0
    max: int = 0
    enabled: bool = True
    policy_json: str = ""


@dataclass(frozen=True, slots=True)
class UpdateStrategy:
    """A group's ``update`` block. ``max_parallel = 0`` means no deployment: every change
    goes at once. For service jobs ``stagger`` is not used (the next batch waits for health,
    as in Nomad 1.11); system jobs wait for both."""

    max_parallel: int = 1
    stagger_ns: int = 30_000_000_000
    min_healthy_time_ns: int = 10_000_000_000
    healthy_deadline_ns: int = 300_000_000_000
    auto_revert: bool = False
    canary: int = 0
    auto_promote: bool = False
    progress_deadline_ns: int = 600_000_000_000
    health_check: str = HEALTH_CHECK_TASK_STATES

    def is_empty(self) -> bool:
        """No rolling: Nomad's IsEmpty (max_parallel 0), no deployment is made."""
        return self.max_parallel == 0


@dataclass(frozen=True, slots=True)
class ReschedulePolicy:
    attempts: int = 0
    interval_ns: int = 0
    delay_ns: int = 30_000_000_000
    delay_function: str = DELAY_EXPONENTIAL
    max_delay_ns: int = 3_600_000_000_000
    unlimited: bool = True


@dataclass(frozen=True, slots=True)
class RestartPolicy:
    attempts: int = 2
    interval_ns: int = 1_800_000_000_000
    delay_ns: int = 15_000_000_000
    mode: str = "fail"


@dataclass(frozen=True, slots=True)
class PeriodicConfig:
    """When a periodic job launches: ``spec`` (one cron) or ``specs`` (several, Nomad's
    ``crons``), in the IANA ``time_zone``; scheduler/periodic.py evaluates them."""

    enabled: bool = True
    spec: str = ""
    time_zone: str = "UTC"
    prohibit_overlap: bool = False
    specs: tuple[str, ...] = ()

    def schedules(self) -> tuple[str, ...]:
        """Every cron expression of the job; it launches at the earliest next one."""
        return ((self.spec,) if self.spec else ()) + self.specs


@dataclass(frozen=True, slots=True)
class ParameterizedConfig:
    payload: str = "optional"
    meta_required: tuple[str, ...] = ()
    meta_optional: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class DisconnectStrategy:
    """What happens to a group's allocs when their node stops heartbeating
    (docs/field-reports.md#field-report-3)."""

    lost_after_ns: int = 0
    reconcile: str = RECONCILE_BEST_SCORE
    replace: bool = True
    stop_on_client_after_ns: int = 0


@dataclass(frozen=True, slots=True)
class CheckRestart:
    """A check's ``check_restart`` (Nomad's): ``limit`` failing results in a row, once
    ``grace_ns`` has passed since the task (re)started, restart the task through its restart
    policy (``limit`` 0: never); ``ignore_warnings`` counts a warning as passing."""

    limit: int = 0
    grace_ns: int = 1_000_000_000
    ignore_warnings: bool = False


# A check's status as its client reports it (AllocCheckStatus.status), and a
# registration's health (ServiceRegistration.health), which adds "pending": a check of the
# service has no result yet.
CHECK_PASSING: Final = "passing"
CHECK_WARNING: Final = "warning"
CHECK_CRITICAL: Final = "critical"
CHECK_PENDING: Final = "pending"
CHECK_STATUSES: Final = (CHECK_PASSING, CHECK_WARNING, CHECK_CRITICAL)


@dataclass(frozen=True, slots=True)
class AllocCheckStatus:
    """One check's latest status in an alloc, reported by its client: ``task`` is the
    task of a task-level service ("" for a group's), ``service`` its name as written."""

    task: str = ""
    service: str = ""
    check: str = ""
    status: str = ""
    output: str = ""
    timestamp_ns: int = 0


class HasCheckStatus(Protocol):
    """A check status as a record (``AllocCheckStatus``) or as the message a client sent."""

    @property
    def status(self) -> str: ...


def all_checks_passing(statuses: Collection[HasCheckStatus], expected: int) -> bool:
    """An alloc is healthy by its checks when at least ``expected`` of them have reported
    and every one passes: the one rule behind a drain's ``health_check = "checks"``
    (scheduler/reconciler/migrate.py) and the drain eval a report that makes them pass
    brings (server/endpoints.py)."""
    return len(statuses) >= expected and all(s.status == CHECK_PASSING for s in statuses)


@dataclass(frozen=True, slots=True)
class ServiceCheck:
    """One ``check`` of a ``service { provider = "nomad" }`` block, run by the client.
    ``port`` is a port label of the group's network (http, tcp); ``command``/``args`` run
    in the task's environment (script, ``task`` names the task for a group service)."""

    name: str = ""
    type: str = CHECK_HTTP
    port: str = ""
    path: str = "/"
    method: str = "GET"
    protocol: str = "http"
    command: str = ""
    args: tuple[str, ...] = ()
    task: str = ""
    interval_ns: int = 10_000_000_000
    timeout_ns: int = 2_000_000_000
    check_restart: CheckRestart | None = None


# A service's address_mode (Nomad's): which address and port a registration carries. Tasks
# share the host's network here, so "auto" and "host" both give the node's address and the
# host port; "alloc" gives the port's ``to`` (the port the task binds) where one is set.
ADDRESS_MODE_AUTO: Final = "auto"
ADDRESS_MODE_HOST: Final = "host"
ADDRESS_MODE_ALLOC: Final = "alloc"
ADDRESS_MODES: Final = (ADDRESS_MODE_AUTO, ADDRESS_MODE_HOST, ADDRESS_MODE_ALLOC)


@dataclass(frozen=True, slots=True)
class Service:
    name: str = ""
    provider: str = "nomad"
    port: str = ""
    tags: tuple[str, ...] = ()
    checks: tuple[ServiceCheck, ...] = ()
    address_mode: str = ADDRESS_MODE_AUTO


@dataclass(frozen=True, slots=True)
class ServiceRegistration:
    """One running alloc's instance of a ``service { provider = "nomad" }`` (Nomad's
    ServiceRegistration), derived by the FSM from the alloc, its job version and its node
    (server/services/registrations.py); ``task`` is empty for a group service."""

    id: str = ""
    service_name: str = ""
    namespace: str = DEFAULT_NAMESPACE
    node_id: str = ""
    datacenter: str = ""
    job_id: str = ""
    alloc_id: str = ""
    task: str = ""
    tags: tuple[str, ...] = ()
    address: str = ""
    port: int = 0
    create_index: int = 0
    modify_index: int = 0
    health: str = CHECK_PASSING
    checks: tuple[AllocCheckStatus, ...] = ()


# Task lifecycle hooks (Nomad's): a task without a lifecycle block is a main task.
HOOK_PRESTART: Final = "prestart"
HOOK_POSTSTART: Final = "poststart"
HOOK_POSTSTOP: Final = "poststop"
LIFECYCLE_HOOKS: Final = (HOOK_PRESTART, HOOK_POSTSTART, HOOK_POSTSTOP)
# The signals a task's kill_signal may name (the client maps the name to the OS's number).
KILL_SIGNALS: Final = ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2", "SIGKILL")


@dataclass(frozen=True, slots=True)
class TaskLifecycle:
    hook: str = ""
    sidecar: bool = False


# A template's change_mode (Nomad's): what the client does when a re-render changes the file.
CHANGE_MODE_RESTART: Final = "restart"
CHANGE_MODE_SIGNAL: Final = "signal"
CHANGE_MODE_NOOP: Final = "noop"
CHANGE_MODES: Final = (CHANGE_MODE_RESTART, CHANGE_MODE_SIGNAL, CHANGE_MODE_NOOP)


@dataclass(frozen=True, slots=True)
class Template:
    """A ``template`` block: ``data`` or ``source`` rendered to ``destination`` (relative to
    the task's directory) by the client (client_agent/templates.py)."""

    data: str = ""
    source: str = ""
    destination: str = ""
    change_mode: str = CHANGE_MODE_RESTART
    change_signal: str = ""
    env: bool = False
    perms: str = ""
    # A re-render's action waits a random time in [0, splay); wait: quiet for min, at most max.
    splay_ns: int = 0
    wait_min_ns: int = 0
    wait_max_ns: int = 0
    left_delimiter: str = ""
    right_delimiter: str = ""


# An artifact's mode (go-getter's): "" is "any".
ARTIFACT_MODES: Final = ("any", "file", "dir")


@dataclass(frozen=True, slots=True)
class Artifact:
    """An ``artifact`` block: a path on the node (or ``file://`` URL) copied into the task's
    directory before its first start."""

    source: str = ""
    destination: str = ""
    mode: str = ""


@dataclass(frozen=True, slots=True)
class DispatchPayload:
    file: str = ""


@dataclass(frozen=True, slots=True)
class Task:
    name: str = ""
    driver: str = "mock"
    config_json: str = "{}"
    resources: Resources | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    constraints: tuple[Constraint, ...] = ()
    kill_timeout_ns: int = 5_000_000_000
    leader: bool = False
    meta: Mapping[str, str] = field(default_factory=dict)
    services: tuple[Service, ...] = ()
    lifecycle: TaskLifecycle | None = None
    kill_signal: str = ""
    shutdown_delay_ns: int = 0
    restart: RestartPolicy | None = None
    user: str = ""
    templates: tuple[Template, ...] = ()
    artifacts: tuple[Artifact, ...] = ()
    dispatch_payload: DispatchPayload | None = None


@dataclass(frozen=True, slots=True)
class TaskGroup:
    name: str = ""
    count: int = 1
    tasks: tuple[Task, ...] = ()
    constraints: tuple[Constraint, ...] = ()
    affinities: tuple[Affinity, ...] = ()
    spreads: tuple[Spread, ...] = ()
    network: NetworkResource | None = None
    update: UpdateStrategy | None = None
    reschedule: ReschedulePolicy | None = None
    restart: RestartPolicy | None = None
    disconnect: DisconnectStrategy | None = None
    ephemeral_disk_mb: int = 300
    meta: Mapping[str, str] = field(default_factory=dict)
    services: tuple[Service, ...] = ()
    migrate: MigrateStrategy | None = None
    scaling: ScalingPolicy | None = None
    max_run_duration_ns: int = 0

    def total_resources(self, mhz_per_core: int = 0) -> Resources:
        """What one alloc of this group asks of a node: the sum of its tasks, a task's
        ``cores`` counted as that many times the node's ``mhz_per_core``
        (``fit.cpu_per_core_mhz``), as Nomad counts reserved cores' CPU shares."""
        cpu = mem = cores = 0
        for task in self.tasks:
            res = task.resources or Resources()
            cpu += res.cpu_mhz
            mem += res.memory_mb
            cores += res.cores
        return Resources(
            cpu_mhz=cpu + cores * mhz_per_core, memory_mb=mem, disk_mb=self.ephemeral_disk_mb, cores=cores
        )


# The Job fields the servers set (the FSM, on register), never the submitter: not part of a
# job's spec, so spec comparisons (the FSM's "did it change", the CLI's version diff) skip them.
JOB_BOOKKEEPING_FIELDS: Final = frozenset(
    {
        "status",
        "status_description",
        "version",
        "stable",
        "submit_time_ns",
        "create_index",
        "modify_index",
        "job_modify_index",
    }
)


@dataclass(frozen=True, slots=True)
class Job:
    id: str = ""
    name: str = ""
    namespace: str = DEFAULT_NAMESPACE
    type: str = JOB_TYPE_SERVICE
    priority: int = DEFAULT_PRIORITY
    datacenters: tuple[str, ...] = ("dc1",)
    constraints: tuple[Constraint, ...] = ()
    affinities: tuple[Affinity, ...] = ()
    spreads: tuple[Spread, ...] = ()
    groups: tuple[TaskGroup, ...] = ()
    update: UpdateStrategy | None = None
    periodic: PeriodicConfig | None = None
    parameterized: ParameterizedConfig | None = None
    meta: Mapping[str, str] = field(default_factory=dict)
    parent_id: str = ""
    payload: bytes = b""
    stop: bool = False
    status: str = ""
    status_description: str = ""
    version: int = 0
    stable: bool = False
    dispatched: bool = False
    dispatch_idempotency_token: str = ""
    # Only nodes of this pool are fed to the scheduler ("all": any node's).
    node_pool: str = ""
    # The job-wide policies a group without its own inherits (canonicalize_job copies them).
    migrate: MigrateStrategy | None = None
    reschedule: ReschedulePolicy | None = None
    submit_time_ns: int = 0
    create_index: int = 0
    modify_index: int = 0
    job_modify_index: int = 0

    def lookup_group(self, name: str) -> TaskGroup | None:
        for group in self.groups:
            if group.name == name:
                return group
        return None

    def is_periodic(self) -> bool:
        """Has a periodic block, enabled or not (Nomad's IsPeriodic): a disabled periodic
        job is paused, it does not run as a plain batch job."""
        return self.periodic is not None

    def is_parameterized(self) -> bool:
        return self.parameterized is not None and not self.dispatched

    def is_periodic_active(self) -> bool:
        """The periodic dispatcher launches children for it (Nomad's IsPeriodicActive)."""
        return (
            self.periodic is not None
            and self.periodic.enabled
            and not self.stop
            and not self.is_parameterized()
        )

    def is_template(self) -> bool:
        """Periodic and parameterized parents are templates: their children run, they don't."""
        return self.is_periodic() or self.is_parameterized()


# ---------------------------------------------------------------------------------------
# Nodes


@dataclass(frozen=True, slots=True)
class DrainStrategy:
    deadline_ns: int = 3_600_000_000_000
    ignore_system_jobs: bool = False
    force_deadline_at_ns: int = 0
    started_at_ns: int = 0


@dataclass(frozen=True, slots=True)
class NodeEvent:
    message: str = ""
    subsystem: str = ""
    details: Mapping[str, str] = field(default_factory=dict)
    timestamp_ns: int = 0
    create_index: int = 0


@dataclass(frozen=True, slots=True)
class NodeResources:
    cpu_mhz: int = 4000
    memory_mb: int = 8192
    disk_mb: int = 100_000
    max_allocs: int = 0
    reserved: Resources | None = None
    reserved_ports: tuple[int, ...] = ()
    min_dynamic_port: int = 20000
    max_dynamic_port: int = 32000


MAX_NODE_EVENTS: Final = 10


@dataclass(frozen=True, slots=True)
class Node:
    id: str = ""
    name: str = ""
    datacenter: str = "dc1"
    node_class: str = ""
    status: str = NODE_STATUS_INIT
    status_description: str = ""
    scheduling_eligibility: str = NODE_ELIGIBLE
    drain_strategy: DrainStrategy | None = None
    attributes: Mapping[str, str] = field(default_factory=dict)
    meta: Mapping[str, str] = field(default_factory=dict)
    resources: NodeResources | None = None
    address: str = ""
    events: tuple[NodeEvent, ...] = ()
    status_updated_at_ns: int = 0
    create_index: int = 0
    modify_index: int = 0
    secret_id: str = ""
    last_missed_heartbeat_index: int = 0
    last_alloc_update_index: int = 0
    # The hash of the node's secret (drover.common.secrets); the secret itself is never kept.
    secret_hash: str = ""
    # The client config's node_pool ("" is the "default" pool).
    node_pool: str = ""

    @property
    def drain(self) -> bool:
        return self.drain_strategy is not None

    def ready_for_placement(self) -> bool:
        return (
            self.status == NODE_STATUS_READY
            and self.scheduling_eligibility == NODE_ELIGIBLE
            and self.drain_strategy is None
        )


# ---------------------------------------------------------------------------------------
# Allocations


@dataclass(frozen=True, slots=True)
class AllocatedPort:
    label: str = ""
    value: int = 0
    to: int = 0
    host_ip: str = ""


@dataclass(frozen=True, slots=True)
class AllocatedResources:
    cpu_mhz: int = 0
    memory_mb: int = 0
    disk_mb: int = 0
    ports: tuple[AllocatedPort, ...] = ()


@dataclass(frozen=True, slots=True)
class DesiredTransition:
    """What an operator asked to happen to an alloc next; the scheduler acts on it at its
    next evaluation of the job (Nomad's DesiredTransition)."""

    # Stop it and place a replacement (``drover alloc stop``): the migrate bucket, as a drain.
    migrate: bool = False


@dataclass(frozen=True, slots=True)
class AllocStateChange:
    field: str = ""
    value: str = ""
    time_ns: int = 0


@dataclass(frozen=True, slots=True)
class RescheduleEvent:
    reschedule_time_ns: int = 0
    prev_alloc_id: str = ""
    prev_node_id: str = ""
    delay_ns: int = 0


@dataclass(frozen=True, slots=True)
class AllocDeploymentStatus:
    """The client's verdict on an alloc of a deployment (Nomad's AllocDeploymentStatus).
    ``health`` is HEALTH_UNSET until the client decides; ``canary`` is set by the scheduler
    on a canary and cleared by promotion."""

    health: str = HEALTH_UNSET
    timestamp_ns: int = 0
    canary: bool = False
    modify_index: int = 0

    def is_healthy(self) -> bool:
        return self.health == HEALTH_HEALTHY

    def is_unhealthy(self) -> bool:
        return self.health == HEALTH_UNHEALTHY


@dataclass(frozen=True, slots=True)
class NodeScoreMeta:
    """One ranked node of a placement: each scorer's value and the final normalised score."""

    node_id: str = ""
    scores: Mapping[str, float] = field(default_factory=dict)
    norm_score: float = 0.0


@dataclass(frozen=True, slots=True)
class AllocMetric:
    """How a placement was decided (Nomad's AllocMetric): how many nodes were looked at,
    why the others were filtered or exhausted, and the best nodes' scores by component.
    ``constraint_filtered`` and ``dimension_exhausted`` are keyed by a reason an operator
    reads ("missing drivers", "constraint ${attr.kernel.name} = linux", "memory")."""

    nodes_evaluated: int = 0
    nodes_filtered: int = 0
    nodes_in_pool: int = 0
    nodes_available: Mapping[str, int] = field(default_factory=dict)
    class_filtered: Mapping[str, int] = field(default_factory=dict)
    constraint_filtered: Mapping[str, int] = field(default_factory=dict)
    nodes_exhausted: int = 0
    class_exhausted: Mapping[str, int] = field(default_factory=dict)
    dimension_exhausted: Mapping[str, int] = field(default_factory=dict)
    score_meta_data: tuple[NodeScoreMeta, ...] = ()
    allocation_time_ns: int = 0
    coalesced_failures: int = 0


@dataclass(frozen=True, slots=True)
class Allocation:
    id: str = ""
    namespace: str = DEFAULT_NAMESPACE
    eval_id: str = ""
    name: str = ""
    node_id: str = ""
    node_name: str = ""
    job_id: str = ""
    job_version: int = 0
    task_group: str = ""
    resources: AllocatedResources | None = None
    desired_status: str = ALLOC_DESIRED_RUN
    desired_description: str = ""
    client_status: str = ALLOC_CLIENT_PENDING
    client_description: str = ""
    task_states: Mapping[str, TaskState] = field(default_factory=dict)
    state_history: tuple[AllocStateChange, ...] = ()
    previous_allocation: str = ""
    next_allocation: str = ""
    reschedule_events: tuple[RescheduleEvent, ...] = ()
    followup_eval_id: str = ""
    create_index: int = 0
    modify_index: int = 0
    alloc_modify_index: int = 0
    create_time_ns: int = 0
    modify_time_ns: int = 0
    index: int = 0
    deployment_id: str = ""
    deployment_status: AllocDeploymentStatus | None = None
    metrics: AllocMetric | None = None
    desired_transition: DesiredTransition | None = None
    check_statuses: tuple[AllocCheckStatus, ...] = ()

    def should_migrate(self) -> bool:
        """An operator asked for this alloc to be stopped and replaced."""
        return self.desired_transition is not None and self.desired_transition.migrate

    def terminal(self) -> bool:
        """No longer holds resources: told to stop, or finished on its own."""
        return self.desired_status != ALLOC_DESIRED_RUN or self.client_status in ALLOC_CLIENT_TERMINAL

    def client_terminal(self) -> bool:
        return self.client_status in ALLOC_CLIENT_TERMINAL


def alloc_name(job_id: str, group: str, index: int) -> str:
    """Nomad's naming: ``job.group[i]``, stable across replacements of the same slot."""
    return f"{job_id}.{group}[{index}]"


# ---------------------------------------------------------------------------------------
# Evaluations, plans and summaries


@dataclass(frozen=True, slots=True)
class Evaluation:
    id: str = ""
    namespace: str = DEFAULT_NAMESPACE
    priority: int = DEFAULT_PRIORITY
    type: str = JOB_TYPE_SERVICE
    triggered_by: str = TRIGGER_JOB_REGISTER
    job_id: str = ""
    job_modify_index: int = 0
    node_id: str = ""
    node_modify_index: int = 0
    status: str = EVAL_STATUS_PENDING
    status_description: str = ""
    wait_ns: int = 0
    wait_until_ns: int = 0
    next_eval: str = ""
    previous_eval: str = ""
    blocked_eval: str = ""
    queued_allocations: Mapping[str, int] = field(default_factory=dict)
    failed_tg_allocs: Mapping[str, str] = field(default_factory=dict)
    annotate_plan: bool = False
    snapshot_index: int = 0
    create_index: int = 0
    modify_index: int = 0
    create_time_ns: int = 0
    modify_time_ns: int = 0
    deployment_id: str = ""
    # Per group that could not be placed: how the nodes were filtered and exhausted.
    failed_tg_metrics: Mapping[str, AllocMetric] = field(default_factory=dict)

    def terminal(self) -> bool:
        return self.status in EVAL_TERMINAL


def job_eval(eval_id: str, job: Job, triggered_by: str, now_ns: int, node_id: str = "") -> Evaluation:
    """A new pending evaluation of ``job``, created at ``now_ns`` (every writer's shape)."""
    return Evaluation(
        id=eval_id,
        namespace=job.namespace,
        priority=job.priority,
        type=job.type,
        triggered_by=triggered_by,
        job_id=job.id,
        node_id=node_id,
        status=EVAL_STATUS_PENDING,
        create_time_ns=now_ns,
        modify_time_ns=now_ns,
    )


def follow_up_eval(
    ev: Evaluation,
    eval_id: str,
    triggered_by: str,
    now_ns: int,
    *,
    job: Job | None = None,
    status: str = EVAL_STATUS_PENDING,
    wait_until_ns: int = 0,
) -> Evaluation:
    """The evaluation that carries on ``ev``'s work later (Nomad's NextRollingEval,
    CreateBlockedEval and CreateFailedFollowUpEval): a blocked eval for what did not fit, a
    rolling or reschedule eval due at ``wait_until_ns``, a retry of a failed eval. It runs
    at ``ev``'s priority, as the work it continues would have, and ``previous_eval`` points
    back so an operator can follow the chain. ``job`` is the job as the scheduler read it,
    whose modify index says which version the follow-up is for; the leader, which has no
    job at hand, passes none and the eval's own fields stand."""
    return Evaluation(
        id=eval_id,
        namespace=ev.namespace,
        priority=ev.priority,
        type=job.type if job is not None else ev.type,
        triggered_by=triggered_by,
        job_id=ev.job_id,
        job_modify_index=job.job_modify_index if job is not None else ev.job_modify_index,
        status=status,
        wait_until_ns=wait_until_ns,
        previous_eval=ev.id,
        create_time_ns=now_ns,
        modify_time_ns=now_ns,
    )


@dataclass(frozen=True, slots=True)
class TaskGroupSummary:
    queued: int = 0
    complete: int = 0
    failed: int = 0
    running: int = 0
    starting: int = 0
    lost: int = 0
    unknown: int = 0


@dataclass(frozen=True, slots=True)
class JobChildrenSummary:
    pending: int = 0
    running: int = 0
    dead: int = 0


@dataclass(frozen=True, slots=True)
class JobSummary:
    job_id: str = ""
    namespace: str = DEFAULT_NAMESPACE
    summary: Mapping[str, TaskGroupSummary] = field(default_factory=dict)
    children: JobChildrenSummary | None = None
    create_index: int = 0
    modify_index: int = 0


@dataclass(frozen=True, slots=True)
class PeriodicLaunch:
    job_id: str = ""
    namespace: str = DEFAULT_NAMESPACE
    launch_ns: int = 0
    create_index: int = 0
    modify_index: int = 0


@dataclass(frozen=True, slots=True)
class RejectionTrackerConfig:
    """On by default (Nomad's is off). The threshold is below the worker's bound on plan
    attempts without progress (10), so a node the applier keeps rejecting is taken out of
    scheduling within the eval that hit it, and that eval ends (docs/design.md#invariant-6)."""

    enabled: bool = True
    threshold: int = 5
    window_ns: int = 300_000_000_000


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    scheduler_algorithm: str = SCHEDULER_ALGORITHM_BINPACK
    rejection_tracker: RejectionTrackerConfig | None = None
    pause_eval_broker: bool = False
    create_index: int = 0
    modify_index: int = 0


@dataclass(frozen=True, slots=True)
class ServerMember:
    name: str = ""
    raft_address: str = ""
    grpc_address: str = ""
    modify_index: int = 0


# ---------------------------------------------------------------------------------------
# Deployments


@dataclass(frozen=True, slots=True)
class DeploymentState:
    """One group's progress in a deployment (Nomad's DeploymentState). The scheduler sets
    the desired numbers; the state store alone moves the placed/healthy/unhealthy counters,
    from the allocs it commits and the health clients report (so they are exact)."""

    auto_revert: bool = False
    auto_promote: bool = False
    progress_deadline_ns: int = 0
    require_progress_by_ns: int = 0
    promoted: bool = False
    placed_canaries: tuple[str, ...] = ()
    desired_canaries: int = 0
    desired_total: int = 0
    placed_allocs: int = 0
    healthy_allocs: int = 0
    unhealthy_allocs: int = 0


@dataclass(frozen=True, slots=True)
class Deployment:
    """The rollout of one job version: made by the scheduler when a version changes a
    group with an update block, ended by the scheduler (successful, cancelled), the
    deployment watcher (failed) or an operator."""

    id: str = ""
    namespace: str = DEFAULT_NAMESPACE
    job_id: str = ""
    job_version: int = 0
    job_modify_index: int = 0
    job_create_index: int = 0
    task_groups: Mapping[str, DeploymentState] = field(default_factory=dict)
    status: str = DEPLOYMENT_STATUS_RUNNING
    status_description: str = ""
    eval_priority: int = DEFAULT_PRIORITY
    create_index: int = 0
    modify_index: int = 0
    create_time_ns: int = 0
    modify_time_ns: int = 0

    def active(self) -> bool:
        return self.status in DEPLOYMENT_ACTIVE

    def requires_promotion(self) -> bool:
        return any(s.desired_canaries > 0 and not s.promoted for s in self.task_groups.values())


@dataclass(frozen=True, slots=True)
class DeploymentStatusUpdate:
    deployment_id: str = ""
    status: str = ""
    status_description: str = ""


@dataclass(frozen=True, slots=True)
class AllocStop:
    alloc_id: str = ""
    desired_status: str = ALLOC_DESIRED_STOP
    desired_description: str = ""
    client_status: str = ""
    followup_eval_id: str = ""


@dataclass(frozen=True, slots=True)
class Plan:
    """What a scheduler wants changed: the applier re-checks it node by node before commit."""

    eval_id: str = ""
    eval_token: str = ""
    priority: int = DEFAULT_PRIORITY
    job_id: str = ""
    namespace: str = DEFAULT_NAMESPACE
    all_at_once: bool = False
    node_allocation: Mapping[str, tuple[Allocation, ...]] = field(default_factory=dict)
    node_update: Mapping[str, tuple[AllocStop, ...]] = field(default_factory=dict)
    snapshot_index: int = 0
    # A deployment the plan creates or whose desired numbers it changes (committed with
    # the allocs that name it), and status changes of others (cancelled, successful).
    deployment: Deployment | None = None
    deployment_updates: tuple[DeploymentStatusUpdate, ...] = ()

    def is_no_op(self) -> bool:
        return (
            not self.node_allocation
            and not self.node_update
            and self.deployment is None
            and not self.deployment_updates
        )


@dataclass(frozen=True, slots=True)
class PlanResult:
    """What the applier committed. A node of the plan missing here was rejected."""

    node_allocation: Mapping[str, tuple[Allocation, ...]] = field(default_factory=dict)
    node_update: Mapping[str, tuple[AllocStop, ...]] = field(default_factory=dict)
    rejected_nodes: tuple[str, ...] = ()
    refresh_index: int = 0
    alloc_index: int = 0
