"""drover.scheduler.validate: every rule reports the field path it is about, and all rules run."""

from __future__ import annotations

import pickle
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from drover.scheduler.structs import (
    DEFAULT_NAMESPACE,
    DEFAULT_PRIORITY,
    JOB_TYPES,
    Affinity,
    Constraint,
    DisconnectStrategy,
    Job,
    NetworkResource,
    Node,
    NodeEvent,
    NodeResources,
    ParameterizedConfig,
    PeriodicConfig,
    Port,
    ReschedulePolicy,
    Resources,
    RestartPolicy,
    Service,
    ServiceCheck,
    Spread,
    Task,
    TaskGroup,
    UpdateStrategy,
)
from drover.scheduler.validate import (
    ANY_DATACENTER,
    DEFAULT_LIMITS,
    INT32_FIELDS,
    MAX_REPORTED_ERRORS,
    FieldError,
    Limits,
    ValidationError,
    canonicalize_job,
    default_reschedule_policy,
    default_restart_policy,
    default_update_strategy,
    validate_eligibility,
    validate_job,
    validate_node,
    validate_node_status,
)
from tests.unit.test_codec import assert_identical
from tests.unit.test_codec import values as codec_values

SECOND = 1_000_000_000
HOUR = 3600 * SECOND


def job(**changes: Any) -> Job:
    """A complete, valid, canonical service job: group "api" of 3, task "server", port "http"."""
    base = Job(
        id="web",
        type="service",
        datacenters=("dc1",),
        groups=(
            TaskGroup(
                name="api",
                count=3,
                network=NetworkResource(dynamic_ports=(Port(label="http"),)),
                tasks=(
                    Task(
                        name="server",
                        driver="mock",
                        config_json='{"run_for": "1h"}',
                        resources=Resources(cpu_mhz=100, memory_mb=64),
                    ),
                ),
            ),
        ),
    )
    return replace(canonicalize_job(base), **changes)


def with_group(base: Job | None = None, **changes: Any) -> Job:
    j = base or job()
    return replace(j, groups=(replace(j.groups[0], **changes), *j.groups[1:]))


def with_task(base: Job | None = None, **changes: Any) -> Job:
    j = base or job()
    group = j.groups[0]
    return with_group(j, tasks=(replace(group.tasks[0], **changes), *group.tasks[1:]))


def batch(**changes: Any) -> Job:
    """The same job as a canonical batch job (no update block: batch jobs do not roll)."""
    service = job()
    return replace(
        canonicalize_job(
            replace(service, type="batch", groups=tuple(replace(g, update=None) for g in service.groups))
        ),
        **changes,
    )


def errors_of(j: Job) -> list[FieldError]:
    with pytest.raises(ValidationError) as info:
        validate_job(j)
    return list(info.value.errors)


def paths_of(j: Job) -> list[str]:
    return [e.path for e in errors_of(j)]


# ---------------------------------------------------------------------------------------
# Valid jobs


@pytest.mark.parametrize(
    "j",
    [
        job(),
        batch(),
        with_group(job(type="system"), count=1, network=None),
        with_group(job(type="sysbatch"), count=0, update=None),
        with_group(job(type="sysbatch"), count=3, update=None),
        with_group(count=0),
        batch(periodic=PeriodicConfig(spec="*/5 * * * *", time_zone="America/New_York")),
        # Nomad's forms: 6 fields end with a year, 7 start with seconds and end with a year.
        batch(periodic=PeriodicConfig(spec="30 3 * * * 2030")),
        batch(periodic=PeriodicConfig(spec="*/10 * * * * * *")),
        batch(periodic=PeriodicConfig(spec="@daily")),
        batch(periodic=PeriodicConfig(specs=("@daily", "0 12 * * MON-FRI"))),
        batch(parameterized=ParameterizedConfig(payload="required", meta_required=("x",))),
        job(datacenters=("*",)),
        job(constraints=(Constraint(operator="distinct_hosts", value="true"),)),
        job(constraints=(Constraint(attribute="${attr.kernel.name}", operator="is_set"),)),
        job(affinities=(Affinity(attribute="${node.class}", value="big", weight=-100),)),
        job(spreads=(Spread(attribute="${node.datacenter}", weight=0),)),
        with_group(disconnect=DisconnectStrategy(lost_after_ns=HOUR, reconcile="keep_original")),
        with_group(
            network=NetworkResource(
                reserved_ports=(Port(label="db", value=5432, to=5432),),
                dynamic_ports=(Port(label="http", to=8080),),
            )
        ),
        job(payload=b"x" * 16 * 1024),
    ],
    ids=[
        "service",
        "batch",
        "system-count-1",
        "sysbatch-count-0",
        "sysbatch-count-3-per-node",
        "count-0",
        "periodic-5-fields-tz",
        "periodic-6-fields-year-last",
        "periodic-7-fields-seconds-first",
        "periodic-macro",
        "periodic-several-crons",
        "parameterized",
        "any-datacenter",
        "distinct-hosts-needs-no-attribute",
        "is-set-needs-no-value",
        "negative-affinity",
        "spread-weight-0",
        "disconnect",
        "static-and-dynamic-ports",
        "payload-at-limit",
    ],
)
def test_validate_job__valid(j: Job) -> None:
    validate_job(j)


