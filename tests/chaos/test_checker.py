"""The chaos checker, schedule and partition control, on hand-written inputs: the checker must
fail what is broken.

A checker that only ever says "pass" proves nothing; each test here feeds it one way a
cluster could lose or invent a write, break an invariant at one raft index on one server,
or log a defect, and one way a correct cluster looks odd but is fine (an operation with an
unknown outcome that landed late). Every ``check_*`` of tests/chaos/checker.py has at least
one such must-fail test (``test_every_check_has_a_must_fail_test`` keeps it so).
"""

from __future__ import annotations

import inspect
import pickle
import re
import sys
from collections.abc import Iterable, Iterator
from concurrent import futures
from dataclasses import replace
from pathlib import Path
from typing import Any

import grpc
import immutables
import pytest
from pysyncobj.journal import FileJournal
from pysyncobj.syncobj import _COMMAND_TYPE

from deploy.cluster import wait_for
from drover.scheduler.structs import (
    ALLOC_CLIENT_COMPLETE,
    ALLOC_CLIENT_RUNNING,
    ALLOC_DESIRED_STOP,
    EVAL_STATUS_BLOCKED,
    EVAL_STATUS_COMPLETE,
    Job,
    TaskGroupSummary,
)
from drover.server.codec import from_proto
from drover.server.fsm import FSM
from drover.server.snapshot import state_digest, to_snapshot
from drover.server.state_store import StateStore, Tables
from drover.v1 import api_pb2, raft_pb2
from tests.chaos import checker
from tests.chaos.clients import LOST_AFTER_S, TaskSeen, Window
from tests.chaos.disagreement import Disagreement, DisagreementControl, shrink_in_view, watch_shrunk
from tests.chaos.history import FAIL, INFO, OK, History, Op
from tests.chaos.nemesis import CUT_CLIENT, DISAGREE, KILL_LEADER, KILL_TWO, PARTITION, plan_schedule
from tests.chaos.partition import PartitionControl, watch_blocked
from tests.chaos.report import leader_changes, percentile, plot_timeline
from tests.chaos.workload import READ_KIND, Caller, WorkloadConfig, build_job, record_write
from tests.fixtures import mock


def _job(job_id: str, *, seq: int, count: int = 2, variant: int = 0, stop: bool = False) -> Job:
    job = from_proto(build_job(job_id, "service", count=count, variant=variant, seq=seq), Job)
    return replace(job, namespace="default", stop=stop, version=seq)


def _tables(jobs: Iterable[Job]) -> Tables:
    return Tables(jobs=immutables.Map({(j.namespace, j.id): j for j in jobs}))


def _op(kind: str, key: str, t: float, outcome: str = OK, index: int = 0, **args: Any) -> Op:
    result = {"version": args["seq"]} if "seq" in args else {}
    if "seq" in args:
        args.setdefault("count", 2)
        args.setdefault("variant", 0)
    return Op(
        "w",
        kind,
        key,
        args,
        t,
        t + 0.1,
        outcome,
        index or int(t * 10) + 1,
        "" if outcome == OK else "X",
        result,
    )


def _history(*ops: Op) -> History:
    history = History(origin=0.0)
    for op in ops:
        history.add(op)
    return history


TEMPLATES = [_job("tpl-periodic", seq=0), _job("tpl-dispatch", seq=0)]


def test_checker__acked_register_present__passes() -> None:
    history = _history(_op("register", "a", 1, seq=1), _op("update-inplace", "a", 2, seq=2))
    result = checker.check_acked_jobs(history, _tables([_job("a", seq=2), *TEMPLATES]))
    assert result.passed, result.details


def test_checker__acked_update_lost__fails() -> None:
    history = _history(_op("register", "a", 1, seq=1), _op("update-inplace", "a", 2, seq=2))
    result = checker.check_acked_jobs(history, _tables([_job("a", seq=1), *TEMPLATES]))
    assert not result.passed
    assert "job 'a' is running seq=1" in result.details[0]


def test_checker__acked_register_missing__fails() -> None:
    history = _history(_op("register", "a", 1, seq=1))
    assert not checker.check_acked_jobs(history, _tables(TEMPLATES)).passed


def test_checker__acked_purge_but_job_still_there__fails() -> None:
    history = _history(_op("register", "a", 1, seq=1), _op("purge", "a", 2))
    assert not checker.check_acked_jobs(history, _tables([_job("a", seq=1), *TEMPLATES])).passed


def test_checker__unknown_outcome_register_landed_after_acked_stop__passes() -> None:
    # A register stuck in a paused server, applied after the stop its caller went on to make.
    history = _history(
        _op("register", "a", 1, seq=1),
        _op("update-inplace", "a", 2, outcome=INFO, seq=2),
        _op("stop", "a", 3),
    )
    assert checker.check_acked_jobs(history, _tables([_job("a", seq=2), *TEMPLATES])).passed


def test_checker__write_nobody_requested__fails() -> None:
    history = _history(_op("register", "a", 1, seq=1))
    assert not checker.check_acked_jobs(history, _tables([_job("a", seq=7), *TEMPLATES])).passed


def test_checker__version_below_acknowledged__fails() -> None:
    history = _history(_op("register", "a", 1, seq=5))
    old = replace(_job("a", seq=5), version=2)
    result = checker.check_acked_jobs(history, _tables([old, *TEMPLATES]))
    assert not result.passed and "below the acknowledged 5" in result.details[0]


def test_checker__acknowledged_dispatch_child_missing__fails() -> None:
    op = _op("dispatch", "tpl-dispatch", 1)
    op.result = {"dispatched_job_id": "tpl-dispatch/dispatch-1-abc"}
    result = checker.check_acked_jobs(_history(op), _tables(TEMPLATES))
    assert not result.passed
    assert any("missing" in d for d in result.details)


