"""The ``raw_exec`` driver: a real process, unisolated, in its own session and process group.

Config keys: ``command`` (required) and ``args`` (a list of strings). The task's ``env``
is laid over the agent's environment plus the ``DROVER_*``/``NOMAD_*`` variables
(client_agent/taskenv.py) naming the alloc, task, node and directories. stdout and stderr are appended to ``stdout.log`` / ``stderr.log`` in the task
directory (``data_dir/allocs/<alloc_id>/<task>/``), which is also the working directory.

Stopping sends SIGTERM (or the task's ``kill_signal``) to the whole process group, then
SIGKILL once the task's kill_timeout has passed: a shell that ignores TERM cannot keep its
children alive.

``user``: the task runs as that OS user (its primary group, no supplementary groups), and
its task directory and ``secrets/`` are given to it. Only an agent running as root can
switch users; any other agent refuses the task at start (a task event, the task failed)
rather than run it as itself, which would be the silent key the job file did not ask for.
The shared alloc directory stays the agent's: a task with a ``user`` reaches it only if
the agent's data_dir lets that user in.

Re-attaching. ``state()`` records the PID and the process's ``create_time``. A new agent
re-attaches only if ``psutil.Process(pid).create_time()`` still matches, so a reused PID is
never mistaken for the task. A re-attached process is not our child: its exit code cannot
be known, so it is reported as None (the runner counts that as a failure unless the task
was being stopped). Zombies count as exited: PID 1 in a container may never reap them.

Within one process (an agent stopped with ``leave_tasks_running`` and a new agent started
in the same interpreter, as the tests do) the ``Popen`` object is kept in a registry, so
the child is still reaped and its real exit code is known.
"""

from __future__ import annotations

import os
import pwd
import signal
import subprocess
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from signal import SIGTERM
from typing import Any, Final

import psutil
import structlog

from drover.client.drivers.base import ExitResult, TaskSpec
from drover.client.errors import DriverConfigError, TaskStartError
from drover.client.taskenv import dir_env

__all__ = ["RawExecDriver", "RawExecHandle", "reap_registered_children"]

NAME: Final = "raw_exec"
_KEYS: Final = frozenset({"command", "args"})
# Two psutil readings of one process's start time agree exactly; the slack only absorbs
# float formatting through JSON.
_CREATE_TIME_SLACK_S: Final = 0.01
_POLL_S: Final = 0.05
_AFTER_KILL_WAIT_S: Final = 5.0

log = structlog.get_logger("drover.client.raw_exec")

_children_lock = threading.Lock()
# pid -> (Popen, create_time) for every child this interpreter started and has not reaped.
_children: dict[int, tuple[subprocess.Popen[bytes], float]] = {}


def _register(proc: subprocess.Popen[bytes], create_time: float) -> None:
    with _children_lock:
        _children[proc.pid] = (proc, create_time)


def _unregister(pid: int) -> None:
    with _children_lock:
        _children.pop(pid, None)


def _registered(pid: int, create_time: float) -> subprocess.Popen[bytes] | None:
    with _children_lock:
        entry = _children.get(pid)
    if entry is None or abs(entry[1] - create_time) > _CREATE_TIME_SLACK_S:
        return None
    return entry[0]


def reap_registered_children() -> list[int]:
    """Reap children of this interpreter that have exited; their PIDs (for tests' cleanup)."""
    with _children_lock:
        entries = list(_children.items())
    reaped = []
    for pid, (proc, _) in entries:
        if proc.poll() is not None:
            _unregister(pid)
            reaped.append(pid)
    return reaped


def _parse_config(config: Mapping[str, Any], task_name: str) -> list[str]:
    unknown = sorted(set(config) - _KEYS)
    if unknown:
        raise DriverConfigError(
            f"task {task_name!r}: unknown raw_exec config key(s) {', '.join(unknown)} (known: args, command)"
        )
    command = config.get("command")
    if not isinstance(command, str) or not command:
        raise DriverConfigError(f"task {task_name!r}: config.command: required, a non-empty string")
    args = config.get("args", [])
    if not isinstance(args, list) or not all(isinstance(a, str | int | float) for a in args):
        raise DriverConfigError(f"task {task_name!r}: config.args: expected a list of strings")
    return [command, *(str(a) for a in args)]


def _user_ids(user: str, task_name: str) -> tuple[int, int]:
    """The uid and gid ``user`` names; DriverConfigError if this agent cannot run as it."""
    if os.geteuid() != 0:
        raise DriverConfigError(
            f"task {task_name!r}: user {user!r}: raw_exec can run a task as another user only "
            f"when the agent runs as root (it runs as uid {os.geteuid()})"
        )
    try:
        entry = pwd.getpwnam(user)
    except KeyError:
        raise DriverConfigError(f"task {task_name!r}: user {user!r}: no such user on this node") from None
    return entry.pw_uid, entry.pw_gid


def _exit_from_returncode(returncode: int) -> ExitResult:
    if returncode < 0:
        sig = -returncode
        return ExitResult(128 + sig, signal=sig, message=f"killed by signal {signal.Signals(sig).name}")
    return ExitResult(returncode)


