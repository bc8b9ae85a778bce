"""The system/sysbatch diff (scheduler/reconciler/system.py), one situation per test.

Every case builds complete objects with ``tests/fixtures/mock.py``, changes only the fields
it is about, and asserts bucket counts through ``Expect`` (Nomad's resultExpectation). The
environments are possible ones: every alloc sits on a node the inputs describe, the way
the scheduler's shell (scheduler/system.py ``read_inputs``) builds them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import pytest

from drover.scheduler import structs
from drover.scheduler.reconciler.system import (
    CLASSIFICATION_RULES,
    KEEP_RULES,
    SYSTEM_BUCKETS,
    AllocTuple,
    SystemDiff,
    diff_system_allocs,
    rank_duplicates,
)
from drover.scheduler.reconciler.vocabulary import DESC_DUPLICATE, DESC_LOST, IGNORE, tasks_updated
from drover.scheduler.structs import (
    AllocatedPort,
    AllocatedResources,
    Allocation,
    AllocStateChange,
    DisconnectStrategy,
    DrainStrategy,
    Job,
    NetworkResource,
    Node,
    Port,
    Resources,
    TaskGroup,
    UpdateStrategy,
)
from tests.fixtures import buckets, mock
from tests.fixtures.buckets import Expect
from tests.fixtures.mock import NOW, SECOND

# ---------------------------------------------------------------------------------------
# Builders


def group_of(job: Job) -> TaskGroup:
    return job.groups[0]


def with_group(job: Job, **changes: object) -> Job:
    return replace(job, groups=(replace(group_of(job), **changes), *job.groups[1:]))  # type: ignore[arg-type]


def with_task(job: Job, **changes: object) -> Job:
    group = group_of(job)
    return with_group(job, tasks=(replace(group.tasks[0], **changes), *group.tasks[1:]))  # type: ignore[arg-type]


def bump(job: Job, *, destructive: bool) -> Job:
    """The next version of ``job``: a new task config (destructive) or new job meta (in place)."""
    nxt = replace(job, version=job.version + 1, job_modify_index=job.job_modify_index + 10)
    if destructive:
        return with_task(nxt, config_json=f'{{"run_for": "{nxt.version}h"}}')
    return replace(nxt, meta={**job.meta, "rev": str(nxt.version)})


def running(job: Job, node: Node, index: int = 0, **overrides: Any) -> Allocation:
    overrides.setdefault("client_status", structs.ALLOC_CLIENT_RUNNING)
    return mock.alloc(job, node, index, **overrides)


def unknown_since(job: Job, node: Node, since_ns: int, **overrides: Any) -> Allocation:
    history = (
        AllocStateChange(
            field="client_status", value=structs.ALLOC_CLIENT_RUNNING, time_ns=since_ns - 60 * SECOND
        ),
        AllocStateChange(field="client_status", value=structs.ALLOC_CLIENT_UNKNOWN, time_ns=since_ns),
    )
    return mock.alloc(
        job, node, client_status=structs.ALLOC_CLIENT_UNKNOWN, state_history=history, **overrides
    )


def ready_nodes(n: int, **overrides: object) -> list[Node]:
    return [mock.node(**overrides) for _ in range(n)]


@dataclass
class Scenario:
    """The diff's inputs. Nodes are split into ready/not ready the way the shell does it."""

    job: Job | None
    nodes: list[Node] = field(default_factory=list)
    allocs: list[Allocation] = field(default_factory=list)
    versions: list[Job] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)  # node IDs of deregistered nodes
    infeasible: Mapping[str, frozenset[str]] = field(default_factory=dict)
    drain_pending: frozenset[str] = frozenset()
    now_ns: int = NOW
    # nodes ready and eligible but outside the job's datacenters
    other_dc: list[Node] = field(default_factory=list)

    def run(self) -> SystemDiff:
        ready = [n for n in self.nodes if n.ready_for_placement()]
        not_ready: dict[str, Node | None] = {n.id: n for n in (*self.nodes, *self.other_dc) if n not in ready}
        not_ready.update(dict.fromkeys(self.missing))
        return diff_system_allocs(
            self.job,
            ready,
            not_ready,
            self.allocs,
            self.now_ns,
            infeasible=self.infeasible,
            drain_pending=self.drain_pending,
            job_versions={v.version: v for v in self.versions},
        )


