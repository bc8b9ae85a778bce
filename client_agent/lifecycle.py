"""When each task of an alloc may start and when the rest must be stopped (pure).

Nomad's ordering (client/allocrunner/task_hook_coordinator.go and the alloc runner's
``handleTaskStateUpdates``), as a function of the task states at one moment:

- ``prestart`` tasks start at once. Main tasks (no lifecycle block) start once every
  prestart sidecar has started and every ephemeral (non-sidecar) prestart task has
  *completed successfully*: a failed one never lets them start.
- ``poststart`` tasks start once every main task has started.
- ``poststop`` tasks start once every other task is dead.
- Among the tasks that are not poststop: when one of them died failed (after its restart
  policy gave up), or the ``leader`` died, or every task still alive is a sidecar (the
  main work is done), every task still alive is stopped. Tasks that never started are
  stopped too, so they end dead ("stopped before it started") instead of pending forever.

Stopping is ordered too (Nomad's ``allocRunner.killTasks``): of the tasks to stop, the
leader first; once it is dead, every other task that is not a sidecar (the main tasks and
the ephemeral prestart/poststart ones); once those are dead, the sidecars; the poststop
tasks are not stopped, they start once the rest is dead. ``stop_wave`` says which of those
to stop now, so a main task still has its sidecar (a proxy, a log shipper) while it shuts
down, as it had while it ran.

The alloc runner (client_agent/runner.py) calls ``plan_steps`` and ``stop_wave`` after
every task change and does what they say; starting a task twice or stopping a dead one is
a no-op there, so the plan only has to be right, not minimal.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Final

from drover.common.taskstate import TASK_DEAD, TaskState
from drover.v1 import structs_pb2

__all__ = [
    "KILL_LEADER_DEAD",
    "KILL_MAIN_DEAD",
    "KILL_SIBLING_FAILED",
    "Steps",
    "TaskRole",
    "plan_steps",
    "roles_of",
    "stop_wave",
]

HOOK_MAIN: Final = ""
HOOK_PRESTART: Final = "prestart"
HOOK_POSTSTART: Final = "poststart"
HOOK_POSTSTOP: Final = "poststop"

# Nomad's task event types for why a task was stopped by its siblings.
KILL_LEADER_DEAD: Final = "Leader Task Dead"
KILL_MAIN_DEAD: Final = "Main Tasks Dead"
KILL_SIBLING_FAILED: Final = "Sibling Task Failed"


@dataclass(frozen=True, slots=True)
class TaskRole:
    name: str
    hook: str = HOOK_MAIN
    sidecar: bool = False
    leader: bool = False


@dataclass(frozen=True, slots=True)
class Steps:
    """Tasks to start now, tasks to stop now, and the event type that says why they stop
    (one of the ``KILL_*`` names; "" when ``stop`` is empty)."""

    start: tuple[str, ...] = ()
    stop: tuple[str, ...] = ()
    stop_reason: str = ""
    stop_message: str = ""


def roles_of(tasks: Iterable[structs_pb2.Task]) -> tuple[TaskRole, ...]:
    return tuple(
        TaskRole(
            name=t.name,
            hook=t.lifecycle.hook if t.HasField("lifecycle") else HOOK_MAIN,
            sidecar=t.HasField("lifecycle") and t.lifecycle.sidecar,
            leader=t.leader,
        )
        for t in tasks
    )


def _started(state: TaskState | None) -> bool:
    return state is not None and state.started_at_ns > 0


def _dead(state: TaskState | None) -> bool:
    return state is not None and state.state == TASK_DEAD


def _succeeded(state: TaskState | None) -> bool:
    return _dead(state) and state is not None and not state.failed


def plan_steps(roles: Iterable[TaskRole], states: Mapping[str, TaskState], *, stopping: bool) -> Steps:
    """What to do now. ``stopping``: the alloc is being stopped (the servers asked): no
    task but the poststop ones may start, and those only once the others are dead."""
    roles = tuple(roles)
    by_hook: dict[str, list[TaskRole]] = {}
    for role in roles:
        by_hook.setdefault(role.hook, []).append(role)
    prestart = by_hook.get(HOOK_PRESTART, [])
    main = by_hook.get(HOOK_MAIN, [])
    not_poststop = [r for r in roles if r.hook != HOOK_POSTSTOP]

    stop, reason, message = _stop_decision(not_poststop, states)
    start: list[str] = []
    if not stopping and not stop:
        start += [r.name for r in prestart]
        prestart_done = all(
            _started(states.get(r.name)) if r.sidecar else _succeeded(states.get(r.name)) for r in prestart
        )
        if prestart_done:
            start += [r.name for r in main]
            if all(_started(states.get(r.name)) for r in main):
                start += [r.name for r in by_hook.get(HOOK_POSTSTART, [])]
    if all(_dead(states.get(r.name)) for r in not_poststop):
        start += [r.name for r in by_hook.get(HOOK_POSTSTOP, [])]
    return Steps(tuple(start), stop, reason if stop else "", message if stop else "")


def _stop_decision(
    roles: list[TaskRole], states: Mapping[str, TaskState]
) -> tuple[tuple[str, ...], str, str]:
    alive = [r for r in roles if not _dead(states.get(r.name))]
    if not alive:
        return (), "", ""
    failed = sorted(r.name for r in roles if _dead(states.get(r.name)) and states[r.name].failed)
    leader = next((r.name for r in roles if r.leader and _dead(states.get(r.name))), None)
    names = tuple(r.name for r in alive)
    if leader is not None:
        return names, KILL_LEADER_DEAD, f"Leader Task {leader!r} is dead"
    if failed:
        return names, KILL_SIBLING_FAILED, f"Task's sibling {failed[0]!r} failed"
    if all(r.sidecar for r in alive):
        return names, KILL_MAIN_DEAD, "Main tasks in the group died"
    return (), "", ""


def stop_wave(
    roles: Iterable[TaskRole], states: Mapping[str, TaskState], to_stop: Iterable[str]
) -> tuple[str, ...]:
    """The tasks of ``to_stop`` to stop now, in role order: the live leaders; when none is
    left alive, the live tasks that are neither sidecars nor poststop; then the live
    sidecars. Poststop tasks are never in a wave (they run after the others). Tasks that
    never started count as alive: stopping them is what ends them."""
    wanted = set(to_stop)
    alive = [
        r for r in roles if r.name in wanted and r.hook != HOOK_POSTSTOP and not _dead(states.get(r.name))
    ]
    for wave in (
        [r for r in alive if r.leader],
        [r for r in alive if not r.sidecar],
        alive,
    ):
        if wave:
            return tuple(r.name for r in wave)
    return ()
