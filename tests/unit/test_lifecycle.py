"""drover.client.lifecycle.plan_steps: task order and sibling stops, as Nomad decides them (pure)."""

from __future__ import annotations

from drover.client.lifecycle import (
    KILL_LEADER_DEAD,
    KILL_MAIN_DEAD,
    KILL_SIBLING_FAILED,
    Steps,
    TaskRole,
    plan_steps,
    roles_of,
    stop_wave,
)
from drover.common.taskstate import TaskState
from drover.v1 import structs_pb2

PENDING = TaskState()
RUNNING = TaskState().started(1, 10)
DONE = RUNNING.dead(2, failed=False)
FAILED = RUNNING.dead(2, failed=True)
# Restarting after an exit: pending again, but it did start once.
RESTARTING = RUNNING.restarting(3, 0, "restart")

INIT = TaskRole("init", "prestart")
PROXY = TaskRole("proxy", "prestart", sidecar=True)
MAIN = TaskRole("main")
OTHER = TaskRole("other")
ANNOUNCE = TaskRole("announce", "poststart")
LOGS = TaskRole("logs", "poststart", sidecar=True)
CLEANUP = TaskRole("cleanup", "poststop")
ALL = (INIT, PROXY, MAIN, ANNOUNCE, LOGS, CLEANUP)


def plan(roles: tuple[TaskRole, ...], stopping: bool = False, **states: TaskState) -> Steps:
    return plan_steps(roles, states, stopping=stopping)


def test_at_first_only_prestart_tasks_start() -> None:
    assert plan(ALL).start == ("init", "proxy")


def test_main_waits_for_the_ephemeral_prestart_to_succeed_and_the_sidecar_to_start() -> None:
    assert "main" not in plan(ALL, init=RUNNING, proxy=RUNNING).start
    assert "main" not in plan(ALL, init=DONE, proxy=PENDING).start
    assert "main" in plan(ALL, init=DONE, proxy=RUNNING).start


def test_a_failed_ephemeral_prestart_never_lets_main_start_and_stops_the_rest() -> None:
    steps = plan(ALL, init=FAILED, proxy=RUNNING)
    assert "main" not in steps.start
    assert set(steps.stop) == {"proxy", "main", "announce", "logs"}
    assert steps.stop_reason == KILL_SIBLING_FAILED


def test_poststart_waits_for_every_main_task_to_have_started() -> None:
    roles = (MAIN, OTHER, ANNOUNCE)
    assert "announce" not in plan(roles, main=RUNNING, other=PENDING).start
    assert "announce" in plan(roles, main=RUNNING, other=RUNNING).start
    # A main task that already ran to completion did start.
    assert "announce" in plan(roles, main=DONE, other=RESTARTING).start


def test_poststop_waits_for_every_other_task_to_be_dead() -> None:
    roles = (MAIN, LOGS, CLEANUP)
    assert "cleanup" not in plan(roles, main=DONE, logs=RUNNING).start
    assert "cleanup" in plan(roles, main=DONE, logs=DONE).start


def test_only_sidecars_left_alive__they_are_stopped() -> None:
    steps = plan(ALL, init=DONE, proxy=RUNNING, main=DONE, announce=DONE, logs=RUNNING)
    assert set(steps.stop) == {"proxy", "logs"}
    assert steps.stop_reason == KILL_MAIN_DEAD
    # ...but not while a non-sidecar poststart task still runs.
    assert plan(ALL, init=DONE, proxy=RUNNING, main=DONE, announce=RUNNING, logs=RUNNING).stop == ()


def test_a_finished_ephemeral_prestart_stops_nothing() -> None:
    assert plan(ALL, init=DONE, proxy=RUNNING, main=RUNNING).stop == ()


def test_the_leader_dying_stops_every_other_task_even_when_it_succeeded() -> None:
    leader = TaskRole("main", leader=True)
    steps = plan((leader, OTHER, CLEANUP), main=DONE, other=RUNNING)
    assert steps.stop == ("other",)
    assert steps.stop_reason == KILL_LEADER_DEAD
    assert "main" in steps.stop_message
    # The poststop task is not stopped: it runs once the others are dead.
    assert "cleanup" not in steps.stop and "cleanup" not in steps.start
    assert "cleanup" in plan((leader, OTHER, CLEANUP), main=DONE, other=DONE).start


def test_a_main_task_that_failed_stops_its_siblings() -> None:
    steps = plan((MAIN, OTHER), main=FAILED, other=RUNNING)
    assert steps == Steps(
        stop=("other",), stop_reason=KILL_SIBLING_FAILED, stop_message="Task's sibling 'main' failed"
    )


def test_while_stopping_nothing_new_starts_but_poststop_once_the_rest_is_dead() -> None:
    assert plan(ALL, stopping=True).start == ()
    dead = {"init": DONE, "proxy": DONE, "main": DONE, "announce": DONE, "logs": DONE}
    assert plan(ALL, stopping=True, **dead).start == ("cleanup",)


def test_plain_group_starts_every_task_at_once() -> None:
    assert plan((MAIN, OTHER)).start == ("main", "other")


def test_roles_of__reads_lifecycle_and_leader() -> None:
    tasks = [
        structs_pb2.Task(name="a", lifecycle=structs_pb2.TaskLifecycle(hook="prestart", sidecar=True)),
        structs_pb2.Task(name="b", leader=True),
    ]
    assert roles_of(tasks) == (TaskRole("a", "prestart", sidecar=True), TaskRole("b", "", leader=True))


def test_stop_wave__leader_then_main_tasks_then_sidecars_never_poststop() -> None:
    leader = TaskRole("main", leader=True)
    roles = (INIT, PROXY, leader, OTHER, ANNOUNCE, LOGS, CLEANUP)
    everything = [r.name for r in roles]
    live = {"init": DONE, "proxy": RUNNING, "main": RUNNING, "other": RUNNING, "announce": RUNNING}
    live |= {"logs": RUNNING}
    assert stop_wave(roles, live, everything) == ("main",)
    # Once the leader is dead: the tasks that are not sidecars (init is dead already).
    assert stop_wave(roles, live | {"main": DONE}, everything) == ("other", "announce")
    # Then the sidecars; a task that never started counts as alive (stopping ends it).
    after_main = live | {"main": DONE, "other": DONE, "announce": DONE, "logs": PENDING}
    assert stop_wave(roles, after_main, everything) == ("proxy", "logs")
    every_dead = dict.fromkeys(everything, DONE) | {"cleanup": PENDING}
    assert stop_wave(roles, every_dead, everything) == ()
    # Only what is asked: a sibling stop that names the sidecars alone stops them at once.
    assert stop_wave(roles, live, ["proxy", "logs"]) == ("proxy", "logs")
    assert stop_wave((MAIN, OTHER), {"main": RUNNING}, ["main", "other"]) == ("main", "other")
