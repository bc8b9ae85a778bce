"""server/gc/: what garbage collection selects, per object kind and threshold, and what the
FSM's GC entry deletes (summaries and a parent's children counts equal to a recount after).

States are built through the FSM, the way raft builds them; selection is a pure function of
the snapshot, a time and the thresholds, so each test moves ``now`` across one threshold.
"""

from __future__ import annotations

import re
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest

from drover.scheduler.periodic import derive_dispatched_child
from drover.scheduler.structs import (
    DEPLOYMENT_STATUS_RUNNING,
    DEPLOYMENT_STATUS_SUCCESSFUL,
    EVAL_STATUS_COMPLETE,
    JOB_STATUS_DEAD,
    NODE_STATUS_DOWN,
    Allocation,
    Deployment,
    Evaluation,
    Job,
    JobChildrenSummary,
    Node,
    ParameterizedConfig,
    RescheduleEvent,
    ReschedulePolicy,
)
from drover.server.config import ConfigError, load_server_config
from drover.server.fsm import FSM, ApplyResult, encode_entry
from drover.server.gc.runner import GarbageCollector, GCSettings, gc_entry, gc_settings
from drover.server.gc.select import (
    FORCE,
    Garbage,
    JobGarbage,
    Ref,
    Thresholds,
    alloc_collectable,
    batches,
    select_garbage,
)
from drover.server.invariants import check_invariants
from drover.server.snapshot import from_snapshot, to_snapshot
from drover.server.state_store import StateStore, Tables, Txn
from drover.v1 import raft_pb2
from tests.fixtures import mock
from tests.fixtures.mock import HOUR, NOW, SECOND

T = Thresholds()  # Nomad's defaults: eval 1h, batch eval 24h, job 4h, node 24h, deployment 1h


class Cluster:
    def __init__(self) -> None:
        self.store = StateStore()
        self.fsm = FSM(self.store)
        self.index = 0
        self.node = mock.node()
        self.apply(mock.register_node_entry(self.node))

    def apply(self, data: bytes) -> object:
        self.index += 1
        result = self.fsm.apply(data, self.index)
        assert not result.error, result.error
        return result.value

    def write(self, fn: object) -> None:
        """A write the FSM has no entry for in these tests (a deployment): through a Txn."""
        self.index += 1
        txn = Txn(self.store.snapshot().tables, self.index)
        fn(txn)  # type: ignore[operator]
        self.store.commit(txn.commit())

    @property
    def tables(self) -> Tables:
        return self.store.snapshot().tables

    def select(self, now: int, thresholds: Thresholds = T) -> Garbage:
        return select_garbage(self.store.snapshot(), now, thresholds)

    def collect(self, garbage: Garbage) -> dict[str, int]:
        value = self.apply(encode_entry(raft_pb2.ENTRY_TYPE_GC, gc_entry(garbage)))
        assert isinstance(value, dict)
        return value

    def periodic_with_dead_children(self) -> Job:
        """The periodic job "nightly" as stored, with three children launched a second
        apart from NOW and run to completion: dead children for GC to weigh against a
        parent that stays (both the selection and the FSM's GC entry start here)."""
        self.apply(mock.register_job_entry(mock.periodic_job(id="nightly")))
        parent = self.tables.jobs[("default", "nightly")]
        for n in range(3):
            self.run_job(mock.periodic_child(parent, launch_ns=NOW + n * mock.SECOND), "complete")
        return parent

    def run_job(self, job: Job, client_status: str, *, at: int = NOW) -> tuple[Job, Evaluation, Allocation]:
        """``job`` registered, placed (one alloc), its eval complete and the alloc reported
        ``client_status``, every change stamped ``at``."""
        ev = mock.eval_for(job, create_time_ns=at, modify_time_ns=at)
        self.apply(mock.register_job_entry(replace(job, submit_time_ns=at), ev))
        stored = self.tables.jobs[(job.namespace, job.id)]
        alloc = mock.alloc(stored, self.node, eval_id=ev.id)
        self.apply(mock.plan_entry([alloc], updated_at_ns=at))
        self.apply(mock.eval_update_entry(replace(ev, status=EVAL_STATUS_COMPLETE, modify_time_ns=at)))
        self.apply(mock.client_update_entry(alloc.id, client_status, updated_at_ns=at))
        return (
            self.tables.jobs[(job.namespace, job.id)],
            self.tables.evals[ev.id],
            self.tables.allocs[alloc.id],
        )


