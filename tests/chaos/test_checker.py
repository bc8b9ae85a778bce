"""The chaos checker, schedule and partition control, on hand-written inputs: the checker must
fail what is broken.

A checker that only ever says "pass" proves nothing; each test here feeds it one way a
cluster could lose or invent a write, and one way a correct cluster looks odd but is fine
(an operation with an unknown outcome that landed late).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path
from typing import Any

import immutables
import pytest

from deploy.cluster import wait_for
from drover.scheduler.structs import Job
from drover.server.codec import from_proto
from drover.server.state_store import Tables
from tests.chaos import checker
from tests.chaos.clients import LOST_AFTER_S, TaskSeen, Window
from tests.chaos.history import INFO, OK, History, Op
from tests.chaos.nemesis import CUT_CLIENT, KILL_LEADER, KILL_TWO, PARTITION, plan_schedule
from tests.chaos.partition import PartitionControl, _Blocked
from tests.chaos.report import leader_changes, percentile, plot_timeline
from tests.chaos.workload import build_job


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


def test_checker__indexes_against_real_time__violation_found() -> None:
    ok = _history(_op("probe", "p", 1.0, index=10), _op("probe", "p", 2.0, index=11))
    assert checker.check_realtime_order(ok).passed
    # Acknowledged at 1.1 s with index 10; a write invoked at 2.0 s got index 9: lost order.
    bad = _history(_op("probe", "p", 1.0, index=10), _op("probe", "q", 2.0, index=9))
    assert not checker.check_realtime_order(bad).passed
    # Overlapping writes may be applied in either order.
    overlapping = _history(_op("probe", "p", 1.0, index=10), _op("probe", "q", 1.05, index=9))
    assert checker.check_realtime_order(overlapping).passed


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
    blocked = _Blocked(str(path))
    assert blocked.pairs == frozenset()
    control.isolate("s2")
    want = {("b:2", "a:1"), ("a:1", "b:2"), ("b:2", "c:3"), ("c:3", "b:2")}
    assert wait_for(lambda: blocked.pairs == want, 5, 0.01, "the agent to see the cut")
    control.heal()
    assert wait_for(lambda: blocked.pairs == frozenset(), 5, 0.01, "the agent to see the heal")
    blocked.close()
