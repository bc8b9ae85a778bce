"""The eval broker: priority and age order, one outstanding eval per job, tokens, nacks,
timeouts, the delivery limit, delays, leadership, requeue and untrack.

Time is an argument (``now_ns``) everywhere, so every timer is driven by ``tick`` here.
The blocking ``dequeue`` is only exercised with zero/short timeouts, or from a thread
joined against a deadline; no test sleeps.

The last part is a hypothesis ``RuleBasedStateMachine`` checking the broker against an
at-least-once model: every enqueued eval ends acked, cancelled (returned by an ack) or
failed (``take_failed``) once time moves on and everything is processed, and no two evals
of one job are ever with workers at once.
"""

from __future__ import annotations

import threading
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from drover.scheduler.structs import Evaluation
from drover.server.broker import (
    DEFAULT_DELIVERY_LIMIT,
    DEFAULT_NACK_TIMEOUT_NS,
    INITIAL_NACK_DELAY_NS,
    SUBSEQUENT_NACK_DELAY_NS,
    BrokerDisabledError,
    BrokerStats,
    EvalBroker,
    TokenMismatchError,
)

SECOND = 1_000_000_000
T0 = 1_700_000_000 * SECOND
EMPTY = BrokerStats(ready=0, unacked=0, waiting=0, delayed=0, failed=0)
# How long a test waits for a blocked dequeue to return: a deadline for "never", generous
# for a loaded machine. A dequeue that must be woken by something waits NEVER_S on its own.
WAKE_DEADLINE_S = 30.0
NEVER_S = 3600.0


def ev(eval_id: str, job: str = "web", *, priority: int = 50, create_index: int = 1, **kw: Any) -> Evaluation:
    """A pending eval; ``create_index`` is its age (lower is older)."""
    return Evaluation(
        id=eval_id,
        job_id=job,
        priority=priority,
        create_index=create_index,
        modify_index=create_index,
        **kw,
    )


def enabled_broker(**kw: Any) -> EvalBroker:
    broker = EvalBroker(**kw)
    broker.set_enabled(True)
    return broker


def take(broker: EvalBroker, now: int = T0) -> tuple[Evaluation, str]:
    item = broker.dequeue(now, timeout=0)
    assert item is not None, "expected a ready eval"
    return item


def one_taken(eval_id: str = "e1") -> tuple[EvalBroker, str]:
    """An enabled broker that has handed ``eval_id`` (job web, the oldest) to a worker:
    (broker, its token)."""
    broker = enabled_broker()
    broker.enqueue(ev(eval_id), T0)
    _, token = take(broker)
    return broker, token


def web_queue(n: int) -> EvalBroker:
    """An enabled broker with evals a1..an of job web enqueued, a1 the oldest."""
    broker = enabled_broker()
    for i in range(1, n + 1):
        broker.enqueue(ev(f"a{i}", "web", create_index=i), T0)
    return broker


def nothing_ready(broker: EvalBroker, now: int = T0) -> bool:
    return broker.dequeue(now, timeout=0) is None


def drain_ids(broker: EvalBroker, now: int = T0) -> list[str]:
    """Dequeue (without acking) every ready eval, in order."""
    ids = []
    while (item := broker.dequeue(now, timeout=0)) is not None:
        ids.append(item[0].id)
    return ids


# ---------------------------------------------------------------------------------------
# Ordering


def test_dequeue__priority_then_age() -> None:
    broker = enabled_broker()
    for eval_id, job, priority, index in [
        ("low-new", "j1", 10, 9),
        ("mid-new", "j2", 50, 7),
        ("high-new", "j3", 90, 8),
        ("mid-old", "j4", 50, 2),
        ("high-old", "j5", 90, 3),
        ("low-old", "j6", 10, 1),
    ]:
        assert broker.enqueue(ev(eval_id, job, priority=priority, create_index=index), T0)

    assert drain_ids(broker) == ["high-old", "high-new", "mid-old", "mid-new", "low-old", "low-new"]


def test_dequeue__same_priority_and_age__fifo() -> None:
    broker = enabled_broker()
    for i in range(5):
        broker.enqueue(ev(f"e{i}", f"j{i}", create_index=4), T0)

    assert drain_ids(broker) == ["e0", "e1", "e2", "e3", "e4"]


