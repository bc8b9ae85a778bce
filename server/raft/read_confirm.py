"""Reads a deposed leader cannot answer: a leader confirms it still leads before a read.

Theory of operation. A leader cut off from the others (a partition, a long pause) still
believes it leads until its own fallback timeout, while the others elect a new leader and
commit writes; a read it answered from its own state meanwhile would miss acknowledged
writes. Raft's answer (the ReadIndex round, Ongaro's thesis 6.4): before answering, the
leader hears from a majority that they still accept its term, in an exchange that started
after the read arrived.

pysyncobj has no such exchange, and no lease is safe with it: its followers vote for any
candidate of a higher term, whenever it asks (no leader stickiness), and drover's
leader-lost patch has them ask 0.1 s after the leader's socket closes. So this module adds
one message pair, carried by pysyncobj's own transport (patches.py, the message hook):

- a reader takes a sequence number (``request``) and nudges the leader to send appends now;
- the tick thread, right after each append_entries it sends to a follower while some
  request is unanswered by that follower, sends ``{"type": PROBE, "term", "seq"}``, the
  newest sequence number (``probe_for``);
- a follower answers ``{"type": ACK, "term", "seq"}`` only if the probe's term is its own
  current term (``answer_probe``): after the append before it on the same connection,
  that is true unless it has moved to a later term, i.e. unless another leader may exist;
- the reader's read is confirmed when the leader itself plus acks of its term carrying a
  sequence number at least its own make a majority (``wait``), and it still leads in the
  term it started in.

Why that is enough: an ack of seq >= s was sent for a probe built after request s, so after
the read arrived. A leader of a later term needs the votes of a majority, each of which
then has a term past ours and acks nothing more of ours; two majorities share a member, so
when the read is confirmed no later leader can have been elected before the read arrived,
and every write acknowledged before it is in this leader's state (a leader applies its own
writes before acknowledging them, and had applied every earlier term's at its no-op).

Threads: readers call ``request`` and ``wait`` (a thread) or ``wait_async`` (a coroutine
on the API's event loop, so that a read waiting for its round holds no pool thread: the
pool is the handlers' only capacity, server/api/_aio.py); pysyncobj's tick thread calls
``probe_for`` and ``on_ack``. One condition variable guards it all; an ack wakes the
coroutines with one callback per event loop, however many wait there.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

from drover.server.loop_wakers import LoopWakers, woken_within

__all__ = ["ACK", "PROBE", "ReadConfirmations", "answer_probe", "quorum"]

PROBE: Final = "drover_read_probe"
ACK: Final = "drover_read_ack"


def quorum(voters: int) -> int:
    """How many of ``voters`` make a majority."""
    return voters // 2 + 1


def answer_probe(message: Mapping[str, Any], current_term: int) -> dict[str, Any] | None:
    """A follower's answer to a probe: an ack only while the probe's term is its own."""
    term, seq = message.get("term"), message.get("seq")
    if not isinstance(term, int) or not isinstance(seq, int) or term != current_term:
        return None
    return {"type": ACK, "term": term, "seq": seq}


class ReadConfirmations:
    def __init__(self, recheck_s: float = 0.05) -> None:
        # A waiting reader looks again at least this often while no ack comes, so a lost
        # leadership is seen; the tests raise it to prove that an ack is what wakes them.
        self._recheck_s = recheck_s
        self._cond = threading.Condition()
        self._requested = 0
        # Follower (raft address) -> the newest (term, seq) it acked.
        self._acked: dict[str, tuple[int, int]] = {}
        # The coroutines waiting, by the loop they wait on: each ack sets their events.
        self._async_waiters = LoopWakers()

    # -- readers -----------------------------------------------------------------------
    def request(self) -> int:
        with self._cond:
            self._requested += 1
            return self._requested

    def confirmed(self, seq: int, term: int, followers: Sequence[str]) -> bool:
        with self._cond:
            return self._confirmed_locked(seq, term, followers)

    def _confirmed_locked(self, seq: int, term: int, followers: Sequence[str]) -> bool:
        acks = 0
        for follower in followers:
            acked_term, acked_seq = self._acked.get(follower, (0, 0))
            if acked_term == term and acked_seq >= seq:
                acks += 1
        return 1 + acks >= quorum(1 + len(followers))

    def wait(
        self,
        seq: int,
        term: int,
        followers: Sequence[str],
        timeout: float,
        still_leading: Callable[[], bool],
    ) -> bool:
        """Whether a majority confirmed ``term`` for ``seq`` within ``timeout`` while
        ``still_leading()`` held."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                verdict, pause = self._step_locked(
                    seq, term, followers, still_leading, deadline - time.monotonic()
                )
                if verdict is not None:
                    return verdict
                self._cond.wait(pause)

    def _step_locked(
        self, seq: int, term: int, followers: Sequence[str], still_leading: Callable[[], bool], left: float
    ) -> tuple[bool | None, float]:
        """One look of a waiting reader: its answer (None: not yet), and how long to wait
        for an ack before looking again (a slice, so lost leadership is seen while none
        comes)."""
        if not still_leading():
            return False, 0.0
        if self._confirmed_locked(seq, term, followers):
            return still_leading(), 0.0
        if left <= 0:
            return False, 0.0
        return None, min(left, self._recheck_s)

    async def wait_async(
        self,
        seq: int,
        term: int,
        followers: Sequence[str],
        timeout: float,
        still_leading: Callable[[], bool],
    ) -> bool:
        """``wait``, as a coroutine: the same answer, with no thread held meanwhile."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        with self._async_waiters.waiting(self._cond) as woken:
            while True:
                # Cleared before the check: an ack landing after it sets the event again.
                woken.clear()
                with self._cond:
                    verdict, pause = self._step_locked(
                        seq, term, followers, still_leading, deadline - loop.time()
                    )
                if verdict is not None:
                    return verdict
                await woken_within(woken, pause)

    # -- the tick thread ---------------------------------------------------------------
    def probe_for(self, follower: str, term: int) -> dict[str, Any] | None:
        """The probe to send ``follower`` after an append of ``term``, or None if it has
        acked every request so far."""
        with self._cond:
            acked = self._acked.get(follower)
            if self._requested == 0 or (acked is not None and acked >= (term, self._requested)):
                return None
            return {"type": PROBE, "term": term, "seq": self._requested}

    def on_ack(self, follower: str, message: Mapping[str, Any]) -> None:
        term, seq = message.get("term"), message.get("seq")
        if not isinstance(term, int) or not isinstance(seq, int):
            return
        with self._cond:
            if self._acked.get(follower, (0, 0)) >= (term, seq):
                return
            self._acked[follower] = (term, seq)
            self._cond.notify_all()
            self._async_waiters.wake_all()
