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
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, Final

DUMP_TIMEOUT_S: Final = 15.0
# A thread role below this share of one core is left out of the tables: noise.
MIN_ROLE_PERCENT: Final = 0.5
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


def cpu_percent_by_role(
    thread_percent: Mapping[int, tuple[str, float]], names: Mapping[int, str]
) -> dict[str, float]:
    """Per-thread CPU (% of one core; OS thread id -> (kernel name, percent)) summed by
    role, busiest first, roles under ``MIN_ROLE_PERCENT`` left out."""
    by_role: dict[str, float] = {}
    for tid, (kernel_name, percent) in thread_percent.items():
        role = thread_role(names.get(tid), kernel_name)
        by_role[role] = by_role.get(role, 0.0) + percent
    busiest = sorted(by_role.items(), key=lambda item: -item[1])
    return {role: percent for role, percent in busiest if percent >= MIN_ROLE_PERCENT}


def thread_cpu_by_role(
    pid: int, thread_percent: Mapping[int, tuple[str, float]], ops_per_s: float
) -> dict[str, dict[str, float]]:
    """Per-thread CPU by role (``cpu_percent_by_role``), with CPU microseconds per operation."""
    out: dict[str, dict[str, float]] = {}
    for role, percent in cpu_percent_by_role(thread_percent, python_thread_names(pid)).items():
        entry: dict[str, float] = {"cpu_percent": round(percent, 1)}
        if ops_per_s > 0:
            entry["cpu_us_per_op"] = round(percent / 100.0 / ops_per_s * 1e6, 1)
        out[role] = entry
    return out


def _frame_name(frame: str) -> str:
    """``func (path/to/file.py:123)`` -> ``func (file.py)``: a function's lines together."""
    name, _, where = frame.partition(" (")
    return f"{name} ({Path(where.rsplit(':', 1)[0]).name})" if where else name


def raw_stacks(raw: Path) -> Iterator[tuple[str, list[str], int]]:
    """(thread role, frame names outermost first, samples) for each stack of py-spy's raw
    (collapsed-stack, ``--threads``) output."""
    for line in raw.read_text(errors="replace").splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        frames = stack.split(";")
        # The first frame is "thread (<tid>): <python name>".
        role = thread_role(frames[0].partition(": ")[2], "?")
        yield role, [_frame_name(f) for f in frames[1:]], int(count_text)


def summarize_raw(raw: Path, top: int = 30) -> dict[str, Any]:
    """Where the GIL time went, from py-spy's raw (collapsed-stack, ``--threads``) output."""
    own: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    by_thread: Counter[str] = Counter()
    total = 0
    for role, names, count in raw_stacks(raw):
        total += count
        by_thread[role] += count
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


def start_recording(
    exe: str, pid: int, out: Path, *, rate: int, seconds: float | None = None
) -> subprocess.Popen[bytes]:
    """``py-spy record --gil --threads`` of ``pid`` into ``out`` as raw stacks (its own log
    beside it), for ``seconds`` or, with None, until it gets SIGINT."""
    argv = [exe, "record", "--pid", str(pid), "--rate", str(rate), "--gil", "--threads"]
    argv += ["--format", "raw", "--output", str(out)]
    if seconds is not None:
        argv += ["--duration", str(max(1, round(seconds)))]
    with open(out.with_suffix(".log"), "wb") as log:
        return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)


@contextlib.contextmanager
def recording(
    pid: int,
    out: Path,
    *,
    seconds: float | None = None,
    rate: int = 100,
    summarize: Callable[[Path, float], dict[str, Any]] | None = None,
) -> Iterator[dict[str, Any]]:
    """Record ``pid`` with py-spy for ``seconds``, or (None) from just before the block until
    it ends; the yielded dict gets ``summarize(raw file, seconds recorded)`` (by default
    :func:`summarize_raw`).

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
    proc = start_recording(exe, pid, out, rate=rate, seconds=seconds)
    if seconds is None:
        time.sleep(0.5)  # attached before the work starts
    started = time.perf_counter()
    try:
        yield info
    finally:
        if seconds is None and proc.poll() is None:
            proc.send_signal(signal.SIGINT)  # py-spy stops sampling and writes what it has
        try:
            proc.wait(timeout=60.0 if seconds is None else 30.0)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    elapsed = time.perf_counter() - started
    if out.exists():
        summary = summarize(out, elapsed) if summarize is not None else summarize_raw(out)
        info.update(file=str(out), **summary)
    else:
        info["error"] = f"py-spy wrote nothing (exit {proc.returncode}), see {out.with_suffix('.log')}"