# ---------------------------------------------------------------------------------------
# One problem each: the error names the field


G = "job.groups[0]"
T = "job.groups[0].tasks[0]"

BAD_JOBS: list[tuple[str, Job, str, str]] = [
    ("empty-id", job(id=""), "job.id", "must not be empty"),
    ("long-id", job(id="x" * 129), "job.id", "at most 128"),
    ("id-with-space", job(id="my job"), "job.id", "whitespace"),
    ("id-with-nul", job(id="a\x00b"), "job.id", "NUL"),
    ("bad-type", job(type="daemon"), "job.type", '"service", "batch", "system", "sysbatch"'),
    ("priority-0", job(priority=0), "job.priority", "between 1 and 100"),
    ("priority-101", job(priority=101), "job.priority", "got 101"),
    ("no-datacenters", job(datacenters=()), "job.datacenters", "at least one"),
    ("empty-datacenter", job(datacenters=("dc1", "")), "job.datacenters[1]", "must not be empty"),
    ("no-groups", job(groups=()), "job.groups", "at least one group"),
    ("empty-group-name", with_group(name=""), f"{G}.name", "must not be empty"),
    (
        "duplicate-group-name",
        (lambda j: replace(j, groups=(j.groups[0], j.groups[0])))(job()),
        "job.groups[1].name",
        'duplicate group name "api"',
    ),
    ("negative-count", with_group(count=-1), f"{G}.count", ">= 0"),
    (
        "system-count-2",
        with_group(job(type="system"), count=2),
        f"{G}.count",
        "count > 1 is not allowed for a system job",
    ),
    ("no-tasks", with_group(tasks=()), f"{G}.tasks", "at least one task"),
    ("empty-task-name", with_task(name=""), f"{T}.name", "must not be empty"),
    (
        "duplicate-task-name",
        (lambda j: with_group(j, tasks=(j.groups[0].tasks[0],) * 2))(job()),
        "job.groups[0].tasks[1].name",
        'duplicate task name "server"',
    ),
    (
        "two-leaders",
        (lambda t: with_group(tasks=(t, replace(t, name="b"))))(
            replace(job().groups[0].tasks[0], leader=True)
        ),
        "job.groups[0].tasks[1].leader",
        "only one",
    ),
    ("empty-driver", with_task(driver=""), f"{T}.driver", "must not be empty"),
    ("zero-memory", with_task(resources=Resources(memory_mb=0)), f"{T}.resources.memory_mb", "> 0"),
    ("zero-cpu", with_task(resources=Resources(cpu_mhz=0)), f"{T}.resources.cpu_mhz", "> 0"),
    ("negative-disk", with_task(resources=Resources(disk_mb=-1)), f"{T}.resources.disk_mb", ">= 0"),
    ("config-not-json", with_task(config_json="{run_for"), f"{T}.config_json", "JSON object"),
    ("config-json-list", with_task(config_json="[1]"), f"{T}.config_json", "got list"),
    ("negative-kill-timeout", with_task(kill_timeout_ns=-1), f"{T}.kill_timeout_ns", ">= 0"),
    ("empty-env-key", with_task(env={"": "x"}), f"{T}.env", "keys must not be empty"),
    ("empty-task-meta-key", with_task(meta={"": "x"}), f"{T}.meta", "keys must not be empty"),
    ("empty-group-meta-key", with_group(meta={"": "x"}), f"{G}.meta", "keys must not be empty"),
    ("empty-job-meta-key", job(meta={"": "x"}), "job.meta", "keys must not be empty"),
    ("negative-disk-mb", with_group(ephemeral_disk_mb=-1), f"{G}.ephemeral_disk_mb", ">= 0"),
    (
        "port-empty-label",
        with_group(network=NetworkResource(dynamic_ports=(Port(label=""),))),
        f"{G}.network.dynamic_ports[0].label",
        "must not be empty",
    ),
    (
        "port-duplicate-label-across-kinds",
        with_group(
            network=NetworkResource(
                reserved_ports=(Port(label="http", value=80),), dynamic_ports=(Port(label="http"),)
            )
        ),
        f"{G}.network.dynamic_ports[0].label",
        'duplicate port label "http"',
    ),
    (
        "reserved-port-0",
        with_group(network=NetworkResource(reserved_ports=(Port(label="db", value=0),))),
        f"{G}.network.reserved_ports[0].value",
        "between 1 and 65535",
    ),
    (
        "reserved-port-too-big",
        with_group(network=NetworkResource(reserved_ports=(Port(label="db", value=70000),))),
        f"{G}.network.reserved_ports[0].value",
        "got 70000",
    ),
    (
        "dynamic-port-with-value",
        with_group(network=NetworkResource(dynamic_ports=(Port(label="http", value=8080),))),
        f"{G}.network.dynamic_ports[0].value",
        "must be 0",
    ),
    (
        "port-to-too-big",
        with_group(network=NetworkResource(dynamic_ports=(Port(label="http", to=65536),))),
        f"{G}.network.dynamic_ports[0].to",
        "between 0 and 65535",
    ),
    (
        "negative-mbits",
        with_group(network=NetworkResource(mbits=-1)),
        f"{G}.network.mbits",
        ">= 0",
    ),
    (
        "bad-constraint-operator",
        job(constraints=(Constraint(attribute="a", operator="~=", value="x"),)),
        "job.constraints[0].operator",
        '"distinct_hosts"',
    ),
    (
        "constraint-without-attribute",
        job(constraints=(Constraint(attribute="", operator="=", value="x"),)),
        "job.constraints[0].attribute",
        'required for operator "="',
    ),
    (
        "distinct-property-without-attribute",
        with_group(constraints=(Constraint(operator="distinct_property"),)),
        f"{G}.constraints[0].attribute",
        "required",
    ),
    (
        "constraint-without-value",
        with_task(constraints=(Constraint(attribute="${attr.kernel.name}", operator="="),)),
        f"{T}.constraints[0].value",
        "required",
    ),
    (
        "bad-regexp",
        job(constraints=(Constraint(attribute="a", operator="regexp", value="(unclosed"),)),
        "job.constraints[0].value",
        "invalid regular expression",
    ),
    (
        "affinity-weight-0",
        job(affinities=(Affinity(attribute="a", value="x", weight=0),)),
        "job.affinities[0].weight",
        "not 0",
    ),
    (
        "affinity-weight-101",
        with_group(affinities=(Affinity(attribute="a", value="x", weight=101),)),
        f"{G}.affinities[0].weight",
        "got 101",
    ),
    (
        "affinity-distinct-hosts",
        job(affinities=(Affinity(attribute="a", operator="distinct_hosts"),)),
        "job.affinities[0].operator",
        "must be one of",
    ),
    (
        "spread-weight-101",
        job(spreads=(Spread(attribute="a", weight=101),)),
        "job.spreads[0].weight",
        "between 0 and 100",
    ),
    (
        "spread-without-attribute",
        with_group(spreads=(Spread(attribute=""),)),
        f"{G}.spreads[0].attribute",
        "must not be empty",
    ),
    (
        "update-negative-max-parallel",
        job(update=UpdateStrategy(max_parallel=-1)),
        "job.update.max_parallel",
        ">= 0",
    ),
    (
        "group-update-negative-stagger",
        with_group(update=UpdateStrategy(stagger_ns=-1)),
        f"{G}.update.stagger_ns",
        ">= 0",
    ),
    (
        "group-update-negative-deadline",
        with_group(update=UpdateStrategy(healthy_deadline_ns=-1)),
        f"{G}.update.healthy_deadline_ns",
        ">= 0",
    ),
    (
        "periodic-service",
        job(periodic=PeriodicConfig(spec="@hourly")),
        "job.periodic",
        "only batch and sysbatch",
    ),
    (
        "periodic-empty-spec",
        batch(periodic=PeriodicConfig(spec="")),
        "job.periodic.spec",
        "must not be empty",
    ),
    (
        "periodic-4-fields",
        batch(periodic=PeriodicConfig(spec="* * * *")),
        "job.periodic.spec",
        "has 4 fields",
    ),
    (
        "periodic-unknown-macro",
        batch(periodic=PeriodicConfig(spec="@fortnightly")),
        "job.periodic.spec",
        "unknown macro",
    ),
    (
        "periodic-bad-chars",
        batch(periodic=PeriodicConfig(spec="* * * * $")),
        "job.periodic.spec",
        "not a valid item",
    ),
    (
        "periodic-bad-time-zone",
        batch(periodic=PeriodicConfig(spec="@daily", time_zone="Mars/Olympus")),
        "job.periodic.time_zone",
        "unknown time zone",
    ),
    (
        "periodic-path-time-zone",
        batch(periodic=PeriodicConfig(spec="@daily", time_zone="../etc/passwd")),
        "job.periodic.time_zone",
        "unknown time zone",
    ),
    (
        "parameterized-service",
        job(parameterized=ParameterizedConfig()),
        "job.parameterized",
        "only batch and sysbatch",
    ),
    (
        "parameterized-bad-payload",
        batch(parameterized=ParameterizedConfig(payload="maybe")),
        "job.parameterized.payload",
        '"optional", "required", "forbidden"',
    ),
    (
        "periodic-and-parameterized",
        batch(periodic=PeriodicConfig(spec="@daily"), parameterized=ParameterizedConfig()),
        "job.parameterized",
        "both periodic and parameterized",
    ),
    (
        "disconnect-bad-reconcile",
        with_group(disconnect=DisconnectStrategy(reconcile="newest")),
        f"{G}.disconnect.reconcile",
        '"best_score"',
    ),
    (
        "disconnect-negative-lost-after",
        with_group(disconnect=DisconnectStrategy(lost_after_ns=-1)),
        f"{G}.disconnect.lost_after_ns",
        ">= 0",
    ),
    (
        "disconnect-negative-stop-after",
        with_group(disconnect=DisconnectStrategy(stop_on_client_after_ns=-1)),
        f"{G}.disconnect.stop_on_client_after_ns",
        ">= 0",
    ),
    (
        "reschedule-bad-delay-function",
        with_group(reschedule=ReschedulePolicy(delay_function="linear")),
        f"{G}.reschedule.delay_function",
        '"constant", "exponential", "fibonacci"',
    ),
    (
        "reschedule-max-delay-below-delay",
        with_group(reschedule=ReschedulePolicy(delay_ns=60 * SECOND, max_delay_ns=SECOND)),
        f"{G}.reschedule.max_delay_ns",
        ">= delay_ns",
    ),
    (
        "reschedule-negative-attempts",
        with_group(reschedule=ReschedulePolicy(attempts=-1)),
        f"{G}.reschedule.attempts",
        ">= 0",
    ),
    (
        "restart-bad-mode",
        with_group(restart=RestartPolicy(mode="retry")),
        f"{G}.restart.mode",
        '"fail", "delay"',
    ),
    (
        "restart-negative-delay",
        with_group(restart=RestartPolicy(delay_ns=-1)),
        f"{G}.restart.delay_ns",
        ">= 0",
    ),
    ("payload-too-big", job(payload=b"x" * (16 * 1024 + 1)), "job.payload", "at most 16384 bytes"),
]


