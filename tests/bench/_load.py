"""A closed-loop load generator: N threads, each calling one operation back to back.

Each thread builds its own connection (``make_worker``), then all start together; the
first ``warmup`` seconds are not measured, the next ``duration`` seconds are. Every
operation carries its own timeout, so the threads stop soon after the window closes.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, Final

from tests.bench._procs import BenchError
from tests.bench._stats import CpuProbe, OpRecord, WindowStats

# A failed operation is retried after this long, so a dead server is not hammered.
ERROR_PAUSE_S: Final = 0.01
SETUP_TIMEOUT_S: Final = 60.0
MAX_ERROR_SAMPLES: Final = 5

Operation = Callable[[], None]
WorkerFactory = Callable[[int], AbstractContextManager[Operation]]


@dataclass(slots=True)
class LoadResult:
    stats: WindowStats
    cpu_percent: dict[str, float]
    # Per thread of the ``threads_of`` process: thread id -> (kernel name, % of one core).
    thread_percent: dict[int, tuple[str, float]] = field(default_factory=dict)
    error_samples: list[str] = field(default_factory=list)
    stragglers: int = 0

    def summary(self) -> dict[str, Any]:
        out = self.stats.summary()
        out["cpu_percent_of_one_core"] = self.cpu_percent
        if self.error_samples:
            out["error_samples"] = self.error_samples
        if self.stragglers:
            out["threads_not_stopped"] = self.stragglers
        return out


def closed_loop(
    make_worker: WorkerFactory,
    threads: int,
    warmup: float,
    duration: float,
    cpu_pids: Mapping[str, int],
    op_timeout: float,
    threads_of: str | None = None,
) -> LoadResult:
    """Run ``threads`` workers for ``warmup + duration`` seconds and measure the window.

    ``cpu_pids`` are the processes whose CPU use is recorded over the window; the one named
    ``threads_of`` is also broken down per thread.
    """
    barrier = threading.Barrier(threads + 1, timeout=SETUP_TIMEOUT_S)
    stop = threading.Event()
    per_thread: list[list[OpRecord]] = [[] for _ in range(threads)]
    errors: list[str] = []
    errors_lock = threading.Lock()

    def note_error(exc: BaseException) -> None:
        with errors_lock:
            text = f"{type(exc).__name__}: {exc}"
            if len(errors) < MAX_ERROR_SAMPLES and text not in errors:
                errors.append(text)

    def body(index: int) -> None:
        records = per_thread[index]
        try:
            with make_worker(index) as op:
                barrier.wait()
                while not stop.is_set():
                    start = time.perf_counter()
                    try:
                        op()
                    except Exception as exc:
                        records.append(OpRecord(start, time.perf_counter(), False))
                        note_error(exc)
                        stop.wait(ERROR_PAUSE_S)
                        continue
                    records.append(OpRecord(start, time.perf_counter(), True))
        except threading.BrokenBarrierError:
            return
        except Exception as exc:
            note_error(exc)
            barrier.abort()

    workers = [
        threading.Thread(target=body, args=(i,), name=f"load-{i}", daemon=True) for i in range(threads)
    ]
    for worker in workers:
        worker.start()
    probe = CpuProbe(cpu_pids, threads_of)
    try:
        try:
            barrier.wait()
        except threading.BrokenBarrierError as exc:
            raise BenchError(f"load workers failed to start: {'; '.join(errors) or 'timeout'}") from exc
        window_start = time.perf_counter() + warmup
        window_end = window_start + duration
        _sleep_until(window_start)
        probe.start(time.perf_counter())
        _sleep_until(window_end)
        cpu = probe.stop(time.perf_counter())
    finally:
        stop.set()
        with contextlib.suppress(threading.BrokenBarrierError):
            barrier.abort()
        join_deadline = time.monotonic() + op_timeout + 5.0
        for worker in workers:
            worker.join(timeout=max(0.0, join_deadline - time.monotonic()))
    stats = WindowStats(window_start, window_end, [r for records in per_thread for r in records])
    return LoadResult(stats, cpu, probe.thread_percent, errors, sum(1 for w in workers if w.is_alive()))


def _sleep_until(t: float) -> None:
    while (remaining := t - time.perf_counter()) > 0:
        time.sleep(min(remaining, 0.5))
