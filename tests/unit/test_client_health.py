"""drover.client.health: the deployment health verdict, as a table over task states, check
streaks and times; the tracker stepped by hand on a manual clock; and the agent sending the
verdict to an in-process fake of the servers (tests/unit/test_client_fake_server)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

import drover.client.runner as alloc_runner
from drover.client.agent import ClientAgent
from drover.client.checks import CheckOutcome, CheckSpec, CheckStatus
from drover.client.health import (
    CheckStreak,
    DeploymentHealth,
    HealthPolicy,
    HealthTracker,
    decide_health,
    health_policy,
    streaks_of,
)
from drover.client.rpc import alloc_update_message
from drover.client.taskstate import AllocStatus
from drover.common.taskstate import TASK_DEAD, TASK_PENDING, TASK_RUNNING, TaskState
from drover.v1 import structs_pb2
from tests.fixtures.clock import ManualClock
from tests.unit.test_client_agent import FAST, settings
from tests.unit.test_client_fake_server import FakeServer, alloc, fake_server, job, task, wait_until

S = 1_000_000_000
T0 = 1_000 * S  # when tracking began

POLICY = HealthPolicy("d1", min_healthy_time_ns=10 * S, healthy_deadline_ns=60 * S, use_checks=False)
CHECKED = replace(POLICY, use_checks=True)


def running(since_s: float, restarts: int = 0) -> TaskState:
    return TaskState(state=TASK_RUNNING, started_at_ns=T0 + int(since_s * S), restarts=restarts)


PENDING = TaskState(state=TASK_PENDING)
RESTARTING = TaskState(state=TASK_PENDING, started_at_ns=T0, restarts=1)
FAILED = TaskState(state=TASK_DEAD, failed=True, started_at_ns=T0)
FINISHED = TaskState(state=TASK_DEAD, failed=False, started_at_ns=T0)


def passing(since_s: float) -> CheckStreak:
    return CheckStreak(passing_since_ns=T0 + int(since_s * S), last_run_ns=T0 + int(since_s * S))


FAILING = CheckStreak(passing_since_ns=0, last_run_ns=T0)


@dataclass(frozen=True)
class Case:
    policy: HealthPolicy
    tasks: Mapping[str, TaskState]
    checks: Mapping[str, CheckStreak]
    now_s: float
    health: str
    recheck_s: float | None = None  # when undecided: the next moment the answer may change


CASES: list[tuple[str, Case]] = [
    ("running-not-long-enough", Case(POLICY, {"a": running(0)}, {}, 5, "", 10)),
    ("healthy-after-min-healthy-time", Case(POLICY, {"a": running(0)}, {}, 10, "healthy")),
    ("restart-resets-min-healthy-time", Case(POLICY, {"a": running(8, restarts=1)}, {}, 15, "", 18)),
    (
        "restarted-task-healthy-from-its-new-start",
        Case(POLICY, {"a": running(8, restarts=1)}, {}, 18, "healthy"),
    ),
    ("restarting-task-is-not-running", Case(POLICY, {"a": RESTARTING}, {}, 30, "", 60)),
    ("latest-task-start-counts", Case(POLICY, {"a": running(0), "b": running(4)}, {}, 13, "", 14)),
    ("every-task-running-long-enough", Case(POLICY, {"a": running(0), "b": running(4)}, {}, 14, "healthy")),
    ("one-task-still-pending", Case(POLICY, {"a": running(0), "b": PENDING}, {}, 30, "", 60)),
    ("failed-task-unhealthy", Case(POLICY, {"a": running(0), "b": FAILED}, {}, 5, "unhealthy")),
    ("finished-service-task-unhealthy", Case(POLICY, {"a": FINISHED}, {}, 5, "unhealthy")),
    ("deadline-unhealthy", Case(POLICY, {"a": PENDING}, {}, 60, "unhealthy")),
    ("deadline-beats-a-late-start", Case(POLICY, {"a": running(55)}, {}, 60, "unhealthy")),
    ("waiting-capped-by-the-deadline", Case(POLICY, {"a": running(55)}, {}, 56, "", 60)),
    ("no-tasks-yet", Case(POLICY, {}, {}, 5, "", 60)),
    ("min-healthy-time-0", Case(replace(POLICY, min_healthy_time_ns=0), {"a": running(1)}, {}, 1, "healthy")),
    ("task-states-mode-ignores-checks", Case(POLICY, {"a": running(0)}, {"c": FAILING}, 10, "healthy")),
    ("checks-failing-not-healthy", Case(CHECKED, {"a": running(0)}, {"c": FAILING}, 30, "", 60)),
    ("checks-failing-until-the-deadline", Case(CHECKED, {"a": running(0)}, {"c": FAILING}, 60, "unhealthy")),
    ("check-passing-not-long-enough", Case(CHECKED, {"a": running(0)}, {"c": passing(5)}, 12, "", 15)),
    (
        "check-passing-for-min-healthy-time",
        Case(CHECKED, {"a": running(0)}, {"c": passing(5)}, 15, "healthy"),
    ),
    (
        "every-check-must-pass",
        Case(CHECKED, {"a": running(0)}, {"c": passing(0), "d": FAILING}, 30, "", 60),
    ),
    (
        "latest-streak-counts",
        Case(CHECKED, {"a": running(0)}, {"c": passing(1), "d": passing(7)}, 16, "", 17),
    ),
    ("failed-task-beats-passing-checks", Case(CHECKED, {"a": FAILED}, {"c": passing(0)}, 30, "unhealthy")),
]


@pytest.mark.parametrize("case", [c for _, c in CASES], ids=[name for name, _ in CASES])
def test_decide_health__table(case: Case) -> None:
    verdict = decide_health(case.policy, case.tasks, case.checks, T0, T0 + int(case.now_s * S))

    assert verdict.health == case.health, verdict.reason
    if case.recheck_s is not None:
        assert verdict.recheck_at_ns == T0 + int(case.recheck_s * S)


def test_check_streak__any_failure_resets_it() -> None:
    ok, bad = CheckOutcome(True), CheckOutcome(False, "refused")
    streak = CheckStreak().after(ok, 10).after(ok, 20)
    assert streak.passing_since_ns == 10
    streak = streak.after(bad, 30)
    assert (streak.passing_since_ns, streak.output) == (0, "refused")
    assert streak.after(ok, 40).passing_since_ns == 40


# ---------------------------------------------------------------------------------------
# Whether the client decides at all


def deployed_job(**update: object) -> structs_pb2.Job:
    j = job()
    j.groups[0].update.CopyFrom(structs_pb2.UpdateStrategy(**{"max_parallel": 1, **update}))  # type: ignore[arg-type]
    return j


def deployed_alloc(j: structs_pb2.Job, deployment_id: str = "d1") -> structs_pb2.Allocation:
    a = alloc("a1", j)
    a.deployment_id = deployment_id
    return a


def with_type(j: structs_pb2.Job, job_type: str) -> structs_pb2.Job:
    j.type = job_type
    return j


POLICIES: list[tuple[str, structs_pb2.Job, str, HealthPolicy | None]] = [
    (
        "task-states",
        deployed_job(min_healthy_time_ns=2 * S, healthy_deadline_ns=9 * S, health_check="task_states"),
        "d1",
        HealthPolicy("d1", 2 * S, 9 * S, use_checks=False),
    ),
    (
        "mode-unset-is-task-states",
        deployed_job(min_healthy_time_ns=2 * S, healthy_deadline_ns=9 * S),
        "d1",
        HealthPolicy("d1", 2 * S, 9 * S, use_checks=False),
    ),
    (
        "checks",
        deployed_job(min_healthy_time_ns=S, healthy_deadline_ns=5 * S, health_check="checks"),
        "d2",
        HealthPolicy("d2", S, 5 * S, use_checks=True),
    ),
    (
        "system-job",
        with_type(deployed_job(healthy_deadline_ns=5 * S), "system"),
        "d1",
        HealthPolicy("d1", 0, 5 * S, use_checks=False),
    ),
    ("manual-never", deployed_job(healthy_deadline_ns=5 * S, health_check="manual"), "d1", None),
    ("no-deployment", deployed_job(healthy_deadline_ns=5 * S), "", None),
    ("max-parallel-0", deployed_job(healthy_deadline_ns=5 * S, max_parallel=0), "d1", None),
    ("no-update-block", job(), "d1", None),
    ("batch-job", with_type(deployed_job(healthy_deadline_ns=5 * S), "batch"), "d1", None),
]


@pytest.mark.parametrize(
    ("j", "deployment_id", "expected"), [c[1:] for c in POLICIES], ids=[c[0] for c in POLICIES]
)
def test_health_policy__who_decides(
    j: structs_pb2.Job, deployment_id: str, expected: HealthPolicy | None
) -> None:
    assert health_policy(deployed_alloc(j, deployment_id), j) == expected


def test_alloc_update_message__carries_the_verdict_and_the_servers_canary_flag() -> None:
    verdict = DeploymentHealth("d1", "healthy", 42, canary=True)
    msg = alloc_update_message("n1", AllocStatus("a1", "running", "", {}, verdict))
    assert msg.HasField("deployment_status")
    assert (msg.deployment_status.health, msg.deployment_status.timestamp_ns) == ("healthy", 42)
    assert msg.deployment_status.canary
    assert msg.deployment_id == "d1"
    undecided = alloc_update_message("n1", AllocStatus("a1", "running", "", {}))
    assert not undecided.HasField("deployment_status")


# ---------------------------------------------------------------------------------------
# The tracker, stepped by hand


class ScriptedCheck:
    """Check outcomes in order; each run is recorded with the clock's time."""

    def __init__(self, clock: ManualClock, outcomes: list[bool]) -> None:
        self._clock = clock
        self._outcomes = list(outcomes)
        self.runs: list[int] = []

    def __call__(self, spec: CheckSpec) -> CheckOutcome:
        self.runs.append(self._clock.now)
        return CheckOutcome(self._outcomes.pop(0))