def updated(**changes: Any) -> Job:
    """The job with its group's (canonical) update block changed."""
    j = job()
    update = j.groups[0].update
    assert update is not None
    return with_group(j, update=replace(update, **changes))


def served(*services: Service, task_services: tuple[Service, ...] = ()) -> Job:
    """The job with these services on its group (and on its task)."""
    j = with_task(job(), services=task_services)
    return with_group(j, services=services)


def http_check(**changes: Any) -> ServiceCheck:
    return replace(ServiceCheck(type="http", port="http", path="/health"), **changes)


# Deployments: Nomad's UpdateStrategy.Validate, and checks the client can run.
BAD_DEPLOYMENT_JOBS: list[tuple[str, Job, str, str]] = [
    ("negative-canary", updated(canary=-1), f"{G}.update.canary", ">= 0"),
    ("auto-promote-without-canary", updated(auto_promote=True), f"{G}.update.auto_promote", "canary > 0"),
    ("unknown-health-check", updated(health_check="consul"), f"{G}.update.health_check", '"task_states"'),
    (
        "min-healthy-time-equal-to-deadline",
        updated(min_healthy_time_ns=60 * SECOND, healthy_deadline_ns=60 * SECOND),
        f"{G}.update.min_healthy_time_ns",
        "less than healthy_deadline_ns (1m), got 1m",
    ),
    (
        "min-healthy-time-above-deadline",
        updated(min_healthy_time_ns=90 * SECOND, healthy_deadline_ns=30 * SECOND),
        f"{G}.update.min_healthy_time_ns",
        "got 90s",
    ),
    (
        "healthy-deadline-past-progress-deadline",
        updated(healthy_deadline_ns=20 * 60 * SECOND, progress_deadline_ns=10 * 60 * SECOND),
        f"{G}.update.healthy_deadline_ns",
        "less than progress_deadline_ns (10m) unless that is 0",
    ),
    (
        "negative-progress-deadline",
        updated(progress_deadline_ns=-1),
        f"{G}.update.progress_deadline_ns",
        ">= 0",
    ),
    (
        "update-on-batch-job",
        replace(batch(), update=UpdateStrategy()),
        "job.update",
        'job type "batch" does not allow an update block',
    ),
    (
        "group-update-on-sysbatch-job",
        with_group(batch(type="sysbatch"), count=1, update=UpdateStrategy()),
        f"{G}.update",
        'job type "sysbatch" does not allow an update block',
    ),
    (
        "canary-on-system-job",
        with_group(job(type="system"), count=1, update=UpdateStrategy(max_parallel=1, canary=1)),
        f"{G}.update.canary",
        "canary is not supported for system jobs",
    ),
    (
        "job-level-canary-on-system-job",
        (
            lambda j: canonicalize_job(
                replace(
                    j,
                    update=UpdateStrategy(canary=1),
                    groups=tuple(replace(g, update=None) for g in j.groups),
                )
            )
        )(with_group(job(type="system"), count=1)),
        "job.update.canary",
        "canary is not supported for system jobs",
    ),
    (
        "consul-service",
        served(Service(provider="consul")),
        f"{G}.services[0].provider",
        '"nomad"',
    ),
    (
        "service-port-not-a-label",
        served(Service(port="admin")),
        f"{G}.services[0].port",
        '"admin" is not a port label of the group\'s network (labels: "http")',
    ),
    (
        "check-port-not-a-label",
        served(Service(checks=(http_check(port="web"),))),
        f"{G}.services[0].checks[0].port",
        '"web" is not a port label',
    ),
    (
        "tcp-check-without-port",
        served(Service(checks=(ServiceCheck(type="tcp"),))),
        f"{G}.services[0].checks[0].port",
        "needs a port",
    ),
    (
        "task-check-port-not-a-label",
        served(task_services=(Service(checks=(ServiceCheck(type="tcp", port="db"),)),)),
        f"{G}.tasks[0].services[0].checks[0].port",
        '"db" is not a port label',
    ),
    (
        "unknown-check-type",
        served(Service(checks=(ServiceCheck(type="grpc", port="http"),))),
        f"{G}.services[0].checks[0].type",
        '"http", "tcp", "script"',
    ),
    (
        "script-check-without-command",
        served(task_services=(Service(checks=(ServiceCheck(type="script"),)),)),
        f"{G}.tasks[0].services[0].checks[0].command",
        "needs a command",
    ),
    (
        "group-script-check-without-task",
        served(Service(checks=(ServiceCheck(type="script", command="/bin/true"),))),
        f"{G}.services[0].checks[0].task",
        "must name the task",
    ),
    (
        "script-check-in-unknown-task",
        served(Service(checks=(ServiceCheck(type="script", command="/bin/true", task="sidecar"),))),
        f"{G}.services[0].checks[0].task",
        '"sidecar" is not a task of the group',
    ),
    (
        "check-interval-under-1s",
        served(Service(checks=(http_check(interval_ns=500_000_000),))),
        f"{G}.services[0].checks[0].interval_ns",
        "at least 1s, got 500ms",
    ),
    (
        "check-timeout-0",
        served(Service(checks=(http_check(timeout_ns=0),))),
        f"{G}.services[0].checks[0].timeout_ns",
        "> 0",
    ),
    (
        "http-check-relative-path",
        served(Service(checks=(http_check(path="health"),))),
        f"{G}.services[0].checks[0].path",
        "must start with /",
    ),
    (
        "http-check-bad-method",
        served(Service(checks=(http_check(method="FETCH"),))),
        f"{G}.services[0].checks[0].method",
        '"GET"',
    ),
]


