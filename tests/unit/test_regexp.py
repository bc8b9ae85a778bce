"""regexp constraints: RE2 (Go's syntax, linear time), one compile path for validation and
feasibility (scheduler/regexp.py)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from drover.scheduler import validate
from drover.scheduler.placement.feasible import check_operator, compile_predicate
from drover.scheduler.regexp import RegexpError, compile_regexp, matches, regexp_error
from drover.scheduler.structs import Constraint
from tests.fixtures import mock

# With Python's backtracking ``re`` this pattern takes time doubling with each "a": at
# 100,000 of them these tests would never finish (pytest-timeout fails them).
REDOS = "^(a+)+$"
LONG = "a" * 100_000 + "!"


@pytest.mark.timeout(30)
def test_regexp__catastrophic_pattern__answers_on_a_long_string() -> None:
    pattern = compile_regexp(REDOS)
    assert not matches(pattern, LONG)
    assert matches(pattern, "a" * 100_000)


@pytest.mark.timeout(30)
def test_feasible__redos_constraint__node_with_long_attribute_is_judged() -> None:
    node = mock.node(attributes={"kernel.name": "linux", "bomb": LONG})
    predicate = compile_predicate("${attr.bomb}", "regexp", REDOS)
    assert predicate(node) is False
    assert check_operator("regexp", LONG, REDOS) is False


@pytest.mark.parametrize(
    ("pattern", "why"),
    [
        (r"(a)\1", "backreference"),
        (r"foo(?=bar)", "lookahead"),
        (r"(?<!x)y", "lookbehind"),
        ("(", "unbalanced"),
        ("a{1001}", "repeat count over RE2's 1000"),
        ("\ud800", "lone surrogate"),
    ],
    ids=["backreference", "lookahead", "lookbehind", "unbalanced", "huge-repeat", "surrogate"],
)
def test_regexp__outside_re2__refused_with_a_reason(pattern: str, why: str) -> None:
    with pytest.raises(RegexpError):
        compile_regexp(pattern)
    assert regexp_error(pattern), why


def test_regexp__go_syntax__unanchored_search_like_go() -> None:
    assert matches(compile_regexp(r"^linux$"), "linux")
    assert matches(compile_regexp(r"\d+\.\d+"), "kernel 6.1 lts")
    assert matches(compile_regexp(r"(?i)LINUX"), "linux")
    assert matches(compile_regexp(r"\pL+"), "Ünïcode")
    # Go's $ without (?m) is the end of the text, not before a final newline (Python's).
    assert not matches(compile_regexp(r"^a$"), "a\n")


def test_validate__regexp_constraint_re2_refuses__invalid_argument_names_the_value() -> None:
    job = mock.job()
    job = replace(
        job, constraints=(Constraint(attribute="${attr.kernel.name}", operator="regexp", value=r"(a)\1"),)
    )
    with pytest.raises(validate.ValidationError) as err:
        validate.validate_job(validate.canonicalize_job(job))
    assert "job.constraints[0].value: invalid regular expression" in str(err.value)


def test_validate__catastrophic_pattern__valid_in_re2() -> None:
    job = replace(
        mock.job(), constraints=(Constraint(attribute="${attr.x}", operator="regexp", value=REDOS),)
    )
    validate.validate_job(validate.canonicalize_job(job))
