"""The chaos report: JSON in ``bench-results/chaos-<UTC>.json``, and a PNG timeline.

The JSON holds the seed and configuration, the planned schedule and the timeline of what
the nemesis actually did, operation counts and rates, every leader failover with its
duration (leader SIGKILL to the first acknowledged write after it) and their p50/p99
against the target, and each invariant with pass/fail and its first problems.

The PNG (same name, ``.png``) needs matplotlib, which is not a drover dependency but the
``chaos`` extra (``pip install -e '.[chaos]'``; ``make chaos`` installs it): without it the
plot is skipped and the report says so, so ``make test``'s short run never needs it. It is
drawn with the Agg backend (no display): x is seconds since the run started; one lane per
server shows when it was down, paused or cut off from raft, one lane when a real client's
connections were cut (darker once the servers marked it disconnected), one lane marks each
leader the nemesis saw take over; below, acknowledged writes per second.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

from tests.chaos.checker import CheckResult
from tests.chaos.history import History
from tests.chaos.nemesis import Failover
from tests.chaos.workload import READ_KIND

FAILOVER_TARGET_P50_S: Final = 2.0
FAILOVER_TARGET_P99_S: Final = 5.0


def percentile(values: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile (``q`` in 0..100); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def failover_figures(failovers: Sequence[Failover]) -> dict[str, Any]:
    durations = [f.duration_s for f in failovers if f.duration_s is not None]
    elections = [f.t_elected - f.t_kill for f in failovers if f.t_elected is not None]
    p50, p99 = percentile(durations, 50), percentile(durations, 99)
    return {
        "count": len(failovers),
        "measured": len(durations),
        "p50_s": None if p50 is None else round(p50, 3),
        "p99_s": None if p99 is None else round(p99, 3),
        "max_s": round(max(durations), 3) if durations else None,
        "election_p50_s": None if not elections else round(percentile(elections, 50) or 0, 3),
        "target": {"p50_s": FAILOVER_TARGET_P50_S, "p99_s": FAILOVER_TARGET_P99_S},
        "meets_target": p50 is not None
        and p99 is not None
        and p50 < FAILOVER_TARGET_P50_S
        and p99 < FAILOVER_TARGET_P99_S,
        "each": [f.to_dict() for f in failovers],
    }


def op_figures(history: History, workload_s: float) -> dict[str, Any]:
    ops = history.ops()
    by_kind: dict[str, Counter[str]] = {}
    errors: Counter[str] = Counter()
    for op in ops:
        by_kind.setdefault(op.kind, Counter())[op.outcome or "open"] += 1
        if op.error:
            errors[op.error.split(":", 1)[0]] += 1
    acked = sum(op.ok and op.kind != READ_KIND for op in ops)  # acknowledged writes
    return {
        "total": len(ops),
        "acknowledged": acked,
        "unknown_outcome": sum(op.unknown for op in ops),
        "definite_failure": sum(op.failed for op in ops),
        "workload_s": round(workload_s, 1),
        "acknowledged_per_s": round(acked / workload_s, 1) if workload_s > 0 else None,
        "by_kind": {k: dict(v) for k, v in sorted(by_kind.items())},
        "errors_by_code": dict(errors),
    }


def build_report(
    *,
    config: dict[str, Any],
    history: History,
    schedule: list[dict[str, Any]],
    timeline: list[dict[str, Any]],
    fault_counts: dict[str, int],
    failovers: Sequence[Failover],
    checks: Sequence[CheckResult],
    workload_s: float,
    phases: dict[str, float],
    notes: list[str],
    reconnects: list[dict[str, Any]] | None = None,
    disagreements: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    executed = sum(fault_counts.values())
    return {
        "kind": "chaos",
        "config": config,
        "passed": all(c.passed for c in checks),
        "invariants": {c.name: c.to_dict() for c in checks},
        "failovers": failover_figures(failovers),
        "operations": op_figures(history, workload_s),
        "nemesis": {
            "faults_executed": fault_counts,
            "schedule": schedule[: executed + 1],
            "timeline": timeline,
        },
        "clients": {"cuts": fault_counts.get("cut-client", 0), "windows": reconnects or []},
        "disagreements": disagreements or [],
        "phases_s": {k: round(v, 1) for k, v in phases.items()},
        "notes": notes,
    }


def write_report(report: dict[str, Any], results_dir: Path, stamp: str, acked_times: list[float]) -> Path:
    """Write the JSON (and the PNG beside it when it can); returns the JSON's path."""
    results_dir.mkdir(parents=True, exist_ok=True)
    path = results_dir / f"chaos-{stamp}.json"
    report["plot"] = plot_timeline(report, acked_times, path.with_suffix(".png"))
    path.write_text(json.dumps(report, indent=2) + "\n")
    return path