@pytest.mark.parametrize(
    ("j", "path", "fragment"), [c[1:] for c in BAD_DEPLOYMENT_JOBS], ids=[c[0] for c in BAD_DEPLOYMENT_JOBS]
)
def test_validate_job__deployment_problem__names_the_field(j: Job, path: str, fragment: str) -> None:
    errors = errors_of(j)
    assert [e.path for e in errors] == [path]
    assert fragment in errors[0].message


@pytest.mark.parametrize(
    "j",
    [
        updated(canary=2, auto_promote=True, health_check="checks"),
        updated(health_check="manual"),
        # progress_deadline 0: no progress deadline, so any healthy_deadline goes.
        updated(healthy_deadline_ns=HOUR, progress_deadline_ns=0),
        updated(min_healthy_time_ns=0),
        with_group(job(type="system"), count=1, update=UpdateStrategy(max_parallel=1)),
        served(
            Service(name="web", port="http", checks=(ServiceCheck(type="http", path="/"),)),
            Service(checks=(ServiceCheck(type="script", command="/bin/true", task="server"),)),
            task_services=(
                Service(
                    checks=(ServiceCheck(type="tcp", port="http"), ServiceCheck(type="script", command="x"))
                ),
            ),
        ),
    ],
    ids=["canary-auto-promote", "manual", "no-progress-deadline", "min-healthy-time-0", "system", "services"],
)
def test_validate_job__deployment_settings__valid(j: Job) -> None:
    validate_job(j)


