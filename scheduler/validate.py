"""Job and node validation, and the canonical form a job takes before it is stored.

Two steps, in this order, on every write path (API register, jobspec run, tests):

1. ``canonicalize_job`` fills in what the wire format cannot say. Protobuf has no "unset"
   for scalars, so a job decoded from the API arrives with ``priority=0``, ``namespace=""``
   and no restart policy; those mean "use the default", and the defaults depend on the job
   type. Canonicalizing is idempotent, so a job may pass through it more than once.
2. ``validate_job`` reports *every* problem at once, each tagged with the field path
   (``job.groups[0].tasks[1].resources.memory_mb``) so a CLI can point at the line and an
   API client can highlight the field. It never fixes anything: that is step 1's job.

Pure: no clock, no I/O. The checks mirror Nomad's ``Job.Validate`` where drover has the
same concept, so a jobspec that Nomad rejects is rejected here too.

Bounds come before meaning. Anyone who reaches a server can send a job or a node, and a
single oversized one used to take the leader down (a group ``count`` of 2**31-1, a 1 MB
node name). So ``validate_job`` and ``validate_node`` first walk the whole record against
``Limits`` (every string, list, map and count; each integer within the protobuf field it
travels in, which a JSON job file can overflow), and only a record within bounds is
checked further: no rule below ever parses, compiles or reports a value of unbounded
size. At most ``MAX_REPORTED_ERRORS`` problems are listed, and a quoted value is cut short.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import re
import typing
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Final

from drover.scheduler._records import replacer
from drover.scheduler.periodic import cron_error, time_zone_error
from drover.scheduler.regexp import regexp_error
from drover.scheduler.structs import (
    ADDRESS_MODES,
    ARTIFACT_MODES,
    CHANGE_MODE_SIGNAL,
    CHANGE_MODES,
    CHECK_HTTP,
    CHECK_SCRIPT,
    CHECK_TCP,
    CHECK_TYPES,
    DEFAULT_NAMESPACE,
    DEFAULT_PRIORITY,
    DELAY_CONSTANT,
    DELAY_EXPONENTIAL,
    DELAY_FUNCTION_NAMES,
    HEALTH_CHECK_MODES,
    HEALTH_CHECK_TASK_STATES,
    JOB_TYPE_BATCH,
    JOB_TYPE_SERVICE,
    JOB_TYPE_SYSBATCH,
    JOB_TYPE_SYSTEM,
    JOB_TYPES,
    KILL_SIGNALS,
    LIFECYCLE_HOOKS,
    MAX_PRIORITY,
    MIN_PRIORITY,
    NODE_ELIGIBILITIES,
    NODE_STATUSES,
    RECONCILE_MODES,
    Affinity,
    Artifact,
    Constraint,
    DisconnectStrategy,
    Job,
    MigrateStrategy,
    NetworkResource,
    Node,
    NodeResources,
    ParameterizedConfig,
    PeriodicConfig,
    ReschedulePolicy,
    Resources,
    RestartPolicy,
    ScalingPolicy,
    Service,
    ServiceCheck,
    Spread,
    Task,
    TaskGroup,
    Template,
    UpdateStrategy,
)

__all__ = [
    "AFFINITY_OPERATORS",
    "ANY_DATACENTER",
    "CONSTRAINT_OPERATORS",
    "DEFAULT_LIMITS",
    "INT32_FIELDS",
    "MAX_JOB_ID_LENGTH",
    "MAX_PAYLOAD_BYTES",
    "MAX_REPORTED_ERRORS",
    "FieldError",
    "Limits",
    "ValidationError",
    "canonicalize_job",
    "default_reschedule_policy",
    "default_restart_policy",
    "default_update_strategy",
    "validate_dispatch",
    "validate_eligibility",
    "validate_job",
    "validate_node",
    "validate_node_status",
]

# A datacenter list of ("*",) places anywhere; it is what an empty list canonicalizes to.
ANY_DATACENTER: Final = "*"
MAX_JOB_ID_LENGTH: Final = 128
# Dispatch payloads ride inside the raft log; Nomad caps them at 16 KiB for the same reason.
MAX_PAYLOAD_BYTES: Final = 16 * 1024

# A node pool's name: Nomad's limit.
MAX_NODE_POOL_LENGTH: Final = 128
# A migrate block's health_check: Nomad's ("task_states" or "checks").
_MIGRATE_HEALTH_CHECKS: Final = ("checks", "task_states")
CONSTRAINT_OPERATORS: Final = frozenset(
    {
        "=",
        "==",
        "!=",
        ">",
        ">=",
        "<",
        "<=",
        "regexp",
        "set_contains",
        "set_contains_any",
        "set_contains_all",
        "version",
        "semver",
        "is_set",
        "is_not_set",
        "distinct_hosts",
        "distinct_property",
    }
)
# Affinities score nodes one at a time; the distinct_* operators only make sense across
# a whole placement, so they are constraints only.
AFFINITY_OPERATORS: Final = CONSTRAINT_OPERATORS - {"distinct_hosts", "distinct_property"}
# Operators that compare the attribute with ``value``: an empty value is almost always a
# forgotten line, as in Nomad ("Operator %q requires an RTarget").
_VALUE_OPERATORS: Final = frozenset(
    {"=", "==", "!=", ">", ">=", "<", "<=", "set_contains", "set_contains_any", "set_contains_all"}
    | {"version", "semver"}
)

_PERIODIC_JOB_TYPES: Final = (JOB_TYPE_BATCH, JOB_TYPE_SYSBATCH)
_SYSTEM_JOB_TYPES: Final = (JOB_TYPE_SYSTEM, JOB_TYPE_SYSBATCH)
_PAYLOAD_MODES: Final = ("optional", "required", "forbidden")
_RESTART_MODES: Final = ("fail", "delay")
# Deployments (and so the update block) exist for jobs that keep running: Nomad's
# "Job type %q does not allow update block".
_UPDATE_JOB_TYPES: Final = (JOB_TYPE_SERVICE, JOB_TYPE_SYSTEM)
# A system job runs one alloc on every node: there is no spare place for a canary.
_NO_SYSTEM_CANARY: Final = "canary is not supported for system jobs"
_SERVICE_PROVIDERS: Final = ("nomad",)
_CHECK_PROTOCOLS: Final = ("http", "https")
_CHECK_METHODS: Final = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")
# Nomad's minCheckInterval: a check that runs more often only loads the task it watches.
_MIN_CHECK_INTERVAL_NS: Final = 1_000_000_000
_BAD_ID_CHARS: Final = re.compile(r"[\s\x00]")
_MAX_PORT: Final = 65535

_SECOND: Final = 1_000_000_000
_HOUR: Final = 3600 * _SECOND


# ---------------------------------------------------------------------------------------
# Bounds


@dataclass(frozen=True, slots=True)
class Limits:
    """What one job or node registration may hold; each bound is refused naming the field.

    The defaults fit every real job and node we know of by an order of magnitude, and keep
    the worst single request to a few MB of state and milliseconds of scheduling per node.
    """

    # Allocations one group asks for (Nomad's ``job_max_count`` idea, per group): the
    # scheduler materialises every one of them in memory.
    max_group_count: int = 10_000
    # IDs, names, datacenters, drivers, port labels and map keys.
    max_name_length: int = 128
    # Any other string: meta, env and attribute values, constraint operands, descriptions.
    max_string_length: int = 4096
    # A task's driver config (JSON text), and how deeply its values may nest.
    max_config_bytes: int = 64 * 1024
    max_config_depth: int = 32
    # Any list: groups, tasks, constraints, affinities, spreads, ports, datacenters, crons.
    max_list_items: int = 256
    # Any map: meta, env, node attributes.
    max_map_entries: int = 512


DEFAULT_LIMITS: Final = Limits()
MAX_REPORTED_ERRORS: Final = 20

_INT32: Final = (-(2**31), 2**31 - 1)
_INT64: Final = (-(2**63), 2**63 - 1)
_UINT64: Final = (0, 2**64 - 1)
# The integer fields that travel as int32 (proto/drover/v1/structs.proto); every other
# ``int`` is an int64, or a uint64 when it is a version or raft index.
# tests/unit/test_validate.py checks this table against the proto descriptors.
INT32_FIELDS: Final = frozenset(
    {
        ("Port", "value"),
        ("Port", "to"),
        ("Affinity", "weight"),
        ("Spread", "weight"),
        ("SpreadTarget", "percent"),
        ("MigrateStrategy", "max_parallel"),
        ("Resources", "cores"),
        ("UpdateStrategy", "max_parallel"),
        ("UpdateStrategy", "canary"),
        ("ReschedulePolicy", "attempts"),
        ("RestartPolicy", "attempts"),
        ("CheckRestart", "limit"),
        ("TaskGroup", "count"),
        ("Job", "priority"),
        ("NodeResources", "max_allocs"),
        ("NodeResources", "reserved_ports"),
        ("NodeResources", "min_dynamic_port"),
        ("NodeResources", "max_dynamic_port"),
    }
)
_UINT64_FIELDS: Final = frozenset(
    {
        "version",
        "create_index",
        "modify_index",
        "job_modify_index",
        "last_missed_heartbeat_index",
        "last_alloc_update_index",
    }
)
# Strings held to ``max_name_length``; the others to ``max_string_length``.
_NAME_FIELDS: Final = frozenset(
    {
        ("Job", "id"),
        ("Job", "name"),
        ("Job", "namespace"),
        ("Job", "type"),
        ("Job", "parent_id"),
        ("Job", "datacenters"),
        ("TaskGroup", "name"),
        ("Task", "name"),
        ("Task", "driver"),
        ("Port", "label"),
        ("Node", "id"),
        ("Node", "name"),
        ("Node", "datacenter"),
        ("Node", "node_class"),
        ("Node", "status"),
        ("Node", "scheduling_eligibility"),
        ("Node", "secret_id"),
        ("Node", "secret_hash"),
    }
)
# Fields with a bound of their own, checked by the rules that read them.
_OWN_BOUND: Final = frozenset({("Task", "config_json"), ("Job", "payload")})

_STR, _INT, _BOOL, _BYTES, _RECORD = range(5)
_Plan = tuple[tuple[str, bool, bool, int, Any], ...]  # (name, is_list, is_map, kind, record type)
_PLANS: dict[type, _Plan] = {}


def _kind(tp: Any) -> tuple[int, Any]:
    if tp is str:
        return _STR, None
    if tp is bool:
        return _BOOL, None
    if tp is int:
        return _INT, None
    if tp is bytes:
        return _BYTES, None
    return _RECORD, tp


def _plan(cls: type) -> _Plan:
    """How to walk one record class: computed once from its type hints."""
    plan = _PLANS.get(cls)
    if plan is not None:
        return plan
    hints = typing.get_type_hints(cls)
    rows = []
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        origin = typing.get_origin(tp)
        args = typing.get_args(tp)
        is_list = origin is tuple
        is_map = origin is Mapping or origin is dict
        if is_list:
            tp = args[0]
        elif is_map:
            tp = args[1]
        elif origin is typing.Union or type(tp).__name__ == "UnionType":
            tp = next(a for a in args if a is not type(None))
        kind, record = _kind(tp)
        rows.append((f.name, is_list, is_map, kind, record))
    plan = tuple(rows)
    _PLANS[cls] = plan
    return plan


def _bounds_errors(record: object, path: str, limits: Limits) -> Iterator[FieldError]:
    """Every bound ``record`` (and what it holds) breaks, outermost first.

    A list or map over its bound is reported once and not looked into, so the walk is
    bounded by the limits, not by the input.
    """
    cls = type(record)
    name = cls.__name__
    for field_name, is_list, is_map, kind, _record in _plan(cls):
        value = getattr(record, field_name)
        if value is None or (name, field_name) in _OWN_BOUND:
            continue
        here = f"{path}.{field_name}"
        if is_list:
            if len(value) > limits.max_list_items:
                yield FieldError(here, f"at most {limits.max_list_items} items, got {len(value)}")
                continue
            for i, item in enumerate(value):
                yield from _value_errors(item, f"{here}[{i}]", name, field_name, kind, limits)
        elif is_map:
            if len(value) > limits.max_map_entries:
                yield FieldError(here, f"at most {limits.max_map_entries} entries, got {len(value)}")
                continue
            for key, item in value.items():
                key_error = _string_error(key, limits.max_name_length)
                if key_error:
                    yield FieldError(here, f"key {_q(key)}: {key_error}")
                    continue
                yield from _value_errors(item, f"{here}[{_q(key)}]", name, field_name, kind, limits)
        else:
            yield from _value_errors(value, here, name, field_name, kind, limits)


def _value_errors(
    value: Any, path: str, cls_name: str, field_name: str, kind: int, limits: Limits
) -> Iterator[FieldError]:
    if kind == _STR:
        longest = (
            limits.max_name_length if (cls_name, field_name) in _NAME_FIELDS else limits.max_string_length
        )
        error = _string_error(value, longest)
        if error:
            yield FieldError(path, error)
    elif kind == _INT:
        low, high = _int_range(cls_name, field_name)
        if cls_name == "TaskGroup" and field_name == "count" and value > limits.max_group_count:
            yield FieldError(
                path,
                f"must be at most {limits.max_group_count} (allocations per group), got {_number(value)}",
            )
        elif value > high:
            yield FieldError(path, f"must be at most {high}, got {_number(value)}")
        elif value < low:
            yield FieldError(path, f"must be at least {low}, got {_number(value)}")
    elif kind == _RECORD:
        yield from _bounds_errors(value, path, limits)


def _int_range(cls_name: str, field_name: str) -> tuple[int, int]:
    if (cls_name, field_name) in INT32_FIELDS:
        return _INT32
    if field_name in _UINT64_FIELDS:
        return _UINT64
    return _INT64


def _string_error(value: str, longest: int) -> str:
    if len(value) > longest:
        return f"must be at most {longest} characters, got {len(value)}"
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return "must be valid UTF-8 text (it holds a lone surrogate)"
    return ""


def _number(value: int) -> str:
    """An integer for a message: a huge one by its size, not its 10,000 digits."""
    if -(10**30) < value < 10**30:
        return str(value)
    return f"an integer of {value.bit_length()} bits"


def _json_depth(text: str) -> int:
    """How deeply ``text``'s JSON arrays and objects nest (brackets in strings ignored)."""
    depth = deepest = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "]}":
            depth -= 1
    return deepest


