"""The driver seam: what the task runner needs from a driver, and nothing else.

A driver starts a task and returns a handle; the task runner polls the handle
(``wait(timeout)``), asks it to ``stop(timeout)``, and persists ``handle.state()`` so that
a restarted agent can ``recover(state)`` the same running task instead of starting a new
one. ``recover`` returns None when the task is gone (or the state names another process):
the runner then treats the task as exited with an unknown code.
"""

from __future__ import annotations

import json
import signal
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from signal import SIGTERM
from typing import Any, Protocol, runtime_checkable

from drover.client.errors import DriverConfigError

__all__ = ["Driver", "ExitResult", "SignalableHandle", "TaskHandle", "TaskSpec", "parse_config_json"]


@dataclass(frozen=True, slots=True)
class TaskSpec:
    """One task of one alloc, as a driver sees it."""

    alloc_id: str
    name: str
    driver: str
    config: Mapping[str, Any] = field(default_factory=dict)
    env: Mapping[str, str] = field(default_factory=dict)
    kill_timeout_ns: int = 5_000_000_000
    job_id: str = ""
    group: str = ""
    # What a stop sends first (the job's kill_signal), and how long it waits before that.
    kill_signal: int = signal.SIGTERM
    shutdown_delay_ns: int = 0
    # The OS user to run as ("": the agent's own); a driver that cannot refuses at start.
    user: str = ""


@dataclass(frozen=True, slots=True)
class ExitResult:
    """How a task ended. ``exit_code`` None: unknown (a re-attached process we cannot reap)."""

    exit_code: int | None
    signal: int = 0
    message: str = ""

    @property
    def successful(self) -> bool:
        return self.exit_code == 0 and self.signal == 0


class TaskHandle(Protocol):
    @property
    def pid(self) -> int:
        """The OS process ID, or 0 when the task is not a process."""
        ...

    def state(self) -> dict[str, Any]:
        """JSON-able data that lets ``Driver.recover`` find this task again."""
        ...

    def wait(self, timeout_s: float) -> ExitResult | None:
        """The exit once the task has ended, or None if it still runs after ``timeout_s``."""
        ...

    def stop(self, timeout_s: float, signum: int = SIGTERM) -> ExitResult:
        """Ask the task to end (``signum``), force it after ``timeout_s``, and return how it ended."""
        ...


@runtime_checkable
class SignalableHandle(Protocol):
    """A handle that can pass an operator's signal to its task (``alloc signal``); a
    driver whose tasks take no signals leaves it out, and the signal is refused."""

    def signal(self, signum: int) -> None:
        """Send ``signum`` to the task; a task that already ended is not an error."""
        ...


class Driver(Protocol):
    name: str

    def start(self, task: TaskSpec, task_dir: Path) -> TaskHandle:
        """Start ``task`` with ``task_dir`` as its working directory; raises TaskStartError."""
        ...

    def recover(self, state: Mapping[str, Any]) -> TaskHandle | None:
        """The task a previous handle's ``state()`` described, if it is still that task."""
        ...


def parse_config_json(text: str, task_name: str) -> dict[str, Any]:
    """A task's ``config_json`` as a dict ("" is an empty config)."""
    if not text.strip():
        return {}
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise DriverConfigError(f"task {task_name!r}: config is not valid JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise DriverConfigError(f"task {task_name!r}: config must be a JSON object")
    return value