def test_dequeue__empty__returns_none_after_timeout() -> None:
    broker = enabled_broker()
    got: list[tuple[Evaluation, str] | None] = []
    done = threading.Event()

    def worker() -> None:
        got.append(broker.dequeue(T0, timeout=0.01))
        done.set()

    threading.Thread(target=worker, daemon=True).start()

    assert done.wait(timeout=WAKE_DEADLINE_S), "a dequeue with a 10 ms timeout never returned"
    assert got == [None]


def test_dequeue__blocked_worker__wakes_on_enqueue() -> None:
    broker = enabled_broker()
    got: list[tuple[Evaluation, str] | None] = []
    done = threading.Event()

    def worker() -> None:
        # Far longer than the wait below: only the enqueue can end it in time.
        got.append(broker.dequeue(T0, timeout=NEVER_S))
        done.set()

    thread = threading.Thread(target=worker, daemon=True)
    thread.start()
    broker.enqueue(ev("e1"), T0)

    assert done.wait(timeout=WAKE_DEADLINE_S), "the waiting dequeue was not woken by enqueue"
    thread.join(timeout=5)
    assert got[0] is not None and got[0][0].id == "e1"


def test_dequeue__issues_fresh_token_per_delivery_and_counts_deliveries() -> None:
    broker = enabled_broker(initial_nack_delay_ns=0)
    broker.enqueue(ev("e1"), T0)

    _, first = take(broker)
    broker.nack("e1", first, T0)
    broker.tick(T0)
    _, second = take(broker)

    assert first != second
    assert broker.deliveries("e1") == 2


def test_evals_without_job__are_not_serialized() -> None:
    broker = enabled_broker()
    broker.enqueue(ev("core-1", job=""), T0)
    broker.enqueue(ev("core-2", job=""), T0)

    assert sorted(drain_ids(broker)) == ["core-1", "core-2"]


# ---------------------------------------------------------------------------------------
# One outstanding eval per job


def test_one_outstanding_per_job__second_eval_waits_until_ack() -> None:
    broker = web_queue(2)

    first, token = take(broker)
    assert first.id == "a1"
    assert nothing_ready(broker), "a2 must wait while a1 is with a worker"
    assert broker.stats() == replace(EMPTY, unacked=1, waiting=1)

    assert broker.ack("a1", token) == []
    second, _ = take(broker)
    assert second.id == "a2"


def test_one_outstanding_per_job__waits_while_first_is_ready_too() -> None:
    broker = web_queue(2)

    assert broker.stats() == replace(EMPTY, ready=1, waiting=1)
    assert drain_ids(broker) == ["a1"]


def test_one_outstanding_per_job__other_jobs_are_independent() -> None:
    broker = web_queue(2)
    broker.enqueue(ev("b1", "db", create_index=3), T0)

    assert drain_ids(broker) == ["a1", "b1"]


def test_one_outstanding_per_job__same_job_id_in_other_namespace_is_another_job() -> None:
    broker = enabled_broker()
    broker.enqueue(ev("a1", "web", create_index=1), T0)
    broker.enqueue(ev("a2", "web", create_index=2, namespace="prod"), T0)

    assert drain_ids(broker) == ["a1", "a2"]


def test_ack__only_newest_waiting_survives__others_returned_for_cancellation() -> None:
    broker, token = one_taken("a1")
    # Arrival order differs from age order on purpose.
    for eval_id, index in [("a4", 4), ("a2", 2), ("a5", 5), ("a3", 3)]:
        broker.enqueue(ev(eval_id, "web", create_index=index), T0)

    cancelled = broker.ack("a1", token)

    assert sorted(c.id for c in cancelled) == ["a2", "a3", "a4"]
    assert drain_ids(broker) == ["a5"]
    assert broker.stats() == replace(EMPTY, unacked=1)