def test_validate_job__deployment_problems__all_reported() -> None:
    j = with_group(
        updated(canary=-1, health_check="", min_healthy_time_ns=HOUR),
        services=(Service(checks=(ServiceCheck(type="script"), ServiceCheck(type="tcp"))),),
    )
    assert set(paths_of(j)) == {
        f"{G}.update.canary",
        f"{G}.update.health_check",
        f"{G}.update.min_healthy_time_ns",
        f"{G}.services[0].checks[0].command",
        f"{G}.services[0].checks[0].task",
        f"{G}.services[0].checks[1].port",
    }


def test_canonicalize_job__api_update_without_deadline_or_mode__gets_the_defaults() -> None:
    """Protobuf cannot send "unset": 0 and "" there mean the defaults (0 is no valid
    healthy_deadline, "" no mode); a progress_deadline of 0 stays (it means none)."""
    raw = with_group(
        job(),
        update=UpdateStrategy(max_parallel=2, healthy_deadline_ns=0, health_check="", progress_deadline_ns=0),
    )
    update = canonicalize_job(raw).groups[0].update
    assert update == UpdateStrategy(max_parallel=2, progress_deadline_ns=0)
    validate_job(canonicalize_job(raw))


@pytest.mark.parametrize(("j", "path", "fragment"), [c[1:] for c in BAD_JOBS], ids=[c[0] for c in BAD_JOBS])
def test_validate_job__one_problem__names_the_field(j: Job, path: str, fragment: str) -> None:
    errors = errors_of(j)
    assert [e.path for e in errors] == [path]
    assert fragment in errors[0].message


def test_validate_job__many_problems__reports_all_of_them() -> None:
    j = with_task(with_group(job(id="", priority=0), count=-1), resources=Resources(memory_mb=0))
    assert paths_of(j) == [
        "job.id",
        "job.priority",
        "job.groups[0].count",
        "job.groups[0].tasks[0].resources.memory_mb",
    ]


def test_validate_job__uncanonical_task_without_resources__is_not_an_error() -> None:
    validate_job(with_task(resources=None))


def test_validation_error__str_joins_path_and_message() -> None:
    err = ValidationError([FieldError("job.id", "must not be empty"), FieldError("job.type", "bad")])
    assert str(err) == "job.id: must not be empty; job.type: bad"
    assert isinstance(err, ValueError)


def test_validation_error__pickles_with_its_errors() -> None:
    err = ValidationError([FieldError("node.name", "must not be empty")])
    copy = pickle.loads(pickle.dumps(err))
    assert copy.errors == err.errors
    assert str(copy) == str(err)


# ---------------------------------------------------------------------------------------
# Canonical form


def test_canonicalize_job__zero_values__become_defaults() -> None:
    raw = Job(id="web", namespace="", priority=0, datacenters=(), groups=(TaskGroup(name="g", count=0),))
    j = canonicalize_job(raw)
    assert (j.name, j.namespace, j.priority, j.datacenters) == ("web", "default", 50, ("*",))
    assert j.groups[0].count == 0


