"""Task drivers: the mock timer, and raw_exec with real processes (every one killed after)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from drover.client.drivers import ExitResult, MockDriver, RawExecDriver, TaskHandle, TaskSpec
from drover.client.errors import DriverConfigError, TaskStartError
from tests.fixtures.clock import ManualClock
from tests.unit.test_client_fake_server import alive, wait_until

S = 1_000_000_000


def spec(
    driver: str, config: dict[str, object], *, kill_timeout_ns: int = 5 * S, name: str = "t"
) -> TaskSpec:
    return TaskSpec(
        alloc_id="alloc-1", name=name, driver=driver, config=config, kill_timeout_ns=kill_timeout_ns
    )


def wait_exit(handle: TaskHandle, timeout: float = 10.0) -> ExitResult:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = handle.wait(0.1)
        if result is not None:
            return result
    raise AssertionError("task did not exit in time")


@pytest.fixture
def foreign_sleep() -> Iterator[subprocess.Popen[bytes]]:
    """A ``sleep 30`` the driver did not start, in its own session (like a task left by an
    agent that has since restarted): killed and waited for afterwards."""
    proc = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait(5)


# --- mock -------------------------------------------------------------------------------------


def test_mock__run_for__exits_with_exit_code_when_time_is_up(tmp_path: Path) -> None:
    clock = ManualClock(1_000 * S)
    handle = MockDriver(clock).start(spec("mock", {"run_for": "30s", "exit_code": 3}), tmp_path)
    assert handle.wait(0) is None
    clock.now += 29 * S
    assert handle.wait(0) is None
    clock.now += 2 * S
    assert handle.wait(0) == ExitResult(3)


def test_mock__no_run_for__runs_until_stopped(tmp_path: Path) -> None:
    handle = MockDriver(ManualClock(1_000 * S)).start(spec("mock", {}), tmp_path)
    assert handle.wait(0.01) is None
    assert handle.stop(1.0).exit_code == 0
    assert handle.wait(0) is not None


def test_mock__real_time__250ms(tmp_path: Path) -> None:
    # The driver's own clock (the wall clock), read before the start, so the task's start
    # time is no earlier: an exit seen less than 250 ms later is an early exit however slow
    # the machine (a bound the other way would only measure the machine).
    started_ns = time.time_ns()
    handle = MockDriver().start(spec("mock", {"run_for": "250ms"}), tmp_path)
    assert wait_exit(handle) == ExitResult(0)
    assert time.time_ns() - started_ns >= 250_000_000


def test_mock__start_error__task_start_error(tmp_path: Path) -> None:
    with pytest.raises(TaskStartError, match="boom"):
        MockDriver().start(spec("mock", {"start_error": "boom"}), tmp_path)


def test_mock__unknown_key__config_error(tmp_path: Path) -> None:
    with pytest.raises(DriverConfigError, match="run_fro"):
        MockDriver().start(spec("mock", {"run_fro": "1s"}), tmp_path)


def test_mock__recover__keeps_the_original_deadline() -> None:
    clock = ManualClock(1_000 * S)
    driver = MockDriver(clock)
    state = driver.start(spec("mock", {"run_for": 10, "exit_code": 1}), Path("/nonexistent")).state()
    clock.now += 5 * S
    recovered = driver.recover(state)
    assert recovered is not None and recovered.wait(0) is None
    clock.now += 6 * S
    assert recovered.wait(0) == ExitResult(1)


# --- raw_exec ---------------------------------------------------------------------------------


def test_raw_exec__runs_in_own_process_group_with_logs_and_env(tmp_path: Path, pids: list[int]) -> None:
    task = TaskSpec(
        alloc_id="alloc-1",
        name="t",
        driver="raw_exec",
        config={
            "command": "/bin/sh",
            "args": ["-c", 'echo "hello $GREETING $DROVER_ALLOC_ID"; echo oops >&2'],
        },
        env={"GREETING": "world"},
    )
    handle = RawExecDriver().start(task, tmp_path / "t")
    pids.append(handle.pid)
    assert wait_exit(handle) == ExitResult(0)
    assert (tmp_path / "t" / "stdout.log").read_text() == "hello world alloc-1\n"
    assert (tmp_path / "t" / "stderr.log").read_text() == "oops\n"


def test_raw_exec__stop__sigterm_ends_sleep(tmp_path: Path, pids: list[int]) -> None:
    handle = RawExecDriver().start(spec("raw_exec", {"command": "sleep", "args": ["30"]}), tmp_path)
    pids.append(handle.pid)
    assert os.getpgid(handle.pid) == handle.pid  # its own group: signals reach all of it
    assert handle.wait(0.1) is None
    # SIGTERM is the signal that ended it: had sleep ignored it, the driver would have
    # waited out the kill timeout and reported SIGKILL.
    result = handle.stop(60.0)
    assert result.signal == signal.SIGTERM
    assert not alive(handle.pid)


def test_raw_exec__stop__sigkill_after_kill_timeout_when_term_is_ignored(
    tmp_path: Path, pids: list[int]
) -> None:
    handle = RawExecDriver().start(
        spec("raw_exec", {"command": "sh", "args": ["-c", 'trap "" TERM; sleep 30']}), tmp_path
    )
    pids.append(handle.pid)
    group = [handle.pid]
    wait_until(lambda: psutil.Process(handle.pid).children(), 5, "the shell's sleep child")
    group += [c.pid for c in psutil.Process(handle.pid).children()]
    started = time.monotonic()
    result = handle.stop(0.5)
    assert result.signal == signal.SIGKILL
    # Not before the kill timeout: a lower bound, which a slow machine cannot break.
    assert time.monotonic() - started >= 0.5
    wait_until(lambda: not any(alive(p) for p in group), 5, "the whole group (sh and sleep) to be gone")


def test_raw_exec__nonzero_exit_code(tmp_path: Path, pids: list[int]) -> None:
    handle = RawExecDriver().start(spec("raw_exec", {"command": "sh", "args": ["-c", "exit 7"]}), tmp_path)
    pids.append(handle.pid)
    assert wait_exit(handle) == ExitResult(7)


def test_raw_exec__missing_command__start_error(tmp_path: Path) -> None:
    with pytest.raises(TaskStartError, match="no-such-command"):
        RawExecDriver().start(spec("raw_exec", {"command": "no-such-command-xyz"}), tmp_path)


@pytest.mark.parametrize(
    "config", [{}, {"command": ""}, {"command": "sleep", "args": "30"}, {"command": "x", "extra": 1}]
)
def test_raw_exec__bad_config__config_error(tmp_path: Path, config: dict[str, object]) -> None:
    with pytest.raises(DriverConfigError):
        RawExecDriver().start(spec("raw_exec", config), tmp_path)


def test_raw_exec__recover__same_process_in_this_interpreter_keeps_exit_code(
    tmp_path: Path, pids: list[int]
) -> None:
    driver = RawExecDriver()
    handle = driver.start(spec("raw_exec", {"command": "sleep", "args": ["30"]}), tmp_path)
    pids.append(handle.pid)
    recovered = RawExecDriver().recover(handle.state())
    assert recovered is not None and recovered.pid == handle.pid and not recovered.reattached
    os.killpg(handle.pid, signal.SIGTERM)
    assert wait_exit(recovered).signal == signal.SIGTERM


def test_raw_exec__recover__foreign_process__watched_with_unknown_exit(
    foreign_sleep: subprocess.Popen[bytes],
) -> None:
    proc = foreign_sleep
    state = {"driver": "raw_exec", "pid": proc.pid, "create_time": psutil.Process(proc.pid).create_time()}
    recovered = RawExecDriver().recover(state)
    assert recovered is not None and recovered.reattached and recovered.pid == proc.pid
    assert recovered.wait(0.1) is None
    proc.kill()  # dies and stays a zombie until reaped: must count as exited
    result = wait_exit(recovered)
    assert result.exit_code is None


def test_raw_exec__recover__refuses_a_reused_pid(foreign_sleep: subprocess.Popen[bytes]) -> None:
    proc = foreign_sleep
    state = {"pid": proc.pid, "create_time": psutil.Process(proc.pid).create_time() - 100}
    assert RawExecDriver().recover(state) is None
    assert RawExecDriver().recover({"pid": 0, "create_time": 0}) is None
    assert RawExecDriver().recover({}) is None


def test_raw_exec__stop_of_recovered_foreign_process__sigterm_group(
    foreign_sleep: subprocess.Popen[bytes],
) -> None:
    proc = foreign_sleep
    state = {"pid": proc.pid, "create_time": psutil.Process(proc.pid).create_time()}
    recovered = RawExecDriver().recover(state)
    assert recovered is not None
    result = recovered.stop(5.0)
    assert result.exit_code is None
    assert proc.wait(5) == -signal.SIGTERM