def test_ack__cancelled_evals_are_forgotten__can_be_enqueued_again() -> None:
    broker, token = one_taken("a1")
    broker.enqueue(ev("a2", "web", create_index=2), T0)
    broker.enqueue(ev("a3", "web", create_index=3), T0)

    assert [c.id for c in broker.ack("a1", token)] == ["a2"]
    # A cancelled eval is no longer tracked: a later write of it is a new arrival.
    assert broker.enqueue(ev("a2", "web", create_index=2), T0)


# ---------------------------------------------------------------------------------------
# Tokens


def test_ack__wrong_token__raises_and_keeps_eval_outstanding() -> None:
    broker, token = one_taken()

    with pytest.raises(TokenMismatchError):
        broker.ack("e1", token + "-forged")
    with pytest.raises(TokenMismatchError):
        broker.nack("e1", token + "-forged", T0)

    assert broker.outstanding("e1", token)
    assert broker.ack("e1", token) == []


def test_ack__unknown_eval__raises() -> None:
    broker = enabled_broker()

    with pytest.raises(TokenMismatchError):
        broker.ack("nope", "1")
    with pytest.raises(TokenMismatchError):
        broker.nack("nope", "1", T0)


def test_ack__twice__second_raises() -> None:
    broker, token = one_taken()
    broker.ack("e1", token)

    assert not broker.outstanding("e1", token)
    with pytest.raises(TokenMismatchError):
        broker.ack("e1", token)


def test_ack__stale_token_after_redelivery__raises() -> None:
    broker, stale = one_taken()
    broker.nack("e1", stale, T0)
    broker.tick(T0 + INITIAL_NACK_DELAY_NS)
    _, fresh = take(broker, T0 + INITIAL_NACK_DELAY_NS)

    assert not broker.outstanding("e1", stale)
    assert broker.outstanding("e1", fresh)
    with pytest.raises(TokenMismatchError):
        broker.ack("e1", stale)
    with pytest.raises(TokenMismatchError):
        broker.nack("e1", stale, T0)
    assert broker.ack("e1", fresh) == []


def test_nack__stale_token_while_awaiting_redelivery__raises() -> None:
    broker, token = one_taken()
    broker.nack("e1", token, T0)

    with pytest.raises(TokenMismatchError):
        broker.nack("e1", token, T0)
    with pytest.raises(TokenMismatchError):
        broker.ack("e1", token)


# ---------------------------------------------------------------------------------------
# Nack and redelivery


def test_nack__redelivered_only_after_initial_delay() -> None:
    broker, token = one_taken()

    broker.nack("e1", token, T0)
    assert broker.stats() == replace(EMPTY, delayed=1)
    broker.tick(T0 + INITIAL_NACK_DELAY_NS - 1)
    assert nothing_ready(broker)

    broker.tick(T0 + INITIAL_NACK_DELAY_NS)
    again, _ = take(broker)
    assert again.id == "e1"
    assert broker.deliveries("e1") == 2


def test_nack__later_redeliveries_use_subsequent_delay() -> None:
    broker = enabled_broker(delivery_limit=10)
    broker.enqueue(ev("e1"), T0)
    _, token = take(broker)
    broker.nack("e1", token, T0)
    now = T0 + INITIAL_NACK_DELAY_NS
    broker.tick(now)
    _, token = take(broker, now)

    broker.nack("e1", token, now)
    broker.tick(now + SUBSEQUENT_NACK_DELAY_NS - 1)
    assert nothing_ready(broker)
    broker.tick(now + SUBSEQUENT_NACK_DELAY_NS)
    assert take(broker)[0].id == "e1"


def test_nack__job_slot_kept__waiting_eval_not_served_meanwhile() -> None:
    broker, token = one_taken("a1")
    broker.enqueue(ev("a2", "web", create_index=2), T0)

    broker.nack("a1", token, T0)
    assert nothing_ready(broker), "the nacked eval keeps its job's slot"
    broker.tick(T0 + INITIAL_NACK_DELAY_NS)

    assert drain_ids(broker) == ["a1"]


def test_nack__redelivery_keeps_priority_order() -> None:
    broker = enabled_broker()
    broker.enqueue(ev("hi", "j1", priority=90, create_index=5), T0)
    _, token = take(broker)
    broker.nack("hi", token, T0)
    broker.enqueue(ev("lo", "j2", priority=10, create_index=1), T0)
    broker.tick(T0 + INITIAL_NACK_DELAY_NS)

    assert drain_ids(broker) == ["hi", "lo"]