def test_canonicalize_job__explicit_values__are_kept() -> None:
    raw = Job(id="web", name="Web", namespace="prod", priority=70, datacenters=("dc2",))
    j = canonicalize_job(raw)
    assert (j.name, j.namespace, j.priority, j.datacenters) == ("Web", "prod", 70, ("dc2",))


@pytest.mark.parametrize(
    ("job_type", "update", "reschedule", "restart"),
    [
        (
            "service",
            UpdateStrategy(),
            ReschedulePolicy(
                delay_ns=30 * SECOND, delay_function="exponential", max_delay_ns=HOUR, unlimited=True
            ),
            RestartPolicy(attempts=2, interval_ns=1800 * SECOND, delay_ns=15 * SECOND, mode="fail"),
        ),
        (
            "batch",
            None,
            ReschedulePolicy(
                attempts=1,
                interval_ns=24 * HOUR,
                delay_ns=5 * SECOND,
                delay_function="constant",
                unlimited=False,
            ),
            RestartPolicy(attempts=3, interval_ns=24 * HOUR, delay_ns=15 * SECOND, mode="fail"),
        ),
        ("system", None, None, RestartPolicy(attempts=2, interval_ns=1800 * SECOND, delay_ns=15 * SECOND)),
        ("sysbatch", None, None, RestartPolicy(attempts=3, interval_ns=24 * HOUR, delay_ns=15 * SECOND)),
    ],
    ids=["service", "batch", "system", "sysbatch"],
)
def test_canonicalize_job__group_policies__default_by_job_type(
    job_type: str, update: UpdateStrategy | None, reschedule: ReschedulePolicy | None, restart: RestartPolicy
) -> None:
    group = canonicalize_job(Job(id="j", type=job_type, groups=(TaskGroup(name="g"),))).groups[0]
    assert group.update == update
    assert group.reschedule == reschedule
    assert group.restart == restart


def test_canonicalize_job__job_update__is_inherited_by_groups_without_one() -> None:
    job_update = UpdateStrategy(max_parallel=4)
    own = UpdateStrategy(max_parallel=2)
    raw = Job(id="j", update=job_update, groups=(TaskGroup(name="a"), TaskGroup(name="b", update=own)))
    a, b = canonicalize_job(raw).groups
    assert a.update == job_update
    assert b.update == own


def test_canonicalize_job__task_defaults() -> None:
    raw = Job(id="j", groups=(TaskGroup(name="g", tasks=(Task(name="t", config_json="", resources=None),)),))
    task = canonicalize_job(raw).groups[0].tasks[0]
    assert task.resources == Resources()
    assert task.config_json == "{}"


def test_canonicalize_job__periodic_without_time_zone__is_utc() -> None:
    raw = Job(id="j", type="batch", periodic=PeriodicConfig(spec="@daily", time_zone=""))
    periodic = canonicalize_job(raw).periodic
    assert periodic is not None and periodic.time_zone == "UTC"


def reference_canonicalize_job(job: Job) -> Job:
    """canonicalize_job as plain ``dataclasses.replace`` calls (what it is specialised from)."""
    periodic = job.periodic
    if periodic is not None and not periodic.time_zone:
        periodic = replace(periodic, time_zone="UTC")

    def task_of(task: Task) -> Task:
        return replace(task, resources=task.resources or Resources(), config_json=task.config_json or "{}")

    def update_of(update: UpdateStrategy | None) -> UpdateStrategy | None:
        if update is None:
            return None
        return replace(
            update,
            healthy_deadline_ns=update.healthy_deadline_ns or UpdateStrategy().healthy_deadline_ns,
            health_check=update.health_check or "task_states",
        )

    def group_of(group: TaskGroup) -> TaskGroup:
        reschedule = group.reschedule or job.reschedule
        if reschedule is None:
            reschedule = default_reschedule_policy(job.type)
        return replace(
            group,
            migrate=group.migrate or job.migrate,
            update=update_of(group.update or job.update or default_update_strategy(job.type)),
            reschedule=reschedule,
            restart=group.restart or default_restart_policy(job.type),
            tasks=tuple(task_of(task) for task in group.tasks),
        )

    return replace(
        job,
        name=job.name or job.id,
        namespace=job.namespace or DEFAULT_NAMESPACE,
        priority=job.priority or DEFAULT_PRIORITY,
        datacenters=tuple(job.datacenters) or (ANY_DATACENTER,),
        periodic=periodic,
        groups=tuple(group_of(group) for group in job.groups),
    )


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(raw=codec_values(Job), job_type=st.sampled_from([*JOB_TYPES, "", "bogus"]))
def test_canonicalize_job__random_job__matches_the_reference(raw: Job, job_type: str) -> None:
    raw = replace(raw, type=job_type)

    canonical = canonicalize_job(raw)

    assert_identical(canonical, reference_canonicalize_job(raw))
    assert_identical(canonicalize_job(canonical), canonical)


# ---------------------------------------------------------------------------------------
# Nodes


def node(**changes: Any) -> Node:
    return replace(Node(id="n1", name="client-1", datacenter="dc1", resources=NodeResources()), **changes)


