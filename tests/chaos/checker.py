"""The chaos checker: each invariant of docs/design.md, decided pass or fail from what a run left.

Inputs: the ``History`` of every request, the settled cluster's state (a snapshot from the
leader and one from every server), the servers' logs, their data dirs (replayed offline
with server/raft_tools.py once they are stopped), and what the live checker
(``Operator.Invariants``) said during the run. Each check returns a ``CheckResult`` with
the first problems it found; none raises on a failed invariant.

How "acknowledged" is judged (invariant 4, every acknowledged write is present after any
number of leader kills: docs/design.md#invariant-4): operations on one key are sequential, so the
last acknowledged one says what the key must look like at the end, unless an ``info``
operation (outcome unknown) landed later, which is allowed whenever it was invoked: a
write stuck in a paused server can be applied long after its caller gave up. So the final
state must be the effect of the last acknowledged operation or of one of the ``info``
ones; and it must never be the effect of anything that was not requested at all.
"""

from __future__ import annotations

import json
import re
import time
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Final

from drover.scheduler.structs import EVAL_STATUS_BLOCKED, EVAL_STATUS_PENDING, EVAL_TERMINAL, Job, Node
from drover.server.invariants import INVARIANT_SYSTEM_ALLOCS, check_invariants
from drover.server.raft_tools import OfflineError, open_data_dir, replay
from drover.server.snapshot import state_digest
from drover.server.state_store import Tables
from tests.chaos.clients import TaskSeen, Window
from tests.chaos.history import History, Op
from tests.chaos.workload import (
    CLIENT_RANK,
    DISPATCH_PARENT,
    PERIODIC_PARENT,
    SEQ_KEY,
)
from tests.fixtures import mock

MAX_DETAILS: Final = 20
JOB_KINDS: Final = frozenset({"register", "update-inplace", "update-destructive", "scale", "stop", "purge"})
REGISTER_KINDS: Final = frozenset({"register", "update-inplace", "update-destructive", "scale"})
DIVERGENCE: Final = re.compile(r"may have diverged|failed _onTick|IndexError")
TRACEBACK: Final = re.compile(r"^Traceback \(most recent call last\)", re.MULTILINE)
REJECTED: Final = re.compile(r"^(\S+Z) .*plan\.node_rejected.*?\bnode_id=(\S+)", re.MULTILINE)
HEARTBEAT_MISSED: Final = re.compile(r"leader\.heartbeat_missed\s+node_id=(\S+)")
# Writes that deliberately end or replace a job's allocs: their allocs need not be kept.
ENDS_ALLOCS: Final = frozenset({"stop", "purge", "update-destructive"})
CLIENT_DEFECT: Final = re.compile(
    r"client\.loop_crashed|task\.runner_crashed|^Traceback \(most recent", re.MULTILINE
)


@dataclass
class CheckResult:
    name: str
    invariant: str  # its number in docs/design.md ("Invariants"), or "" for a supporting check
    description: str
    passed: bool
    details: list[str] = field(default_factory=list)
    figures: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "invariant": self.invariant,
            "description": self.description,
            "passed": self.passed,
            "details": self.details[:MAX_DETAILS],
            "problems": len(self.details),
            "figures": self.figures,
        }


def _result(name: str, invariant: str, description: str, problems: list[str], **figures: Any) -> CheckResult:
    return CheckResult(name, invariant, description, not problems, problems, figures)


def _by_key(ops: Iterable[Op], kinds: frozenset[str]) -> dict[str, list[Op]]:
    out: dict[str, list[Op]] = defaultdict(list)
    for op in ops:
        if op.kind in kinds:
            out[op.key].append(op)
    return out


def _candidates(ops: list[Op]) -> tuple[Op | None, list[Op]]:
    """(the last acknowledged op, every op whose outcome is unknown)."""
    acked = [op for op in ops if op.ok]
    return (acked[-1] if acked else None), [op for op in ops if not op.ok]


# ---------------------------------------------------------------------------------------
# Invariant 4: every acknowledged write is present (docs/design.md#invariant-4)


def _job_matches(job: Job | None, op: Op) -> bool:
    if op.kind == "purge":
        return job is None
    if job is None:
        return False
    if op.kind == "stop":
        return job.stop
    group = job.groups[0] if job.groups else None
    return (
        not job.stop
        and job.meta.get(SEQ_KEY) == str(op.args["seq"])
        and group is not None
        and group.count == op.args["count"]
        and _variant(group.tasks[0].config_json) == op.args["variant"]
    )