@pytest.fixture
def cluster() -> Cluster:
    return Cluster()


def _ids(refs: tuple[Ref, ...]) -> list[str]:
    return [r.id for r in refs]


def _jobs(garbage: Garbage) -> list[str]:
    return [j.job_id for j in garbage.jobs]


# -- evals and their allocs ---------------------------------------------------------------


def test_gc_eval__terminal_eval_of_a_running_job__collected_after_the_eval_threshold(
    cluster: Cluster,
) -> None:
    job, ev, done = cluster.run_job(mock.job(id="web"), "complete")
    # A second, running alloc keeps the job running (not dead: job GC does not take it).
    live = mock.alloc(job, cluster.node, index=1)
    cluster.apply(mock.plan_entry([live], updated_at_ns=NOW))
    cluster.apply(mock.client_update_entry(live.id, "running", updated_at_ns=NOW))
    assert cluster.tables.jobs[("default", "web")].status == "running"

    before = cluster.select(NOW + HOUR - 1)
    assert before.evals == () and before.allocs == ()
    after = cluster.select(NOW + HOUR)
    assert _ids(after.evals) == [ev.id]
    assert _ids(after.allocs) == [done.id]
    assert after.jobs == ()


def test_gc_eval__non_terminal_eval__never_collected(cluster: Cluster) -> None:
    job = mock.job(id="web")
    ev = mock.eval_for(job, modify_time_ns=NOW)
    cluster.apply(mock.register_job_entry(job, ev))
    assert cluster.select(NOW + 100 * HOUR, FORCE).evals == ()


def test_gc_eval__failed_alloc_not_yet_replaced__kept_with_its_eval(cluster: Cluster) -> None:
    job, ev, _ = cluster.run_job(mock.job(id="web"), "running")
    failed = mock.alloc(job, cluster.node, index=1, eval_id=ev.id)
    cluster.apply(mock.plan_entry([failed], updated_at_ns=NOW))
    cluster.apply(mock.client_update_entry(failed.id, "failed", updated_at_ns=NOW))
    garbage = cluster.select(NOW + 10 * HOUR)
    # The rescheduler still needs the failed alloc; the running one is not terminal.
    assert garbage.allocs == () and garbage.evals == ()


