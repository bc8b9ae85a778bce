"""HCL2 evaluation of job files (drover.server.jobspec_eval): variables, locals, functions,
expressions, runtime interpolation left for the client, bounds, and every error of a file
reported at once with its line. Job files are written in Nomad's style."""

from __future__ import annotations

import json
import textwrap
import time
from pathlib import Path
from typing import Any

import hcl2
import pytest

from drover.cli import main
from drover.scheduler.structs import Job
from drover.server.jobspec import JobspecError, parse_jobspec
from drover.server.jobspec_eval import FUNCTIONS, MAX_ITEMS, VariableInputs, evaluate_document

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "deploy" / "examples" / "variables.nomad.hcl"


def evaluate(text: str, inputs: VariableInputs | None = None) -> tuple[dict[str, Any], list[str]]:
    """The evaluated top-level data of ``text`` and every problem as ``line: message``."""
    data, errors = evaluate_document(hcl2.parses(textwrap.dedent(text)).body, inputs or VariableInputs())
    return dict(data), [f"{e.line}: {e.message}" for e in errors]


def value(expression: str, prelude: str = "", inputs: VariableInputs | None = None) -> Any:
    data, errors = evaluate(f"{prelude}\nv = {expression}\n", inputs)
    assert errors == [], errors
    return data["v"]


def error_of(expression: str, prelude: str = "", inputs: VariableInputs | None = None) -> str:
    _, errors = evaluate(f"{prelude}\nv = {expression}\n", inputs)
    assert len(errors) == 1, errors
    return errors[0]


def job_with(task_body: str, prelude: str = "", group_body: str = "") -> str:
    return (
        f"{prelude}\n"
        'job "web" {\n'
        '  group "api" {\n'
        f"    {group_body}\n"
        '    task "server" {\n'
        '      driver = "mock"\n'
        f"      {task_body}\n"
        "    }\n"
        "  }\n"
        "}\n"
    )


def task_env(job: Job) -> dict[str, str]:
    return dict(job.groups[0].tasks[0].env)


# ---------------------------------------------------------------------------------------
# Functions: one case (at least) per function Nomad jobs use

FUNCTION_CASES: list[tuple[str, Any]] = [
    ('upper("web")', "WEB"),
    ('lower("WeB")', "web"),
    ('title("hello big world")', "Hello Big World"),
    ('format("%s-%03d:%.2f %t %q %%", "a", 7, 1.5, true, "x")', 'a-007:1.50 true "x" %'),
    ('formatlist("%s=%d", ["a", "b"], [1, 2])', ["a=1", "b=2"]),
    ('join("-", ["a", "b"], ["c"])', "a-b-c"),
    ('split(",", "a,b,,c")', ["a", "b", "", "c"]),
    ('replace("a.b.c", ".", "/")', "a/b/c"),
    ('replace("a1b22c", "/[0-9]+/", "#")', "a#b#c"),
    ('regex_replace("web-01", "([a-z]+)-(\\\\d+)", "$2_$1")', "01_web"),
    ('trimspace("  x \\n")', "x"),
    ('trim("--x--", "-")', "x"),
    ('trimprefix("web-api", "web-")', "api"),
    ('trimsuffix("api.hcl", ".hcl")', "api"),
    ('substr("hello", 1, 3)', "ell"),
    ('substr("hello", -3, -1)', "llo"),
    ('strlen("héllo")', 5),
    ('chomp("x\\n")', "x"),
    ("length([1, 2, 3])", 3),
    ("length({a = 1})", 1),
    ('length("abc")', 3),
    ("concat([1], [2, 3])", [1, 2, 3]),
    ('contains(["a", "b"], "b")', True),
    ('contains(["a", "b"], "c")', False),
    ("keys({b = 1, a = 2})", ["a", "b"]),
    ("values({b = 1, a = 2})", [2, 1]),
    ('lookup({a = "x"}, "a", "d")', "x"),
    ('lookup({a = "x"}, "b", "d")', "d"),
    ("merge({a = 1, b = 1}, {b = 2})", {"a": 1, "b": 2}),
    ('element(["a", "b"], 3)', "b"),
    ('index(["a", "b"], "b")', 1),
    ("range(3)", [0, 1, 2]),
    ("range(1, 4)", [1, 2, 3]),
    ("range(10, 0, -4)", [10, 6, 2]),
    ("flatten([[1, [2]], 3])", [1, 2, 3]),
    ("distinct([1, 2, 1])", [1, 2]),
    ('coalesce("", null, "x")', "x"),
    ('compact(["a", "", "b"])', ["a", "b"]),
    ("slice([1, 2, 3, 4], 1, 3)", [2, 3]),
    ('sort(["b", "a", "c"])', ["a", "b", "c"]),
    ("reverse([1, 2, 3])", [3, 2, 1]),
    ('zipmap(["a", "b"], [1, 2])', {"a": 1, "b": 2}),
    ('toset(["b", "a", "b"])', ["a", "b"]),
    ("tolist([1])", [1]),
    ("tomap({a = 1})", {"a": 1}),
    ("tostring(5)", "5"),
    ('tonumber("42")', 42),
    ('tobool("true")', True),
    ("min(3, 1, 2)", 1),
    ("max(3, 1, 2)", 3),
    ("abs(-4)", 4),
    ("ceil(1.2)", 2),
    ("floor(1.8)", 1),
    ('parseint("ff", 16)', 255),
    ("jsonencode({a = [1, true, null]})", '{"a":[1,true,null]}'),
    ('jsondecode("{\\"a\\": [1, 2.5]}")', {"a": [1, 2.5]}),
    ('base64encode("hi")', "aGk="),
    ('base64decode("aGk=")', "hi"),
    ('urlencode("a b/c")', "a%20b%2Fc"),
    ("yamlencode({a = [1]})", "a:\n- 1\n"),
    ('strrev("abc")', "cba"),
]


