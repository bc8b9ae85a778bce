"""The ``mock`` driver: a task that is only a timer, for tests and demos (Nomad's mock_driver).

Config keys:

- ``run_for``: how long the task runs ("30s", "250ms", or a number of seconds). Left out,
  the task runs until it is stopped.
- ``exit_code``: the code it exits with once ``run_for`` has passed (default 0).
- ``start_error``: if set, starting fails with this message (a task failure).

The handle holds no thread: it is a deadline on the wall clock, so a restarted agent
recovers it from its state (``started_at_ns``, ``run_for_ns``) with the time left.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from pathlib import Path
from signal import SIGTERM
from typing import Any, Final

from drover.client.clock import Clock, SystemClock
from drover.client.drivers._duration import parse_duration_ns
from drover.client.drivers.base import ExitResult, TaskSpec
from drover.client.errors import DriverConfigError, TaskStartError

__all__ = ["MockConfig", "MockDriver", "MockHandle", "parse_mock_config"]

NAME: Final = "mock"
_KEYS: Final = frozenset({"run_for", "exit_code", "start_error"})
# run_for_ns of a task that runs until stopped.
FOREVER: Final = -1


class MockConfig:
    __slots__ = ("exit_code", "run_for_ns", "start_error")

    def __init__(self, run_for_ns: int, exit_code: int, start_error: str) -> None:
        self.run_for_ns = run_for_ns
        self.exit_code = exit_code
        self.start_error = start_error


def parse_mock_config(config: Mapping[str, Any], task_name: str) -> MockConfig:
    unknown = sorted(set(config) - _KEYS)
    if unknown:
        raise DriverConfigError(
            f"task {task_name!r}: unknown mock config key(s) {', '.join(unknown)} "
            f"(known: {', '.join(sorted(_KEYS))})"
        )
    run_for = FOREVER
    if config.get("run_for") is not None:
        run_for = parse_duration_ns(config["run_for"], f"task {task_name!r}: config.run_for")
    exit_code = config.get("exit_code", 0)
    if isinstance(exit_code, bool) or not isinstance(exit_code, int):
        raise DriverConfigError(
            f"task {task_name!r}: config.exit_code: expected an integer, got {exit_code!r}"
        )
    start_error = config.get("start_error", "")
    if not isinstance(start_error, str):
        raise DriverConfigError(f"task {task_name!r}: config.start_error: expected a string")
    return MockConfig(run_for, exit_code, start_error)


class MockHandle:
    def __init__(self, clock: Clock, started_at_ns: int, run_for_ns: int, exit_code: int) -> None:
        self._clock = clock
        self._started_at_ns = started_at_ns
        self._run_for_ns = run_for_ns
        self._exit_code = exit_code
        self._stopped = threading.Event()
        # What ``signal`` was sent, in order: a mock task has no process to hear it.
        self.signals: list[int] = []

    @property
    def pid(self) -> int:
        return 0

    def state(self) -> dict[str, Any]:
        return {
            "driver": NAME,
            "started_at_ns": self._started_at_ns,
            "run_for_ns": self._run_for_ns,
            "exit_code": self._exit_code,
        }

    def _remaining_s(self) -> float | None:
        if self._run_for_ns == FOREVER:
            return None
        return max(0.0, (self._started_at_ns + self._run_for_ns - self._clock.now_ns()) / 1e9)

    def wait(self, timeout_s: float) -> ExitResult | None:
        if self._stopped.is_set():
            return ExitResult(0, message="stopped")
        remaining = self._remaining_s()
        if remaining is not None and remaining <= 0:
            return ExitResult(self._exit_code)
        if self._stopped.wait(timeout_s if remaining is None else min(timeout_s, remaining)):
            return ExitResult(0, message="stopped")
        remaining = self._remaining_s()
        if remaining is not None and remaining <= 0:
            return ExitResult(self._exit_code)
        return None

    def signal(self, signum: int) -> None:
        self.signals.append(signum)

    def stop(self, timeout_s: float, signum: int = SIGTERM) -> ExitResult:
        self._stopped.set()
        return ExitResult(0, message="stopped")


class MockDriver:
    name = NAME

    def __init__(self, clock: Clock | None = None) -> None:
        self._clock: Clock = clock or SystemClock()

    def start(self, task: TaskSpec, task_dir: Path) -> MockHandle:
        cfg = parse_mock_config(task.config, task.name)
        if cfg.start_error:
            raise TaskStartError(cfg.start_error)
        return MockHandle(self._clock, self._clock.now_ns(), cfg.run_for_ns, cfg.exit_code)

    def recover(self, state: Mapping[str, Any]) -> MockHandle | None:
        try:
            return MockHandle(
                self._clock, int(state["started_at_ns"]), int(state["run_for_ns"]), int(state["exit_code"])
            )
        except (KeyError, TypeError, ValueError):
            return None