def running_everywhere(job: Job | None, nodes: list[Node], ran: Job | None = None, **fields: Any) -> Scenario:
    """Every one of ``nodes`` runs an alloc of ``ran``, by default ``job`` itself: the version
    the store holds now (None: purged), which the diff weighs against what runs."""
    source = ran or job
    assert source is not None, "a purged job needs the version that ran"
    return Scenario(job, nodes, [running(source, n) for n in nodes], **fields)


def node_ids(tuples: Iterable[AllocTuple]) -> list[str]:
    return sorted(t.node_id for t in tuples)


# ---------------------------------------------------------------------------------------
# The table: one situation per row, every bucket covered


def s_new_nodes() -> Scenario:
    return Scenario(mock.system_job(), ready_nodes(3))


def s_all_current() -> Scenario:
    return running_everywhere(mock.system_job(), ready_nodes(3))


def s_one_node_new() -> Scenario:
    job = mock.system_job()
    nodes = ready_nodes(3)
    return Scenario(job, nodes, [running(job, n) for n in nodes[:2]])


def s_job_stopped() -> Scenario:
    job = mock.system_job()
    return running_everywhere(replace(job, stop=True), ready_nodes(3), job)


def s_job_purged() -> Scenario:
    return running_everywhere(None, ready_nodes(2), mock.system_job())


def s_count_zero() -> Scenario:
    job = mock.system_job()
    return running_everywhere(with_group(job, count=0), ready_nodes(2), job)


def s_group_removed() -> Scenario:
    job = mock.system_job()
    return running_everywhere(with_group(job, name="api"), ready_nodes(2), job)


def s_inplace() -> Scenario:
    v0 = mock.system_job()
    return running_everywhere(bump(v0, destructive=False), ready_nodes(3), v0, versions=[v0])


def s_destructive() -> Scenario:
    v0 = mock.system_job()
    return running_everywhere(bump(v0, destructive=True), ready_nodes(3), v0, versions=[v0])


def s_alloc_stop_requested() -> Scenario:
    job = mock.system_job()
    nodes = ready_nodes(3)
    allocs = [running(job, n) for n in nodes]
    allocs[1] = replace(allocs[1], desired_transition=structs.DesiredTransition(migrate=True))
    return Scenario(job, nodes, allocs)


def s_unknown_old_version() -> Scenario:
    # The old version was garbage-collected from the version table: restart to be safe.
    v0 = mock.system_job()
    return running_everywhere(bump(v0, destructive=False), ready_nodes(2), v0, versions=[])


def s_node_down() -> Scenario:
    return running_everywhere(
        mock.system_job(), [*ready_nodes(2), mock.node(status=structs.NODE_STATUS_DOWN)]
    )


def s_node_deregistered() -> Scenario:
    job = mock.system_job()
    nodes = ready_nodes(1)
    gone = mock.node()
    return Scenario(job, nodes, [running(job, n) for n in (*nodes, gone)], missing=[gone.id])


def s_stopping_on_down_node() -> Scenario:
    # Told to stop, the node died before the client said so: lost, not "stopping" forever.
    job = mock.system_job()
    down = mock.node(status=structs.NODE_STATUS_DOWN)
    return Scenario(job, [down], [running(job, down, desired_status=structs.ALLOC_DESIRED_STOP)])


def s_stopped_job_on_down_node() -> Scenario:
    job = mock.system_job()
    down = mock.node(status=structs.NODE_STATUS_DOWN)
    return Scenario(replace(job, stop=True), [down], [running(job, down)])


def s_disconnected_running() -> Scenario:
    return running_everywhere(
        mock.system_job(), [mock.node(), mock.node(status=structs.NODE_STATUS_DISCONNECTED)]
    )


def s_disconnected_pending_and_unknown() -> Scenario:
    job = mock.system_job()
    a, b = (
        mock.node(status=structs.NODE_STATUS_DISCONNECTED),
        mock.node(status=structs.NODE_STATUS_DISCONNECTED),
    )
    return Scenario(job, [a, b], [mock.alloc(job, a), unknown_since(job, b, NOW - 10 * SECOND)])


def s_disconnected_expired() -> Scenario:
    job = with_group(mock.system_job(), disconnect=DisconnectStrategy(lost_after_ns=60 * SECOND))
    a, b = (
        mock.node(status=structs.NODE_STATUS_DISCONNECTED),
        mock.node(status=structs.NODE_STATUS_DISCONNECTED),
    )
    old = unknown_since(job, a, NOW - 61 * SECOND)
    fresh = unknown_since(job, b, NOW - 59 * SECOND)
    return Scenario(job, [a, b], [old, fresh])


