"""Every problem of a job file at once (issue 15): repeated keys and blocks, labels left
out or doubled, unknown keys, values of the wrong type, for HCL, HCL-shaped JSON and
Nomad's API JSON, each with its line and its place; and ``drover job validate`` listing
them all as a real process."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from drover.cli import main
from drover.scheduler.validate import ValidationError, validate_job
from drover.server.jobspec import JobspecError, locate_problems, parse_jobspec

# Each mistake is on its own line, and the file goes on after every one of them.
MANY_MISTAKES = """\
job "web" {
  priorty = 50
  group {
    count = 1
    task "a" "b" {
      driver       = "mock"
      kill_timeout = "5 sec"
    }
  }
  group "api" {
    count = 1
    count = 2
    update {
      max_parallel = 1
    }
    update {
      max_paralel = 2
    }
    task "t" {
      driver = "mock"
      leader = "yes"
      meta = {}
      meta {}
    }
  }
}
job "other" {
  priority = "high"
}
"""

MANY_MISTAKES_ERRORS = (
    'web.hcl:2: job "web": unknown key "priorty" (did you mean "priority"?)',
    'web.hcl:3: job "web": group block must be written as group "NAME" { ... } (its name is missing)',
    'web.hcl:5: job "web" group: task block must be written as task "NAME" { ... } (it has the labels "a" "b")',
    'web.hcl:7: job "web" group task "a" kill_timeout: expected a duration like "30s" or "1h30m", got "5 sec"',
    'web.hcl:12: job "web" group "api": duplicate key "count" (the first is on line 11)',
    'web.hcl:16: job "web" group "api": only one "update" block is allowed (the first is on line 13)',
    'web.hcl:17: job "web" group "api" update[1]: unknown key "max_paralel" (did you mean "max_parallel"?)',
    'web.hcl:21: job "web" group "api" task "t" leader: expected true or false, got "yes"',
    'web.hcl:23: job "web" group "api" task "t": duplicate key "meta" (the first is on line 22)',
    "web.hcl:27: expected exactly one job block, found 2 (the first is on line 1)",
    'web.hcl:28: job "other" priority: expected a number, got "high"',
)


def _errors(text: str, filename: str) -> tuple[str, ...]:
    with pytest.raises(JobspecError) as caught:
        parse_jobspec(text, filename=filename)
    assert "\n" not in str(caught.value)
    return caught.value.errors


def test_hcl__every_mistake_reported_with_its_line_and_place() -> None:
    assert _errors(MANY_MISTAKES, "web.hcl") == MANY_MISTAKES_ERRORS


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('job "a" {\n  type = "batch"\n  type = "service"\n}\n', 'line 3: job "a": duplicate key "type"'),
        ('job "a" {\n  meta {}\n  meta = {}\n}\n', 'line 3: job "a": duplicate key "meta"'),
        ('job "a" {\n  periodic {}\n  periodic {}\n}\n', 'line 3: job "a": only one "periodic" block'),
        ('job {\n  group "g" {}\n}\n', 'line 1: top level: job block must be written as job "NAME"'),
        ('job "a" "b" {\n}\n', 'line 1: top level: job block must be written as job "NAME" { ... } (it has'),
        (
            'job "a" {\n  group "g" {\n    network {\n      port { static = 80 }\n    }\n  }\n}\n',
            'line 4: job "a" group "g" network: port block must be written as port "NAME"',
        ),
        (
            'job "a" {\n  group "g" {\n    task "t" {\n      config {\n        x = 1\n        x = 2\n      }\n    }\n  }\n}\n',
            'line 6: job "a" group "g" task "t" config: duplicate key "x"',
        ),
        (
            'variable "v" {\n  default = 1\n  default = 2\n}\njob "a" {}\n',
            'line 3: variable "v": duplicate key "default"',
        ),
        (
            'job "a" {\n  meta = {}\n  dynamic "meta" {\n    for_each = [1]\n    content {}\n  }\n}\n',
            'line 3: dynamic "meta": "meta" is set already',
        ),
    ],
    ids=[
        "attribute-twice",
        "block-then-attribute",
        "single-block-twice",
        "job-no-label",
        "job-two-labels",
        "port-no-label",
        "config-key-twice",
        "variable-key-twice",
        "dynamic-beside-attribute",
    ],
)
def test_hcl__each_kind_of_mistake__alone_is_refused_at_its_line(text: str, expected: str) -> None:
    assert any(error.startswith(expected) for error in _errors(text, "")), _errors(text, "")


def test_hcl__a_local_defined_twice__reported_once() -> None:
    text = 'locals {\n  a = 1\n  a = 2\n}\njob "x" {\n  priority = local.a\n}\n'
    assert _errors(text, "") == ("line 3: local.a is defined twice",)


def test_hcl__a_block_without_its_label__no_guessed_keys_from_inside_it() -> None:
    """``group { meta = {} }`` is not a group called "meta": only the label is reported,
    and a mistake inside the block is found as well."""
    text = 'job "a" {\n  group {\n    meta = {}\n    count = "x"\n  }\n}\n'
    assert _errors(text, "a.hcl") == (
        'a.hcl:2: job "a": group block must be written as group "NAME" { ... } (its name is missing)',
        'a.hcl:4: job "a" group count: expected a number, got "x"',
    )


def test_hcl__dynamic_block_without_labels__refused_like_a_written_one() -> None:
    text = 'job "a" {\n  dynamic "group" {\n    for_each = ["x"]\n    content {\n      count = 1\n    }\n  }\n}\n'
    errors = _errors(text, "")
    assert errors == (
        'line 4: job "a": group block must be written as group "NAME" { ... } (its name is missing)',
    )


def test_hcl__the_same_file_without_its_mistakes__reads() -> None:
    """The placeholders the reading goes on with never make a job: fixed, the file is one."""
    fixed = (
        MANY_MISTAKES.replace("priorty", "priority")
        .replace("  group {\n", '  group "first" {\n')
        .replace('task "a" "b"', 'task "a"')
        .replace('"5 sec"', '"5s"')
        .replace("    count = 1\n    count = 2\n", "    count = 2\n")
        .replace("    update {\n      max_paralel = 2\n    }\n", "")
        .replace('"yes"', "true")
        .replace("      meta {}\n", "")
    )
    fixed = fixed[: fixed.index('job "other"')]
    job = parse_jobspec(fixed)
    assert [g.name for g in job.groups] == ["first", "api"] and job.priority == 50
    assert job.groups[1].count == 2 and job.groups[1].tasks[0].leader


HCL_SHAPED_JSON = """\
{"job": {"web": {
  "priority": 1,
  "priority": 2,
  "group": {"api": {
    "count": "x",
    "meta": {"a": "1", "a": "2"}
  }}
}}}
"""


def test_hcl_shaped_json__repeated_keys_and_bad_values__with_their_objects_line() -> None:
    assert _errors(HCL_SHAPED_JSON, "web.json") == (
        'web.json:1: job "web": duplicate key "priority"',
        'web.json:4: job "web" group "api" count: expected a number, got "x"',
        'web.json:6: job "web" group "api" meta: duplicate key "a"',
    )


NOMAD_API_JSON = """\
{
  "Job": {
    "ID": "web",
    "Priority": 50,
    "Priority": 60,
    "TaskGroups": [
      {
        "Name": "api",
        "Count": 1,
        "Count": 2,
        "Bogus": 1,
        "Tasks": [
          {"Name": "t", "Driver": "mock", "KillTimeout": "5 sec", "Leader": "yes"}
        ]
      }
    ]
  }
}
"""


def test_nomad_api_json__every_problem_with_its_objects_line() -> None:
    assert _errors(NOMAD_API_JSON, "web.json") == (
        'web.json:2: job "web": duplicate key "Priority"',
        'web.json:7: job "web" group "api": duplicate key "Count"',
        'web.json:7: job "web" group "api": unknown key "Bogus" (Nomad API JSON)',
        'web.json:13: job "web" group "api" task "t" kill_timeout: expected a duration like "30s" or "1h30m", got "5 sec"',
        'web.json:13: job "web" group "api" task "t" leader: expected true or false, got "yes"',
    )


def test_json__still_refused_past_its_nesting_and_number_bounds() -> None:
    with pytest.raises(JobspecError, match="nested too deeply"):
        parse_jobspec('{"job": ' + "[" * 100_000 + "]" * 100_000 + "}")
    with pytest.raises(JobspecError, match="invalid JSON"):
        parse_jobspec('{"job": {"web": {"priority": ' + "9" * 5000 + "}}}")


def test_cli_validate__a_real_process_lists_every_problem_and_exits_1(tmp_path: Path) -> None:
    path = tmp_path / "web.hcl"
    path.write_text(MANY_MISTAKES)

    result = subprocess.run(
        [sys.executable, "-m", "drover.cli", "job", "validate", "-address", "127.0.0.1:1", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        env={k: v for k, v in os.environ.items() if not k.startswith(("DROVER_", "NOMAD_"))},
    )

    assert result.returncode == 1, (result.stdout, result.stderr)
    lines = result.stdout.splitlines()
    assert lines[0] == "Job validation errors:", result.stdout
    assert lines[1:] == [
        "  * " + error.replace("web.hcl:", f"{path}:", 1) for error in MANY_MISTAKES_ERRORS
    ], result.stdout
    assert result.stderr == f"Error: {path}: job validation failed: {len(MANY_MISTAKES_ERRORS)} problem(s)\n"


def test_cli_validate__more_problems_than_one_line_shows__lists_them_all(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``run`` and ``plan`` put the first 20 on their one line; ``validate`` lists all."""
    path = tmp_path / "web.hcl"
    path.write_text('job "web" {\n' + "".join(f"  bogus{i} = 1\n" for i in range(30)) + "}\n")

    code = main(["job", "validate", "-address", "127.0.0.1:1", str(path)])

    out, err = capsys.readouterr()
    assert code == 1
    assert out.splitlines()[1:] == [
        f'  * {path}:{i + 2}: job "web": unknown key "bogus{i}"' for i in range(30)
    ]
    assert err == f"Error: {path}: job validation failed: 30 problem(s)\n"