@pytest.mark.parametrize(
    ("policy", "last_reschedule_ago", "collectable"),
    [
        (None, 0, True),  # the group never reschedules
        (ReschedulePolicy(attempts=0, unlimited=False), 0, True),
        (ReschedulePolicy(unlimited=True), 10 * HOUR, False),  # it will be replaced: keep
        (ReschedulePolicy(attempts=2, interval_ns=HOUR, unlimited=False), 2 * HOUR, True),
        (ReschedulePolicy(attempts=2, interval_ns=HOUR, unlimited=False), HOUR // 2, False),
    ],
)
def test_gc_alloc__failed_alloc_of_a_live_job__by_its_reschedule_policy(
    policy: ReschedulePolicy | None, last_reschedule_ago: int, collectable: bool
) -> None:
    job = mock.job(id="web", status="running")
    job = replace(job, groups=(replace(job.groups[0], reschedule=policy),))
    now = NOW + 10 * HOUR
    failed = mock.alloc(
        job,
        mock.node(),
        client_status="failed",
        reschedule_events=(RescheduleEvent(reschedule_time_ns=now - last_reschedule_ago),),
    )
    assert alloc_collectable(failed, job, now, now) is collectable
    # Replaced, its history went to the replacement: collectable under every policy.
    assert alloc_collectable(replace(failed, next_allocation="next"), job, now, now)
    # Too new for the threshold: never.
    assert not alloc_collectable(replace(failed, next_allocation="next"), job, NOW - 1, now)


def test_gc_eval__live_batch_job__only_older_versions_allocs_and_their_eval_go(cluster: Cluster) -> None:
    _, old_eval, old_alloc = cluster.run_job(mock.batch_job(id="report"), "complete")
    # Version 1 registered: its own alloc running, the job alive.
    v1 = mock.batch_job(id="report", meta={"v": "1"})
    new_eval = mock.eval_for(v1, modify_time_ns=NOW)
    cluster.apply(mock.register_job_entry(v1, new_eval))
    stored = cluster.tables.jobs[("default", "report")]
    current = mock.alloc(stored, cluster.node, eval_id=new_eval.id)
    cluster.apply(mock.plan_entry([current], updated_at_ns=NOW))
    cluster.apply(mock.eval_update_entry(replace(new_eval, status=EVAL_STATUS_COMPLETE, modify_time_ns=NOW)))
    cluster.apply(mock.client_update_entry(current.id, "complete", updated_at_ns=NOW))
    second = mock.alloc(stored, cluster.node, index=1, eval_id=new_eval.id)
    cluster.apply(mock.plan_entry([second], updated_at_ns=NOW))
    assert cluster.tables.jobs[("default", "report")].status == "running"

    garbage = cluster.select(NOW, FORCE)

    assert _ids(garbage.allocs) == [old_alloc.id]
    assert _ids(garbage.evals) == [old_eval.id]
    assert garbage.jobs == ()


def test_gc_eval__batch_eval_of_a_live_batch_job__kept(cluster: Cluster) -> None:
    job, _, _ = cluster.run_job(mock.batch_job(id="report"), "complete")
    # A second alloc still running: the batch job lives, and its finished work must stay
    # in the state or the scheduler would run it again.
    live = mock.alloc(job, cluster.node, index=1)
    cluster.apply(mock.plan_entry([live], updated_at_ns=NOW))
    garbage = cluster.select(NOW + 100 * HOUR)
    assert garbage.evals == () and garbage.allocs == () and garbage.jobs == ()


def test_gc_eval__batch_eval_of_a_purged_job__waits_for_the_batch_threshold(cluster: Cluster) -> None:
    _, ev, done = cluster.run_job(mock.batch_job(id="report"), "complete")
    cluster.apply(mock.deregister_entry("report", purge=True))
    assert cluster.select(NOW + 24 * HOUR - 1).evals == ()  # past 1h: a batch eval waits 24h
    garbage = cluster.select(NOW + 24 * HOUR)
    assert _ids(garbage.evals) == [ev.id] and _ids(garbage.allocs) == [done.id]


# -- jobs ---------------------------------------------------------------------------------


def test_gc_job__dead_batch_job__collected_after_the_job_threshold(cluster: Cluster) -> None:
    job, _, _ = cluster.run_job(mock.batch_job(id="report"), "complete")
    assert job.status == JOB_STATUS_DEAD
    assert cluster.select(NOW + 4 * HOUR - 1).jobs == ()
    garbage = cluster.select(NOW + 4 * HOUR)
    assert garbage.jobs == (JobGarbage("default", "report", job.modify_index, evals=1, allocs=1),)
    # Its eval and alloc go with the job, not on their own.
    assert garbage.evals == () and garbage.allocs == ()


def test_gc_job__running_job__kept(cluster: Cluster) -> None:
    cluster.run_job(mock.batch_job(id="report"), "running")
    assert cluster.select(NOW + 100 * HOUR, FORCE).jobs == ()


def test_gc_job__stopped_service_job_with_stopped_allocs__collected(cluster: Cluster) -> None:
    _, _, alloc = cluster.run_job(mock.job(id="web"), "running")
    cluster.apply(mock.deregister_entry("web"))
    cluster.apply(mock.plan_entry(allocs_stopped=[alloc.id], updated_at_ns=NOW))
    assert cluster.select(NOW, FORCE).jobs == ()  # told to stop, still running on its node
    cluster.apply(mock.client_update_entry(alloc.id, "complete", updated_at_ns=NOW))
    assert cluster.tables.jobs[("default", "web")].status == JOB_STATUS_DEAD
    assert _jobs(cluster.select(NOW, FORCE)) == ["web"]


def test_gc_job__periodic_parent__kept_until_stopped_while_dead_children_go(cluster: Cluster) -> None:
    cluster.periodic_with_dead_children()
    garbage = cluster.select(NOW + 4 * HOUR)
    assert sorted(_jobs(garbage)) == [f"nightly/periodic-{NOW // mock.SECOND + n}" for n in range(3)]
    cluster.apply(mock.deregister_entry("nightly"))
    assert "nightly" in _jobs(cluster.select(NOW + 4 * HOUR))


def test_gc_job__forced__ignores_every_threshold(cluster: Cluster) -> None:
    cluster.run_job(mock.batch_job(id="report"), "complete")
    assert cluster.select(NOW).jobs == ()
    assert _jobs(cluster.select(NOW, FORCE)) == ["report"]


# -- nodes --------------------------------------------------------------------------------


def _down(cluster: Cluster, node: Node, at: int) -> None:
    cluster.apply(mock.register_node_entry(node))
    cluster.apply(mock.node_status_entry(node.id, NODE_STATUS_DOWN, updated_at_ns=at))


def test_gc_node__down_without_live_allocs__collected_after_the_node_threshold(cluster: Cluster) -> None:
    gone = mock.node(id="gone")
    _down(cluster, gone, NOW)
    assert cluster.select(NOW + 24 * HOUR - 1).nodes == ()
    assert _ids(cluster.select(NOW + 24 * HOUR).nodes) == ["gone"]
    assert cluster.node.id not in _ids(cluster.select(NOW + 100 * HOUR).nodes)  # ready: kept


def test_gc_node__down_with_a_live_alloc__kept(cluster: Cluster) -> None:
    gone = mock.node(id="gone")
    cluster.apply(mock.register_node_entry(gone))
    cluster.apply(mock.register_job_entry(mock.job(id="web")))
    alloc = mock.alloc(cluster.tables.jobs[("default", "web")], gone)
    cluster.apply(mock.plan_entry([alloc]))
    cluster.apply(mock.node_status_entry("gone", NODE_STATUS_DOWN, updated_at_ns=NOW))
    assert cluster.select(NOW + 100 * HOUR).nodes == ()


# -- deployments --------------------------------------------------------------------------


def _deployment(cluster: Cluster, deployment_id: str, status: str, create_index: int, at: int) -> None:
    def put(txn: Txn) -> None:
        txn.put_deployment(
            Deployment(
                id=deployment_id,
                job_id="web",
                status=status,
                create_index=create_index,
                modify_index=cluster.index,
                modify_time_ns=at,
            )
        )

    cluster.write(put)


def test_gc_deployment__terminal_and_old__collected_but_not_the_newest_of_a_live_job(
    cluster: Cluster,
) -> None:
    cluster.run_job(mock.job(id="web"), "running")
    _deployment(cluster, "d-old", DEPLOYMENT_STATUS_SUCCESSFUL, 1, NOW)
    _deployment(cluster, "d-new", DEPLOYMENT_STATUS_SUCCESSFUL, 2, NOW)
    assert cluster.select(NOW + HOUR - 1).deployments == ()
    assert _ids(cluster.select(NOW + HOUR).deployments) == ["d-old"]


def test_gc_deployment__active__kept(cluster: Cluster) -> None:
    cluster.run_job(mock.job(id="web"), "running")
    _deployment(cluster, "d-1", DEPLOYMENT_STATUS_RUNNING, 1, NOW)
    _deployment(cluster, "d-2", DEPLOYMENT_STATUS_SUCCESSFUL, 2, NOW)
    assert cluster.select(NOW + 100 * HOUR, FORCE).deployments == ()


# -- batching -----------------------------------------------------------------------------


def test_gc_batches__bounded_pieces_and_a_job_never_cut() -> None:
    garbage = Garbage(
        evals=tuple(Ref(f"e{i}", 1) for i in range(5)),
        jobs=(JobGarbage("default", "big", 1, evals=3, allocs=3), JobGarbage("default", "small", 1)),
    )
    pieces = list(batches(garbage, limit=4))
    assert [p.size for p in pieces] == [7, 4, 2]  # the 7-object job alone, then 1 + 3, then 2
    assert [j.job_id for p in pieces for j in p.jobs] == ["big", "small"]
    assert [r.id for p in pieces for r in p.evals] == [f"e{i}" for i in range(5)]
    assert list(batches(Garbage())) == []


# -- the FSM's GC entry -------------------------------------------------------------------


def test_gc_apply__dead_children__deleted_with_their_evals_and_allocs_counts_exact(cluster: Cluster) -> None:
    stored = cluster.periodic_with_dead_children()
    cluster.run_job(mock.periodic_child(stored, launch_ns=NOW + 10 * mock.SECOND), "running")
    summary = cluster.tables.job_summaries[("default", "nightly")]
    assert summary.children == JobChildrenSummary(pending=0, running=1, dead=3)

    deleted = cluster.collect(cluster.select(NOW, FORCE))

    assert deleted == {"evals": 3, "allocs": 3, "jobs": 3, "nodes": 0, "deployments": 0}
    tables = cluster.tables
    assert sorted(k[1] for k in tables.jobs) == ["nightly", f"nightly/periodic-{NOW // mock.SECOND + 10}"]
    assert len(tables.evals) == 1 and len(tables.allocs) == 1
    # Nomad's rule: the summary counts the children that exist; a recount agrees.
    assert tables.job_summaries[("default", "nightly")].children == JobChildrenSummary(running=1)
    assert mock.summary_problems(tables) == []
    assert check_invariants(tables) == []
    # The collected children left every index and their versions, summaries and evals.
    assert list(tables.children_by_parent[("default", "nightly")]) == [
        ("default", f"nightly/periodic-{NOW // mock.SECOND + 10}")
    ]
    assert all(k[1] != "nightly/periodic-1700000000" for k in (*tables.job_versions, *tables.job_summaries))


def test_gc_apply__job_changed_since_selection__kept(cluster: Cluster) -> None:
    cluster.run_job(mock.batch_job(id="report"), "complete")
    garbage = cluster.select(NOW, FORCE)
    assert _jobs(garbage) == ["report"]
    # Registered again (a new version, a new eval) before the GC entry is applied.
    again = mock.batch_job(id="report", meta={"v": "2"})
    cluster.apply(mock.register_job_entry(again, mock.eval_for(again)))
    deleted = cluster.collect(garbage)
    assert deleted["jobs"] == 0
    assert ("default", "report") in cluster.tables.jobs
    assert mock.summary_problems(cluster.tables) == []


def test_gc_apply__eval_alloc_node_deployment_refs__deleted_only_while_unchanged(cluster: Cluster) -> None:
    job, ev, done = cluster.run_job(mock.job(id="web"), "complete")
    live = mock.alloc(job, cluster.node, index=1)
    cluster.apply(mock.plan_entry([live], updated_at_ns=NOW))
    _down(cluster, mock.node(id="gone"), NOW)
    _deployment(cluster, "d-old", DEPLOYMENT_STATUS_SUCCESSFUL, 1, NOW)
    _deployment(cluster, "d-new", DEPLOYMENT_STATUS_SUCCESSFUL, 2, NOW)
    garbage = cluster.select(NOW, FORCE)
    assert (_ids(garbage.evals), _ids(garbage.allocs)) == ([ev.id], [done.id])
    assert (_ids(garbage.nodes), _ids(garbage.deployments)) == (["gone"], ["d-old"])
    # The node came back before the entry applied: it stays.
    cluster.apply(mock.node_status_entry("gone", "ready", updated_at_ns=NOW))

    deleted = cluster.collect(garbage)

    assert deleted == {"evals": 1, "allocs": 1, "jobs": 0, "nodes": 0, "deployments": 1}
    tables = cluster.tables
    assert ev.id not in tables.evals and done.id not in tables.allocs and "d-old" not in tables.deployments
    assert "gone" in tables.nodes and live.id in tables.allocs
    assert done.id not in tables.allocs_by_node.get(cluster.node.id, {})
    summary = tables.job_summaries[("default", "web")].summary["web"]
    assert (summary.complete, summary.starting) == (0, 1)
    assert mock.summary_problems(tables) == []


# -- the knobs ----------------------------------------------------------------------------


def test_gc_config__defaults_are_nomads_and_keys_load_from_a_file(tmp_path: Path) -> None:
    cfg = load_server_config({"node_name": "s1", "data_dir": str(tmp_path)}, None)
    assert gc_settings(cfg) == GCSettings(thresholds=Thresholds(), interval_ns=5 * 60 * mock.SECOND)
    path = tmp_path / "server.hcl"
    path.write_text('job_gc_threshold = "30m"\ngc_interval = "10s"\n')
    cfg = load_server_config(
        {"node_name": "s1", "data_dir": str(tmp_path), "node_gc_threshold": "0"}, str(path)
    )
    settings = gc_settings(cfg)
    assert settings.thresholds.job_ns == 30 * mock.MINUTE
    assert settings.thresholds.node_ns == 0
    assert settings.interval_ns == 10 * mock.SECOND


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("eval_gc_threshold", "soon", "key 'eval_gc_threshold'"),
        ("batch_eval_gc_threshold", "-1h", "key 'batch_eval_gc_threshold': must be >= 0"),
        ("gc_interval", "0s", "key 'gc_interval': must be > 0"),
        ("deployment_gc_threshold", 5, "key 'deployment_gc_threshold': expected a string"),
    ],
)
def test_gc_config__bad_value__refused_naming_the_key(
    tmp_path: Path, key: str, value: object, message: str
) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_server_config({"node_name": "s1", "data_dir": str(tmp_path), key: value}, None)