def test_checker__indexes_against_real_time__violation_fails() -> None:
    ok = _history(_op("probe", "p", 1.0, index=10), _op("probe", "p", 2.0, index=11))
    assert checker.check_realtime_order(ok).passed
    # Acknowledged at 1.1 s with index 10; a write invoked at 2.0 s got index 9: lost order.
    bad = _history(_op("probe", "p", 1.0, index=10), _op("probe", "q", 2.0, index=9))
    assert not checker.check_realtime_order(bad).passed
    # Overlapping writes may be applied in either order.
    overlapping = _history(_op("probe", "p", 1.0, index=10), _op("probe", "q", 1.05, index=9))
    assert checker.check_realtime_order(overlapping).passed


def _read(key: str, t: float, *, stale: bool = False, outcome: str = OK, **seen: Any) -> Op:
    """A reader's get_job invoked at ``t``: ``seen`` is ``modify_index=N`` or ``absent=True``."""
    return Op("reads", READ_KIND, key, {"stale": stale}, t, t + 0.05, outcome, 0, "", dict(seen))


def test_checker__default_read_sees_acknowledged_writes__passes() -> None:
    history = _history(
        _op("register", "a", 1.0, index=10, seq=1),
        _read("a", 1.2, modify_index=10),
        _op("purge", "a", 2.0, index=20),
        _read("a", 2.2, absent=True),
        _op("register", "a", 3.0, index=30, seq=2),
        _read("a", 3.05, modify_index=30),  # concurrent with the register: it may show
    )
    result = checker.check_stale_reads(history)
    assert result.passed, result.details
    assert result.figures["judged"] == 3


def test_checker__default_read_older_than_acknowledged_write__fails() -> None:
    # Acknowledged at 1.1 s at index 10; a default read invoked at 1.5 s still saw index 5:
    # a deposed leader answered from its own state.
    history = _history(_op("update-inplace", "a", 1.0, index=10, seq=2), _read("a", 1.5, modify_index=5))
    result = checker.check_stale_reads(history)
    assert not result.passed
    assert "older than the update-inplace acknowledged at index 10" in result.details[0]


def test_checker__stop_of_a_stopped_job__keeps_the_first_stops_index__passes() -> None:
    # The first stop's answer was lost (applied at 12), so the worker stopped the job again:
    # acknowledged at 20, it changed nothing, and reads see the job stopped at 12.
    history = _history(
        _op("register", "a", 1.0, index=10, seq=1),
        _op("stop", "a", 1.5, outcome=INFO),
        _op("stop", "a", 2.0, index=20),
        _read("a", 2.5, modify_index=12, stop=True),
    )
    result = checker.check_stale_reads(history)
    assert result.passed, result.details


def test_checker__after_a_stop__a_running_job_or_one_older_than_its_register__fails() -> None:
    base = (_op("register", "a", 1.0, index=10, seq=1), _op("stop", "a", 2.0, index=20))
    running = _history(*base, _read("a", 2.5, modify_index=10, stop=False))
    assert not checker.check_stale_reads(running).passed
    older = _history(*base, _read("a", 2.5, modify_index=8, stop=True))
    assert not checker.check_stale_reads(older).passed
    assert "but a stop was acknowledged at index 20" in checker.check_stale_reads(older).details[0]
    # Stopped at an index below the stop's, with no earlier stop that could have done it.
    no_earlier_stop = _history(*base, _read("a", 2.5, modify_index=12, stop=True))
    assert not checker.check_stale_reads(no_earlier_stop).passed


def test_checker__default_read_sees_purged_job__fails() -> None:
    history = _history(_op("purge", "a", 1.0, index=10), _read("a", 1.5, modify_index=8))
    assert not checker.check_stale_reads(history).passed


def test_checker__default_read_misses_registered_job__fails_unless_a_purge_may_have_landed() -> None:
    missing = _history(_op("register", "a", 1.0, index=10, seq=1), _read("a", 1.5, absent=True))
    assert not checker.check_stale_reads(missing).passed
    maybe_purged = _history(
        _op("register", "a", 1.0, index=10, seq=1),
        _op("purge", "a", 1.3, outcome=INFO),
        _read("a", 1.5, absent=True),
    )
    assert checker.check_stale_reads(maybe_purged).passed


def test_checker__stale_read_may_lag__not_judged() -> None:
    history = _history(
        _op("register", "a", 1.0, index=10, seq=1),
        _read("a", 1.5, stale=True, modify_index=5),
        _read("a", 1.6, modify_index=10),
    )
    result = checker.check_stale_reads(history)
    assert result.passed, result.details
    assert result.figures == {"judged": 1, "stale_reads": 1}


def test_checker__no_default_read_judged__fails() -> None:
    history = _history(
        _op("register", "a", 1.0, index=10, seq=1), _read("a", 1.5, stale=True, modify_index=5)
    )
    result = checker.check_stale_reads(history)
    assert not result.passed and "nothing was checked" in result.details[0]


def _rejections(node: str, seconds: Iterable[int]) -> str:
    return "".join(
        f"2026-11-30T02:00:{s:02d}.000000Z [info     ] plan.node_rejected  eval_id=e job_id=j "
        f"node_id={node} reason=x\n"
        for s in seconds
    )


def test_checker__plan_rejections__bounded_by_threshold_per_window() -> None:
    fine = {"s1": _rejections("n1", range(6)) + _rejections("n2", range(3))}
    result = checker.check_plan_rejections(fine, threshold=5, window_s=300)
    assert result.passed and result.figures["rejections_per_node"] == {"n1": 6, "n2": 3}
    looping = {"s1": _rejections("n1", range(7))}
    assert not checker.check_plan_rejections(looping, threshold=5, window_s=300).passed


def test_checker__divergence_logged__fails() -> None:
    logs = {
        "s1": "ok\n",
        "s2": "truncating already-applied log entries 5..9: state machine may have diverged\n",
    }
    result = checker.check_logs(logs)
    assert not result.passed and result.details[0].startswith("s2: truncating")


def test_checker__heartbeat_missed__counted_not_judged() -> None:
    line = "2026-11-30T04:56:37.645487Z [warning  ] leader.heartbeat_missed        node_id=n-1 status=disconnected\n"
    result = checker.check_logs({"s1": line * 2, "s2": line})
    assert result.passed and result.figures["heartbeat_missed"] == {"n-1": 3}


