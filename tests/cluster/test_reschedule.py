"""The failure loop, whole: a task exits non-zero on a real client, the client gives up per
its restart policy and reports the alloc failed, the server writes an ``alloc-failure``
evaluation with that report, the scheduler reschedules the alloc now or after the policy's
delay (a delayed evaluation in raft, so a new leader keeps the appointment), and a new
alloc runs, elsewhere when it can.

Real server processes, real client agents running ``raw_exec`` tasks (``sh``), jobs
registered with the ``drover`` CLI from HCL files. Delays are checked from the allocs'
create times and their tasks' finish times, with a tolerance for scheduling and reporting
latency (the lower bound is the policy's delay less the scheduler's 1 s reschedule window).
"""

from __future__ import annotations

import itertools
import re
from pathlib import Path

from deploy.cluster import LocalCluster, wait_for
from drover.sdk import DroverClient
from drover.v1 import structs_pb2
from tests.cluster.cli import run_cli, run_job_file
from tests.cluster.conftest import wait_ready_nodes
from tests.cluster.jobs import NO_RESTARTS, raw_exec_hcl

SECOND = 1_000_000_000
# The scheduler reschedules a failure due within this window at once (scheduler/reconciler/reschedule.py).
WINDOW_NS = SECOND
# Failure report, evaluation, plan and placement: generous on a loaded 2-core machine.
LATENCY_NS = 12 * SECOND


def _service(job_id: str, script: str, reschedule: str, *, job_type: str = "service") -> str:
    return raw_exec_hcl(job_id, script, job_type=job_type, restart=NO_RESTARTS, reschedule=reschedule)


def _constant_delay(attempts: int, *, interval: str, delay: str) -> str:
    """A limited reschedule block: ``attempts`` within ``interval``, each ``delay`` after the failure."""
    return f"""reschedule {{
      attempts       = {attempts}
      interval       = "{interval}"
      delay          = "{delay}"
      delay_function = "constant"
      unlimited      = false
    }}"""


def _cli(cluster: LocalCluster, *args: str) -> str:
    result = run_cli(cluster, *args)
    assert result.returncode == 0, result.stderr
    return result.stdout


def _run_job(
    cluster: LocalCluster,
    tmp_path: Path,
    job_id: str,
    script: str,
    reschedule: str,
    *,
    nodes: int = 2,
    job_type: str = "service",
) -> None:
    """Once ``nodes`` clients are ready, ``drover job run`` the job whose one task runs ``script``."""
    wait_ready_nodes(cluster, nodes)
    run_job_file(cluster, tmp_path, job_id, _service(job_id, script, reschedule, job_type=job_type))


def _allocs(client: DroverClient, job_id: str) -> list[structs_pb2.Allocation]:
    """The job's allocs, full records, oldest first."""
    listed = client.list_allocs(job_id=job_id).allocs
    full = [client.get_alloc(a.id).alloc for a in listed]
    return sorted(full, key=lambda a: (a.create_index, a.id))


def _failed(client: DroverClient, job_id: str, n: int) -> list[structs_pb2.Allocation] | None:
    allocs = _allocs(client, job_id)
    failed = [a for a in allocs if a.client_status == "failed"]
    return allocs if len(failed) >= n else None


def _wait_failed(
    cluster: LocalCluster, client: DroverClient, job_id: str, n: int, timeout_s: float, what: str
) -> list[structs_pb2.Allocation]:
    """The job's allocs once ``n`` of them failed."""
    allocs = wait_for(
        lambda: _failed(client, job_id, n), timeout_s, 0.3, lambda: f"{what}\n" + cluster.logs_tail()
    )
    assert allocs is not None
    return allocs


def _settled(client: DroverClient, job_id: str) -> bool:
    """Every evaluation of the job is finished and none waits for a later time."""
    evals = client.list_evals(job_id=job_id).evals
    return bool(evals) and all(e.status in ("complete", "failed", "canceled") for e in evals)


def _fail_time(alloc: structs_pb2.Allocation) -> int:
    return max((ts.finished_at_ns for ts in alloc.task_states.values()), default=0) or alloc.modify_time_ns


def _gaps(allocs: list[structs_pb2.Allocation]) -> list[int]:
    """From each alloc's failure to its replacement's creation, along the chain."""
    by_id = {a.id: a for a in allocs}
    gaps = []
    for a in allocs:
        if a.previous_allocation:
            gaps.append(a.create_time_ns - _fail_time(by_id[a.previous_allocation]))
    return gaps


def _check_chain(allocs: list[structs_pb2.Allocation]) -> None:
    """Each replacement names the alloc it replaces and carries one more attempt."""
    for earlier, later in itertools.pairwise(allocs):
        assert later.previous_allocation == earlier.id
        assert [e.prev_alloc_id for e in later.reschedule_events][-1] == earlier.id
        assert len(later.reschedule_events) == len(earlier.reschedule_events) + 1