def _spans(timeline: list[dict[str, Any]], end: float) -> dict[str, list[tuple[float, float, str]]]:
    """Per server, (start, end, what) for each time it was down, paused or cut off; per
    client (keyed by its name), each cut and, within it, the time it was marked disconnected."""
    opened: dict[tuple[str, str], float] = {}
    spans: dict[str, list[tuple[float, float, str]]] = {}
    starts = {
        "sigkill": "down",
        "sigterm": "down",
        "sigstop": "paused",
        "partition": "cut off",
        "cut-client": "client cut",
        "client-disconnected": "disconnected",
    }
    ends = {
        "restart": ("down",),
        "sigcont": ("paused",),
        "heal": ("cut off",),
        "heal-client": ("client cut", "disconnected"),
    }
    for event in timeline:
        who = event.get("server") or event.get("client")
        if who is None:
            continue
        kind = event["event"]
        if kind in starts:
            opened.setdefault((who, starts[kind]), event["t"])
        for what in ends.get(kind, ()):
            if (who, what) in opened:
                t0 = opened.pop((who, what))
                spans.setdefault(who, []).append((t0, event["t"], what))
    for (who, what), t0 in opened.items():
        spans.setdefault(who, []).append((t0, end, what))
    return spans


def leader_changes(timeline: list[dict[str, Any]]) -> list[tuple[float, str]]:
    """(t, server) each time the nemesis saw a different server lead."""
    out: list[tuple[float, str]] = []
    for event in timeline:
        if event["event"] in ("leader", "leader-elected") and (not out or out[-1][1] != event["server"]):
            out.append((event["t"], event["server"]))
    return out


def plot_timeline(report: dict[str, Any], acked_times: list[float], path: Path) -> str:
    """Draw the timeline; returns the PNG's path, or why there is none."""
    try:
        import matplotlib  # type: ignore[import-not-found,unused-ignore]

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        return "skipped: matplotlib is not installed (pip install -e '.[chaos]' to get the PNG timeline)"
    timeline = report["nemesis"]["timeline"]
    end = max([e["t"] for e in timeline] + acked_times + [1.0])
    spans = _spans(timeline, end)
    # LocalCluster names server i "s{i+1}": a server no fault touched still gets its lane.
    named = {f"s{i + 1}" for i in range(report["config"]["servers"])}
    servers = sorted({e["server"] for e in timeline if "server" in e} | named)
    clients = sorted({e["client"] for e in timeline if "client" in e})
    colors = {
        "down": "tab:red",
        "paused": "tab:orange",
        "cut off": "tab:purple",
        "client cut": "lightsteelblue",
        "disconnected": "tab:blue",
    }
    lanes = [*servers, "client cuts", "leader"]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(14, 6.5), sharex=True, height_ratios=[2.2, 1])
    for row, server in enumerate(servers):
        for t0, t1, what in spans.get(server, []):
            top.broken_barh([(t0, max(t1 - t0, 0.05))], (row - 0.4, 0.8), color=colors[what])
    client_row = len(servers)
    for name in clients:
        for t0, t1, what in sorted(spans.get(name, []), key=lambda s: s[2] == "disconnected"):
            inner = what == "disconnected"
            height = 0.5 if inner else 0.8
            top.broken_barh([(t0, max(t1 - t0, 0.05))], (client_row - height / 2, height), color=colors[what])
            if not inner:
                top.text(t0, client_row + 0.42, name, fontsize=7, va="bottom")
    leader_row = client_row + 1
    changes = leader_changes(timeline)
    if changes:
        top.plot([t for t, _ in changes], [leader_row] * len(changes), "k^", markersize=6)
        for n, (t, server) in enumerate(changes):
            # Alternate heights: a leader seen just before it is killed and its successor
            # are often a second apart.
            top.text(t, leader_row + (0.15 if n % 2 == 0 else 0.45), server, fontsize=7, ha="center")
    for failover in report["failovers"]["each"]:
        top.axvline(failover["t_kill"], color="grey", linewidth=0.5)
    top.set_yticks(range(len(lanes)), lanes)
    top.set_ylim(-0.6, leader_row + 0.9)
    top.set_title(
        f"seed {report['config']['seed']}: red down, orange paused, purple raft-partitioned, "
        f"blue client cut (dark: marked disconnected), ^ new leader; "
        f"failover p50 {report['failovers']['p50_s']}s p99 {report['failovers']['p99_s']}s",
        fontsize=9,
    )
    buckets = Counter(int(t) for t in acked_times)
    xs = list(range(int(end) + 1))
    bottom.plot(xs, [buckets.get(x, 0) for x in xs], linewidth=0.8)
    bottom.set_ylabel("acked writes/s")
    bottom.set_xlabel("seconds since start")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return str(path)