def test_tick__nack_timeout__redelivers_after_delay_and_invalidates_token() -> None:
    broker, token = one_taken()

    broker.tick(T0 + DEFAULT_NACK_TIMEOUT_NS - 1)
    assert broker.outstanding("e1", token)

    timeout = T0 + DEFAULT_NACK_TIMEOUT_NS
    broker.tick(timeout)
    assert not broker.outstanding("e1", token)
    with pytest.raises(TokenMismatchError):
        broker.ack("e1", token)
    assert nothing_ready(broker, timeout), "a timed-out eval waits the nack delay too"

    broker.tick(timeout + INITIAL_NACK_DELAY_NS)
    assert take(broker)[0].id == "e1"


def test_tick__nack_timeout_counted_from_each_delivery() -> None:
    broker = enabled_broker(nack_timeout_ns=10 * SECOND)
    broker.enqueue(ev("e1"), T0)
    later = T0 + 8 * SECOND
    _, token = take(broker, later)

    broker.tick(T0 + 10 * SECOND)
    assert broker.outstanding("e1", token), "the deadline runs from the dequeue, not the enqueue"
    broker.tick(later + 10 * SECOND)
    assert not broker.outstanding("e1", token)


# ---------------------------------------------------------------------------------------
# Delivery limit and the failed queue


def deliver_and_nack(broker: EvalBroker, eval_id: str, times: int, now: int) -> int:
    """Deliver ``eval_id`` and nack it ``times`` times; returns the time reached."""
    for _ in range(times):
        broker.tick(now)
        got, token = take(broker, now)
        assert got.id == eval_id
        broker.nack(eval_id, token, now)
        now += SUBSEQUENT_NACK_DELAY_NS
    return now


def test_delivery_limit__eval_lands_in_failed_queue() -> None:
    broker = enabled_broker()
    broker.enqueue(ev("e1"), T0)

    now = deliver_and_nack(broker, "e1", DEFAULT_DELIVERY_LIMIT, T0)
    broker.tick(now)

    assert nothing_ready(broker, now)
    assert broker.stats() == replace(EMPTY, failed=1)
    assert [e.id for e in broker.take_failed()] == ["e1"]
    assert broker.take_failed() == []
    assert broker.stats() == EMPTY


def test_delivery_limit__not_reached__still_redelivered() -> None:
    broker = enabled_broker()
    broker.enqueue(ev("e1"), T0)

    now = deliver_and_nack(broker, "e1", DEFAULT_DELIVERY_LIMIT - 1, T0)
    broker.tick(now)

    assert broker.take_failed() == []
    assert take(broker, now)[0].id == "e1"


def test_delivery_limit__via_nack_timeouts() -> None:
    broker = enabled_broker(nack_timeout_ns=5 * SECOND, delivery_limit=2, initial_nack_delay_ns=SECOND)
    broker.enqueue(ev("e1"), T0)
    take(broker, T0)
    broker.tick(T0 + 5 * SECOND)  # timeout 1
    broker.tick(T0 + 6 * SECOND)
    take(broker, T0 + 6 * SECOND)
    broker.tick(T0 + 11 * SECOND)  # timeout 2: the limit

    assert [e.id for e in broker.take_failed()] == ["e1"]


def web_evals_with_a1_failed(n: int) -> tuple[EvalBroker, int]:
    """Evals a1..an of job web queued (a1 the oldest), and a1 delivered and nacked up to the
    delivery limit: (broker, the time of the last nack). a1 must be the one failed."""
    broker = web_queue(n)
    now = deliver_and_nack(broker, "a1", DEFAULT_DELIVERY_LIMIT, T0)
    assert [e.id for e in broker.take_failed()] == ["a1"]
    return broker, now


def test_delivery_limit__job_slot_released__next_waiting_eval_served() -> None:
    broker, now = web_evals_with_a1_failed(2)
    got, token = take(broker, now)
    assert got.id == "a2"
    assert broker.ack("a2", token) == []
    assert broker.stats() == EMPTY