def test_validate_node__valid() -> None:
    validate_node(node())
    validate_node(node(resources=None, status="ready", scheduling_eligibility="ineligible"))


BAD_NODES: list[tuple[str, Node, str]] = [
    ("empty-id", node(id=""), "node.id"),
    ("empty-name", node(name=""), "node.name"),
    ("empty-datacenter", node(datacenter=""), "node.datacenter"),
    ("bad-status", node(status="up"), "node.status"),
    ("bad-eligibility", node(scheduling_eligibility="maybe"), "node.scheduling_eligibility"),
    ("negative-cpu", node(resources=NodeResources(cpu_mhz=-1)), "node.resources.cpu_mhz"),
    ("negative-memory", node(resources=NodeResources(memory_mb=-1)), "node.resources.memory_mb"),
    ("negative-disk", node(resources=NodeResources(disk_mb=-1)), "node.resources.disk_mb"),
    ("negative-max-allocs", node(resources=NodeResources(max_allocs=-1)), "node.resources.max_allocs"),
    (
        "negative-reserved",
        node(resources=NodeResources(reserved=Resources(memory_mb=-5))),
        "node.resources.reserved.memory_mb",
    ),
    (
        "reserved-port-0",
        node(resources=NodeResources(reserved_ports=(22, 0))),
        "node.resources.reserved_ports[1]",
    ),
    ("min-port-0", node(resources=NodeResources(min_dynamic_port=0)), "node.resources.min_dynamic_port"),
    (
        "max-port-too-big",
        node(resources=NodeResources(max_dynamic_port=70000)),
        "node.resources.max_dynamic_port",
    ),
    (
        "port-range-inverted",
        node(resources=NodeResources(min_dynamic_port=30000, max_dynamic_port=20000)),
        "node.resources.min_dynamic_port",
    ),
]


@pytest.mark.parametrize(("n", "path"), [c[1:] for c in BAD_NODES], ids=[c[0] for c in BAD_NODES])
def test_validate_node__one_problem__names_the_field(n: Node, path: str) -> None:
    with pytest.raises(ValidationError) as info:
        validate_node(n)
    assert [e.path for e in info.value.errors] == [path]


def test_validate_node__reserved_cpu_may_be_zero() -> None:
    validate_node(node(resources=NodeResources(reserved=Resources(cpu_mhz=0, memory_mb=0))))


@pytest.mark.parametrize("status", ["initializing", "ready", "down", "disconnected"])
def test_validate_node_status__known__passes(status: str) -> None:
    validate_node_status(status, "req.status")


def test_validate_node_status__unknown__names_the_given_path() -> None:
    with pytest.raises(ValidationError) as info:
        validate_node_status("up", "req.status")
    assert info.value.errors == (FieldError("req.status", info.value.errors[0].message),)
    assert '"ready"' in str(info.value)


@pytest.mark.parametrize("value", ["eligible", "ineligible"])
def test_validate_eligibility__known__passes(value: str) -> None:
    validate_eligibility(value, "req.eligibility")


def test_validate_eligibility__unknown__names_the_given_path() -> None:
    with pytest.raises(ValidationError) as info:
        validate_eligibility("drain", "req.eligibility")
    assert [e.path for e in info.value.errors] == ["req.eligibility"]


# ---------------------------------------------------------------------------------------
# Bounds: every string, list, map, count and integer, refused naming the field


MB = 1_000_000

JOB_BOMBS: list[tuple[str, Job, str]] = [
    ("count-2**31-1", with_group(count=2**31 - 1), "job.groups[0].count"),
    ("count-over-limit", with_group(count=DEFAULT_LIMITS.max_group_count + 1), "job.groups[0].count"),
    ("long-group-name", with_group(name="g" * MB), "job.groups[0].name"),
    ("long-task-name", with_task(name="t" * 129), "job.groups[0].tasks[0].name"),
    ("long-namespace", job(namespace="n" * 129), "job.namespace"),
    ("long-meta-value", job(meta={"k": "v" * 4097}), 'job.meta["k"]'),
    ("long-meta-key", job(meta={"k" * 129: "v"}), "job.meta"),
    ("many-meta", job(meta={f"k{i}": "v" for i in range(513)}), "job.meta"),
    ("many-env", with_task(env={f"K{i}": "v" for i in range(513)}), "job.groups[0].tasks[0].env"),
    ("many-groups", job(groups=job().groups * 257), "job.groups"),
    ("many-datacenters", job(datacenters=("dc1",) * 257), "job.datacenters"),
    (
        "many-constraints",
        job(constraints=(Constraint(attribute="${attr.a}", value="b"),) * 257),
        "job.constraints",
    ),
    (
        "long-constraint-value",
        job(constraints=(Constraint(attribute="${attr.a}", operator="regexp", value="a" * MB),)),
        "job.constraints[0].value",
    ),
    (
        "huge-config",
        with_task(config_json='{"a": "' + "x" * (64 * 1024) + '"}'),
        "job.groups[0].tasks[0].config_json",
    ),
    ("deep-config", with_task(config_json="[" * 33 + "]" * 33), "job.groups[0].tasks[0].config_json"),
    (
        "int64-overflow-kill-timeout",
        with_task(kill_timeout_ns=2**63),
        "job.groups[0].tasks[0].kill_timeout_ns",
    ),
    (
        "int64-overflow-memory",
        with_task(resources=Resources(cpu_mhz=100, memory_mb=10**30)),
        "job.groups[0].tasks[0].resources.memory_mb",
    ),
    ("int64-underflow-disk", with_group(ephemeral_disk_mb=-(2**63) - 1), "job.groups[0].ephemeral_disk_mb"),
    (
        "int32-overflow-weight",
        job(spreads=(Spread(attribute="${node.datacenter}", weight=2**31),)),
        "job.spreads[0].weight",
    ),
    (
        "int32-overflow-port",
        with_group(network=NetworkResource(reserved_ports=(Port(label="http", value=2**40),))),
        "job.groups[0].network.reserved_ports[0].value",
    ),
    ("uint64-negative-version", job(version=-1), "job.version"),
    ("surrogate-in-id", job(id="web\ud800"), "job.id"),
    ("surrogate-in-config", with_task(config_json='{"a": "\ud800"}'), "job.groups[0].tasks[0].config_json"),
]