@pytest.mark.parametrize(("expression", "expected"), FUNCTION_CASES, ids=[c[0] for c in FUNCTION_CASES])
def test_function__gives_nomads_result(expression: str, expected: Any) -> None:
    assert value(expression) == expected


def test_functions__every_documented_function_has_a_case() -> None:
    called = {expression.split("(", 1)[0] for expression, _ in FUNCTION_CASES}
    assert set(FUNCTIONS) - called == set()


def test_function_call__list_expansion() -> None:
    assert value("max([4, 9, 2]...)") == 9


def test_function__unknown__refused_by_name_with_its_line() -> None:
    assert error_of("timestamp()", prelude="# one\n# two") == (
        '3: function "timestamp" is not supported (see docs/job-files.md)'
    )


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ('upper(["a"])', "upper: argument must be a string, got list"),
        ("element([], 0)", "element: the list is empty"),
        ('lookup({}, "k")', 'lookup: no key "k" and no default given'),
        ('regex_replace("a", "(", "")', "regex_replace: invalid regular expression"),
        ('base64decode("%%%")', "base64decode: not valid base64"),
        ("substr()", "substr: takes 3 argument(s), got 0"),
        ('format("%d")', "format: not enough arguments for %d"),
        ("1 / 0", "division by zero"),
        ('1 + "x"', "+ must be a number, got string"),
    ],
)
def test_function__bad_arguments__named_error(expression: str, message: str) -> None:
    assert message in error_of(expression)


# ---------------------------------------------------------------------------------------
# Expressions


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ("1 + 2 * 3", 7),
        ("(1 + 2) * 3", 9),
        ("7 / 2", 3.5),
        ("8 / 2", 4),
        ("7 % 3", 1),
        ("-7 % 3", -1),
        ("-(2 + 1)", -3),
        ("1 < 2 && 2 >= 2", True),
        ("!true || false", False),
        ('"a" == "a" && 1 != 2', True),
        ('1 == "1"', False),
        ("[1, [2]] == [1, [2]]", True),
        ('true ? "yes" : "no"', "yes"),
        ('2 > 3 ? "yes" : "no"', "no"),
        ('"x-${1 + 1}-${upper("y")}"', "x-2-Y"),
        ('"${3}"', 3),
        ('"tab\\tquote\\""', 'tab\tquote"'),
        ('"$${literal}"', "${literal}"),
        ('[for s in ["a", "b"] : upper(s)]', ["A", "B"]),
        ('[for i, s in ["a", "b"] : "${i}${s}" if s != "a"]', ["1b"]),
        ("{for k, v in {a = 1, b = 2} : v => k}", {"1": "a", "2": "b"}),
        ('{for s in ["a", "ab", "b"] : substr(s, 0, 1) => s...}', {"a": ["a", "ab"], "b": ["b"]}),
        ("[{n = 1}, {n = 2}][*].n", [1, 2]),
        ('{a = {b = ["x", "y"]}}.a.b[1]', "y"),
        ('{"k" = 1, (upper("z")) = 2}', {"k": 1, "Z": 2}),
    ],
)
def test_expression__evaluated_as_hcl2_does(expression: str, expected: Any) -> None:
    assert value(expression) == expected