# ---------------------------------------------------------------------------------------
# Errors


@dataclass(frozen=True, slots=True)
class FieldError:
    """One problem, at one field. ``path`` uses the dataclass field names, e.g. ``job.groups[0].count``."""

    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


class ValidationError(ValueError):
    """Every problem found in one object; ``str()`` joins them as ``path: message; ...``."""

    errors: tuple[FieldError, ...]

    def __init__(self, errors: Iterable[FieldError]) -> None:
        self.errors = tuple(errors)
        super().__init__("; ".join(str(e) for e in self.errors))

    def __reduce__(self) -> tuple[type[ValidationError], tuple[tuple[FieldError, ...]]]:
        # ValueError pickles as cls(*args), and args holds the joined message, not the errors.
        return (type(self), (self.errors,))


def _raise_if_any(errors: Iterable[FieldError]) -> None:
    found = list(itertools.islice(errors, MAX_REPORTED_ERRORS + 1))
    if len(found) > MAX_REPORTED_ERRORS:
        found[-1] = FieldError("...", f"more problems; the first {MAX_REPORTED_ERRORS} are listed")
    if found:
        raise ValidationError(found)


_QUOTE_CHARS: Final = 64


def _q(value: str) -> str:
    """Quote a user value for a one-line message (escapes newlines and quotes), cut short
    when long: a message must never grow with the input."""
    if len(value) > _QUOTE_CHARS:
        return json.dumps(value[:_QUOTE_CHARS]) + f"... ({len(value)} characters)"
    return json.dumps(value)