def _variant(config_json: str) -> Any:
    try:
        return json.loads(config_json).get("variant")
    except ValueError:
        return None


def _describe_job(job: Job | None) -> str:
    if job is None:
        return "absent"
    group = job.groups[0] if job.groups else None
    return (
        f"{'stopped' if job.stop else 'running'} seq={job.meta.get(SEQ_KEY)} "
        f"count={group.count if group else '?'} version={job.version}"
    )


def _describe_op(op: Op) -> str:
    what = f"{op.kind}" + (f" seq={op.args['seq']}" if "seq" in op.args else "")
    return f"{what} ({op.outcome or 'open'} at t={op.t_complete:.2f}s, index {op.index})"


def check_acked_jobs(history: History, tables: Tables) -> CheckResult:
    problems: list[str] = []
    checked = 0
    for job_id, ops in sorted(_by_key(history, JOB_KINDS).items()):
        job = tables.jobs.get(("default", job_id))
        last, unknown = _candidates(ops)
        checked += 1
        allowed = ([last] if last is not None else []) + unknown
        if last is None and job is None:
            continue  # never acknowledged, never there
        if not any(_job_matches(job, op) for op in allowed):
            tail = "; ".join(_describe_op(op) for op in ops[-4:])
            problems.append(f"job {job_id!r} is {_describe_job(job)}; its last operations: {tail}")
            continue
        if (
            last is not None
            and last.kind in REGISTER_KINDS
            and _job_matches(job, last)
            and job is not None
            and job.version < last.result.get("version", 0)
        ):
            problems.append(
                f"job {job_id!r} is at version {job.version}, below the acknowledged {last.result['version']}"
            )
    for op in history:
        if op.kind in ("periodic-force", "dispatch") and op.ok:
            child_id = op.result.get("child_job_id") or op.result.get("dispatched_job_id") or ""
            child = tables.jobs.get(("default", child_id))
            checked += 1
            if child is None:
                problems.append(
                    f"{op.kind} of {op.key!r} acknowledged child {child_id!r} at index {op.index}: missing"
                )
            elif child.parent_id != op.key:
                problems.append(f"child {child_id!r} has parent {child.parent_id!r}, not {op.key!r}")
    dispatches = [op for op in history if op.kind == "dispatch"]
    children = sum(1 for j in tables.jobs.values() if j.parent_id == DISPATCH_PARENT)
    acked = sum(op.ok for op in dispatches)
    if not acked <= children <= len(dispatches):
        problems.append(
            f"{DISPATCH_PARENT!r} has {children} children; {acked} dispatches were acknowledged"
            f" and {len(dispatches)} attempted"
        )
    for parent in (PERIODIC_PARENT, DISPATCH_PARENT):
        if ("default", parent) not in tables.jobs:
            problems.append(f"template parent {parent!r} is missing")
    return _result(
        "acknowledged_writes_present",
        "4",
        "every acknowledged job write (register, update, scale, stop, purge, dispatch, forced launch) "
        "is what the final state shows, and nothing unrequested is",
        problems,
        keys_checked=checked,
    )


def _node_matches(node: Node | None, op: Op) -> bool:
    if node is None:
        return False
    if op.kind == "drain":
        return node.drain_strategy is not None
    return node.drain_strategy is None


def check_acked_nodes(history: History, tables: Tables) -> CheckResult:
    problems: list[str] = []
    for op in history:
        if op.kind == "node-register" and op.ok and op.key not in tables.nodes:
            problems.append(f"node {op.key!r} was registered at index {op.index} and is missing")
    for node_id, ops in sorted(_by_key(history, frozenset({"drain", "undrain"})).items()):
        node = tables.nodes.get(node_id)
        last, unknown = _candidates(ops)
        allowed = ([last] if last is not None else []) + unknown
        if allowed and not any(_node_matches(node, op) for op in allowed):
            state = "absent" if node is None else ("draining" if node.drain_strategy else "not draining")
            problems.append(
                f"node {node_id!r} is {state}; last acknowledged: {_describe_op(last) if last else '-'}"
            )
    reports = 0
    for op in history:
        if op.kind != "alloc-update" or not op.ok:
            continue
        for alloc_id, status in op.args["statuses"].items():
            reports += 1
            alloc = tables.allocs.get(alloc_id)
            if alloc is None:
                problems.append(f"alloc {alloc_id} reported {status} at index {op.index}: missing")
                continue
            have = alloc.client_status
            if have in ("lost", "unknown") and CLIENT_RANK[status] < 2:
                continue  # the servers may declare a live alloc lost
            if CLIENT_RANK.get(have, -1) < CLIENT_RANK[status]:
                problems.append(
                    f"alloc {alloc_id} was reported {status} (acknowledged at index {op.index}) but is {have}"
                )
    return _result(
        "acknowledged_node_and_alloc_writes_present",
        "4",
        "registered nodes exist, each node's drain state is its last acknowledged drain/undrain, "
        "and no alloc's client status is behind an acknowledged report",
        problems,
        alloc_reports=reports,
    )


