"""Blocked evals: one per job (per job and node for system/sysbatch), newest wins, released
all at once when capacity changes, a blocked eval that missed a release is detected, and
nothing is kept while disabled."""

from __future__ import annotations

from typing import Any

import pytest

from drover.scheduler.structs import (
    EVAL_STATUS_BLOCKED,
    JOB_TYPE_BATCH,
    JOB_TYPE_SERVICE,
    JOB_TYPE_SYSBATCH,
    JOB_TYPE_SYSTEM,
    TRIGGER_QUEUED_ALLOCS,
    Evaluation,
)
from drover.server.blocked import BlockedEvals

INDEX = 100


def blocked(eval_id: str, job: str = "web", create_index: int = 1, **kw: Any) -> Evaluation:
    return Evaluation(
        id=eval_id,
        job_id=job,
        status=EVAL_STATUS_BLOCKED,
        triggered_by=TRIGGER_QUEUED_ALLOCS,
        create_index=create_index,
        modify_index=create_index,
        **kw,
    )


@pytest.fixture
def tracker() -> BlockedEvals:
    b = BlockedEvals()
    b.set_enabled(True)
    return b


def ids(evals: list[Evaluation]) -> list[str]:
    return sorted(e.id for e in evals)


# ---------------------------------------------------------------------------------------
# One per job


def test_block__first_eval_of_job__kept(tracker: BlockedEvals) -> None:
    assert tracker.block(blocked("b1")) == []
    assert len(tracker) == 1
    assert ids(tracker.unblock_all(INDEX)) == ["b1"]


def test_block__newer_replaces_older__older_returned_to_cancel(tracker: BlockedEvals) -> None:
    tracker.block(blocked("b1", create_index=5))

    assert ids(tracker.block(blocked("b2", create_index=7))) == ["b1"]
    assert len(tracker) == 1
    assert ids(tracker.unblock_all(INDEX)) == ["b2"]


def test_block__older_arriving_after_newer__is_itself_returned(tracker: BlockedEvals) -> None:
    tracker.block(blocked("b2", create_index=7))

    assert ids(tracker.block(blocked("b1", create_index=5))) == ["b1"]
    assert ids(tracker.unblock_all(INDEX)) == ["b2"]


def test_block__same_eval_again__updates_without_cancelling(tracker: BlockedEvals) -> None:
    """A released blocked eval that still can not place is blocked again as itself."""
    tracker.block(blocked("b1", create_index=5))

    again = blocked("b1", create_index=5, snapshot_index=42)
    assert tracker.block(again) == []
    released = tracker.unblock_all(INDEX)
    assert released == [again]


def test_block__chain_of_replacements__each_older_cancelled_once(tracker: BlockedEvals) -> None:
    cancelled: list[Evaluation] = []
    for i in range(1, 6):
        cancelled += tracker.block(blocked(f"b{i}", create_index=i))

    assert ids(cancelled) == ["b1", "b2", "b3", "b4"]
    assert ids(tracker.unblock_all(INDEX)) == ["b5"]


def test_block__different_jobs__independent(tracker: BlockedEvals) -> None:
    assert tracker.block(blocked("w1", "web", create_index=1)) == []
    assert tracker.block(blocked("d1", "db", create_index=2)) == []

    assert len(tracker) == 2
    assert ids(tracker.unblock_all(INDEX)) == ["d1", "w1"]


def test_block__same_job_id_other_namespace__independent(tracker: BlockedEvals) -> None:
    tracker.block(blocked("b1", create_index=1))

    assert tracker.block(blocked("b2", create_index=2, namespace="prod")) == []
    assert len(tracker) == 2


@pytest.mark.parametrize("job_type", [JOB_TYPE_SERVICE, JOB_TYPE_BATCH], ids=["service", "batch"])
def test_block__non_system__node_id_ignored__still_one_per_job(tracker: BlockedEvals, job_type: str) -> None:
    tracker.block(blocked("b1", create_index=1, type=job_type, node_id="n1"))

    assert ids(tracker.block(blocked("b2", create_index=2, type=job_type, node_id="n2"))) == ["b1"]
    assert len(tracker) == 1


# ---------------------------------------------------------------------------------------
# Per node for system and sysbatch


@pytest.mark.parametrize("job_type", [JOB_TYPE_SYSTEM, JOB_TYPE_SYSBATCH], ids=["system", "sysbatch"])
def test_block__system_evals__one_per_job_and_node(tracker: BlockedEvals, job_type: str) -> None:
    assert tracker.block(blocked("n1-old", "sys", 1, type=job_type, node_id="n1")) == []
    assert tracker.block(blocked("n2", "sys", 2, type=job_type, node_id="n2")) == []
    assert len(tracker) == 2

    assert ids(tracker.block(blocked("n1-new", "sys", 3, type=job_type, node_id="n1"))) == ["n1-old"]
    assert ids(tracker.block(blocked("n2-stale", "sys", 0, type=job_type, node_id="n2"))) == ["n2-stale"]
    assert ids(tracker.unblock_all(INDEX)) == ["n1-new", "n2"]


