"""Random raft logs: the FSM is deterministic, restorable, and summaries equal a recount at every index.

The logs are "valid-ish": every entry is one a leader could propose, but in any order and
over a small, fixed ID space (3 jobs, 3 nodes, 6 allocs, 4 evals), with the odd corrupt
entry. IDs are chosen from fixed lists, never generated, so a shrunk counterexample reads
like a story: ``register(web count=2) / plan(+alloc-1@node-2) / purge(web) / ...``.

Each allocation and evaluation belongs to one fixed job (an ID names one object for its
whole life, as leader-minted UUIDs do); nodes, statuses and groups vary freely.
"""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from drover.scheduler.structs import (
    ALLOC_CLIENT_STATUSES,
    ALLOC_DESIRED_EVICT,
    ALLOC_DESIRED_RUN,
    ALLOC_DESIRED_STOP,
    EVAL_STATUS_BLOCKED,
    EVAL_STATUS_CANCELED,
    EVAL_STATUS_COMPLETE,
    EVAL_STATUS_FAILED,
    EVAL_STATUS_PENDING,
    JOB_STATUS_DEAD,
    JOB_STATUS_PENDING,
    JOB_STATUS_RUNNING,
    NODE_ELIGIBLE,
    NODE_INELIGIBLE,
    NODE_STATUSES,
    Allocation,
    AllocStop,
    DrainStrategy,
    Evaluation,
    Job,
    NodeEvent,
    RejectionTrackerConfig,
    SchedulerConfig,
)
from drover.server.fsm import FSM
from drover.server.snapshot import from_snapshot, state_digest, to_snapshot
from drover.server.state_store import StateStore, Tables
from drover.v1 import raft_pb2
from tests.fixtures import mock

ET = raft_pb2.EntryType
REPO = Path(__file__).resolve().parents[2]

# ---------------------------------------------------------------------------------------
# The fixed world

WEB = mock.job(id="web")
CRON = mock.periodic_job(id="cron")
CHILD = mock.periodic_child(CRON, mock.NOW)  # "cron/periodic-1700000000"
JOBS: dict[str, Job] = {"web": WEB, "cron": CRON, "child": CHILD}
NODE_IDS = ("node-1", "node-2", "node-3")
# alloc -> the job it belongs to
ALLOC_JOBS = {
    "alloc-1": "web",
    "alloc-2": "web",
    "alloc-3": "web",
    "alloc-4": "child",
    "alloc-5": "child",
    "alloc-6": "cron",
}
EVAL_JOBS = {"eval-1": "web", "eval-2": "web", "eval-3": "child", "eval-4": "cron"}
EVAL_STATUSES = (
    EVAL_STATUS_PENDING,
    EVAL_STATUS_BLOCKED,
    EVAL_STATUS_COMPLETE,
    EVAL_STATUS_FAILED,
    EVAL_STATUS_CANCELED,
)
JOB_STATUSES = ("", JOB_STATUS_PENDING, JOB_STATUS_RUNNING, JOB_STATUS_DEAD)


class Entry:
    """One log entry: what it says (all hypothesis shows of it) and its bytes."""

    __slots__ = ("data", "desc")

    def __init__(self, desc: str, data: bytes) -> None:
        self.desc = desc
        self.data = data

    def __repr__(self) -> str:
        return self.desc


# ---------------------------------------------------------------------------------------
# Strategies. Most entry kinds are a precomputed list of every variant over the fixed
# world, sampled with one draw: few choices per entry keep generation fast and let the
# shrinker cut a 60-entry log down in seconds, to variants listed simplest first.

alloc_ids = st.sampled_from(sorted(ALLOC_JOBS))
eval_ids = st.sampled_from(sorted(EVAL_JOBS))
node_ids = st.sampled_from(NODE_IDS)


def _eval(eval_id: str, status: str) -> Evaluation:
    queued = {"web": 2, "other": 1} if status == EVAL_STATUS_COMPLETE else {}
    return mock.eval_for(JOBS[EVAL_JOBS[eval_id]], id=eval_id, status=status, queued_allocations=queued)