def tracker_for(
    policy: HealthPolicy,
    clock: ManualClock,
    tasks: dict[str, TaskState],
    run: Callable[[CheckSpec], CheckOutcome] | None = None,
) -> tuple[HealthTracker, list[tuple[str, int]]]:
    verdicts: list[tuple[str, int]] = []
    spec = CheckSpec(key="web/alive", type="http", interval_ns=5 * S, timeout_ns=S, port=1)
    tracker = HealthTracker(
        policy,
        [spec],
        clock=clock,
        tasks=lambda: tasks,
        on_health=lambda health, ts, _reason: verdicts.append((health, ts)),
        log_fields={"alloc_id": "a1"},
        run=run or ScriptedCheck(clock, []),
    )
    return tracker, verdicts


def test_tracker__failing_check__resets_the_streak_then_healthy() -> None:
    clock = ManualClock(T0)
    tasks = {"a": running(0)}
    run = ScriptedCheck(clock, [True, True, False, True, True, True, True])
    tracker, verdicts = tracker_for(CHECKED, clock, tasks, run)

    for _ in range(10):
        delay = tracker.tick()
        if delay is None:
            break
        clock.now += 5 * S

    # Passes at 0 and 5, fails at 10, passes again from 15: healthy at 15 + 10.
    assert run.runs == [T0 + i * 5 * S for i in range(6)]
    assert verdicts == [("healthy", T0 + 25 * S)]
    assert tracker.done and tracker.tick() is None


