"""docs/field-reports.md#field-report-2 on a real 3-server cluster with a real client agent (mock driver).

A periodic batch job launches every second (7-field cron: seconds first, year last); each
child runs 2 s on the client. The leader is SIGKILLed three times while it runs (restarted
each time so a quorum remains). Then every server is stopped, and each data dir is replayed
with the offline state tool's code: at EVERY raft index, the parent's children counts are
non-negative and equal a recount of its children's statuses (and every other summary
counter a recount from allocs). The same for a parameterized job dispatched 50 times across
a leader kill.
"""

from __future__ import annotations

import functools
import itertools
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from deploy.cluster import LocalCluster, wait_for
from drover.scheduler.periodic import SECOND_NS, launch_ns_from_id, prev_periodic_launch
from drover.scheduler.structs import PeriodicConfig
from drover.sdk import DroverClient
from drover.v1 import structs_pb2
from tests.cluster.conftest import ready_cluster
from tests.cluster.jobs import child_jobs, service_job
from tests.cluster.replay import ReplayReport, assert_servers_agree, check_every_index

EVERY_SECOND = "* * * * * * *"
EVERY_SECOND_CONFIG = PeriodicConfig(enabled=True, spec=EVERY_SECOND, time_zone="UTC")


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    """Three servers and one client agent (real processes), always stopped afterwards."""
    with ready_cluster(tmp_path / "cluster", servers=3, clients=1) as c:
        yield c


def batch_job(job_id: str, run_for: str) -> structs_pb2.Job:
    job = service_job(job_id, count=1)
    job.type = "batch"
    job.groups[0].tasks[0].config_json = f'{{"run_for": "{run_for}"}}'
    return job


def kill_leader_and_recover(cluster: LocalCluster, progress: Callable[[], None]) -> int:
    """SIGKILL the leader, wait for a new one and for ``progress()`` under it, restart the
    killed server and wait until it has caught up. Returns the killed server's index."""
    leader = cluster.leader_index(timeout=60)
    cluster.kill(leader, signal.SIGKILL)
    cluster.wait_for_leader(timeout=60)
    progress()
    cluster.restart(leader)

    def caught_up() -> bool:
        answers = {i: cluster.query_digest(i) for i in range(3)}
        if any(a is None for a in answers.values()):
            return False
        commit = max(a.commit_index for a in answers.values() if a is not None)
        restarted = answers[leader]
        return restarted is not None and restarted.applied_index >= commit - 20

    wait_for(caught_up, 60, 0.2, f"restarted s{leader + 1} to catch up")
    return leader


def replay_all(cluster: LocalCluster, parents: list[str]) -> list[ReplayReport]:
    """Once the cluster is quiet and every server holds the whole log, stop it and replay
    every server's data dir. The states must be equal at every index two servers both
    replayed, and every such index must hold the same term on both (raft's log matching):
    a comparison that silently skipped indexes would prove nothing about them."""
    cluster.wait_converged(timeout=60)
    cluster.stop_all()
    reports = [check_every_index(cluster.base_dir / name, parents) for name in cluster.server_names]
    compared = assert_servers_agree(reports)
    first, *others = reports
    shared = sum(len(_indexes(first) & _indexes(other)) for other in others)
    assert compared == shared > 0, f"{compared} states compared, {shared} indexes replayed by s1 and another"
    return reports


def _indexes(report: ReplayReport) -> set[int]:
    return {index for index, _term in report.digests}