def test_reschedule__attempts_within_interval_then_left_failed(
    shared_two_clients: LocalCluster, tmp_path: Path
) -> None:
    cluster = shared_two_clients
    policy = _constant_delay(2, interval="10m", delay="2s")
    with DroverClient(cluster.grpc_addresses, retry_deadline=60) as client:
        _run_job(cluster, tmp_path, "crash", "exit 1", policy)
        allocs = _wait_failed(cluster, client, "crash", 3, 90, "3 failed allocs")
        wait_for(lambda: _settled(client, "crash"), 60, 0.3, "the job's evaluations to settle")
        allocs = _allocs(client, "crash")
        assert len(allocs) == 3, [(a.id, a.client_status) for a in allocs]
        assert all(a.client_status == "failed" for a in allocs)
        _check_chain(allocs)
        for gap in _gaps(allocs):
            assert 2 * SECOND - WINDOW_NS <= gap <= 2 * SECOND + LATENCY_NS, gap
        evals = client.list_evals(job_id="crash").evals
        failure = [e for e in evals if e.triggered_by == "alloc-failure"]
        # Two reported failures that still had an attempt left, each with the delayed
        # follow-up its evaluation created; the third failure creates nothing.
        assert len(failure) == 4, [(e.triggered_by, e.wait_until_ns) for e in evals]
        delayed = [e for e in failure if e.wait_until_ns > 0]
        assert len(delayed) == 2
        for ev in delayed:
            assert ev.previous_eval in {e.id for e in failure if e.wait_until_ns == 0}


def test_reschedule__unlimited_goes_on_with_growing_delays(
    shared_two_clients: LocalCluster, tmp_path: Path
) -> None:
    cluster = shared_two_clients
    policy = """reschedule {
      unlimited      = true
      delay          = "2s"
      delay_function = "exponential"
      max_delay      = "1m"
    }"""
    with DroverClient(cluster.grpc_addresses, retry_deadline=60) as client:
        _run_job(cluster, tmp_path, "flappy", "exit 3", policy)
        allocs = _wait_failed(cluster, client, "flappy", 4, 120, "4 failed allocs")
        chain = [a for a in allocs if a.client_status == "failed"][:4]
        _check_chain(chain)
        gaps = _gaps(chain)
        # 2 s, 4 s, 8 s: each at least the doubled delay, less the window.
        for gap, delay in zip(gaps, (2, 4, 8), strict=True):
            assert delay * SECOND - WINDOW_NS <= gap <= delay * SECOND + LATENCY_NS, (gaps, delay)
        assert [e.delay_ns for e in chain[3].reschedule_events] == [2 * SECOND, 4 * SECOND, 8 * SECOND]
        # The cluster is shared with the file's other tests: stop the failing loop.
        client.deregister_job("flappy", purge=True)


def test_reschedule__fails_on_one_node_runs_on_the_other(
    shared_two_clients: LocalCluster, tmp_path: Path
) -> None:
    """The task fails on whichever node it lands first (it records that node in a file) and
    runs anywhere else: the replacement must avoid the previous node."""
    cluster = shared_two_clients
    marker = tmp_path / "first-node"
    script = (
        f"first=$(cat {marker} 2>/dev/null); "
        f'if [ -z \\"$first\\" ]; then echo $NOMAD_NODE_NAME > {marker}; exit 1; fi; '
        f'[ \\"$first\\" = \\"$DROVER_NODE_NAME\\" ] && exit 1; exec sleep 600'
    )
    policy = _constant_delay(1, interval="1h", delay="1s")
    with DroverClient(cluster.grpc_addresses, retry_deadline=60) as client:
        _run_job(cluster, tmp_path, "picky", script, policy)

        def moved_and_running() -> list[structs_pb2.Allocation] | None:
            allocs = _allocs(client, "picky")
            running = [a for a in allocs if a.client_status == "running"]
            return allocs if running else None

        allocs = wait_for(moved_and_running, 90, 0.3, lambda: "a running replacement\n" + cluster.logs_tail())
        assert allocs is not None
        first, second = allocs
        assert first.client_status == "failed" and second.client_status == "running"
        assert marker.read_text().strip() == first.node_name
        assert second.node_id != first.node_id
        assert second.previous_allocation == first.id
        client.deregister_job("picky", purge=True)