def test_schedule__same_seed_same_faults__every_other_kills_the_leader() -> None:
    first = plan_schedule(42, 3, count=40)
    assert first == plan_schedule(42, 3, count=40)
    assert first != plan_schedule(43, 3, count=40)
    assert all(f.kind == KILL_LEADER for f in first[::2])
    assert KILL_TWO not in {f.kind for f in first}
    assert KILL_TWO in {f.kind for f in plan_schedule(42, 5, count=40)}
    assert PARTITION not in {f.kind for f in plan_schedule(42, 3, count=40, partitions=False)}


def test_schedule__with_clients__second_fault_cuts_a_client_and_leader_kills_stay() -> None:
    with_clients = plan_schedule(42, 3, count=40, clients=2)
    assert with_clients == plan_schedule(42, 3, count=40, clients=2)
    assert all(f.kind == KILL_LEADER for f in with_clients[::2])
    assert with_clients[1].kind == CUT_CLIENT and with_clients[1].target == "client"
    cuts = [f for f in with_clients if f.kind == CUT_CLIENT]
    assert len(cuts) > 1 and all(0 <= f.pick < 2 and f.hold_s < LOST_AFTER_S for f in cuts)
    assert CUT_CLIENT not in {f.kind for f in plan_schedule(42, 3, count=40)}


# --- invariant 5: allocs kept across a client reconnect ------------------------------------


def _seen(alloc_id: str = "a1", *, pid: int = 100, started: float = 5.0, **over: Any) -> TaskSeen:
    fields: dict[str, Any] = {
        "alloc_id": alloc_id,
        "job_id": "rx-c1",
        "client": "c1",
        "desired_status": "run",
        "client_status": "running",
        "pid": pid,
        "create_time": started,
        "alive": True,
        "server_pid": pid,
        "restarts": 0,
        "started_at_ns": 7,
    }
    fields.update(over)
    return TaskSeen(**fields)


def _cut(before: list[TaskSeen], after: list[TaskSeen], problems: Iterable[str] = ()) -> Window:
    return Window(
        "cut",
        "c1",
        t_before=10.0,
        before=before,
        t_cut=10.5,
        t_disconnected=18.0,
        t_unknown=18.5,
        t_heal=20.0,
        t_reconnected=22.0,
        t_after=22.0,
        after=after,
        problems=list(problems),
    )


def test_checker__allocs_kept__same_alloc_same_process__passes() -> None:
    # The servers marked it unknown meanwhile; it is back, same alloc, same process.
    result = checker.check_allocs_kept([_cut([_seen()], [_seen()])], _history())
    assert result.passed, result.details
    assert result.figures["allocs_checked"] == 1 and result.figures["allocs_kept"] == 1
    assert result.figures["disconnected_after_s"] == [7.5]


@pytest.mark.parametrize(
    ("after", "expected"),
    [
        ([_seen(pid=200, started=21.0)], "task process changed from pid 100"),
        ([_seen(started=21.0)], "task process changed"),  # the pid was reused
        ([_seen(alive=False)], "not running any more"),
        ([_seen(restarts=1, started_at_ns=9)], "restarted"),
        ([_seen(client_status="unknown")], "is unknown after the reconnect"),
        ([_seen(desired_status="stop", client_status="complete"), _seen("a2", pid=200)], "replaced by a2"),
        ([_seen("a2", pid=200)], "is gone, replaced by a2"),
        ([_seen(), _seen("a2", pid=200)], "has company: a2"),
        ([_seen(server_pid=300)], "the servers report pid 300"),
    ],
    ids=[
        "pid-changed",
        "same-pid-new-process",
        "process-dead",
        "restarted",
        "still-unknown",
        "alloc-replaced",
        "alloc-gone",
        "second-alloc",
        "servers-disagree",
    ],
)
def test_checker__allocs_kept__changed_across_the_reconnect__fails(
    after: list[TaskSeen], expected: str
) -> None:
    result = checker.check_allocs_kept([_cut([_seen()], after)], _history())
    assert not result.passed
    assert expected in result.details[0] and result.details[0].startswith("cut of c1 at t=10.5s")


def test_checker__allocs_kept__deliberately_stopped_by_the_workload__not_held_against_it() -> None:
    stopped = [_seen(desired_status="stop", client_status="complete", alive=False)]
    stop = _op("stop", "rx-c1", 15.0)
    result = checker.check_allocs_kept([_cut([_seen()], stopped)], _history(stop))
    assert result.passed, result.details
    assert result.figures["excluded_as_stopped"] == 1
    # A stop of another job, or one acknowledged before the window, excuses nothing.
    for op in (_op("stop", "rx-c2", 15.0), _op("stop", "rx-c1", 2.0)):
        assert not checker.check_allocs_kept([_cut([_seen()], stopped)], _history(op)).passed


def test_checker__allocs_kept__nemesis_problems_and_empty_windows__fail() -> None:
    never = checker.check_allocs_kept([_cut([_seen()], [_seen()], ["never marked disconnected"])], _history())
    assert not never.passed and "never marked disconnected" in never.details[0]
    empty = checker.check_allocs_kept([_cut([], [])], _history())
    assert not empty.passed and "nothing was checked" in empty.details[0]
    not_running = checker.check_allocs_kept([_cut([_seen(client_status="pending")], [])], _history())
    assert not not_running.passed


def test_checker__client_logs__crashed_loop__fails() -> None:
    assert checker.check_client_logs({"c1": "client.registered\n", "c2": ""}).passed
    crashed = {"c1": "2026 [error] client.loop_crashed loop=watch\n"}
    assert not checker.check_client_logs(crashed).passed


def _report(timeline: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "config": {"seed": 1, "servers": 3},
        "nemesis": {"timeline": timeline},
        "failovers": {"each": [{"t_kill": 1.0}], "p50_s": 1.0, "p99_s": 2.0},
    }


