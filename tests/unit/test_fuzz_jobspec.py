"""Fuzzing the jobspec reader (HCL, HCL-shaped JSON, protobuf JSON) the way the CLI and the
API use it: ``parse_jobspec`` -> ``validate_job`` -> ``to_proto``.

Whatever the text, each step either succeeds or raises its one documented error
(``JobspecError``, ``ValidationError``), on one line of bounded length; a job that
validates always encodes (no integer overflows the protobuf field it travels in). Inputs:
arbitrary text, jobspec-shaped documents with hostile values (huge integers, long
strings, deep nesting, unknown keys, wrong types) rendered as HCL and as JSON, and the
same documents cut and spliced at random places. Budgets: tests/fuzz.py.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

import pytest
from hypothesis import given
from hypothesis import strategies as st

from drover.cli import main
from drover.cli._errors import run_handler
from drover.cli.job import _load_job_file
from drover.scheduler.validate import ValidationError, validate_job
from drover.server.codec import to_proto
from drover.server.jobspec import JobspecError, parse_jobspec
from drover.v1 import structs_pb2
from tests.fuzz import budgets, fuzz_settings

# A message says what is wrong and where, and quotes at most a little of the input.
MAX_MESSAGE_CHARS: Final = 8_000


def check_text(text: str) -> str:
    """Run the CLI's steps on ``text``; the outcome ("job", "parse", "invalid") for stats."""
    try:
        job = parse_jobspec(text, filename="fuzz.hcl")
    except JobspecError as exc:
        _assert_one_line(str(exc))
        return "parse"
    try:
        validate_job(job)
    except ValidationError as exc:
        _assert_one_line(str(exc))
        return "invalid"
    to_proto(job, structs_pb2.Job()).SerializeToString()
    return "job"


def _assert_one_line(message: str) -> None:
    assert message, "an error without a message"
    assert "\n" not in message, message[:500]
    assert len(message) <= MAX_MESSAGE_CHARS, f"{len(message)} characters: {message[:200]}"


# ---------------------------------------------------------------------------------------
# Jobspec-shaped documents

KEYS: Final = [
    "job",
    "group",
    "task",
    "count",
    "type",
    "priority",
    "datacenters",
    "namespace",
    "meta",
    "constraint",
    "affinity",
    "spread",
    "update",
    "periodic",
    "parameterized",
    "driver",
    "config",
    "env",
    "resources",
    "cpu",
    "memory",
    "disk",
    "network",
    "port",
    "static",
    "to",
    "mbits",
    "kill_timeout",
    "leader",
    "attribute",
    "operator",
    "value",
    "weight",
    "max_parallel",
    "stagger",
    "reschedule",
    "restart",
    "disconnect",
    "attempts",
    "interval",
    "delay",
    "delay_function",
    "mode",
    "ephemeral_disk",
    "size",
    "cron",
    "crons",
    "time_zone",
    "enabled",
    "payload",
    "meta_required",
    "lost_after",
    "reconcile",
    "name",
]

HOSTILE_INTS: Final = st.sampled_from(
    [0, -1, 1, 2**31 - 1, 2**31, 2**32, 2**63 - 1, 2**63, 2**64, -(2**63) - 1, 10**40]
)
# Stands for a 5,000-digit number literal (past the interpreter's int-from-text limit):
# rendered bare in HCL, as a huge number in JSON.
HUGE_LITERAL: Final = "<5000 digits>"
INTS: Final = st.one_of(st.integers(-5, 20_000), st.integers(), HOSTILE_INTS)
FLOATS: Final = st.floats(allow_nan=True, allow_infinity=True)
TEXT: Final = st.one_of(
    st.text(max_size=20),
    st.sampled_from(
        ["${node.unique.name}", "$${x}", "%{ if }", "\\", '"', "\n", "^(a+)+$", "(a)\\1", "1h", HUGE_LITERAL]
    ),
    st.integers(0, 5000).map(lambda n: "x" * n),
)
# HCL parsing costs ~25 us a character: HCL documents keep their strings short.
SHORT_TEXT: Final = st.one_of(
    st.text(max_size=12), st.sampled_from(["${node.unique.name}", "$${x}", "\\", "^(a+)+$"])
)