def check_realtime_order(history: History) -> CheckResult:
    """A write acknowledged before another was invoked has the lower raft index."""
    acked = [op for op in history if op.ok and op.index]
    by_completion = sorted(acked, key=lambda op: op.t_complete)
    problems: list[str] = []
    best: Op | None = None
    j = 0
    for op in sorted(acked, key=lambda op: op.t_invoke):
        while j < len(by_completion) and by_completion[j].t_complete < op.t_invoke:
            if best is None or by_completion[j].index > best.index:
                best = by_completion[j]
            j += 1
        if best is not None and op.index <= best.index:
            problems.append(
                f"{op.process} {op.kind} {op.key!r} invoked at t={op.t_invoke:.3f}s got index {op.index}, "
                f"but {best.process} {best.kind} {best.key!r} was acknowledged earlier (t={best.t_complete:.3f}s) "
                f"at index {best.index}"
            )
    return _result(
        "acknowledged_indexes_follow_real_time",
        "4",
        "a write acknowledged before another was invoked was applied at a lower raft index",
        problems,
        acknowledged=len(acked),
    )


# ---------------------------------------------------------------------------------------
# Over the settled state: at most count live allocs per system job, group and node (1), job
# summaries equal a recount (2), equal digests at equal indexes (3); docs/design.md#invariants


def check_converged(
    converged: tuple[str, int] | None, error: str, per_server: Mapping[str, Tables]
) -> CheckResult:
    problems = [error] if error else []
    digests = {name: state_digest(t) for name, t in per_server.items()}
    indexes = {name: t.index for name, t in per_server.items()}
    if converged is not None:
        digest, index = converged
        for name, tables in sorted(per_server.items()):
            if tables.index == index and digests[name] != digest:
                problems.append(
                    f"{name}'s saved snapshot at index {index} hashes to {digests[name][:12]}, "
                    f"its live digest was {digest[:12]}"
                )
    if len(set(indexes.values())) == 1 and len(set(digests.values())) > 1:
        problems.append(f"servers at the same index {next(iter(indexes.values()))} differ: {digests}")
    return _result(
        "digests_equal",
        "3",
        "after settling, every server reports the same state digest at the same applied index "
        "(and its saved snapshot hashes to it)",
        problems,
        digest=converged[0] if converged else None,
        applied_index=converged[1] if converged else None,
        servers=sorted(per_server),
    )


def check_summaries(per_server: Mapping[str, Tables]) -> CheckResult:
    problems = [
        f"{name}: {problem}"
        for name, tables in sorted(per_server.items())
        for problem in mock.summary_problems(tables)
    ]
    return _result(
        "summaries_equal_recount",
        "2",
        "on every server, every job summary counter equals a recount from allocs and child jobs "
        "(tests/fixtures/mock.summary_problems over the saved snapshot), none negative",
        problems,
    )


def check_system_allocs(per_server: Mapping[str, Tables]) -> CheckResult:
    problems = [
        f"{name}: {v}"
        for name, tables in sorted(per_server.items())
        for v in check_invariants(tables)
        if v.invariant == INVARIANT_SYSTEM_ALLOCS
    ]
    return _result(
        "system_allocs_at_most_count",
        "1",
        "at most count live desired-running allocs per (system/sysbatch job, group, node)",
        problems,
    )