TIMELINE = [
    {"t": 0.5, "event": "leader", "server": "s1"},
    {"t": 1.0, "event": "sigkill", "server": "s1", "role": "leader"},
    {"t": 2.0, "event": "leader-elected", "server": "s2"},
    {"t": 3.0, "event": "restart", "server": "s1"},
    {"t": 4.0, "event": "leader", "server": "s2"},
    {"t": 5.0, "event": "cut-client", "client": "c1"},
    {"t": 9.0, "event": "client-disconnected", "client": "c1"},
    {"t": 11.0, "event": "heal-client", "client": "c1"},
    {"t": 12.0, "event": "client-reconnected", "client": "c1"},
]


def test_report__leader_changes__each_new_leader_once() -> None:
    assert leader_changes(TIMELINE) == [(0.5, "s1"), (2.0, "s2")]


def test_report__plot__png_with_matplotlib_else_skipped(tmp_path: Path) -> None:
    path = tmp_path / "chaos.png"
    outcome = plot_timeline(_report(TIMELINE), [0.1, 0.2, 2.5, 11.5], path)
    try:
        import matplotlib  # type: ignore[import-not-found,unused-ignore]  # noqa: F401
    except ImportError:
        assert outcome.startswith("skipped: matplotlib is not installed") and not path.exists()
    else:
        assert outcome == str(path) and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    ("values", "q", "expected"),
    [([], 50, None), ([3.0], 99, 3.0), ([1.0, 2.0, 3.0, 4.0], 50, 2.0), ([1.0, 2.0, 3.0, 4.0], 99, 4.0)],
    ids=["empty", "one", "p50", "p99"],
)
def test_report__percentile__nearest_rank(values: list[float], q: float, expected: float | None) -> None:
    assert percentile(values, q) == expected


def test_partition_control__isolate_and_heal__agents_see_the_pairs(tmp_path: Path) -> None:
    path = tmp_path / "partition.json"
    control = PartitionControl(path, ["s1", "s2", "s3"], ["a:1", "b:2", "c:3"])
    blocked = watch_blocked(str(path))
    assert blocked.value == frozenset()
    control.isolate("s2")
    want = {("b:2", "a:1"), ("a:1", "b:2"), ("b:2", "c:3"), ("c:3", "b:2")}
    assert wait_for(lambda: blocked.value == want, 5, 0.01, "the agent to see the cut")
    control.heal()
    assert wait_for(lambda: blocked.value == frozenset(), 5, 0.01, "the agent to see the heal")
    blocked.close()


# --- every check has teeth -------------------------------------------------------------------


def test_every_check_has_a_must_fail_test() -> None:
    checks = {
        name
        for name, fn in vars(checker).items()
        if name.startswith("check_") and inspect.isfunction(fn) and fn.__module__ == checker.__name__
    }
    covered: set[str] = set()
    for name, fn in vars(sys.modules[__name__]).items():
        if name.startswith("test_") and "fail" in name:
            source = inspect.getsource(fn)
            covered |= {c for c in checks if f"checker.{c}(" in source}
    assert len(checks) >= 15
    assert checks <= covered, f"checks without a must-fail test: {sorted(checks - covered)}"


# --- states the FSM built ----------------------------------------------------------------------

NODE = mock.node(id="n1")
SYS = mock.system_job(id="sys")
WEB = mock.job(id="web")


def _apply(*entries: bytes, first: int = 1) -> Tables:
    """The state after ``entries``, applied from raft index ``first`` on."""
    store = StateStore()
    fsm = FSM(store)
    for index, data in enumerate(entries, start=first):
        result = fsm.apply(data, index)
        assert not result.error, f"entry {index}: {result.error}"
    return store.snapshot().tables


def _sound() -> Tables:
    return _apply(
        mock.register_node_entry(NODE),
        mock.register_job_entry(SYS),
        mock.plan_entry([mock.alloc(SYS, NODE, 0, id="s-0")]),
    )


def _off_by_one(tables: Tables) -> Tables:
    """``tables`` with the system job's summary counting one alloc too many."""
    key = ("default", "sys")
    summary = tables.job_summaries[key]
    row = summary.summary.get("web", TaskGroupSummary())
    bad = replace(summary, summary={**summary.summary, "web": replace(row, running=row.running + 1)})
    return replace(tables, job_summaries=tables.job_summaries.set(key, bad))


def test_checker__summaries__one_server_off_by_one__fails() -> None:
    assert checker.check_summaries({"s1": _sound(), "s2": _sound()}).passed
    result = checker.check_summaries({"s1": _sound(), "s2": _off_by_one(_sound())})
    assert not result.passed and result.details == [
        "s2: ('default', 'sys') group 'web': running is 1 in the summary, 0 by recount"
    ]


def _two_on_one_node() -> Tables:
    return _apply(
        mock.register_node_entry(NODE),
        mock.register_job_entry(SYS),
        mock.plan_entry([mock.alloc(SYS, NODE, 0, id="s-0"), mock.alloc(SYS, NODE, 0, id="s-1")]),
    )


def test_checker__system_allocs__two_live_on_one_node__fails() -> None:
    assert checker.check_system_allocs({"s1": _sound()}).passed
    result = checker.check_system_allocs({"s1": _sound(), "s2": _two_on_one_node()})
    assert not result.passed
    # The tests' recount and the live checker both see it.
    assert (
        result.details[0]
        == "s2: system job 'sys' (default) group 'web' has 2 live allocs on node 'n1' (at most 1)"
    )
    assert result.details[1].startswith("s2: the live checker says system-allocs-per-node")