def values(text: st.SearchStrategy[str]) -> st.SearchStrategy[Any]:
    scalars = st.one_of(INTS, FLOATS, st.booleans(), text, st.none())
    return st.recursive(
        scalars,
        lambda inner: st.one_of(
            st.lists(inner, max_size=4),
            st.dictionaries(st.sampled_from(KEYS) | st.text(max_size=6), inner, max_size=4),
        ),
        max_leaves=8,
    )


SCALARS: Final = st.one_of(INTS, FLOATS, st.booleans(), TEXT, st.none())
VALUES: Final = values(TEXT)
SHORT_VALUES: Final = values(SHORT_TEXT)


@st.composite
def bodies(draw: st.DrawFn, depth: int = 0, short: bool = False) -> list[tuple[str, list[str], Any]]:
    """A block body: attributes (key, [], value) and blocks (key, labels, body)."""
    items: list[tuple[str, list[str], Any]] = []
    for _ in range(draw(st.integers(0, 4 if depth < 3 else 1))):
        key = draw(st.sampled_from(KEYS) | st.from_regex(r"[a-z_][a-z0-9_]{0,8}", fullmatch=True))
        if depth < 3 and draw(st.booleans()):
            labels = draw(st.lists(st.text(max_size=8), max_size=2))
            items.append((key, labels, draw(bodies(depth + 1, short))))
        else:
            items.append((key, [], draw(SHORT_VALUES if short else VALUES)))
    return items


def hcl_string(text: str) -> str:
    return json.dumps(text).replace("${", "$${").replace("%{", "%%{")


