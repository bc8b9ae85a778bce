"""The operator writes behind ``alloc stop`` and ``operator scheduler set-config``: the FSM's
check-and-set of the scheduler config, its validation, the desired-transition entry, and
the broker's pause (server/cluster_ops.py, server/fsm.py, server/broker.py)."""

from __future__ import annotations

import itertools
import threading
from dataclasses import replace

import pytest

from drover.scheduler.structs import (
    ALLOC_CLIENT_COMPLETE,
    ALLOC_DESIRED_STOP,
    EVAL_STATUS_PENDING,
    TRIGGER_ALLOC_STOP,
    Evaluation,
    RejectionTrackerConfig,
    SchedulerConfig,
)
from drover.server.broker import EvalBroker
from drover.server.cluster_ops import check_scheduler_config, set_scheduler_config, stop_alloc
from drover.server.errors import ConflictError, NotFoundError, ValidationError
from drover.server.fsm import FSM, ApplyResult
from drover.server.state_store import StateStore
from tests.fixtures import mock

SECOND = 1_000_000_000


class FsmProposer:
    """A leader of one: each proposal is applied at once by a real FSM at the next index."""

    def __init__(self) -> None:
        self.store = StateStore()
        self.fsm = FSM(self.store)
        self.index = itertools.count(1)
        self.proposed = 0

    def propose(self, data: bytes, timeout: float) -> ApplyResult:
        self.proposed += 1
        return self.fsm.apply(data, next(self.index))


class FixedClock:
    def now_ns(self) -> int:
        return mock.NOW


class CountingIds:
    def __init__(self) -> None:
        self._n = itertools.count(1)

    def new(self) -> str:
        return f"id-{next(self._n)}"


@pytest.fixture
def raft() -> FsmProposer:
    return FsmProposer()


# ---------------------------------------------------------------------------------------
# Scheduler config: validation and check-and-set


@pytest.mark.parametrize("algorithm", ["binpack", "spread"])
def test_scheduler_config__known_algorithm__stored(raft: FsmProposer, algorithm: str) -> None:
    index = set_scheduler_config(raft, SchedulerConfig(scheduler_algorithm=algorithm), cas_index=None)

    stored = raft.store.snapshot().scheduler_config()
    assert (stored.scheduler_algorithm, stored.modify_index) == (algorithm, index)


def test_scheduler_config__empty_algorithm__means_binpack() -> None:
    assert check_scheduler_config(SchedulerConfig(scheduler_algorithm="")).scheduler_algorithm == "binpack"


@pytest.mark.parametrize(
    ("config", "field"),
    [
        (SchedulerConfig(scheduler_algorithm="random"), "config.scheduler_algorithm"),
        (SchedulerConfig(scheduler_algorithm="BINPACK"), "config.scheduler_algorithm"),
        (
            SchedulerConfig(rejection_tracker=RejectionTrackerConfig(threshold=-1)),
            "config.rejection_tracker",
        ),
    ],
    ids=["unknown", "wrong-case", "negative-threshold"],
)
def test_scheduler_config__invalid__refused_naming_field_nothing_proposed(
    raft: FsmProposer, config: SchedulerConfig, field: str
) -> None:
    with pytest.raises(ValidationError, match=field):
        set_scheduler_config(raft, config, cas_index=None)
    assert raft.proposed == 0


def test_scheduler_config__caller_indexes__ignored(raft: FsmProposer) -> None:
    index = set_scheduler_config(raft, SchedulerConfig(create_index=99, modify_index=99), cas_index=None)

    stored = raft.store.snapshot().scheduler_config()
    assert (stored.create_index, stored.modify_index) == (index, index)


def test_scheduler_config__cas_current_index__applied(raft: FsmProposer) -> None:
    first = set_scheduler_config(raft, SchedulerConfig(), cas_index=None)

    second = set_scheduler_config(raft, SchedulerConfig(pause_eval_broker=True), cas_index=first)

    stored = raft.store.snapshot().scheduler_config()
    assert (stored.pause_eval_broker, stored.create_index, stored.modify_index) == (True, first, second)


def test_scheduler_config__cas_stale_index__refused_by_fsm_unchanged(raft: FsmProposer) -> None:
    first = set_scheduler_config(raft, SchedulerConfig(), cas_index=None)
    set_scheduler_config(raft, SchedulerConfig(scheduler_algorithm="spread"), cas_index=first)
    before = raft.store.snapshot().scheduler_config()

    # A second writer that read the config at ``first`` too: the FSM refuses it.
    with pytest.raises(ConflictError, match=f"check index {first} does not match"):
        set_scheduler_config(raft, SchedulerConfig(pause_eval_broker=True), cas_index=first)

    assert raft.store.snapshot().scheduler_config() == before


