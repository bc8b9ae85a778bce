"""drover.server.jobspec: HCL and JSON jobspecs to canonical jobs, and errors that name the place."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import hcl2
import pytest
from google.protobuf import json_format
from hypothesis import given
from hypothesis import strategies as st

from drover.scheduler.structs import (
    JOB_TYPES,
    Constraint,
    Job,
    NetworkResource,
    PeriodicConfig,
    Port,
    ReschedulePolicy,
    Resources,
    RestartPolicy,
    Service,
    ServiceCheck,
    Task,
    TaskGroup,
    UpdateStrategy,
)
from drover.scheduler.validate import canonicalize_job, validate_job
from drover.server.codec import to_proto
from drover.server.jobspec import JobspecError, parse_duration, parse_jobspec
from drover.v1 import structs_pb2

JOBS_DIR = Path(__file__).resolve().parents[2] / "deploy" / "jobs"
SECOND = 1_000_000_000
MINUTE = 60 * SECOND
HOUR = 60 * MINUTE


def parse(text: str) -> Job:
    return parse_jobspec(text)


def one_task_job(task_body: str = 'driver = "mock"', group_body: str = "", job_body: str = "") -> str:
    return f"""
job "web" {{
  {job_body}
  group "api" {{
    {group_body}
    task "server" {{
      {task_body}
    }}
  }}
}}
"""


def task_of(j: Job) -> Task:
    return j.groups[0].tasks[0]


# ---------------------------------------------------------------------------------------
# The example files


def example(name: str) -> Job:
    path = JOBS_DIR / name
    return parse_jobspec(path.read_text(), filename=str(path))


@pytest.mark.parametrize("name", ["demo.hcl", "system-example.hcl", "batch-example.hcl"])
def test_example__parses_and_validates(name: str) -> None:
    validate_job(example(name))


def test_example__demo() -> None:
    j = example("demo.hcl")
    assert (j.id, j.type, len(j.groups)) == ("demo", "service", 1)
    group = j.groups[0]
    assert (group.name, group.count) == ("web", 3)
    assert group.network == NetworkResource(dynamic_ports=(Port(label="http"),))
    task = task_of(j)
    assert (task.name, task.driver) == ("server", "mock")
    assert json.loads(task.config_json) == {"run_for": "1h"}
    assert task.resources == Resources(cpu_mhz=100, memory_mb=64)


def test_example__system() -> None:
    j = example("system-example.hcl")
    assert j.type == "system"
    assert j.groups[0].count == 1
    network = j.groups[0].network
    assert network is not None
    assert [p.value for p in network.reserved_ports] == [9100]
    assert task_of(j).driver == "mock"


def test_example__batch() -> None:
    j = example("batch-example.hcl")
    assert (j.type, j.groups[0].count) == ("batch", 2)
    assert json.loads(task_of(j).config_json) == {"run_for": "5s", "exit_code": 0}


@pytest.mark.parametrize("name", ["demo.hcl", "system-example.hcl", "batch-example.hcl"])
def test_example__round_trips_through_proto_json(name: str) -> None:
    j = example(name)
    text = json_format.MessageToJson(to_proto(j, structs_pb2.Job()))
    assert parse(text) == j


@pytest.mark.parametrize("name", ["demo.hcl", "system-example.hcl", "batch-example.hcl"])
def test_example__round_trips_through_hcl_shaped_json(name: str) -> None:
    options = hcl2.SerializationOptions(strip_string_quotes=True, explicit_blocks=False, with_comments=False)
    data = hcl2.loads((JOBS_DIR / name).read_text(), serialization_options=options)
    assert parse(json.dumps(data)) == example(name)


# ---------------------------------------------------------------------------------------
# The full shape


FULL = """
job "web" {
  name        = "Web"
  namespace   = "prod"
  type        = "service"
  priority    = 70
  datacenters = ["dc1", "dc2"]

  meta {
    owner = "team-a"
    tier  = 1
  }

  constraint {
    attribute = "${attr.kernel.name}"
    value     = "linux"
  }

  constraint {
    operator = "distinct_hosts"
    value    = "true"
  }

  affinity {
    attribute = "${node.class}"
    operator  = "!="
    value     = "small"
    weight    = -40
  }

  spread {
    attribute = "${node.datacenter}"
    weight    = 80
  }

  update {
    max_parallel = 2
    stagger      = "10s"
    auto_revert  = true
  }

  group "api" {
    count = 0

    constraint {
      attribute = "${meta.rack}"
      operator  = "distinct_property"
      value     = 2
    }

    update {
      min_healthy_time = "5s"
    }

    reschedule {
      attempts = 5
      interval = "1h"
    }

    restart {
      mode = "delay"
    }

    disconnect {
      lost_after = "6h"
      replace    = false
      reconcile  = "keep_original"
    }

    ephemeral_disk {
      size = 500
    }

    network {
      mbits = 10
      port "http" {}
      port "admin" {
        to = 9000
      }
      port "db" {
        static = 5432
        to     = 5432
      }
    }

    meta = {
      role = "frontend"
    }

    task "server" {
      driver = "mock"
      leader = true

      config {
        run_for = "1h"
        args    = ["--name", "${node.unique.name}", "$${NOT_INTERPOLATED}"]
        limits {
          nofile = 1024
        }
      }

      env {
        NODE = "${node.unique.name}"
      }

      meta {
        version = "1.2"
      }

      resources {
        cpu    = 250
        memory = 128
        disk   = 10
      }

      constraint {
        attribute = "${attr.driver.mock}"
        operator  = "is_set"
      }

      kill_timeout = "45s"
    }

    task "sidecar" {
      driver = "mock"
    }
  }
}
"""


def test_full_job__every_supported_key() -> None:
    j = parse(FULL)
    validate_job(j)
    assert (j.id, j.name, j.namespace, j.type, j.priority) == ("web", "Web", "prod", "service", 70)
    assert j.datacenters == ("dc1", "dc2")
    assert j.meta == {"owner": "team-a", "tier": "1"}
    assert j.constraints == (
        Constraint(attribute="${attr.kernel.name}", operator="=", value="linux"),
        Constraint(attribute="", operator="distinct_hosts", value="true"),
    )
    assert [(a.operator, a.weight) for a in j.affinities] == [("!=", -40)]
    assert [(s.attribute, s.weight) for s in j.spreads] == [("${node.datacenter}", 80)]
    assert j.update == UpdateStrategy(max_parallel=2, stagger_ns=10 * SECOND, auto_revert=True)

    group = j.groups[0]
    assert group.count == 0
    assert group.constraints == (
        Constraint(attribute="${meta.rack}", operator="distinct_property", value="2"),
    )
    # A group's partial update block is laid over the job's.
    assert group.update == UpdateStrategy(
        max_parallel=2, stagger_ns=10 * SECOND, min_healthy_time_ns=5 * SECOND, auto_revert=True
    )
    assert group.reschedule == ReschedulePolicy(attempts=5, interval_ns=HOUR)
    assert group.restart == RestartPolicy(mode="delay")
    assert group.disconnect is not None
    assert (group.disconnect.lost_after_ns, group.disconnect.replace) == (6 * HOUR, False)
    assert group.disconnect.reconcile == "keep_original"
    assert group.ephemeral_disk_mb == 500
    assert group.meta == {"role": "frontend"}
    assert group.network == NetworkResource(
        reserved_ports=(Port(label="db", value=5432, to=5432),),
        dynamic_ports=(Port(label="http"), Port(label="admin", to=9000)),
        mbits=10,
    )

    server, sidecar = group.tasks
    assert server.leader and not sidecar.leader
    assert json.loads(server.config_json) == {
        "run_for": "1h",
        "args": ["--name", "${node.unique.name}", "${NOT_INTERPOLATED}"],
        "limits": [{"nofile": 1024}],
    }
    assert server.env == {"NODE": "${node.unique.name}"}
    assert server.meta == {"version": "1.2"}
    assert server.resources == Resources(cpu_mhz=250, memory_mb=128, disk_mb=10)
    assert server.constraints == (Constraint(attribute="${attr.driver.mock}", operator="is_set"),)
    assert server.kill_timeout_ns == 45 * SECOND
    assert sidecar.resources == Resources()
    assert sidecar.config_json == "{}"


def test_minimal_job__gets_canonical_defaults() -> None:
    j = parse('job "w" { group "g" { task "t" { driver = "mock" } } }')
    assert (j.name, j.namespace, j.type, j.priority, j.datacenters) == ("w", "default", "service", 50, ("*",))
    assert j.groups[0].count == 1
    assert j.groups[0].ephemeral_disk_mb == 300
    assert j == canonicalize_job(j)


def test_batch_reschedule_block__is_laid_over_the_batch_defaults() -> None:
    j = parse(one_task_job(job_body='type = "batch"', group_body="reschedule {\n attempts = 3\n }"))
    assert j.groups[0].reschedule == ReschedulePolicy(
        attempts=3, interval_ns=24 * HOUR, delay_ns=5 * SECOND, delay_function="constant", unlimited=False
    )


@pytest.mark.parametrize(
    ("body", "schedules", "time_zone", "enabled"),
    [
        ('cron = "*/5 * * * *"', ("*/5 * * * *",), "UTC", True),
        (
            'crons = ["@daily", "@hourly"]\n time_zone = "Europe/Berlin"',
            ("@daily", "@hourly"),
            "Europe/Berlin",
            True,
        ),
        ('cron = "@weekly"\n enabled = false\n prohibit_overlap = true', ("@weekly",), "UTC", False),
    ],
    ids=["cron", "crons-keeps-all", "disabled"],
)
def test_periodic(body: str, schedules: tuple[str, ...], time_zone: str, enabled: bool) -> None:
    j = parse(one_task_job(job_body=f'type = "batch"\n periodic {{\n {body}\n }}'))
    assert j.periodic is not None
    assert (j.periodic.schedules(), j.periodic.time_zone, j.periodic.enabled) == (
        schedules,
        time_zone,
        enabled,
    )
    validate_job(j)


def test_parameterized() -> None:
    body = 'type = "batch"\n parameterized {\n payload = "required"\n meta_required = ["a"]\n meta_optional = ["b"]\n }'
    j = parse(one_task_job(job_body=body))
    assert j.parameterized is not None
    assert (j.parameterized.payload, j.parameterized.meta_required, j.parameterized.meta_optional) == (
        "required",
        ("a",),
        ("b",),
    )


def test_heredoc__is_plain_text_each_line_with_its_newline() -> None:
    """HCL's heredoc holds every line between the markers, the last one's newline included
    (a template's rendered file, a script, end as written)."""
    j = parse(one_task_job(task_body='driver = "mock"\n env {\n SCRIPT = <<EOF\necho hi\nEOF\n }'))
    assert task_of(j).env == {"SCRIPT": "echo hi\n"}
    empty = parse(one_task_job(task_body='driver = "mock"\n env {\n SCRIPT = <<EOF\nEOF\n }'))
    assert task_of(empty).env == {"SCRIPT": ""}


def test_parse__does_not_validate() -> None:
    j = parse(one_task_job(group_body="count = -1"))
    assert j.groups[0].count == -1


# ---------------------------------------------------------------------------------------
# Durations


@pytest.mark.parametrize(
    ("text", "ns"),
    [
        ("0", 0),
        ("30s", 30 * SECOND),
        ("5m", 5 * MINUTE),
        ("1h30m", HOUR + 30 * MINUTE),
        ("250ms", 250_000_000),
        ("1.5s", 1_500_000_000),
        ("10us", 10_000),
        ("10µs", 10_000),
        ("100ns", 100),
        ("2h45m30s", 2 * HOUR + 45 * MINUTE + 30 * SECOND),
        ("-1s", -SECOND),
    ],
    ids=["zero", "30s", "5m", "1h30m", "250ms", "fraction", "us", "micro-sign", "ns", "compound", "negative"],
)
def test_parse_duration(text: str, ns: int) -> None:
    assert parse_duration(text) == ns


@pytest.mark.parametrize("text", ["", "5", "1x", "s", "1h 30m", "1.s5", "--1s", "h1"])
def test_parse_duration__rejects(text: str) -> None:
    with pytest.raises(ValueError, match="invalid duration"):
        parse_duration(text)


@pytest.mark.parametrize(
    ("value", "ns"),
    [('"45s"', 45 * SECOND), ("45", 45 * SECOND), ('"1m30s"', 90 * SECOND)],
    ids=["string", "integer-seconds", "compound"],
)
def test_duration_field__string_or_integer_seconds(value: str, ns: int) -> None:
    j = parse(one_task_job(task_body=f'driver = "mock"\n kill_timeout = {value}'))
    assert task_of(j).kill_timeout_ns == ns


# ---------------------------------------------------------------------------------------
# Ports


@pytest.mark.parametrize(
    ("port", "reserved", "dynamic"),
    [
        ('port "http" {}', (), (Port(label="http"),)),
        ('port "http" {\n to = 8080\n }', (), (Port(label="http", to=8080),)),
        ('port "db" {\n static = 5432\n }', (Port(label="db", value=5432),), ()),
        ('port "db" {\n static = 5432\n to = 6432\n }', (Port(label="db", value=5432, to=6432),), ()),
    ],
    ids=["dynamic", "dynamic-mapped", "static", "static-mapped"],
)
def test_network_port(port: str, reserved: tuple[Port, ...], dynamic: tuple[Port, ...]) -> None:
    j = parse(one_task_job(group_body=f"network {{\n {port}\n }}"))
    assert j.groups[0].network == NetworkResource(reserved_ports=reserved, dynamic_ports=dynamic)


# ---------------------------------------------------------------------------------------
# Bad input: the message names the place


BAD_HCL: list[tuple[str, str, str]] = [
    ("typo-in-group", one_task_job(group_body="cout = 3"), 'job "web" group "api": unknown key "cout"'),
    ("typo-hint", one_task_job(group_body="cout = 3"), '(did you mean "count"?)'),
    ("typo-in-job", 'job "web" {\n datacenter = ["dc1"]\n }', 'job "web": unknown key "datacenter"'),
    (
        "typo-in-task",
        one_task_job(task_body='driver = "mock"\n drvier = "x"'),
        'job "web" group "api" task "server": unknown key "drvier"',
    ),
    (
        "typo-in-resources",
        one_task_job(task_body='driver = "mock"\n resources {\n memory_mb = 5\n }'),
        'job "web" group "api" task "server" resources: unknown key "memory_mb"',
    ),
    (
        "typo-in-update",
        'job "web" {\n update {\n max_paralel = 1\n }\n }',
        'job "web" update: unknown key "max_paralel"',
    ),
    (
        "typo-in-port",
        one_task_job(group_body='network {\n port "http" {\n statik = 80\n }\n }'),
        'job "web" group "api" network port "http": unknown key "statik"',
    ),
    (
        "typo-in-second-constraint",
        'job "web" {\n constraint {\n attribute = "a"\n }\n constraint {\n atribute = "b"\n }\n }',
        'job "web" constraint[1]: unknown key "atribute"',
    ),
    # ``variable`` and ``locals`` are HCL2 blocks now (tests/unit/test_jobspec_eval.py).
    ("unknown-top-level", 'provider "x" {}', 'line 1: top level: unknown key "provider"'),
    (
        "count-string",
        one_task_job(group_body='count = "three"'),
        'job "web" group "api" count: expected a number, got "three"',
    ),
    (
        # An expression is evaluated now (``count = 1 + 2`` is 3): a string is still no count.
        "count-expression",
        one_task_job(group_body='count = "${1 + 2}x"'),
        'job "web" group "api" count: expected a number, got "3x"',
    ),
    ("count-fraction", one_task_job(group_body="count = 1.5"), "count: expected a number, got 1.5"),
    ("count-bool", one_task_job(group_body="count = true"), "count: expected a number, got true"),
    (
        "datacenters-string",
        'job "web" {\n datacenters = "dc1"\n }',
        'job "web" datacenters: expected a list of strings, got "dc1"',
    ),
    (
        "datacenters-nested-list",
        'job "web" {\n datacenters = [["dc1"]]\n }',
        'job "web" datacenters[0]: expected a string, got a list',
    ),
    (
        "priority-list",
        'job "web" {\n priority = [1]\n }',
        'job "web" priority: expected a number, got a list',
    ),
    (
        "leader-string",
        one_task_job(task_body='driver = "mock"\n leader = "yes"'),
        'task "server" leader: expected true or false, got "yes"',
    ),
    (
        "bad-duration",
        one_task_job(task_body='driver = "mock"\n kill_timeout = "5 sec"'),
        'task "server" kill_timeout: expected a duration like "30s" or "1h30m", got "5 sec"',
    ),
    (
        "static-port-string",
        one_task_job(group_body='network {\n port "db" {\n static = "x"\n }\n }'),
        'network port "db" static: expected a number, got "x"',
    ),
    (
        "meta-nested",
        'job "web" {\n meta {\n a = { b = 1 }\n }\n }',
        'job "web" meta a: expected a string, got a block',
    ),
    (
        "update-attribute-string",
        'job "web" {\n update = "fast"\n }',
        'job "web" update: expected a block, got "fast"',
    ),
    ("two-update-blocks", 'job "web" {\n update {}\n update {}\n }', 'job "web": only one "update" block'),
    (
        "duplicate-attribute",
        one_task_job(group_body="count = 1\n count = 2"),
        'line 6: job "web" group "api": duplicate key "count" (the first is on line 5)',
    ),
    (
        "attribute-then-block",
        'job "web" {\n meta = {}\n meta {}\n }',
        'line 3: job "web": duplicate key "meta" (the first is on line 2)',
    ),
    (
        "duplicate-in-config",
        one_task_job(task_body='driver = "mock"\n config {\n a = 1\n a = 2\n }'),
        'task "server" config: duplicate key "a"',
    ),
    (
        "group-without-label",
        'job "web" {\n group {\n meta = {}\n }\n }',
        'line 2: job "web": group block must be written as group "NAME" { ... } (its name is missing)',
    ),
    ("job-without-label", "job {\n}", 'top level: job block must be written as job "NAME"'),
    ("job-two-labels", 'job "a" "b" {\n}', 'top level: job block must be written as job "NAME"'),
    ("no-job", "# nothing here\n", "expected exactly one job block, found 0"),
    ("two-jobs", 'job "a" {}\njob "b" {}', "expected exactly one job block, found 2"),
    (
        "cron-and-crons",
        'job "web" {\n periodic {\n cron = "@daily"\n crons = ["@hourly"]\n }\n }',
        'job "web" periodic: set cron or crons, not both',
    ),
    ("syntax-missing-value", 'job "web" {\n  count =\n}', "line 2, column"),
    ("syntax-unclosed", 'job "web" {\n  type = "service"\n', "unexpected end of file"),
]


@pytest.mark.parametrize(("text", "message"), [c[1:] for c in BAD_HCL], ids=[c[0] for c in BAD_HCL])
def test_bad_hcl__names_the_place(text: str, message: str) -> None:
    with pytest.raises(JobspecError) as info:
        parse(text)
    assert message in str(info.value)
    assert "\n" not in str(info.value)


# ---------------------------------------------------------------------------------------
# Deployments: the update block's deployment keys, services and their checks

DEPLOYED = """
job "web" {
  update {
    max_parallel      = 2
    canary            = 1
    auto_promote      = true
    progress_deadline = "15m"
    health_check      = "checks"
  }

  group "api" {
    update {
      min_healthy_time = "3s"
      healthy_deadline = "2m"
    }

    network {
      port "http" {}
    }

    service {
      name = "web"
      port = "http"
      tags = ["v1", "public"]

      check {
        name     = "alive"
        type     = "http"
        path     = "/health"
        method   = "HEAD"
        interval = "5s"
        timeout  = "1s"
      }

      check {
        type    = "script"
        command = "/bin/check"
        args    = ["--quick"]
        task    = "server"
      }
    }

    task "server" {
      driver = "mock"

      service {
        provider = "nomad"

        check {
          type     = "tcp"
          port     = "http"
          interval = "2s"
          timeout  = "500ms"
        }
      }
    }
  }
}
"""


def test_update__deployment_keys__parsed_and_merged_into_the_group() -> None:
    j = parse(DEPLOYED)
    validate_job(j)
    job_update = UpdateStrategy(
        max_parallel=2, canary=1, auto_promote=True, progress_deadline_ns=15 * MINUTE, health_check="checks"
    )
    assert j.update == job_update
    assert j.groups[0].update == replace(
        job_update, min_healthy_time_ns=3 * SECOND, healthy_deadline_ns=2 * MINUTE
    )


def test_update__job_level_only__every_group_inherits_it() -> None:
    j = parse(
        'job "web" {\n update {\n canary = 2\n progress_deadline = "0"\n }\n group "a" {\n task "t" {\n driver = "mock"\n }\n }\n }'
    )
    assert j.groups[0].update == UpdateStrategy(canary=2, progress_deadline_ns=0)


def test_service__group_and_task_services__parsed() -> None:
    j = parse(DEPLOYED)
    group = j.groups[0]
    assert group.services == (
        Service(
            name="web",
            port="http",
            tags=("v1", "public"),
            checks=(
                ServiceCheck(
                    name="alive",
                    type="http",
                    path="/health",
                    method="HEAD",
                    interval_ns=5 * SECOND,
                    timeout_ns=SECOND,
                ),
                ServiceCheck(type="script", command="/bin/check", args=("--quick",), task="server"),
            ),
        ),
    )
    assert group.tasks[0].services == (
        Service(
            checks=(ServiceCheck(type="tcp", port="http", interval_ns=2 * SECOND, timeout_ns=SECOND // 2),)
        ),
    )


def test_service__json_form__same_as_hcl() -> None:
    data = {
        "job": {
            "web": {
                "group": {
                    "api": {
                        "network": {"port": {"http": {}}},
                        "service": [{"port": "http", "check": [{"type": "tcp", "interval": "3s"}]}],
                        "task": {"server": {"driver": "mock"}},
                    }
                }
            }
        }
    }
    hcl = one_task_job(
        group_body='network {\n port "http" {}\n }\n service {\n port = "http"\n check {\n type = "tcp"\n interval = "3s"\n }\n }'
    )
    assert parse(json.dumps(data)) == parse(hcl)


SERVICE_REFUSED: list[tuple[str, str, str, str]] = [
    (
        "consul-provider",
        'service {\n provider = "consul"\n }',
        "",
        'job "web" group "api" service provider: only "nomad" is supported',
    ),
    (
        "on-update",
        'service {\n on_update = "ignore"\n }',
        "",
        'job "web" group "api" service: unknown key "on_update"',
    ),
    ("connect", "service {\n connect {}\n }", "", 'service: unknown key "connect"'),
    ("canary-tags", 'service {\n canary_tags = ["c"]\n }', "", 'service: unknown key "canary_tags"'),
    (
        "check-restart-typo",
        'service {\n check {\n type = "tcp"\n check_restart {\n limt = 3\n }\n }\n }',
        "",
        'job "web" group "api" service check check_restart: unknown key "limt" (did you mean "limit"?)',
    ),
    (
        "check-on-update",
        'service {\n check {\n on_update = "ignore"\n }\n }',
        "",
        'service check: unknown key "on_update"',
    ),
    (
        "task-service-consul",
        "",
        'driver = "mock"\n service {\n provider = "consul"\n }',
        'job "web" group "api" task "server" service provider: only "nomad" is supported',
    ),
    (
        "task-check-typo",
        "",
        'driver = "mock"\n service {\n check {\n intervall = "1s"\n }\n }',
        'task "server" service check: unknown key "intervall" (did you mean "interval"?)',
    ),
    (
        "check-bad-interval",
        'service {\n check {\n interval = "soon"\n }\n }',
        "",
        "service check interval: expected a duration",
    ),
    (
        "update-typo",
        "update {\n canaries = 1\n }",
        "",
        'update: unknown key "canaries" (did you mean "canary"?)',
    ),
]


@pytest.mark.parametrize(
    ("group_body", "task_body", "message"),
    [c[1:] for c in SERVICE_REFUSED],
    ids=[c[0] for c in SERVICE_REFUSED],
)
def test_service__keys_drover_does_not_run__refused_by_name(
    group_body: str, task_body: str, message: str
) -> None:
    text = one_task_job(task_body=task_body or 'driver = "mock"', group_body=group_body)
    with pytest.raises(JobspecError) as info:
        parse(text)
    assert message in str(info.value)


def test_error__starts_with_the_filename() -> None:
    with pytest.raises(JobspecError, match=r'^jobs/web\.hcl:2: job "web": unknown key "cout"'):
        parse_jobspec('job "web" {\n cout = 1\n }', filename="jobs/web.hcl")


def test_jobspec_error__is_a_value_error() -> None:
    assert issubclass(JobspecError, ValueError)


# ---------------------------------------------------------------------------------------
# JSON


def test_json__hcl_shaped__matches_hcl() -> None:
    data = {
        "job": [
            {
                "web": {
                    "datacenters": ["dc1"],
                    "group": [
                        {"api": {"count": 2, "task": [{"server": {"driver": "mock", "config": [{"x": 1}]}}]}}
                    ],
                }
            }
        ]
    }
    hcl = 'job "web" {\n datacenters = ["dc1"]\n group "api" {\n count = 2\n task "server" {\n driver = "mock"\n config {\n x = 1\n }\n }\n }\n }'
    assert parse(json.dumps(data)) == parse(hcl)


def test_json__hcl_json_objects_for_labelled_blocks() -> None:
    data = {"job": {"web": {"group": {"a": {"count": 1}, "b": {"count": 2}}, "update": {"max_parallel": 3}}}}
    j = parse(json.dumps(data))
    assert [(g.name, g.count) for g in j.groups] == [("a", 1), ("b", 2)]
    assert j.update == UpdateStrategy(max_parallel=3)


def test_json__hcl_shaped__keeps_dollar_escapes_verbatim() -> None:
    # HCL's $${ escape is HCL syntax; JSON strings are taken as they are.
    data = {"job": {"web": {"meta": {"a": "$${x}"}}}}
    assert parse(json.dumps(data)).meta == {"a": "$${x}"}


def test_json__proto_form() -> None:
    text = json.dumps(
        {
            "id": "web",
            "type": "batch",
            "groups": [
                {
                    "name": "api",
                    "count": 0,
                    "tasks": [{"name": "t", "driver": "mock", "killTimeoutNs": "7000000000"}],
                }
            ],
            "payload": "aGk=",
        }
    )
    j = parse(text)
    assert (j.id, j.name, j.type, j.priority, j.payload) == ("web", "web", "batch", 50, b"hi")
    assert j.groups[0].count == 0
    assert task_of(j).kill_timeout_ns == 7 * SECOND
    assert task_of(j).resources == Resources()
    assert j.groups[0].restart == RestartPolicy(attempts=3, interval_ns=24 * HOUR, delay_ns=15 * SECOND)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"id": "web", "grups": []}', 'no field named "grups"'),
        ('{"id": "web", "priority": "high"}', "invalid drover.v1.Job JSON"),
        ('{"id": "web",\n "groups": [}', "line 2, column 13: invalid JSON"),
        ('{"job": {"web": {"cout": 1}}}', 'job "web": unknown key "cout"'),
        ('{"job": {"web": {}}, "extra": 1}', 'top level: unknown key "extra"'),
        ('{"job": ["web"]}', 'job: expected a block like job "NAME" { ... }, got "web"'),
        ('{"job": {"web": {"group": {"api": 3}}}}', 'job "web": group block must be written as group "NAME"'),
    ],
    ids=[
        "proto-unknown-field",
        "proto-wrong-type",
        "syntax",
        "hcl-shaped-unknown-key",
        "hcl-shaped-unknown-top-level",
        "hcl-shaped-job-not-a-block",
        "hcl-shaped-group-not-a-block",
    ],
)
def test_json__bad_input(text: str, message: str) -> None:
    with pytest.raises(JobspecError) as info:
        parse(text)
    assert message in str(info.value)
    assert "\n" not in str(info.value)