EVAL_LISTS: list[list[Evaluation]] = [
    [],
    *([_eval(e, status)] for status in EVAL_STATUSES for e in sorted(EVAL_JOBS)),
    [_eval("eval-1", EVAL_STATUS_COMPLETE), _eval("eval-3", EVAL_STATUS_FAILED)],
    [_eval("eval-2", EVAL_STATUS_BLOCKED), _eval("eval-4", EVAL_STATUS_CANCELED)],
]
eval_lists = st.sampled_from(EVAL_LISTS)


def _evals_desc(evs: Sequence[Evaluation]) -> str:
    return "".join(f" +{e.id}:{e.status}" for e in evs)


def _register(name: str, count: int, priority: int, status: str, stop: bool, with_eval: bool) -> Entry:
    job = JOBS[name]
    # ``status`` is what a (new) leader claims for the job: docs/field-reports.md#field-report-2.
    job = replace(
        job, groups=(replace(job.groups[0], count=count),), priority=priority, status=status, stop=stop
    )
    eval_id = next(e for e, j in EVAL_JOBS.items() if j == name)
    ev = mock.eval_for(job, id=eval_id) if with_eval else None
    return Entry(
        f"register({job.id} count={count} prio={priority} status={status!r} stop={stop}"
        + (f" +{eval_id})" if ev else ")"),
        mock.register_job_entry(job, ev),
    )


def _deregister(name: str, purge: bool, with_eval: bool) -> Entry:
    job = JOBS[name]
    eval_id = next(e for e, j in EVAL_JOBS.items() if j == name)
    ev = mock.eval_for(job, id=eval_id, triggered_by="job-deregister") if with_eval else None
    return Entry(
        f"{'purge' if purge else 'stop'}({job.id}" + (f" +{eval_id})" if ev else ")"),
        mock.deregister_entry(job.id, purge=purge, eval=ev),
    )


def _node_register(node_id: str, status: str, eligibility: str, evs: list[Evaluation]) -> Entry:
    node = mock.node(id=node_id, status=status, scheduling_eligibility=eligibility)
    return Entry(
        f"node-register({node_id} {status} {eligibility}{_evals_desc(evs)})",
        mock.register_node_entry(node, evs),
    )


def _node_status(node_id: str, status: str, evs: list[Evaluation]) -> Entry:
    at = mock.NOW + NODE_STATUSES.index(status) * mock.SECOND
    event = NodeEvent(message=f"Node status changed to {status}", subsystem="Cluster", timestamp_ns=at)
    return Entry(
        f"node-status({node_id} {status}{_evals_desc(evs)})",
        mock.node_status_entry(node_id, status, updated_at_ns=at, event=event, evals=evs),
    )


def _drain(node_id: str, mode: str) -> Entry:
    strategy = DrainStrategy(deadline_ns=mock.HOUR, started_at_ns=mock.NOW) if mode == "on" else None
    return Entry(
        f"drain({node_id} {mode})",
        mock.drain_entry(
            node_id, strategy, mark_eligible=mode == "off+eligible", event=NodeEvent(message="drain")
        ),
    )


def _client(alloc_id: str, status: str, with_task_states: bool, evs: list[Evaluation]) -> Entry:
    task_states = {"web": mock.running_task_state()} if with_task_states else None
    at = mock.NOW + len(status) * mock.SECOND
    return Entry(
        f"client({alloc_id} {status or '='}{' +task-states' if with_task_states else ''}{_evals_desc(evs)})",
        mock.client_update_entry(alloc_id, status, task_states=task_states, updated_at_ns=at, evals=evs),
    )


def _config(algorithm: str, tracker: bool, paused: bool) -> Entry:
    config = SchedulerConfig(
        scheduler_algorithm=algorithm,
        rejection_tracker=RejectionTrackerConfig(threshold=3) if tracker else None,
        pause_eval_broker=paused,
    )
    return Entry(
        f"config({algorithm} tracker={tracker} paused={paused})", mock.scheduler_config_entry(config)
    )


