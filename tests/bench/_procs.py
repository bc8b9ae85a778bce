"""Child processes of a benchmark: each in its own session, bounded in life, always reaped.

The parent stops its children with :func:`stop_children` (SIGTERM to the child's process
group, SIGKILL after a grace period) from a ``finally``. In case the parent itself dies
without cleaning up, every child also runs :func:`start_watchdog`: it exits once its parent
is gone or its maximum lifetime has passed.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any, Final

REPO_ROOT: Final = Path(__file__).resolve().parents[2]
PARENT_PID_ENV: Final = "DROVER_BENCH_PARENT_PID"
MAX_SECONDS_ENV: Final = "DROVER_BENCH_MAX_SECONDS"
STOP_GRACE_S: Final = 5.0


class BenchError(RuntimeError):
    """A benchmark could not run (a child died, a wait timed out); carries the logs' tail."""


@dataclass(slots=True)
class Child:
    name: str
    proc: subprocess.Popen[bytes]
    log_path: Path

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log_tail(self, lines: int = 30) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])


def child_env(max_seconds: float, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """Environment for a child: unbuffered output, and what its watchdog needs."""
    return {
        **os.environ,
        "PYTHONUNBUFFERED": "1",
        PARENT_PID_ENV: str(os.getpid()),
        MAX_SECONDS_ENV: f"{max_seconds:.0f}",
        **(extra or {}),
    }


def spawn(name: str, argv: Sequence[str], log_path: Path, max_seconds: float) -> Child:
    """Start ``argv`` in a new session (its own process group) with output to ``log_path``."""
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=REPO_ROOT,
            env=child_env(max_seconds),
            start_new_session=True,
        )
    return Child(name, proc, log_path)


def python_module_argv(module: str, *args: str) -> list[str]:
    return [sys.executable, "-m", module, *args]


def _signal_group(child: Child, sig: int) -> None:
    # The child leads its own session, so its process group id is its pid. Only signal it
    # while it is unreaped: a reaped pid (and so its group id) may belong to someone else.
    if child.proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(child.pid, sig)


def stop_children(children: Sequence[Child], grace: float = STOP_GRACE_S) -> None:
    """SIGTERM every live child's process group, SIGKILL what is left after ``grace``."""
    for child in children:
        _signal_group(child, signal.SIGTERM)
    deadline = time.monotonic() + grace
    for child in children:
        try:
            child.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            _signal_group(child, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.proc.wait(timeout=grace)


@contextlib.contextmanager
def children_stopped_on_exit() -> Iterator[list[Child]]:
    """A list to put children in; all of them are stopped when the block ends, however."""
    children: list[Child] = []
    try:
        yield children
    finally:
        stop_children(children)


def wait_until(
    predicate: Callable[[], Any],
    timeout: float,
    what: str,
    children: Sequence[Child] = (),
    interval: float = 0.05,
) -> Any:
    """Poll ``predicate`` until truthy; fail at once, with its log, if a child exits."""
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if result:
            return result
        for child in children:
            if not child.alive():
                raise BenchError(
                    f"{child.name} exited ({child.proc.returncode}) while waiting for {what}; "
                    f"{child.log_path} ends:\n{child.log_tail()}"
                )
        if time.monotonic() > deadline:
            tails = "\n".join(f"--- {c.name} ---\n{c.log_tail(15)}" for c in children)
            raise BenchError(f"timed out after {timeout:g}s waiting for {what}\n{tails}")
        time.sleep(interval)


def read_json(path: Path) -> Any:
    """The JSON in ``path``, or None while it does not exist (writers replace atomically)."""
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None


def write_json(path: Path, data: Any) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def start_watchdog(on_expiry: Callable[[], None] | None = None) -> None:
    """In a child: exit once the parent that started us is gone or our lifetime is over.

    Reads the parent pid and maximum lifetime from the environment (:func:`child_env`);
    does nothing if they are not set. ``on_expiry`` gets a chance to shut down cleanly
    (e.g. send ourselves SIGTERM); the process is ended hard 10 s later regardless.
    """
    parent = os.environ.get(PARENT_PID_ENV)
    max_seconds = os.environ.get(MAX_SECONDS_ENV)
    if not parent or not max_seconds:
        return
    parent_pid = int(parent)
    deadline = time.monotonic() + float(max_seconds)

    def watch() -> None:
        while os.getppid() == parent_pid and time.monotonic() < deadline:
            time.sleep(0.5)
        reason = "parent gone" if os.getppid() != parent_pid else f"lifetime of {max_seconds}s over"
        print(f"bench watchdog: {reason}, exiting", file=sys.stderr, flush=True)
        if on_expiry is not None:
            with contextlib.suppress(Exception):
                on_expiry()
            time.sleep(10.0)
        os._exit(3)

    threading.Thread(target=watch, name="bench-watchdog", daemon=True).start()


def child_stop_event() -> threading.Event:
    """In a child, first thing: an event SIGTERM or SIGINT sets (the parent asking it to wind
    down), and the watchdog (:func:`start_watchdog`) for a parent that never gets to ask."""
    stop = threading.Event()

    def on_signal(_signum: int, _frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    start_watchdog()
    return stop