def s_reconnect() -> Scenario:
    job = mock.system_job()
    back = mock.node()
    return Scenario(job, [back], [unknown_since(job, back, NOW - 10 * SECOND)])


def s_reconnect_ineligible() -> Scenario:
    job = mock.system_job()
    back = mock.node(scheduling_eligibility=structs.NODE_INELIGIBLE)
    return Scenario(job, [back], [unknown_since(job, back, NOW - 10 * SECOND)])


def s_drain_system_last() -> Scenario:
    return running_everywhere(mock.system_job(), [mock.node(), mock.drain_node()])


def s_drain_other_work_first() -> Scenario:
    job = mock.system_job()
    draining = mock.drain_node()
    return Scenario(job, [draining], [running(job, draining)], drain_pending=frozenset({draining.id}))


def s_drain_ignores_system() -> Scenario:
    job = mock.system_job()
    draining = mock.drain_node(drain_strategy=DrainStrategy(ignore_system_jobs=True))
    return Scenario(job, [draining], [running(job, draining)])


def s_ineligible() -> Scenario:
    v0 = mock.system_job()
    v1 = bump(v0, destructive=True)
    nodes = [
        mock.node(scheduling_eligibility=structs.NODE_INELIGIBLE),
        mock.node(scheduling_eligibility=structs.NODE_INELIGIBLE),
    ]
    # One keeps its (even outdated) alloc, the other gets nothing new.
    return Scenario(v1, nodes, [running(v0, nodes[0])], versions=[v0])


def s_initializing() -> Scenario:
    job = mock.system_job()
    node = mock.node(status=structs.NODE_STATUS_INIT)
    return Scenario(job, [node], [running(job, node)])


def s_other_datacenter() -> Scenario:
    job = mock.system_job()
    east = mock.node(datacenter="east")
    return Scenario(job, ready_nodes(1), [running(job, east)], other_dc=[east])


def s_node_unknown_to_caller() -> Scenario:
    job = mock.system_job()
    stranger = mock.node()
    return Scenario(job, [], [running(job, stranger)])


def s_infeasible_group() -> Scenario:
    job = mock.system_job()
    nodes = ready_nodes(3)
    return Scenario(
        job,
        nodes,
        [running(job, nodes[0])],
        infeasible={"web": frozenset({nodes[0].id, nodes[1].id})},
    )


def s_failed_system_alloc() -> Scenario:
    job = mock.system_job()
    nodes = ready_nodes(2)
    return Scenario(
        job,
        nodes,
        [running(job, nodes[0]), mock.alloc(job, nodes[1], client_status=structs.ALLOC_CLIENT_FAILED)],
    )


def s_duplicates_current() -> Scenario:
    job = mock.system_job()
    node = mock.node()
    return Scenario(job, [node], [running(job, node), running(job, node)])


def s_triplicate_mixed_versions() -> Scenario:
    v0 = mock.system_job()
    v1 = bump(v0, destructive=True)
    node = mock.node()
    allocs = [running(v0, node), running(v0, node), mock.alloc(v1, node)]
    return Scenario(v1, [node], allocs, versions=[v0])


def s_duplicates_disconnected() -> Scenario:
    job = mock.system_job()
    node = mock.node(status=structs.NODE_STATUS_DISCONNECTED)
    return Scenario(job, [node], [running(job, node), running(job, node)])


def s_sysbatch_count() -> Scenario:
    job = with_group(mock.sysbatch_job(), count=3)
    return Scenario(job, ready_nodes(2))


def s_sysbatch_done() -> Scenario:
    job = mock.sysbatch_job()
    nodes = ready_nodes(3)
    allocs = [
        mock.alloc(job, nodes[0], client_status=structs.ALLOC_CLIENT_COMPLETE),
        mock.alloc(job, nodes[1], client_status=structs.ALLOC_CLIENT_FAILED),
    ]
    return Scenario(job, nodes, allocs)


def s_sysbatch_inplace_change_no_rerun() -> Scenario:
    v0 = mock.sysbatch_job()
    v1 = bump(v0, destructive=False)
    node = mock.node()
    return Scenario(
        v1, [node], [mock.alloc(v0, node, client_status=structs.ALLOC_CLIENT_COMPLETE)], versions=[v0]
    )


