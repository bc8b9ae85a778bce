"""Run one chaos experiment: ``python -m tests.chaos.run --servers 3|5 --minutes M --seed S [--quick]``.

Phases, each bounded by a deadline (nothing sleeps and hopes):

1. start ``servers`` real server processes on loopback (LocalCluster, always stopped at
   the end) and wait until they settle; start ``clients`` real client agents behind their
   own proxies (tests/chaos/clients.py, always stopped with their tasks and proxies) and
   wait until each runs its raw_exec job;
2. workload and live checker start; the nemesis runs its schedule for ``minutes``, then
   heals everything;
3. the workload stops writing (the simulated clients and heartbeats go on), and the run
   waits for the cluster to settle: no eval pending, the leader's index quiet, every
   server at the same digest and index; then for the real clients' tasks to run again;
4. snapshots from the leader and from each server, the logs, then every server stopped
   and its log replayed offline, every entry of every server's journal checked;
5. the checker decides every invariant; the report goes to ``bench-results/`` (JSON, and
   the PNG timeline when matplotlib is installed: ``pip install -e '.[chaos]'``).

Exit status 0 when every invariant passed, 1 otherwise.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from deploy.cluster import REPO_ROOT, ClusterError, LocalCluster, wait_for
from drover.scheduler.structs import EVAL_STATUS_PENDING, RejectionTrackerConfig
from drover.sdk import DroverClient
from drover.server.snapshot import from_snapshot
from drover.server.state_store import Tables
from tests.chaos import checker
from tests.chaos.checker import CheckResult
from tests.chaos.clients import SERVER_ARGS as CLIENT_SERVER_ARGS
from tests.chaos.clients import RealClients, Window
from tests.chaos.disagreement import ENV as DISAGREE_ENV
from tests.chaos.disagreement import DisagreementControl
from tests.chaos.history import History
from tests.chaos.live import LiveChecker
from tests.chaos.nemesis import Nemesis, plan_schedule
from tests.chaos.partition import ENV as PARTITION_ENV
from tests.chaos.partition import PartitionControl
from tests.chaos.report import build_report, write_report
from tests.chaos.workload import READ_KIND, Workload, WorkloadConfig
from tests.cluster.conftest import wait_settled

RESULTS_DIR = REPO_ROOT / "bench-results"
SETTLE_TIMEOUT_S = 120.0
CLIENTS_START_TIMEOUT_S = 90.0
QUIET_S = 3.0
# Pending evals due this soon are waited for; later ones (a failed eval's follow-up, a
# minute out) are "delayed" and reported as such.
DUE_SOON_S = 5.0


@dataclass(frozen=True, slots=True)
class ChaosConfig:
    servers: int = 3
    minutes: float = 1.5
    seed: int = 1
    quick: bool = False
    partitions: bool = True
    # Real client agents behind proxies, cut by the nemesis (0: simulated clients only).
    clients: int = 2
    # Plan disagreements the nemesis provokes (tests/chaos/disagreement.py), so the
    # rejection bound of docs/design.md#invariant-6 is exercised.
    disagreements: bool = True
    workload: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.servers not in (3, 5):
            raise ValueError(f"servers must be 3 or 5, got {self.servers}")
        if self.clients < 0:
            raise ValueError(f"clients must be >= 0, got {self.clients}")


@dataclass
class ChaosOutcome:
    report: dict[str, Any]
    path: Path
    checks: list[CheckResult]

    @property
    def passed(self) -> bool:
        return all(c.passed for c in self.checks)

    def failed(self) -> list[CheckResult]:
        return [c for c in self.checks if not c.passed]


def _stamp() -> str:
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())


def _fetch_tables(address: str, stale: bool) -> Tables:
    with DroverClient(address, timeout=20, retry_deadline=30) as client:
        return from_snapshot(client.snapshot_save(stale=stale).snapshot)


def _settle(cluster: LocalCluster) -> tuple[tuple[str, int] | None, str]:
    """Wait until no pending eval is due soon and the leader's applied index has stayed put
    for ``QUIET_S``, then for one digest and index on every server. Returns those (or None)
    and what timed out."""
    cluster.wait_for_leader(SETTLE_TIMEOUT_S)
    deadline = time.monotonic() + SETTLE_TIMEOUT_S
    last: dict[str, Any] = {"index": -1, "since": time.monotonic(), "due": 0}
    with DroverClient(cluster.grpc_addresses, timeout=10, retry_deadline=30) as client:

        def settled() -> bool:
            index = client.state_digest().applied_index
            if index != last["index"]:
                last.update(index=index, since=time.monotonic())
            soon = time.time_ns() + int(DUE_SOON_S * 1e9)
            pending = client.list_evals(status=EVAL_STATUS_PENDING).evals
            last["due"] = sum(e.wait_until_ns <= soon for e in pending)
            return bool(last["due"] == 0 and time.monotonic() - last["since"] >= QUIET_S)

        try:
            wait_for(
                settled,
                SETTLE_TIMEOUT_S,
                0.5,
                lambda: (
                    f"quiet: {last['due']} pending evals due within {DUE_SOON_S:g}s, index {last['index']}"
                ),
            )
        except TimeoutError as exc:
            return None, str(exc)
    try:
        return cluster.wait_converged(max(10.0, deadline - time.monotonic())), ""
    except ClusterError as exc:
        # The first line and each server's last answer; not the logs' tails.
        lines = str(exc).split("\n--- ")[0].splitlines()
        return None, " | ".join(line.strip() for line in lines)


def run_chaos(config: ChaosConfig, base_dir: Path, results_dir: Path = RESULTS_DIR) -> ChaosOutcome:
    stamp = _stamp()
    phases: dict[str, float] = {}
    notes: list[str] = []
    history = History()
    schedule = plan_schedule(
        config.seed,
        config.servers,
        quick=config.quick,
        partitions=config.partitions,
        clients=config.clients,
        disagreements=config.disagreements,
    )
    partition_file = base_dir / "partition.json"
    disagree_file = base_dir / "disagreement.json"
    cluster_dir = base_dir / "cluster"
    env: dict[str, str] = {}
    if config.partitions:
        env[PARTITION_ENV] = str(partition_file)
    disagreement = None
    base_dir.mkdir(parents=True, exist_ok=True)
    if config.disagreements:
        disagreement = DisagreementControl(disagree_file)
        env[DISAGREE_ENV] = str(disagree_file)
    module = "tests.chaos.fault_agent" if env else "drover.cli"
    workload_config = WorkloadConfig(seed=config.seed, **config.workload)
    checks: list[CheckResult] = []
    server_args = CLIENT_SERVER_ARGS if config.clients else ()
    whole_run = Window("run", "*")
    client_logs: dict[str, str] = {}
    with LocalCluster(
        cluster_dir, servers=config.servers, env=env or None, agent_module=module, extra_args=server_args
    ) as cluster:
        t0 = time.monotonic()
        wait_settled(cluster, timeout=60)
        phases["start"] = time.monotonic() - t0
        partitions = (
            PartitionControl(partition_file, cluster.server_names, cluster.raft_addresses)
            if config.partitions
            else None
        )
        workload = Workload(cluster.grpc_addresses, history, workload_config)
        clients = RealClients(cluster, config.clients, workload_config) if config.clients else None
        live = LiveChecker(cluster, history)
        nemesis = Nemesis(cluster, history, schedule, partitions, clients, disagreement)
        try:
            workload.setup()
            if clients is not None:
                t_clients = time.monotonic()
                clients.start()
                workload.register_client_jobs(clients.jobs())
                whole_run.before, problem = clients.wait_settled(CLIENTS_START_TIMEOUT_S)
                whole_run.t_before = history.now()
                if problem:
                    whole_run.problems.append(f"at the start: {problem}")
                phases["clients"] = time.monotonic() - t_clients
            workload.start()
            live.start()
            t1 = time.monotonic()
            nemesis.run(config.minutes * 60)
            phases["nemesis"] = time.monotonic() - t1
            workload.stop_writes()
            workload_s = time.monotonic() - t1
            t2 = time.monotonic()
            converged, settle_error = _settle(cluster)
            if clients is not None:
                whole_run.after, problem = clients.wait_settled(SETTLE_TIMEOUT_S)
                whole_run.t_after = history.now()
                if problem:
                    whole_run.problems.append(f"at the end: {problem}")
            phases["settle"] = time.monotonic() - t2
            t3 = time.monotonic()
            live.stop()
            live.poll_once()
            leader = cluster.grpc_addresses[cluster.leader_index(SETTLE_TIMEOUT_S)]
            final = _fetch_tables(leader, stale=False)
            final_ns = time.time_ns()
            per_server = {
                name: _fetch_tables(address, stale=True)
                for name, address in zip(cluster.server_names, cluster.grpc_addresses, strict=True)
            }
        finally:
            workload.stop()
            live.stop()
            if clients is not None:
                client_logs = {name: clients.log(name) for name in clients.names}
                clients.close()
        logs = {name: cluster.log(i) for i, name in enumerate(cluster.server_names)}
        cluster.stop_all()
    tracker = final.scheduler_config.rejection_tracker or RejectionTrackerConfig()
    checks = [
        checker.check_acked_jobs(history, final),
        checker.check_acked_nodes(history, final),
        checker.check_realtime_order(history),
        checker.check_stale_reads(history),
        checker.check_converged(converged, settle_error, per_server),
        checker.check_summaries(per_server),
        checker.check_system_allocs(per_server),
        checker.check_evals(final, final_ns),
        checker.check_plan_rejections(
            logs,
            tracker.threshold,
            tracker.window_ns / 1e9,
            nemesis.disagreements if config.disagreements else None,
        ),
        checker.check_logs(logs),
        checker.check_tracebacks(logs, client_logs),
        checker.check_live(live.samples, live.unavailable, cluster.server_names),
        checker.check_workload(workload.errors),
    ]
    data_dirs = {name: cluster_dir / name for name in cluster.server_names}
    terms = checker.journal_terms(data_dirs)
    for failover in nemesis.failovers:
        failover.measure(history, terms)
    t4 = time.monotonic()
    checks.append(checker.check_replay(data_dirs, converged))
    phases["replay"] = time.monotonic() - t4
    if clients is not None:
        checks.append(checker.check_allocs_kept([*nemesis.reconnects, whole_run], history))
        checks.append(checker.check_client_logs(client_logs))
    else:
        notes.append(
            "invariant 5 (allocs kept across a client reconnect keep their IDs and processes) is not "
            "checked: no real client agents in this run (--clients 0)"
        )
    phases["check"] = time.monotonic() - t3
    if not config.partitions:
        notes.append("raft partitions disabled for this run (--no-partitions)")
    if not config.disagreements:
        notes.append(
            "plan disagreements disabled for this run (--no-disagreements): the rejection bound "
            "(invariant 6) was not exercised"
        )
    report = build_report(
        config=asdict(config),
        history=history,
        schedule=[f.to_dict() for f in schedule],
        timeline=nemesis.timeline,
        fault_counts=nemesis.counts,
        failovers=nemesis.failovers,
        checks=checks,
        workload_s=workload_s,
        phases=phases,
        notes=notes,
        reconnects=[w.to_dict() for w in [*nemesis.reconnects, whole_run]] if clients is not None else [],
        disagreements=[d.to_dict() for d in nemesis.disagreements],
    )
    acked_times = [op.t_complete for op in history.ops() if op.ok and op.kind != READ_KIND]
    path = write_report(report, results_dir, stamp, acked_times)
    return ChaosOutcome(report, path, checks)


def _describe_cuts(report: dict[str, Any]) -> str:
    if not report["config"]["clients"]:
        return "none (no real clients)"
    parts = []
    for w in report["clients"]["windows"]:
        if w["kind"] != "cut" or w["t_cut"] is None:
            continue
        gone = (
            "never marked disconnected"
            if w["t_disconnected"] is None
            else f"disconnected after {w['t_disconnected'] - w['t_cut']:.1f}s"
        )
        back = (
            "not back in time"
            if w["t_reconnected"] is None or w["t_heal"] is None
            else f"running again {w['t_reconnected'] - w['t_heal']:.1f}s after the heal"
        )
        parts.append(f"{w['client']} at t={w['t_cut']:.1f}s ({gone}, {back})")
    return f"{len(parts)}" + (": " + "; ".join(parts) if parts else "")


def _describe_disagreements(report: dict[str, Any]) -> str:
    if not report["config"]["disagreements"]:
        return "none (disabled)"
    parts = [
        f"{d['node']} at t={d['t_start']:.1f}s ("
        + (
            "never marked ineligible"
            if d["marked_ineligible_after_s"] is None
            else f"marked ineligible after {d['marked_ineligible_after_s']:.1f}s"
        )
        + ")"
        for d in report["disagreements"]
    ]
    return f"{len(parts)}" + (": " + "; ".join(parts) if parts else "")


def _describe_replay(report: dict[str, Any]) -> str:
    replay = report["invariants"].get("replay_every_index", {}).get("figures", {})
    return ", ".join(
        f"{name} {f['entries']} entries {f['first']}..{f['last']} from {f['start']}"
        f" ({f['states_checked']} states checked, {f['states_shared']} shared)"
        for name, f in sorted(replay.get("servers", {}).items())
    )


def summarize(outcome: ChaosOutcome) -> str:
    report = outcome.report
    failovers = report["failovers"]
    ops = report["operations"]
    lines = [
        f"chaos seed={report['config']['seed']} servers={report['config']['servers']} "
        f"minutes={report['config']['minutes']}: {'PASS' if outcome.passed else 'FAIL'}",
        f"  faults: {report['nemesis']['faults_executed']}",
        f"  client cuts: {_describe_cuts(report)}",
        f"  operations: {ops['acknowledged']} acknowledged ({ops['acknowledged_per_s']}/s), "
        f"{ops['unknown_outcome']} unknown outcome, {ops['definite_failure']} definitely failed",
        f"  failovers: {failovers['measured']}/{failovers['count']} measured, p50 {failovers['p50_s']}s, "
        f"p99 {failovers['p99_s']}s, max {failovers['max_s']}s "
        f"(target p50 < {failovers['target']['p50_s']}s, p99 < {failovers['target']['p99_s']}s: "
        f"{'met' if failovers['meets_target'] else 'NOT met'})",
        f"  plan disagreements: {_describe_disagreements(report)}",
        f"  replayed: {_describe_replay(report)}",
    ]
    for name, result in report["invariants"].items():
        mark = "pass" if result["passed"] else "FAIL"
        lines.append(f"  [{mark}] {name} (invariant {result['invariant'] or '-'})")
        for detail in result["details"][:5]:
            lines.append(f"         {detail}")
    lines.append(f"  phases: {report['phases_s']}")
    lines.append(f"  report: {outcome.path}  plot: {report['plot']}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.chaos.run", description=__doc__.splitlines()[0])
    parser.add_argument("--servers", type=int, choices=(3, 5), default=3)
    parser.add_argument("--minutes", type=float, default=2.0)
    parser.add_argument("--seed", type=int, default=int(time.time()) % 100_000)
    parser.add_argument("--quick", action="store_true", help="shorter gaps and holds between faults")
    parser.add_argument("--no-partitions", dest="partitions", action="store_false")
    parser.add_argument("--clients", type=int, default=2, help="real client agents the nemesis cuts off")
    parser.add_argument(
        "--no-disagreements",
        dest="disagreements",
        action="store_false",
        help="no plan disagreements (the rejection bound is then not exercised)",
    )
    parser.add_argument("--keep", action="store_true", help="keep the data dirs and logs (printed)")
    parser.add_argument("--results-dir", type=Path, default=RESULTS_DIR)
    args = parser.parse_args(argv)
    config = ChaosConfig(
        servers=args.servers,
        minutes=args.minutes,
        seed=args.seed,
        quick=args.quick,
        partitions=args.partitions,
        clients=args.clients,
        disagreements=args.disagreements,
    )
    base = Path(tempfile.mkdtemp(prefix=f"drover-chaos-{args.seed}-"))
    try:
        outcome = run_chaos(config, base, args.results_dir)
    finally:
        if args.keep:
            print(f"data dirs and logs kept in {base}")
        else:
            shutil.rmtree(base, ignore_errors=True)
    print(summarize(outcome))
    return 0 if outcome.passed else 1


if __name__ == "__main__":
    sys.exit(main())