def test_scheduler_config__cas_zero__only_before_any_write(raft: FsmProposer) -> None:
    set_scheduler_config(raft, SchedulerConfig(), cas_index=0)

    with pytest.raises(ConflictError):
        set_scheduler_config(raft, SchedulerConfig(), cas_index=0)


# ---------------------------------------------------------------------------------------
# Alloc stop: one entry with the desired transition and the job's eval


def _placed(raft: FsmProposer) -> tuple[str, str]:
    job = mock.job()
    raft.propose(mock.register_job_entry(job), 0)
    alloc = mock.alloc(job, mock.node())
    raft.propose(mock.plan_entry([alloc]), 0)
    return job.id, alloc.id


def test_alloc_stop__sets_migrate_and_writes_eval_in_one_entry(raft: FsmProposer) -> None:
    job_id, alloc_id = _placed(raft)
    alloc = raft.store.snapshot().alloc(alloc_id)
    assert alloc is not None and not alloc.should_migrate()

    stopped = stop_alloc(raft, raft.store, FixedClock(), CountingIds(), alloc)

    snap = raft.store.snapshot()
    after = snap.alloc(alloc_id)
    ev = snap.eval(stopped.eval_id)
    assert after is not None and after.should_migrate()
    assert after.modify_index == stopped.index
    assert isinstance(ev, Evaluation)
    assert (ev.triggered_by, ev.job_id, ev.status, ev.create_index) == (
        TRIGGER_ALLOC_STOP,
        job_id,
        EVAL_STATUS_PENDING,
        stopped.index,
    )


@pytest.mark.parametrize(
    "overrides",
    [{"desired_status": ALLOC_DESIRED_STOP}, {"client_status": ALLOC_CLIENT_COMPLETE}],
    ids=["desired-stop", "complete"],
)
def test_alloc_stop__terminal_alloc__refused_nothing_proposed(
    raft: FsmProposer, overrides: dict[str, str]
) -> None:
    _, alloc_id = _placed(raft)
    alloc = raft.store.snapshot().alloc(alloc_id)
    assert alloc is not None
    proposed = raft.proposed

    with pytest.raises(ConflictError, match="already stopped"):
        stop_alloc(raft, raft.store, FixedClock(), CountingIds(), replace(alloc, **overrides))  # type: ignore[arg-type]
    assert raft.proposed == proposed


def test_alloc_stop__job_purged__not_found(raft: FsmProposer) -> None:
    _, alloc_id = _placed(raft)
    alloc = raft.store.snapshot().alloc(alloc_id)
    assert alloc is not None

    with pytest.raises(NotFoundError, match="job"):
        stop_alloc(raft, raft.store, FixedClock(), CountingIds(), replace(alloc, job_id="gone"))


def test_alloc_stop__alloc_gone_before_apply__eval_still_written(raft: FsmProposer) -> None:
    _, alloc_id = _placed(raft)
    alloc = raft.store.snapshot().alloc(alloc_id)
    assert alloc is not None
    raft.propose(mock.eval_delete_entry(alloc_ids=[alloc_id]), 0)

    stopped = stop_alloc(raft, raft.store, FixedClock(), CountingIds(), alloc)

    snap = raft.store.snapshot()
    assert snap.alloc(alloc_id) is None
    assert snap.eval(stopped.eval_id) is not None


# ---------------------------------------------------------------------------------------
# The broker's pause


def _eval(eval_id: str, job_id: str) -> Evaluation:
    return Evaluation(id=eval_id, job_id=job_id, create_index=1)


def test_broker__paused__hands_out_nothing_until_resumed() -> None:
    broker = EvalBroker()
    broker.set_enabled(True)
    broker.set_paused(True)
    broker.enqueue(_eval("e1", "web"), mock.NOW)

    assert broker.dequeue(mock.NOW, 0) is None
    assert broker.stats().ready == 1

    broker.set_paused(False)
    got = broker.dequeue(mock.NOW, 0)
    assert got is not None and got[0].id == "e1"


def test_broker__paused__waiting_worker_wakes_on_resume() -> None:
    broker = EvalBroker()
    broker.set_enabled(True)
    broker.set_paused(True)
    broker.enqueue(_eval("e1", "web"), mock.NOW)
    got: list[object] = []

    def work() -> None:
        # A worker's long poll: it must come back with the eval once resumed, not time out.
        got.append(broker.dequeue(mock.NOW, 30))

    worker = threading.Thread(target=work)
    worker.start()
    broker.set_paused(False)
    worker.join(10)
    assert not worker.is_alive()
    assert got and got[0] is not None


def test_broker__pause__outlives_a_leadership_flush() -> None:
    broker = EvalBroker()
    broker.set_paused(True)
    broker.set_enabled(True)
    broker.set_enabled(False)
    broker.set_enabled(True)
    broker.enqueue(_eval("e1", "web"), mock.NOW)

    assert broker.paused
    assert broker.dequeue(mock.NOW, 0) is None