def s_sysbatch_destructive_rerun() -> Scenario:
    v0 = mock.sysbatch_job()
    v1 = bump(v0, destructive=True)
    nodes = ready_nodes(2)
    allocs = [
        mock.alloc(v0, nodes[0], client_status=structs.ALLOC_CLIENT_COMPLETE),
        running(v0, nodes[1]),
    ]
    return Scenario(v1, nodes, allocs, versions=[v0])


def s_sysbatch_count_shrink() -> Scenario:
    v0 = with_group(mock.sysbatch_job(), count=3)
    v1 = replace(with_group(v0, count=1), version=1)
    node = mock.node()
    return Scenario(v1, [node], [running(v0, node, i) for i in range(3)], versions=[v0])


CASES: list[tuple[str, Callable[[], Scenario], Expect]] = [
    ("new-nodes-get-placements", s_new_nodes, Expect(place=3)),
    ("all-current", s_all_current, Expect(ignore=3)),
    ("one-new-node", s_one_node_new, Expect(place=1, ignore=2)),
    ("job-stopped", s_job_stopped, Expect(stop=3)),
    ("job-purged", s_job_purged, Expect(stop=2)),
    ("count-zero", s_count_zero, Expect(stop=2)),
    ("group-removed", s_group_removed, Expect(stop=2, place=2)),
    ("inplace-update", s_inplace, Expect(update_inplace=3)),
    ("destructive-update", s_destructive, Expect(update_destructive=3)),
    ("alloc-stop__replaced-on-its-node", s_alloc_stop_requested, Expect(update_destructive=1, ignore=2)),
    ("old-version-unknown-is-destructive", s_unknown_old_version, Expect(update_destructive=2)),
    ("node-down-lost", s_node_down, Expect(lost=1, ignore=2)),
    ("node-deregistered-lost", s_node_deregistered, Expect(lost=1, ignore=1)),
    ("stopping-on-down-node-lost", s_stopping_on_down_node, Expect(lost=1)),
    ("stopped-job-on-down-node-lost", s_stopped_job_on_down_node, Expect(lost=1)),
    ("disconnected-running", s_disconnected_running, Expect(disconnecting=1, ignore=1)),
    ("disconnected-pending-unknown", s_disconnected_pending_and_unknown, Expect(ignore=2)),
    ("disconnected-lost-after-expired", s_disconnected_expired, Expect(lost=1, ignore=1)),
    ("reconnect", s_reconnect, Expect(reconnecting=1)),
    ("reconnect-ineligible-node", s_reconnect_ineligible, Expect(reconnecting=1)),
    ("drain-system-last", s_drain_system_last, Expect(migrate=1, ignore=1)),
    ("drain-other-work-first", s_drain_other_work_first, Expect(ignore=1)),
    ("drain-ignores-system-jobs", s_drain_ignores_system, Expect(ignore=1)),
    ("ineligible-keeps-no-new", s_ineligible, Expect(ignore=1)),
    ("initializing-keeps", s_initializing, Expect(ignore=1)),
    ("other-datacenter", s_other_datacenter, Expect(stop=1, place=1)),
    ("node-unknown-to-caller", s_node_unknown_to_caller, Expect(stop=1)),
    ("infeasible-group", s_infeasible_group, Expect(stop=1, place=1)),
    ("failed-system-alloc-replaced", s_failed_system_alloc, Expect(place=1, ignore=1)),
    ("duplicates-current", s_duplicates_current, Expect(stop=1, ignore=1)),
    ("triplicate-mixed-versions", s_triplicate_mixed_versions, Expect(stop=2, ignore=1)),
    ("duplicates-disconnected", s_duplicates_disconnected, Expect(stop=1, disconnecting=1)),
    ("sysbatch-count-per-node", s_sysbatch_count, Expect(place=6)),
    ("sysbatch-done-not-rerun", s_sysbatch_done, Expect(ignore=2, place=1)),
    ("sysbatch-inplace-change-no-rerun", s_sysbatch_inplace_change_no_rerun, Expect(ignore=1)),
    ("sysbatch-destructive-rerun", s_sysbatch_destructive_rerun, Expect(update_destructive=2)),
    ("sysbatch-count-shrink", s_sysbatch_count_shrink, Expect(stop=2, update_inplace=1)),
]


@pytest.mark.parametrize(("build", "expect"), [(b, e) for _, b, e in CASES], ids=[c[0] for c in CASES])
def test_diff__buckets(build: Callable[[], Scenario], expect: Expect) -> None:
    expect.check(build().run())


def test_diff__table_covers_every_bucket() -> None:
    covered = {name for name in buckets.SYSTEM if any(getattr(e, name) for _, _, e in CASES)}
    # deferred is covered by the max_parallel tests below
    assert covered >= buckets.SYSTEM - {"deferred"}