def test_heredoc__interpolates_and_keeps_runtime_text() -> None:
    data, errors = evaluate(
        """
        locals {
          name = "web"
        }
        v = <<-EOT
          name: ${local.name}
          node: ${node.unique.name}
          keep: $${PATH}
        EOT
        """
    )
    assert errors == []
    assert data["v"] == "name: web\nnode: ${node.unique.name}\nkeep: ${PATH}\n"


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ('"%{ if true }yes%{ else }no%{ endif }"', "yes"),
        ('"%{ if 1 > 2 }yes%{ else }no%{ endif }"', "no"),
        ('"%{ if false }x%{ endif }!"', "!"),
        ('"%{ for s in ["a", "b"] }<${s}>%{ endfor }"', "<a><b>"),
        ('"%{ for k, v in {x = 1, y = 2} }${k}=${v};%{ endfor }"', "x=1;y=2;"),
        ('"a  %{~ if true ~}  b  %{~ endif ~}  c"', "abc"),
        ('"%%{ literal }"', "%{ literal }"),
    ],
)
def test_template_directive__evaluated(expression: str, expected: str) -> None:
    assert value(expression) == expected


def test_template_directive__in_a_heredoc_with_strip_markers() -> None:
    data, errors = evaluate(
        """
        v = <<-EOT
          %{ for port in [80, 443] ~}
          listen ${port};
          %{ endfor ~}
          done
        EOT
        """
    )
    assert errors == []
    assert data["v"] == "listen 80;\nlisten 443;\ndone\n"


def test_template_directive__condition_not_bool__error_with_its_line() -> None:
    _, errors = evaluate('v = <<EOT\nfirst\n%{ if "x" }y%{ endif }\nEOT\n')
    assert errors == ["3: %{ if } needs true or false, got string"]


# ---------------------------------------------------------------------------------------
# Runtime interpolation: left for the client


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ('"${node.unique.name}"', "${node.unique.name}"),
        ('"${attr.kernel.name}-${meta.rack}"', "${attr.kernel.name}-${meta.rack}"),
        ('"${NOMAD_ALLOC_ID}"', "${NOMAD_ALLOC_ID}"),
        ('"${NOMAD_PORT_http}"', "${NOMAD_PORT_http}"),
        ('"${env["HOME"]}"', '${env["HOME"]}'),
        ("node.datacenter", "${node.datacenter}"),
        ('["${attr.unique.network.ip-address}", upper("x")]', ["${attr.unique.network.ip-address}", "X"]),
    ],
)
def test_runtime_interpolation__left_as_text(expression: str, expected: Any) -> None:
    assert value(expression) == expected


def test_runtime_interpolation__in_a_function__refused() -> None:
    assert "${node.class} is known only on the client" in error_of("upper(node.class)")


def test_runtime_interpolation__reaches_the_task_as_text() -> None:
    job = parse_jobspec(job_with('env {\n WHERE = "${node.unique.name}"\n }'))
    assert task_env(job) == {"WHERE": "${node.unique.name}"}


def test_unknown_variable__named_with_its_line() -> None:
    assert error_of('"${PATH}"', prelude="\n") == (
        '3: unknown variable "PATH": use var.PATH for a variable, or $${PATH} for literal text'
    )


# ---------------------------------------------------------------------------------------
# Variables

PRELUDE = """
variable "env" {
  type    = string
  default = "dev"
}
variable "replicas" {
  type    = number
  default = 1
}
variable "ports" {
  type    = list(number)
  default = [80]
}
variable "labels" {
  type    = map(string)
  default = { team = "web" }
}
"""


def test_variable__default_used() -> None:
    assert value("[var.env, var.replicas, var.ports, var.labels]", PRELUDE) == [
        "dev",
        1,
        [80],
        {"team": "web"},
    ]


def test_variable__cli_var_overrides_default_and_is_typed() -> None:
    inputs = VariableInputs(cli=(("env", "prod"), ("replicas", "3"), ("ports", "[80, 443]")))
    assert value("[var.env, var.replicas, var.ports]", PRELUDE, inputs) == ["prod", 3, [80, 443]]


