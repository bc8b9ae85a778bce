"""The foundation benchmark: drover's write path against the two ceilings under it.

Measured in one run on the same machine, one after the other:

1. ``grpc_noop``: a no-op unary gRPC call (what a Python gRPC server can answer at all);
2. ``pysyncobj_bare``: bare pysyncobj tuned like server/raft/tuning.py (what raft can commit);
3. ``drover_register``: Jobs.Register on a 3-server cluster, through the leader at several
   concurrencies and once through a follower;
4. ``drover_write_path_us``: the CPU cost of drover's own code per write, stage by stage,
   on one thread without network or raft (a floor, to read the leader's CPU against).

The ratios say how much of each ceiling drover keeps; the targets are drover's own. CPU
use of every process involved is recorded per phase, including what the rest of the
machine used ("others"): on a shared machine the rates move with it, the CPU cost per
operation (``*_cpu_us_per_*``) much less.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from tests.bench._stats import wait_quiet
from tests.bench.drover_register import RegisterRun, measure_drover_register
from tests.bench.grpc_noop import measure_grpc_noop
from tests.bench.raft_bare import measure_pysyncobj_bare
from tests.bench.write_path import measure_write_path

NAME: Final = "foundation"
MIN_WRITES_VS_NOOP: Final = 0.5
MAX_P50_MS: Final = 5.0
# The p50 target is judged at this many concurrent writers through the leader.
P50_CONCURRENCY: Final = 8
DEFAULT_DROVER_RUNS: Final[tuple[RegisterRun, ...]] = (
    RegisterRun(1, "leader"),
    RegisterRun(8, "leader"),
    RegisterRun(32, "leader"),
    RegisterRun(8, "follower"),
)


@dataclass(frozen=True, slots=True)
class FoundationConfig:
    duration: float
    warmup: float
    noop_client_threads: int = 16
    noop_server_workers: int = 16
    raft_inflight: int = 64
    raft_proposer_threads: int = 4
    payload_bytes: int = 200
    drover_runs: tuple[RegisterRun, ...] = DEFAULT_DROVER_RUNS
    profile_dir: Path | None = None
    # Before each phase, wait up to this long for the machine to be quiet (0: do not wait).
    wait_quiet_s: float = 0.0

    @classmethod
    def make(
        cls, *, quick: bool, duration: float | None, profile_dir: Path | None, wait_quiet_s: float = 0.0
    ) -> FoundationConfig:
        runs = DEFAULT_DROVER_RUNS
        if profile_dir is not None:
            # An extra run with py-spy attached: sampling slows the leader, so it is kept
            # apart from the measured runs and out of the ratios.
            busiest = max((r for r in runs if r.via == "leader"), key=lambda r: r.concurrency)
            runs = (*runs, RegisterRun(busiest.concurrency, "leader", profile=True))
        return cls(
            duration=duration if duration is not None else (3.0 if quick else 10.0),
            warmup=0.5 if quick else 1.0,
            drover_runs=runs,
            profile_dir=profile_dir,
            wait_quiet_s=wait_quiet_s,
        )

    def budget_s(self) -> float:
        """An upper bound for the whole benchmark (set-up included), for the watchdog."""
        phases = 2 + len(self.drover_runs)
        return 240.0 + phases * (self.warmup + self.duration + 45.0 + self.wait_quiet_s)


@dataclass(slots=True)
class _Sections:
    wait_quiet_s: float
    results: dict[str, Any] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    busy_before: dict[str, float] = field(default_factory=dict)

    def settle(self, phase: str) -> None:
        """Note how busy the machine is before ``phase`` (waiting for quiet, if asked to)."""
        self.busy_before[phase] = wait_quiet(self.wait_quiet_s)

    def run(self, key: str, fn: Callable[[], Any]) -> Any:
        print(f"  running {key} ...", flush=True)
        try:
            value = fn()
        except Exception as exc:
            detail = "".join(traceback.format_exception_only(exc)).strip()
            self.errors.append(f"{key}: {detail}")
            self.results[key] = {"error": detail, "traceback": traceback.format_exc()[-4000:]}
            return None
        self.results[key] = value
        return value


def run_foundation(cfg: FoundationConfig) -> dict[str, Any]:
    sections = _Sections(cfg.wait_quiet_s)
    sections.settle("grpc_noop")
    noop = sections.run(
        "grpc_noop",
        lambda: measure_grpc_noop(
            threads=cfg.noop_client_threads,
            server_workers=cfg.noop_server_workers,
            warmup=cfg.warmup,
            duration=cfg.duration,
        ),
    )
    sections.settle("pysyncobj_bare")
    bare = sections.run(
        "pysyncobj_bare",
        lambda: measure_pysyncobj_bare(
            inflight=cfg.raft_inflight,
            threads=cfg.raft_proposer_threads,
            payload_bytes=cfg.payload_bytes,
            warmup=cfg.warmup,
            duration=cfg.duration,
        ),
    )
    drover = sections.run(
        "drover_register",
        lambda: measure_drover_register(
            list(cfg.drover_runs),
            warmup=cfg.warmup,
            duration=cfg.duration,
            profile_dir=cfg.profile_dir,
            before_run=sections.settle,
        ),
    )
    sections.run("drover_write_path_us", measure_write_path)
    runs: list[dict[str, Any]] = []
    cluster: dict[str, Any] = {}
    if drover is not None:
        runs, cluster = drover
        sections.results["drover_register"] = runs
        sections.results["drover_cluster"] = cluster
        if cluster.get("converged") is False:
            sections.errors.append("drover_register: servers did not converge to one state digest")
    _add_cpu_per_op(noop, "server", "requests_per_s", "server_cpu_us_per_call")
    _add_cpu_per_op(bare, "leader", "commits_per_s", "leader_cpu_us_per_commit")
    for run in runs:
        _add_cpu_per_op(run, "leader", "writes_per_s", "leader_cpu_us_per_write")
    ratios = compute_ratios(noop, bare, runs)
    targets = {
        "drover_best_vs_grpc_noop_min": MIN_WRITES_VS_NOOP,
        "drover_p50_ms_max": MAX_P50_MS,
        "drover_p50_judged_at": f"concurrency {P50_CONCURRENCY} via leader",
    }
    p50 = _p50_at(runs, P50_CONCURRENCY)
    best = ratios.get("drover_best_vs_grpc_noop")
    targets_met = {
        "drover_best_vs_grpc_noop": best is not None and best >= MIN_WRITES_VS_NOOP,
        "drover_p50_ms": p50 is not None and p50 < MAX_P50_MS,
    }
    return {
        "config": {
            "duration_s": cfg.duration,
            "warmup_s": cfg.warmup,
            "wait_quiet_s": cfg.wait_quiet_s,
            "drover_runs": [
                {"concurrency": r.concurrency, "via": r.via, "profile": r.profile} for r in cfg.drover_runs
            ],
        },
        "machine_busy_percent_before": sections.busy_before,
        "results": sections.results,
        "ratios": ratios,
        "targets": targets,
        "targets_met": targets_met,
        "errors": sections.errors,
    }


def _add_cpu_per_op(result: dict[str, Any] | None, process: str, rate_key: str, key: str) -> None:
    """CPU microseconds ``process`` spent per operation: steadier than rates on a busy machine."""
    if not result or "error" in result:
        return
    percent = result.get("cpu_percent_of_one_core", {}).get(process)
    rate = result.get(rate_key)
    if percent is not None and rate:
        result[key] = round(percent / 100.0 / rate * 1e6, 1)


def _measured(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in runs if not r.get("profiled") and "writes_per_s" in r]


def _p50_at(runs: list[dict[str, Any]], concurrency: int) -> float | None:
    for run in _measured(runs):
        if run["via"] == "leader" and run["concurrency"] == concurrency:
            return float(run["latency_ms"]["p50"])
    return None


def _ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b <= 0:
        return None
    return round(a / b, 3)


def compute_ratios(
    noop: dict[str, Any] | None, bare: dict[str, Any] | None, runs: list[dict[str, Any]]
) -> dict[str, float | None]:
    noop_rps = noop.get("requests_per_s") if noop else None
    commits = bare.get("commits_per_s") if bare else None
    ratios: dict[str, float | None] = {}
    measured = _measured(runs)
    leader_runs = [r for r in measured if r["via"] == "leader"]
    for run in measured:
        key = f"drover_c{run['concurrency']}_{run['via']}"
        ratios[f"{key}_vs_grpc_noop"] = _ratio(run["writes_per_s"], noop_rps)
        ratios[f"{key}_vs_pysyncobj_bare"] = _ratio(run["writes_per_s"], commits)
    best = max((r["writes_per_s"] for r in leader_runs), default=None)
    ratios["drover_best_vs_grpc_noop"] = _ratio(best, noop_rps)
    ratios["drover_best_vs_pysyncobj_bare"] = _ratio(best, commits)
    ratios["pysyncobj_bare_vs_grpc_noop"] = _ratio(commits, noop_rps)
    for run in measured:
        if run["via"] != "follower":
            continue
        same = next((r for r in leader_runs if r["concurrency"] == run["concurrency"]), None)
        if same is not None:
            c = run["concurrency"]
            ratios[f"follower_vs_leader_c{c}_writes"] = _ratio(run["writes_per_s"], same["writes_per_s"])
            ratios[f"follower_vs_leader_c{c}_p50"] = _ratio(
                run["latency_ms"]["p50"], same["latency_ms"]["p50"]
            )
    return ratios


def summary_lines(doc: dict[str, Any]) -> list[str]:
    """A short human summary of a foundation result document."""
    res = doc["results"]
    lines: list[str] = []

    def lat(d: dict[str, Any]) -> str:
        ms = d["latency_ms"]
        return f"p50 {ms['p50']:7.2f} ms  p99 {ms['p99']:7.2f} ms"

    def cpu(d: dict[str, Any], *names: str) -> str:
        c = d.get("cpu_percent_of_one_core", {})
        parts = [f"{n} {c[n]:.0f}%" for n in names if n in c]
        return "cpu " + ", ".join(parts) if parts else ""

    noop = res.get("grpc_noop", {})
    if "error" in noop:
        lines.append(f"  grpc no-op      ERROR {noop['error']}")
    elif noop:
        lines.append(
            f"  grpc no-op      {noop['requests_per_s']:8.0f} req/s     {lat(noop)}   "
            f"({noop['client_threads']} client threads; {cpu(noop, 'server', 'bench_client', 'others')}; "
            f"server {noop.get('server_cpu_us_per_call', 'n/a')} us cpu/call)"
        )
    bare = res.get("pysyncobj_bare", {})
    if "error" in bare:
        lines.append(f"  pysyncobj bare  ERROR {bare['error']}")
    elif bare:
        followers = [k for k in bare.get("cpu_percent_of_one_core", {}) if k.startswith("follower")]
        lines.append(
            f"  pysyncobj bare  {bare['commits_per_s']:8.0f} commits/s {lat(bare)}   "
            f"({bare['inflight']} in flight; {cpu(bare, 'leader', *followers, 'others')}; "
            f"leader {bare.get('leader_cpu_us_per_commit', 'n/a')} us cpu/commit)"
        )
    drover = res.get("drover_register", [])
    if isinstance(drover, dict):
        lines.append(f"  drover          ERROR {drover.get('error')}")
    else:
        for run in drover:
            tag = f"c{run['concurrency']} via {run['via']}" + (" (py-spy)" if run.get("profiled") else "")
            errors = f", {run['errors']} errors" if run.get("errors") else ""
            lines.append(
                f"  drover {tag:<18}{run['writes_per_s']:6.0f} writes/s  {lat(run)}   "
                f"({cpu(run, 'leader', 'bench_client', 'others')}; "
                f"leader {run.get('leader_cpu_us_per_write', 'n/a')} us cpu/write; leader rss "
                f"{run['leader_rss_mb_before']}->{run['leader_rss_mb_after']} MB{errors})"
            )
    threads = [("grpc no-op server", noop.get("server_threads"))] if isinstance(noop, dict) else []
    if isinstance(drover, list):
        threads += [
            (f"drover leader c{r['concurrency']} {r['via']}", r.get("leader_threads"))
            for r in drover
            if not r.get("profiled")
        ]
    for label, roles in threads:
        if roles:
            parts = ", ".join(
                f"{role} {v.get('cpu_us_per_op', 0):.0f}" for role, v in list(roles.items())[:6]
            )
            lines.append(f"  cpu us/op by thread, {label}: {parts}")
    for run in drover if isinstance(drover, list) else []:
        spy = run.get("py_spy") or {}
        if spy.get("top_own"):
            top = ", ".join(f"{name} {count}" for name, count in list(spy["top_own"].items())[:6])
            lines.append(f"  py-spy (GIL holder, {spy['samples']} samples) top: {top}")
        elif spy.get("error"):
            lines.append(f"  py-spy: {spy['error']}")
    stages = res.get("drover_write_path_us", {})
    if "error" in stages:
        lines.append(f"  write path      ERROR {stages['error']}")
    elif stages:
        parts = ", ".join(
            f"{k} {stages[k]}" for k in ("request_decode", "from_proto", "endpoint", "fsm_apply")
        )
        lines.append(f"  drover's own code per write, one thread, us: {parts}; total {stages['total']}")
    ratios = doc["ratios"]
    met = doc["targets_met"]

    def fmt(value: float | None) -> str:
        return "n/a" if value is None else f"{value:.2f}"

    lines.append(
        f"  RATIO drover/grpc-noop {fmt(ratios.get('drover_best_vs_grpc_noop'))} "
        f"(target >= {MIN_WRITES_VS_NOOP}: {'met' if met['drover_best_vs_grpc_noop'] else 'MISSED'})   "
        f"drover/pysyncobj {fmt(ratios.get('drover_best_vs_pysyncobj_bare'))}   "
        f"pysyncobj/grpc-noop {fmt(ratios.get('pysyncobj_bare_vs_grpc_noop'))}"
    )
    follower = {k: v for k, v in ratios.items() if k.startswith("follower_vs_leader")}
    if follower:
        lines.append("  RATIO " + "   ".join(f"{k} {fmt(v)}" for k, v in follower.items()))
    p50 = _p50_at(drover if isinstance(drover, list) else [], P50_CONCURRENCY)
    lines.append(
        f"  p50 at c{P50_CONCURRENCY} via leader: {fmt(p50)} ms "
        f"(target < {MAX_P50_MS:g} ms: {'met' if met['drover_p50_ms'] else 'MISSED'})"
    )
    noisy = _noisy_phases(doc)
    if noisy:
        lines.append(
            "  NOTE other processes used CPU during: "
            + ", ".join(noisy)
            + " (figures are disturbed; rerun on a quiet machine)"
        )
    for error in doc.get("errors", []):
        lines.append(f"  ERROR {error}")
    return lines


NOISY_OTHERS_PERCENT: Final = 20.0


def _noisy_phases(doc: dict[str, Any]) -> list[str]:
    res = doc["results"]
    phases: list[tuple[str, dict[str, Any]]] = [
        ("grpc_noop", res.get("grpc_noop", {})),
        ("pysyncobj_bare", res.get("pysyncobj_bare", {})),
    ]
    drover = res.get("drover_register", [])
    if isinstance(drover, list):
        phases += [(f"drover c{r['concurrency']} {r['via']}", r) for r in drover]
    out = []
    for name, data in phases:
        others = data.get("cpu_percent_of_one_core", {}).get("others") if isinstance(data, dict) else None
        if others is not None and others > NOISY_OTHERS_PERCENT:
            out.append(f"{name} ({others:.0f}% of a core)")
    return out
