"""The alloc client status derived from its task states: plain values, pure functions.

The task state and its events live in ``drover.common.taskstate``, the one record the
servers store too; this module holds only what the client derives from them.

The alloc's client status is a function of all its task states together (Nomad's
``getClientStatus``): any failed task fails the alloc; otherwise any running task makes
it running; otherwise any pending task keeps it pending; all dead and none failed is
complete. It is recomputed from a consistent snapshot of every task, never patched
incrementally, so a report never mixes two moments.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from drover.common.taskstate import TASK_PENDING, TASK_RUNNING, TaskState

if TYPE_CHECKING:
    from drover.client.checks import CheckStatus
    from drover.client.health import DeploymentHealth

__all__ = [
    "CLIENT_COMPLETE",
    "CLIENT_FAILED",
    "CLIENT_PENDING",
    "CLIENT_RUNNING",
    "AllocStatus",
    "alloc_status",
    "is_terminal_client_status",
]

CLIENT_PENDING: Final = "pending"
CLIENT_RUNNING: Final = "running"
CLIENT_COMPLETE: Final = "complete"
CLIENT_FAILED: Final = "failed"
_TERMINAL_CLIENT: Final = frozenset({CLIENT_COMPLETE, CLIENT_FAILED, "lost"})


def is_terminal_client_status(status: str) -> bool:
    return status in _TERMINAL_CLIENT


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