def test_delivery_limit__older_waiting_evals_are_not_lost() -> None:
    broker, now = web_evals_with_a1_failed(3)
    got, token = take(broker, now)
    assert got.id == "a3"
    cancelled = [c.id for c in broker.ack("a3", token)] + [c.id for c in broker.take_cancelable()]
    delivered_later = drain_ids(broker, now)

    # At least once: a2 is either handed to a worker or handed back to be cancelled.
    assert "a2" in cancelled + delivered_later


def test_delivery_limit__superseded_waiting_evals_handed_out_by_take_cancelable() -> None:
    broker = enabled_broker()
    for i in range(1, 5):
        broker.enqueue(ev(f"a{i}", "web", create_index=i), T0)

    now = deliver_and_nack(broker, "a1", DEFAULT_DELIVERY_LIMIT, T0)

    assert [e.id for e in broker.take_failed()] == ["a1"]
    assert sorted(e.id for e in broker.take_cancelable()) == ["a2", "a3"]
    assert broker.take_cancelable() == []
    assert drain_ids(broker, now) == ["a4"]


def test_delivery_limit__no_waiting_evals__nothing_cancelable() -> None:
    broker = enabled_broker()
    broker.enqueue(ev("a1", "web"), T0)

    deliver_and_nack(broker, "a1", DEFAULT_DELIVERY_LIMIT, T0)

    assert broker.take_cancelable() == []


def test_set_enabled_false__drops_cancelable() -> None:
    broker = enabled_broker()
    for i in range(1, 4):
        broker.enqueue(ev(f"a{i}", "web", create_index=i), T0)
    deliver_and_nack(broker, "a1", DEFAULT_DELIVERY_LIMIT, T0)

    broker.set_enabled(False)
    broker.set_enabled(True)

    assert broker.take_cancelable() == []
    assert broker.take_failed() == []


# ---------------------------------------------------------------------------------------
# Delays (wait_until)


def test_wait_until__held_until_tick_reaches_it() -> None:
    broker = enabled_broker()
    due = T0 + 10 * SECOND
    assert broker.enqueue(ev("e1", wait_until_ns=due), T0)

    assert nothing_ready(broker)
    assert broker.stats() == replace(EMPTY, delayed=1)
    broker.tick(due - 1)
    assert nothing_ready(broker, due - 1)
    broker.tick(due)
    assert take(broker, due)[0].id == "e1"


def test_wait_until__in_the_past__ready_at_once() -> None:
    broker = enabled_broker()
    broker.enqueue(ev("e1", wait_until_ns=T0 - 1), T0)

    assert take(broker)[0].id == "e1"


def test_wait_until__due_while_job_busy__waits_for_job_slot() -> None:
    broker, token = one_taken("a1")
    due = T0 + SECOND
    broker.enqueue(ev("a2", "web", create_index=2, wait_until_ns=due), T0)

    broker.tick(due)
    assert nothing_ready(broker, due)
    assert broker.ack("a1", token) == []
    assert take(broker, due)[0].id == "a2"


def test_wait_until__delayed_eval_does_not_hold_job_slot() -> None:
    broker = enabled_broker()
    broker.enqueue(ev("a1", "web", create_index=1, wait_until_ns=T0 + 60 * SECOND), T0)
    broker.enqueue(ev("a2", "web", create_index=2), T0)

    assert drain_ids(broker) == ["a2"]


# ---------------------------------------------------------------------------------------
# Leadership (enabled / disabled)


def test_disabled__enqueue_refused_and_calls_raise() -> None:
    broker = EvalBroker()

    assert not broker.enabled
    assert broker.enqueue(ev("e1"), T0) is False
    with pytest.raises(BrokerDisabledError):
        broker.dequeue(T0, timeout=0.01)
    with pytest.raises(BrokerDisabledError):
        broker.ack("e1", "1")
    with pytest.raises(BrokerDisabledError):
        broker.nack("e1", "1", T0)
    broker.tick(T0)  # a no-op, not an error
    assert broker.stats() == EMPTY


