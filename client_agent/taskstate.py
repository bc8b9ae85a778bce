"""Task states and the alloc client status derived from them: plain values, pure functions.

A task is ``pending`` until its driver started it, ``running`` while it runs, and ``dead``
for good once it will not be started again (``failed`` says whether that is a failure).
Between a restartable exit and the restart it is ``pending`` again.

The alloc's client status is a function of all its task states together (Nomad's
``getClientStatus``): any failed task fails the alloc; otherwise any running task makes
it running; otherwise any pending task keeps it pending; all dead and none failed is
complete. It is recomputed from a consistent snapshot of every task, never patched
incrementally, so a report never mixes two moments.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from drover.client.checks import CheckStatus
    from drover.client.health import DeploymentHealth

__all__ = [
    "CLIENT_COMPLETE",
    "CLIENT_FAILED",
    "CLIENT_PENDING",
    "CLIENT_RUNNING",
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
    "AllocStatus",
    "TaskEvent",
    "TaskState",
    "alloc_status",
    "is_terminal_client_status",
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

CLIENT_PENDING: Final = "pending"
CLIENT_RUNNING: Final = "running"
CLIENT_COMPLETE: Final = "complete"
CLIENT_FAILED: Final = "failed"
_TERMINAL_CLIENT: Final = frozenset({CLIENT_COMPLETE, CLIENT_FAILED, "lost"})


def is_terminal_client_status(status: str) -> bool:
    return status in _TERMINAL_CLIENT


@dataclass(frozen=True, slots=True)
class TaskEvent:
    type: str
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


@dataclass(frozen=True, slots=True)
class AllocStatus:
    """What the client reports for one alloc: the status and the task states it came from,
    its deployment health once the client decided it (client_agent/health.py), and its
    checks' latest statuses (client_agent/checkwatch.py)."""

    alloc_id: str
    client_status: str
    description: str
    task_states: Mapping[str, TaskState]
    deployment_health: DeploymentHealth | None = None
    checks: tuple[CheckStatus, ...] = ()


def alloc_status(alloc_id: str, states: Mapping[str, TaskState]) -> AllocStatus:
    """The alloc's client status from all of its task states at one moment."""
    failed = [name for name, s in states.items() if s.is_dead and s.failed]
    if failed:
        status, why = CLIENT_FAILED, f"Failed tasks: {', '.join(sorted(failed))}"
    elif any(s.state == TASK_RUNNING for s in states.values()):
        status, why = CLIENT_RUNNING, "Tasks are running"
    elif any(s.state == TASK_PENDING for s in states.values()) or not states:
        status, why = CLIENT_PENDING, "Tasks are pending"
    else:
        status, why = CLIENT_COMPLETE, "All tasks have completed"
    return AllocStatus(alloc_id, status, why, dict(states))