# ---------------------------------------------------------------------------------------
# Canonical form is a fixed point

names = st.text(alphabet="abcxyz-", max_size=4)
small = st.integers(min_value=-2, max_value=120)
tasks = st.builds(
    Task,
    name=names,
    config_json=st.sampled_from(["", "{}", '{"run_for":"1s"}']),
    resources=st.none() | st.builds(Resources, cpu_mhz=small, memory_mb=small),
)
groups = st.builds(
    TaskGroup,
    name=names,
    count=small,
    tasks=st.lists(tasks, max_size=2).map(tuple),
    update=st.none() | st.builds(UpdateStrategy, max_parallel=small),
    reschedule=st.none() | st.builds(ReschedulePolicy, attempts=small),
    restart=st.none() | st.builds(RestartPolicy, attempts=small),
)
jobs = st.builds(
    Job,
    id=names,
    name=names,
    namespace=st.sampled_from(["", "default", "prod"]),
    type=st.sampled_from([*JOB_TYPES, "bogus"]),
    priority=small,
    datacenters=st.lists(names, max_size=2).map(tuple),
    groups=st.lists(groups, max_size=3).map(tuple),
    update=st.none() | st.builds(UpdateStrategy, max_parallel=small),
    periodic=st.none() | st.builds(PeriodicConfig, time_zone=st.sampled_from(["", "UTC", "Asia/Tokyo"])),
)


