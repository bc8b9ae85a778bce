"""A task's state and events: the one record the client agent keeps and reports and the
servers store inside each alloc (``drover.scheduler.structs.Allocation.task_states``).

A task is ``pending`` until its driver started it, ``running`` while it runs, and ``dead``
for good once it will not be started again (``failed`` says whether that is a failure).
Between a restartable exit and the restart it is ``pending`` again.

Plain values and pure methods (the time is passed in): the scheduler, the functional core,
may import this module and no other of ``drover.common`` (tests/unit/test_purity.py checks
it under the scheduler's own rules), so both ends of the wire share one definition.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, Final

__all__ = [
    "EVENT_DRIVER_FAILURE",
    "EVENT_KILLED",
    "EVENT_KILLING",
    "EVENT_NOT_RESTARTING",
    "EVENT_RECEIVED",
    "EVENT_RECONNECTED",
    "EVENT_RESTARTING",
    "EVENT_RESTART_SIGNALED",
    "EVENT_SIGNALING",
    "EVENT_STARTED",
    "EVENT_TERMINATED",
    "MAX_EVENTS",
    "TASK_DEAD",
    "TASK_PENDING",
    "TASK_RUNNING",
    "TaskEvent",
    "TaskState",
]

TASK_PENDING: Final = "pending"
TASK_RUNNING: Final = "running"
TASK_DEAD: Final = "dead"

# Event types, spelled as Nomad's task events.
EVENT_RECEIVED: Final = "Received"
EVENT_STARTED: Final = "Started"
EVENT_TERMINATED: Final = "Terminated"
EVENT_KILLING: Final = "Killing"
EVENT_KILLED: Final = "Killed"
EVENT_RESTARTING: Final = "Restarting"
EVENT_NOT_RESTARTING: Final = "Not Restarting"
EVENT_DRIVER_FAILURE: Final = "Driver Failure"
# An operator's `alloc restart` / `alloc signal` (Nomad's TaskRestartSignal, TaskSignaling).
EVENT_RESTART_SIGNALED: Final = "Restart Signaled"
EVENT_SIGNALING: Final = "Signaling"
EVENT_RECONNECTED: Final = "Reconnected"

# Nomad keeps the last 10 events per task: enough to explain the current state, small
# enough that every status update can carry them all.
MAX_EVENTS: Final = 10


@dataclass(frozen=True, slots=True)
class TaskEvent:
    type: str = ""
    message: str = ""
    time_ns: int = 0
    exit_code: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "type": self.type,
            "message": self.message,
            "time_ns": self.time_ns,
            "exit_code": self.exit_code,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TaskEvent:
        return cls(
            type=str(data["type"]),
            message=str(data.get("message", "")),
            time_ns=int(data.get("time_ns", 0)),
            exit_code=int(data.get("exit_code", 0)),
        )


@dataclass(frozen=True, slots=True)
class TaskState:
    state: str = TASK_PENDING
    failed: bool = False
    restarts: int = 0
    started_at_ns: int = 0
    finished_at_ns: int = 0
    events: tuple[TaskEvent, ...] = ()
    pid: int = 0

    def with_event(self, event: TaskEvent) -> TaskState:
        return replace(self, events=(*self.events, event)[-MAX_EVENTS:])

    def started(self, now_ns: int, pid: int, message: str = "Task started by client") -> TaskState:
        return replace(
            self.with_event(TaskEvent(EVENT_STARTED, message, now_ns)),
            state=TASK_RUNNING,
            started_at_ns=now_ns,
            finished_at_ns=0,
            pid=pid,
        )

    def dead(self, now_ns: int, *, failed: bool) -> TaskState:
        return replace(self, state=TASK_DEAD, failed=failed, finished_at_ns=now_ns, pid=0)

    def restarting(self, now_ns: int, delay_ns: int, reason: str) -> TaskState:
        event = TaskEvent(EVENT_RESTARTING, f"{reason}; restarting in {delay_ns / 1e9:g}s", now_ns)
        return replace(self.with_event(event), state=TASK_PENDING, pid=0, restarts=self.restarts + 1)

    @property
    def is_dead(self) -> bool:
        return self.state == TASK_DEAD

    def to_dict(self) -> dict[str, Any]:
        return {
            "state": self.state,
            "failed": self.failed,
            "restarts": self.restarts,
            "started_at_ns": self.started_at_ns,
            "finished_at_ns": self.finished_at_ns,
            "events": [e.to_dict() for e in self.events],
            "pid": self.pid,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TaskState:
        return cls(
            state=str(data.get("state", TASK_PENDING)),
            failed=bool(data.get("failed", False)),
            restarts=int(data.get("restarts", 0)),
            started_at_ns=int(data.get("started_at_ns", 0)),
            finished_at_ns=int(data.get("finished_at_ns", 0)),
            events=tuple(TaskEvent.from_dict(e) for e in data.get("events", ())),
            pid=int(data.get("pid", 0)),
        )