P = itertools.product
REGISTERS = [
    _register(*v) for v in P(sorted(JOBS), (1, 0, 2, 3), (50, 70), JOB_STATUSES, (False, True), (True, False))
]
DEREGISTERS = [_deregister(*v) for v in P(sorted(JOBS), (False, True), (False, True))]
NODE_REGISTERS = [
    _node_register(n, status, elig, evs)
    for n, status, elig, evs in P(NODE_IDS, NODE_STATUSES, (NODE_ELIGIBLE, NODE_INELIGIBLE), EVAL_LISTS[:6])
]
NODE_STATUS_UPDATES = [_node_status(*v) for v in P(NODE_IDS, NODE_STATUSES, EVAL_LISTS[:6])]
DRAINS = [_drain(*v) for v in P(NODE_IDS, ("on", "off", "off+eligible"))]
ELIGIBILITIES = [
    Entry(f"eligibility({n} {e})", mock.eligibility_entry(n, e))
    for n, e in P(NODE_IDS, (NODE_INELIGIBLE, NODE_ELIGIBLE))
]
NODE_DEREGISTERS = [
    Entry(f"node-deregister({' '.join(ids)})", mock.deregister_node_entry(*ids))
    for ids in [(n,) for n in NODE_IDS] + [("node-1", "node-2"), ("node-2", "node-3")]
]
CLIENT_UPDATES = [
    _client(*v) for v in P(sorted(ALLOC_JOBS), ("", *ALLOC_CLIENT_STATUSES), (False, True), EVAL_LISTS[:4])
]
EVAL_UPDATES = [
    Entry(f"evals({_evals_desc(evs).strip()})", mock.eval_update_entry(*evs)) for evs in EVAL_LISTS[1:]
]
LAUNCHES = [
    Entry(
        f"launch({JOBS[name].id} +{h}h)", mock.periodic_launch_entry(JOBS[name].id, mock.NOW + h * mock.HOUR)
    )
    for name, h in P(sorted(JOBS), range(3))
]
CONFIGS = [_config(*v) for v in P(("binpack", "spread"), (False, True), (False, True))]
SERVERS = [
    Entry(f"server({name}:{port})", mock.server_member_entry(name, grpc_address=f"{name}:{port}"))
    for name, port in P(("s1", "s2", "s3"), (4646, 5646))
]


def _upserted(alloc_id: str, node_id: str, group: str, desired: str, client_status: str) -> Allocation:
    name = ALLOC_JOBS[alloc_id]
    return mock.alloc(
        JOBS[name],
        mock.node(id=node_id),
        index=int(alloc_id[-1]),
        id=alloc_id,
        eval_id=next(e for e, j in EVAL_JOBS.items() if j == name),
        task_group=group,
        desired_status=desired,
        client_status=client_status,
    )


UPSERTS = [
    _upserted(*v)
    for v in P(
        sorted(ALLOC_JOBS),
        NODE_IDS,
        ("web", "other"),
        (ALLOC_DESIRED_RUN, ALLOC_DESIRED_STOP),
        ALLOC_CLIENT_STATUSES,
    )
]
STOPS = [
    AllocStop(alloc_id=a, desired_status=d, desired_description="stopped by plan", client_status=c)
    for a, d, c in P(sorted(ALLOC_JOBS), (ALLOC_DESIRED_STOP, ALLOC_DESIRED_EVICT), ("", "lost", "unknown"))
]