def test_set_enabled_false__drops_everything() -> None:
    broker = enabled_broker()
    broker.enqueue(ev("ready", "j1", create_index=1), T0)
    broker.enqueue(ev("held", "j2", create_index=2), T0)
    broker.enqueue(ev("waiting", "j2", create_index=3), T0)
    broker.enqueue(ev("delayed", "j3", create_index=4, wait_until_ns=T0 + SECOND), T0)
    broker.enqueue(ev("failing", "j4", create_index=5), T0)
    held_token = None
    for _ in range(2):
        got, token = take(broker)
        if got.id == "held":
            held_token = token
        else:
            broker.nack(got.id, token, T0)  # "ready" goes to the delay queue
    assert held_token is not None

    broker.set_enabled(False)
    assert broker.stats() == EMPTY
    assert broker.take_failed() == []

    broker.set_enabled(True)
    assert broker.stats() == EMPTY
    assert not broker.outstanding("held", held_token)
    with pytest.raises(TokenMismatchError):
        broker.ack("held", held_token)
    # Nothing is remembered: a new leader rebuilds from state, so re-enqueue is accepted.
    assert broker.enqueue(ev("held", "j2", create_index=2), T0)
    assert broker.deliveries("held") == 0


def test_set_enabled_false__wakes_blocked_dequeue_with_error() -> None:
    broker = enabled_broker()
    errors: list[BaseException] = []
    done = threading.Event()

    def worker() -> None:
        try:
            # Far longer than the wait below: only the disable can end it in time (a
            # timed-out dequeue on a disabled broker would raise the same error).
            broker.dequeue(T0, timeout=NEVER_S)
        except BaseException as exc:
            errors.append(exc)
        done.set()

    thread = threading.Thread(target=worker, daemon=True)
    thread.start()
    # Disabling before the worker waits is fine too: it then raises on its own check.
    broker.set_enabled(False)

    assert done.wait(timeout=WAKE_DEADLINE_S), "the blocked dequeue was not woken by set_enabled(False)"
    thread.join(timeout=5)
    assert len(errors) == 1 and isinstance(errors[0], BrokerDisabledError)


# ---------------------------------------------------------------------------------------
# Dedup and requeue


def test_enqueue__known_eval__ignored() -> None:
    broker = enabled_broker()

    assert broker.enqueue(ev("e1"), T0)
    assert not broker.enqueue(ev("e1"), T0)
    assert drain_ids(broker) == ["e1"]


def test_enqueue__while_nacked_and_delayed__ignored() -> None:
    broker, token = one_taken()
    broker.nack("e1", token, T0)

    assert not broker.enqueue(ev("e1"), T0)
    broker.tick(T0 + INITIAL_NACK_DELAY_NS)
    assert drain_ids(broker) == ["e1"]


def test_requeue__enqueue_of_held_eval__readmitted_after_ack() -> None:
    broker, token = one_taken()

    assert broker.enqueue(ev("e1"), T0)
    assert nothing_ready(broker), "not redelivered while the worker still holds it"

    assert broker.ack("e1", token) == []
    again, fresh = take(broker)
    assert again.id == "e1"
    assert fresh != token
    assert broker.ack("e1", fresh) == []
    assert nothing_ready(broker), "requeued once, delivered once more"


def test_requeue__readmitted_eval_respects_job_slot() -> None:
    broker, token = one_taken("a1")
    broker.enqueue(ev("a2", "web", create_index=2), T0)
    broker.enqueue(ev("a1", "web", create_index=1), T0)  # requeue

    assert broker.ack("a1", token) == []
    assert drain_ids(broker) == ["a2"], "still one eval of the job at a time"


# ---------------------------------------------------------------------------------------
# Untrack


def test_untrack__ready_eval__not_delivered() -> None:
    broker = enabled_broker()
    broker.enqueue(ev("e1", "j1", create_index=1), T0)
    broker.enqueue(ev("e2", "j2", create_index=2), T0)

    broker.untrack("e1")

    assert drain_ids(broker) == ["e2"]


def test_untrack__job_slot_holder__next_waiting_admitted() -> None:
    broker = web_queue(3)

    broker.untrack("a1")
    got, token = take(broker)

    assert got.id == "a3"
    assert nothing_ready(broker)
    assert [c.id for c in broker.ack("a3", token)] == []
    assert drain_ids(broker) == ["a2"]