def test_variable__precedence__default_env_file_var(tmp_path: Path) -> None:
    """Nomad's order: default < NOMAD_VAR_ < -var-file (later files win) < -var."""
    prelude = PRELUDE + 'variable "a" {}\nvariable "b" {}\nvariable "c" {}\nvariable "d" {}\n'
    inputs = VariableInputs(
        env=(("a", "env"), ("b", "env"), ("c", "env"), ("d", "env")),
        files=(("one.hcl", 'b = "one"\nc = "one"\nd = "one"\n'), ("two.json", '{"c": "two", "d": "two"}')),
        cli=(("d", "cli"),),
    )
    assert value("[var.a, var.b, var.c, var.d]", prelude, inputs) == ["env", "one", "two", "cli"]


def test_variable__from_args_reads_files_and_env(tmp_path: Path) -> None:
    var_file = tmp_path / "prod.hcl"
    var_file.write_text("replicas = 5\nports = [1, 2]\n")
    inputs = VariableInputs.from_args(
        ["env=prod"], [str(var_file)], {"NOMAD_VAR_env": "staging", "NOMAD_VAR_": "x", "HOME": "/"}
    )
    assert value("[var.env, var.replicas, var.ports]", PRELUDE, inputs) == ["prod", 5, [1, 2]]


def test_variable__no_default_no_value__error_says_how_to_set_it() -> None:
    assert error_of("var.x", 'variable "x" {\n type = string\n}') == (
        '4: variable "x" has no value: set it with -var x=... or -var-file'
    )


def test_variable__undeclared__named() -> None:
    assert error_of("var.nope", PRELUDE).endswith(
        'unknown variable var.nope: declare it with variable "nope" { ... }'
    )


def test_variable__cli_value_for_undeclared_variable__refused() -> None:
    inputs = VariableInputs(cli=(("nope", "1"),))
    _, errors = evaluate(PRELUDE, inputs)
    assert errors == ['0: -var nope: no variable "nope" is declared in the job file']


@pytest.mark.parametrize(
    "inputs",
    [VariableInputs(cli=(("x", "1"),)), VariableInputs(files=(("vars.hcl", 'x = "1"'),))],
    ids=["var", "var-file"],
)
def test_variable__given_for_a_json_job__refused_saying_json_has_none(inputs: VariableInputs) -> None:
    """A JSON job file has no variable blocks: a -var for it would change nothing, so it is
    refused rather than dropped; NOMAD_VAR_* in the environment is not the caller's choice
    for this file, and stays ignored."""
    text = '{"Job": {"ID": "j", "Name": "j", "TaskGroups": [{"Name": "g", "Tasks": [{"Name": "t", "Driver": "mock"}]}]}}'
    with pytest.raises(JobspecError, match=r"this job file is JSON, which has none"):
        parse_jobspec(text, variables=inputs)
    assert parse_jobspec(text, variables=VariableInputs(env=(("x", "1"),))).id == "j"


@pytest.mark.parametrize(
    ("inputs", "message"),
    [
        (
            VariableInputs(cli=(("replicas", "many"),)),
            'variable "replicas" (-var replicas): expected number, got string',
        ),
        (
            VariableInputs(cli=(("ports", '["a"]'),)),
            'variable "ports" (-var ports)[0]: expected number, got string',
        ),
        (
            VariableInputs(files=(("v.json", '{"labels": [1]}'),)),
            'variable "labels" (v.json): expected map(string), got list',
        ),
    ],
)
def test_variable__type_mismatch__error(inputs: VariableInputs, message: str) -> None:
    _, errors = evaluate(PRELUDE, inputs)
    assert [e.split(": ", 1)[1] for e in errors] == [message]


def test_variable__default_of_the_wrong_type__error_at_its_line() -> None:
    _, errors = evaluate('variable "n" {\n  type    = number\n  default = "x"\n}\n')
    assert errors == ['1: variable "n" (default): expected number, got string']


def test_variable__validation__error_message_on_failure() -> None:
    prelude = (
        'variable "env" {\n  default = "qa"\n  validation {\n'
        '    condition     = contains(["dev", "prod"], var.env)\n'
        '    error_message = "env must be dev or prod"\n  }\n}\n'
    )
    _, errors = evaluate(prelude)
    assert errors == ['4: variable "env": env must be dev or prod']
    assert value("var.env", prelude, VariableInputs(cli=(("env", "prod"),))) == "prod"