def check_evals(tables: Tables, now_ns: int | None = None) -> CheckResult:
    now_ns = time.time_ns() if now_ns is None else now_ns
    statuses: Counter[str] = Counter()
    problems: list[str] = []
    delayed = 0
    for ev in sorted(tables.evals.values(), key=lambda e: e.id):
        statuses[ev.status] += 1
        if ev.status in EVAL_TERMINAL:
            continue
        if ev.status == EVAL_STATUS_PENDING and ev.wait_until_ns > now_ns:
            delayed += 1
            continue
        if ev.status == EVAL_STATUS_BLOCKED:
            job = tables.jobs.get((ev.namespace, ev.job_id))
            if job is not None and not job.stop:
                continue
            problems.append(
                f"eval {ev.id} is blocked for job {ev.job_id!r}, which is "
                f"{'gone' if job is None else 'stopped'}: nothing can ever unblock it usefully"
            )
            continue
        problems.append(
            f"eval {ev.id} ({ev.triggered_by}, job {ev.job_id!r}) is still {ev.status} after settling"
        )
    return _result(
        "evals_settled",
        "",
        "after settling every eval is terminal, blocked for a job that still wants placements, "
        "or pending with a future wait_until (a delayed follow-up)",
        problems,
        statuses=dict(statuses),
        delayed=delayed,
    )


# ---------------------------------------------------------------------------------------
# From the logs: plan rejections per node bounded (docs/design.md#invariant-6), and no raft
# defect logged