# ---------------------------------------------------------------------------------------
# Details the counts do not show


def test_diff__lost_on_down_node_names_the_reason() -> None:
    diff = s_node_down().run()
    assert [t.reason for t in diff.lost] == [DESC_LOST]


def test_diff__failed_system_alloc__replacement_follows_it() -> None:
    scenario = s_failed_system_alloc()
    diff = scenario.run()
    failed = scenario.allocs[1]
    assert [(t.node_id, t.alloc) for t in diff.place] == [(failed.node_id, failed)]


def test_diff__first_placement_has_no_previous() -> None:
    diff = s_new_nodes().run()
    assert all(t.alloc is None for t in diff.place)
    assert sorted(t.name for t in diff.place) == [diff.place[0].name] * 3


def test_diff__sysbatch_names_per_node() -> None:
    scenario = s_sysbatch_count()
    assert scenario.job is not None
    diff = scenario.run()
    job_id = scenario.job.id
    for node in scenario.nodes:
        names = sorted(t.name for t in diff.place if t.node_id == node.id)
        assert names == [f"{job_id}.web[0]", f"{job_id}.web[1]", f"{job_id}.web[2]"]


def test_diff__sysbatch_destructive_rerun__previous_is_the_finished_alloc() -> None:
    scenario = s_sysbatch_destructive_rerun()
    diff = scenario.run()
    by_node = {t.node_id: t.alloc for t in diff.update_destructive}
    assert by_node == {a.node_id: a for a in scenario.allocs}


def test_diff__sysbatch_count_shrink__keeps_index_zero() -> None:
    diff = s_sysbatch_count_shrink().run()
    assert [t.index for t in diff.update_inplace] == [0]
    assert sorted(t.index for t in diff.stop) == [1, 2]


def test_diff__sysbatch_old_terminal_and_new_live__live_wins() -> None:
    # A name that has a live alloc is never re-placed, whatever ran there before.
    job = mock.sysbatch_job()
    node = mock.node()
    allocs = [mock.alloc(job, node, client_status=structs.ALLOC_CLIENT_FAILED), running(job, node)]
    Expect(ignore=1).check(Scenario(job, [node], allocs).run())


def test_diff__newest_terminal_is_the_previous() -> None:
    job = mock.system_job()
    node = mock.node()
    older = mock.alloc(job, node, client_status=structs.ALLOC_CLIENT_FAILED, create_index=5)
    newer = mock.alloc(job, node, client_status=structs.ALLOC_CLIENT_LOST, create_index=9)
    diff = Scenario(job, [node], [newer, older]).run()
    assert [t.alloc for t in diff.place] == [newer]


def test_diff__reconnecting_on_ready_node_with_new_version_is_an_update() -> None:
    v0 = mock.system_job()
    v1 = bump(v0, destructive=False)
    node = mock.node()
    diff = Scenario(v1, [node], [unknown_since(v0, node, NOW - SECOND)], versions=[v0]).run()
    Expect(update_inplace=1).check(diff)


def test_diff__disconnected_without_lost_after_never_expires() -> None:
    job = mock.system_job()
    node = mock.node(status=structs.NODE_STATUS_DISCONNECTED)
    diff = Scenario(job, [node], [unknown_since(job, node, NOW - 10_000 * SECOND)]).run()
    Expect(ignore=1).check(diff)


def test_diff__disconnected_node_with_unrelated_job_change__no_update() -> None:
    v0 = mock.system_job()
    v1 = bump(v0, destructive=True)
    node = mock.node(status=structs.NODE_STATUS_DISCONNECTED)
    diff = Scenario(v1, [node], [running(v0, node)], versions=[v0]).run()
    Expect(disconnecting=1).check(diff)


# ---------------------------------------------------------------------------------------
# Duplicates: which one survives


def _survivor(*allocs: Allocation) -> Allocation:
    job = mock.system_job()
    node = mock.node()
    placed = [replace(a, node_id=node.id, name=f"{job.id}.web[0]", job_id=job.id) for a in allocs]
    versions = sorted({a.job_version for a in placed})
    current = replace(job, version=versions[-1])
    diff = Scenario(current, [node], placed, versions=[replace(job, version=v) for v in versions]).run()
    kept = [
        t.alloc
        for b in ("ignore", "update_inplace", "update_destructive", "reconnecting")
        for t in diff.bucket(b)
    ]
    assert len(kept) == 1
    assert len(diff.stop) == len(allocs) - 1
    assert all(t.reason == DESC_DUPLICATE for t in diff.stop)
    assert kept[0] is not None
    return kept[0]