def test_variable__default_may_not_use_variables() -> None:
    _, errors = evaluate('variable "a" {\n  default = "x"\n}\nvariable "b" {\n  default = var.a\n}\n')
    assert errors == ['5: variable "b": var.a cannot be used here: a value must not depend on variables']


# ---------------------------------------------------------------------------------------
# Locals


def test_locals__refer_to_each_other_in_any_order_and_to_variables() -> None:
    prelude = PRELUDE + 'locals {\n  b = "${local.a}-${var.env}"\n}\nlocals {\n  a = upper("x")\n}\n'
    assert value("local.b", prelude) == "X-dev"


def test_locals__cycle__error_not_a_hang() -> None:
    _, errors = evaluate("locals {\n  a = local.b\n  b = local.a\n}\n")
    assert errors and "refers to itself" in errors[0]


def test_locals__unknown__named() -> None:
    assert "unknown local value local.nope" in error_of("local.nope")


# ---------------------------------------------------------------------------------------
# file()


def test_file__relative_to_the_job_files_directory(tmp_path: Path) -> None:
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "app.conf").write_text("port = 8080\n")
    assert value('file("conf/app.conf")', inputs=VariableInputs(file_root=str(tmp_path))) == "port = 8080\n"


@pytest.mark.parametrize("path", ["../secret", "/etc/hostname", "conf/../../secret"])
def test_file__outside_the_job_files_directory__refused(tmp_path: Path, path: str) -> None:
    (tmp_path / "job").mkdir()
    (tmp_path / "secret").write_text("s")
    message = error_of(f'file("{path}")', inputs=VariableInputs(file_root=str(tmp_path / "job")))
    assert "is outside the job file's directory" in message


def test_file__without_a_job_file__refused() -> None:
    assert "only a job file read from disk may read files" in error_of('file("x")')


# ---------------------------------------------------------------------------------------
# Bounds: hostile input is refused, never run for ever


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("range(100000)", f"more than {MAX_ITEMS} items"),
        ("[for a in range(9999) : [for b in range(9999) : a * b]]", "too much to evaluate"),
        ('join("", [for i in range(9000) : format("%0900d", i)])', "a value larger than"),
        ('parseint("' + "9" * 70 + '", 10)', "parseint: cannot read"),
    ],
)
def test_bounds__refused(expression: str, message: str) -> None:
    with pytest.raises(JobspecError) as info:
        parse_jobspec(job_with(f"meta = {{ v = {expression} }}"))
    assert message in str(info.value)
    assert "\n" not in str(info.value)


_BIG = (
    'locals {\n  k = join("", [for i in range(10000) : "0123456789"])\n'
    '  s = join("", [for i in range(10) : local.k])\n'
)
_DOUBLINGS = "".join(f"  l{i} = concat(local.l{i - 1}, local.l{i - 1})\n" for i in range(1, 14))
_SHARED = "".join(f"  a{i} = [local.a{i - 1}, local.a{i - 1}]\n" for i in range(1, 60))

BOMBS = {
    # 2**59 leaves from 60 small lists: sized as shared parts, refused at once.
    "shared-lists": ('locals {\n  a0 = ["xxxxxxxxxx"]\n' + _SHARED + "}\n", "jsonencode(local.a59)"),
    "doubling-concat": (_BIG + "  l0 = [local.s]\n" + _DOUBLINGS + "}\n", 'join("", local.l13)'),
    "replace-growth": (_BIG + "}\n", 'replace(local.s, "0", local.s)'),
    "regex-growth": (_BIG + "}\n", 'regex_replace(local.s, "", "ab")'),
    "format-width": ("", 'format("%0900000000d", 1)'),
    "loop-of-copies": (_BIG + "}\n", '[for i in range(1000) : "${local.s}${i}"]'),
}


@pytest.mark.parametrize("name", sorted(BOMBS))
def test_bounds__growth_bombs__refused_quickly(name: str) -> None:
    prelude, expression = BOMBS[name]
    started = time.monotonic()
    with pytest.raises(JobspecError) as info:
        parse_jobspec(job_with(f"meta = {{ v = {expression} }}", prelude=prelude))
    assert time.monotonic() - started < 10, "a bound that is reached only after the work is no bound"
    assert any(word in str(info.value) for word in ("larger than", "longer than", "at most")), str(info.value)


def test_bounds__distinct_of_many_is_linear() -> None:
    started = time.monotonic()
    assert value("length(distinct(concat(range(5000), range(5000))))") == 5000
    assert time.monotonic() - started < 5


