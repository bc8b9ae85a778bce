"""Task lifecycle keys in a job file: lifecycle, kill_signal, shutdown_delay, task-level
restart, user; parsed, carried through the proto, and validated."""

from __future__ import annotations

import pytest

from drover.scheduler import structs
from drover.scheduler.structs import RestartPolicy, TaskLifecycle
from drover.scheduler.validate import ValidationError, canonicalize_job, validate_job
from drover.server.codec import from_proto, to_proto
from drover.server.jobspec import JobspecError, parse_jobspec
from drover.v1 import structs_pb2

SECOND = 1_000_000_000


def job_file(task_body: str, group_body: str = "", job_type: str = "service") -> str:
    return f"""
job "web" {{
  type = "{job_type}"
  group "api" {{
    {group_body}
    task "init" {{
      driver = "mock"
      {task_body}
    }}
    task "main" {{
      driver = "mock"
    }}
  }}
}}
"""


def test_every_lifecycle_key__parsed_and_kept_through_the_proto() -> None:
    job = parse_jobspec(
        job_file(
            """
      lifecycle {
        hook    = "prestart"
        sidecar = true
      }
      kill_signal    = "SIGINT"
      shutdown_delay = "2s"
      user           = "nobody"
      leader         = true
"""
        )
    )
    task = job.groups[0].tasks[0]
    assert task.lifecycle == TaskLifecycle(hook="prestart", sidecar=True)
    assert (task.kill_signal, task.shutdown_delay_ns, task.user, task.leader) == (
        "SIGINT",
        2 * SECOND,
        "nobody",
        True,
    )
    assert job.groups[0].tasks[1].lifecycle is None
    validate_job(canonicalize_job(job))
    assert from_proto(to_proto(job, structs_pb2.Job()), structs.Job) == job


def test_task_restart__laid_over_the_groups_policy() -> None:
    job = parse_jobspec(
        job_file(
            "restart {\n attempts = 9 \n}",
            group_body='restart {\n attempts = 1 \n delay = "3s" \n mode = "delay" \n}',
        )
    )
    init, main = job.groups[0].tasks
    group_restart = job.groups[0].restart
    assert group_restart is not None
    assert init.restart == RestartPolicy(
        attempts=9, interval_ns=group_restart.interval_ns, delay_ns=3 * SECOND, mode="delay"
    )
    assert main.restart is None  # the group's applies


def test_task_restart__without_a_group_block_over_the_job_types_default() -> None:
    job = parse_jobspec(job_file("restart {\n attempts = 0 \n}", job_type="batch"))
    restart = job.groups[0].tasks[0].restart
    assert restart is not None and restart.attempts == 0 and restart.mode == "fail"
    assert restart.delay_ns == 15 * SECOND  # batch's default delay


@pytest.mark.parametrize(
    ("body", "field", "message"),
    [
        ('lifecycle {\n hook = "prestrat" \n}', "lifecycle.hook", 'got "prestrat"'),
        ('kill_signal = "SIGFOO"', "kill_signal", 'got "SIGFOO"'),
        ('restart {\n mode = "sometimes" \n}', "restart.mode", 'got "sometimes"'),
    ],
)
def test_invalid_values__refused_naming_the_field(body: str, field: str, message: str) -> None:
    job = parse_jobspec(job_file(body))
    with pytest.raises(ValidationError) as caught:
        validate_job(canonicalize_job(job))
    assert f"job.groups[0].tasks[0].{field}" in str(caught.value)
    assert message in str(caught.value)


def test_unknown_key_in_lifecycle__refused() -> None:
    with pytest.raises(JobspecError, match='unknown key "sidekick"'):
        parse_jobspec(job_file('lifecycle {\n hook = "prestart" \n sidekick = true \n}'))