def _ts(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def check_plan_rejections(logs: Mapping[str, str], threshold: int, window_s: float) -> CheckResult:
    """No server rejected plans for one node more than ``threshold + 1`` times in any
    ``window_s``: the rejection tracker ends a disagreement (the +1 is the rejection that
    trips it)."""
    per_node: Counter[str] = Counter()
    problems: list[str] = []
    for server, text in sorted(logs.items()):
        times: dict[str, list[float]] = defaultdict(list)
        for stamp, node_id in REJECTED.findall(text):
            times[node_id].append(_ts(stamp))
            per_node[node_id] += 1
        for node_id, stamps in sorted(times.items()):
            stamps.sort()
            lo = 0
            for hi in range(len(stamps)):
                while stamps[hi] - stamps[lo] > window_s:
                    lo += 1
                if hi - lo + 1 > threshold + 1:
                    problems.append(
                        f"{server} rejected plans for node {node_id!r} {hi - lo + 1} times within {window_s:g}s"
                    )
                    break
    return _result(
        "plan_rejections_bounded",
        "6",
        f"per server and node, at most threshold+1 ({threshold + 1}) plan.node_rejected in any {window_s:g}s",
        problems,
        rejections_per_node=dict(per_node),
    )


def check_logs(logs: Mapping[str, str]) -> CheckResult:
    problems: list[str] = []
    tracebacks: dict[str, int] = {}
    # Not judged: which nodes a leader declared silent (a real client cut off, or a node whose
    # heartbeats a fault delayed past TTL + grace), to explain unknown or lost allocs.
    missed: Counter[str] = Counter()
    for server, text in sorted(logs.items()):
        for line in text.splitlines():
            if DIVERGENCE.search(line):
                problems.append(f"{server}: {line.strip()[:300]}")
        tracebacks[server] = len(TRACEBACK.findall(text))
        missed.update(HEARTBEAT_MISSED.findall(text))
    return _result(
        "no_raft_defect_logged",
        "3",
        'no server logged pysyncobj\'s "state machine may have diverged", "failed _onTick" or an IndexError',
        problems,
        tracebacks=tracebacks,
        heartbeat_missed=dict(missed),
    )


# ---------------------------------------------------------------------------------------
# Every raft index, offline


@dataclass
class ReplayFigures:
    server: str
    entries: int = 0
    first_index: int = 0
    last_index: int = 0
    final_digest: str = ""
    # index -> (term, kind, data) of every journal record, for the log-matching check.
    records: dict[int, tuple[int, str, bytes]] = field(default_factory=dict)


def replay_data_dir(
    server: str, data_dir: Path, problems: list[str], *, check_every_index: bool
) -> ReplayFigures:
    """Replay one stopped server's log with the raft state tool; with ``check_every_index``
    check after every entry that no system job has more than count live allocs per group and
    node, and that every job summary equals a recount (invariants 1 and 2, docs/design.md)."""
    figures = ReplayFigures(server)
    last: Tables | None = None
    # One line per distinct violation: the first and last index it was seen at.
    seen: dict[str, list[int]] = {}
    try:
        with open_data_dir(str(data_dir)) as data:
            figures.records = {r.index: (r.term, r.kind, r.data) for r in data.records}
            for step in replay(data):
                index, term = step.record.index, step.record.term
                figures.entries += 1
                figures.first_index = figures.first_index or index
                figures.last_index = index
                last = step.tables
                if check_every_index:
                    for v in check_invariants(step.tables):
                        span = seen.setdefault(str(v), [index, index, 0, term])
                        span[1], span[2] = index, span[2] + 1
    except OfflineError as exc:
        problems.append(f"{server}: replay failed: {exc}")
    for text, (first, last_seen, count, term) in sorted(seen.items(), key=lambda kv: kv[1][0]):
        problems.append(f"{server} from index {first} (term {term}) to {last_seen}, {count} entries: {text}")
    if last is not None:
        figures.final_digest = state_digest(last)
    return figures


def journal_terms(data_dirs: Mapping[str, Path]) -> dict[int, int]:
    """index -> raft term of the committed entry, from the stopped servers' journals.

    Where journals differ at an index (a deposed leader's uncommitted tail), the higher term
    is the committed entry's: once (i, T) is committed every later leader holds it, so only
    leaders of earlier terms can have written something else at i."""
    terms: dict[int, int] = {}
    for path in data_dirs.values():
        try:
            with open_data_dir(str(path)) as data:
                for record in data.records:
                    terms[record.index] = max(record.term, terms.get(record.index, 0))
        except OfflineError:
            continue
    return terms


def _log_mismatches(reports: Sequence[ReplayFigures], upto: int | None) -> list[str]:
    """Raft's log matching, entry by entry: every two journals hold the same entry (term and
    bytes) at every index both hold, up to ``upto`` (the agreed applied index; beyond it, or
    when there is none, a deposed leader's uncommitted tail may legitimately differ, and
    mismatches are reported as such)."""
    out: list[str] = []
    reference = max(reports, key=lambda r: r.last_index)
    for other in reports:
        if other is reference:
            continue
        bad = [
            i
            for i, entry in sorted(other.records.items())
            if i in reference.records and reference.records[i] != entry and (upto is None or i <= upto)
        ]
        if bad:
            where = "" if upto is not None else " (no agreed applied index: possibly an uncommitted tail)"
            first = bad[0]
            out.append(
                f"{other.server}'s journal differs from {reference.server}'s at {len(bad)} indexes from "
                f"{first}{where}: term {other.records[first][0]} vs {reference.records[first][0]}"
            )
    return out


def check_replay(
    data_dirs: Mapping[str, Path], converged: tuple[str, int] | None, *, full_on: Sequence[str]
) -> CheckResult:
    """Invariants 1 and 2 (allocs per system node, summaries equal a recount; docs/design.md)
    after every raft index (replayed on the servers in ``full_on``),
    the journals equal entry by entry, and each log replayed to its end giving the digest
    the live servers agreed on."""
    problems: list[str] = []
    reports = [
        replay_data_dir(name, path, problems, check_every_index=name in full_on)
        for name, path in sorted(data_dirs.items())
    ]
    problems += _log_mismatches(reports, converged[1] if converged else None)
    if converged is not None:
        for report in reports:
            if report.last_index == converged[1] and report.final_digest != converged[0]:
                problems.append(
                    f"{report.server}'s log replayed to index {report.last_index} gives digest "
                    f"{report.final_digest[:12]}, the live servers agreed on {converged[0][:12]}"
                )
    return _result(
        "replay_every_index",
        "1,2,3",
        "each stopped server's log replayed with the raft state tool (from its last raft snapshot "
        "on): after every entry no system job has more than count live allocs per group and node "
        "and every job summary equals a recount, the journals hold the same entries, and "
        "the replayed end state equals the live digest",
        problems,
        servers={
            r.server: {"entries": r.entries, "first": r.first_index, "last": r.last_index} for r in reports
        },
        full_check_on=list(full_on),
    )


# ---------------------------------------------------------------------------------------
# The live checker's answers during the run


def check_live(samples: Sequence[Mapping[str, Any]], unavailable: str = "") -> CheckResult:
    problems = [
        f"t={s['t']:.1f}s {s['server']} index {s['index']}: {v}" for s in samples for v in s["violations"]
    ]
    figures: dict[str, Any] = {"samples": len(samples)}
    if unavailable:
        figures["note"] = unavailable
    return _result(
        "live_checker_clean",
        "1,2",
        "Operator.Invariants polled on every live server during the run reported no violation",
        problems,
        **figures,
    )


# ---------------------------------------------------------------------------------------
# Invariant 5: allocs kept across a client reconnect keep their IDs and processes
# (docs/design.md#invariant-5)


def _ended_deliberately(history: History, job_id: str, t0: float, t1: float) -> Op | None:
    """A write of the workload's that may have ended ``job_id``'s allocs between ``t0`` and
    ``t1``: acknowledged in the window, or with an unknown outcome invoked before its end
    (it may land at any time)."""
    for op in history:
        if op.key != job_id or op.kind not in ENDS_ALLOCS or op.t_invoke > t1:
            continue
        if not op.ok or op.t_complete >= t0:
            return op
    return None


def _window_label(window: Window) -> str:
    if window.kind == "cut":
        at = window.t_cut if window.t_cut is not None else window.t_before
        return f"cut of {window.client} at t={at:.1f}s"
    return "the whole run"


def _kept_problem(before: TaskSeen, after: Sequence[TaskSeen]) -> str:
    """Why ``before`` (running) did not come through unchanged, or ""."""
    what = f"alloc {before.alloc_id[:8]} of {before.job_id} on {before.client}"
    now = next((t for t in after if t.alloc_id == before.alloc_id), None)
    others = [
        t.alloc_id[:8]
        for t in after
        if t.alloc_id != before.alloc_id and t.job_id == before.job_id and t.desired_status == "run"
    ]
    if now is None or now.desired_status != "run":
        state = (
            "gone" if now is None else f"stopped by the servers ({now.desired_status}/{now.client_status})"
        )
        return f"{what} is {state}" + (f", replaced by {', '.join(others)}" if others else "")
    if others:
        return f"{what} has company: {', '.join(others)} placed beside it for the same job"
    if now.client_status != "running":
        return f"{what} is {now.client_status} after the reconnect, not running"
    if (now.pid, now.create_time) != (before.pid, before.create_time):
        return (
            f"{what}: its task process changed from pid {before.pid} (started {before.create_time:.2f}) "
            f"to pid {now.pid} (started {now.create_time:.2f})"
        )
    if not now.alive:
        return f"{what}: its task process {now.pid} is not running any more"
    if (now.restarts, now.started_at_ns) != (before.restarts, before.started_at_ns):
        return (
            f"{what}: restarted (restarts {before.restarts} -> {now.restarts}, "
            f"started_at {before.started_at_ns} -> {now.started_at_ns})"
        )
    if now.server_pid != now.pid:
        return f"{what}: the servers report pid {now.server_pid}, the agent runs pid {now.pid}"
    return ""


def check_allocs_kept(windows: Sequence[Window], history: History) -> CheckResult:
    """Every alloc that ran on a real client before a cut (or at the start of the run) and
    was not deliberately ended by the workload meanwhile runs after the reconnect (at the
    end) with the same alloc ID, the same task process (pid and start time, per the agent's
    record and the OS) and no restart."""
    problems: list[str] = []
    checked = kept = excluded = 0
    for window in windows:
        label = _window_label(window)
        problems += [f"{label}: {p}" for p in window.problems]
        candidates = [t for t in window.before if t.runs]
        if not candidates and not window.problems:
            problems.append(f"{label}: no alloc ran before it: nothing was checked")
        for before in candidates:
            ended = _ended_deliberately(history, before.job_id, window.t_before, window.t_after)
            if ended is not None:
                excluded += 1
                continue
            checked += 1
            problem = _kept_problem(before, window.after)
            if problem:
                problems.append(f"{label}: {problem}")
            else:
                kept += 1
    cuts = [w for w in windows if w.kind == "cut"]
    return _result(
        "allocs_kept_across_reconnect",
        "5",
        "every raw_exec alloc running on a real client agent before a cut of its connections (and "
        "at the start of the run) runs after the reconnect (and at the end) with the same alloc ID, "
        "the same pid and process start time, and no restart, unless the workload stopped it",
        problems,
        cuts=len(cuts),
        allocs_checked=checked,
        allocs_kept=kept,
        excluded_as_stopped=excluded,
        disconnected_after_s=[
            round(w.t_disconnected - w.t_cut, 2)
            for w in cuts
            if w.t_disconnected is not None and w.t_cut is not None
        ],
        reconnected_after_s=[
            round(w.t_reconnected - w.t_heal, 2)
            for w in cuts
            if w.t_reconnected is not None and w.t_heal is not None
        ],
    )


def check_client_logs(logs: Mapping[str, str]) -> CheckResult:
    problems = [
        f"{name}: {line.strip()[:300]}"
        for name, text in sorted(logs.items())
        for line in text.splitlines()
        if CLIENT_DEFECT.search(line)
    ]
    return _result(
        "client_agents_clean",
        "",
        "no real client agent logged a crashed loop or task runner, or a traceback",
        problems,
        clients=sorted(logs),
    )