def test_block__system_job_wide_and_per_node_evals__coexist(tracker: BlockedEvals) -> None:
    tracker.block(blocked("job-wide", "sys", 1, type=JOB_TYPE_SYSTEM))
    tracker.block(blocked("on-n1", "sys", 2, type=JOB_TYPE_SYSTEM, node_id="n1"))

    assert len(tracker) == 2


# ---------------------------------------------------------------------------------------
# Release, untrack, leadership


def test_unblock_all__returns_everything_and_empties(tracker: BlockedEvals) -> None:
    tracker.block(blocked("w", "web", 1))
    tracker.block(blocked("d", "db", 2))
    tracker.block(blocked("s1", "sys", 3, type=JOB_TYPE_SYSTEM, node_id="n1"))
    tracker.block(blocked("s2", "sys", 4, type=JOB_TYPE_SYSTEM, node_id="n2"))

    assert ids(tracker.unblock_all(INDEX)) == ["d", "s1", "s2", "w"]
    assert len(tracker) == 0
    assert tracker.unblock_all(INDEX) == []


def test_unblock_all__then_block_again__starts_fresh(tracker: BlockedEvals) -> None:
    tracker.block(blocked("b2", create_index=7))
    tracker.unblock_all(INDEX)

    # The newer one was released: an older one arriving now is not compared against it.
    assert tracker.block(blocked("b1", create_index=5)) == []
    assert ids(tracker.unblock_all(INDEX)) == ["b1"]


def test_untrack__removes_only_that_eval(tracker: BlockedEvals) -> None:
    tracker.block(blocked("w", "web", 1))
    tracker.block(blocked("s1", "sys", 2, type=JOB_TYPE_SYSTEM, node_id="n1"))
    tracker.block(blocked("s2", "sys", 3, type=JOB_TYPE_SYSTEM, node_id="n2"))

    tracker.untrack("s1")
    tracker.untrack("unknown")

    assert ids(tracker.unblock_all(INDEX)) == ["s2", "w"]


def test_disabled__block_does_nothing() -> None:
    tracker = BlockedEvals()

    assert tracker.block(blocked("b1", create_index=1)) == []
    assert tracker.block(blocked("b2", create_index=2)) == []
    assert len(tracker) == 0
    assert tracker.unblock_all(INDEX) == []


def test_set_enabled_false__drops_everything__and_stays_inert(tracker: BlockedEvals) -> None:
    tracker.block(blocked("b1", "web", 1))
    tracker.block(blocked("b2", "db", 2))

    tracker.set_enabled(False)
    assert len(tracker) == 0
    assert tracker.block(blocked("b3", "web", 3)) == []
    assert tracker.unblock_all(INDEX) == []

    tracker.set_enabled(True)
    assert len(tracker) == 0
    # Nothing remembered from before: an older eval is accepted, not compared to b1.
    assert tracker.block(blocked("b0", "web", 0)) == []


# ---------------------------------------------------------------------------------------
# Missed unblocks: capacity changed after the eval's snapshot, before it was blocked


def test_missed_unblock__nothing_released_yet__false(tracker: BlockedEvals) -> None:
    assert not tracker.missed_unblock(blocked("b1", snapshot_index=0))
    assert not tracker.missed_unblock(blocked("b1", snapshot_index=5))


@pytest.mark.parametrize(
    ("snapshot_index", "missed"),
    [(9, True), (10, False), (11, False)],
    ids=["snapshot-before-release", "snapshot-at-release", "snapshot-after-release"],
)
def test_missed_unblock__compares_snapshot_with_last_release(
    tracker: BlockedEvals, snapshot_index: int, missed: bool
) -> None:
    tracker.unblock_all(10)

    assert tracker.missed_unblock(blocked("b1", snapshot_index=snapshot_index)) is missed


def test_missed_unblock__last_release_index_never_goes_back(tracker: BlockedEvals) -> None:
    tracker.unblock_all(10)
    tracker.unblock_all(4)

    assert tracker.missed_unblock(blocked("b1", snapshot_index=9))


def test_missed_unblock__forgotten_on_leadership_change(tracker: BlockedEvals) -> None:
    tracker.unblock_all(10)

    tracker.set_enabled(False)
    tracker.set_enabled(True)

    assert not tracker.missed_unblock(blocked("b1", snapshot_index=9))