def test_bounds__numbers_cannot_grow_without_limit() -> None:
    locals_text = "locals {\n  a0 = 99999999999\n" + "".join(
        f"  a{i} = local.a{i - 1} * local.a{i - 1}\n" for i in range(1, 12)
    )
    _, errors = evaluate(locals_text + "}\nv = local.a11\n")
    assert any("too large a number" in e for e in errors), errors


# ---------------------------------------------------------------------------------------
# Through parse_jobspec: the job, and every error of a file at once


def test_parse_jobspec__variables_reach_the_job() -> None:
    text = job_with(
        'env {\n NAME = "${var.env}-web"\n }\n resources {\n memory = var.replicas * 32\n }',
        prelude=PRELUDE,
        group_body="count = var.replicas",
    )
    job = parse_jobspec(text, variables=VariableInputs(cli=(("replicas", "2"),)))
    assert job.groups[0].count == 2
    assert task_env(job) == {"NAME": "dev-web"}
    assert job.groups[0].tasks[0].resources is not None and job.groups[0].tasks[0].resources.memory_mb == 64


SEVERAL_ERRORS = """\
variable "size" {
  type = number
}

job "demo" {
  datacenters = ["dc1"]
  priorty = 50

  group "web" {
    count = "many"

    task "t" {
      driver  = "mock"
      templat {}
      env {
        HOME = "${PATH}"
      }
      resources {
        cpu    = var.size
        memory = "lots"
      }
    }
  }
}
"""


def test_several_errors__all_reported_in_line_order_with_their_lines() -> None:
    with pytest.raises(JobspecError) as info:
        parse_jobspec(SEVERAL_ERRORS, filename="job.hcl")
    assert info.value.errors == (
        'job.hcl:7: job "demo": unknown key "priorty" (did you mean "priority"?)',
        'job.hcl:10: job "demo" group "web" count: expected a number, got "many"',
        'job.hcl:14: job "demo" group "web" task "t": unknown key "templat" (did you mean "template"?)',
        'job.hcl:16: unknown variable "PATH": use var.PATH for a variable, or $${PATH} for literal text',
        'job.hcl:19: variable "size" has no value: set it with -var size=... or -var-file',
        'job.hcl:20: job "demo" group "web" task "t" resources memory: expected a number, got "lots"',
    )
    assert str(info.value) == "; ".join(info.value.errors)


def test_cli_validate__lists_every_error_and_exits_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "job.hcl"
    path.write_text(SEVERAL_ERRORS)

    code = main(["job", "validate", "-address", "127.0.0.1:1", str(path)])

    out, err = capsys.readouterr()
    assert code == 1
    listed = [line.removeprefix("  * ") for line in out.splitlines()[1:]]
    assert out.splitlines()[0] == "Job validation errors:"
    assert len(listed) == 6 and all(line.startswith(f"{path}:") for line in listed), out
    assert err == f"Error: {path}: job validation failed: 6 problem(s)\n"