def test_checker__system_alloc_recount__counts_only_live_desired_running_allocs() -> None:
    tables = _two_on_one_node()
    assert checker.system_alloc_problems(tables) != []
    for alloc_update in (
        {"client_status": ALLOC_CLIENT_COMPLETE},
        {"client_status": "failed"},
        {"client_status": "lost"},
        {"desired_status": ALLOC_DESIRED_STOP},
    ):
        stopped = replace(tables.allocs["s-1"], **alloc_update)
        assert checker.system_alloc_problems(replace(tables, allocs=tables.allocs.set("s-1", stopped))) == []
    # A sysbatch group allows ``count`` per node; a service job is never judged.
    sysbatch = replace(tables.jobs[("default", "sys")], type="sysbatch")
    widened = replace(sysbatch, groups=(replace(sysbatch.groups[0], count=2),))
    assert (
        checker.system_alloc_problems(replace(tables, jobs=tables.jobs.set(("default", "sys"), widened)))
        == []
    )
    service = replace(sysbatch, type="service")
    assert (
        checker.system_alloc_problems(replace(tables, jobs=tables.jobs.set(("default", "sys"), service)))
        == []
    )


def test_checker__converged__digests_differ_or_settling_failed__fails() -> None:
    a, b = _sound(), _off_by_one(_sound())
    digest = state_digest(a)
    assert checker.check_converged((digest, a.index), "", {"s1": a, "s2": a}).passed
    # Same index, different states.
    assert not checker.check_converged(None, "", {"s1": a, "s2": b}).passed
    # A saved snapshot that does not hash to the digest the server reported live.
    mismatch = checker.check_converged((digest, a.index), "", {"s1": a, "s2": b})
    assert not mismatch.passed and any("s2's saved snapshot" in d for d in mismatch.details)
    timed_out = checker.check_converged(None, "timed out after 120s waiting for quiet", {"s1": a})
    assert not timed_out.passed and timed_out.details == ["timed out after 120s waiting for quiet"]


def test_checker__evals__pending_past_due_or_blocked_for_a_stopped_job__fails() -> None:
    now = mock.NOW + mock.HOUR
    done = mock.eval_for(WEB, id="done", status=EVAL_STATUS_COMPLETE)
    delayed = mock.eval_for(WEB, id="later", wait_until_ns=now + mock.MINUTE)
    blocked = mock.eval_for(WEB, id="blocked", status=EVAL_STATUS_BLOCKED)
    fine = _apply(mock.register_job_entry(WEB), mock.eval_update_entry(done, delayed, blocked))
    result = checker.check_evals(fine, now)
    assert result.passed and result.figures["delayed"] == 1, result.details
    stuck = _apply(mock.register_job_entry(WEB), mock.eval_update_entry(mock.eval_for(WEB, id="stuck")))
    result = checker.check_evals(stuck, now)
    assert not result.passed and "eval stuck" in result.details[0] and "still pending" in result.details[0]
    stopped = _apply(mock.register_job_entry(replace(WEB, stop=True)), mock.eval_update_entry(blocked))
    result = checker.check_evals(stopped, now)
    assert not result.passed and "which is stopped" in result.details[0]


# --- acknowledged writes: definite failures never happened ------------------------------------


def test_checker__definitely_failed_update_shows_in_the_state__fails() -> None:
    # The same history with the update's outcome unknown passes (it may have landed).
    unknown = _history(_op("register", "a", 1, seq=1), _op("update-inplace", "a", 2, outcome=INFO, seq=2))
    assert checker.check_acked_jobs(unknown, _tables([_job("a", seq=2), *TEMPLATES])).passed
    refused = _history(_op("register", "a", 1, seq=1), _op("update-inplace", "a", 2, outcome=FAIL, seq=2))
    result = checker.check_acked_jobs(refused, _tables([_job("a", seq=2), *TEMPLATES]))
    assert not result.passed and "job 'a' is running seq=2" in result.details[0]


def test_checker__more_dispatch_children_than_could_have_landed__fails() -> None:
    def dispatch(t: float, outcome: str) -> Op:
        op = _op("dispatch", "tpl-dispatch", t, outcome=outcome)
        op.result = {"dispatched_job_id": f"tpl-dispatch/dispatch-{int(t)}"} if outcome == OK else {}
        return op

    children = [replace(_job(f"tpl-dispatch/dispatch-{i}", seq=0), parent_id="tpl-dispatch") for i in (1, 2)]
    tables = _tables([*children, *TEMPLATES])
    assert checker.check_acked_jobs(_history(dispatch(1, OK), dispatch(2, INFO)), tables).passed
    result = checker.check_acked_jobs(_history(dispatch(1, OK), dispatch(2, FAIL)), tables)
    assert (
        not result.passed
        and "'tpl-dispatch' has 2 children; 1 dispatches were acknowledged" in result.details[0]
    )


def test_checker__acked_node_writes_lost__fails() -> None:
    drained = replace(NODE, drain_strategy=mock.drain_node().drain_strategy)
    alloc = mock.alloc(WEB, NODE, 0, id="a1")
    tables = Tables(nodes=immutables.Map({"n1": drained}), allocs=immutables.Map({"a1": alloc}))
    register = _op("node-register", "n1", 1)
    drain = _op("drain", "n1", 2)
    assert checker.check_acked_nodes(_history(register, drain), tables).passed
    # A registered node that is gone.
    missing = checker.check_acked_nodes(_history(_op("node-register", "n2", 1)), tables)
    assert not missing.passed and "node 'n2' was registered" in missing.details[0]
    # An acknowledged undrain the state does not show.
    undrained = checker.check_acked_nodes(_history(register, drain, _op("undrain", "n1", 3)), tables)
    assert not undrained.passed and "node 'n1' is draining" in undrained.details[0]
    # An acknowledged report of "running" for an alloc still pending.
    report = _op("alloc-update", "n1", 4, statuses={"a1": ALLOC_CLIENT_RUNNING})
    behind = checker.check_acked_nodes(_history(register, drain, report), tables)
    assert not behind.passed and "alloc a1 was reported running" in behind.details[0]
    # The servers may declare a live alloc lost meanwhile.
    lost = replace(tables, allocs=tables.allocs.set("a1", replace(alloc, client_status="lost")))
    assert checker.check_acked_nodes(_history(register, drain, report), lost).passed


# --- plan rejections: bounded per tracker, and exercised --------------------------------------


