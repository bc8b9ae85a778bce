"""The FSM's deployment entries (server/deployments/apply.py): status update with its
auto-revert job, promotion, manual alloc health; and the watcher's pass, through them.

The state is seeded through ``Txn`` (the deployment as the scheduler's plan would have left
it), then every change under test goes through ``FSM.apply`` with the bytes a leader would
propose. A refused entry must leave the state digest as it was.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest

from deploy.cluster import wait_for
from drover.scheduler.structs import (
    ALLOC_CLIENT_RUNNING,
    DEPLOYMENT_DESC_NEEDS_PROMOTION,
    DEPLOYMENT_DESC_PAUSED,
    DEPLOYMENT_DESC_RUNNING,
    DEPLOYMENT_STATUS_FAILED,
    DEPLOYMENT_STATUS_PAUSED,
    DEPLOYMENT_STATUS_RUNNING,
    DEPLOYMENT_STATUS_SUCCESSFUL,
    HEALTH_HEALTHY,
    HEALTH_UNHEALTHY,
    TRIGGER_DEPLOYMENT_WATCHER,
    Allocation,
    AllocDeploymentStatus,
    Deployment,
    DeploymentState,
    DeploymentStatusUpdate,
    Evaluation,
    Job,
    job_eval,
)
from drover.server.codec import to_proto
from drover.server.deployments.actions import DeploymentActions
from drover.server.deployments.watcher import DeploymentWatcher
from drover.server.fsm import FSM, ApplyResult, encode_entry
from drover.server.snapshot import state_digest
from drover.server.state_store import StateStore, Txn
from drover.v1 import raft_pb2
from tests.fixtures import mock
from tests.unit.test_purity import nondeterministic_calls

ET = raft_pb2.EntryType
NOW = mock.NOW
MIN = mock.MINUTE
REPO = Path(__file__).resolve().parents[2]


class Cluster:
    """One FSM and its store; ``seed`` writes through a Txn, ``apply`` through the FSM."""

    def __init__(self) -> None:
        self.store = StateStore()
        self.fsm = FSM(self.store)
        self.index = 0
        # One writer at a time, as raft's apply thread is (a watcher thread proposes too).
        self._writing = threading.Lock()

    def seed(self, fn: Callable[[Txn], None]) -> None:
        with self._writing:
            self.index += 1
            txn = Txn(self.store.snapshot().tables, self.index)
            fn(txn)
            self.store.commit(txn.commit(), txn.changes)

    def apply(self, data: bytes, *, refused: bool = False) -> ApplyResult:
        before = state_digest(self.store.snapshot().tables)
        result = self.propose(data, 0.0)
        if refused:
            assert result.error, "expected the entry to be refused"
            assert state_digest(self.store.snapshot().tables) == before, "a refused entry changed the state"
        else:
            assert not result.error, result.error
        return result

    # The leader's side, for the actions and the watcher: propose = apply here.
    def propose(self, data: bytes, timeout: float) -> ApplyResult:
        with self._writing:
            self.index += 1
            return self.fsm.apply(data, self.index)

    def deployment(self, deployment_id: str = "d1") -> Deployment:
        found = self.store.snapshot().deployment(deployment_id)
        assert found is not None
        return found

    def alloc(self, alloc_id: str) -> Allocation:
        found = self.store.snapshot().alloc(alloc_id)
        assert found is not None
        return found


def _register(cluster: Cluster, job: Job) -> Job:
    cluster.apply(mock.register_job_entry(job, mock.eval_for(job)))
    stored = cluster.store.snapshot().job(job.namespace, job.id)
    assert stored is not None
    return stored


def _with_count(job: Job, count: int) -> Job:
    return replace(job, groups=(replace(job.groups[0], count=count),))


@pytest.fixture
def cluster() -> Cluster:
    """Job "web": version 0 (count 2, stable) then version 1 (count 3) rolling out in
    deployment d1 (auto_revert, one canary wanted), with canary c1 and alloc a1 placed."""
    c = Cluster()
    v0 = _register(c, _with_count(mock.job(id="web"), 2))
    c.seed(lambda txn: txn.mark_version_stable(("default", "web"), 0))
    c.seed(lambda txn: txn.put_job(replace(v0, stable=True)))
    v1 = _register(c, _with_count(mock.job(id="web"), 3))
    assert v1.version == 1
    state = DeploymentState(
        auto_revert=True,
        progress_deadline_ns=10 * MIN,
        require_progress_by_ns=NOW + 5 * MIN,
        desired_canaries=1,
        desired_total=3,
        placed_canaries=("c1",),
        placed_allocs=2,
    )
    deployment = mock.deployment(v1, state, status_description=DEPLOYMENT_DESC_NEEDS_PROMOTION)
    node = mock.node(id="n1")
    canary = mock.alloc(
        v1,
        node,
        id="c1",
        deployment_id="d1",
        client_status=ALLOC_CLIENT_RUNNING,
        deployment_status=AllocDeploymentStatus(canary=True),
    )
    plain = mock.alloc(v1, node, 1, id="a1", deployment_id="d1", client_status=ALLOC_CLIENT_RUNNING)
    other = mock.alloc(v1, node, 2, id="x1", deployment_id="d0", client_status=ALLOC_CLIENT_RUNNING)

    def seed(txn: Txn) -> None:
        txn.put_deployment(deployment)
        for alloc in (canary, plain, other):
            txn.put_alloc(alloc)

    c.seed(seed)
    return c


def _eval(job_id: str = "web", eval_id: str = "ev-d") -> Evaluation:
    return replace(
        job_eval(eval_id, mock.job(id=job_id), TRIGGER_DEPLOYMENT_WATCHER, NOW), deployment_id="d1"
    )


def status_entry(status: str, description: str, *, job: Job | None = None, with_eval: bool = True) -> bytes:
    entry = raft_pb2.DeploymentStatusUpdateEntry(updated_at_ns=NOW + MIN)
    to_proto(DeploymentStatusUpdate("d1", status, description), entry.update)
    if job is not None:
        to_proto(job, entry.job)
    if with_eval:
        to_proto(_eval(), entry.eval)
    return encode_entry(ET.ENTRY_TYPE_DEPLOYMENT_STATUS_UPDATE, entry)


def promote_entry(*groups: str, deployment_id: str = "d1") -> bytes:
    entry = raft_pb2.DeploymentPromoteEntry(
        deployment_id=deployment_id, groups=groups, updated_at_ns=NOW + MIN
    )
    to_proto(_eval(), entry.eval)
    return encode_entry(ET.ENTRY_TYPE_DEPLOYMENT_PROMOTE, entry)


def health_entry(
    healthy: tuple[str, ...] = (), unhealthy: tuple[str, ...] = (), *, fail: Job | None = None
) -> bytes:
    entry = raft_pb2.DeploymentAllocHealthEntry(
        deployment_id="d1", healthy_alloc_ids=healthy, unhealthy_alloc_ids=unhealthy, updated_at_ns=NOW + MIN
    )
    if fail is not None:
        to_proto(
            DeploymentStatusUpdate("d1", DEPLOYMENT_STATUS_FAILED, "Failed due to unhealthy allocations"),
            entry.update,
        )
        to_proto(fail, entry.job)
    to_proto(_eval(), entry.eval)
    return encode_entry(ET.ENTRY_TYPE_DEPLOYMENT_ALLOC_HEALTH, entry)


def _mark_healthy(cluster: Cluster, *alloc_ids: str) -> None:
    cluster.apply(health_entry(alloc_ids))


# ---------------------------------------------------------------------------------------
# Status updates


def test_status_update__pause_then_resume__status_moves_and_resume_adds_its_eval(cluster: Cluster) -> None:
    cluster.apply(status_entry(DEPLOYMENT_STATUS_PAUSED, DEPLOYMENT_DESC_PAUSED, with_eval=False))
    assert cluster.deployment().status == DEPLOYMENT_STATUS_PAUSED

    cluster.apply(status_entry(DEPLOYMENT_STATUS_RUNNING, DEPLOYMENT_DESC_RUNNING))

    assert (cluster.deployment().status, cluster.deployment().status_description) == (
        DEPLOYMENT_STATUS_RUNNING,
        DEPLOYMENT_DESC_RUNNING,
    )
    ev = cluster.store.snapshot().eval("ev-d")
    assert ev is not None and ev.deployment_id == "d1"


def test_status_update__fail_with_revert_job__failed_and_old_spec_is_a_new_unstable_version(
    cluster: Cluster,
) -> None:
    v0 = cluster.store.snapshot().job_version("default", "web", 0)
    assert v0 is not None and v0.stable

    cluster.apply(
        status_entry(
            DEPLOYMENT_STATUS_FAILED,
            "Failed due to unhealthy allocations - rolling back to job version 0",
            job=replace(v0, stable=False, submit_time_ns=NOW + MIN),
        )
    )

    snap = cluster.store.snapshot()
    assert cluster.deployment().status == DEPLOYMENT_STATUS_FAILED
    job = snap.job("default", "web")
    assert job is not None
    assert (job.version, job.groups[0].count, job.stable) == (2, 2, False)
    assert [v.version for v in snap.job_versions("default", "web")] == [2, 1, 0]
    ev = snap.eval("ev-d")
    assert ev is not None and ev.job_modify_index == job.job_modify_index


@pytest.mark.parametrize("status", [DEPLOYMENT_STATUS_FAILED, DEPLOYMENT_STATUS_SUCCESSFUL])
def test_status_update__terminal_deployment__refused_and_nothing_registered(
    cluster: Cluster, status: str
) -> None:
    cluster.seed(lambda txn: txn.put_deployment(replace(cluster.deployment(), status=status)))
    v0 = cluster.store.snapshot().job_version("default", "web", 0)
    assert v0 is not None

    cluster.apply(status_entry(DEPLOYMENT_STATUS_FAILED, "x", job=replace(v0, stable=False)), refused=True)


def test_status_update__unknown_deployment__refused_as_missing(cluster: Cluster) -> None:
    entry = raft_pb2.DeploymentStatusUpdateEntry(updated_at_ns=NOW)
    to_proto(DeploymentStatusUpdate("d9", DEPLOYMENT_STATUS_PAUSED, ""), entry.update)

    result = cluster.apply(encode_entry(ET.ENTRY_TYPE_DEPLOYMENT_STATUS_UPDATE, entry), refused=True)

    assert result.not_found


# ---------------------------------------------------------------------------------------
# Promotion


def test_promote__terminal__refused_with_nomads_words(cluster: Cluster) -> None:
    cluster.seed(
        lambda txn: txn.put_deployment(replace(cluster.deployment(), status=DEPLOYMENT_STATUS_FAILED))
    )

    result = cluster.apply(promote_entry(), refused=True)

    assert result.error == "Cannot promote terminal deployment"


def test_promote__canary_not_healthy__refused_with_the_count(cluster: Cluster) -> None:
    result = cluster.apply(promote_entry("web"), refused=True)

    assert result.error == 'Task group "web" has 0/1 healthy allocations'


def test_promote__unknown_group__refused(cluster: Cluster) -> None:
    result = cluster.apply(promote_entry("db"), refused=True)

    assert "no task group 'db'" in result.error


def test_promote__healthy_canary__promoted_deadline_reset_canary_flag_cleared(cluster: Cluster) -> None:
    _mark_healthy(cluster, "c1")

    cluster.apply(promote_entry())

    deployment = cluster.deployment()
    state = deployment.task_groups["web"]
    assert state.promoted
    assert state.require_progress_by_ns == NOW + MIN + 10 * MIN
    assert deployment.status_description == DEPLOYMENT_DESC_RUNNING
    status = cluster.alloc("c1").deployment_status
    assert status is not None and not status.canary and status.is_healthy()
    assert cluster.store.snapshot().eval("ev-d") is not None


# ---------------------------------------------------------------------------------------
# Manual alloc health


def test_alloc_health__healthy__counted_and_recorded_on_the_alloc(cluster: Cluster) -> None:
    _mark_healthy(cluster, "a1")

    assert cluster.deployment().task_groups["web"].healthy_allocs == 1
    status = cluster.alloc("a1").deployment_status
    assert status is not None and status.health == HEALTH_HEALTHY and status.timestamp_ns == NOW + MIN


def test_alloc_health__alloc_of_another_deployment__refused(cluster: Cluster) -> None:
    result = cluster.apply(health_entry(("a1", "x1")), refused=True)

    assert "not part of deployment" in result.error


def test_alloc_health__unknown_alloc__refused_as_missing(cluster: Cluster) -> None:
    assert cluster.apply(health_entry(("zz",)), refused=True).not_found


def test_alloc_health__terminal_deployment__refused(cluster: Cluster) -> None:
    cluster.seed(
        lambda txn: txn.put_deployment(replace(cluster.deployment(), status=DEPLOYMENT_STATUS_FAILED))
    )

    result = cluster.apply(health_entry(("a1",)), refused=True)

    assert result.error == "Cannot set health of allocations for a terminal deployment"


def test_alloc_health__unhealthy_with_update__counted_failed_and_reverted(cluster: Cluster) -> None:
    v0 = cluster.store.snapshot().job_version("default", "web", 0)
    assert v0 is not None

    cluster.apply(health_entry(unhealthy=("a1",), fail=replace(v0, stable=False)))

    deployment = cluster.deployment()
    assert deployment.status == DEPLOYMENT_STATUS_FAILED
    assert deployment.task_groups["web"].unhealthy_allocs == 1
    status = cluster.alloc("a1").deployment_status
    assert status is not None and status.health == HEALTH_UNHEALTHY
    job = cluster.store.snapshot().job("default", "web")
    assert job is not None and (job.version, job.groups[0].count) == (2, 2)


# ---------------------------------------------------------------------------------------
# The watcher's pass, writing through the FSM


class _Clock:
    def __init__(self, now: int) -> None:
        self.now = now

    def now_ns(self) -> int:
        return self.now


def _watcher(cluster: Cluster, clock: _Clock) -> DeploymentWatcher:
    actions = DeploymentActions(cluster, cluster.store, clock, mock.Counter("id"))
    return DeploymentWatcher(cluster.store, actions, clock, lambda: True, threading.Event())


def test_watcher__unhealthy_without_deadline__fails_and_reverts_in_one_entry(cluster: Cluster) -> None:
    state = replace(cluster.deployment().task_groups["web"], progress_deadline_ns=0, require_progress_by_ns=0)
    cluster.seed(lambda txn: txn.put_deployment(replace(cluster.deployment(), task_groups={"web": state})))
    cluster.apply(health_entry(unhealthy=("a1",)))
    clock = _Clock(NOW + 2 * MIN)

    _watcher(cluster, clock).watch_once(cluster.store.snapshot(), clock.now)

    deployment = cluster.deployment()
    assert deployment.status == DEPLOYMENT_STATUS_FAILED
    assert (
        deployment.status_description == "Failed due to unhealthy allocations - rolling back to job version 0"
    )
    job = cluster.store.snapshot().job("default", "web")
    assert job is not None and (job.version, job.groups[0].count, job.stable) == (2, 2, False)
    evals = [e for e in cluster.store.snapshot().evals() if e.triggered_by == TRIGGER_DEPLOYMENT_WATCHER]
    assert [e.deployment_id for e in evals if e.id != "ev-d"] == ["d1"]


def test_watcher__deadline__returns_it_and_fails_once_passed(cluster: Cluster) -> None:
    _mark_healthy(cluster, "c1")
    cluster.apply(promote_entry())
    due = cluster.deployment().task_groups["web"].require_progress_by_ns
    clock = _Clock(NOW + 2 * MIN)
    watcher = _watcher(cluster, clock)

    assert watcher.watch_once(cluster.store.snapshot(), clock.now) == due
    assert cluster.deployment().status == DEPLOYMENT_STATUS_RUNNING

    clock.now = due
    watcher.watch_once(cluster.store.snapshot(), clock.now)

    assert cluster.deployment().status == DEPLOYMENT_STATUS_FAILED
    assert cluster.deployment().status_description.startswith("Failed due to progress deadline")


def test_watcher__auto_promote__promotes_once_the_canary_is_healthy(cluster: Cluster) -> None:
    state = replace(cluster.deployment().task_groups["web"], auto_promote=True)
    cluster.seed(lambda txn: txn.put_deployment(replace(cluster.deployment(), task_groups={"web": state})))
    clock = _Clock(NOW + 2 * MIN)
    watcher = _watcher(cluster, clock)
    watcher.watch_once(cluster.store.snapshot(), clock.now)
    assert not cluster.deployment().task_groups["web"].promoted

    _mark_healthy(cluster, "c1")
    watcher.watch_once(cluster.store.snapshot(), clock.now)

    assert cluster.deployment().task_groups["web"].promoted


def test_watcher__refused_write__not_retried_until_the_deployment_changes(cluster: Cluster) -> None:
    """A promotion the FSM refuses (the healthy canary stopped since the decision's
    snapshot) is tried once per change of the deployment, not on every pass."""
    state = replace(cluster.deployment().task_groups["web"], auto_promote=True)
    cluster.seed(lambda txn: txn.put_deployment(replace(cluster.deployment(), task_groups={"web": state})))
    _mark_healthy(cluster, "c1")
    decided_on = cluster.store.snapshot()
    cluster.seed(lambda txn: txn.put_alloc(replace(cluster.alloc("c1"), desired_status="stop")))
    clock = _Clock(NOW + 2 * MIN)
    watcher = _watcher(cluster, clock)
    index = cluster.index

    watcher.watch_once(decided_on, clock.now)
    assert cluster.index == index + 1, "one refused proposal"
    watcher.watch_once(decided_on, clock.now)
    assert cluster.index == index + 1, "not proposed again while the deployment is unchanged"


def test_watcher__thread__wakes_on_a_health_report_and_stops_when_told(cluster: Cluster) -> None:
    state = replace(cluster.deployment().task_groups["web"], progress_deadline_ns=0, require_progress_by_ns=0)
    cluster.seed(lambda txn: txn.put_deployment(replace(cluster.deployment(), task_groups={"web": state})))
    clock = _Clock(NOW + 2 * MIN)
    stop = threading.Event()
    actions = DeploymentActions(cluster, cluster.store, clock, mock.Counter("id"))
    thread = threading.Thread(target=DeploymentWatcher(cluster.store, actions, clock, lambda: True, stop).run)
    thread.start()
    try:
        cluster.apply(health_entry(unhealthy=("a1",)))
        wait_for(
            lambda: cluster.deployment().status == DEPLOYMENT_STATUS_FAILED,
            timeout=10,
            message="the watcher to act on the unhealthy alloc",
        )
    finally:
        stop.set()
        thread.join(timeout=5)
    assert not thread.is_alive(), "the watcher did not stop"


# ---------------------------------------------------------------------------------------
# Determinism


@pytest.mark.parametrize("path", ["server/deployments/apply.py", "server/deployments/decide.py"])
def test_purity__deployment_apply_and_decide__call_no_clock_or_randomness(path: str) -> None:
    findings = nondeterministic_calls((REPO / path).read_text(), path, frozenset())

    assert findings == [], "\n".join(map(str, findings))