def _a(alloc_id: str, **overrides: Any) -> Allocation:
    job = mock.system_job()
    return mock.alloc(job, mock.node(), id=alloc_id, **overrides)


@pytest.mark.parametrize(
    ("allocs", "winner"),
    [
        (
            [_a("a", job_version=0, client_status=structs.ALLOC_CLIENT_RUNNING), _a("b", job_version=1)],
            "b",
        ),
        (
            [_a("a", client_status=structs.ALLOC_CLIENT_RUNNING, create_index=1), _a("b", create_index=9)],
            "a",
        ),
        (
            [
                _a("a", client_status=structs.ALLOC_CLIENT_UNKNOWN),
                _a("b", client_status=structs.ALLOC_CLIENT_PENDING),
            ],
            "a",
        ),
        ([_a("a", create_index=3), _a("b", create_index=2)], "a"),
        ([_a("a", create_index=3), _a("b", create_index=3)], "b"),
        (
            [
                _a("a", job_version=1, client_status=structs.ALLOC_CLIENT_PENDING, create_index=1),
                _a("b", job_version=1, client_status=structs.ALLOC_CLIENT_RUNNING, create_index=0),
                _a("c", job_version=0, client_status=structs.ALLOC_CLIENT_RUNNING, create_index=99),
            ],
            "b",
        ),
    ],
    ids=[
        "newest-version-over-running",
        "running-over-newer-pending",
        "unknown-over-pending",
        "newest-create-index",
        "highest-id-breaks-ties",
        "version-then-status",
    ],
)
def test_diff__duplicate_survivor(allocs: list[Allocation], winner: str) -> None:
    assert _survivor(*allocs).id == winner
    assert rank_duplicates(allocs)[0].id == winner
    assert rank_duplicates(reversed(allocs))[0].id == winner


def test_diff__duplicates_holding_the_same_static_port__one_survives() -> None:
    # docs/field-reports.md#field-report-1: two live allocs on one node both hold 9100; the applier
    # would reject any
    # plan that keeps both. Exactly one survives and the name is not placed again.
    network = NetworkResource(reserved_ports=(Port(label="metrics", value=9100, to=9100),))
    job = with_group(mock.system_job(), network=network)
    node = mock.node()
    port = AllocatedResources(cpu_mhz=500, memory_mb=256, ports=(AllocatedPort(label="metrics", value=9100),))
    allocs = [running(job, node, resources=port), running(job, node, resources=port)]
    diff = Scenario(job, [node], allocs).run()
    Expect(stop=1, ignore=1).check(diff)
    survivors = [t.alloc.id for t in (*diff.stop, *diff.ignore) if t.alloc is not None]
    assert sorted(survivors) == sorted(a.id for a in allocs)


# ---------------------------------------------------------------------------------------
# Rolling updates: max_parallel counts nodes left without a running instance


def rolling(job: Job, max_parallel: int, stagger_s: int = 30) -> Job:
    return replace(job, update=UpdateStrategy(max_parallel=max_parallel, stagger_ns=stagger_s * SECOND))


def test_diff__field_report_1__destructive_and_newer_inplace_on_one_node() -> None:
    """docs/field-reports.md#field-report-1 (the max_parallel doubt): max_parallel 1; node A holds an
    alloc needing a destructive update
    and a newer one needing only an in-place update; node B needs a destructive update.
    One pass: A keeps the newer alloc (in-place), stops the older duplicate for free, and
    exactly one destructive update happens (B's)."""
    v0 = rolling(mock.system_job(), 1)
    v1 = bump(v0, destructive=True)  # tasks changed since v0
    v2 = bump(v1, destructive=False)  # only meta since v1
    a, b = mock.node(id="node-a"), mock.node(id="node-b")
    old_a = running(v0, a, id="a-v0", create_index=10)
    new_a = running(v1, a, id="a-v1", create_index=20)
    old_b = running(v0, b, id="b-v0", create_index=11)
    diff = Scenario(v2, [a, b], [old_a, new_a, old_b], versions=[v0, v1]).run()

    Expect(update_inplace=1, stop=1, update_destructive=1).check(diff)
    assert [t.alloc for t in diff.update_inplace] == [new_a]
    assert [(t.alloc, t.reason) for t in diff.stop] == [(old_a, DESC_DUPLICATE)]
    assert [t.alloc for t in diff.update_destructive] == [old_b]