INVALID_HCL_SHAPED_JSON = """\
{"job": {"w": {
  "priority": 500,
  "group": {"a": {
    "count": -1,
    "task": {"t": {
      "driver": "mock",
      "resources": {
        "memory": -5
      }
    }}
  }}
}}}
"""

INVALID_NOMAD_API_JSON = """\
{"Job": {
  "ID": "w",
  "Priority": 500,
  "TaskGroups": [
    {
      "Name": "a",
      "Count": -1,
      "Tasks": [
        {
          "Name": "t",
          "Driver": "mock",
          "Resources": {
            "MemoryMB": -5
          }
        }
      ]
    }
  ]
}}
"""


@pytest.mark.parametrize(
    ("text", "group_line", "resources_line"),
    [(INVALID_HCL_SHAPED_JSON, 3, 7), (INVALID_NOMAD_API_JSON, 5, 12)],
    ids=["hcl-shaped-json", "nomad-api-json"],
)
def test_locate_problems__json__each_validation_problem_gets_its_objects_line(
    text: str, group_line: int, resources_line: int
) -> None:
    with pytest.raises(ValidationError) as info:
        validate_job(parse_jobspec(text))
    located = locate_problems([str(e) for e in info.value.errors], text, filename="w.json")
    lines = {e.split(": ", 2)[1]: int(e.split(":", 2)[1]) for e in located}
    assert lines == {
        "job.priority": 1,  # the job's object opens on line 1
        "job.groups[0].count": group_line,
        "job.groups[0].tasks[0].resources.memory_mb": resources_line,
    }, located


def test_nomad_api_json__a_group_without_its_name__still_read_for_its_problems() -> None:
    text = (
        '{"Job": {"ID": "w", "TaskGroups": [\n {"Count": "x",\n'
        '  "Tasks": [{"Name": "t", "Driver": "mock", "Bogus": 1}]}]}}\n'
    )
    assert _errors(text, "w.json") == (
        'w.json:2: job "w" group: each needs "Name", a string',
        'w.json:2: job "w" group "" count: expected a number, got "x"',
        'w.json:3: job "w" group "" task "t": unknown key "Bogus" (Nomad API JSON)',
    )
