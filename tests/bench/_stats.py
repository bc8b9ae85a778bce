"""Latency percentiles, throughput over a window, per-process CPU use, and latency
histograms scraped from an agent's metrics port."""

from __future__ import annotations

import math
import os
import time
import urllib.request
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import psutil
from prometheus_client.parser import text_string_to_metric_families

MACHINE: Final = "machine"
OTHERS: Final = "others"
# A machine counts as quiet below this (% of one core, all processes; idle servers included).
QUIET_PERCENT: Final = 30.0


def percentile(sorted_values: Sequence[float], pct: float) -> float:
    """Nearest-rank percentile of already sorted values (0 for none)."""
    if not sorted_values:
        return 0.0
    rank = max(1, math.ceil(pct / 100.0 * len(sorted_values)))
    return sorted_values[min(rank, len(sorted_values)) - 1]


def latency_ms(latencies_s: Iterable[float]) -> dict[str, float]:
    values = sorted(latencies_s)
    if not values:
        return {"p50": 0.0, "p90": 0.0, "p99": 0.0, "max": 0.0, "mean": 0.0}
    return {
        "p50": round(percentile(values, 50) * 1e3, 3),
        "p90": round(percentile(values, 90) * 1e3, 3),
        "p99": round(percentile(values, 99) * 1e3, 3),
        "max": round(values[-1] * 1e3, 3),
        "mean": round(sum(values) / len(values) * 1e3, 3),
    }


@dataclass(frozen=True, slots=True)
class OpRecord:
    """One operation: when it started and ended (perf_counter seconds) and whether it worked."""

    start: float
    end: float
    ok: bool


@dataclass(slots=True)
class WindowStats:
    """Operations of a fixed-duration run, judged against the measurement window.

    Throughput counts successful operations that *ended* inside the window; latency uses
    every successful operation that *started* inside it (they all finish after the window
    closes, so slow ones are not cut off).
    """

    window_start: float
    window_end: float
    records: list[OpRecord] = field(default_factory=list)

    @property
    def window_s(self) -> float:
        return self.window_end - self.window_start

    def _in_window(self, t: float) -> bool:
        return self.window_start <= t < self.window_end

    def summary(self) -> dict[str, Any]:
        done = [r for r in self.records if r.ok and self._in_window(r.end)]
        started = [r.end - r.start for r in self.records if r.ok and self._in_window(r.start)]
        failed = sum(1 for r in self.records if not r.ok and self._in_window(r.end))
        return {
            "ops": len(done),
            "errors": failed,
            "window_s": round(self.window_s, 3),
            "per_s": round(len(done) / self.window_s, 1) if self.window_s > 0 else 0.0,
            "latency_ms": latency_ms(started),
            "latency_samples": len(started),
        }


def thread_cpu_seconds(pid: int) -> dict[int, tuple[str, float]]:
    """(kernel thread name, CPU seconds) of each thread of ``pid``; empty where /proc is missing."""
    out: dict[int, tuple[str, float]] = {}
    task_dir = f"/proc/{pid}/task"
    try:
        tids = os.listdir(task_dir)
    except OSError:
        return out
    ticks = os.sysconf("SC_CLK_TCK")
    for tid in tids:
        try:
            with open(f"{task_dir}/{tid}/comm") as f:
                comm = f.read().strip()
            with open(f"{task_dir}/{tid}/stat") as f:
                fields = f.read().rpartition(")")[2].split()
        except OSError:
            continue
        # After the command name: state is field 0, utime 11 and stime 12 (clock ticks).
        out[int(tid)] = (comm, (int(fields[11]) + int(fields[12])) / ticks)
    return out