def test_untrack__waiting_eval__dropped() -> None:
    broker, token = one_taken("a1")
    broker.enqueue(ev("a2", "web", create_index=2), T0)

    broker.untrack("a2")

    assert broker.ack("a1", token) == []
    assert nothing_ready(broker)
    assert broker.stats() == EMPTY


def test_untrack__delayed_eval__dropped() -> None:
    broker = enabled_broker()
    due = T0 + SECOND
    broker.enqueue(ev("e1", wait_until_ns=due), T0)

    broker.untrack("e1")
    broker.tick(due)

    assert nothing_ready(broker, due)
    assert broker.stats() == EMPTY


def test_untrack__held_eval__ignored__ack_still_works() -> None:
    broker, token = one_taken()

    broker.untrack("e1")

    assert broker.outstanding("e1", token)
    assert broker.ack("e1", token) == []


def test_untrack__held_eval_with_pending_requeue__not_redelivered_after_ack() -> None:
    broker, token = one_taken()
    broker.enqueue(ev("e1"), T0)  # e.g. a leader rescan re-enqueues every pending eval
    broker.untrack("e1")  # the worker wrote it complete before acking

    broker.ack("e1", token)

    assert nothing_ready(broker), "a terminal eval was delivered again"


def test_untrack__unknown_eval__no_op() -> None:
    broker = enabled_broker()
    broker.enqueue(ev("e1"), T0)

    broker.untrack("nope")

    assert drain_ids(broker) == ["e1"]


# ---------------------------------------------------------------------------------------
# The at-least-once model

JOBS = ("a", "b", "c")
NACK_TIMEOUT = 10
INITIAL_DELAY = 2
SUBSEQUENT_DELAY = 5