@pytest.mark.parametrize(("case", "bad", "path"), JOB_BOMBS, ids=[c[0] for c in JOB_BOMBS])
def test_validate_job__over_a_bound__refused_naming_the_field(case: str, bad: Job, path: str) -> None:
    errors = errors_of(bad)

    assert [e.path for e in errors] == [path], case
    # The message never grows with the input (a 1 MB value is not echoed back).
    assert len(str(ValidationError(errors))) < 300


def test_validate_job__count_at_the_limit__valid() -> None:
    validate_job(with_group(count=DEFAULT_LIMITS.max_group_count))


def test_validate_job__limits_are_the_callers__a_larger_count_passes_when_allowed() -> None:
    big = with_group(count=20_000)
    with pytest.raises(ValidationError):
        validate_job(big)
    validate_job(big, Limits(max_group_count=20_000))


def test_validate_job__bounds_first__no_rule_runs_on_an_oversized_job() -> None:
    # A bogus operator alone is reported; past a bound, only the bound is.
    bogus = Constraint(attribute="${attr.a}", operator="bogus" * 1000, value="x")
    errors = errors_of(job(constraints=(bogus,)))
    assert [e.path for e in errors] == ["job.constraints[0].operator"]
    assert "must be at most 4096" in errors[0].message


def test_validate_job__many_problems__the_first_twenty_are_listed() -> None:
    bad = Constraint(attribute="", operator="=", value="")
    errors = errors_of(job(constraints=(bad,) * 200))
    assert len(errors) == MAX_REPORTED_ERRORS + 1
    assert errors[-1].path == "..."


def test_validate_job__long_quoted_value__cut_short_in_the_message() -> None:
    errors = errors_of(job(type="x" * 100))
    assert [e.path for e in errors] == ["job.type"]
    assert "(100 characters)" in errors[0].message and "x" * 100 not in errors[0].message


NODE_BOMBS: list[tuple[str, Node, str]] = [
    ("1MB-name", node(name="n" * MB), "node.name"),
    ("long-id", node(id="i" * 129), "node.id"),
    ("many-attributes", node(attributes={f"a{i}": "1" for i in range(513)}), "node.attributes"),
    ("long-attribute", node(attributes={"kernel.name": "l" * 4097}), 'node.attributes["kernel.name"]'),
    ("many-events", node(events=(NodeEvent(message="m"),) * 257), "node.events"),
    (
        "long-event-detail",
        node(events=(NodeEvent(details={"d": "x" * 4097}),)),
        'node.events[0].details["d"]',
    ),
    ("int64-overflow-cpu", node(resources=NodeResources(cpu_mhz=2**63)), "node.resources.cpu_mhz"),
    (
        "int32-overflow-port",
        node(resources=NodeResources(reserved_ports=(2**31,))),
        "node.resources.reserved_ports[0]",
    ),
]


@pytest.mark.parametrize(("case", "bad", "path"), NODE_BOMBS, ids=[c[0] for c in NODE_BOMBS])
def test_validate_node__over_a_bound__refused_naming_the_field(case: str, bad: Node, path: str) -> None:
    with pytest.raises(ValidationError) as info:
        validate_node(bad)
    assert [e.path for e in info.value.errors] == [path], case
    assert len(str(info.value)) < 300


def _int32_fields(descriptor: Any, seen: set[str]) -> set[tuple[str, str]]:
    from google.protobuf.descriptor import FieldDescriptor

    found: set[tuple[str, str]] = set()
    if descriptor.full_name in seen:
        return found
    seen.add(descriptor.full_name)
    for fd in descriptor.fields:
        if fd.type in (FieldDescriptor.TYPE_INT32, FieldDescriptor.TYPE_UINT32, FieldDescriptor.TYPE_SINT32):
            found.add((descriptor.name, fd.name))
        if fd.message_type is not None and not fd.message_type.GetOptions().map_entry:
            found |= _int32_fields(fd.message_type, seen)
    return found


def test_int32_fields__match_the_proto_of_jobs_and_nodes() -> None:
    from drover.v1 import structs_pb2

    seen: set[str] = set()
    in_proto = _int32_fields(structs_pb2.Job.DESCRIPTOR, seen) | _int32_fields(
        structs_pb2.Node.DESCRIPTOR, seen
    )
    assert in_proto == INT32_FIELDS