def _one_of(allowed: Iterable[str], got: str) -> str:
    return f"must be one of {', '.join(_q(a) for a in allowed)}; got {_q(got)}"


# ---------------------------------------------------------------------------------------
# Canonical form


def default_update_strategy(job_type: str) -> UpdateStrategy | None:
    """Only service jobs roll by default (Nomad's api ``Job.Canonicalize``)."""
    return UpdateStrategy() if job_type == JOB_TYPE_SERVICE else None


def default_reschedule_policy(job_type: str) -> ReschedulePolicy | None:
    """Nomad's defaults: batch retries once a day, services forever with backoff.

    System jobs get none: their allocs are tied to a node, so there is nowhere else to go.
    """
    if job_type in _SYSTEM_JOB_TYPES:
        return None
    if job_type == JOB_TYPE_BATCH:
        return ReschedulePolicy(
            attempts=1,
            interval_ns=24 * _HOUR,
            delay_ns=5 * _SECOND,
            delay_function=DELAY_CONSTANT,
            unlimited=False,
        )
    return ReschedulePolicy(delay_ns=30 * _SECOND, delay_function=DELAY_EXPONENTIAL, max_delay_ns=_HOUR)


def default_restart_policy(job_type: str) -> RestartPolicy:
    """Batch work restarts more patiently than services (Nomad's Batch/ServiceJobRestartPolicy)."""
    if job_type in (JOB_TYPE_BATCH, JOB_TYPE_SYSBATCH):
        return RestartPolicy(attempts=3, interval_ns=24 * _HOUR, delay_ns=15 * _SECOND, mode="fail")
    return RestartPolicy(attempts=2, interval_ns=1800 * _SECOND, delay_ns=15 * _SECOND, mode="fail")


def canonicalize_job(job: Job) -> Job:
    """Fill the defaults the API cannot express; idempotent, and never touches ``count``.

    Zero values mean "unset" because that is all protobuf can say: ``priority=0`` becomes
    50, an empty namespace ``default``, no datacenters ``("*",)``. Group policies left out
    take the job type's defaults, and a job-level ``update``, ``reschedule`` or ``migrate``
    is inherited by groups without their own (Nomad merges a group's partial block over
    the job's at parse time; drover's jobspec does too).
    """
    periodic = job.periodic
    if periodic is not None and not periodic.time_zone:
        periodic = _with_time_zone(periodic, "UTC")
    return _canonical_job(
        job,
        job.name or job.id,
        job.namespace or DEFAULT_NAMESPACE,
        job.priority or DEFAULT_PRIORITY,
        tuple(job.datacenters) or (ANY_DATACENTER,),
        periodic,
        tuple([_canonicalize_group(job, group) for group in job.groups]),
    )


# Specialised ``dataclasses.replace`` (canonicalizing is on every register's path).
_with_time_zone = replacer(PeriodicConfig, "time_zone")
_canonical_job = replacer(Job, "name", "namespace", "priority", "datacenters", "periodic", "groups")
_canonical_group = replacer(TaskGroup, "update", "reschedule", "restart", "tasks")
_inherit_migrate = replacer(TaskGroup, "migrate")
_canonical_update = replacer(UpdateStrategy, "healthy_deadline_ns", "health_check")
_UPDATE_DEFAULTS: Final = UpdateStrategy()
_canonical_task = replacer(Task, "resources", "config_json")

# The defaults are frozen values, so one instance per job type serves every job. A type
# that is not one (validation reports it) gets them computed as usual.
_DEFAULT_UPDATE: Final = {t: default_update_strategy(t) for t in JOB_TYPES}
_DEFAULT_RESCHEDULE: Final = {t: default_reschedule_policy(t) for t in JOB_TYPES}
_DEFAULT_RESTART: Final = {t: default_restart_policy(t) for t in JOB_TYPES}


def _canonicalize_group(job: Job, group: TaskGroup) -> TaskGroup:
    job_type = job.type
    update = group.update or job.update
    if update is None:
        update = (
            _DEFAULT_UPDATE[job_type] if job_type in _DEFAULT_UPDATE else default_update_strategy(job_type)
        )
    elif not update.healthy_deadline_ns or not update.health_check:
        update = _canonicalize_update(update)
    reschedule = group.reschedule or job.reschedule
    if reschedule is None:
        reschedule = (
            _DEFAULT_RESCHEDULE[job_type]
            if job_type in _DEFAULT_RESCHEDULE
            else default_reschedule_policy(job_type)
        )
    restart = group.restart
    if not restart:
        restart = (
            _DEFAULT_RESTART[job_type] if job_type in _DEFAULT_RESTART else default_restart_policy(job_type)
        )
    canonical = _canonical_group(
        group,
        update,
        reschedule,
        restart,
        tuple([_canonicalize_task(task) for task in group.tasks]),
    )
    if canonical.migrate is None and job.migrate is not None:
        canonical = _inherit_migrate(canonical, job.migrate)
    return canonical


def _canonicalize_update(update: UpdateStrategy) -> UpdateStrategy:
    """An update block sent over the API without a healthy deadline or a health check
    mode means the defaults: 0 is no valid deadline and "" no mode, so nothing is lost.
    (A progress deadline of 0 is kept: it means "none", as in Nomad.)"""
    return _canonical_update(
        update,
        update.healthy_deadline_ns or _UPDATE_DEFAULTS.healthy_deadline_ns,
        update.health_check or HEALTH_CHECK_TASK_STATES,
    )


def _canonicalize_task(task: Task) -> Task:
    return _canonical_task(task, task.resources or Resources(), task.config_json or "{}")


# ---------------------------------------------------------------------------------------
# Jobs