def test_diff__field_report_1__third_node_waits_for_the_next_batch() -> None:
    v0 = rolling(mock.system_job(), 1)
    v1 = bump(v0, destructive=True)
    v2 = bump(v1, destructive=False)
    a, b, c = mock.node(id="node-a"), mock.node(id="node-b"), mock.node(id="node-c")
    allocs = [running(v0, a), running(v1, a), running(v0, b), running(v0, c)]
    diff = Scenario(v2, [a, b, c], allocs, versions=[v0, v1]).run()
    Expect(update_inplace=1, stop=1, update_destructive=1, deferred=1).check(diff)
    assert node_ids(diff.update_destructive) == ["node-b"]
    assert node_ids(diff.deferred) == ["node-c"]


def test_diff__max_parallel__limits_destructive_nodes() -> None:
    v0 = rolling(mock.system_job(), 2)
    v1 = bump(v0, destructive=True)
    nodes = ready_nodes(5)
    diff = running_everywhere(v1, nodes, v0, versions=[v0]).run()
    Expect(update_destructive=2, deferred=3).check(diff)
    # Same input, same batch: replays of the eval admit the same nodes.
    assert node_ids(diff.update_destructive) == sorted(n.id for n in nodes)[:2]


def test_diff__max_parallel_zero_is_unlimited() -> None:
    v0 = rolling(mock.system_job(), 0)
    v1 = bump(v0, destructive=True)
    nodes = ready_nodes(4)
    Expect(update_destructive=4).check(running_everywhere(v1, nodes, v0, versions=[v0]).run())


def test_diff__max_parallel__inplace_updates_are_free() -> None:
    v0 = rolling(mock.system_job(), 1)
    v1 = bump(v0, destructive=False)
    nodes = ready_nodes(4)
    Expect(update_inplace=4).check(running_everywhere(v1, nodes, v0, versions=[v0]).run())


def test_diff__max_parallel__placements_stops_and_lost_are_free() -> None:
    v0 = rolling(mock.system_job(), 1)
    v1 = bump(v0, destructive=True)
    up = ready_nodes(3)
    down = mock.node(status=structs.NODE_STATUS_DOWN)
    east = mock.node(datacenter="east")
    allocs = [running(v0, up[0]), running(v0, up[1]), running(v0, down), running(v0, east)]
    diff = Scenario(v1, [*up, down], allocs, versions=[v0], other_dc=[east]).run()
    Expect(update_destructive=1, deferred=1, place=1, lost=1, stop=1).check(diff)


def test_diff__max_parallel__duplicate_beside_running_survivor_is_free() -> None:
    v0 = rolling(mock.system_job(), 1)
    v1 = bump(v0, destructive=True)
    a, b = mock.node(id="node-a"), mock.node(id="node-b")
    allocs = [running(v1, a), mock.alloc(v0, a), running(v0, b)]
    diff = Scenario(v1, [a, b], allocs, versions=[v0]).run()
    Expect(ignore=1, stop=1, update_destructive=1).check(diff)


def test_diff__max_parallel__duplicate_taking_the_only_running_alloc_is_charged() -> None:
    # A's running alloc is an outdated duplicate of a pending newer one: stopping it
    # leaves A without a running instance, so it uses A's share of the budget, and is
    # never held back (the invariant comes first). B waits.
    v0 = rolling(mock.system_job(), 1)
    v1 = bump(v0, destructive=True)
    a, b = mock.node(id="node-a"), mock.node(id="node-b")
    allocs = [mock.alloc(v1, a, client_status=structs.ALLOC_CLIENT_PENDING), running(v0, a), running(v0, b)]
    diff = Scenario(v1, [a, b], allocs, versions=[v0]).run()
    Expect(ignore=1, stop=1, deferred=1).check(diff)
    assert node_ids(diff.deferred) == ["node-b"]


def test_diff__max_parallel__group_update_overrides_job_update() -> None:
    v0 = with_group(rolling(mock.system_job(), 1), update=UpdateStrategy(max_parallel=3))
    v1 = bump(v0, destructive=True)
    nodes = ready_nodes(4)
    Expect(update_destructive=3, deferred=1).check(running_everywhere(v1, nodes, v0, versions=[v0]).run())


