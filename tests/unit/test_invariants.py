"""server/invariants.py: the live checker finds exactly the system groups over count on a node and
the job summaries that differ from a recount (docs/design.md#invariant-1, #invariant-2).

States are built through the FSM (the way raft builds them) and then broken the only way a
bug could break them: by writing a table directly with ``Txn``, as a faulty apply would.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from drover.scheduler.structs import Job, JobChildrenSummary, JobSummary, Node, TaskGroupSummary
from drover.server.invariants import INVARIANT_SUMMARIES, INVARIANT_SYSTEM_ALLOCS, check_invariants
from drover.server.state_store import Tables, Txn
from tests.fixtures import mock
from tests.fixtures.fsm_log import FsmLog


class Cluster(FsmLog):
    def corrupt(self, write: object) -> None:
        """Write the tables directly, bypassing the FSM's bookkeeping (a bug's effect)."""
        self.index += 1
        txn = Txn(self.store.snapshot().tables, self.index)
        write(txn)  # type: ignore[operator]
        self.store.commit(txn.commit())

    def node_and_job(self, job: Job) -> tuple[Node, Job]:
        """A registered node and ``job`` registered with its eval, as the store holds it."""
        node = mock.node()
        self.apply(mock.register_node_entry(node))
        self.apply(mock.register_job_entry(job, mock.eval_for(job)))
        return node, self.tables.jobs[(job.namespace, job.id)]

    @property
    def tables(self) -> Tables:
        return self.store.snapshot().tables


@pytest.fixture
def cluster() -> Cluster:
    c = Cluster()
    return c


def test_invariants__consistent_state__no_violations(cluster: Cluster) -> None:
    job = mock.system_job()
    node, stored = cluster.node_and_job(job)
    alloc = mock.alloc(stored, node)
    cluster.apply(mock.plan_entry([alloc]))
    cluster.apply(mock.client_update_entry(alloc.id, "running"))
    assert check_invariants(cluster.tables) == []


def test_invariants__two_live_system_allocs_on_one_node__reported(cluster: Cluster) -> None:
    job = mock.system_job()
    node, stored = cluster.node_and_job(job)
    first, second = mock.alloc(stored, node), mock.alloc(stored, node)
    cluster.apply(mock.plan_entry([first, second]))
    violations = check_invariants(cluster.tables)
    assert [v.invariant for v in violations] == [INVARIANT_SYSTEM_ALLOCS]
    assert node.id in violations[0].message and "2 live" in violations[0].message

    # Stopping one of them restores the invariant.
    cluster.apply(mock.plan_entry(allocs_stopped=[second.id]))
    assert check_invariants(cluster.tables) == []


def test_invariants__service_job_may_run_several_allocs_per_node(cluster: Cluster) -> None:
    job = mock.job()
    node, stored = cluster.node_and_job(job)
    cluster.apply(mock.plan_entry([mock.alloc(stored, node, i) for i in range(3)]))
    assert check_invariants(cluster.tables) == []


def test_invariants__summary_counter_off_and_negative__both_reported(cluster: Cluster) -> None:
    job = mock.batch_job()
    node, stored = cluster.node_and_job(job)
    cluster.apply(mock.plan_entry([mock.alloc(stored, node)]))
    key = (job.namespace, job.id)
    summary = cluster.tables.job_summaries[key]
    broken = replace(summary, summary={"web": replace(summary.summary["web"], starting=0, complete=-1)})
    cluster.corrupt(lambda txn: txn.put_summary(broken))
    messages = sorted(v.message for v in check_invariants(cluster.tables))
    assert all(v.invariant == INVARIANT_SUMMARIES for v in check_invariants(cluster.tables))
    assert messages == [
        "web.complete is -1, a recount of the allocs gives 0",
        "web.complete is negative (-1)",
        "web.starting is 0, a recount of the allocs gives 1",
    ]


def test_invariants__children_count_off__reported(cluster: Cluster) -> None:
    parent = mock.periodic_job()
    cluster.apply(mock.register_job_entry(parent))
    cluster.apply(mock.register_job_entry(mock.periodic_child(parent)))
    key = (parent.namespace, parent.id)
    summary = cluster.tables.job_summaries[key]
    assert summary.children == JobChildrenSummary(pending=1)
    cluster.corrupt(
        lambda txn: txn.put_summary(replace(summary, children=JobChildrenSummary(pending=0, dead=1)))
    )
    messages = sorted(v.message for v in check_invariants(cluster.tables))
    assert messages == [
        "children.dead is 1, a recount of the child jobs gives 0",
        "children.pending is 0, a recount of the child jobs gives 1",
    ]


def test_invariants__summary_without_job__reported(cluster: Cluster) -> None:
    orphan = JobSummary(job_id="ghost", summary={"web": TaskGroupSummary()})
    cluster.corrupt(lambda txn: txn.put_summary(orphan))
    violations = check_invariants(cluster.tables)
    assert [str(v) for v in violations] == ["job-summaries: job 'ghost' (default): has a summary but no job"]