def _line(second: int, event: str, **fields: str) -> str:
    kv = " ".join(f"{k}={v}" for k, v in fields.items())
    return f"2026-11-30T02:00:{second:02d}.000000Z [info     ] {event} {kv}\n"


def _mark(node: str, second: int) -> str:
    return _line(second, "plan.node_marked_ineligible", eval_id="e", job_id="j", node_id=node, threshold="5")


def _elected(second: int) -> str:
    return _line(second, "leader.established", server="s1", term="7", workers="2")


def test_checker__plan_rejections__more_than_threshold_plus_one_without_a_mark__fails() -> None:
    looping = {"s1": _rejections("n1", range(9))}
    result = checker.check_plan_rejections(looping, threshold=5, window_s=300)
    assert not result.passed
    assert result.details == [
        "s1 rejected plans for node 'n1' 7 times within 300s without marking it ineligible"
    ]
    # The tracker forgets a node it marked: what follows is a new count.
    marked = {"s1": _rejections("n1", range(6)) + _mark("n1", 6) + _rejections("n1", range(7, 10))}
    result = checker.check_plan_rejections(marked, threshold=5, window_s=300)
    assert result.passed and result.figures["marked_ineligible"] == {"n1": 1}, result.details
    # A new leader's applier has a new tracker.
    two_leaders = {"s1": _rejections("n1", range(4)) + _elected(5) + _rejections("n1", range(6, 10))}
    assert checker.check_plan_rejections(two_leaders, threshold=5, window_s=300).passed
    # Outside the window, older rejections no longer count.
    spread = {"s1": _rejections("n1", [0, 1, 2, 3, 40, 41, 42, 43])}
    assert checker.check_plan_rejections(spread, threshold=5, window_s=30).passed


def _disagreement(**over: Any) -> Disagreement:
    start = checker._ts("2026-11-30T02:00:00.000000Z")
    fields: dict[str, Any] = {
        "node_id": "n1",
        "t_start": 10.0,
        "wall_start": start,
        "t_marked": 12.0,
        "t_restored": 13.0,
        "t_eligible": 13.5,
        "wall_end": start + 8,
    }
    fields.update(over)
    return Disagreement(**fields)


def test_checker__plan_rejections__provoked_disagreement_not_exercised__fails() -> None:
    logs = {"s1": _rejections("n1", range(6)) + _mark("n1", 6)}
    result = checker.check_plan_rejections(logs, 5, 300, [_disagreement()])
    assert result.passed, result.details
    assert result.figures["disagreements"][0]["rejections"] == 6
    # Refused nothing: the bound was never approached.
    quiet = checker.check_plan_rejections({"s1": ""}, 5, 300, [_disagreement()])
    assert not quiet.passed and "no plan was rejected for it" in quiet.details[0]
    # Rejections of that node, but long after the disagreement ended.
    late = {"s1": _rejections("n1", [40, 41])}
    assert not checker.check_plan_rejections(late, 5, 300, [_disagreement()]).passed
    # Never marked ineligible, or what the nemesis saw go wrong.
    never = checker.check_plan_rejections(logs, 5, 300, [_disagreement(t_marked=None)])
    assert not never.passed and "never marked ineligible" in never.details[0]
    stuck = checker.check_plan_rejections(logs, 5, 300, [_disagreement(problems=["timed out after 60s"])])
    assert not stuck.passed and "timed out after 60s" in stuck.details[0]
    # Enabled but none provoked; not enabled at all is only a figure.
    assert not checker.check_plan_rejections(logs, 5, 300, []).passed
    assert checker.check_plan_rejections(logs, 5, 300, None).figures["disagreements"] == "not enabled"


def test_disagreement__control_file_reaches_the_applier_view(tmp_path: Path) -> None:
    path = tmp_path / "disagree.json"
    control = DisagreementControl(path)
    shrunk = watch_shrunk(str(path))
    try:
        assert shrunk.value == frozenset()
        control.shrink("n1")
        assert wait_for(lambda: shrunk.value == {"n1"}, 5, 0.01, "the hook to see the shrink")
        control.restore()
        assert wait_for(lambda: shrunk.value == frozenset(), 5, 0.01, "the hook to see the restore")
    finally:
        shrunk.close()
    snap = StateStore(_sound()).snapshot()
    view = shrink_in_view(snap, ["n1", "absent"])
    node = view.node("n1")
    assert node is not None and node.resources is not None and node.resources.cpu_mhz == 1
    original = snap.node("n1")
    assert original is not None and original.resources == NODE.resources, "the state itself is untouched"
    assert shrink_in_view(snap, ["absent"]) is snap


def test_schedule__with_disagreements__fourth_fault_disagrees() -> None:
    plain = plan_schedule(42, 3, count=40, clients=2)
    assert DISAGREE not in {f.kind for f in plain}
    with_them = plan_schedule(42, 3, count=40, clients=2, disagreements=True)
    assert with_them == plan_schedule(42, 3, count=40, clients=2, disagreements=True)
    assert with_them[3].kind == DISAGREE and with_them[3].target == "node"
    assert all(f.kind == KILL_LEADER for f in with_them[::2]) and with_them[1].kind == CUT_CLIENT


# --- tracebacks ---------------------------------------------------------------------------------

EVENT = "2026-11-30T02:00:00.000000Z [error    ] plan.apply_failed eval_id=e1"
TRACE = (
    f"{EVENT}\n"
    "Traceback (most recent call last):\n"
    '  File "server/plan_apply.py", line 10, in _run\n'
    "    self._apply(pending)\n"
    "KeyError: 'n1'\n"
    "2026-11-30T02:00:01.000000Z [info     ] worker.eval_done status=complete\n"
)
CHAINED_TRACE = (
    "Exception in thread chaos-x:\n"
    "Traceback (most recent call last):\n"
    '  File "a.py", line 1, in f\n'
    "ValueError: first\n"
    "\n"
    "During handling of the above exception, another exception occurred:\n"
    "\n"
    "Traceback (most recent call last):\n"
    '  File "a.py", line 3, in f\n'
    "RuntimeError: second\n"
)