def validate_job(job: Job, limits: Limits = DEFAULT_LIMITS) -> None:
    """Raise ``ValidationError`` listing every problem in ``job``; return if there are none.

    Validate the canonical form (``canonicalize_job`` first): zero values that mean
    "default" on the wire are errors here.
    """
    _raise_if_any(_bounded(_bounds_errors(job, "job", limits), lambda: _job_errors(job, limits)))


def _bounded(
    bounds: Iterator[FieldError], rules: typing.Callable[[], Iterator[FieldError]]
) -> Iterator[FieldError]:
    """The bound errors; only when there are none, the rules' (see the module docstring)."""
    broken = False
    for error in bounds:
        broken = True
        yield error
    if not broken:
        yield from rules()


def _job_errors(job: Job, limits: Limits) -> Iterator[FieldError]:
    yield from _id_errors(job.id)
    if job.type not in JOB_TYPES:
        yield FieldError("job.type", _one_of(JOB_TYPES, job.type))
    if not MIN_PRIORITY <= job.priority <= MAX_PRIORITY:
        yield FieldError(
            "job.priority", f"must be between {MIN_PRIORITY} and {MAX_PRIORITY}, got {job.priority}"
        )
    if not job.datacenters:
        yield FieldError("job.datacenters", "at least one datacenter is required")
    for i, dc in enumerate(job.datacenters):
        if not dc:
            yield FieldError(f"job.datacenters[{i}]", "must not be empty")
    # The guards skip helpers that would find nothing (this runs on every register).
    if job.meta:
        yield from _meta_errors(job.meta, "job.meta")
    if job.constraints or job.affinities or job.spreads:
        yield from _placement_errors(job.constraints, job.affinities, job.spreads, "job")
    if job.update is not None:
        yield from _update_errors(job.update, "job.update")
        if job.type == JOB_TYPE_SYSTEM and job.update.canary > 0:
            yield FieldError("job.update.canary", _NO_SYSTEM_CANARY)
        if job.type in JOB_TYPES and job.type not in _UPDATE_JOB_TYPES:
            yield FieldError("job.update", f"job type {_q(job.type)} does not allow an update block")
    if job.reschedule is not None:
        yield from _reschedule_errors(job.reschedule, "job.reschedule")
    if job.migrate is not None:
        yield from _migrate_errors(job.migrate, "job.migrate")
    if len(job.node_pool) > MAX_NODE_POOL_LENGTH:
        yield FieldError("job.node_pool", f"must be at most {MAX_NODE_POOL_LENGTH} characters")
    if job.periodic is not None:
        yield from _periodic_errors(job.periodic, job.type)
    if job.parameterized is not None:
        yield from _parameterized_errors(job.parameterized, job.type)
        if job.periodic is not None:
            yield FieldError("job.parameterized", "a job cannot be both periodic and parameterized")
    if len(job.payload) > MAX_PAYLOAD_BYTES:
        yield FieldError("job.payload", f"must be at most {MAX_PAYLOAD_BYTES} bytes, got {len(job.payload)}")
    if not job.groups:
        yield FieldError("job.groups", "at least one group is required")
    seen: set[str] = set()
    for i, group in enumerate(job.groups):
        path = f"job.groups[{i}]"
        if group.name in seen:
            yield FieldError(f"{path}.name", f"duplicate group name {_q(group.name)}")
        seen.add(group.name)
        yield from _group_errors(group, job.type, path, limits)
        # The job's update block is copied into its groups: reported once, at the job.
        if (
            job.type == JOB_TYPE_SYSTEM
            and group.update is not None
            and group.update.canary > 0
            and group.update != job.update
        ):
            yield FieldError(f"{path}.update.canary", _NO_SYSTEM_CANARY)
        if (
            group.update is not None
            and group.update != job.update
            and job.type in JOB_TYPES
            and job.type not in _UPDATE_JOB_TYPES
        ):
            yield FieldError(f"{path}.update", f"job type {_q(job.type)} does not allow an update block")


def _id_errors(job_id: str) -> Iterator[FieldError]:
    if not job_id:
        yield FieldError("job.id", "must not be empty")
        return
    if len(job_id) > MAX_JOB_ID_LENGTH:
        yield FieldError("job.id", f"must be at most {MAX_JOB_ID_LENGTH} characters, got {len(job_id)}")
    if _BAD_ID_CHARS.search(job_id):
        yield FieldError("job.id", "must not contain whitespace or NUL characters")


def _group_errors(group: TaskGroup, job_type: str, path: str, limits: Limits) -> Iterator[FieldError]:
    if not group.name:
        yield FieldError(f"{path}.name", "must not be empty")
    if group.count < 0:
        yield FieldError(f"{path}.count", f"must be >= 0, got {group.count}")
    elif group.count > 1 and job_type == JOB_TYPE_SYSTEM:
        # A system job runs one alloc per eligible node; the node set is the count. Sysbatch
        # runs `count` per node (docs/field-reports.md#field-report-1), so it may ask for more than one.
        yield FieldError(f"{path}.count", f"count > 1 is not allowed for a {job_type} job")
    if group.ephemeral_disk_mb < 0:
        yield FieldError(f"{path}.ephemeral_disk_mb", f"must be >= 0, got {group.ephemeral_disk_mb}")
    if group.meta:
        yield from _meta_errors(group.meta, f"{path}.meta")
    if group.constraints or group.affinities or group.spreads:
        yield from _placement_errors(group.constraints, group.affinities, group.spreads, path)
    if group.network is not None:
        yield from _network_errors(group.network, f"{path}.network")
    if group.update is not None:
        yield from _update_errors(group.update, f"{path}.update")
    if group.reschedule is not None:
        yield from _reschedule_errors(group.reschedule, f"{path}.reschedule")
    if group.restart is not None:
        yield from _restart_errors(group.restart, f"{path}.restart")
    if group.disconnect is not None:
        yield from _disconnect_errors(group.disconnect, f"{path}.disconnect")
    if group.migrate is not None:
        yield from _migrate_errors(group.migrate, f"{path}.migrate")
    if group.scaling is not None:
        yield from _scaling_errors(group.scaling, group.count, f"{path}.scaling")
    if not group.tasks:
        yield FieldError(f"{path}.tasks", "at least one task is required")
    names: set[str] = set()
    leaders = 0
    for i, task in enumerate(group.tasks):
        task_path = f"{path}.tasks[{i}]"
        if task.name in names:
            yield FieldError(f"{task_path}.name", f"duplicate task name {_q(task.name)}")
        names.add(task.name)
        leaders += task.leader
        if task.leader and leaders > 1:
            yield FieldError(f"{task_path}.leader", "only one task in a group may be the leader")
        yield from _task_errors(task, task_path, limits)
    if group.max_run_duration_ns < 0:
        yield FieldError(f"{path}.max_run_duration_ns", f"must be >= 0, got {group.max_run_duration_ns}")
    if group.services or any(task.services for task in group.tasks):
        yield from _group_services_errors(group, path)


