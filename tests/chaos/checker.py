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
ones; and it must never be the effect of anything that was not requested at all, nor of
a ``fail`` operation (a definite error: never applied, tests/chaos/history.py).

The recounts are the tests' own: job summaries by ``tests/fixtures/mock.summary_problems``,
system allocs per node by ``system_alloc_problems`` here; the product's live checker
(``drover.server.invariants``) is asked too, and any violation either reports fails.

Every check here has a test in tests/chaos/test_checker.py that feeds it the one
violation it exists to catch and requires it to fail.
"""

from __future__ import annotations

import hashlib
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
from drover.server.raft.journal import JournalRecord
from drover.server.raft_tools import OfflineError, RaftData, open_data_dir, replay
from drover.server.snapshot import from_snapshot, state_digest
from drover.server.state_store import Tables
from tests.chaos.clients import TaskSeen, Window
from tests.chaos.disagreement import Disagreement
from tests.chaos.history import History, Op
from tests.chaos.workload import (
    CLIENT_RANK,
    DISPATCH_PARENT,
    PERIODIC_PARENT,
    READ_KIND,
    SEQ_KEY,
)
from tests.fixtures import mock

MAX_DETAILS: Final = 20
JOB_KINDS: Final = frozenset({"register", "update-inplace", "update-destructive", "scale", "stop", "purge"})
REGISTER_KINDS: Final = frozenset({"register", "update-inplace", "update-destructive", "scale"})
DIVERGENCE: Final = re.compile(r"may have diverged|failed _onTick|IndexError")
# The plan applier's log lines that bound a rejection count: a new leader's applier starts
# a new tracker, and the tracker forgets a node once it has marked it.
PLAN_EVENT: Final = re.compile(
    r"^(?P<ts>\S+Z) .*?(?:(?P<leader>leader\.established)"
    r"|plan\.node_(?P<kind>rejected|marked_ineligible)\b.*?\bnode_id=(?P<node>\S+))"
)
HEARTBEAT_MISSED: Final = re.compile(r"leader\.heartbeat_missed\s+node_id=(\S+)")
# Writes that deliberately end or replace a job's allocs: their allocs need not be kept.
ENDS_ALLOCS: Final = frozenset({"stop", "purge", "update-destructive"})
CLIENT_DEFECT: Final = re.compile(r"client\.loop_crashed|task\.runner_crashed")
TRACEBACK_HEADER: Final = re.compile(r"^(?:  \+ Exception Group )?Traceback \(most recent call last\):")
CHAINED: Final = ("During handling of the above exception", "The above exception was the direct cause")
# A log line of its own (not a traceback's): a timestamped event, or the threading module's
# header for an exception that escaped a thread.
LOG_LINE: Final = re.compile(r"^(?:\d{4}-\d\d-\d\dT\S+ |Exception in thread )")
SYSTEM_TYPES: Final = frozenset({"system", "sysbatch"})
LIVE_CLIENT_STATUSES_END: Final = frozenset({"complete", "failed", "lost"})


@dataclass(frozen=True, slots=True)
class AllowedTraceback:
    """A traceback a run may log without failing: what it looks like (searched in its log
    line and its exception line) and why it is not a defect."""

    pattern: re.Pattern[str]
    reason: str


# Tracebacks that are not defects, each with the reason. Empty: every traceback found in a
# server or client log so far was a defect to fix, not to excuse.
ALLOWED_TRACEBACKS: Final[tuple[AllowedTraceback, ...]] = ()


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
    """(the last acknowledged op, every op whose outcome is unknown); definite failures
    are neither: they never happened."""
    acked = [op for op in ops if op.ok]
    return (acked[-1] if acked else None), [op for op in ops if op.unknown]


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
    unknown = sum(op.unknown for op in dispatches)
    if not acked <= children <= acked + unknown:
        problems.append(
            f"{DISPATCH_PARENT!r} has {children} children; {acked} dispatches were acknowledged"
            f" and {unknown} more may have been applied (of {len(dispatches)} attempted)"
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


def check_stale_reads(history: History) -> CheckResult:
    """A default read sees every write acknowledged before it was invoked (reads a deposed
    leader cannot answer: server/raft/read_confirm.py); a stale read may lag and is not held
    to it.

    Per job (its writes are sequential, tests/chaos/history.py): the newest acknowledged
    write completed before the read began must show. After a register, update or scale
    the job is there with ``modify_index`` at least the write's index; after a stop it is
    there and stopped, at the stop's index or, when an earlier stop had already stopped it,
    at least at the newest register, update or scale before the read; after a purge
    it is absent or re-registered later (a higher ``modify_index``). A job may be absent
    after a non-purge write only if a purge whose outcome is unknown or acknowledged was
    invoked before the read completed. Zero default reads judged is a failure: a check
    that saw nothing has shown nothing."""
    writes = _by_key(history, JOB_KINDS)
    problems: list[str] = []
    judged = stale = 0
    for read in history:
        if read.kind != READ_KIND or not read.ok:
            continue
        if read.args.get("stale"):
            stale += 1
            continue
        before = [w for w in writes.get(read.key, []) if w.ok and w.t_complete < read.t_invoke]
        if not before:
            continue
        judged += 1
        last = max(before, key=lambda w: w.index)
        absent = bool(read.result.get("absent"))
        seen = int(read.result.get("modify_index", 0))
        if last.kind == "purge":
            if not absent and seen <= last.index:
                problems.append(
                    f"read of {read.key!r} at t={read.t_invoke:.3f}s saw modify_index {seen}, but a purge was "
                    f"acknowledged at index {last.index} (t={last.t_complete:.3f}s)"
                )
            continue
        if absent:
            purged = any(
                w.kind == "purge" and not w.failed and w.t_invoke < read.t_complete
                for w in writes.get(read.key, [])
                if w.index > last.index or w.unknown
            )
            if not purged:
                problems.append(
                    f"read of {read.key!r} at t={read.t_invoke:.3f}s found no job, but {last.kind} was "
                    f"acknowledged at index {last.index} (t={last.t_complete:.3f}s) and no purge followed"
                )
        elif last.kind == "stop" and seen < last.index:
            # Stopping a stopped job changes nothing (server/fsm.py apply_job_deregister):
            # after a stop whose job an earlier stop had already stopped (one whose answer
            # was lost, so the worker stopped it again) the job keeps that first stop's
            # modify_index. Allowed only with such an earlier stop (not known to have
            # failed, invoked since the last register, update or scale), the job shown
            # stopped, and not older than that last register, update or scale.
            moved = [w for w in before if w.kind not in ("stop", "purge")]
            since = max((w.t_invoke for w in moved), default=0.0)
            earlier_stop = any(
                w.kind == "stop" and not w.failed and since <= w.t_invoke < last.t_invoke
                for w in writes.get(read.key, [])
            )
            floor = max((w.index for w in moved), default=0)
            if not (earlier_stop and read.result.get("stop") and seen >= floor):
                problems.append(
                    f"read of {read.key!r} at t={read.t_invoke:.3f}s saw modify_index {seen} "
                    f"(stop={bool(read.result.get('stop'))}), but a stop was acknowledged at index "
                    f"{last.index} (t={last.t_complete:.3f}s)"
                )
        elif seen < last.index:
            problems.append(
                f"read of {read.key!r} at t={read.t_invoke:.3f}s saw modify_index {seen}, older than the "
                f"{last.kind} acknowledged at index {last.index} (t={last.t_complete:.3f}s)"
            )
    if not judged:
        problems.append("no default read followed an acknowledged write: nothing was checked")
    return _result(
        "default_reads_not_stale",
        "4",
        "a default (non-stale) read sees every write acknowledged before it was invoked",
        problems,
        judged=judged,
        stale_reads=stale,
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
        servers=sorted(per_server),
    )


def system_alloc_problems(tables: Tables) -> list[str]:
    """Invariant 1 recounted by the tests (docs/design.md#invariant-1): one scan of every
    alloc, each joined with its job, never the product's indexes or its checker. Live means
    desired to run and not complete, failed or lost on its client; a system job's group
    allows one per node, a sysbatch group ``count`` (at least one)."""
    live: Counter[tuple[tuple[str, str], str, str]] = Counter()
    for alloc in tables.allocs.values():
        if alloc.desired_status != "run" or alloc.client_status in LIVE_CLIENT_STATUSES_END:
            continue
        job = tables.jobs.get((alloc.namespace, alloc.job_id))
        if job is None or job.type not in SYSTEM_TYPES:
            continue
        live[((alloc.namespace, alloc.job_id), alloc.task_group, alloc.node_id)] += 1
    problems = []
    for (key, group, node_id), n in sorted(live.items()):
        job = tables.jobs[key]
        count = next((g.count for g in job.groups if g.name == group), 1)
        allowed = 1 if job.type == "system" else max(1, count)
        if n > allowed:
            problems.append(
                f"{job.type} job {key[1]!r} ({key[0]}) group {group!r} has {n} live allocs on node "
                f"{node_id!r} (at most {allowed})"
            )
    return problems


def _product_system_alloc_violations(tables: Tables) -> list[str]:
    return [str(v) for v in check_invariants(tables) if v.invariant == INVARIANT_SYSTEM_ALLOCS]


def check_system_allocs(per_server: Mapping[str, Tables]) -> CheckResult:
    """The tests' recount, and the product's live checker as a second opinion: a violation
    either finds fails (so does a disagreement between them)."""
    problems = []
    for name, tables in sorted(per_server.items()):
        problems += [f"{name}: {p}" for p in system_alloc_problems(tables)]
        problems += [f"{name}: the live checker says {p}" for p in _product_system_alloc_violations(tables)]
    return _result(
        "system_allocs_at_most_count",
        "1",
        "on every server, at most count live desired-running allocs per (system/sysbatch job, group, "
        "node), by the tests' own recount (system_alloc_problems) and by the live checker",
        problems,
        servers=sorted(per_server),
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


def check_plan_rejections(
    logs: Mapping[str, str],
    threshold: int,
    window_s: float,
    disagreements: Sequence[Disagreement] | None = None,
) -> CheckResult:
    """The rejection tracker bounds every disagreement (docs/design.md#invariant-6).

    Per server and node, at most ``threshold + 1`` ``plan.node_rejected`` lines in any
    ``window_s``, counted the way the tracker counts: afresh from each
    ``leader.established`` (a new leader's applier has a new tracker) and after each
    ``plan.node_marked_ineligible`` of that node (the tracker forgets a node it marked; only
    an operator makes it eligible again). The +1 is the rejection that trips it.

    ``disagreements`` are those the nemesis provoked (None: not enabled in this run). Each
    must have been refused at least once and ended with the node marked ineligible, so the
    bound was exercised, not just never approached; an enabled run that provoked none fails.
    """
    problems: list[str] = []
    per_node: Counter[str] = Counter()
    marks: Counter[str] = Counter()
    worst: Counter[str] = Counter()
    stamps_by_node: dict[str, list[float]] = defaultdict(list)
    for server, text in sorted(logs.items()):
        counting: dict[str, list[float]] = {}
        reported: set[str] = set()
        for line in text.splitlines():
            m = PLAN_EVENT.match(line)
            if m is None:
                continue
            if m["leader"]:
                counting.clear()
                continue
            node_id, ts = m["node"], _ts(m["ts"])
            if m["kind"] == "marked_ineligible":
                marks[node_id] += 1
                counting.pop(node_id, None)
                continue
            per_node[node_id] += 1
            stamps_by_node[node_id].append(ts)
            window = [t for t in counting.get(node_id, []) if ts - t <= window_s] + [ts]
            counting[node_id] = window
            worst[node_id] = max(worst[node_id], len(window))
            if len(window) > threshold + 1 and node_id not in reported:
                reported.add(node_id)
                problems.append(
                    f"{server} rejected plans for node {node_id!r} {len(window)} times within {window_s:g}s "
                    "without marking it ineligible"
                )
    provoked = []
    for d in disagreements or ():
        refused = sum(d.wall_start - 1.0 <= t <= d.wall_end + 5.0 for t in stamps_by_node.get(d.node_id, []))
        provoked.append({**d.to_dict(), "rejections": refused})
        label = f"disagreement about {d.node_id} at t={d.t_start:.1f}s"
        problems += [f"{label}: {p}" for p in d.problems]
        if not refused:
            problems.append(f"{label}: no plan was rejected for it: the bound was not exercised")
        if d.t_marked is None and not d.problems:
            problems.append(f"{label}: the node was never marked ineligible")
    if disagreements is not None and not disagreements:
        problems.append("disagreements were enabled but none was provoked: the bound was not exercised")
    return _result(
        "plan_rejections_bounded",
        "6",
        f"per server, leadership and node, at most threshold+1 ({threshold + 1}) plan.node_rejected in any "
        f"{window_s:g}s before the node is marked ineligible; every provoked disagreement refused and ended "
        "by a mark",
        problems,
        rejections_per_node=dict(per_node),
        marked_ineligible=dict(marks),
        most_in_a_window=dict(worst),
        disagreements=provoked if disagreements is not None else "not enabled",
    )


def check_logs(logs: Mapping[str, str]) -> CheckResult:
    problems: list[str] = []
    # Not judged: which nodes a leader declared silent (a real client cut off, or a node whose
    # heartbeats a fault delayed past TTL + grace), to explain unknown or lost allocs.
    missed: Counter[str] = Counter()
    for server, text in sorted(logs.items()):
        for line in text.splitlines():
            if DIVERGENCE.search(line):
                problems.append(f"{server}: {line.strip()[:300]}")
        missed.update(HEARTBEAT_MISSED.findall(text))
    return _result(
        "no_raft_defect_logged",
        "3",
        'no server logged pysyncobj\'s "state machine may have diverged", "failed _onTick" or an IndexError',
        problems,
        servers=sorted(logs),
        heartbeat_missed=dict(missed),
    )


@dataclass(frozen=True, slots=True)
class TracebackSeen:
    process: str
    event: str  # the log line it belongs to ("" when none came before it)
    exception: str  # its last line: what was raised

    def describe(self) -> str:
        return f"{self.process}: {self.exception or '?'} (after: {self.event[:200] or '-'})"


def find_tracebacks(process: str, text: str) -> list[TracebackSeen]:
    """Every traceback block in a log, with the log line before it and its final exception
    line (a chained traceback is one block: its last exception is the one that escaped)."""
    lines = text.splitlines()
    out: list[TracebackSeen] = []
    event = ""
    i = 0
    while i < len(lines):
        if not TRACEBACK_HEADER.match(lines[i]):
            if LOG_LINE.match(lines[i]):
                event = lines[i].strip()
            i += 1
            continue
        exception = ""
        j = i + 1
        while j < len(lines):
            line = lines[j]
            j += 1
            if not line.strip() or line.startswith((" ", "\t")) or TRACEBACK_HEADER.match(line):
                continue
            if line.startswith(CHAINED):
                continue
            exception = line.strip()
            following = next((rest for rest in lines[j:] if rest.strip()), "")
            if not following.startswith(CHAINED):
                break
        out.append(TracebackSeen(process, event, exception))
        i = j
    return out


def check_tracebacks(
    server_logs: Mapping[str, str],
    client_logs: Mapping[str, str],
    allowed: Sequence[AllowedTraceback] = ALLOWED_TRACEBACKS,
) -> CheckResult:
    """Any traceback in a server or client agent log is a defect, unless ``allowed`` names
    it with a reason."""
    problems: list[str] = []
    excused: Counter[str] = Counter()
    seen: Counter[str] = Counter()
    for process, text in [*sorted(server_logs.items()), *sorted(client_logs.items())]:
        for tb in find_tracebacks(process, text):
            seen[process] += 1
            reason = next(
                (a.reason for a in allowed if a.pattern.search(f"{tb.event}\n{tb.exception}")), None
            )
            if reason is None:
                problems.append(tb.describe())
            else:
                excused[reason] += 1
    return _result(
        "no_unexplained_tracebacks",
        "",
        "no server or client agent logged a traceback, except those allowed with a reason "
        "(tests/chaos/checker.py: ALLOWED_TRACEBACKS)",
        problems,
        tracebacks=dict(seen),
        allowed=dict(excused),
        logs_read=[*sorted(server_logs), *sorted(client_logs)],
    )


# ---------------------------------------------------------------------------------------
# Every raft index, offline


def state_problems(tables: Tables) -> list[str]:
    """Every state invariant broken in ``tables``: system allocs per node (1) and job
    summaries (2) by the tests' recounts, and whatever the product's live checker reports."""
    return [
        *system_alloc_problems(tables),
        *mock.summary_problems(tables),
        *(f"the live checker says {v}" for v in check_invariants(tables)),
    ]


@dataclass
class ReplayFigures:
    server: str
    entries: int = 0  # journal entries replayed through the FSM
    first_index: int = 0  # the first of them
    last_index: int = 0
    journal_first: int = 0  # the first entry the journal retains
    snapshot_index: int = 0  # its raft snapshot's index (0: none)
    start: str = ""  # where the replay started: "snapshot" or "empty"
    # States whose invariants were computed here, and states reached from the same start by
    # the same entries as one computed on an earlier server (the same state: judged once).
    checked: int = 0
    shared: int = 0
    final_digest: str = ""
    # index -> (term, kind, data) of every journal record, for the log-matching check.
    records: dict[int, tuple[int, str, bytes]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "entries": self.entries,
            "first": self.first_index,
            "last": self.last_index,
            "journal_first": self.journal_first,
            "snapshot_index": self.snapshot_index,
            "start": self.start,
            "states_checked": self.checked,
            "states_shared": self.shared,
        }


def _chain(previous: bytes, record: JournalRecord) -> bytes:
    """The provenance of the state after ``record``: the state it was applied to, and the
    entry's bytes. Equal provenance is an equal state (the FSM is deterministic, and every
    replay runs here, in one process)."""
    h = hashlib.sha256(previous)
    h.update(f"{record.index}:{record.term}:{record.kind}:".encode())
    h.update(record.data)
    return h.digest()


def _seed(what: str, index: int = 0, digest: str = "") -> bytes:
    return hashlib.sha256(f"{what}:{index}:{digest}".encode()).digest()


@dataclass
class _Replayer:
    """Replays stopped servers' journals one after another, judging every state once."""

    problems: list[str]
    # Raft snapshot indexes of the servers (index -> terms of their last entry): states a
    # replay passes there are digested, so a server starting from that snapshot can be
    # compared with them, and share their verdicts when equal.
    snapshot_points: dict[int, set[int]]
    verdicts: dict[bytes, list[str]] = field(default_factory=dict)
    # index -> (server, term, digest, provenance) of states replayed at a snapshot point.
    at_points: dict[int, list[tuple[str, int, str, bytes]]] = field(default_factory=lambda: defaultdict(list))

    def run(self, server: str, data: RaftData) -> ReplayFigures:
        figures = ReplayFigures(server, journal_first=data.records[0].index if data.records else 0)
        figures.records = {r.index: (r.term, r.kind, r.data) for r in data.records}
        # One line per distinct violation: the first and last index, how many, the first term.
        seen: dict[str, list[int]] = {}

        def judge(key: bytes, tables: Tables, index: int, term: int) -> None:
            found = self.verdicts.get(key)
            if found is None:
                found = self.verdicts[key] = state_problems(tables)
                figures.checked += 1
            else:
                figures.shared += 1
            for text in found:
                span = seen.setdefault(text, [index, index, 0, term])
                span[1], span[2] = index, span[2] + 1

        snap = data.snapshot
        # A journal that still starts at the log's first entry is replayed from nothing, so
        # every entry it holds is checked; its snapshot is then compared with the replay.
        from_empty = snap is None or (bool(data.records) and data.records[0].index == 1)
        key = _seed("empty")
        snap_at: tuple[int, int, str] | None = None
        if snap is not None:
            snap_tables = from_snapshot(snap.state)
            index, term = snap.state.index, snap.last_entry.term
            digest = state_digest(snap_tables)
            snap_at = (index, term, digest)
            figures.snapshot_index = index
            snap_key = _seed("snapshot", index, digest)
            for other, other_term, other_digest, other_key in self.at_points.get(index, []):
                if other_term != term:
                    continue
                if other_digest != digest:
                    self.problems.append(
                        f"{server}'s raft snapshot at index {index} (term {term}) hashes to {digest[:12]}, "
                        f"{other}'s state replayed there to {other_digest[:12]}"
                    )
                else:
                    snap_key = other_key  # the same state, already judged there
            judge(snap_key, snap_tables, index, term)
            if not from_empty:
                key = snap_key
                self.at_points[index].append((server, term, digest, key))
        figures.start = "empty" if from_empty else "snapshot"
        source = RaftData(data.data_dir, None, data.records) if from_empty else data
        last: Tables | None = None
        try:
            for step in replay(source):
                record = step.record
                key = _chain(key, record)
                figures.entries += 1
                figures.first_index = figures.first_index or record.index
                figures.last_index = record.index
                last = step.tables
                judge(key, step.tables, record.index, record.term)
                if record.index in self.snapshot_points:
                    digest = state_digest(step.tables)
                    self.at_points[record.index].append((server, record.term, digest, key))
                    own_snapshot = snap_at is not None and snap_at[:2] == (record.index, record.term)
                    if own_snapshot and snap_at is not None and digest != snap_at[2]:
                        self.problems.append(
                            f"{server}'s raft snapshot at index {record.index} hashes to "
                            f"{snap_at[2][:12]}, its own journal replayed there to {digest[:12]}"
                        )
        except OfflineError as exc:
            self.problems.append(f"{server}: replay failed: {exc}")
        for text, (first, last_seen, count, term) in sorted(seen.items(), key=lambda kv: kv[1][0]):
            self.problems.append(
                f"{server} from index {first} (term {term}) to {last_seen}, {count} states: {text}"
            )
        if last is not None:
            figures.final_digest = state_digest(last)
        elif snap_at is not None:
            figures.last_index, _term, figures.final_digest = snap_at
        return figures


def _load(data_dirs: Mapping[str, Path], problems: list[str]) -> dict[str, RaftData]:
    loaded: dict[str, RaftData] = {}
    for name, path in sorted(data_dirs.items()):
        try:
            with open_data_dir(str(path)) as data:
                loaded[name] = data
        except OfflineError as exc:
            problems.append(f"{name}: replay failed: {exc}")
    return loaded


def _start_index(data: RaftData) -> int:
    if data.snapshot is None or (data.records and data.records[0].index == 1):
        return 0
    return data.snapshot.state.index


def replay_servers(data_dirs: Mapping[str, Path], problems: list[str]) -> list[ReplayFigures]:
    """Every stopped server's journal replayed entry by entry with the raft state tool's
    code, from its first retained entry (its raft snapshot, when the journal no longer
    starts at the log's beginning), with every state invariant checked on the snapshot's
    state and after every entry. Servers are replayed earliest start first, so a server
    starting from a snapshot can be compared with (and share verdicts with) a replay that
    passed that index."""
    loaded = _load(data_dirs, problems)
    points: dict[int, set[int]] = defaultdict(set)
    for data in loaded.values():
        if data.snapshot is not None:
            points[data.snapshot.state.index].add(data.snapshot.last_entry.term)
    replayer = _Replayer(problems, dict(points))
    order = sorted(loaded, key=lambda name: (_start_index(loaded[name]), name))
    return [replayer.run(name, loaded[name]) for name in order]


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
    if not reports:
        return out
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


def check_replay(data_dirs: Mapping[str, Path], converged: tuple[str, int] | None) -> CheckResult:
    """Invariants 1 and 2 (allocs per system node, summaries equal a recount; docs/design.md)
    on every server's raft snapshot and after every entry of its journal; the journals equal
    entry by entry; and each log replayed to its end giving the digest the live servers
    agreed on."""
    problems: list[str] = []
    reports = replay_servers(data_dirs, problems)
    problems += _log_mismatches(reports, converged[1] if converged else None)
    if converged is not None:
        for report in reports:
            if report.last_index == converged[1] and report.final_digest != converged[0]:
                problems.append(
                    f"{report.server}'s log replayed to index {report.last_index} gives digest "
                    f"{report.final_digest[:12]}, the live servers agreed on {converged[0][:12]}"
                )
    missing = sorted(set(data_dirs) - {r.server for r in reports})
    empty = [r.server for r in reports if not r.entries and not r.snapshot_index]
    if empty:
        problems.append(f"nothing replayed for {', '.join(empty)}: no journal entry, no snapshot")
    return _result(
        "replay_every_index",
        "1,2,3",
        "every stopped server's log replayed with the raft state tool, from its first retained entry "
        "(its raft snapshot, whose own state is checked and compared, when the journal was compacted): "
        "after every entry no system job has more than count live allocs per group and node, every "
        "job summary equals a recount and the live checker agrees; the journals hold the same "
        "entries; the replayed end state equals the live digest",
        problems,
        servers={r.server: r.to_dict() for r in sorted(reports, key=lambda r: r.server)},
        not_replayed=missing,
    )


# ---------------------------------------------------------------------------------------
# The live checker's answers during the run


def check_live(
    samples: Sequence[Mapping[str, Any]], unavailable: str = "", servers: Sequence[str] = ()
) -> CheckResult:
    """What ``Operator.Invariants`` said on the live servers during the run. A check that
    never ran proves nothing: no sample at all, a server never sampled, or servers that do
    not implement the RPC fail it."""
    problems = [
        f"t={s['t']:.1f}s {s['server']} index {s['index']}: {v}" for s in samples for v in s["violations"]
    ]
    if unavailable:
        problems.append(f"the live checker could not run: {unavailable}")
    if not samples:
        problems.append("no server answered Operator.Invariants during the run: nothing was checked")
    per_server = Counter(str(s["server"]) for s in samples)
    never = [name for name in servers if not per_server[name]]
    if samples and never:
        problems.append(f"never sampled: {', '.join(never)}")
    return _result(
        "live_checker_clean",
        "1,2",
        "Operator.Invariants polled on every live server during the run answered on every server "
        "and reported no violation",
        problems,
        samples=len(samples),
        samples_per_server=dict(sorted(per_server.items())),
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
    """Crashed loops and task runners; their tracebacks, and any other, are
    ``check_tracebacks``'s."""
    problems = [
        f"{name}: {line.strip()[:300]}"
        for name, text in sorted(logs.items())
        for line in text.splitlines()
        if CLIENT_DEFECT.search(line)
    ]
    if not logs:
        problems.append("no client agent log was read")
    return _result(
        "client_agents_clean",
        "",
        "no real client agent logged a crashed loop or task runner (tracebacks: no_unexplained_tracebacks)",
        problems,
        clients=sorted(logs),
    )


def check_workload(errors: Sequence[str]) -> CheckResult:
    return _result(
        "workload_ran_clean",
        "",
        "the workload threads raised nothing and stopped when told",
        list(errors),
    )
