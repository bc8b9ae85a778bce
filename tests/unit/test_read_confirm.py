"""server/raft/read_confirm.py: a read is confirmed only by a majority of acks of this term,
for probes sent after the read asked (no pysyncobj here: the bookkeeping alone)."""

from __future__ import annotations

import asyncio
import threading

from drover.server.raft.read_confirm import ACK, PROBE, ReadConfirmations, answer_probe, quorum

FOLLOWERS = ["b:1", "c:1"]
TERM = 7


def test_quorum__majorities() -> None:
    assert [quorum(n) for n in (1, 2, 3, 4, 5)] == [1, 2, 2, 3, 3]


def test_probe__only_while_a_request_is_unanswered() -> None:
    reads = ReadConfirmations()
    assert reads.probe_for("b:1", TERM) is None
    seq = reads.request()
    assert reads.probe_for("b:1", TERM) == {"type": PROBE, "term": TERM, "seq": seq}
    reads.on_ack("b:1", {"type": ACK, "term": TERM, "seq": seq})
    assert reads.probe_for("b:1", TERM) is None
    assert reads.probe_for("c:1", TERM) is not None


def test_confirmed__one_ack_of_two_followers_is_a_majority_with_the_leader() -> None:
    reads = ReadConfirmations()
    seq = reads.request()
    assert not reads.confirmed(seq, TERM, FOLLOWERS)
    reads.on_ack("c:1", {"term": TERM, "seq": seq})
    assert reads.confirmed(seq, TERM, FOLLOWERS)


def test_confirmed__ack_of_an_earlier_request_does_not_confirm_a_later_read() -> None:
    reads = ReadConfirmations()
    first = reads.request()
    reads.on_ack("b:1", {"term": TERM, "seq": first})
    later = reads.request()
    assert not reads.confirmed(later, TERM, FOLLOWERS)


def test_confirmed__ack_of_another_term_does_not_count() -> None:
    reads = ReadConfirmations()
    seq = reads.request()
    reads.on_ack("b:1", {"term": TERM - 1, "seq": seq})
    reads.on_ack("c:1", {"term": TERM + 1, "seq": seq})
    assert not reads.confirmed(seq, TERM, FOLLOWERS)


def test_confirmed__five_servers_need_two_acks() -> None:
    reads = ReadConfirmations()
    seq = reads.request()
    followers = ["b", "c", "d", "e"]
    reads.on_ack("b", {"term": TERM, "seq": seq})
    assert not reads.confirmed(seq, TERM, followers)
    reads.on_ack("d", {"term": TERM, "seq": seq + 3})
    assert reads.confirmed(seq, TERM, followers)


def test_answer_probe__acks_only_its_own_term() -> None:
    probe = {"type": PROBE, "term": TERM, "seq": 4}
    assert answer_probe(probe, TERM) == {"type": ACK, "term": TERM, "seq": 4}
    assert answer_probe(probe, TERM + 1) is None  # it has moved on: another leader may exist
    assert answer_probe({"type": PROBE, "term": "x", "seq": 4}, TERM) is None


def test_wait__returns_when_acked_and_fails_when_leadership_is_lost_or_time_runs_out() -> None:
    reads = ReadConfirmations()
    seq = reads.request()
    timer = threading.Timer(0.05, reads.on_ack, ("b:1", {"term": TERM, "seq": seq}))
    timer.start()
    assert reads.wait(seq, TERM, FOLLOWERS, 5.0, lambda: True)
    timer.join()
    later = reads.request()
    assert not reads.wait(later, TERM, FOLLOWERS, 0.1, lambda: True)
    reads.on_ack("b:1", {"term": TERM, "seq": later})
    assert not reads.wait(later, TERM, FOLLOWERS, 5.0, lambda: False)


def test_wait_async__woken_by_an_ack_from_the_tick_thread_and_fails_as_wait_does() -> None:
    """The coroutine form gives ``wait``'s answers: an ack from another thread (the tick
    thread) confirms it, no ack or lost leadership does not, and no waiter is left behind."""
    reads = ReadConfirmations()

    async def scenario() -> tuple[bool, bool, bool]:
        seq = reads.request()
        timer = threading.Timer(0.05, reads.on_ack, ("b:1", {"term": TERM, "seq": seq}))
        timer.start()
        acked = await reads.wait_async(seq, TERM, FOLLOWERS, 5.0, lambda: True)
        timer.join()
        later = reads.request()
        unacked = await reads.wait_async(later, TERM, FOLLOWERS, 0.1, lambda: True)
        reads.on_ack("b:1", {"term": TERM, "seq": later})
        deposed = await reads.wait_async(later, TERM, FOLLOWERS, 5.0, lambda: False)
        return acked, unacked, deposed

    acked, unacked, deposed = asyncio.run(scenario())
    assert acked and not unacked and not deposed
    assert len(reads._async_waiters) == 0


def test_wait_async__many_waiters_one_ack_wakes_them_all() -> None:
    # No recheck before the waiters' timeout (60 s): only the ack's wake can end their wait
    # within the test's deadline (10 s).
    reads = ReadConfirmations(recheck_s=60.0)

    async def scenario() -> list[bool]:
        seqs = [reads.request() for _ in range(50)]
        waits = [
            asyncio.ensure_future(reads.wait_async(s, TERM, FOLLOWERS, 60.0, lambda: True)) for s in seqs
        ]
        await asyncio.sleep(0)
        threading.Thread(target=reads.on_ack, args=("c:1", {"term": TERM, "seq": seqs[-1]})).start()
        return list(await asyncio.wait_for(asyncio.gather(*waits), 10.0))

    assert asyncio.run(scenario()) == [True] * 50
    assert len(reads._async_waiters) == 0