def test_field_report_2__periodic_every_second__three_leader_kills__children_exact_at_every_index(
    cluster: LocalCluster,
) -> None:
    started = time.monotonic()
    with DroverClient(cluster.grpc_addresses, retry_deadline=60) as client:
        job = batch_job("tick", run_for="2s")
        job.periodic.CopyFrom(structs_pb2.PeriodicConfig(enabled=True, spec=EVERY_SECOND, time_zone="UTC"))
        assert client.register_job(job).eval_id == "", "a periodic parent is a template: no eval"

        def launched_at_least(n: int) -> None:
            wait_for(lambda: len(child_jobs(client, "tick")) >= n, 60, 0.2, f"{n} children of tick")

        launched_at_least(3)
        for _ in range(3):
            before = len(child_jobs(client, "tick"))
            kill_leader_and_recover(cluster, functools.partial(launched_at_least, before + 3))
        launched_at_least(len(child_jobs(client, "tick")) + 3)

        # Stop launching, let the last children finish on the client.
        client.deregister_job("tick")
        wait_for(
            lambda: all(c.status == "dead" for c in child_jobs(client, "tick")),
            60,
            0.2,
            "every child to finish",
        )
        live = child_jobs(client, "tick")
        summary = client.get_job("tick").summary
        assert (summary.children.pending, summary.children.running, summary.children.dead) == (
            0,
            0,
            len(live),
        )
    running_s = time.monotonic() - started

    reports = replay_all(cluster, ["tick"])

    for report in reports:
        assert len(report.launches) >= 15
        assert len(report.terms) >= 4, f"{report.server}: three leader changes, terms {sorted(report.terms)}"
        # No slot launched twice: the FSM applied each (parent, slot) once, and each child once.
        slots = Counter(report.launches)
        assert max(slots.values()) == 1, [s for s, n in slots.items() if n > 1]
        assert max(report.children_seen.values()) == 1
        assert {c.id for c in live} == set(report.children_seen)
        # A launch's slot is the second in its child's ID, and slots only move forward.
        launched = [ns for _, ns in report.launches]
        assert launched == sorted(launched)
        assert {launch_ns_from_id(i) for i in report.children_seen} == set(launched)
        # At most one catch-up launch, for the latest slot: each launch is for the latest
        # slot at or before the moment its leader proposed it (the child's submit time, that
        # leader's clock). A leader that replayed the slots missed while no one led (or
        # while a tick was late) would propose older ones. Nothing here depends on how
        # promptly a loaded machine ran the tick.
        latest = [prev_periodic_launch(EVERY_SECOND_CONFIG, p) for p in report.proposed_ns]
        stale = [(s, p) for s, p, want in zip(launched, report.proposed_ns, latest, strict=True) if s != want]
        assert not stale, f"{report.server}: (slot, proposed at) of launches not for the latest slot: {stale}"
    gaps = [b - a for a, b in itertools.pairwise(launched) if b - a > SECOND_NS]
    print(
        f"periodic children: {len(launched)} launches, {len(gaps)} gaps (max {max(gaps, default=0) // SECOND_NS} s),"
        f" {reports[0].indexes} indexes checked per server, {running_s:.0f} s of running"
    )


def test_field_report_2__parameterized_dispatched_50_times_across_a_leader_kill__children_exact_at_every_index(
    cluster: LocalCluster,
) -> None:
    with DroverClient(cluster.grpc_addresses, retry_deadline=60) as client:
        job = batch_job("encode", run_for="500ms")
        job.parameterized.CopyFrom(
            structs_pb2.ParameterizedConfig(payload="optional", meta_required=["n"], meta_optional=["codec"])
        )
        client.register_job(job)
        dispatched: list[str] = []
        killed = -1
        for n in range(50):
            if n == 25:
                killed = cluster.leader_index(timeout=60)
                cluster.kill(killed, signal.SIGKILL)
            resp = client.dispatch_job("encode", meta={"n": str(n)}, payload=f"frame {n}".encode())
            dispatched.append(resp.dispatched_job_id)
        cluster.restart(killed)
        wait_for(
            lambda: (
                len(child_jobs(client, "encode")) >= 50
                and all(c.status == "dead" for c in child_jobs(client, "encode"))
            ),
            90,
            0.2,
            "every dispatched child to finish",
        )
        live = {c.id: c for c in child_jobs(client, "encode")}
        assert set(dispatched) <= set(live)
        child = live[dispatched[7]]
        assert (child.dispatched, child.payload, child.meta["n"]) == (True, b"frame 7", "7")
        summary = client.get_job("encode").summary
        assert (summary.children.pending, summary.children.running, summary.children.dead) == (
            0,
            0,
            len(live),
        )

    reports = replay_all(cluster, ["encode"])

    for report in reports:
        assert len(report.terms) >= 2
        assert set(report.children_seen) == set(live)
        assert max(report.children_seen.values()) == 1