class RawExecHandle:
    def __init__(self, pid: int, create_time: float, popen: subprocess.Popen[bytes] | None) -> None:
        self._pid = pid
        self._create_time = create_time
        self._popen = popen
        self._psutil: psutil.Process | None = None

    @property
    def pid(self) -> int:
        return self._pid

    @property
    def reattached(self) -> bool:
        """True when this is not our child: its exit code will be unknown."""
        return self._popen is None

    def state(self) -> dict[str, Any]:
        return {"driver": NAME, "pid": self._pid, "create_time": self._create_time}

    def _same_process_alive(self) -> bool:
        """The recorded process still exists, is not a zombie, and is the same process."""
        try:
            if self._psutil is None:
                self._psutil = psutil.Process(self._pid)
            proc = self._psutil
            if abs(proc.create_time() - self._create_time) > _CREATE_TIME_SLACK_S:
                return False
            return proc.status() != psutil.STATUS_ZOMBIE
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            return False

    def wait(self, timeout_s: float) -> ExitResult | None:
        if self._popen is not None:
            try:
                returncode = self._popen.wait(timeout=max(0.0, timeout_s))
            except subprocess.TimeoutExpired:
                return None
            _unregister(self._pid)
            return _exit_from_returncode(returncode)
        deadline = time.monotonic() + max(0.0, timeout_s)
        while True:
            if not self._same_process_alive():
                return ExitResult(
                    None, message="exit code unknown: the process was re-attached after an agent restart"
                )
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            time.sleep(min(_POLL_S, remaining))

    def _signal_group(self, sig: int) -> None:
        if self._popen is not None:
            if self._popen.poll() is not None:
                return
        elif not self._same_process_alive():
            return
        try:
            # The task leads its own session and process group (start_new_session).
            os.killpg(self._pid, sig)
        except ProcessLookupError:
            pass
        except PermissionError as exc:
            log.warning("raw_exec.signal_failed", pid=self._pid, signal=sig, error=str(exc))

    def signal(self, signum: int) -> None:
        """To the whole process group, as a stop's SIGTERM: a shell's children hear it too."""
        self._signal_group(signum)

    def _kill_stragglers(self) -> None:
        """SIGKILL what is left of the group once its leader is gone (reaped by us)."""
        if self._popen is None:
            return
        try:
            os.killpg(self._pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    def stop(self, timeout_s: float, signum: int = SIGTERM) -> ExitResult:
        self._signal_group(signum)
        result = self.wait(timeout_s)
        if result is None:
            log.info("raw_exec.kill_timeout", pid=self._pid, timeout_s=timeout_s)
            self._signal_group(signal.SIGKILL)
            result = self.wait(_AFTER_KILL_WAIT_S)
        self._kill_stragglers()
        return result or ExitResult(None, signal=signal.SIGKILL, message="still running after SIGKILL")


class RawExecDriver:
    name = NAME

    def __init__(self, base_env: Mapping[str, str] | None = None) -> None:
        self._base_env = dict(os.environ if base_env is None else base_env)

    def start(self, task: TaskSpec, task_dir: Path) -> RawExecHandle:
        argv = _parse_config(task.config, task.name)
        ids = _user_ids(task.user, task.name) if task.user else None
        task_dir.mkdir(parents=True, exist_ok=True)
        (task_dir / "secrets").mkdir(mode=0o700, exist_ok=True)
        if ids is not None:
            for path in (task_dir, task_dir / "secrets"):
                os.chown(path, *ids)
        env = {
            **self._base_env,
            "DROVER_ALLOC_ID": task.alloc_id,
            "DROVER_TASK_NAME": task.name,
            "DROVER_JOB_ID": task.job_id,
            "DROVER_GROUP_NAME": task.group,
            **dir_env(str(task_dir.parent), str(task_dir)),
            **task.env,
        }
        try:
            with open(task_dir / "stdout.log", "ab") as out, open(task_dir / "stderr.log", "ab") as err:
                proc = subprocess.Popen(
                    argv,
                    cwd=task_dir,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=err,
                    start_new_session=True,
                    close_fds=True,
                    user=ids[0] if ids is not None else None,
                    group=ids[1] if ids is not None else None,
                    extra_groups=[] if ids is not None else None,
                )
        except OSError as exc:
            raise TaskStartError(f"failed to start {argv[0]!r}: {exc.strerror or exc}") from exc
        try:
            create_time = psutil.Process(proc.pid).create_time()
        except psutil.Error:
            create_time = 0.0  # already gone and reaped elsewhere: the Popen still knows its code
        _register(proc, create_time)
        return RawExecHandle(proc.pid, create_time, proc)

    def recover(self, state: Mapping[str, Any]) -> RawExecHandle | None:
        try:
            pid = int(state["pid"])
            create_time = float(state["create_time"])
        except (KeyError, TypeError, ValueError):
            return None
        if pid <= 0:
            return None
        popen = _registered(pid, create_time)
        if popen is not None:
            return RawExecHandle(pid, create_time, popen)
        handle = RawExecHandle(pid, create_time, None)
        return handle if handle._same_process_alive() else None