def hcl_value(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return repr(value) if value == value and abs(value) != float("inf") else "1e999"
    if value == HUGE_LITERAL:
        return "9" * 5000
    if isinstance(value, str):
        return hcl_string(value)
    if isinstance(value, list):
        return "[" + ", ".join(hcl_value(v) for v in value) + "]"
    return "{" + " ".join(f"{hcl_string(str(k))} = {hcl_value(v)}" for k, v in value.items()) + "}"


def render_hcl(body: list[tuple[str, list[str], Any]], indent: str = "") -> str:
    lines = []
    for key, labels, value in body:
        if isinstance(value, list) and value and all(isinstance(v, tuple) for v in value):
            label_text = " ".join(hcl_string(label) for label in labels)
            lines.append(f"{indent}{key} {label_text} {{\n{render_hcl(value, indent + '  ')}{indent}}}")
        elif labels or (isinstance(value, list) and not value and labels):
            lines.append(f"{indent}{key} {' '.join(hcl_string(label) for label in labels)} {{\n{indent}}}")
        else:
            lines.append(f"{indent}{key} = {hcl_value(value)}")
    return "".join(line + "\n" for line in lines)


def to_data(body: list[tuple[str, list[str], Any]]) -> dict[str, Any]:
    """The HCL-JSON shape of a body: labelled blocks nest by label, repeats become lists."""
    data: dict[str, Any] = {}
    for key, labels, value in body:
        if isinstance(value, list) and all(isinstance(v, tuple) for v in value) and (labels or value):
            inner: Any = to_data(value)
            for label in reversed(labels):
                inner = {label: inner}
            if not isinstance(data.get(key), list):
                data[key] = []
            data[key].append(inner)
        else:
            data[key] = value
    return data


def render_json(value: Any) -> str:
    return json.dumps(json_safe(value)).replace(json.dumps(HUGE_LITERAL), "9" * 5000)


def json_safe(value: Any) -> Any:
    if isinstance(value, float) and (value != value or abs(value) == float("inf")):
        return str(value)
    if isinstance(value, list):
        return [json_safe(v) for v in value]
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    return value


@st.composite
def documents(draw: st.DrawFn, short: bool = False) -> list[tuple[str, list[str], Any]]:
    """Mostly one ``job "ID" { group "G" { task "T" { ... } } }``, with random contents."""
    text = SHORT_TEXT if short else TEXT
    task = [("driver", [], draw(st.sampled_from(["mock", "raw_exec", ""]) | text)), *draw(bodies(2, short))]
    group = [("task", [draw(st.text(max_size=6))], task), *draw(bodies(2, short))]
    job = [("group", [draw(st.text(max_size=6))], group), *draw(bodies(1, short))]
    return [("job", [draw(st.text(max_size=10))], job), *draw(bodies(3, short))]


@st.composite
def mutated(draw: st.DrawFn, text: str) -> str:
    """``text`` cut, spliced or doubled at a random place."""
    if not text:
        return text
    i = draw(st.integers(0, len(text)))
    j = draw(st.integers(i, min(len(text), i + 40)))
    how = draw(st.sampled_from(["delete", "insert", "duplicate", "none"]))
    if how == "delete":
        return text[:i] + text[j:]
    if how == "insert":
        return text[:i] + draw(st.text(alphabet='{}[]()"=,\\$#/*<>-\n \t01ae', max_size=8)) + text[i:]
    if how == "duplicate":
        return text[:j] + text[i:j] + text[j:]
    return text


def deep(n: int, opener: str, closer: str) -> str:
    return opener * n + closer * n


DEEP: Final = st.integers(1, 5000).flatmap(
    lambda n: st.sampled_from(
        [
            'job "x" { meta = ' + deep(n, "[", "]") + " }",
            'job "x" { group "g" { task "t" { config { a = ' + deep(n, "[", "]") + " } } } }",
            '{"job": {"x": {"group": {"g": {"task": {"t": {"config": {"a": ' + deep(n, "[", "]") + "}}}}}}}}",
            '{"job": ' + deep(n, "[", "]") + "}",
            '{"ID": "x", "TaskGroups": ' + deep(n, "[", "]") + "}",
            'job "x" {' + deep(n, "{", "}") + "}",
            'job "x" { count = ' + deep(n, "(", ")") + " }",
        ]
    )
)


def run(
    strategy: st.SearchStrategy[str], budget: int, check: Callable[[str], str] = check_text
) -> dict[str, int]:
    seen: dict[str, int] = {}

    @fuzz_settings(budget)
    @given(strategy)
    def one(text: str) -> None:
        outcome = check(text)
        seen[outcome] = seen.get(outcome, 0) + 1

    one()
    assert sum(seen.values()) >= budget, seen
    return seen


@pytest.mark.parametrize("budget", budgets(3000))
def test_fuzz_jobspec__any_text__one_documented_error_or_a_job(budget: int) -> None:
    run(st.text(alphabet=st.characters(codec="utf-8"), max_size=200) | st.text(max_size=50), budget)


@pytest.mark.parametrize("budget", budgets(400))
def test_fuzz_jobspec__hcl_documents__one_documented_error_or_a_job(budget: int) -> None:
    seen = run(documents(short=True).map(render_hcl).flatmap(mutated), budget)
    # The generator reaches every outcome, so each branch of the property is exercised.
    assert {"parse", "invalid"} <= set(seen), seen


@pytest.mark.parametrize("budget", budgets(600))
def test_fuzz_jobspec__json_documents__one_documented_error_or_a_job(budget: int) -> None:
    as_json = documents().map(lambda d: render_json(to_data(d))).flatmap(mutated)
    seen = run(as_json, budget)
    assert {"parse", "invalid"} <= set(seen), seen


@pytest.mark.parametrize("budget", budgets(500))
def test_fuzz_jobspec__protobuf_json__one_documented_error_or_a_job(budget: int) -> None:
    proto_keys = st.sampled_from(
        [
            "id",
            "type",
            "priority",
            "groups",
            "count",
            "tasks",
            "name",
            "driver",
            "config_json",
            "meta",
            "resources",
        ]
    )
    proto_values = st.recursive(
        SCALARS.map(json_safe),
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(proto_keys, inner, max_size=4),
    )
    doc = st.dictionaries(proto_keys, proto_values, min_size=1, max_size=6).map(render_json)
    run(doc.flatmap(mutated), budget)


@pytest.mark.parametrize("budget", budgets(200))
def test_fuzz_jobspec__deep_nesting__refused_not_raised(budget: int) -> None:
    seen = run(DEEP, budget)
    assert "job" not in seen, seen


@pytest.mark.parametrize(
    "text",
    [
        'job "x" { group "g" { count = 2147483647 task "t" { driver = "mock" } } }',
        'job "x" { group "g" { count = ' + "9" * 5000 + ' task "t" { driver = "mock" } } }',
        '{"job": {"x": {"group": {"g": {"count": ' + "9" * 5000 + "}}}}}",
        '{"job": {"x": {"group": {"g": {"count": 1e400}}}}}',
        '{"job": {"x": {"group": {"g": {"count": 99999999999999999999, "task": {"t": {}}}}}}}',
        '{"job": {"x": {"priority": "' + "9" * 5000 + '"}}}',
        '{"id": "x", "groups": [{"count": 99999999999}]}',
        'job "x" { group "g" { task "t" { resources { memory = 99999999999999999999999 } } } }',
        'job "' + "x" * 1_000_000 + '" {}',
        '{"job": {"' + "k" * 100_000 + '": {}}}',
        'job "x" { ' + "k" * 100_000 + " = 1 }",
    ],
    ids=[
        "count-2**31-1",
        "count-5000-digits-hcl",
        "count-5000-digits-json",
        "count-inf",
        "count-int64-overflow",
        "priority-digit-string",
        "proto-json-int32-overflow",
        "memory-int64-overflow",
        "1MB-job-id",
        "long-json-key",
        "long-hcl-key",
    ],
)
def test_jobspec_bombs__refused_with_one_line(text: str) -> None:
    assert check_text(text) in ("parse", "invalid")


# ---------------------------------------------------------------------------------------
# Through the CLI's boundary: bytes on disk -> exit status and stderr


CLI_BOMBS: Final = {
    "bad-utf8": b'job "x" { meta = { a = "\xff\xfe" } }',
    "deep-nesting": b'job "x" { meta = ' + b"[" * 100_000 + b"]" * 100_000 + b" }",
    "deep-json": b'{"job": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
    "huge-integer": b'job "x" { group "g" { count = ' + b"9" * 100_000 + b" } }",
    "huge-json-integer": b'{"job": {"x": {"group": {"g": {"count": ' + b"9" * 100_000 + b"}}}}}",
    "count-2**31-1": b'job "x" { group "g" { count = 2147483647 task "t" { driver = "mock" } } }',
}


@pytest.mark.parametrize("name", sorted(CLI_BOMBS))
def test_cli_job_run__hostile_file__one_line_exit_1(
    name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "job.hcl"
    path.write_bytes(CLI_BOMBS[name])

    code = main(["job", "run", "-address", "127.0.0.1:1", str(path)])

    out, err = capsys.readouterr()
    assert code == 1
    assert out == ""
    assert err.startswith("Error: ") and err.count("\n") == 1, err[:500]
    assert "Traceback" not in err and len(err) < 2000


@pytest.mark.parametrize("budget", budgets(300))
def test_fuzz_cli_job_file__random_bytes__exit_0_or_1_one_line(budget: int, tmp_path: Path) -> None:
    path = tmp_path / "job.hcl"
    samples = st.one_of(
        st.binary(max_size=300),
        documents(short=True)
        .map(lambda d: render_hcl(d).encode())
        .flatmap(lambda b: st.tuples(st.just(b), st.binary(max_size=4)).map(lambda t: t[0] + t[1])),
    )
    seen = 0

    @fuzz_settings(budget)
    @given(samples)
    def one(data: bytes) -> None:
        nonlocal seen
        seen += 1
        path.write_bytes(data)
        stderr = io.StringIO()
        with contextlib.redirect_stderr(stderr):
            code = run_handler(lambda _args: (_load_job_file(str(path)), 0)[1], argparse.Namespace())
        assert code in (0, 1)
        assert stderr.getvalue().count("\n") == (1 if code else 0), stderr.getvalue()[:500]

    one()
    assert seen >= budget
