"""Which nodes may run a group: readiness, datacenters, drivers and constraints.

A node is feasible for a group when it is ready (status ready, eligible, not draining), its
datacenter matches one of the job's (``*`` and fnmatch globs allowed), it announces every
driver the group's tasks use (``driver.<name>`` = "1", as the client fingerprints them: a
task sent to a node without its driver can only fail there, and be rescheduled forever)
and it passes every constraint of the job, the group and the group's tasks. ``distinct_hosts`` and
``distinct_property`` depend on where the plan has put other allocs, so they are only
*described* here (``distinct_hosts_scope``, ``distinct_properties``) and checked by
``drover.scheduler.placement`` against the plan's proposed view.

Everything is compiled once per (job, group) into closures over a ``Node``
(``compile_feasibility``): the schedulers test thousands of nodes against the same
constraints, so targets, regular expressions, sets and version ranges are parsed once.
``feasible_nodes`` also counts why each ready node in the job's datacenters was filtered
(``FilterReport``: "missing drivers", "constraint ${attr.kernel.name} = linux"), the
first half of a placement's metrics.

Constraint semantics follow Nomad's ``checkConstraint``:

* a target is ``${node.unique.id}``, ``${node.unique.name}``, ``${node.datacenter}``,
  ``${node.class}``, ``${attr.<key>}`` (node attributes), ``${meta.<key>}`` (node meta),
  or on the left-hand side a plain attribute key (``kernel.name``); a plain right-hand side
  is a literal;
* a target the node does not have is "missing": ``=`` and ordering fail, ``!=`` passes,
  ``is_set`` fails and ``is_not_set`` passes, every other operator fails;
* ordering compares numerically when both sides parse as numbers, else as strings;
* ``regexp`` is RE2 (Go's syntax, linear-time matching: ``drover.scheduler.regexp``), so
  no pattern can stall the scheduler; a pattern RE2 refuses matches no node;
* ``set_contains``/``set_contains_all``/``set_contains_any`` read comma-separated sets;
* ``version`` and ``semver`` take ranges such as ``>= 1.2, < 2.0`` (``~>`` too). ``version``
  follows hashicorp/go-version: a prerelease only satisfies a clause whose version is a
  prerelease of the same release. ``semver`` is plain Semantic Versioning 2.0 ordering.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

from drover.scheduler.interfaces import State
from drover.scheduler.regexp import RegexpError, compile_regexp, matches
from drover.scheduler.structs import NODE_POOL_ALL, NODE_POOL_DEFAULT, Constraint, Job, Node, TaskGroup

__all__ = [
    "DISTINCT_HOSTS",
    "DISTINCT_HOSTS_GROUP",
    "DISTINCT_HOSTS_JOB",
    "DISTINCT_PROPERTY",
    "REASON_CORES",
    "REASON_DATACENTER",
    "REASON_DISTINCT_HOSTS",
    "REASON_DISTINCT_PROPERTY",
    "REASON_MISSING_DRIVERS",
    "REASON_NODE_POOL",
    "REASON_NOT_READY",
    "DistinctProperty",
    "Feasibility",
    "FeasibleNodes",
    "FilterReport",
    "Version",
    "check_operator",
    "compare_versions",
    "compile_cores",
    "compile_datacenters",
    "compile_drivers",
    "compile_feasibility",
    "compile_node_pool",
    "compile_predicate",
    "compile_target",
    "distinct_hosts_scope",
    "distinct_properties",
    "feasible_nodes",
    "feasible_nodes_from",
    "parse_version",
    "version_matches",
]

DISTINCT_HOSTS: Final = "distinct_hosts"
DISTINCT_PROPERTY: Final = "distinct_property"
# distinct_hosts_scope: no two allocs of the job, or of the group, on one node.
DISTINCT_HOSTS_JOB: Final = "job"
DISTINCT_HOSTS_GROUP: Final = "group"
# Operators that depend on the plan, not on the node alone.
_PLAN_DEPENDENT: Final = frozenset({DISTINCT_HOSTS, DISTINCT_PROPERTY})

Getter = Callable[[Node], str | None]
Predicate = Callable[[Node], bool]

# ---------------------------------------------------------------------------------------
# Targets


def _node_id(n: Node) -> str | None:
    return n.id


def _node_name(n: Node) -> str | None:
    return n.name


def _node_dc(n: Node) -> str | None:
    return n.datacenter


def _node_class(n: Node) -> str | None:
    return n.node_class


def _missing(n: Node) -> str | None:
    return None


_NODE_FIELDS: Final[dict[str, Getter]] = {
    "node.unique.id": _node_id,
    "node.unique.name": _node_name,
    "node.datacenter": _node_dc,
    "node.class": _node_class,
}


def _attribute(key: str) -> Getter:
    def get(n: Node) -> str | None:
        return n.attributes.get(key)

    return get


def _meta(key: str) -> Getter:
    def get(n: Node) -> str | None:
        return n.meta.get(key)

    return get


def _interpolated(target: str) -> str | None:
    if target.startswith("${") and target.endswith("}"):
        return target[2:-1]
    return None


def compile_target(target: str) -> Getter:
    """A node -> value function for a left-hand target (a plain string is an attribute key).

    Unknown ``${...}`` forms resolve to "missing" on every node.
    """
    inner = _interpolated(target)
    if inner is None:
        return _attribute(target)
    if inner in _NODE_FIELDS:
        return _NODE_FIELDS[inner]
    if inner.startswith("attr."):
        return _attribute(inner[len("attr.") :])
    if inner.startswith("meta."):
        return _meta(inner[len("meta.") :])
    return _missing


# ---------------------------------------------------------------------------------------
# Versions (our own small comparator; hashicorp/go-version and semver 2.0 semantics)

_VERSION_RE: Final = re.compile(r"^v?(\d+(?:\.\d+)*)(?:-([0-9A-Za-z.-]+))?(?:\+[0-9A-Za-z.-]+)?$")
_SEMVER_RE: Final = re.compile(r"^v?(\d+(?:\.\d+){0,2})(?:-([0-9A-Za-z.-]+))?(?:\+[0-9A-Za-z.-]+)?$")
_CLAUSE_RE: Final = re.compile(r"^\s*(~>|>=|<=|!=|==|=|>|<)?\s*(\S+)\s*$")


@dataclass(frozen=True, slots=True)
class Version:
    # Release segments as written (``1.2`` is (1, 2)); comparisons pad with zeros.
    segments: tuple[int, ...]
    # Prerelease identifiers (``rc.1`` is ("rc", 1)); empty for a release.
    prerelease: tuple[int | str, ...] = ()

    def padded(self, length: int) -> tuple[int, ...]:
        return self.segments + (0,) * (length - len(self.segments))


def parse_version(text: str, *, strict: bool = False) -> Version | None:
    """``1.2.3``, ``v1.2``, ``1.2.3-rc.1+build``; None when unparsable.

    ``strict`` (semver) allows at most three release segments; lenient allows any number.
    """
    match = (_SEMVER_RE if strict else _VERSION_RE).match(text.strip())
    if match is None:
        return None
    segments = tuple(int(s) for s in match.group(1).split("."))
    pre_text = match.group(2)
    prerelease: tuple[int | str, ...] = ()
    if pre_text:
        prerelease = tuple(int(p) if p.isdigit() else p for p in pre_text.split("."))
    return Version(segments, prerelease)


def _compare_prerelease(a: tuple[int | str, ...], b: tuple[int | str, ...]) -> int:
    if a == b:
        return 0
    if not a:  # a release ranks above any of its prereleases
        return 1
    if not b:
        return -1
    for x, y in zip(a, b, strict=False):
        if x == y:
            continue
        if isinstance(x, int) and isinstance(y, int):
            return -1 if x < y else 1
        if isinstance(x, int):  # numeric identifiers rank below alphanumeric ones
            return -1
        if isinstance(y, int):
            return 1
        return -1 if x < y else 1
    return -1 if len(a) < len(b) else 1


def compare_versions(a: Version, b: Version) -> int:
    """-1, 0 or 1, Semantic Versioning precedence (build metadata ignored)."""
    length = max(len(a.segments), len(b.segments), 3)
    pa, pb = a.padded(length), b.padded(length)
    if pa != pb:
        return -1 if pa < pb else 1
    return _compare_prerelease(a.prerelease, b.prerelease)


@dataclass(frozen=True, slots=True)
class _Clause:
    op: str
    version: Version


def _parse_range(text: str, strict: bool) -> tuple[_Clause, ...] | None:
    clauses: list[_Clause] = []
    for part in text.split(","):
        match = _CLAUSE_RE.match(part)
        if match is None:
            return None
        version = parse_version(match.group(2), strict=strict)
        if version is None:
            return None
        clauses.append(_Clause(match.group(1) or "=", version))
    return tuple(clauses) if clauses else None


def _clause_holds(clause: _Clause, v: Version, strict: bool) -> bool:
    c = clause.version
    if not strict:
        # go-version's prerelease rule: a prerelease only matches a clause naming a
        # prerelease of the same release ("> 1.0" must not pick up "1.1.0-beta").
        if v.prerelease and not c.prerelease:
            return False
        if v.prerelease and c.prerelease:
            length = max(len(v.segments), len(c.segments), 3)
            if v.padded(length) != c.padded(length):
                return False
    cmp = compare_versions(v, c)
    op = clause.op
    if op in ("=", "=="):
        return cmp == 0
    if op == "!=":
        return cmp != 0
    if op == ">":
        return cmp > 0
    if op == ">=":
        return cmp >= 0
    if op == "<":
        return cmp < 0
    if op == "<=":
        return cmp <= 0
    # "~>": at least c, and the same release line: all of c's segments but the last fixed
    # (``~> 1.2`` is >= 1.2, < 2.0; ``~> 1.2.3`` is >= 1.2.3, < 1.3.0).
    fixed = max(len(c.segments) - 1, 1)
    return cmp >= 0 and v.padded(fixed)[:fixed] == c.segments[:fixed]


def version_matches(version: str, constraint: str, *, strict: bool = False) -> bool:
    """Whether ``version`` satisfies every clause of ``constraint`` (``>= 1.2, < 2.0``)."""
    clauses = _parse_range(constraint, strict)
    return clauses is not None and _range_holds(clauses, version, strict)


def _range_holds(clauses: Sequence[_Clause], version: str, strict: bool) -> bool:
    v = parse_version(version, strict=strict)
    return v is not None and all(_clause_holds(c, v, strict) for c in clauses)


# ---------------------------------------------------------------------------------------
# Operators

_INT_RE: Final = re.compile(r"^[+-]?\d+$")


def _as_number(text: str) -> float | int | None:
    if _INT_RE.match(text):
        return int(text)
    if "_" in text:
        return None
    try:
        return float(text)
    except ValueError:
        return None


def _ordered(op: str, lval: str, rval: str) -> bool:
    ln, rn = _as_number(lval), _as_number(rval)
    if ln is not None and rn is not None:
        a: float | int | str = ln
        b: float | int | str = rn
    else:
        a, b = lval, rval
    if op == "<":
        return a < b  # type: ignore[operator]
    if op == "<=":
        return a <= b  # type: ignore[operator]
    if op == ">":
        return a > b  # type: ignore[operator]
    return a >= b  # type: ignore[operator]


def _parse_set(text: str) -> frozenset[str]:
    return frozenset(s for s in (part.strip() for part in text.split(",")) if s)


def check_operator(op: str, lval: str | None, rval: str | None) -> bool:
    """One constraint/affinity operator on resolved values (None = the target is missing)."""
    if op in ("=", "=="):
        return lval is not None and rval is not None and lval == rval
    if op == "!=":
        return lval != rval
    if op in ("<", "<=", ">", ">="):
        return lval is not None and rval is not None and _ordered(op, lval, rval)
    if op == "is_set":
        return lval is not None
    if op == "is_not_set":
        return lval is None
    if op in _PLAN_DEPENDENT:
        return True
    if lval is None or rval is None:
        return False
    if op == "regexp":
        try:
            return matches(compile_regexp(rval), lval)
        except RegexpError:
            return False
    if op in ("set_contains", "set_contains_all"):
        return _parse_set(rval) <= _parse_set(lval)
    if op == "set_contains_any":
        return bool(_parse_set(rval) & _parse_set(lval))
    if op == "version":
        return version_matches(lval, rval)
    if op == "semver":
        return version_matches(lval, rval, strict=True)
    return False  # unknown operator: validation rejects it; never feasible


def _never(n: Node) -> bool:
    return False


def compile_predicate(attribute: str, operator: str, value: str) -> Predicate:
    """A node -> bool function for one constraint or affinity, with its operand pre-parsed."""
    lget = compile_target(attribute)
    rinner = _interpolated(value)
    if rinner is not None:  # the right-hand side depends on the node: no pre-parsing
        rget = compile_target(value)

        def dynamic(n: Node) -> bool:
            return check_operator(operator, lget(n), rget(n))

        return dynamic

    if operator == "regexp":
        try:
            pattern = compile_regexp(value)
        except RegexpError:
            return _never

        def regexp(n: Node) -> bool:
            lval = lget(n)
            return lval is not None and matches(pattern, lval)

        return regexp
    if operator in ("set_contains", "set_contains_all", "set_contains_any"):
        wanted = _parse_set(value)
        any_of = operator == "set_contains_any"

        def contains(n: Node) -> bool:
            lval = lget(n)
            if lval is None:
                return False
            have = _parse_set(lval)
            return bool(wanted & have) if any_of else wanted <= have

        return contains
    if operator in ("version", "semver"):
        strict = operator == "semver"
        clauses = _parse_range(value, strict)
        if clauses is None:
            return _never
        parsed = clauses

        def version(n: Node) -> bool:
            lval = lget(n)
            return lval is not None and _range_holds(parsed, lval, strict)

        return version

    def simple(n: Node) -> bool:
        return check_operator(operator, lget(n), value)

    return simple


# ---------------------------------------------------------------------------------------
# Datacenters


def _any_dc(dc: str) -> bool:
    return True


def compile_datacenters(patterns: Sequence[str]) -> Callable[[str], bool]:
    """A datacenter -> bool function; ``*`` (or no datacenters at all) matches every one."""
    if not patterns or "*" in patterns:
        return _any_dc
    exact = frozenset(p for p in patterns if not any(ch in p for ch in "*?["))
    globs = tuple(re.compile(fnmatch.translate(p)) for p in patterns if p not in exact)
    seen: dict[str, bool] = {}

    def matches(dc: str) -> bool:
        hit = seen.get(dc)
        if hit is None:
            hit = dc in exact or any(g.match(dc) for g in globs)
            seen[dc] = hit
        return hit

    return matches


# ---------------------------------------------------------------------------------------
# Per (job, group)


def _group_constraints(job: Job, group: TaskGroup) -> list[tuple[Constraint, bool]]:
    """Every constraint that applies to the group, with whether it was set at job level."""
    out = [(c, True) for c in job.constraints]
    out += [(c, False) for c in group.constraints]
    for task in group.tasks:
        out += [(c, False) for c in task.constraints]
    return out


# Why a node is filtered, in the words an operator reads (Nomad's metric reasons).
REASON_MISSING_DRIVERS: Final = "missing drivers"
REASON_NOT_READY: Final = "node not ready"
REASON_DATACENTER: Final = "datacenter"
REASON_NODE_POOL: Final = "node pool"
REASON_CORES: Final = "cpu cores"
REASON_DISTINCT_HOSTS: Final = DISTINCT_HOSTS
REASON_DISTINCT_PROPERTY: Final = DISTINCT_PROPERTY
# A driver attribute counts when it parses as true, as Go's strconv.ParseBool reads it
# (Nomad's DriverChecker falls back to ``driver.<name>`` the same way).
_DRIVER_ON: Final = frozenset({"1", "t", "T", "TRUE", "true", "True"})


def compile_drivers(drivers: Iterable[str]) -> Predicate:
    """A node -> bool function: the node announces every one of ``drivers`` (``driver.<name>``)."""
    keys = tuple(sorted({f"driver.{d}" for d in drivers}))
    on = _DRIVER_ON

    def has_drivers(n: Node) -> bool:
        attrs = n.attributes
        return all(attrs.get(key) in on for key in keys)

    return has_drivers


@dataclass(frozen=True, slots=True)
class Feasibility:
    """The node-only checks for one (job, group), compiled."""

    datacenter_ok: Callable[[str], bool]
    # Every check in the order Nomad's feasibility chain runs them (job constraints, the
    # group's drivers, then group and task constraints), each with the reason a node
    # failing it is filtered for: ``constraint <text>`` or "missing drivers".
    checks: tuple[tuple[str, Predicate], ...]

    def constraints_ok(self, node: Node) -> bool:
        """Constraints and drivers: everything but readiness and datacenters."""
        return all(pred(node) for _, pred in self.checks)

    def feasible(self, node: Node) -> bool:
        return (
            node.ready_for_placement() and self.datacenter_ok(node.datacenter) and self.constraints_ok(node)
        )

    def filter_reason(self, node: Node) -> str:
        """The first constraint or driver check ``node`` fails, "" when it passes them all."""
        for reason, pred in self.checks:
            if not pred(node):
                return reason
        return ""

    def reason(self, node: Node) -> str:
        """Why ``node`` is infeasible ("" when it is feasible), for metrics and plans."""
        if not node.ready_for_placement():
            return REASON_NOT_READY
        if not self.datacenter_ok(node.datacenter):
            return REASON_DATACENTER
        return self.filter_reason(node)


def compile_feasibility(job: Job, group: TaskGroup) -> Feasibility:
    checks: dict[Constraint, Predicate] = {}
    job_level: set[Constraint] = set()
    for c, at_job in _group_constraints(job, group):
        if c.operator in _PLAN_DEPENDENT or c in checks:
            continue
        checks[c] = compile_predicate(c.attribute, c.operator, c.value)
        if at_job:
            job_level.add(c)
    described = [(c, f"{c.attribute} {c.operator} {c.value}".strip(), p) for c, p in checks.items()]
    ordered = [(f"constraint {text}", p) for c, text, p in described if c in job_level]
    pool = job.node_pool or NODE_POOL_DEFAULT
    if pool != NODE_POOL_ALL:
        ordered.insert(0, (REASON_NODE_POOL, compile_node_pool(pool)))
    cores = max((t.resources.cores for t in group.tasks if t.resources is not None), default=0)
    if cores:
        ordered.append((REASON_CORES, compile_cores(cores)))
    drivers = {t.driver for t in group.tasks}
    if drivers:
        ordered.append((REASON_MISSING_DRIVERS, compile_drivers(drivers)))
    ordered += [(f"constraint {text}", p) for c, text, p in described if c not in job_level]
    return Feasibility(
        datacenter_ok=compile_datacenters(job.datacenters),
        checks=tuple(ordered),
    )


def compile_node_pool(pool: str) -> Predicate:
    """Nodes of ``pool`` only; a node that names none is in the default pool."""

    def in_pool(node: Node) -> bool:
        return (node.node_pool or NODE_POOL_DEFAULT) == pool

    return in_pool


def compile_cores(cores: int) -> Predicate:
    """Nodes with at least ``cores`` cores (the fingerprint's ``cpu.numcores``): a task
    reserving whole cores cannot run on fewer."""

    def has_cores(node: Node) -> bool:
        numcores = node.attributes.get("cpu.numcores", "")
        return numcores.isdigit() and int(numcores) >= cores

    return has_cores


def _enabled(c: Constraint) -> bool:
    # Nomad: an empty value means true; "false" switches the constraint off.
    return c.value.strip().lower() not in ("false", "0", "no")


def distinct_hosts_scope(job: Job, group: TaskGroup) -> str:
    """The distinct_hosts scope: "job" (no two allocs of the job on one node), "group" (no two
    of the group), or "" (none). A job-level constraint wins over a group's."""
    scope = ""
    for c, job_level in _group_constraints(job, group):
        if c.operator == DISTINCT_HOSTS and _enabled(c):
            if job_level:
                return DISTINCT_HOSTS_JOB
            scope = DISTINCT_HOSTS_GROUP
    return scope


@dataclass(frozen=True, slots=True)
class DistinctProperty:
    """At most ``limit`` allocs of the job (or of the group) per value of ``target``."""

    target: str
    # 0 when the constraint's value is not a positive integer: no node is feasible.
    limit: int
    group_scoped: bool


def distinct_properties(job: Job, group: TaskGroup) -> tuple[DistinctProperty, ...]:
    out: dict[tuple[str, bool], int] = {}
    for c, job_level in _group_constraints(job, group):
        if c.operator != DISTINCT_PROPERTY:
            continue
        text = c.value.strip()
        limit = int(text) if text.isdigit() else (1 if not text else 0)
        key = (c.attribute, not job_level)
        out[key] = min(out.get(key, limit), limit)
    return tuple(DistinctProperty(t, limit, scoped) for (t, scoped), limit in out.items())


@dataclass(frozen=True, slots=True)
class FilterReport:
    """What the feasibility pass over every node found, for placement metrics: the ready
    nodes in the job's datacenters (Nomad's pool), per datacenter, and why each of those
    that cannot run the group was filtered (by reason, by node class)."""

    nodes_in_pool: int = 0
    nodes_available: Mapping[str, int] = field(default_factory=dict)
    nodes_filtered: int = 0
    constraint_filtered: Mapping[str, int] = field(default_factory=dict)
    class_filtered: Mapping[str, int] = field(default_factory=dict)


class FeasibleNodes(list[Node]):
    """The feasible nodes, sorted by ID, that also remember why the others were left out
    (``report``), so ranking can put the filter counts into each placement's metrics
    without a second pass over the nodes. A plain list everywhere else."""

    __slots__ = ("report",)

    def __init__(self, nodes: Iterable[Node] = (), report: FilterReport | None = None) -> None:
        super().__init__(nodes)
        self.report = report if report is not None else FilterReport()


def feasible_nodes_from(nodes: Iterable[Node], job: Job, group: TaskGroup) -> FeasibleNodes:
    check = compile_feasibility(job, group)
    datacenter_ok = check.datacenter_ok
    filter_reason = check.filter_reason
    ok: list[Node] = []
    available: dict[str, int] = {}
    reasons: dict[str, int] = {}
    classes: dict[str, int] = {}
    for node in nodes:
        if not node.ready_for_placement() or not datacenter_ok(node.datacenter):
            continue
        available[node.datacenter] = available.get(node.datacenter, 0) + 1
        reason = filter_reason(node)
        if not reason:
            ok.append(node)
            continue
        reasons[reason] = reasons.get(reason, 0) + 1
        classes[node.node_class] = classes.get(node.node_class, 0) + 1
    ok.sort(key=_node_id_key)
    report = FilterReport(
        nodes_in_pool=sum(available.values()),
        nodes_available=available,
        nodes_filtered=sum(reasons.values()),
        constraint_filtered=reasons,
        class_filtered=classes,
    )
    return FeasibleNodes(ok, report)


def _node_id_key(n: Node) -> str:
    return n.id


def feasible_nodes(state: State, job: Job, group: TaskGroup) -> FeasibleNodes:
    """Ready nodes (status ready, eligible, not draining) in the job's datacenters ("*" and
    globs allowed) that have the group's drivers and pass the job's, group's and tasks'
    constraints (not distinct_hosts / distinct_property, which depend on the plan and are
    checked in select_node). Sorted by ID; ``report`` says why the others were filtered."""
    return feasible_nodes_from(state.nodes(), job, group)