def _task_errors(task: Task, path: str, limits: Limits) -> Iterator[FieldError]:
    if not task.name:
        yield FieldError(f"{path}.name", "must not be empty")
    if not task.driver:
        yield FieldError(f"{path}.driver", "must not be empty")
    yield from _config_errors(task.config_json, f"{path}.config_json", limits)
    if task.resources is not None:
        yield from _resources_errors(task.resources, f"{path}.resources", require_positive=True)
    if task.kill_timeout_ns < 0:
        yield FieldError(f"{path}.kill_timeout_ns", f"must be >= 0, got {task.kill_timeout_ns}")
    if task.shutdown_delay_ns < 0:
        yield FieldError(f"{path}.shutdown_delay_ns", f"must be >= 0, got {task.shutdown_delay_ns}")
    if task.kill_signal and task.kill_signal not in KILL_SIGNALS:
        yield FieldError(f"{path}.kill_signal", _one_of(KILL_SIGNALS, task.kill_signal))
    if task.lifecycle is not None and task.lifecycle.hook not in LIFECYCLE_HOOKS:
        yield FieldError(f"{path}.lifecycle.hook", _one_of(LIFECYCLE_HOOKS, task.lifecycle.hook))
    if task.restart is not None:
        yield from _restart_errors(task.restart, f"{path}.restart")
    if task.env:
        yield from _meta_errors(task.env, f"{path}.env")
    if task.meta:
        yield from _meta_errors(task.meta, f"{path}.meta")
    for i, constraint in enumerate(task.constraints):
        yield from _constraint_errors(constraint, f"{path}.constraints[{i}]")
    for i, template in enumerate(task.templates):
        yield from _template_errors(template, f"{path}.templates[{i}]")
    for i, artifact in enumerate(task.artifacts):
        yield from _artifact_errors(artifact, f"{path}.artifacts[{i}]")
    if task.dispatch_payload is not None:
        error = _relative_path_error(task.dispatch_payload.file, required=True)
        if error:
            yield FieldError(f"{path}.dispatch_payload.file", error)


def _relative_path_error(path: str, *, required: bool) -> str:
    """Files a job places stay inside the task's directory (Nomad's sandbox): no absolute
    path, no ``..``. ``${...}`` is left for the client to fill in."""
    if not path:
        return "must not be empty" if required else ""
    if path.startswith("/") or ".." in path.replace("\\", "/").split("/"):
        return f"must be a path inside the task's directory (no leading / and no ..), got {_q(path)}"
    return ""


_PERMS: Final = re.compile(r"^0?[0-7]{3}$")


def _template_errors(template: Template, path: str) -> Iterator[FieldError]:
    if bool(template.data) == bool(template.source):
        yield FieldError(f"{path}.data", "set data or source (one of them)")
    error = _relative_path_error(template.destination, required=True)
    if error:
        yield FieldError(f"{path}.destination", error)
    if template.change_mode and template.change_mode not in CHANGE_MODES:
        yield FieldError(f"{path}.change_mode", _one_of(CHANGE_MODES, template.change_mode))
    if template.change_mode == CHANGE_MODE_SIGNAL and template.change_signal not in KILL_SIGNALS:
        yield FieldError(f"{path}.change_signal", _one_of(KILL_SIGNALS, template.change_signal))
    if template.perms and not _PERMS.match(template.perms):
        yield FieldError(
            f"{path}.perms", f'must be an octal file mode such as "0644", got {_q(template.perms)}'
        )
    if template.source and not template.source.startswith("/"):
        yield FieldError(f"{path}.source", f"must be an absolute path on the node, got {_q(template.source)}")
    for name in ("splay_ns", "wait_min_ns", "wait_max_ns"):
        if getattr(template, name) < 0:
            yield FieldError(f"{path}.{name}", f"must be >= 0, got {getattr(template, name)}")
    if 0 < template.wait_max_ns < template.wait_min_ns:
        yield FieldError(
            f"{path}.wait_max_ns",
            f"must be >= wait min ({template.wait_min_ns}ns), got {template.wait_max_ns}",
        )


def _artifact_errors(artifact: Artifact, path: str) -> Iterator[FieldError]:
    source = artifact.source
    if not source:
        yield FieldError(f"{path}.source", "must not be empty")
    elif "://" in source and not source.startswith("file://"):
        scheme = source.split("://", 1)[0]
        yield FieldError(
            f"{path}.source",
            f"{_q(scheme)} sources are not supported by drover (only local paths and file:// URLs:"
            " nothing remote can be fetched here)",
        )
    elif "::" in source:
        yield FieldError(
            f"{path}.source",
            f"go-getter forcing ({_q(source.split('::', 1)[0])}::) is not supported by drover",
        )
    elif not source.removeprefix("file://").startswith("/"):
        yield FieldError(f"{path}.source", f"must be an absolute path on the node, got {_q(source)}")
    error = _relative_path_error(artifact.destination, required=False)
    if error:
        yield FieldError(f"{path}.destination", error)
    if artifact.mode and artifact.mode not in ARTIFACT_MODES:
        yield FieldError(f"{path}.mode", _one_of(ARTIFACT_MODES, artifact.mode))


def _config_errors(config_json: str, path: str, limits: Limits) -> Iterator[FieldError]:
    size = len(config_json.encode("utf-8", "surrogatepass"))
    if size > limits.max_config_bytes:
        yield FieldError(path, f"must be at most {limits.max_config_bytes} bytes, got {size}")
        return
    error = _string_error(config_json, limits.max_config_bytes)
    if error:
        yield FieldError(path, error)
        return
    # Counting brackets is cheap; the scan only runs when the text could nest too deep.
    if config_json.count("[") + config_json.count("{") > limits.max_config_depth:
        depth = _json_depth(config_json)
        if depth > limits.max_config_depth:
            yield FieldError(path, f"nests at most {limits.max_config_depth} levels deep, got {depth}")
            return
    try:
        config = json.loads(config_json)
    except ValueError as exc:
        yield FieldError(path, f"must be a JSON object: {exc}")
        return
    if not isinstance(config, dict):
        yield FieldError(path, f"must be a JSON object, got {type(config).__name__}")


def _resources_errors(res: Resources, path: str, *, require_positive: bool) -> Iterator[FieldError]:
    # A task that asks for no CPU or memory would let the bin-packer stack it without limit
    # (whole cores count as CPU: such a task sets cores instead of cpu).
    positive = ("cpu_mhz" if res.cores == 0 else "cores", "memory_mb") if require_positive else ()
    if res.cores and res.cpu_mhz:
        yield FieldError(f"{path}.cores", f"set cpu_mhz or cores, not both (cpu_mhz is {res.cpu_mhz})")
    if res.memory_max_mb and res.memory_max_mb < res.memory_mb:
        yield FieldError(
            f"{path}.memory_max_mb", f"must be >= memory_mb ({res.memory_mb}), got {res.memory_max_mb}"
        )
    for name in ("cpu_mhz", "memory_mb", "disk_mb", "memory_max_mb", "cores"):
        value: int = getattr(res, name)
        if name in positive and value <= 0:
            yield FieldError(f"{path}.{name}", f"must be > 0, got {value}")
        elif value < 0:
            yield FieldError(f"{path}.{name}", f"must be >= 0, got {value}")