@pytest.mark.parametrize("command", ["run", "plan"])
def test_cli_run_and_plan__every_error_on_one_line_exit_1(
    command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "job.hcl"
    path.write_text(SEVERAL_ERRORS)

    code = main(["job", command, "-address", "127.0.0.1:1", str(path)])

    _, err = capsys.readouterr()
    assert code == 1
    assert err.count("\n") == 1 and err.count(f"{path}:") == 6, err


def test_cli__var_sets_a_variable_and_var_file_is_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "job.hcl"
    path.write_text(job_with('env {\n N = "${var.env}:${var.replicas}"\n }', prelude=PRELUDE))
    (tmp_path / "vars.hcl").write_text("replicas = 7\n")

    code = main(
        ["job", "validate", "-address", "127.0.0.1:1", "-var", "env=nope=1", "-var", "replicas=2",
         "-var-file", str(tmp_path / "vars.hcl"), "-var", "replicas=9", str(path)]
    )  # fmt: skip

    # It gets as far as asking the (absent) server: the file itself was read and is valid.
    _, err = capsys.readouterr()
    assert code == 1 and "127.0.0.1:1" in err, err
    from drover.cli._jobs import parse_job_file

    class Args:
        var = ["env=nope=1", "replicas=2", "replicas=9"]
        var_file = [str(tmp_path / "vars.hcl")]

    job = parse_job_file(str(path), Args())  # type: ignore[arg-type]
    assert task_env(job) == {"N": "nope=1:9"}


def test_cli__var_without_equals__usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "job.hcl"
    path.write_text(job_with("", prelude=PRELUDE))
    code = main(["job", "run", "-address", "127.0.0.1:1", "-var", "env", str(path)])
    _, err = capsys.readouterr()
    assert code == 1 and "-var 'env': expected NAME=VALUE" in err, err


# ---------------------------------------------------------------------------------------
# The example


def test_example__parses_with_defaults_and_with_var_overrides() -> None:
    text = EXAMPLE.read_text()
    job = parse_jobspec(text, filename=str(EXAMPLE))
    assert job.id == "variables-example"
    assert job.groups[0].count == 1
    assert job.meta == {
        "team": "web",
        "tier": "frontend",
        "env": "DEV",
        "replicas": "1",
        "ports": "port-8080,port-8443",
    }
    env = task_env(job)
    assert env["SERVICE_NAME"] == "dev-web" and env["INSTANCE"] == "dev-web-02"
    assert json.loads(env["SETTINGS"]) == {"ports": [8080, 8443], "prod": False}
    assert env["WHERE"] == "${node.unique.name}/${NOMAD_ALLOC_ID}"

    prod = parse_jobspec(text, variables=VariableInputs(cli=(("env", "prod"), ("replicas", "3"))))
    assert prod.groups[0].count == 3 and prod.meta["env"] == "PROD"
    resources = prod.groups[0].tasks[0].resources
    assert resources is not None and resources.memory_mb == 64
    assert json.loads(prod.groups[0].tasks[0].config_json) == {"run_for": "24h"}

    with pytest.raises(JobspecError, match="env must be dev, staging or prod"):
        parse_jobspec(text, variables=VariableInputs(cli=(("env", "qa"),)))


def test_many_errors__first_twenty_listed_then_counted() -> None:
    keys = "".join(f"  bogus{i} = 1\n" for i in range(30))
    with pytest.raises(JobspecError) as info:
        parse_jobspec(f'job "web" {{\n{keys}}}\n', filename="job.hcl")
    assert len(info.value.errors) == 20 and info.value.errors[0].startswith("job.hcl:2: ")
    assert str(info.value).endswith("; and 10 more") and "\n" not in str(info.value)


# ---------------------------------------------------------------------------------------
# Validation problems (bad values) get the line of their field

INVALID = """\
job "w" {
  priority = 500
  group "a" {
    count = -1
    task "t" {
      driver = ""
      resources {
        memory = -5
      }
      kill_timeout = "-1s"
    }
    constraint {
      operator = "bogus"
    }
  }
}
"""


def test_locate_problems__each_validation_problem_gets_its_fields_line() -> None:
    from drover.scheduler.validate import ValidationError, validate_job
    from drover.server.jobspec import locate_problems

    with pytest.raises(ValidationError) as info:
        validate_job(parse_jobspec(INVALID))
    located = locate_problems([str(e) for e in info.value.errors], INVALID, filename="w.hcl")
    lines = {e.split(": ", 2)[1]: e.split(":", 2)[1] for e in located}
    assert lines == {
        "job.priority": "2",
        "job.groups[0].count": "4",
        "job.groups[0].constraints[0].operator": "13",
        "job.groups[0].tasks[0].driver": "6",
        "job.groups[0].tasks[0].resources.memory_mb": "8",
        "job.groups[0].tasks[0].kill_timeout_ns": "10",
    }


def test_locate_problems__no_place_in_the_file__kept_as_is() -> None:
    from drover.server.jobspec import locate_problems

    assert locate_problems(["job.payload: too big", "no path here"], INVALID, filename="w.hcl") == [
        "w.hcl:1: job.payload: too big",  # not written: the job block's line
        "no path here",
    ]
    assert locate_problems(["job.priority: x"], '{"id": "w"}') == ["job.priority: x"]


def test_cli_run__invalid_values__every_one_with_its_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "w.hcl"
    path.write_text(INVALID)

    code = main(["job", "run", "-address", "127.0.0.1:1", str(path)])

    _, err = capsys.readouterr()
    assert code == 1 and err.count("\n") == 1, err
    assert f"{path}:4: job.groups[0].count: must be >= 0" in err
    assert f"{path}:8: job.groups[0].tasks[0].resources.memory_mb: must be > 0" in err


def test_bounds__heredoc_of_many_interpolations__refused_quickly() -> None:
    body = "x ${1}\n" * 5000
    started = time.monotonic()
    with pytest.raises(JobspecError, match="too much to evaluate"):
        parse_jobspec(f'job "x" {{\n meta = {{ v = <<EOT\n{body}EOT\n }}\n}}\n')
    assert time.monotonic() - started < 10


def test_heredoc__interpolation_lines_count_from_the_heredoc() -> None:
    _, errors = evaluate("v = <<EOT\none\ntwo ${nope}\nEOT\n")
    assert errors == ['3: unknown variable "nope": use var.nope for a variable, or $${nope} for literal text']


# ---------------------------------------------------------------------------------------
# dynamic blocks

DYNAMIC = """
variable "groups" {
  default = { api = 2, web = 1 }
}
job "x" {
  dynamic "group" {
    for_each = var.groups
    labels   = [group.key]
    content {
      count = group.value
      task "t" {
        driver = "mock"
        dynamic "constraint" {
          for_each = ["a", "b"]
          iterator = c
          content {
            attribute = "${meta.rack}"
            value     = c.value
          }
        }
      }
    }
  }
}
"""


def test_dynamic__one_block_per_item_with_its_key_and_value() -> None:
    job = parse_jobspec(DYNAMIC)
    assert [(g.name, g.count) for g in job.groups] == [("api", 2), ("web", 1)]
    for group in job.groups:
        assert [(c.attribute, c.value) for c in group.tasks[0].constraints] == [
            ("${meta.rack}", "a"),
            ("${meta.rack}", "b"),
        ]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            ("for_each = var.groups", "for_each = 3"),
            'd.hcl:7: dynamic "group" for_each: needs a list or a map, got number',
        ),
        (("labels   = [group.key]", "labelz = []"), 'd.hcl:6: dynamic "group": unknown key "labelz"'),
        (("iterator = c", 'iterator = "c"'), 'd.hcl:13: dynamic "constraint": iterator must be a name'),
    ],
)
def test_dynamic__mistakes__named_with_their_line(change: tuple[str, str], message: str) -> None:
    with pytest.raises(JobspecError) as info:
        parse_jobspec(DYNAMIC.replace(*change), filename="d.hcl")
    assert message in info.value.errors