def test_periodic_and_dispatch__cli_end_to_end__and_offline_tools_refuse_while_running(
    tmp_path: Path,
) -> None:
    """One server, one client: the commands an operator types, then the offline tools."""
    # The forced launch below must place at once (a placement failure exits 2).
    with ready_cluster(tmp_path / "one", servers=1, clients=1) as cluster:
        env = {**os.environ, "DROVER_ADDR": cluster.grpc_addresses[0]}

        def cli(*args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                [sys.executable, "-m", "drover.cli", *args],
                capture_output=True,
                text=stdin is None,
                input=stdin,
                timeout=120,
                env=env,
            )

        hourly = tmp_path / "hourly.hcl"
        hourly.write_text(
            'job "nightly" {\n type = "batch"\n periodic {\n crons = ["0 3 * * *", "30 4 * * *"]\n'
            ' time_zone = "America/New_York"\n prohibit_overlap = true\n }\n'
            ' group "g" {\n task "t" {\n driver = "mock"\n config { run_for = "1s" }\n }\n }\n}\n'
        )
        params = tmp_path / "params.hcl"
        params.write_text(
            'job "encode" {\n type = "batch"\n parameterized {\n payload = "required"\n'
            ' meta_required = ["file"]\n }\n'
            ' group "g" {\n task "t" {\n driver = "mock"\n config { run_for = "1s" }\n }\n }\n}\n'
        )
        for path in (hourly, params):
            result = cli("job", "run", str(path))
            assert result.returncode == 0, result.stderr

        forced = cli("job", "periodic", "force", "nightly")
        assert forced.returncode == 0, forced.stderr
        assert 'Force periodic successful: launched job "nightly/periodic-' in forced.stdout
        assert 'finished with status "complete"' in forced.stdout

        payload = tmp_path / "input.txt"
        payload.write_text("hello")
        dispatched = cli("job", "dispatch", "-meta", "file=a.mp4", "-detach", "encode", str(payload))
        assert dispatched.returncode == 0, dispatched.stderr
        assert dispatched.stdout.startswith('Dispatched job "encode/dispatch-')
        missing = cli("job", "dispatch", "encode", str(payload))
        assert missing.returncode == 1
        assert missing.stderr.startswith("Error: meta.file: required by job")

        with DroverClient(cluster.grpc_addresses) as client:
            wait_for(
                lambda: all(
                    c.status == "dead" for c in child_jobs(client, "nightly") + child_jobs(client, "encode")
                ),
                60,
                0.2,
                "children to finish",
            )
        status = cli("job", "status", "nightly")
        assert status.returncode == 0, status.stderr
        assert "Cron                 = 0 3 * * *, 30 4 * * *" in status.stdout
        assert "Next Periodic Launch = " in status.stdout
        assert "Children Job Summary\nPending  Running  Dead\n0        0        1" in status.stdout
        assert "Recent Launches\nID" in status.stdout and "nightly/periodic-" in status.stdout

        reconciled = cli("system", "reconcile", "summaries")
        assert reconciled.returncode == 0, reconciled.stderr
        assert "all were exact, nothing corrected" in reconciled.stdout

        data_dir = str(cluster.base_dir / "s1")
        busy = cli("operator", "raft", "state", "-data-dir", data_dir)
        assert (busy.returncode, busy.stdout) == (1, "")
        assert busy.stderr.startswith(f"Error: data dir {data_dir} is in use by a running server (pid ")
        assert busy.stderr.count("\n") == 1

        cluster.stop_all()
        logs = cli("operator", "raft", "logs", "-data-dir", data_dir)
        assert logs.returncode == 0, logs.stderr
        assert '"type": "ENTRY_TYPE_RECONCILE_SUMMARIES"' in logs.stdout
        state = cli("operator", "raft", "state", "-data-dir", data_dir, "-last-index", "-1")
        assert state.returncode == 0, state.stderr
        assert '"job_summaries"' in state.stdout

    report = check_every_index(Path(data_dir), ["nightly", "encode"])
    assert report.launches and not report.refused_launches