@st.composite
def plan_results(draw: st.DrawFn) -> Entry:
    upserts = []
    for alloc in draw(st.lists(st.sampled_from(UPSERTS), max_size=3, unique_by=lambda a: a.id)):
        previous = draw(st.sampled_from(["", *sorted(ALLOC_JOBS)]), label="previous_allocation")
        version = draw(st.integers(0, 2), label="job_version")
        upserts.append(replace(alloc, previous_allocation=previous, job_version=version))
    stops = draw(st.lists(st.sampled_from(STOPS), max_size=2, unique_by=lambda s: s.alloc_id))
    ineligible = draw(st.sampled_from([[], *([n] for n in NODE_IDS)]))
    evs = draw(eval_lists)
    desc = (
        "plan("
        + " ".join(
            f"+{a.id}@{a.node_id}/{a.task_group}:{a.desired_status}/{a.client_status}/v{a.job_version}"
            + (f"<-{a.previous_allocation}" if a.previous_allocation else "")
            for a in upserts
        )
        + "".join(f" -{s.alloc_id}:{s.desired_status}/{s.client_status or '='}" for s in stops)
        + "".join(f" ineligible:{n}" for n in ineligible)
        + _evals_desc(evs)
        + ")"
    )
    return Entry(desc, mock.plan_entry(upserts, stops, evals=evs, nodes_ineligible=ineligible))


@st.composite
def eval_delete(draw: st.DrawFn) -> Entry:
    e_ids = draw(st.lists(eval_ids, max_size=2, unique=True))
    a_ids = draw(st.lists(alloc_ids, max_size=3, unique=True))
    return Entry(f"gc(evals={e_ids} allocs={a_ids})", mock.eval_delete_entry(e_ids, a_ids))


KNOWN_TYPES: list[int] = sorted(
    int(t) for t in set(ET.values()) - {ET.ENTRY_TYPE_UNSPECIFIED, ET.ENTRY_TYPE_IGNORABLE_FLOAT}
)
# The first type number no entry uses yet: unknown to this FSM.
NEXT_TYPE = max(KNOWN_TYPES) + 1


@st.composite
def garbage(draw: st.DrawFn) -> Entry:
    kind = draw(st.sampled_from(["bytes", "unknown-type", "ignorable", "corrupt-payload"]))
    if kind == "bytes":
        data = draw(st.binary(max_size=12))
        return Entry(f"garbage({data!r})", data)
    types_of_kind: dict[str, list[int]] = {
        "unknown-type": [0, NEXT_TYPE, 999],
        "ignorable": [1000, 1234],
        "corrupt-payload": KNOWN_TYPES,
    }
    entry_type = draw(st.sampled_from(types_of_kind[kind]))
    payload = draw(st.binary(max_size=8))
    return Entry(f"raw(type={entry_type} {payload!r})", mock.raw_entry(entry_type, payload))


# Weighted by how often a real log has them: plans and client updates dominate.
entries = st.one_of(
    st.sampled_from(REGISTERS),
    st.sampled_from(REGISTERS),
    st.sampled_from(DEREGISTERS),
    st.sampled_from(NODE_REGISTERS),
    st.sampled_from(NODE_STATUS_UPDATES),
    st.sampled_from(DRAINS),
    st.sampled_from(ELIGIBILITIES),
    st.sampled_from(NODE_DEREGISTERS),
    plan_results(),
    plan_results(),
    plan_results(),
    st.sampled_from(CLIENT_UPDATES),
    st.sampled_from(CLIENT_UPDATES),
    st.sampled_from(CLIENT_UPDATES),
    st.sampled_from(EVAL_UPDATES),
    eval_delete(),
    st.sampled_from(LAUNCHES),
    st.sampled_from(CONFIGS),
    st.sampled_from(SERVERS),
    garbage(),
)

# Half the logs start from a populated cluster, so short logs reach deep states too.
PRELUDE = (
    *(Entry(f"node-register({n})", mock.register_node_entry(mock.node(id=n))) for n in NODE_IDS),
    Entry("register(cron)", mock.register_job_entry(CRON)),
    Entry("register(web +eval-1)", mock.register_job_entry(WEB, mock.eval_for(WEB, id="eval-1"))),
    Entry(f"register({CHILD.id} +eval-3)", mock.register_job_entry(CHILD, mock.eval_for(CHILD, id="eval-3"))),
)