def test_tracker__check_that_raises__counts_as_failing() -> None:
    clock = ManualClock(T0)

    def broken(spec: CheckSpec) -> CheckOutcome:
        raise RuntimeError("boom")

    tracker, verdicts = tracker_for(CHECKED, clock, {"a": running(0)}, broken)
    assert tracker.tick() is not None
    clock.now += 60 * S
    assert tracker.tick() is None
    assert verdicts == [("unhealthy", T0 + 60 * S)]


def test_tracker__check_not_due__not_run_again_and_waits_for_it() -> None:
    clock = ManualClock(T0)
    run = ScriptedCheck(clock, [False, False])
    tracker, verdicts = tracker_for(CHECKED, clock, {"a": running(0)}, run)

    assert tracker.tick() == pytest.approx(1.0)  # the check is due in 5 s; look at least every second
    clock.now += 2 * S
    tracker.tick()
    clock.now += 3 * S
    tracker.tick()

    assert run.runs == [T0, T0 + 5 * S]
    assert verdicts == []


def test_tracker__streaks_from_the_check_watcher__run_nothing__pass_counted_from_tracking() -> None:
    """With the watcher's results, the tracker runs no check itself; a check that passed
    before the deployment began counts from when tracking began; a failure resets it."""
    clock = ManualClock(T0)
    watcher: dict[str, CheckStatus] = {
        "web/alive": CheckStatus("", "web", "alive", "passing", "", T0 - 100 * S)
    }
    verdicts: list[tuple[str, int]] = []
    run = ScriptedCheck(clock, [])
    spec = CheckSpec(key="web/alive", type="http", interval_ns=5 * S, timeout_ns=S, port=1)
    tracker = HealthTracker(
        CHECKED,
        [spec],
        clock=clock,
        tasks=lambda: {"a": running(-200)},
        on_health=lambda health, ts, _reason: verdicts.append((health, ts)),
        log_fields={},
        run=run,
        streaks=lambda: streaks_of(watcher),
    )
    assert tracker.tick() == pytest.approx(1.0)
    clock.now = T0 + 5 * S
    watcher["web/alive"] = CheckStatus("", "web", "alive", "critical", "refused", T0 + 5 * S)
    tracker.tick()
    clock.now = T0 + 12 * S
    watcher["web/alive"] = CheckStatus("", "web", "alive", "passing", "", T0 + 12 * S)
    tracker.tick()
    clock.now = T0 + 21 * S
    assert tracker.tick() is not None and verdicts == []  # 9 s of the 10 s passing
    clock.now = T0 + 22 * S
    assert tracker.tick() is None
    assert verdicts == [("healthy", T0 + 22 * S)]
    assert run.runs == []  # the watcher ran the check, not the tracker