class CpuProbe:
    """CPU seconds (user + system, all threads) of named processes, sampled on demand.

    With ``threads_of`` (one of the names), that process is also broken down per thread:
    after ``stop``, ``thread_percent`` maps each thread id to (kernel name, % of one core).
    """

    def __init__(self, pids: Mapping[str, int], threads_of: str | None = None) -> None:
        self._thread_pid = pids.get(threads_of) if threads_of is not None else None
        self._threads0: dict[int, tuple[str, float]] = {}
        self.thread_percent: dict[int, tuple[str, float]] = {}
        self._procs: dict[str, psutil.Process] = {}
        for name, pid in pids.items():
            try:
                self._procs[name] = psutil.Process(pid)
            except psutil.Error:
                continue
        self._first: dict[str, float] = {}
        self._t0 = 0.0

    def _sample(self) -> dict[str, float]:
        machine = psutil.cpu_times()
        out: dict[str, float] = {MACHINE: sum(machine) - machine.idle - getattr(machine, "iowait", 0.0)}
        for name, proc in self._procs.items():
            try:
                times = proc.cpu_times()
            except psutil.Error:
                continue
            out[name] = times.user + times.system
        return out

    def start(self, now: float) -> None:
        self._t0 = now
        self._first = self._sample()
        if self._thread_pid is not None:
            self._threads0 = thread_cpu_seconds(self._thread_pid)

    def stop(self, now: float) -> dict[str, float]:
        """Percent of one core each process used since ``start`` (100 = one full core).

        Also ``machine``: all cores together (at most 100 x cores), and ``others``: what
        the machine spent outside the named processes (other work disturbing the run).
        """
        elapsed = now - self._t0
        last = self._sample()
        if elapsed <= 0:
            return {}
        if self._thread_pid is not None:
            for tid, (comm, seconds) in thread_cpu_seconds(self._thread_pid).items():
                before = self._threads0.get(tid, (comm, 0.0))[1]
                self.thread_percent[tid] = (comm, round((seconds - before) / elapsed * 100.0, 2))
        out = {
            name: round((last[name] - self._first[name]) / elapsed * 100.0, 1)
            for name in last
            if name in self._first
        }
        ours = sum(v for k, v in out.items() if k != MACHINE)
        out[OTHERS] = round(max(0.0, out.get(MACHINE, 0.0) - ours), 1)
        return out


def machine_busy_percent(seconds: float = 1.0) -> float:
    """Percent of one core the whole machine used over the next ``seconds`` (a quietness check)."""
    probe = CpuProbe({})
    probe.start(time.monotonic())
    time.sleep(seconds)
    return probe.stop(time.monotonic()).get(MACHINE, 0.0)


def wait_quiet(max_wait: float, threshold: float = QUIET_PERCENT) -> float:
    """Wait (at most ``max_wait`` s) until the machine uses under ``threshold`` % of a core.

    Returns the last busy figure seen; with ``max_wait`` 0 it only measures, for a second.
    """
    deadline = time.monotonic() + max_wait
    while True:
        busy = machine_busy_percent(1.0)
        if busy < threshold or time.monotonic() >= deadline:
            return busy


def rss_mb(pid: int) -> float | None:
    try:
        return round(psutil.Process(pid).memory_info().rss / 2**20, 1)
    except psutil.Error:
        return None


def scrape_histogram(http_address: str, name: str, **labels: str) -> dict[float, float]:
    """The cumulative bucket counts (upper bound -> count) of histogram ``name`` on an
    agent's ``/v1/metrics``, summed over the series whose labels include ``labels``;
    empty when the agent does not answer (it may be the one just killed)."""
    url = f"http://{http_address}/v1/metrics?format=prometheus"
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            text = response.read().decode()
    except OSError:
        return {}
    buckets: dict[float, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name != f"{name}_bucket" or not labels.items() <= sample.labels.items():
                continue
            bound = float(sample.labels["le"])
            buckets[bound] = buckets.get(bound, 0.0) + sample.value
    return buckets


def histogram_latency_ms(before: Mapping[float, float], after: Mapping[float, float]) -> dict[str, float]:
    """p50/p90/p99 (ms) of what a histogram observed between two scrapes, interpolated
    inside a bucket as Prometheus's ``histogram_quantile`` does; with the count."""
    bounds = sorted(after)
    counts = [after[b] - before.get(b, 0.0) for b in bounds]
    total = counts[-1] if counts else 0.0
    out: dict[str, float] = {"count": total}
    for label, q in (("p50", 0.5), ("p90", 0.9), ("p99", 0.99)):
        out[label] = round(_bucket_quantile(bounds, counts, q) * 1e3, 3) if total > 0 else 0.0
    return out


def _bucket_quantile(bounds: Sequence[float], cumulative: Sequence[float], q: float) -> float:
    rank = q * cumulative[-1]
    lower_bound, lower_count = 0.0, 0.0
    for bound, count in zip(bounds, cumulative, strict=True):
        if count >= rank:
            if math.isinf(bound):
                return lower_bound  # past the last finite bucket: its bound is all one can say
            width = count - lower_count
            return lower_bound + (bound - lower_bound) * ((rank - lower_count) / width if width else 1.0)
        lower_bound, lower_count = bound, count
    return lower_bound