def _migrate_errors(m: MigrateStrategy, path: str) -> Iterator[FieldError]:
    if m.max_parallel < 1:
        yield FieldError(f"{path}.max_parallel", f"must be >= 1, got {m.max_parallel}")
    if m.health_check not in _MIGRATE_HEALTH_CHECKS:
        yield FieldError(f"{path}.health_check", _one_of(_MIGRATE_HEALTH_CHECKS, m.health_check))
    if m.min_healthy_time_ns < 0:
        yield FieldError(f"{path}.min_healthy_time_ns", f"must be >= 0, got {m.min_healthy_time_ns}")
    if m.healthy_deadline_ns <= m.min_healthy_time_ns:
        yield FieldError(
            f"{path}.healthy_deadline_ns",
            f"must be longer than min_healthy_time ({m.min_healthy_time_ns} ns), got {m.healthy_deadline_ns}",
        )


def _scaling_errors(scaling: ScalingPolicy, count: int, path: str) -> Iterator[FieldError]:
    """Nomad's scaling policy rules: 0 <= min <= max, and the group's count inside them, so
    ``job scale`` (which registers a version checked here) refuses a count outside."""
    if scaling.min < 0:
        yield FieldError(f"{path}.min", f"must be >= 0, got {scaling.min}")
    if scaling.max < scaling.min:
        yield FieldError(f"{path}.max", f"must be >= min ({scaling.min}), got {scaling.max}")
        return
    if count > scaling.max:
        yield FieldError(
            path.rsplit(".", 1)[0] + ".count",
            f"must be <= the scaling policy's max {scaling.max}, got {count}",
        )
    elif count < scaling.min:
        yield FieldError(
            path.rsplit(".", 1)[0] + ".count",
            f"must be >= the scaling policy's min {scaling.min}, got {count}",
        )


def _meta_errors(meta: Mapping[str, str], path: str) -> Iterator[FieldError]:
    if any(not key for key in meta):
        yield FieldError(path, "keys must not be empty")


def _network_errors(network: NetworkResource, path: str) -> Iterator[FieldError]:
    if network.mode not in ("", "host"):
        yield FieldError(
            f"{path}.mode", f'only "host" is supported (no network namespaces here), got {_q(network.mode)}'
        )
    if network.mbits < 0:
        yield FieldError(f"{path}.mbits", f"must be >= 0, got {network.mbits}")
    labels: set[str] = set()
    ports = [("reserved_ports", p) for p in network.reserved_ports]
    ports += [("dynamic_ports", p) for p in network.dynamic_ports]
    indexes = {"reserved_ports": 0, "dynamic_ports": 0}
    for kind, port in ports:
        port_path = f"{path}.{kind}[{indexes[kind]}]"
        indexes[kind] += 1
        if not port.label:
            yield FieldError(f"{port_path}.label", "must not be empty")
        elif port.label in labels:
            # Labels name the NOMAD_PORT_<label> env vars, so they share one namespace.
            yield FieldError(f"{port_path}.label", f"duplicate port label {_q(port.label)}")
        labels.add(port.label)
        if kind == "reserved_ports" and not 1 <= port.value <= _MAX_PORT:
            yield FieldError(f"{port_path}.value", f"must be between 1 and {_MAX_PORT}, got {port.value}")
        if kind == "dynamic_ports" and port.value != 0:
            yield FieldError(
                f"{port_path}.value",
                f"must be 0 for a dynamic port (the scheduler picks it), got {port.value}",
            )
        if not 0 <= port.to <= _MAX_PORT:
            yield FieldError(f"{port_path}.to", f"must be between 0 and {_MAX_PORT}, got {port.to}")


def _placement_errors(
    constraints: tuple[Constraint, ...],
    affinities: tuple[Affinity, ...],
    spreads: tuple[Spread, ...],
    path: str,
) -> Iterator[FieldError]:
    for i, constraint in enumerate(constraints):
        yield from _constraint_errors(constraint, f"{path}.constraints[{i}]")
    for i, affinity in enumerate(affinities):
        yield from _affinity_errors(affinity, f"{path}.affinities[{i}]")
    for i, spread in enumerate(spreads):
        spread_path = f"{path}.spreads[{i}]"
        if not spread.attribute:
            yield FieldError(f"{spread_path}.attribute", "must not be empty")
        if not 0 <= spread.weight <= 100:
            yield FieldError(f"{spread_path}.weight", f"must be between 0 and 100, got {spread.weight}")
        yield from _spread_target_errors(spread, spread_path)


def _spread_target_errors(spread: Spread, path: str) -> Iterator[FieldError]:
    """Nomad's Spread.Validate: each target once, percents 0..100 summing to at most 100."""
    seen: set[str] = set()
    total = 0
    for j, target in enumerate(spread.targets):
        target_path = f"{path}.targets[{j}]"
        if target.value in seen:
            yield FieldError(f"{target_path}.value", f"duplicate spread target {_q(target.value)}")
        seen.add(target.value)
        if not 0 <= target.percent <= 100:
            yield FieldError(f"{target_path}.percent", f"must be between 0 and 100, got {target.percent}")
        total += target.percent
    if total > 100:
        yield FieldError(f"{path}.targets", f"percents must sum to at most 100, got {total}")


def _constraint_errors(c: Constraint, path: str) -> Iterator[FieldError]:
    if c.operator not in CONSTRAINT_OPERATORS:
        yield FieldError(f"{path}.operator", _one_of(sorted(CONSTRAINT_OPERATORS), c.operator))
        return
    if not c.attribute and c.operator != "distinct_hosts":
        yield FieldError(f"{path}.attribute", f"is required for operator {_q(c.operator)}")
    yield from _operand_errors(c.operator, c.value, path)


def _affinity_errors(a: Affinity, path: str) -> Iterator[FieldError]:
    if a.operator not in AFFINITY_OPERATORS:
        yield FieldError(f"{path}.operator", _one_of(sorted(AFFINITY_OPERATORS), a.operator))
    else:
        if not a.attribute:
            yield FieldError(f"{path}.attribute", f"is required for operator {_q(a.operator)}")
        yield from _operand_errors(a.operator, a.value, path)
    if a.weight == 0 or not -100 <= a.weight <= 100:
        yield FieldError(f"{path}.weight", f"must be between -100 and 100 and not 0, got {a.weight}")


def _operand_errors(operator: str, value: str, path: str) -> Iterator[FieldError]:
    if operator in _VALUE_OPERATORS and not value:
        yield FieldError(f"{path}.value", f"is required for operator {_q(operator)}")
    if operator == "regexp":
        error = regexp_error(value)
        if error:
            yield FieldError(f"{path}.value", f"invalid regular expression (RE2 syntax): {error}")


