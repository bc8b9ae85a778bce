"""The worker's pure helpers: ``reblocked`` (a released blocked eval that still can not
place stays blocked as itself) and ``write_evals`` (one eval-update raft entry)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from drover.scheduler.interfaces import SchedulerResult
from drover.scheduler.structs import (
    EVAL_STATUS_BLOCKED,
    EVAL_STATUS_CANCELED,
    EVAL_STATUS_COMPLETE,
    EVAL_STATUS_PENDING,
    TRIGGER_QUEUED_ALLOCS,
    TRIGGER_ROLLING_UPDATE,
    Evaluation,
    Plan,
)
from drover.server.fsm import FSM
from drover.server.state_store import StateStore
from drover.server.worker import reblocked, write_evals
from drover.v1 import raft_pb2
from tests.fixtures import mock

JOB = mock.job(id="web")


def result_with_blocked_follow_up(
    ev: Evaluation, *, queued: dict[str, int] | None = None, others: tuple[Evaluation, ...] = ()
) -> SchedulerResult:
    """What a scheduler returns when it could not place everything: the eval completes and
    names a new blocked eval, created alongside any other follow-ups."""
    new_blocked = mock.eval_for(
        JOB,
        id="blocked-new",
        status=EVAL_STATUS_BLOCKED,
        triggered_by=TRIGGER_QUEUED_ALLOCS,
        previous_eval=ev.id,
        queued_allocations={"web": 3} if queued is None else queued,
    )
    update = replace(
        ev, status=EVAL_STATUS_COMPLETE, blocked_eval=new_blocked.id, queued_allocations={"web": 5}
    )
    return SchedulerResult(
        plan=Plan(eval_id=ev.id, job_id=JOB.id),
        eval_update=update,
        created_evals=(*others, new_blocked),
    )


def rolling_follow_up(ev: Evaluation) -> Evaluation:
    return mock.eval_for(JOB, id="rolling-next", triggered_by=TRIGGER_ROLLING_UPDATE, previous_eval=ev.id)


# ---------------------------------------------------------------------------------------
# reblocked


def test_reblocked__released_blocked_eval_still_blocked__stays_blocked_as_itself() -> None:
    ev = mock.eval_for(JOB, id="blocked-old", status=EVAL_STATUS_BLOCKED, triggered_by=TRIGGER_QUEUED_ALLOCS)
    result = result_with_blocked_follow_up(ev)

    out = reblocked(ev, result)

    assert out.eval_update.id == "blocked-old"
    assert out.eval_update.status == EVAL_STATUS_BLOCKED
    assert out.eval_update.blocked_eval == ""
    assert out.eval_update.queued_allocations == {"web": 3}, (
        "queued counts come from the would-be blocked eval"
    )
    assert out.created_evals == (), "no new blocked eval is minted"
    assert out.plan is result.plan


def test_reblocked__other_follow_ups_are_kept() -> None:
    ev = mock.eval_for(JOB, id="blocked-old", status=EVAL_STATUS_BLOCKED)
    rolling = rolling_follow_up(ev)

    out = reblocked(ev, result_with_blocked_follow_up(ev, others=(rolling,)))

    assert out.created_evals == (rolling,)
    assert out.eval_update.status == EVAL_STATUS_BLOCKED


def test_reblocked__follow_up_without_queued_counts__keeps_evals_own() -> None:
    ev = mock.eval_for(JOB, id="blocked-old", status=EVAL_STATUS_BLOCKED)

    out = reblocked(ev, result_with_blocked_follow_up(ev, queued={}))

    assert out.eval_update.queued_allocations == {"web": 5}


def test_reblocked__pending_eval__blocked_follow_up_kept() -> None:
    ev = mock.eval_for(JOB, id="pending-1", status=EVAL_STATUS_PENDING)
    result = result_with_blocked_follow_up(ev)

    out = reblocked(ev, result)

    assert out is result
    assert out.eval_update.status == EVAL_STATUS_COMPLETE
    assert out.eval_update.blocked_eval == "blocked-new"
    assert [e.id for e in out.created_evals] == ["blocked-new"]


def test_reblocked__blocked_eval_now_placed_everything__completes() -> None:
    ev = mock.eval_for(JOB, id="blocked-old", status=EVAL_STATUS_BLOCKED)
    result = SchedulerResult(
        plan=Plan(eval_id=ev.id, job_id=JOB.id),
        eval_update=replace(ev, status=EVAL_STATUS_COMPLETE),
        created_evals=(rolling_follow_up(ev),),
    )

    out = reblocked(ev, result)

    assert out is result
    assert out.eval_update.status == EVAL_STATUS_COMPLETE


def test_reblocked__named_blocked_eval_not_among_created__unchanged() -> None:
    ev = mock.eval_for(JOB, id="blocked-old", status=EVAL_STATUS_BLOCKED)
    result = result_with_blocked_follow_up(ev)
    result = replace(result, created_evals=())

    assert reblocked(ev, result) is result


def test_reblocked__applied_through_fsm__one_blocked_eval_for_the_job() -> None:
    """End to end on the state: the job keeps exactly its original blocked eval."""
    store = StateStore()
    fsm = FSM(store)
    ev = mock.eval_for(JOB, id="blocked-old", status=EVAL_STATUS_BLOCKED)
    fsm.apply(mock.eval_update_entry(ev), 1)

    out = reblocked(ev, result_with_blocked_follow_up(ev))
    write_evals(lambda data, timeout: fsm.apply(data, store.index + 1), [out.eval_update, *out.created_evals])

    evals = store.snapshot().evals_by_job(JOB.namespace, JOB.id)
    assert [(e.id, e.status) for e in evals] == [("blocked-old", EVAL_STATUS_BLOCKED)]


# ---------------------------------------------------------------------------------------
# write_evals


def test_write_evals__one_entry_with_every_eval() -> None:
    proposed: list[tuple[bytes, float]] = []
    evals = [
        mock.eval_for(JOB, id="e1", status=EVAL_STATUS_COMPLETE),
        mock.eval_for(JOB, id="e2", status=EVAL_STATUS_CANCELED),
    ]

    write_evals(lambda data, timeout: proposed.append((data, timeout)), evals)

    [(data, timeout)] = proposed
    assert timeout > 0
    entry = raft_pb2.LogEntry.FromString(data)
    assert entry.type == raft_pb2.ENTRY_TYPE_EVAL_UPDATE
    payload = raft_pb2.EvalUpdateEntry.FromString(entry.payload)
    assert [(e.id, e.status) for e in payload.evals] == [("e1", "complete"), ("e2", "canceled")]


def test_write_evals__nothing__proposes_nothing() -> None:
    proposed: list[bytes] = []

    write_evals(lambda data, timeout: proposed.append(data), [])

    assert proposed == []


def test_write_evals__applies_through_fsm() -> None:
    store = StateStore()
    fsm = FSM(store)

    write_evals(
        lambda data, timeout: fsm.apply(data, store.index + 1),
        [mock.eval_for(JOB, id="e1", status=EVAL_STATUS_COMPLETE)],
    )

    stored = store.snapshot().eval("e1")
    assert stored is not None and stored.status == EVAL_STATUS_COMPLETE


@pytest.mark.parametrize("status", [EVAL_STATUS_PENDING, EVAL_STATUS_BLOCKED])
def test_write_evals__keeps_status(status: str) -> None:
    proposed: list[bytes] = []

    write_evals(lambda data, timeout: proposed.append(data), [mock.eval_for(JOB, id="e1", status=status)])

    payload = raft_pb2.EvalUpdateEntry.FromString(raft_pb2.LogEntry.FromString(proposed[0]).payload)
    assert payload.evals[0].status == status