def test_checker__traceback_in_a_server_log__fails() -> None:
    assert checker.check_tracebacks({"s1": "2026 [info] ok\n"}, {"c1": ""}).passed
    result = checker.check_tracebacks({"s1": "ok\n", "s2": TRACE}, {})
    assert not result.passed and result.figures["tracebacks"] == {"s2": 1}
    assert result.details == [f"s2: KeyError: 'n1' (after: {EVENT})"]


def test_checker__traceback_in_a_client_log__fails() -> None:
    result = checker.check_tracebacks({"s1": ""}, {"c1": CHAINED_TRACE})
    assert not result.passed
    # A chained traceback is one: the exception that escaped, after the thread's header.
    assert result.details == ["c1: RuntimeError: second (after: Exception in thread chaos-x:)"]


def test_checker__traceback_allowed_with_a_reason__passes_and_is_counted() -> None:
    allowed = [
        checker.AllowedTraceback(re.compile(r"plan\.apply_failed.*\n.*KeyError"), "a known race (issue N)")
    ]
    result = checker.check_tracebacks({"s2": TRACE}, {}, allowed)
    assert result.passed and result.figures["allowed"] == {"a known race (issue N)": 1}
    # The allow-list names one traceback, not every traceback.
    assert not checker.check_tracebacks({"s2": TRACE + CHAINED_TRACE}, {}, allowed).passed


# --- the live checker ----------------------------------------------------------------------------


def _sample(server: str, *violations: str) -> dict[str, Any]:
    return {"t": 1.0, "server": server, "index": 10, "violations": list(violations)}


def test_checker__live__violation_or_nothing_checked__fails() -> None:
    servers = ["s1", "s2"]
    assert checker.check_live([_sample("s1"), _sample("s2")], "", servers).passed
    bad = checker.check_live([_sample("s1", "job-summaries: web off"), _sample("s2")], "", servers)
    assert not bad.passed and bad.details == ["t=1.0s s1 index 10: job-summaries: web off"]
    none = checker.check_live([], "", servers)
    assert not none.passed and "nothing was checked" in none.details[0]
    unimplemented = checker.check_live([], "the servers do not implement Operator.Invariants", servers)
    assert not unimplemented.passed and "could not run" in unimplemented.details[0]
    one_missing = checker.check_live([_sample("s1")], "", servers)
    assert not one_missing.passed and one_missing.details == ["never sampled: s2"]


def test_checker__workload_errors__fails() -> None:
    assert checker.check_workload([]).passed
    assert not checker.check_workload(["jobs-0: KeyError: 'x'"]).passed


def test_checker__client_logs__none_read__fails() -> None:
    assert not checker.check_client_logs({}).passed


# --- recording outcomes exactly -------------------------------------------------------------------


@pytest.fixture
def scripted_server() -> Iterator[tuple[list[grpc.StatusCode | None], str]]:
    """A one-method fake server (Jobs.Deregister): each call takes the next scripted answer
    (a status to fail with, or None for success at index 7)."""
    answers: list[grpc.StatusCode | None] = []

    def deregister(request: api_pb2.JobDeregisterRequest, context: grpc.ServicerContext) -> Any:
        code = answers.pop(0) if answers else grpc.StatusCode.INTERNAL
        if code is not None:
            context.abort(code, "scripted")
        return api_pb2.JobDeregisterResponse(meta=api_pb2.WriteMeta(index=7))

    handler = grpc.method_handlers_generic_handler(
        "drover.v1.Jobs",
        {
            "Deregister": grpc.unary_unary_rpc_method_handler(
                deregister,
                request_deserializer=api_pb2.JobDeregisterRequest.FromString,
                response_serializer=api_pb2.JobDeregisterResponse.SerializeToString,
            )
        },
    )
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield answers, f"127.0.0.1:{port}"
    finally:
        server.stop(None).wait()


@pytest.mark.parametrize(
    ("script", "outcome"),
    [
        ([None], OK),
        ([grpc.StatusCode.NOT_FOUND], FAIL),
        ([grpc.StatusCode.INVALID_ARGUMENT], FAIL),
        ([grpc.StatusCode.FAILED_PRECONDITION], FAIL),
        # A retried attempt may have committed: the definite answer to the retry says nothing.
        ([grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.NOT_FOUND], INFO),
        ([grpc.StatusCode.DEADLINE_EXCEEDED], INFO),
        ([grpc.StatusCode.INTERNAL], INFO),
    ],
    ids=["ok", "not-found", "invalid", "precondition", "not-found-after-a-retry", "deadline", "internal"],
)
def test_record_write__outcome_exactly_as_the_answers_say(
    scripted_server: tuple[list[grpc.StatusCode | None], str],
    script: list[grpc.StatusCode | None],
    outcome: str,
) -> None:
    answers, address = scripted_server
    answers.extend(script)
    history = History()
    caller = Caller([address], WorkloadConfig(seed=0, rpc_timeout_s=5, retry_deadline_s=10), 0)
    try:
        op = record_write(history, caller, "w", "purge", "a", lambda c: c.deregister_job("a", purge=True))
    finally:
        caller.close()
    assert op.outcome == outcome, op.error
    if outcome != OK:
        assert caller.last_attempts == len(script)
    assert op.index == (7 if outcome == OK else 0)
    assert not answers, "every scripted answer was used: the SDK made exactly those attempts"


# --- every raft index, on every server -----------------------------------------------------------


def _regular(entry: bytes) -> bytes:
    return bytes([_COMMAND_TYPE.REGULAR]) + pickle.dumps((0, (entry,)), 2)


NOOP = bytes([_COMMAND_TYPE.NO_OP])


