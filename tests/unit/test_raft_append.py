"""plan_append against a model of pysyncobj's follower handler (pure logic, no processes).

The model follows pysyncobj 0.3.17's append_entries branch line by line (reset replies,
truncate-after-prevLogIdx, append, reply with the last new index) and runs it on the plan
that drover.server.raft.patches hands it. Logs are generated to satisfy Raft's Log Matching property: a
follower shares a prefix with the leader and may carry a stale tail from a term the leader
never had.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from drover.server.raft.append import Entry, plan_append

Log = list[int]  # terms; index i (1-based) is Log[i - 1]


@dataclass
class Reply:
    next_index: int
    success: bool
    reset: bool


def _entries(log: Log, start: int, stop: int) -> list[Entry]:
    return [(b"", i, log[i - 1]) for i in range(start, stop + 1)]


def handle(
    leader: Log, follower: Log, floor: int, prev: int, sent: list[Entry]
) -> tuple[Log, list[Reply], bool]:
    """One message through plan_append and the pysyncobj model; returns the new log, the
    replies in order, and whether pysyncobj would have logged the applied-truncation alarm."""
    plan = plan_append(
        prev_index=prev,
        prev_term=0 if prev == 0 else leader[prev - 1],
        entries=sent,
        first_index=1,
        last_index=len(follower),
        term_at=lambda i: follower[i - 1],
        applied_floor=floor,
    )
    log = list(follower)
    if plan.delete_from is not None:
        assert plan.delete_from > floor
        del log[plan.delete_from - 1 :]
    replies: list[Reply] = []
    alarm = False
    if plan.prev_index < 1 or plan.prev_index > len(log):
        replies.append(Reply(len(log) + 1, False, True))
    elif log[plan.prev_index - 1] != plan.prev_term:
        replies.append(Reply(plan.prev_index, False, True))
    else:
        if len(log) > plan.prev_index and not plan.keep_tail:
            alarm = plan.prev_index + 1 <= floor
            del log[plan.prev_index :]
        log.extend(term for _c, _i, term in plan.entries)
        last_new = plan.entries[-1][1] if plan.entries else plan.prev_index
        replies.append(Reply(last_new + 1, True, False))
    if plan.hint is not None:
        replies.append(Reply(plan.hint, False, True))
    return log, replies, alarm


@st.composite
def cluster_logs(draw: st.DrawFn) -> tuple[Log, Log, int]:
    """(leader, follower, follower's applied floor) obeying Log Matching."""
    steps = draw(st.lists(st.integers(0, 2), min_size=1, max_size=40))
    leader: Log = []
    term = 2
    for step in steps:
        term += 2 * step  # leader terms are even
        leader.append(term)
    common = draw(st.integers(1, len(leader)))
    stale_len = draw(st.integers(0, 30))
    stale_term = leader[common - 1] + 1  # odd: a term the leader never had
    follower = leader[:common] + [stale_term] * stale_len
    if common < len(leader) and stale_len:
        # Terms only grow along a log; a stale tail comes from an older term than the
        # leader's next entry, so it can never match it.
        assert stale_term != leader[common]
    # Every leader starts its term with a no-op entry, newer than any term a follower holds.
    leader.append(max(leader[-1], stale_term) // 2 * 2 + 2)
    floor = draw(st.integers(0, common))
    return leader, follower, floor


@settings(max_examples=400, deadline=None)
@given(cluster_logs(), st.data())
def test_one_message_keeps_every_matching_entry_and_places_what_it_carries(logs, data):
    leader, follower, floor = logs
    prev = data.draw(st.integers(0, len(leader)), label="prev")
    count = data.draw(st.integers(0, len(leader) - prev), label="count")
    sent = _entries(leader, prev + 1, prev + count)
    after, replies, alarm = handle(leader, follower, floor, prev, sent)

    assert not alarm, "a consistent message truncated applied entries"
    # Raft: entries matching the leader's are never deleted.
    for index, term in enumerate(follower, start=1):
        if index <= len(leader) and leader[index - 1] == term:
            assert len(after) >= index and after[index - 1] == term
    if replies[0].success:
        last_new = prev + count
        assert after[:last_new] == leader[:last_new]
        assert replies[0].next_index == last_new + 1


@settings(max_examples=300, deadline=None)
@given(cluster_logs(), st.integers(1, 8))
def test_leader_brings_a_stale_follower_level_quickly(logs, batch):
    """A deposed leader's stale tail is dropped in a couple of round trips, not one per entry."""
    leader, follower, floor = logs
    next_index = len(leader) + 1
    log = follower
    rounds = 0
    budget = 4 + (len(leader) + batch - 1) // batch + len({*leader})
    while log != leader:
        rounds += 1
        assert rounds <= budget, f"still behind after {rounds} round trips: {log} vs {leader}"
        prev = next_index - 1
        sent = _entries(leader, next_index, min(len(leader), prev + batch))
        log, replies, alarm = handle(leader, log, floor, prev, sent)
        assert not alarm
        for reply in replies:
            if reply.reset or reply.success:
                next_index = reply.next_index


def test_a_repeated_message_over_applied_entries_changes_nothing():
    """The chaos failure: a paused follower drains an old batch it has long applied."""
    leader = [2] * 50 + [4] * 50
    follower = list(leader)
    after, replies, alarm = handle(leader, follower, 90, 20, _entries(leader, 21, 40))
    assert (after, alarm) == (follower, False)
    assert replies == [Reply(41, True, False)]


def test_a_conflicting_tail_is_dropped_and_the_leader_sent_to_its_start():
    leader = [2] * 10 + [4] * 10
    follower = [2] * 10 + [3] * 25
    after, replies, alarm = handle(leader, follower, 8, 20, [])
    assert after == [2] * 10 + [3] * 9
    assert replies == [Reply(20, False, True), Reply(11, False, True)]
    assert not alarm


def test_a_divergence_below_the_applied_floor_is_left_for_pysyncobj_to_report():
    follower = [2] * 5 + [3] * 5  # impossible in Raft: applied entries 6..9 differ
    plan = plan_append(
        prev_index=8,
        prev_term=2,
        entries=[],
        first_index=1,
        last_index=10,
        term_at=lambda i: follower[i - 1],
        applied_floor=9,
    )
    assert plan.delete_from is None and plan.hint is None


def test_followers_elect_in_address_order_after_the_leader_socket_closes():
    from drover.server.raft.patches import leader_lost_delay
    from drover.server.raft.tuning import RaftTuning

    tuning = RaftTuning()
    members = ["127.0.0.1:7003", "127.0.0.1:7001", "127.0.0.1:7002", "127.0.0.1:7005", "127.0.0.1:7004"]
    lost = "127.0.0.1:7002"
    delays = {m: leader_lost_delay(m, members, lost, tuning, 0.99) for m in members if m != lost}
    order = sorted(delays, key=delays.__getitem__)
    assert order == ["127.0.0.1:7001", "127.0.0.1:7003", "127.0.0.1:7004", "127.0.0.1:7005"]
    # Even with the most jitter, each one starts a full step minus jitter after the previous.
    gaps = [delays[b] - delays[a] for a, b in itertools.pairwise(order)]
    assert min(gaps) >= tuning.leader_lost_step_s - tuning.leader_lost_jitter_s
    assert delays[order[0]] < tuning.raft_min_timeout / 2
