"""The raw_exec tasks a client agent leaves running, and the one way tests end them.

An agent that stops (or is killed) leaves its tasks running by design: a restarted agent
re-attaches to them (client_agent/drivers/raw_exec.py). So stopping the agents does not
end a test's tasks; killing every process whose working directory lies inside the test's
directory does, since raw_exec runs each task in ``<data_dir>/allocs/<alloc_id>/<task>/``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from pathlib import Path

import psutil

__all__ = ["kill_processes_working_under"]

# Long enough for a SIGKILLed process to be reaped even on a loaded machine.
REAP_TIMEOUT_S = 10


def kill_processes_working_under(roots: Iterable[Path]) -> None:
    """SIGKILL every process whose working directory is one of ``roots`` or below one, and
    wait for them, so no task outlives the test that started it. ``roots`` should be
    resolved paths: a process's cwd is reported resolved."""
    roots = list(roots)
    victims = []
    for proc in psutil.process_iter(["pid"]):
        with contextlib.suppress(psutil.Error, OSError):
            cwd = Path(proc.cwd())
            if any(cwd == root or root in cwd.parents for root in roots):
                victims.append(proc)
    for proc in victims:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    psutil.wait_procs(victims, timeout=REAP_TIMEOUT_S)