def _data_dir(
    root: Path,
    entries: list[bytes],
    *,
    term: int = 1,
    snapshot: tuple[Tables, int] | None = None,
    first: int = 1,
) -> Path:
    """A stopped server's data dir: pysyncobj's own journal of ``entries`` from index
    ``first`` (a no-op first when it is 1), and a raft snapshot (state, index) if given."""
    raft = root / "raft"
    raft.mkdir(parents=True)
    journal = FileJournal(str(raft / "journal.bin"))
    commands = ([NOOP] if first == 1 else []) + [_regular(e) for e in entries]
    for offset, command in enumerate(commands):
        journal.add(command, first + offset, term)
    journal._destroy()
    if snapshot is not None:
        tables, index = snapshot
        msg = raft_pb2.RaftSnapshotFile(state=to_snapshot(replace(tables, index=index)))
        msg.last_entry.index = index
        msg.last_entry.term = term
        (raft / "snapshot.pb").write_bytes(msg.SerializeToString())
    return root


SOUND_ENTRIES = [
    mock.register_node_entry(NODE),
    mock.register_job_entry(SYS),
    mock.plan_entry([mock.alloc(SYS, NODE, 0, id="s-0")]),
]
# Two live allocs of the system job on one node for one entry, then one stopped: the end
# state is sound, only the index in between is not.
DUPLICATED_THEN_FIXED = [
    *SOUND_ENTRIES,
    mock.plan_entry([mock.alloc(SYS, NODE, 0, id="s-1")]),
    mock.plan_entry(allocs_stopped=["s-0"]),
]


def test_checker__replay__every_server_clean__passes_with_every_entry_replayed(tmp_path: Path) -> None:
    dirs = {name: _data_dir(tmp_path / name, SOUND_ENTRIES) for name in ("s1", "s2", "s3")}
    result = checker.check_replay(dirs, None)
    assert result.passed, result.details
    servers = result.figures["servers"]
    assert {name: f["entries"] for name, f in servers.items()} == {"s1": 4, "s2": 4, "s3": 4}
    # The same entries from the same start are the same states: judged once, on s1.
    assert servers["s1"]["states_checked"] == 4 and servers["s2"]["states_shared"] == 4


def test_checker__replay__violation_at_one_index_on_one_server_only__fails(tmp_path: Path) -> None:
    dirs = {
        "s1": _data_dir(tmp_path / "s1", SOUND_ENTRIES),
        "s2": _data_dir(tmp_path / "s2", DUPLICATED_THEN_FIXED),
    }
    result = checker.check_replay(dirs, None)
    assert not result.passed
    assert all(d.startswith("s2 from index 5 (term 1) to 5, 1 states:") for d in result.details), (
        result.details
    )
    assert any("has 2 live allocs on node 'n1'" in d for d in result.details)
    assert any("the live checker says system-allocs-per-node" in d for d in result.details)


def test_checker__replay__summary_off_by_one_restored_at_one_index__fails(tmp_path: Path) -> None:
    broken = _off_by_one(_apply(*SOUND_ENTRIES))
    dirs = {"s1": _data_dir(tmp_path / "s1", [*SOUND_ENTRIES, mock.snapshot_restore_entry(broken)])}
    result = checker.check_replay(dirs, None)
    assert not result.passed
    assert any(
        d.startswith("s1 from index 5") and "running is 1 in the summary, 0 by recount" in d
        for d in result.details
    ), result.details


def test_checker__replay__broken_raft_snapshot__fails(tmp_path: Path) -> None:
    """A compacted journal: the replay starts from the snapshot, whose own state is judged."""
    broken = _off_by_one(_apply(*SOUND_ENTRIES))
    after = [mock.register_job_entry(WEB)]
    dirs = {"s1": _data_dir(tmp_path / "s1", after, snapshot=(broken, 4), first=5)}
    result = checker.check_replay(dirs, None)
    assert not result.passed
    assert result.details[0].startswith("s1 from index 4 (term 1) to 5, 2 states:")
    figures = result.figures["servers"]["s1"]
    assert (figures["start"], figures["snapshot_index"], figures["entries"]) == ("snapshot", 4, 1)


def test_checker__replay__snapshot_differs_from_another_servers_replay_at_its_index__fails(
    tmp_path: Path,
) -> None:
    sound = _apply(*SOUND_ENTRIES, first=2)  # as s1's journal has them: after its no-op
    after = [mock.register_job_entry(WEB)]
    other = replace(sound, nodes=sound.nodes.set("n1", replace(sound.nodes["n1"], name="renamed")))
    dirs = {
        "s1": _data_dir(tmp_path / "s1", [*SOUND_ENTRIES, *after]),
        "s2": _data_dir(tmp_path / "s2", after, snapshot=(sound, 4), first=5),
    }
    agreeing = checker.check_replay(dirs, None)
    assert agreeing.passed, agreeing.details
    # Equal to s1's state at index 4: s2's states are s1's, judged once.
    assert agreeing.figures["servers"]["s2"]["states_shared"] == 2
    dirs["s3"] = _data_dir(tmp_path / "s3", after, snapshot=(other, 4), first=5)
    result = checker.check_replay(dirs, None)
    assert not result.passed
    assert any(d.startswith("s3's raft snapshot at index 4 (term 1) hashes to") for d in result.details)


def test_checker__replay__journals_differ_or_end_state_is_not_the_live_digest__fails(tmp_path: Path) -> None:
    dirs = {
        "s1": _data_dir(tmp_path / "s1", SOUND_ENTRIES),
        "s2": _data_dir(tmp_path / "s2", SOUND_ENTRIES, term=2),
    }
    result = checker.check_replay(dirs, (state_digest(_apply(*SOUND_ENTRIES, first=2)), 4))
    assert not result.passed and any("journal differs from" in d for d in result.details)
    same = {name: _data_dir(tmp_path / f"same-{name}", SOUND_ENTRIES) for name in ("s1", "s2")}
    wrong = checker.check_replay(same, ("0" * 64, 4))
    assert not wrong.passed and all("the live servers agreed on 000000000000" in d for d in wrong.details)


def test_checker__replay__unreadable_data_dir__fails(tmp_path: Path) -> None:
    (tmp_path / "s1").mkdir()
    result = checker.check_replay({"s1": tmp_path / "s1"}, None)
    assert not result.passed and result.details[0].startswith("s1: replay failed: no raft journal")
