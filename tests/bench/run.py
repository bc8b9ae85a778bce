"""Run drover's benchmarks: ``python -m tests.bench.run [--quick] [--only foundation,scheduling]``.

Each benchmark writes one JSON document to ``bench-results/<name>-<UTC timestamp>.json``
and prints a short summary. Everything it starts runs on loopback, is bounded in time and
is stopped before it returns (a watchdog alarm ends a run that overstays its budget, and
the cleanup still runs).

Exit status: 0 when every benchmark ran (with ``--strict``: and met its targets), 1 when
one failed or missed a target under ``--strict``, 2 for usage errors.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType
from typing import Any, Protocol, TypeVar

from tests.bench import c1m, fleet, foundation, grpc_accept, heartbeats, scheduling, state_load
from tests.bench._machine import machine_info
from tests.bench._procs import REPO_ROOT

DEFAULT_OUT_DIR = REPO_ROOT / "bench-results"


class BenchTimeout(BaseException):
    """The benchmark overstayed its budget (raised from the SIGALRM handler).

    A BaseException, so no ``except Exception`` on the way swallows it: it unwinds through
    every ``finally`` (which stop the processes) up to ``main``.
    """


@dataclass(frozen=True, slots=True)
class Options:
    quick: bool
    duration: float | None
    profile_dir: Path | None
    wait_quiet_s: float


@dataclass(frozen=True, slots=True)
class Benchmark:
    run: Callable[[Options], dict[str, Any]]
    summary: Callable[[dict[str, Any]], list[str]]
    budget_s: Callable[[Options], float]


def _foundation_config(opts: Options) -> foundation.FoundationConfig:
    return foundation.FoundationConfig.make(
        quick=opts.quick, duration=opts.duration, profile_dir=opts.profile_dir, wait_quiet_s=opts.wait_quiet_s
    )


def _scheduling_config(opts: Options) -> scheduling.SchedulingConfig:
    return scheduling.SchedulingConfig.make(
        quick=opts.quick, profile_dir=opts.profile_dir, wait_quiet_s=opts.wait_quiet_s
    )


def _fleet_config(opts: Options) -> fleet.FleetConfig:
    cfg = fleet.FleetConfig.make(quick=opts.quick)
    if opts.duration is None:
        return cfg
    return dataclasses.replace(cfg, duration_s=opts.duration, failover_at_s=opts.duration / 2)


def _c1m_config(opts: Options) -> c1m.C1MConfig:
    return c1m.C1MConfig.make(quick=opts.quick)


def _heartbeats_config(opts: Options) -> heartbeats.HeartbeatsConfig:
    cfg = heartbeats.HeartbeatsConfig.make(quick=opts.quick, wait_quiet_s=opts.wait_quiet_s)
    return cfg if opts.duration is None else dataclasses.replace(cfg, window_s=opts.duration)


def _accept_config(opts: Options) -> grpc_accept.AcceptConfig:
    return grpc_accept.AcceptConfig.make(quick=opts.quick, duration=opts.duration)


def _state_load_config(opts: Options) -> state_load.StateLoadConfig:
    return state_load.StateLoadConfig.make(quick=opts.quick)


class _Budgeted(Protocol):
    def budget_s(self) -> float: ...


Config = TypeVar("Config", bound=_Budgeted)


def benchmark(
    config: Callable[[Options], Config],
    run: Callable[[Config], dict[str, Any]],
    summary: Callable[[dict[str, Any]], list[str]],
) -> Benchmark:
    """A benchmark whose run and time budget come from one config, made from the options."""
    return Benchmark(
        run=lambda opts: run(config(opts)), summary=summary, budget_s=lambda opts: config(opts).budget_s()
    )


BENCHMARKS: dict[str, Benchmark] = {
    foundation.NAME: benchmark(_foundation_config, foundation.run_foundation, foundation.summary_lines),
    scheduling.NAME: benchmark(_scheduling_config, scheduling.run_scheduling, scheduling.summary_lines),
    heartbeats.NAME: benchmark(_heartbeats_config, heartbeats.run_heartbeats, heartbeats.summary_lines),
    fleet.NAME: benchmark(_fleet_config, fleet.run_fleet, fleet.summary_lines),
    c1m.NAME: benchmark(_c1m_config, c1m.run_c1m, c1m.summary_lines),
    state_load.NAME: benchmark(_state_load_config, state_load.run_state_load, state_load.summary_lines),
    grpc_accept.NAME: benchmark(_accept_config, grpc_accept.run_accept, grpc_accept.summary_lines),
}


def _raise_timeout(_signum: int, _frame: FrameType | None) -> None:
    raise BenchTimeout("benchmark exceeded its time budget")


def _raise_exit(signum: int, _frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)


def _selected(only: list[str] | None) -> list[str]:
    if not only:
        return list(BENCHMARKS)
    names = [n.strip() for item in only for n in item.split(",") if n.strip()]
    unknown = [n for n in names if n not in BENCHMARKS]
    if unknown:
        raise ValueError(f"unknown benchmark(s): {', '.join(unknown)}; known: {', '.join(BENCHMARKS)}")
    return names


def run_one(
    name: str,
    bench: Benchmark,
    *,
    quick: bool,
    duration: float | None,
    profile: bool,
    wait_quiet_s: float,
    out_dir: Path,
) -> tuple[Path, dict[str, Any]]:
    started = datetime.now(UTC)
    stamp = started.strftime("%Y%m%dT%H%M%SZ")
    profile_dir = out_dir / f"{name}-{stamp}-profiles" if profile else None
    if profile_dir is not None:
        profile_dir.mkdir(parents=True, exist_ok=True)
    opts = Options(quick=quick, duration=duration, profile_dir=profile_dir, wait_quiet_s=wait_quiet_s)
    budget = bench.budget_s(opts)
    machine = machine_info()
    print(
        f"{name}: {'quick' if opts.quick else 'full'} run, at most {budget:.0f} s "
        f"(plain Python at {machine['python_loop_mops']} M loop iterations/s)",
        flush=True,
    )
    signal.signal(signal.SIGALRM, _raise_timeout)
    signal.alarm(int(budget))
    try:
        body = bench.run(opts)
    finally:
        signal.alarm(0)
    doc: dict[str, Any] = {
        "name": name,
        "timestamp": started.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "quick": quick,
        "machine": machine,
        **body,
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{name}-{stamp}.json"
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(doc, indent=2, sort_keys=False) + "\n")
    os.replace(tmp, path)
    return path, doc


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.bench.run", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick",
        action="store_true",
        help="short phases (3 s instead of 10 s), smaller scheduling scenarios",
    )
    parser.add_argument(
        "--only", action="append", metavar="NAME", help=f"run only these ({', '.join(BENCHMARKS)})"
    )
    parser.add_argument("--duration", type=float, help="seconds measured per phase (overrides --quick)")
    parser.add_argument("--out-dir", type=Path, default=DEFAULT_OUT_DIR, help="where the JSON goes")
    parser.add_argument(
        "--profile-leader",
        action="store_true",
        help="add runs with py-spy recording the drover leader (raw stacks beside the JSON)",
    )
    parser.add_argument(
        "--wait-quiet",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="before each phase, wait up to this long for other processes to leave the CPU",
    )
    parser.add_argument("--strict", action="store_true", help="exit 1 if a target is missed")
    args = parser.parse_args(argv)
    if args.duration is not None and args.duration <= 0:
        parser.error("--duration must be positive")
    if args.wait_quiet < 0:
        parser.error("--wait-quiet must be >= 0")
    try:
        names = _selected(args.only)
    except ValueError as exc:
        parser.error(str(exc))
    signal.signal(signal.SIGTERM, _raise_exit)
    status = 0
    for name in names:
        bench = BENCHMARKS[name]
        try:
            path, doc = run_one(
                name,
                bench,
                quick=args.quick,
                duration=args.duration,
                profile=args.profile_leader,
                wait_quiet_s=args.wait_quiet,
                out_dir=args.out_dir.resolve(),
            )
        except BenchTimeout as exc:
            print(f"{name}: {exc}", file=sys.stderr)
            status = 1
            continue
        print(f"{name}: wrote {os.path.relpath(path)}")
        for line in bench.summary(doc):
            print(line)
        if doc.get("errors") or (args.strict and not all(doc.get("targets_met", {}).values())):
            status = 1
    return status


if __name__ == "__main__":
    sys.exit(main())