def test_gc_config__agent_flags__reach_the_config(tmp_path: Path) -> None:
    from drover.cli._parser import build_parser

    args = build_parser().parse_args(["agent", "-server", "-job-gc-threshold", "1m", "-gc-interval", "2s"])
    assert (args.job_gc_threshold, args.gc_interval) == ("1m", "2s")


# -- the dispatch idempotency index -------------------------------------------------------


def test_gc_dispatch_tokens__an_index_lookup__left_by_a_collected_child(cluster: Cluster) -> None:
    cluster.apply(mock.register_job_entry(mock.batch_job(id="encode", parameterized=ParameterizedConfig())))
    parent = cluster.tables.jobs[("default", "encode")]
    for n in range(3):
        child = derive_dispatched_child(parent, f"encode/dispatch-{n}", NOW, {}, b"", f"tok-{n}")
        cluster.run_job(child, "complete")
    snap = cluster.store.snapshot()
    found = snap.dispatched_child("default", "encode", "tok-1")
    assert found is not None and found.id == "encode/dispatch-1"
    assert snap.dispatched_child("default", "encode", "") is None
    assert snap.dispatched_child("default", "encode", "tok-9") is None
    # A snapshot restore rebuilds the same index.
    assert from_snapshot(to_snapshot(cluster.tables)).dispatch_tokens == cluster.tables.dispatch_tokens

    cluster.collect(cluster.select(NOW, FORCE))

    assert len(cluster.tables.dispatch_tokens) == 0
    assert cluster.store.snapshot().dispatched_child("default", "encode", "tok-1") is None
    # The token may be used again once its child is collected, as in Nomad.
    again = derive_dispatched_child(parent, "encode/dispatch-again", NOW, {}, b"", "tok-1")
    cluster.run_job(again, "running")
    found = cluster.store.snapshot().dispatched_child("default", "encode", "tok-1")
    assert found is not None and found.id == "encode/dispatch-again"