class BrokerModel(RuleBasedStateMachine):
    """Workers that ack, nack, stall (nack timeout) and re-enqueue, against a plain model.

    Model: ``pending`` evals are owed a resolution. An eval is resolved exactly once, by an
    ack (unless it was re-enqueued while held: then it is owed again), by being returned
    from an ack for cancellation, or by ``take_failed``. ``held`` is what the test's
    workers believe they hold; the broker may have timed a delivery out meanwhile.
    """

    delivery_limit = 1_000  # the failed path is exercised by BrokerModelWithFailures

    @initialize()
    def start(self) -> None:
        self.broker = EvalBroker(
            nack_timeout_ns=NACK_TIMEOUT,
            delivery_limit=self.delivery_limit,
            initial_nack_delay_ns=INITIAL_DELAY,
            subsequent_nack_delay_ns=SUBSEQUENT_DELAY,
        )
        self.broker.set_enabled(True)
        self.now = 0
        self.next_id = 0
        self.evals: dict[str, Evaluation] = {}
        self.pending: set[str] = set()
        self.requeued: set[str] = set()
        self.held: dict[str, str] = {}
        self.resolved: dict[str, str] = {}

    # -- helpers -----------------------------------------------------------------------
    def _resolve(self, eval_id: str, how: str) -> None:
        assert eval_id in self.pending, (
            f"{eval_id} resolved ({how}) but was not owed ({self.resolved.get(eval_id)})"
        )
        self.pending.discard(eval_id)
        self.resolved[eval_id] = how

    def _live_held(self) -> dict[str, str]:
        return {i: t for i, t in self.held.items() if self.broker.outstanding(i, t)}

    def _collect_failed(self) -> None:
        for failed in self.broker.take_failed():
            self.requeued.discard(failed.id)
            self._resolve(failed.id, "failed")
        for cancelled in self.broker.take_cancelable():
            self._resolve(cancelled.id, "cancelled")

    def _ack(self, eval_id: str) -> None:
        token = self.held.pop(eval_id)
        if not self.broker.outstanding(eval_id, token):
            with pytest.raises(TokenMismatchError):
                self.broker.ack(eval_id, token)
            return
        job = self.evals[eval_id].job_id
        cancelled = self.broker.ack(eval_id, token)
        if eval_id in self.requeued:
            self.requeued.discard(eval_id)  # owed again: re-admitted by the ack
        else:
            self._resolve(eval_id, "acked")
        for c in cancelled:
            assert c.job_id == job, "an ack only cancels evals of its own job"
            assert c.id not in self._live_held()
            self._resolve(c.id, "cancelled")

    def _dequeue(self) -> bool:
        item = self.broker.dequeue(self.now, timeout=0)
        if item is None:
            return False
        got, token = item
        assert got.id in self.pending, f"{got.id} delivered after being {self.resolved.get(got.id)}"
        self.held[got.id] = token
        return True

    # -- rules -------------------------------------------------------------------------
    @rule(
        job=st.sampled_from(JOBS),
        priority=st.sampled_from((10, 50, 90)),
        wait=st.sampled_from((0, 0, 0, 3, 12)),
    )
    def enqueue(self, job: str, priority: int, wait: int) -> None:
        self.next_id += 1
        new = ev(
            f"e{self.next_id}",
            job,
            priority=priority,
            create_index=self.next_id,
            wait_until_ns=self.now + wait if wait else 0,
        )
        assert self.broker.enqueue(new, self.now)
        self.evals[new.id] = new
        self.pending.add(new.id)

    @rule()
    def dequeue(self) -> None:
        self._dequeue()

    @precondition(lambda self: bool(self.held))
    @rule(data=st.data())
    def ack(self, data: st.DataObject) -> None:
        self._ack(data.draw(st.sampled_from(sorted(self.held))))

    @precondition(lambda self: bool(self.held))
    @rule(data=st.data())
    def nack(self, data: st.DataObject) -> None:
        eval_id = data.draw(st.sampled_from(sorted(self.held)))
        token = self.held.pop(eval_id)
        if self.broker.outstanding(eval_id, token):
            self.broker.nack(eval_id, token, self.now)
        else:
            with pytest.raises(TokenMismatchError):
                self.broker.nack(eval_id, token, self.now)

    @precondition(lambda self: bool(self._live_held()))
    @rule(data=st.data())
    def requeue_held(self, data: st.DataObject) -> None:
        eval_id = data.draw(st.sampled_from(sorted(self._live_held())))
        assert self.broker.enqueue(self.evals[eval_id], self.now)
        self.requeued.add(eval_id)

    @rule(delta=st.sampled_from((1, 2, 5, 10, 30)))
    def tick(self, delta: int) -> None:
        self.now += delta
        self.broker.tick(self.now)
        self._collect_failed()

    # -- invariants --------------------------------------------------------------------
    @invariant()
    def one_outstanding_eval_per_job(self) -> None:
        jobs = [self.evals[i].job_id for i in self._live_held()]
        assert len(jobs) == len(set(jobs)), f"two evals of one job with workers: {self._live_held()}"

    @invariant()
    def broker_holds_what_workers_hold(self) -> None:
        assert self.broker.stats().unacked == len(self._live_held())

    def teardown(self) -> None:
        """Process everything, moving time on, then every eval must be resolved."""
        if not hasattr(self, "broker"):
            return
        for _ in range(1_000):
            for eval_id in sorted(self.held):
                self._ack(eval_id)
            self.now += SUBSEQUENT_DELAY + NACK_TIMEOUT
            self.broker.tick(self.now)
            self._collect_failed()
            while self._dequeue():
                pass
            if not self.held and self.broker.stats() == EMPTY:
                break
        assert not self.pending, f"never acked, cancelled or failed: {sorted(self.pending)}"
        assert not self.requeued


MODEL_SETTINGS = settings(
    max_examples=200,
    stateful_step_count=40,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)

TestBrokerAtLeastOnce = BrokerModel.TestCase
TestBrokerAtLeastOnce.settings = MODEL_SETTINGS


class BrokerModelWithFailures(BrokerModel):
    """Evals hit the delivery limit: failed ones and the superseded evals of their job
    (``take_cancelable``) must still be accounted for."""

    delivery_limit = 2


TestBrokerAtLeastOnceWithFailures = BrokerModelWithFailures.TestCase
TestBrokerAtLeastOnceWithFailures.settings = MODEL_SETTINGS
