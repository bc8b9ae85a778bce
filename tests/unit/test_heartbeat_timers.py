"""The leader's heartbeat timers (server/heartbeat.py), alone and as the node endpoints arm
them (server/endpoints.py), on a real FSM with a raft stand-in whose commit takes as long
as the test says, against a hand-moved clock: a node whose Register waits for its commit
is not judged meanwhile, and its new timer counts from the commit."""

from __future__ import annotations

import random
from collections.abc import Callable
from types import SimpleNamespace

from drover.server.endpoints import Endpoints
from drover.server.fsm import ApplyResult
from drover.server.heartbeat import SECOND, HeartbeatConfig, HeartbeatTimers
from tests.fixtures import mock
from tests.fixtures.fsm_log import FsmLog

CONFIG = HeartbeatConfig(min_ttl_ns=10 * SECOND, max_per_second=50.0, grace_ns=10 * SECOND)


def _timers() -> HeartbeatTimers:
    timers = HeartbeatTimers(CONFIG, random.Random(7))
    timers.set_enabled(True)
    return timers


def _runs_out_at(timers: HeartbeatTimers, node_id: str, at_ns: int) -> bool:
    """Whether ``node_id``'s timer runs out exactly at ``at_ns`` (then it is removed)."""
    return node_id not in timers.expired(at_ns - 1) and node_id in timers.expired(at_ns)


def test_heard_from__pushes_a_tracked_timer_to_a_base_ttl_and_grace__never_back() -> None:
    timers = _timers()
    ttl = timers.reset("n1", 0)
    assert 10 * SECOND <= ttl < 20 * SECOND
    late = ttl + 5 * SECOND  # past the TTL, within the grace
    timers.heard_from("n1", late)
    assert timers.expired(ttl + CONFIG.grace_ns) == []
    assert _runs_out_at(timers, "n1", late + 10 * SECOND + CONFIG.grace_ns)

    far = timers.reset("n2", 100 * SECOND) + 100 * SECOND + CONFIG.grace_ns
    timers.heard_from("n2", 100 * SECOND)  # sooner than what it was told: kept
    assert _runs_out_at(timers, "n2", far)


def test_heard_from__an_untracked_node_gets_no_timer() -> None:
    timers = _timers()
    timers.heard_from("new", 0)
    assert timers.tracked() == 0


class _SlowRaft:
    """Applies every entry to the FSM, after ``during`` ran and the clock moved ``commit_ns``."""

    def __init__(self, log: FsmLog, clock: SimpleNamespace) -> None:
        self.log, self.clock = log, clock
        self.commit_ns = 0
        self.during: Callable[[], None] = lambda: None

    def propose(self, data: bytes, timeout: float) -> ApplyResult:
        self.clock.now += self.commit_ns
        self.during()
        return self.log.apply(data)

    def leader_address(self) -> str:
        return "127.0.0.1:4647"


def test_register_waiting_for_its_commit__is_not_judged_meanwhile__and_is_armed_from_the_commit() -> None:
    log = FsmLog()
    clock = SimpleNamespace(now=0)
    clock.now_ns = lambda: clock.now
    raft = _SlowRaft(log, clock)
    timers = _timers()
    endpoints = Endpoints(raft, log.store, clock, mock.Counter("id"), heartbeats=timers)  # type: ignore[arg-type]
    node = mock.node(id="n1", secret_id="n1-secret", secret_hash="")
    _, _, first_ttl = endpoints.register_node(node)

    # It registers again just before its timer runs out, and the commit takes 15 s: the
    # reaper looking meanwhile must not judge it (it is talking to us).
    clock.now = first_ttl + CONFIG.grace_ns - SECOND
    raft.commit_ns = 15 * SECOND
    judged: list[list[str]] = []
    raft.during = lambda: judged.append(timers.expired(clock.now))
    _, _, ttl = endpoints.register_node(node)
    assert judged == [[]]
    committed_at = clock.now
    # Its new timer counts from the commit, when it heard its TTL.
    assert _runs_out_at(timers, "n1", committed_at + ttl + CONFIG.grace_ns)