# -- the leader's collector ---------------------------------------------------------------


class _Raft:
    """Proposes straight into the test cluster's FSM, as a one-server raft would."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.entries = 0

    def propose(self, data: bytes, timeout: float) -> ApplyResult:
        self.entries += 1
        self.cluster.index += 1
        return self.cluster.fsm.apply(data, self.cluster.index)


class _Clock:
    def __init__(self, now: int) -> None:
        self.now = now

    def now_ns(self) -> int:
        return self.now


def test_gc_collector__forced_run__one_entry_and_counts(cluster: Cluster) -> None:
    for n in range(3):
        cluster.run_job(mock.batch_job(id=f"report-{n}"), "complete")
    raft = _Raft(cluster)
    collector = GarbageCollector(cluster.store, raft, _Clock(NOW), GCSettings(Thresholds(), SECOND))
    assert collector.collect(T) == (dict.fromkeys(("evals", "allocs", "jobs", "nodes", "deployments"), 0), 0)
    assert raft.entries == 0  # nothing old enough: no entry at all

    deleted, index = collector.collect(FORCE)

    assert deleted == {"evals": 3, "allocs": 3, "jobs": 3, "nodes": 0, "deployments": 0}
    assert (raft.entries, index) == (1, cluster.index)
    assert len(cluster.tables.jobs) == 0


def test_gc_collector__periodic_run__collects_past_the_threshold_while_leading(cluster: Cluster) -> None:
    cluster.run_job(mock.batch_job(id="report"), "complete")
    raft = _Raft(cluster)
    clock = _Clock(NOW + 4 * HOUR)
    collector = GarbageCollector(cluster.store, raft, clock, GCSettings(Thresholds(), 10_000_000))
    stop = threading.Event()

    # Not the leader (any more): the loop ends at its first wake-up, having written nothing.
    collector.run(lambda: False, stop)
    assert raft.entries == 0

    runner = threading.Thread(target=collector.run, args=(lambda: True, stop), daemon=True)
    runner.start()
    deadline = time.monotonic() + 10
    while ("default", "report") in cluster.tables.jobs and time.monotonic() < deadline:
        time.sleep(0.01)
    stop.set()
    runner.join(5)
    assert ("default", "report") not in cluster.tables.jobs
    assert not runner.is_alive()