@given(jobs)
def test_canonicalize_job__is_idempotent(job: Job) -> None:
    once = canonicalize_job(job)
    assert canonicalize_job(once) == once


@given(jobs)
def test_canonicalize_job__keeps_identity_and_counts(job: Job) -> None:
    once = canonicalize_job(job)
    assert once.id == job.id
    assert [g.count for g in once.groups] == [g.count for g in job.groups]
    assert [g.name for g in once.groups] == [g.name for g in job.groups]


@given(jobs)
def test_parsed_jobs__are_already_canonical(job: Job) -> None:
    # parse_jobspec's output goes through the proto path too: canonical in, canonical out.
    once = canonicalize_job(job)
    text = json_format.MessageToJson(to_proto(once, structs_pb2.Job()))
    reparsed = parse(text)
    assert canonicalize_job(reparsed) == reparsed


# ---------------------------------------------------------------------------------------
# Forms seen in Nomad's own job files

_HEREDOC_JOB = """job "x" {
  group "g" {
    task "t" {
      driver = "raw_exec"
      config {
        command = "/bin/sh"
        args = ["-c", <<EOT
echo "one"%s
echo two
EOT%s
        ]
      }
    }
  }
}
"""


@pytest.mark.parametrize("after_marker", ["", "   ", "\t", " \t "], ids=["none", "spaces", "tab", "mixed"])
def test_heredoc__closing_marker_may_have_trailing_blanks(after_marker: str) -> None:
    job = parse_jobspec(_HEREDOC_JOB % ("   ", after_marker))
    args = json.loads(job.groups[0].tasks[0].config_json)["args"]
    # The body is kept as written, blanks at its own line ends included.
    assert args[1].startswith('echo "one"   \necho two')


def test_heredoc__marker_text_inside_the_body_does_not_end_it() -> None:
    text = _HEREDOC_JOB.replace("echo two", "echo EOT is a word") % ("", "")
    args = json.loads(parse_jobspec(text).groups[0].tasks[0].config_json)["args"]
    assert "echo EOT is a word" in args[1]


def test_task_directly_under_job__refused_saying_to_wrap_it_in_a_group() -> None:
    text = 'job "x" {\n  task "web" {\n    driver = "mock"\n  }\n}\n'
    with pytest.raises(JobspecError) as err:
        parse_jobspec(text)
    assert str(err.value) == (
        'line 2: job "x": task "web" must be inside a group: wrap it in group "web" { task "web" { ... } }'
    )