def _update_errors(u: UpdateStrategy, path: str) -> Iterator[FieldError]:
    """Nomad's ``UpdateStrategy.Validate``: the timings must nest, min_healthy_time <
    healthy_deadline < progress_deadline (0: none), or a deployment could never succeed."""
    if u.max_parallel < 0:
        yield FieldError(f"{path}.max_parallel", f"must be >= 0, got {u.max_parallel}")
    if u.canary < 0:
        yield FieldError(f"{path}.canary", f"must be >= 0, got {u.canary}")
    elif u.auto_promote and u.canary == 0:
        yield FieldError(f"{path}.auto_promote", "requires canary > 0 (there is nothing to promote)")
    if u.health_check not in HEALTH_CHECK_MODES:
        yield FieldError(f"{path}.health_check", _one_of(HEALTH_CHECK_MODES, u.health_check))
    names = ("stagger_ns", "min_healthy_time_ns", "healthy_deadline_ns", "progress_deadline_ns")
    negative = [name for name in names if getattr(u, name) < 0]
    yield from _non_negative(u, names, path)
    if "min_healthy_time_ns" in negative or "healthy_deadline_ns" in negative:
        return
    if u.min_healthy_time_ns >= u.healthy_deadline_ns:
        yield FieldError(
            f"{path}.min_healthy_time_ns",
            f"must be less than healthy_deadline_ns ({_duration(u.healthy_deadline_ns)}), "
            f"got {_duration(u.min_healthy_time_ns)}",
        )
    if "progress_deadline_ns" not in negative and 0 < u.progress_deadline_ns <= u.healthy_deadline_ns:
        yield FieldError(
            f"{path}.healthy_deadline_ns",
            f"must be less than progress_deadline_ns ({_duration(u.progress_deadline_ns)}) unless that is 0, "
            f"got {_duration(u.healthy_deadline_ns)}",
        )


def _duration(ns: int) -> str:
    """Nanoseconds for a message, in the unit a job file would use."""
    for unit, size in (("h", 3600 * _SECOND), ("m", 60 * _SECOND), ("s", _SECOND), ("ms", 1_000_000)):
        if ns >= size and ns % size == 0:
            return f"{ns // size}{unit}"
    return f"{ns}ns"


def _group_services_errors(group: TaskGroup, path: str) -> Iterator[FieldError]:
    labels = _port_labels(group.network)
    task_names = frozenset(task.name for task in group.tasks)
    for i, service in enumerate(group.services):
        yield from _service_errors(service, f"{path}.services[{i}]", labels, task_names, own_task="")
    for t, task in enumerate(group.tasks):
        for i, service in enumerate(task.services):
            service_path = f"{path}.tasks[{t}].services[{i}]"
            yield from _service_errors(service, service_path, labels, task_names, own_task=task.name)


def _port_labels(network: NetworkResource | None) -> frozenset[str]:
    if network is None:
        return frozenset()
    return frozenset(p.label for p in (*network.reserved_ports, *network.dynamic_ports))


def _service_errors(
    service: Service, path: str, labels: frozenset[str], task_names: frozenset[str], *, own_task: str
) -> Iterator[FieldError]:
    """A service of a group (``own_task`` "") or of one task. Ports are the group network's
    labels: the client resolves them to the alloc's port values."""
    if service.provider not in _SERVICE_PROVIDERS:
        yield FieldError(f"{path}.provider", _one_of(_SERVICE_PROVIDERS, service.provider))
    if service.port and service.port not in labels:
        yield FieldError(f"{path}.port", _port_label_error(service.port, labels))
    if service.address_mode == "driver":
        yield FieldError(
            f"{path}.address_mode", '"driver" is not supported by drover (no driver networks here)'
        )
    elif service.address_mode and service.address_mode not in ADDRESS_MODES:
        yield FieldError(f"{path}.address_mode", _one_of(ADDRESS_MODES, service.address_mode))
    for i, check in enumerate(service.checks):
        yield from _check_errors(check, service, f"{path}.checks[{i}]", labels, task_names, own_task=own_task)


def _port_label_error(label: str, labels: frozenset[str]) -> str:
    known = ", ".join(_q(label) for label in sorted(labels)) or "none"
    return f"{_q(label)} is not a port label of the group's network (labels: {known})"


def _check_errors(
    check: ServiceCheck,
    service: Service,
    path: str,
    labels: frozenset[str],
    task_names: frozenset[str],
    *,
    own_task: str,
) -> Iterator[FieldError]:
    if check.type not in CHECK_TYPES:
        yield FieldError(f"{path}.type", _one_of(CHECK_TYPES, check.type))
    if check.type in (CHECK_HTTP, CHECK_TCP):
        port = check.port or service.port
        if not port:
            yield FieldError(f"{path}.port", f"a {check.type} check needs a port (here or on its service)")
        elif port not in labels:
            yield FieldError(f"{path}.port", _port_label_error(port, labels))
    if check.type == CHECK_HTTP:
        if not check.path.startswith("/"):
            yield FieldError(f"{path}.path", f"must start with /, got {_q(check.path)}")
        if check.method not in _CHECK_METHODS:
            yield FieldError(f"{path}.method", _one_of(_CHECK_METHODS, check.method))
        if check.protocol not in _CHECK_PROTOCOLS:
            yield FieldError(f"{path}.protocol", _one_of(_CHECK_PROTOCOLS, check.protocol))
    if check.type == CHECK_SCRIPT:
        if not check.command:
            yield FieldError(f"{path}.command", "a script check needs a command")
        if check.task and check.task not in task_names:
            yield FieldError(f"{path}.task", f"{_q(check.task)} is not a task of the group")
        elif not check.task and not own_task:
            yield FieldError(f"{path}.task", "a script check of a group service must name the task to run in")
        elif check.task and own_task and check.task != own_task:
            yield FieldError(f"{path}.task", f"a task's check runs in that task ({_q(own_task)})")
    if check.interval_ns < _MIN_CHECK_INTERVAL_NS:
        yield FieldError(
            f"{path}.interval_ns", f"must be at least 1s, got {_duration(max(check.interval_ns, 0))}"
        )
    if check.timeout_ns <= 0:
        yield FieldError(f"{path}.timeout_ns", f"must be > 0, got {check.timeout_ns}")
    if check.check_restart is not None:
        yield from _check_restart_errors(check, path, task_names, own_task=own_task)


def _check_restart_errors(
    check: ServiceCheck, path: str, task_names: frozenset[str], *, own_task: str
) -> Iterator[FieldError]:
    """A check_restart needs a task to restart: a task service's own, or the check's ``task``."""
    restart = check.check_restart
    assert restart is not None
    where = f"{path}.check_restart"
    if restart.limit < 0:
        yield FieldError(f"{where}.limit", f"must be >= 0 (0: never restart), got {restart.limit}")
    if restart.grace_ns < 0:
        yield FieldError(f"{where}.grace_ns", f"must be >= 0, got {restart.grace_ns}")
    if restart.limit <= 0 or check.type == CHECK_SCRIPT:
        return  # (a script check's task is checked with the check)
    if not own_task and not check.task:
        yield FieldError(
            f"{path}.task", "a group service's check with a check_restart must name the task to restart"
        )
    elif check.task and check.task not in task_names:
        yield FieldError(f"{path}.task", f"{_q(check.task)} is not a task of the group")


def _reschedule_errors(r: ReschedulePolicy, path: str) -> Iterator[FieldError]:
    if r.delay_function not in DELAY_FUNCTION_NAMES:
        yield FieldError(f"{path}.delay_function", _one_of(DELAY_FUNCTION_NAMES, r.delay_function))
    elif r.delay_function != DELAY_CONSTANT and r.max_delay_ns < r.delay_ns:
        # Backoff grows from delay up to max_delay; a cap below the start is a typo.
        yield FieldError(
            f"{path}.max_delay_ns", f"must be >= delay_ns for the {_q(r.delay_function)} delay function"
        )
    yield from _non_negative(r, ("attempts", "interval_ns", "delay_ns", "max_delay_ns"), path)


