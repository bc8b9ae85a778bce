"""drover.scheduler.placement.feasible: readiness, datacenters and constraints, node by node."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from drover.scheduler.placement.feasible import (
    DistinctProperty,
    check_operator,
    compile_datacenters,
    compile_feasibility,
    compile_predicate,
    distinct_hosts_scope,
    distinct_properties,
    feasible_nodes,
    parse_version,
    version_matches,
)
from drover.scheduler.structs import (
    NODE_INELIGIBLE,
    NODE_STATUS_DOWN,
    NODE_STATUS_INIT,
    Constraint,
    Job,
    Node,
    Task,
    TaskGroup,
)
from tests.fixtures import mock
from tests.harness import Harness


def node_with(**attributes: str) -> Node:
    return mock.node(id="node-x", name="node-x.dc1", attributes=attributes, meta={"rack": "r2"})


# ---------------------------------------------------------------------------------------
# Operators, one row per situation

OPERATOR_CASES = [
    # (attribute on node, operator, value, expected)
    ("linux", "=", "linux", True),
    ("linux", "==", "linux", True),
    ("darwin", "=", "linux", False),
    ("darwin", "!=", "linux", True),
    ("linux", "!=", "linux", False),
    ("10", ">", "9", True),  # numeric, not lexical ("10" < "9" as strings)
    ("10", "<", "9", False),
    ("2.5", ">=", "2.50", True),
    ("abc", "<", "abd", True),  # lexical when not numbers
    ("b", "<=", "a", False),
    ("4", "<=", "4", True),
    ("x86_64", "regexp", "^x86", True),
    ("arm64", "regexp", "^x86", False),
    ("linux-5.10", "regexp", r"5\.\d+", True),  # unanchored search, as Go's MatchString
    ("a,b,c", "set_contains", "a,c", True),
    ("a,b,c", "set_contains", "a,d", False),
    ("a, b ,c", "set_contains_all", "b, c", True),
    ("a,b,c", "set_contains_any", "d,c", True),
    ("a,b,c", "set_contains_any", "d,e", False),
    ("1.2.3", "version", ">= 1.2, < 2.0", True),
    ("2.0.0", "version", ">= 1.2, < 2.0", False),
    ("1.3.0-beta1", "version", ">= 1.2", False),  # go-version: prereleases need a prerelease clause
    ("1.3.0-beta1", "semver", ">= 1.2.0", True),  # semver ordering: 1.3.0-beta1 > 1.2.0
    ("1.3.0-beta1", "semver", ">= 1.3.0", False),
    ("v1.4.1", "version", "~> 1.4", True),
    ("anything", "is_set", "", True),
]


@pytest.mark.parametrize(
    ("have", "op", "value", "expected"),
    OPERATOR_CASES,
    ids=[f"{have!r} {op} {value!r}" for have, op, value, _ in OPERATOR_CASES],
)
def test_constraint__operator_on_attribute(have: str, op: str, value: str, expected: bool) -> None:
    node = node_with(thing=have)
    assert compile_predicate("${attr.thing}", op, value)(node) is expected
    assert check_operator(op, have, value) is expected  # the uncompiled path agrees


MISSING_CASES = [
    ("=", "x", False),
    ("!=", "x", True),
    (">", "1", False),
    ("regexp", ".*", False),
    ("set_contains", "a", False),
    ("version", ">= 0", False),
    ("is_set", "", False),
    ("is_not_set", "", True),
]


@pytest.mark.parametrize(
    ("op", "value", "expected"), MISSING_CASES, ids=[f"missing {op}" for op, _, _ in MISSING_CASES]
)
def test_constraint__attribute_missing_on_node(op: str, value: str, expected: bool) -> None:
    assert compile_predicate("${attr.nope}", op, value)(node_with()) is expected


TARGET_CASES = [
    ("${node.datacenter}", "dc1"),
    ("${node.unique.name}", "node-x.dc1"),
    ("${node.unique.id}", "node-x"),
    ("${node.class}", "linux-medium-pci"),
    ("${meta.rack}", "r2"),
    ("${attr.kernel.name}", "linux"),
    ("kernel.name", "linux"),  # a plain key is an attribute key
]


@pytest.mark.parametrize(("target", "value"), TARGET_CASES, ids=[t for t, _ in TARGET_CASES])
def test_constraint__target_resolves_against_node(target: str, value: str) -> None:
    node = node_with(**{"kernel.name": "linux"})
    assert compile_predicate(target, "=", value)(node)
    assert not compile_predicate(target, "=", value + "-other")(node)


def test_constraint__unknown_interpolation_is_missing() -> None:
    node = node_with()
    assert not compile_predicate("${node.pool}", "=", "default")(node)
    assert compile_predicate("${node.pool}", "is_not_set", "")(node)


def test_constraint__right_hand_side_interpolated_against_node() -> None:
    node = node_with(home="dc1")
    assert compile_predicate("${attr.home}", "=", "${node.datacenter}")(node)
    assert not compile_predicate("${attr.home}", "!=", "${node.datacenter}")(node)


def test_constraint__invalid_regexp_or_version_range_never_matches() -> None:
    node = node_with(thing="1.0.0")
    assert not compile_predicate("${attr.thing}", "regexp", "(")(node)
    assert not compile_predicate("${attr.thing}", "version", ">= banana")(node)


# ---------------------------------------------------------------------------------------
# Versions

VERSION_CASES = [
    # (version, range, strict, expected)
    ("1.2.3", "= 1.2.3", False, True),
    ("1.2", "= 1.2.0", False, True),  # padded with zeros
    ("1.2.3", "!= 1.2.3", False, False),
    ("1.10.0", "> 1.9", False, True),  # numeric segments, not lexical
    ("1.2.3", "~> 1.2.0", False, True),
    ("1.3.0", "~> 1.2.0", False, False),  # ~> 1.2.0 is < 1.3.0
    ("1.9.9", "~> 1.2", False, True),  # ~> 1.2 is < 2.0
    ("2.0.0", "~> 1.2", False, False),
    ("1.2.3-rc.1", "> 1.2.3-beta.2", False, True),  # same release, prerelease ordering
    ("1.2.3-rc.1", ">= 1.2.0-rc.1", False, False),  # prerelease of another release
    ("1.2.3-rc.1", "< 1.2.3", True, True),  # a prerelease ranks below its release
    ("1.2.3-alpha.10", "> 1.2.3-alpha.9", True, True),  # numeric identifiers compare numerically
    ("1.2.3-alpha", "< 1.2.3-alpha.1", True, True),  # a shorter prefix ranks lower
    ("1.2.3-1", "< 1.2.3-alpha", True, True),  # numeric below alphanumeric
    ("1.2.3+build.5", "= 1.2.3", True, True),  # build metadata ignored
    ("1.2.3.4", ">= 1.0", False, True),  # lenient: any number of segments
    ("1.2.3.4", ">= 1.0", True, False),  # semver: at most three
    ("not-a-version", ">= 0", False, False),
]


@pytest.mark.parametrize(
    ("version", "constraint", "strict", "expected"),
    VERSION_CASES,
    ids=[f"{'semver' if s else 'version'} {v} {c}" for v, c, s, _ in VERSION_CASES],
)
def test_version__range(version: str, constraint: str, strict: bool, expected: bool) -> None:
    assert version_matches(version, constraint, strict=strict) is expected


def test_version__parse_keeps_segments_and_prerelease() -> None:
    v = parse_version("v1.2.3-rc.1+meta")
    assert v is not None
    assert (v.segments, v.prerelease) == ((1, 2, 3), ("rc", 1))


# ---------------------------------------------------------------------------------------
# Datacenters

DC_CASES = [
    (("dc1",), "dc1", True),
    (("dc1",), "dc2", False),
    (("*",), "anything", True),
    ((), "anything", True),  # no datacenters is "*", as canonicalize_job makes it
    (("us-*",), "us-east-1", True),
    (("us-*",), "eu-west-1", False),
    (("dc[12]",), "dc2", True),
    (("dc[12]",), "dc3", False),
    (("dc?",), "dc9", True),
    (("eu-*", "dc1"), "dc1", True),
    (("DC1",), "dc1", False),  # case-sensitive
]


@pytest.mark.parametrize(
    ("patterns", "dc", "expected"),
    DC_CASES,
    ids=[f"{','.join(p) or 'none'} vs {dc}" for p, dc, _ in DC_CASES],
)
def test_datacenters__glob(patterns: tuple[str, ...], dc: str, expected: bool) -> None:
    assert compile_datacenters(patterns)(dc) is expected


# ---------------------------------------------------------------------------------------
# feasible_nodes over a real state store


def harness_with(*nodes: Node) -> Harness:
    h = Harness()
    for n in nodes:
        h.add_node(n)
    return h


NOT_READY_CASES = [
    ("initializing", {"status": NODE_STATUS_INIT}),
    ("down", {"status": NODE_STATUS_DOWN}),
    ("ineligible", {"scheduling_eligibility": NODE_INELIGIBLE}),
]


@pytest.mark.parametrize("changes", [c for _, c in NOT_READY_CASES], ids=[i for i, _ in NOT_READY_CASES])
def test_feasible_nodes__not_ready_node_excluded(changes: dict[str, str]) -> None:
    good = mock.node(id="a-ready")
    bad = mock.node(id="b-bad", **changes)
    h = harness_with(good, bad)
    job = mock.job()
    assert [n.id for n in feasible_nodes(h.snapshot(), job, job.groups[0])] == ["a-ready"]


def test_feasible_nodes__draining_node_excluded() -> None:
    h = harness_with(mock.node(id="a-ready"), mock.drain_node(id="b-draining"))
    job = mock.job()
    assert [n.id for n in feasible_nodes(h.snapshot(), job, job.groups[0])] == ["a-ready"]


def test_feasible_nodes__datacenter_glob_and_sorted_by_id() -> None:
    h = harness_with(
        mock.node(id="n3", datacenter="us-west"),
        mock.node(id="n1", datacenter="us-east"),
        mock.node(id="n2", datacenter="eu-west"),
    )
    job = mock.job(datacenters=("us-*",))
    assert [n.id for n in feasible_nodes(h.snapshot(), job, job.groups[0])] == ["n1", "n3"]


def group_with(job: Job, **changes: Any) -> Job:
    return replace(job, groups=(replace(job.groups[0], **changes),))


def test_feasible_nodes__job_group_and_task_constraints_all_apply() -> None:
    h = harness_with(
        mock.node(id="n1", meta={"rack": "r1"}, node_class="big"),
        mock.node(id="n2", meta={"rack": "r2"}, node_class="big"),
        mock.node(id="n3", meta={"rack": "r2"}, node_class="small"),
        mock.node(id="n4", meta={"rack": "r2"}, node_class="big", attributes={"kernel.name": "windows"}),
    )
    job = mock.job()  # job level: ${attr.kernel.name} = linux
    task = replace(job.groups[0].tasks[0], constraints=(Constraint("${node.class}", "=", "big"),))
    job = group_with(job, constraints=(Constraint("${meta.rack}", "=", "r2"),), tasks=(task,))
    assert [n.id for n in feasible_nodes(h.snapshot(), job, job.groups[0])] == ["n2"]


def test_feasible_nodes__distinct_constraints_left_to_the_plan() -> None:
    h = harness_with(mock.node(id="n1"), mock.node(id="n2"))
    job = mock.job(
        constraints=(
            Constraint(operator="distinct_hosts"),
            Constraint("${meta.rack}", "distinct_property", "1"),
        )
    )
    assert len(feasible_nodes(h.snapshot(), job, job.groups[0])) == 2


def test_feasibility__reason_names_the_failing_check() -> None:
    job = mock.job(datacenters=("dc1",))
    check = compile_feasibility(job, job.groups[0])
    assert check.reason(mock.node()) == ""
    assert check.reason(mock.node(status=NODE_STATUS_DOWN)) == "node not ready"
    assert check.reason(mock.node(datacenter="dc9")) == "datacenter"
    windows = mock.node(attributes={"kernel.name": "windows"})
    assert check.reason(windows) == "constraint ${attr.kernel.name} = linux"


# ---------------------------------------------------------------------------------------
# distinct_* descriptions


def test_distinct_hosts_scope__job_level_wins_over_group() -> None:
    group = TaskGroup(name="g", constraints=(Constraint(operator="distinct_hosts"),))
    assert distinct_hosts_scope(Job(id="j", groups=(group,)), group) == "group"
    job = Job(id="j", constraints=(Constraint(operator="distinct_hosts", value="true"),), groups=(group,))
    assert distinct_hosts_scope(job, group) == "job"
    off = TaskGroup(name="g", constraints=(Constraint(operator="distinct_hosts", value="false"),))
    assert distinct_hosts_scope(Job(id="j", groups=(off,)), off) == ""


def test_distinct_hosts_scope__task_constraint_counts_as_group() -> None:
    task = Task(name="t", constraints=(Constraint(operator="distinct_hosts"),))
    group = TaskGroup(name="g", tasks=(task,))
    assert distinct_hosts_scope(Job(id="j", groups=(group,)), group) == "group"


def test_distinct_properties__limit_default_and_invalid() -> None:
    group = TaskGroup(
        name="g",
        constraints=(
            Constraint("${meta.rack}", "distinct_property", ""),
            Constraint("${node.datacenter}", "distinct_property", "3"),
            Constraint("${attr.zone}", "distinct_property", "many"),
        ),
    )
    job = Job(id="j", constraints=(Constraint("${meta.rack}", "distinct_property", "2"),), groups=(group,))
    assert set(distinct_properties(job, group)) == {
        DistinctProperty("${meta.rack}", 2, group_scoped=False),
        DistinctProperty("${meta.rack}", 1, group_scoped=True),
        DistinctProperty("${node.datacenter}", 3, group_scoped=True),
        DistinctProperty("${attr.zone}", 0, group_scoped=True),  # never satisfiable
    }