def test_reschedule__batch_job_uses_the_batch_defaults(
    shared_two_clients: LocalCluster, tmp_path: Path
) -> None:
    """No reschedule block on a batch job: one more attempt within 24 h, after 5 s."""
    cluster = shared_two_clients
    with DroverClient(cluster.grpc_addresses, retry_deadline=60) as client:
        _run_job(cluster, tmp_path, "report", "exit 2", "", job_type="batch")
        allocs = _wait_failed(cluster, client, "report", 2, 90, "2 failed allocs")
        wait_for(lambda: _settled(client, "report"), 60, 0.3, "the job's evaluations to settle")
        allocs = _allocs(client, "report")
        assert len(allocs) == 2 and all(a.client_status == "failed" for a in allocs)
        _check_chain(allocs)
        (gap,) = _gaps(allocs)
        assert 5 * SECOND - WINDOW_NS <= gap <= 5 * SECOND + LATENCY_NS, gap
        policy = client.get_job("report").job.groups[0].reschedule
        assert (policy.attempts, policy.unlimited, policy.delay_function) == (1, False, "constant")


def test_reschedule__delayed_eval_survives_a_leader_kill(tmp_path: Path) -> None:
    """The leader dies while the replacement waits for its delay: the next leader rebuilds
    the delayed evaluation from the replicated state and reschedules on time."""
    policy = _constant_delay(1, interval="1h", delay="12s")
    with LocalCluster(tmp_path / "cluster", servers=3, clients=1) as cluster:
        cluster.wait_for_leader(60)
        with DroverClient(cluster.grpc_addresses, retry_deadline=60) as client:
            _run_job(cluster, tmp_path, "phoenix", "exit 1", policy, nodes=1)

            def delayed_eval() -> structs_pb2.Evaluation | None:
                evals = client.list_evals(job_id="phoenix").evals
                return next((e for e in evals if e.wait_until_ns > 0 and e.status == "pending"), None)

            waiting = wait_for(delayed_eval, 60, 0.2, lambda: "a delayed eval\n" + cluster.logs_tail())
            assert waiting is not None
            (failed,) = _allocs(client, "phoenix")
            assert failed.followup_eval_id == waiting.id
            # What an operator sees while the replacement waits for its delay.
            alloc_status = _cli(cluster, "alloc", "status", failed.id)
            assert re.search(r"Reschedule Attempts\s+=\s+0/1", alloc_status), alloc_status
            assert re.search(r"Reschedule Eligibility\s+=\s+in \d+s \(", alloc_status), alloc_status
            job_status = _cli(cluster, "job", "status", "phoenix")
            assert "Failed Allocations Awaiting Reschedule" in job_status, job_status
            assert re.search(rf"{failed.id[:8]}\s+phoenix\.g\[0\]\s+c1\s+in \d+s", job_status), job_status
            eval_list = _cli(cluster, "eval", "list", "-job", "phoenix", "-verbose")
            (line,) = [ln for ln in eval_list.splitlines() if ln.startswith(waiting.id)]
            assert "pending" in line and re.search(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$", line.rstrip()), (
                eval_list
            )
            leader = cluster.leader_index()
            cluster.kill(leader)
            allocs = _wait_failed(cluster, client, "phoenix", 2, 90, "the replacement")
            replacement = allocs[1]
            assert replacement.previous_allocation == failed.id
            assert replacement.create_time_ns >= waiting.wait_until_ns - WINDOW_NS
            assert replacement.create_time_ns <= waiting.wait_until_ns + LATENCY_NS
            # The replacement carries the attempt: its own status says so.
            assert re.search(
                r"Reschedule Attempts\s+=\s+1/1", _cli(cluster, "alloc", "status", replacement.id)
            )


def test_reschedule__zero_attempts_never_reschedules(
    shared_two_clients: LocalCluster, tmp_path: Path
) -> None:
    cluster = shared_two_clients
    policy = """reschedule {
      attempts  = 0
      unlimited = false
    }"""
    with DroverClient(cluster.grpc_addresses, retry_deadline=60) as client:
        _run_job(cluster, tmp_path, "once", "exit 1", policy)
        _wait_failed(cluster, client, "once", 1, 60, "the failure")

        # Nothing can replace the alloc, so the leader's watcher fails its deployment.
        def deployment_failed() -> structs_pb2.Deployment | None:
            (d,) = client.list_deployments(job_id="once").deployments
            return d if d.status == "failed" else None

        deployment = wait_for(deployment_failed, 60, 0.3, "the deployment to fail")
        assert deployment.status_description.startswith("Failed due to unhealthy allocations")
        wait_for(lambda: _settled(client, "once"), 60, 0.3, "the job's evaluations to settle")
        (alloc,) = _allocs(client, "once")
        assert alloc.client_status == "failed" and not alloc.followup_eval_id
        # No reschedule eval; the deployment's watcher evals (the unhealthy verdict, the
        # failure) placed nothing, as the one alloc above shows.
        triggers = [e.triggered_by for e in client.list_evals(job_id="once").evals]
        assert [t for t in triggers if t != "deployment-watcher"] == ["job-register"]
        assert re.search(r"Reschedule Attempts\s+=\s+0/0\n", _cli(cluster, "alloc", "status", alloc.id))