def test_tracker__task_states_mode__runs_no_check() -> None:
    clock = ManualClock(T0)
    run = ScriptedCheck(clock, [])
    tracker, verdicts = tracker_for(POLICY, clock, {"a": running(0)}, run)

    tracker.tick()
    clock.now += 10 * S
    tracker.tick()

    assert run.runs == []
    assert verdicts == [("healthy", T0 + 10 * S)]


def test_tracker__deadline_counts_from_when_tracking_began() -> None:
    clock = ManualClock(T0 + 100 * S)
    tracker, verdicts = tracker_for(POLICY, clock, {"a": PENDING})
    clock.now += 59 * S
    tracker.tick()
    assert verdicts == []
    clock.now += S
    tracker.tick()
    assert verdicts == [("unhealthy", T0 + 160 * S)]


def test_tracker__cancelled__never_reports() -> None:
    clock = ManualClock(T0)
    tracker, verdicts = tracker_for(POLICY, clock, {"a": FAILED})
    tracker.cancel()
    assert tracker.tick() is None
    assert verdicts == []


# ---------------------------------------------------------------------------------------
# The agent: the verdict reaches the servers in the alloc updates


@pytest.fixture
def server() -> Iterator[FakeServer]:
    with fake_server() as s:
        yield s


@pytest.fixture
def agent(tmp_path: Path, server: FakeServer) -> Iterator[ClientAgent]:
    a = ClientAgent(settings(tmp_path, server), tuning=FAST)
    a.start()
    try:
        assert a.wait_registered(10)
        yield a
    finally:
        a.stop(timeout_s=10)


def reported_health(server: FakeServer, alloc_id: str) -> list[structs_pb2.AllocDeploymentStatus]:
    return [
        u.deployment_status for u in server.nodes.updates_for(alloc_id) if u.HasField("deployment_status")
    ]