@st.composite
def logs(draw: st.DrawFn, min_size: int = 0, max_size: int = 60) -> list[Entry]:
    # A flat st.lists averages a handful of elements; a list of short runs averages ~25
    # and still shrinks well (the shrinker deletes entries and whole runs).
    runs = draw(st.lists(st.lists(entries, max_size=10), max_size=max_size // 10))
    body = [entry for run in runs for entry in run]
    if len(body) < min_size:
        body += draw(st.lists(entries, min_size=min_size - len(body), max_size=min_size - len(body)))
    prelude = list(PRELUDE) if draw(st.booleans(), label="from a populated cluster") else []
    return prelude + body


PROPERTY_SETTINGS = settings(
    # `make chaos` style deep runs: DROVER_HYPOTHESIS_EXAMPLES=2000.
    max_examples=int(os.environ.get("DROVER_HYPOTHESIS_EXAMPLES", "100")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def replay(entry_list: Sequence[Entry], store: StateStore | None = None, first_index: int = 1) -> StateStore:
    store = store or StateStore()
    fsm = FSM(store)
    for i, entry in enumerate(entry_list, start=first_index):
        fsm.apply(entry.data, i)
    return store


def invariant_2(tables: Tables, at: str) -> None:
    problems = mock.summary_problems(tables, children=True)
    assert not problems, f"summaries differ from a recount after {at}:\n" + "\n".join(problems)


# ---------------------------------------------------------------------------------------
# Properties


@PROPERTY_SETTINGS
@given(log=logs())
def test_fsm__same_log_on_two_fresh_stores__same_digest_at_every_index(log: list[Entry]) -> None:
    a, b = StateStore(), StateStore()
    fsm_a, fsm_b = FSM(a), FSM(b)
    for i, entry in enumerate(log, start=1):
        result_a, result_b = fsm_a.apply(entry.data, i), fsm_b.apply(entry.data, i)
        assert result_a == result_b, f"entry {i} {entry}"
        assert a.snapshot().tables == b.snapshot().tables, f"entry {i} {entry}"
    assert state_digest(a.snapshot().tables) == state_digest(b.snapshot().tables)


@PROPERTY_SETTINGS
@given(log=logs())
def test_fsm__random_log__summaries_equal_recount_after_every_entry(log: list[Entry]) -> None:
    store = StateStore()
    fsm = FSM(store)
    for i, entry in enumerate(log, start=1):
        fsm.apply(entry.data, i)
        invariant_2(store.snapshot().tables, f"entry {i} {entry}")


@PROPERTY_SETTINGS
@given(log=logs())
def test_fsm__log_then_snapshot_round_trip__same_digest_and_indexes(log: list[Entry]) -> None:
    tables = replay(log).snapshot().tables
    fresh = StateStore()

    FSM(fresh).restore_tables(
        from_snapshot(raft_pb2.StateSnapshot.FromString(to_snapshot(tables).SerializeToString()))
    )

    restored = fresh.snapshot().tables
    assert state_digest(restored) == state_digest(tables)
    # Secondary indexes and counters are rebuilt on load: they must equal the maintained ones.
    assert restored == tables


@PROPERTY_SETTINGS
@given(log=logs(), data=st.data())
def test_fsm__restored_mid_log_then_rest_applied__same_state_as_full_replay(
    log: list[Entry], data: Any
) -> None:
    # A follower that installs a snapshot at index k and applies the rest must end where a
    # server that replayed the whole log ends (docs/design.md#invariant-3).
    cut = data.draw(st.integers(0, len(log)), label="cut")
    full = replay(log).snapshot().tables
    prefix = replay(log[:cut]).snapshot().tables
    follower = StateStore()
    FSM(follower).restore_tables(from_snapshot(to_snapshot(prefix)))

    replay(log[cut:], follower, first_index=cut + 1)

    assert state_digest(follower.snapshot().tables) == state_digest(full)
    assert follower.snapshot().tables == full


@settings(max_examples=2, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(log=logs(min_size=20))
def test_fsm__same_log_under_other_hash_seeds__same_digest(log: list[Entry], tmp_path_factory: Any) -> None:
    """Set and dict orders of str keys change with PYTHONHASHSEED: every server has its own."""
    path = tmp_path_factory.mktemp("log") / "entries.bin"
    with path.open("wb") as f:
        for entry in log:
            f.write(len(entry.data).to_bytes(4, "big") + entry.data)
    want = state_digest(replay(log).snapshot().tables)
    for seed in ("1", "271828"):
        out = subprocess.run(
            [sys.executable, "-c", _REPLAY_SCRIPT, str(path)],
            cwd=REPO,
            env={**os.environ, "PYTHONHASHSEED": seed},
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        )
        assert out.stdout.strip().splitlines()[-1] == want, f"PYTHONHASHSEED={seed}: {out.stderr}"


_REPLAY_SCRIPT = """
import sys, structlog
structlog.configure(logger_factory=structlog.PrintLoggerFactory(sys.stderr))
from drover.server.fsm import FSM
from drover.server.snapshot import state_digest
from drover.server.state_store import StateStore
data = open(sys.argv[1], "rb").read()
store, pos, index = StateStore(), 0, 0
fsm = FSM(store)
while pos < len(data):
    size = int.from_bytes(data[pos:pos + 4], "big")
    index += 1
    fsm.apply(data[pos + 4:pos + 4 + size], index)
    pos += 4 + size
print(state_digest(store.snapshot().tables))
"""


# ---------------------------------------------------------------------------------------
# The state store's jobs and allocs tables against a plain-dict model


@dataclass
class ModelJob:
    spec: tuple[int, int]  # (count, priority): what a re-registration may change
    stop: bool
    version: int
    versions: list[int]


@dataclass
class ModelAlloc:
    job: str
    node_id: str
    desired_status: str
    client_status: str
    job_version: int
    create_index: int


class FSMAgainstModel(RuleBasedStateMachine):
    """Drives the FSM with entries and keeps, next to it, what they must have done."""

    @initialize()
    def start(self) -> None:
        self.store = StateStore()
        self.fsm = FSM(self.store)
        self.index = 0
        self.jobs: dict[str, ModelJob] = {}
        self.allocs: dict[str, ModelAlloc] = {}

    def _apply(self, data: bytes) -> str:
        self.index += 1
        return self.fsm.apply(data, self.index).error

    @rule(
        name=st.sampled_from(["web", "child"]),
        count=st.integers(0, 3),
        priority=st.sampled_from([50, 70]),
        stop=st.booleans(),
    )
    def register(self, name: str, count: int, priority: int, stop: bool) -> None:
        job = JOBS[name]
        job = replace(job, groups=(replace(job.groups[0], count=count),), priority=priority, stop=stop)
        assert self._apply(mock.register_job_entry(job)) == ""
        old = self.jobs.get(job.id)
        if old is None:
            self.jobs[job.id] = ModelJob((count, priority), stop, 0, [0])
        elif old.spec != (count, priority) or old.stop != stop:
            version = old.version + 1
            self.jobs[job.id] = ModelJob((count, priority), stop, version, [version, *old.versions][:6])

    @rule(name=st.sampled_from(["web", "child"]), purge=st.booleans())
    def deregister(self, name: str, purge: bool) -> None:
        job_id = JOBS[name].id
        error = self._apply(mock.deregister_entry(job_id, purge=purge))
        old = self.jobs.get(job_id)
        if old is None:
            assert error
            return
        assert error == ""
        if purge:
            del self.jobs[job_id]
        elif not old.stop:
            version = old.version + 1
            self.jobs[job_id] = ModelJob(old.spec, True, version, [version, *old.versions][:6])

    @rule(
        alloc_id=alloc_ids.filter(lambda a: ALLOC_JOBS[a] != "cron"),
        node_id=node_ids,
        job_version=st.integers(0, 2),
    )
    def place(self, alloc_id: str, node_id: str, job_version: int) -> None:
        name = ALLOC_JOBS[alloc_id]
        alloc = mock.alloc(
            JOBS[name], mock.node(id=node_id), id=alloc_id, eval_id="eval-1", job_version=job_version
        )
        assert self._apply(mock.plan_entry([alloc])) == ""
        old = self.allocs.get(alloc_id)
        if old is None:
            self.allocs[alloc_id] = ModelAlloc(
                JOBS[name].id, node_id, ALLOC_DESIRED_RUN, "pending", job_version, self.index
            )
        else:
            # In place: the scheduler's fields change, the client's stay.
            old.node_id, old.desired_status, old.job_version = node_id, ALLOC_DESIRED_RUN, job_version

    @rule(alloc_id=alloc_ids, desired=st.sampled_from([ALLOC_DESIRED_STOP, ALLOC_DESIRED_EVICT]))
    def stop_alloc(self, alloc_id: str, desired: str) -> None:
        assert (
            self._apply(mock.plan_entry(allocs_stopped=[mock.stop(alloc_id, desired_status=desired)])) == ""
        )
        if alloc_id in self.allocs:
            self.allocs[alloc_id].desired_status = desired

    @rule(alloc_id=alloc_ids, status=st.sampled_from(("", *ALLOC_CLIENT_STATUSES)))
    def client_reports(self, alloc_id: str, status: str) -> None:
        assert self._apply(mock.client_update_entry(alloc_id, status)) == ""
        if alloc_id in self.allocs and status:
            self.allocs[alloc_id].client_status = status

    @rule(ids=st.lists(alloc_ids, max_size=3, unique=True))
    def collect(self, ids: list[str]) -> None:
        assert self._apply(mock.eval_delete_entry([], ids)) == ""
        for alloc_id in ids:
            self.allocs.pop(alloc_id, None)

    @rule(
        data=st.one_of(
            st.sampled_from([b"\xff", b"\x0a\xff\xff", b"\x80" * 11]),  # not a LogEntry at all
            st.builds(mock.raw_entry, st.sampled_from([NEXT_TYPE, 999, 1000, 1234]), st.binary(max_size=8)),
            st.builds(mock.raw_entry, st.sampled_from(KNOWN_TYPES), st.just(b"\x0a\xff\xff\x01")),
        )
    )
    def garbage(self, data: bytes) -> None:
        before = self.store.snapshot().tables

        assert self._apply(data) != ""

        assert self.store.snapshot().tables is before

    @invariant()
    def jobs_match(self) -> None:
        snap = self.store.snapshot()
        assert {j.id: (j.groups[0].count, j.priority, j.stop, j.version) for j in snap.jobs()} == {
            job_id: (*m.spec, m.stop, m.version) for job_id, m in self.jobs.items()
        }
        for job_id, m in self.jobs.items():
            assert [v.version for v in snap.job_versions("default", job_id)] == m.versions

    @invariant()
    def allocs_match(self) -> None:
        snap = self.store.snapshot()
        assert {
            a.id: ModelAlloc(
                a.job_id, a.node_id, a.desired_status, a.client_status, a.job_version, a.create_index
            )
            for a in snap.allocs()
        } == self.allocs
        for job_id in {m.job for m in self.allocs.values()}:
            assert {a.id for a in snap.allocs_by_job("default", job_id)} == {
                i for i, m in self.allocs.items() if m.job == job_id
            }
        for node_id in NODE_IDS:
            assert {a.id for a in snap.allocs_by_node(node_id)} == {
                i for i, m in self.allocs.items() if m.node_id == node_id
            }

    @invariant()
    def summaries_equal_recount(self) -> None:
        invariant_2(self.store.snapshot().tables, f"index {self.index}")


FSMAgainstModel.TestCase.settings = settings(
    max_examples=100, stateful_step_count=30, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
test_fsm__against_plain_dict_model = FSMAgainstModel.TestCase