def _restart_errors(r: RestartPolicy, path: str) -> Iterator[FieldError]:
    if r.mode not in _RESTART_MODES:
        yield FieldError(f"{path}.mode", _one_of(_RESTART_MODES, r.mode))
    yield from _non_negative(r, ("attempts", "interval_ns", "delay_ns"), path)


def _disconnect_errors(d: DisconnectStrategy, path: str) -> Iterator[FieldError]:
    if d.reconcile not in RECONCILE_MODES:
        yield FieldError(f"{path}.reconcile", _one_of(RECONCILE_MODES, d.reconcile))
    yield from _non_negative(d, ("lost_after_ns", "stop_on_client_after_ns"), path)


def _non_negative(obj: object, names: tuple[str, ...], path: str) -> Iterator[FieldError]:
    for name in names:
        value: int = getattr(obj, name)
        if value < 0:
            yield FieldError(f"{path}.{name}", f"must be >= 0, got {value}")


def _periodic_errors(p: PeriodicConfig, job_type: str) -> Iterator[FieldError]:
    if job_type not in _PERIODIC_JOB_TYPES:
        yield FieldError("job.periodic", f"only batch and sysbatch jobs can be periodic, not {_q(job_type)}")
    if p.spec and p.specs:
        yield FieldError("job.periodic.specs", "set spec (one cron) or specs (several), not both")
    if not p.specs:
        error = cron_error(p.spec)
        if error:
            yield FieldError("job.periodic.spec", error)
    for i, spec in enumerate(p.specs):
        error = cron_error(spec)
        if error:
            yield FieldError(f"job.periodic.specs[{i}]", error)
    error = time_zone_error(p.time_zone)
    if error:
        yield FieldError("job.periodic.time_zone", error)


def _parameterized_errors(p: ParameterizedConfig, job_type: str) -> Iterator[FieldError]:
    if job_type not in _PERIODIC_JOB_TYPES:
        yield FieldError(
            "job.parameterized", f"only batch and sysbatch jobs can be parameterized, not {_q(job_type)}"
        )
    if p.payload not in _PAYLOAD_MODES:
        yield FieldError("job.parameterized.payload", _one_of(_PAYLOAD_MODES, p.payload))
    for name in ("meta_required", "meta_optional"):
        keys: tuple[str, ...] = getattr(p, name)
        if any(not key for key in keys):
            yield FieldError(f"job.parameterized.{name}", "keys must not be empty")
    both = sorted(set(p.meta_required) & set(p.meta_optional))
    if both:
        yield FieldError(
            "job.parameterized.meta_optional",
            f"{', '.join(_q(k) for k in both)} also in meta_required; a key is either required or optional",
        )


def validate_dispatch(parent: Job, meta: Mapping[str, str], payload: bytes) -> None:
    """Raise ``ValidationError`` unless ``meta`` and ``payload`` fit the parameterized ``parent``.

    Paths name the request's fields: ``payload``, ``meta.<key>``.
    """
    _raise_if_any(_dispatch_errors(parent, meta, payload))


def _dispatch_errors(parent: Job, meta: Mapping[str, str], payload: bytes) -> Iterator[FieldError]:
    limits = DEFAULT_LIMITS
    if len(meta) > limits.max_map_entries:
        yield FieldError("meta", f"at most {limits.max_map_entries} entries, got {len(meta)}")
        return
    for key, value in meta.items():
        error = _string_error(key, limits.max_name_length) or _string_error(value, limits.max_string_length)
        if error:
            yield FieldError(f"meta.{key[:_QUOTE_CHARS]}", error)
            return
    config = parent.parameterized
    if config is None or parent.dispatched:
        yield FieldError(
            "job_id", f"job {_q(parent.id)} is not a parameterized job; only those can be dispatched"
        )
        return
    if config.payload == "required" and not payload:
        yield FieldError("payload", f"job {_q(parent.id)} requires a payload")
    elif config.payload == "forbidden" and payload:
        yield FieldError("payload", f"job {_q(parent.id)} forbids a payload, got {len(payload)} bytes")
    if len(payload) > MAX_PAYLOAD_BYTES:
        yield FieldError("payload", f"must be at most {MAX_PAYLOAD_BYTES} bytes, got {len(payload)}")
    for key in config.meta_required:
        if key not in meta:
            yield FieldError(f"meta.{key}", f"required by job {_q(parent.id)} but not given")
    allowed = set(config.meta_required) | set(config.meta_optional)
    for key in sorted(meta):
        if key not in allowed:
            expected = ", ".join(_q(k) for k in sorted(allowed)) or "none"
            yield FieldError(
                f"meta.{key}", f"not a meta key job {_q(parent.id)} accepts (accepted: {expected})"
            )


# ---------------------------------------------------------------------------------------
# Nodes


def validate_node_status(status: str, path: str) -> None:
    """Raise ``ValidationError`` at ``path`` unless ``status`` is a known node status."""
    if status not in NODE_STATUSES:
        raise ValidationError([FieldError(path, _one_of(NODE_STATUSES, status))])


def validate_eligibility(value: str, path: str) -> None:
    """Raise ``ValidationError`` at ``path`` unless ``value`` is a scheduling eligibility."""
    if value not in NODE_ELIGIBILITIES:
        raise ValidationError([FieldError(path, _one_of(NODE_ELIGIBILITIES, value))])


def validate_node(node: Node, limits: Limits = DEFAULT_LIMITS) -> None:
    """Raise ``ValidationError`` listing every problem in a node registration."""
    _raise_if_any(_bounded(_bounds_errors(node, "node", limits), lambda: _node_errors(node)))


def _node_errors(node: Node) -> Iterator[FieldError]:
    for name in ("id", "name", "datacenter"):
        if not getattr(node, name):
            yield FieldError(f"node.{name}", "must not be empty")
    if node.status not in NODE_STATUSES:
        yield FieldError("node.status", _one_of(NODE_STATUSES, node.status))
    if node.scheduling_eligibility not in NODE_ELIGIBILITIES:
        yield FieldError(
            "node.scheduling_eligibility", _one_of(NODE_ELIGIBILITIES, node.scheduling_eligibility)
        )
    if node.resources is not None:
        yield from _node_resources_errors(node.resources, "node.resources")


def _node_resources_errors(res: NodeResources, path: str) -> Iterator[FieldError]:
    yield from _non_negative(res, ("cpu_mhz", "memory_mb", "disk_mb", "max_allocs"), path)
    if res.reserved is not None:
        yield from _resources_errors(res.reserved, f"{path}.reserved", require_positive=False)
    for i, port in enumerate(res.reserved_ports):
        if not 1 <= port <= _MAX_PORT:
            yield FieldError(f"{path}.reserved_ports[{i}]", f"must be between 1 and {_MAX_PORT}, got {port}")
    bad_range = False
    for name in ("min_dynamic_port", "max_dynamic_port"):
        value: int = getattr(res, name)
        if not 1 <= value <= _MAX_PORT:
            bad_range = True
            yield FieldError(f"{path}.{name}", f"must be between 1 and {_MAX_PORT}, got {value}")
    if not bad_range and res.min_dynamic_port > res.max_dynamic_port:
        yield FieldError(
            f"{path}.min_dynamic_port",
            f"must be <= max_dynamic_port ({res.max_dynamic_port}), got {res.min_dynamic_port}",
        )