def test_bounds__template_loop_is_linear() -> None:
    started = time.monotonic()
    text = value('"%{ for i in range(9000) }<${i}>%{ endfor }"')
    assert len(text) == sum(len(str(i)) + 2 for i in range(9000))
    assert time.monotonic() - started < 5


def test_sdk_parse_job__variables_as_the_cli_gives_them(tmp_path: Path) -> None:
    from drover.sdk import JobFileError, parse_job, parse_job_file

    text = job_with('env {\n N = "${var.env}:${var.replicas}"\n F = file("f.txt")\n }', prelude=PRELUDE)
    (tmp_path / "f.txt").write_text("beside")
    (tmp_path / "job.hcl").write_text(text)
    (tmp_path / "vars.json").write_text('{"replicas": 4}')

    job = parse_job_file(
        tmp_path / "job.hcl",
        variables={"env": "prod"},
        var_files=[tmp_path / "vars.json"],
        environ={"NOMAD_VAR_env": "staging"},
    )
    assert dict(job.groups[0].tasks[0].env) == {"N": "prod:4", "F": "beside"}
    with pytest.raises(JobFileError, match="only a job file read from disk may read files"):
        parse_job(text)
    with pytest.raises(JobFileError, match='variable "replicas" \\(-var replicas\\): expected number'):
        parse_job_file(tmp_path / "job.hcl", variables={"replicas": "many"})


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # Found by the fuzzer: a meta block labelled "\n", once every error was listed.
        ('job "x" {\n  meta "\\n" {\n  }\n  job = []\n}\n', 'job "x" meta "\\n": expected a string'),
        ('variable "a\\nb" {}\njob "x" {}\n', "a variable's name must be a name"),
        (
            'variable "v" {\n  default = 1\n  validation {\n    condition = false\n'
            '    error_message = "two\\nlines"\n  }\n}\njob "x" {}\n',
            'variable "v": two lines',
        ),
        ('job "x" {\n  dynamic "a\\nb" {\n    for_each = 1\n  }\n}\n', 'dynamic "a\\nb"'),
    ],
)
def test_messages__users_text_with_newlines__stays_one_line(text: str, expected: str) -> None:
    with pytest.raises(JobspecError) as info:
        parse_jobspec(text)
    assert expected in str(info.value) and "\n" not in str(info.value), str(info.value)
