"""After a snapshot restore the clients' real alloc states win (server/restore_followup.py,
the running-on-node invariant, and the client's rewind detection in client_agent/allocdiff.py)."""

from __future__ import annotations

from dataclasses import replace

import immutables

from drover.client.allocdiff import LocalAlloc, ServerAlloc, diff_allocs
from drover.scheduler.structs import Allocation, Job, Node
from drover.server.invariants import INVARIANT_RUNNING_ON_NODE, Violation, check_invariants
from drover.server.restore_followup import RESTORE_GRACE_NS, RestoreMark, followup, followup_entry
from drover.server.state_store import Tables
from tests.fixtures import mock

RESTORE_INDEX = 100
MARK = RestoreMark(index=RESTORE_INDEX, seen_at_ns=1_000)
AFTER_GRACE = MARK.seen_at_ns + RESTORE_GRACE_NS


class CountingIds:
    def __init__(self) -> None:
        self.n = 0

    def new(self) -> str:
        self.n += 1
        return f"id-{self.n}"


def restored(job: Job, node: Node, *allocs: Allocation) -> Tables:
    return Tables(
        index=RESTORE_INDEX + 5,
        nodes=immutables.Map({node.id: node}),
        jobs=immutables.Map({(job.namespace, job.id): job}),
        allocs=immutables.Map({a.id: a for a in allocs}),
    )


def running_on_node(tables: Tables, mark: RestoreMark, now_ns: int) -> list[Violation]:
    """The running-on-node violations only (these hand-built tables have no job summaries)."""
    return [v for v in check_invariants(tables, mark, now_ns) if v.invariant == INVARIANT_RUNNING_ON_NODE]


def phantom_state(*, node_registered_since: bool) -> tuple[Tables, Allocation, Allocation]:
    job = mock.job()
    node = mock.node(modify_index=RESTORE_INDEX + 2 if node_registered_since else 10)
    phantom = mock.alloc(job, node, 0, client_status="running", modify_index=40, create_index=30)
    resent = mock.alloc(
        job, node, 1, client_status="running", modify_index=RESTORE_INDEX + 3, create_index=30
    )
    return restored(job, node, phantom, resent), phantom, resent


def test_followup__within_grace__nothing_yet() -> None:
    tables, _, _ = phantom_state(node_registered_since=True)
    assert followup(tables, MARK, AFTER_GRACE - 1) is None


def test_followup__node_registered_since__unreported_alloc_lost_and_job_evaluated() -> None:
    tables, phantom, _ = phantom_state(node_registered_since=True)
    plan = followup(tables, MARK, AFTER_GRACE)
    assert plan is not None
    assert [a.id for a in plan.lost] == [phantom.id]
    assert plan.evaluate == ((phantom.namespace, phantom.job_id),)
    entry = followup_entry(tables, plan, CountingIds(), AFTER_GRACE)
    assert [(a.id, a.client_status) for a in entry.allocs] == [(phantom.id, "lost")]
    assert [e.job_id for e in entry.evals] == [phantom.job_id]


def test_followup__node_not_registered_since__nothing_lost_heartbeat_judges_it() -> None:
    tables, _, _ = phantom_state(node_registered_since=False)
    plan = followup(tables, MARK, AFTER_GRACE)
    assert plan is not None and plan.lost == ()
    assert len(plan.evaluate) == 1


def test_followup__down_node__left_to_the_heartbeat_path() -> None:
    tables, phantom, _ = phantom_state(node_registered_since=True)
    node = tables.nodes[phantom.node_id]
    tables = replace(tables, nodes=tables.nodes.set(node.id, replace(node, status="down")))
    plan = followup(tables, MARK, AFTER_GRACE)
    assert plan is not None and plan.lost == ()


def test_invariants__unconfirmed_running_alloc_after_grace__reported() -> None:
    tables, phantom, _ = phantom_state(node_registered_since=True)
    assert running_on_node(tables, MARK, AFTER_GRACE - 1) == []
    found = running_on_node(tables, MARK, AFTER_GRACE)
    assert [(v.invariant, v.subject) for v in found] == [
        (INVARIANT_RUNNING_ON_NODE, f"alloc {phantom.id!r} (job {phantom.job_id!r})")
    ]
    assert f"restored at index {RESTORE_INDEX}" in found[0].message


def test_invariants__no_restore__running_on_node_not_checked() -> None:
    tables, _, _ = phantom_state(node_registered_since=True)
    assert [v for v in check_invariants(tables) if v.invariant == INVARIANT_RUNNING_ON_NODE] == []


def test_diff__server_copy_older_than_runner__rewound() -> None:
    server = [ServerAlloc("a", "run", "running", 8), ServerAlloc("b", "run", "running", 20)]
    local = {"a": LocalAlloc("a", 13, stopping=True), "b": LocalAlloc("b", 20, stopping=False)}
    diff = diff_allocs(server, local)
    assert diff.rewound == ("a",)
    assert diff.update == () and diff.start == ()


def test_diff__server_copy_newer__not_rewound() -> None:
    diff = diff_allocs([ServerAlloc("a", "stop", "running", 13)], {"a": LocalAlloc("a", 8, stopping=False)})
    assert diff.rewound == () and diff.stop == ("a",)
