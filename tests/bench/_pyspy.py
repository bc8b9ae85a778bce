"""Looking inside a server process with py-spy (optional: everything degrades without it).

* :func:`thread_cpu_by_role`: which threads used the CPU, from per-thread CPU counters
  (/proc) named through one ``py-spy dump`` (pausing the process for a moment). Exact,
  no sampling, so it runs on every measured drover run.
* :func:`recording`: ``py-spy record --gil`` over a run, summarized into the functions that
  held the GIL. Sampling slows the process a lot, so it is an extra, opt-in run.
"""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Final

DUMP_TIMEOUT_S: Final = 15.0
_NUMBERED = re.compile(r"^(.*?)[-_]?\d+$")


def py_spy_path() -> str | None:
    beside = Path(sys.executable).parent / "py-spy"
    return str(beside) if beside.exists() else shutil.which("py-spy")


def python_thread_names(pid: int) -> dict[int, str]:
    """OS thread id -> Python thread name for every Python thread of ``pid`` ({} if unknown)."""
    exe = py_spy_path()
    if exe is None:
        return {}
    try:
        done = subprocess.run(
            [exe, "dump", "--pid", str(pid), "--json"],
            capture_output=True,
            timeout=DUMP_TIMEOUT_S,
            check=False,
        )
        threads = json.loads(done.stdout) if done.returncode == 0 else []
    except (OSError, subprocess.TimeoutExpired, ValueError):
        return {}
    return {int(t["os_thread_id"]): str(t.get("thread_name") or "") for t in threads if t.get("os_thread_id")}


def thread_role(python_name: str | None, kernel_name: str) -> str:
    """A stable label for a thread: numbered pool threads grouped, native threads marked."""
    if not python_name:
        return f"native {kernel_name}"
    if "(" in python_name and python_name.endswith(")"):
        # Thread-3 (_autoTickThread) -> _autoTickThread: the target names the role.
        return python_name[python_name.rindex("(") + 1 : -1]
    match = _NUMBERED.match(python_name)
    return f"{match.group(1)} pool" if match else python_name


def thread_cpu_by_role(
    pid: int, thread_percent: Mapping[int, tuple[str, float]], ops_per_s: float
) -> dict[str, dict[str, float]]:
    """Group per-thread CPU (% of one core) by role; add CPU microseconds per operation."""
    names = python_thread_names(pid)
    by_role: dict[str, float] = {}
    for tid, (kernel_name, percent) in thread_percent.items():
        role = thread_role(names.get(tid), kernel_name)
        by_role[role] = by_role.get(role, 0.0) + percent
    out: dict[str, dict[str, float]] = {}
    for role, percent in sorted(by_role.items(), key=lambda item: -item[1]):
        if percent < 0.5:
            continue
        entry: dict[str, float] = {"cpu_percent": round(percent, 1)}
        if ops_per_s > 0:
            entry["cpu_us_per_op"] = round(percent / 100.0 / ops_per_s * 1e6, 1)
        out[role] = entry
    return out


def _frame_name(frame: str) -> str:
    """``func (path/to/file.py:123)`` -> ``func (file.py)``: a function's lines together."""
    name, _, where = frame.partition(" (")
    return f"{name} ({Path(where.rsplit(':', 1)[0]).name})" if where else name


def summarize_raw(raw: Path, top: int = 30) -> dict[str, Any]:
    """Where the GIL time went, from py-spy's raw (collapsed-stack, ``--threads``) output."""
    own: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    by_thread: Counter[str] = Counter()
    total = 0
    for line in raw.read_text(errors="replace").splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = stack.split(";")
        total += count
        # The first frame is "thread (<tid>): <python name>".
        by_thread[thread_role(frames[0].partition(": ")[2], "?")] += count
        names = [_frame_name(f) for f in frames[1:]]
        if names:
            own[names[-1]] += count
        for name in set(names):
            inclusive[name] += count
    return {
        "samples": total,
        "by_thread": dict(by_thread.most_common(10)),
        "top_own": dict(own.most_common(top)),
        "top_inclusive": dict(inclusive.most_common(top)),
    }


@contextlib.contextmanager
def recording(pid: int, seconds: float, out: Path) -> Iterator[dict[str, Any]]:
    """Record ``pid`` with py-spy while the block runs; the yielded dict gets the summary.

    ``--gil`` samples only the thread holding the GIL: in a CPython server that is where the
    Python work that limits throughput happens (threads blocked in C would drown it out).
    grpc's own C threads are invisible to it: see :func:`thread_cpu_by_role` for those.
    """
    info: dict[str, Any] = {}
    exe = py_spy_path()
    if exe is None:
        info["error"] = "py-spy not installed"
        yield info
        return
    argv = [exe, "record", "--pid", str(pid), "--duration", str(max(1, round(seconds))), "--rate", "100"]
    argv += ["--gil", "--threads", "--format", "raw", "--output", str(out)]
    with open(out.with_suffix(".log"), "wb") as log:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
    try:
        yield info
    finally:
        try:
            proc.wait(timeout=30.0)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    if out.exists():
        info.update(file=str(out), **summarize_raw(out))
    else:
        info["error"] = f"py-spy wrote nothing (exit {proc.returncode}), see {out.with_suffix('.log')}"