def test_diff__max_parallel__sysbatch_node_counts_once() -> None:
    v0 = rolling(with_group(mock.sysbatch_job(), count=2), 1)
    v1 = bump(v0, destructive=True)
    nodes = ready_nodes(2)
    allocs = [running(v0, n, i) for n in nodes for i in range(2)]
    diff = Scenario(v1, nodes, allocs, versions=[v0]).run()
    Expect(update_destructive=2, deferred=2).check(diff)
    assert len(set(node_ids(diff.update_destructive))) == 1


def test_diff__max_parallel__ignored_when_job_stopped() -> None:
    job = rolling(mock.system_job(), 1)
    nodes = ready_nodes(3)
    Expect(stop=3).check(running_everywhere(replace(job, stop=True), nodes, job).run())


# ---------------------------------------------------------------------------------------
# tasks_updated


def _net(*ports: Port) -> NetworkResource:
    return NetworkResource(reserved_ports=ports)


TASK_CHANGES: list[tuple[str, Callable[[Job], Job], bool]] = [
    ("nothing", lambda j: j, False),
    ("job-meta", lambda j: replace(j, meta={"owner": "someone-else"}), False),
    ("priority", lambda j: replace(j, priority=90), False),
    ("job-update-block", lambda j: replace(j, update=UpdateStrategy(max_parallel=4)), False),
    ("group-update-block", lambda j: with_group(j, update=UpdateStrategy(max_parallel=2)), False),
    ("group-meta", lambda j: with_group(j, meta={"x": "y"}), False),
    ("count", lambda j: with_group(j, count=0), False),
    ("kill-timeout", lambda j: with_task(j, kill_timeout_ns=30 * SECOND), False),
    ("driver", lambda j: with_task(j, driver="raw_exec"), True),
    ("config", lambda j: with_task(j, config_json='{"run_for": "1h"}'), True),
    ("env", lambda j: with_task(j, env={"FOO": "baz"}), True),
    ("resources", lambda j: with_task(j, resources=Resources(cpu_mhz=501, memory_mb=256)), True),
    ("task-meta", lambda j: with_task(j, meta={"owner": "x"}), True),
    ("static-port", lambda j: with_group(j, network=_net(Port(label="http", value=8081, to=8081))), True),
    ("network-removed", lambda j: with_group(j, network=None), True),
    ("ephemeral-disk", lambda j: with_group(j, ephemeral_disk_mb=1000), True),
    ("task-renamed", lambda j: with_task(j, name="other"), True),
    (
        "task-added",
        lambda j: with_group(j, tasks=(*group_of(j).tasks, replace(group_of(j).tasks[0], name="sidecar"))),
        True,
    ),
]


@pytest.mark.parametrize(
    ("change", "destructive"), [(c, d) for _, c, d in TASK_CHANGES], ids=[t[0] for t in TASK_CHANGES]
)
def test_tasks_updated(change: Callable[[Job], Job], destructive: bool) -> None:
    old = mock.system_job()
    assert tasks_updated(old, change(old), "web") is destructive


def test_tasks_updated__missing_version_or_group_is_destructive() -> None:
    job = mock.system_job()
    assert tasks_updated(None, job, "web")
    assert tasks_updated(job, None, "web")
    assert tasks_updated(job, job, "api")


def test_tasks_updated__absent_resources_equal_the_default() -> None:
    job = with_task(mock.system_job(), resources=None)
    assert not tasks_updated(job, with_task(job, resources=Resources()), "web")


# ---------------------------------------------------------------------------------------
# The rule tables are data: each rule says why, and the ladder ends in a catch-all


def test_rules__every_rule_says_why() -> None:
    for rule in CLASSIFICATION_RULES:
        assert rule.category in SYSTEM_BUCKETS
        assert len(rule.why) > 20
    for keep in KEEP_RULES:
        assert len(keep.why) > 20


def test_rules__ladder_ends_in_ignore_catch_all() -> None:
    last = CLASSIFICATION_RULES[-1]
    assert last.category == IGNORE
    assert last.applies(None)  # type: ignore[arg-type]


def test_diff__annotations_by_group_name_every_bucket() -> None:
    diff = s_one_node_new().run()
    by_group = diff.counts_by_group(["web"])
    assert by_group["web"]["place"] == 1
    assert by_group["web"]["ignore"] == 2
    assert set(by_group["web"]) == {*SYSTEM_BUCKETS, "deferred"}


def test_diff__merge_and_log_fields() -> None:
    merged = s_new_nodes().run().merge(s_all_current().run())
    assert merged.log_fields() == {"place": 3, "ignore": 3}