def test_agent__running_task__reported_healthy_with_the_canary_flag(
    server: FakeServer, agent: ClientAgent
) -> None:
    j = deployed_job(min_healthy_time_ns=S // 2, healthy_deadline_ns=30 * S)
    a = deployed_alloc(j)
    a.node_id = agent.node_id
    a.deployment_status.canary = True
    server.nodes.place(a, j)

    statuses = wait_until(lambda: reported_health(server, "a1"), 15, "a deployment_status for a1")

    assert statuses[0].health == "healthy"
    assert statuses[0].canary
    judged = {u.deployment_id for u in server.nodes.updates_for("a1") if u.HasField("deployment_status")}
    assert judged == {"d1"}
    first_running = min(
        u.task_states["main"].started_at_ns
        for u in server.nodes.updates_for("a1")
        if u.task_states["main"].started_at_ns
    )
    assert statuses[0].timestamp_ns >= first_running + S // 2


def test_agent__failing_task__reported_unhealthy(server: FakeServer, agent: ClientAgent) -> None:
    j = deployed_job(min_healthy_time_ns=10 * S, healthy_deadline_ns=30 * S)
    j.groups[0].tasks[0].CopyFrom(task(config='{"run_for": "200ms", "exit_code": 1}'))
    j.groups[0].restart.CopyFrom(structs_pb2.RestartPolicy(attempts=0, interval_ns=60 * S, mode="fail"))
    a = deployed_alloc(j)
    a.node_id = agent.node_id
    server.nodes.place(a, j)

    statuses = wait_until(lambda: reported_health(server, "a1"), 15, "a deployment_status for a1")

    assert [s.health for s in statuses][:1] == ["unhealthy"]
    assert not statuses[0].canary


def test_agent__manual_health_check__client_never_watches(server: FakeServer, agent: ClientAgent) -> None:
    j = deployed_job(min_healthy_time_ns=0, healthy_deadline_ns=30 * S, health_check="manual")
    a = deployed_alloc(j)
    a.node_id = agent.node_id
    server.nodes.place(a, j)

    wait_until(lambda: server.nodes.client_status("a1") == "running", 15, "a1 running")
    runner = agent.runner("a1")
    assert runner is not None
    assert runner.health_watched_deployment == ""
    assert reported_health(server, "a1") == []


def test_agent__in_place_update_into_a_new_deployment__decided_again(
    server: FakeServer, agent: ClientAgent
) -> None:
    j = deployed_job(min_healthy_time_ns=S // 5, healthy_deadline_ns=30 * S)
    a = deployed_alloc(j, "d1")
    a.node_id = agent.node_id
    server.nodes.place(a, j)
    runner = wait_until(lambda: agent.runner("a1"), 15, "a runner for a1")
    first = wait_until(lambda: runner.deployment_health, 15, "a verdict for d1")
    assert (first.deployment_id, first.health) == ("d1", "healthy")

    moved = deployed_alloc(j, "d2")
    moved.node_id = agent.node_id
    server.nodes.place(moved, j)  # a new alloc_modify_index: the client takes the newer copy

    second = wait_until(
        lambda: (v := runner.deployment_health) is not None and v.deployment_id == "d2" and v,
        15,
        "a verdict for d2",
    )
    assert second.health == "healthy"
    assert second.timestamp_ns > first.timestamp_ns


def test_agent__restarted_on_the_same_data_dir__does_not_decide_again(
    tmp_path: Path, server: FakeServer
) -> None:
    j = deployed_job(min_healthy_time_ns=S // 5, healthy_deadline_ns=30 * S)
    first = ClientAgent(settings(tmp_path, server), tuning=FAST)
    first.start()
    try:
        assert first.wait_registered(10)
        a = deployed_alloc(j)
        a.node_id = first.node_id
        server.nodes.place(a, j)
        runner = wait_until(lambda: first.runner("a1"), 15, "a runner for a1")
        verdict = wait_until(lambda: runner.deployment_health, 15, "a verdict for d1")
    finally:
        first.stop(leave_tasks_running=True, timeout_s=10)

    second = ClientAgent(settings(tmp_path, server), tuning=FAST)
    second.start()
    try:
        restored = second.runner("a1")
        assert restored is not None
        assert restored.deployment_health == verdict
        assert restored.health_watched_deployment == ""
    finally:
        second.stop(timeout_s=10)


def test_agent__servers_verdict_first__tracker_stops_and_the_verdict_is_theirs(
    server: FakeServer, agent: ClientAgent
) -> None:
    j = deployed_job(min_healthy_time_ns=20 * S, healthy_deadline_ns=30 * S)
    a = deployed_alloc(j)
    a.node_id = agent.node_id
    server.nodes.place(a, j)
    runner = wait_until(lambda: agent.runner("a1"), 15, "a runner for a1")
    wait_until(lambda: runner.health_watched_deployment == "d1", 15, "a tracker on d1")

    marked = deployed_alloc(j)
    marked.node_id = agent.node_id
    marked.deployment_status.health = "unhealthy"  # an operator's `deployment alloc-health`
    marked.deployment_status.timestamp_ns = 7
    server.nodes.place(marked, j)

    wait_until(lambda: runner.health_watched_deployment == "", 15, "the tracker to stop")
    assert runner.deployment_health == DeploymentHealth("d1", "unhealthy", 7)


def test_agent__late_verdict_of_a_replaced_tracker__not_taken_for_the_new_deployment(
    server: FakeServer, agent: ClientAgent, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A tracker can finish its last look after an in-place update replaced it: its word is
    on the old deployment and must not become the new one's."""
    reporters: dict[str, Callable[[str, int, str], None]] = {}

    class RecordingTracker(HealthTracker):
        def __init__(self, policy: HealthPolicy, specs: Sequence[CheckSpec], **kwargs: Any) -> None:
            reporters[policy.deployment_id] = kwargs["on_health"]
            super().__init__(policy, specs, **kwargs)

    monkeypatch.setattr(alloc_runner, "HealthTracker", RecordingTracker)
    j = deployed_job(min_healthy_time_ns=20 * S, healthy_deadline_ns=30 * S)
    a = deployed_alloc(j, "d1")
    a.node_id = agent.node_id
    server.nodes.place(a, j)
    runner = wait_until(lambda: agent.runner("a1"), 15, "a runner for a1")
    wait_until(lambda: runner.health_watched_deployment == "d1", 15, "a tracker on d1")
    moved = deployed_alloc(j, "d2")
    moved.node_id = agent.node_id
    server.nodes.place(moved, j)
    wait_until(lambda: runner.health_watched_deployment == "d2", 15, "a tracker on d2")

    reporters["d1"]("unhealthy", 7, "d1's last look, ended after d2's tracker started")

    assert runner.deployment_health is None
    assert runner.health_watched_deployment == "d2"
