"""One raft member: pysyncobj's ``SyncObj`` with drover's one replicated method.

Everything a server does with raft goes through ``RaftNode``: ``propose`` (wait for the
commit) and ``submit`` (a future of it), both group-committed (server/write_batch.py:
writes that arrive together share one entry), ``propose_async`` (the plan applier's
pipeline, one entry per plan), and the status reads. It wires
the tuned configuration (tuning.py), the snapshot writer (snapshot_writer.py) and the
patches (patches.py, where every private pysyncobj name lives) together.

pysyncobj's transport unpickles what a peer sends, so every node is keyed (``password``,
the cluster key, or a random one for a server without peers: ``drover.server.core``): a
frame not sealed with the key fails its seal's check (AES-GCM's tag, or Fernet's HMAC for a
peer of an older release: seal.py) before anything is unpickled.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Final

from pysyncobj import SyncObj, replicated
from pysyncobj.config import FAIL_REASON

from drover.server.datadir import narrow_files, private_dir
from drover.server.errors import (
    CommitTimeoutError,
    MembershipBusyError,
    NoLeaderError,
    NotLeaderError,
    RaftError,
    ValidationError,
)
from drover.server.fsm import FSM, ApplyResult
from drover.server.inline import await_inline, in_inline
from drover.server.raft import patches
from drover.server.raft.journal import JOURNAL_FILE, SNAPSHOT_FILE
from drover.server.raft.read_confirm import ReadConfirmations
from drover.server.raft.snapshot_writer import SnapshotWriter
from drover.server.raft.tuning import RaftTuning, tuned_conf
from drover.server.telemetry.metrics import FSM_APPLY_SECONDS, RAFT_COMMIT_SECONDS, entry_type_label
from drover.server.write_batch import Done, WriteBatcher

__all__ = ["RaftNode"]


@dataclass(frozen=True, slots=True)
class _ReadRound:
    """One read's confirmation round (server/raft/read_confirm.py): its sequence number,
    the term it must be confirmed in, the followers asked, and whether we still lead."""

    seq: int
    term: int
    followers: list[str]
    leading: Callable[[], bool]

    def unconfirmed(self, timeout: float) -> NoLeaderError:
        return NoLeaderError(
            f"leadership of term {self.term} not confirmed by a majority within {timeout:.1f}s"
        )


class RaftNode(SyncObj):  # type: ignore[misc]
    """One raft member whose only replicated method applies a drover ``LogEntry``."""

    def __init__(
        self,
        self_address: str,
        peers: list[str],
        fsm: FSM,
        data_dir: str,
        *,
        password: str,
        tuning: RaftTuning | None = None,
        on_state_changed: Callable[[bool], None] | None = None,
    ) -> None:
        patches.check_version()
        tuning = tuning or RaftTuning()
        # Before SyncObj.__init__: its transport opens connections right away.
        patches.install_frame_guard(tuning.frame_limit_bytes())
        patches.install_durable_journal()  # before SyncObj.__init__ reads the journal
        self._max_entry_bytes = tuning.max_entry_bytes
        private_dir(data_dir)
        self._fsm = fsm
        self._on_state_changed = on_state_changed
        # Before SyncObj.__init__: it may report a state change already.
        self._batcher = WriteBatcher(self._append, max_bytes=tuning.max_entry_bytes)
        dump_file = os.path.join(data_dir, SNAPSHOT_FILE)
        self._writer = SnapshotWriter(dump_file, fsm)
        conf = tuned_conf(
            tuning,
            journal_file=os.path.join(data_dir, JOURNAL_FILE),
            full_dump_file=dump_file,
            serializer=self._writer.serialize,
            deserializer=self._writer.deserialize,
            serializeChecker=self._writer.check,
            password=password,
            onStateChanged=self._state_changed,
            # Without it pysyncobj listens on every interface (0.0.0.0), whatever the
            # address the server was told to bind.
            bindAddress=self_address,
            # Servers join and leave a running cluster (`agent -join`, `operator raft
            # remove-peer`): pysyncobj then logs each change as a membership entry and
            # takes it into its configuration when appended, one change at a time.
            dynamicMembershipChange=True,
        )
        super().__init__(self_address, peers, conf)
        narrow_files(data_dir)  # the journal pysyncobj just created with our umask
        self._writer.attach(self.log_end_index)
        self._reads = ReadConfirmations()
        patches.install(self, tuning, self._reads)

    @replicated  # type: ignore[untyped-decorator]
    def apply_entry(self, data: bytes) -> ApplyResult:
        # Entries are contiguous: the one being applied is the one after the last applied.
        # Timed here, not in the FSM, which reads no clock.
        started = time.perf_counter()
        result = self._fsm.apply(data, self.raftLastApplied + 1)
        FSM_APPLY_SECONDS.labels(entry_type_label(data)).observe(time.perf_counter() - started)
        return result

    # -- proposing ---------------------------------------------------------------------
    def propose(self, data: bytes, timeout: float) -> ApplyResult:
        """Append ``data`` to the log on this leader and wait until it is applied here."""
        started = time.perf_counter()
        future = self.submit(data)
        try:
            if in_inline():
                # On the API loop (server/inline.py): the loop waits, no thread does.
                result = await_inline(asyncio.wait_for(asyncio.wrap_future(future), timeout))
            else:
                result = future.result(timeout)
        except TimeoutError:
            raise CommitTimeoutError(
                f"not committed within {timeout:.1f}s; the write may still apply"
            ) from None
        RAFT_COMMIT_SECONDS.observe(time.perf_counter() - started)
        return result

    def submit(self, data: bytes) -> Future[ApplyResult]:
        """``propose`` without waiting: a future of the result, for callers that await.

        The future fails with NotLeaderError, ValidationError (too large), NoLeaderError
        or RaftError as ``propose`` raises them; a batched write reports its batch entry's
        index (server/write_batch.py)."""
        if not self._isLeader():
            return _failed(NotLeaderError(self.leader_address()))
        try:
            self._check_size(data)
        except ValidationError as exc:
            return _failed(exc)
        return self._batcher.submit(data)

    def _append(self, data: bytes, done: Done) -> None:
        """The batcher's way into the log: one entry, its outcome as a result or an error."""
        if not self._isLeader():
            done(None, NoLeaderError("leadership changed before the write was proposed"))
            return

        def on_result(result: Any, error: int) -> None:
            if error == FAIL_REASON.SUCCESS and isinstance(result, ApplyResult):
                done(result, None)
            else:
                done(None, _commit_error(error))

        self.apply_entry(data, callback=on_result)

    def propose_async(self, data: bytes, on_done: Callable[[ApplyResult | None, str], None]) -> None:
        """Append ``data`` without waiting; ``on_done(result, error)`` runs on raft's thread."""
        if not self._isLeader():
            on_done(None, "not the leader")
            return
        try:
            self._check_size(data)
        except ValidationError as exc:
            on_done(None, str(exc))
            return

        started = time.perf_counter()

        def on_result(result: Any, error: int) -> None:
            if error == FAIL_REASON.SUCCESS:
                RAFT_COMMIT_SECONDS.observe(time.perf_counter() - started)
                on_done(result, "")
            else:
                on_done(None, str(_FAIL_NAMES.get(error, error)))

        self.apply_entry(data, callback=on_result)

    def _check_size(self, data: bytes) -> None:
        """Refuse an entry over ``max_entry_bytes`` before it is in the log: a larger one
        could make a frame over the bound followers accept (server/raft/frames.py), and
        they would never catch up."""
        if len(data) > self._max_entry_bytes:
            raise ValidationError(
                f"raft entry of {len(data)} bytes is over the {self._max_entry_bytes}-byte limit: "
                "split it (plans are split at 2,000 allocs)"
            )

    # -- status ------------------------------------------------------------------------
    def is_leader(self) -> bool:
        return bool(self._isLeader())

    def confirm_leadership(self, timeout: float) -> None:
        """Return only once a majority has confirmed, after this call began, that this
        server still leads in its term (server/raft/read_confirm.py): a leader deposed
        without knowing it raises NoLeaderError instead of answering from its state."""
        read = self._begin_read_round()
        if read is not None and not self._reads.wait(
            read.seq, read.term, read.followers, timeout, read.leading
        ):
            raise read.unconfirmed(timeout)

    async def confirm_leadership_async(self, timeout: float) -> None:
        """``confirm_leadership``, awaited on the API's event loop instead of in a thread."""
        read = self._begin_read_round()
        if read is not None and not await self._reads.wait_async(
            read.seq, read.term, read.followers, timeout, read.leading
        ):
            raise read.unconfirmed(timeout)

    def _begin_read_round(self) -> _ReadRound | None:
        """A confirmation round for a read arriving now; None when this server alone is a
        majority."""
        if not self._isLeader():
            raise NotLeaderError(self.leader_address())
        term = self.term()
        followers = [str(n.id) for n in self.otherNodes]
        if not followers:
            return None
        seq = self._reads.request()
        patches.hurry_appends(self)
        return _ReadRound(seq, term, followers, lambda: self.is_leader() and self.term() == term)

    def leader_ready(self) -> bool:
        """Leader, and every entry of earlier terms is applied here (our no-op committed)."""
        if not self._isLeader():
            return False
        noop = patches.noop_index(self)
        return noop is not None and self.raftLastApplied >= noop

    def leader_address(self) -> str | None:
        leader = self._getLeader()
        return None if leader is None else str(leader.id)

    def self_address(self) -> str:
        return str(self.selfNode.id)

    def peers(self) -> list[tuple[str, bool]]:
        """(raft address, connected) for every other member."""
        return [(str(n.id), bool(self.isNodeConnected(n))) for n in sorted(self.otherNodes, key=str)]

    def members(self) -> list[str]:
        """Every voter's raft address, this server's included, as its configuration holds
        them now (a change counts from when it is appended, as pysyncobj applies it)."""
        return sorted([self.self_address(), *(str(n) for n in self.otherNodes)])

    # -- membership --------------------------------------------------------------------
    def add_member(self, address: str, timeout: float) -> None:
        """On the leader: add ``address`` as a voter; returns once the change is committed."""
        self._change_membership(self.addNodeToCluster, address, timeout)

    def remove_member(self, address: str, timeout: float) -> None:
        """On the leader: remove ``address``; returns once the change is committed."""
        self._change_membership(self.removeNodeFromCluster, address, timeout)

    def _change_membership(self, change: Callable[..., None], address: str, timeout: float) -> None:
        if not self._isLeader():
            raise NotLeaderError(self.leader_address())
        done = threading.Event()
        box: list[int] = [FAIL_REASON.SUCCESS]

        def on_result(_result: Any, error: int) -> None:
            box[0] = error
            done.set()

        change(address, callback=on_result)
        if not done.wait(timeout):
            raise CommitTimeoutError(
                f"membership change not committed within {timeout:.1f}s; it may still apply"
            )
        error = box[0]
        if error == FAIL_REASON.SUCCESS:
            return
        if error == FAIL_REASON.REQUEST_DENIED:
            # pysyncobj takes one change at a time: the previous one is not committed yet.
            raise MembershipBusyError("another membership change is not committed yet, retry")
        if error in (FAIL_REASON.MISSING_LEADER, FAIL_REASON.NOT_LEADER, FAIL_REASON.DISCARDED):
            raise NoLeaderError(f"leadership changed before commit ({_FAIL_NAMES.get(error, error)})")
        raise RaftError(f"raft refused the membership change ({_FAIL_NAMES.get(error, error)})")

    def transfer_leadership_to(self, address: str | None, timeout: float) -> str:
        """On the leader: hand leadership to ``address`` (None: the most caught-up connected
        follower) and wait until another server leads; the new leader's raft address.

        pysyncobj sends TimeoutNow only to a follower whose log matches the leader's to
        the last entry, so under writes a request can be refused a few times before the
        follower catches up: it is retried until ``timeout``."""
        deadline = time.monotonic() + timeout
        me = self.self_address()
        while True:
            if not self._isLeader():
                leader = self.leader_address()
                if leader is not None and leader != me:
                    return leader
            else:
                sent = threading.Event()
                # Success means only that TimeoutNow was sent; the loop then waits to see
                # another leader. A refusal (follower behind) is simply tried again.
                self.transferLeadership(address, callback=lambda _r, _e, done=sent: done.set())
                sent.wait(max(0.0, deadline - time.monotonic()))
            if time.monotonic() >= deadline:
                raise MembershipBusyError(
                    f"leadership not transferred within {timeout:.1f}s (the follower is behind or unreachable)"
                )
            time.sleep(0.05)

    def term(self) -> int:
        return int(self.raftCurrentTerm)

    def commit_index(self) -> int:
        return int(self.raftCommitIndex)

    def applied_index(self) -> int:
        return int(self.raftLastApplied)

    def log_end_index(self) -> int:
        return patches.log_end_index(self)

    def last_contact(self) -> dict[str, float]:
        """On the leader: seconds since each follower's last append answer, by raft
        address; empty on a follower (it hears only the leader)."""
        if not self._isLeader():
            return {}
        return patches.last_contact_ages(self)

    def _state_changed(self, old: int, new: int) -> None:
        self._batcher.reset(NoLeaderError("leadership changed before the write was proposed"))
        if self._on_state_changed is not None:
            self._on_state_changed(new == 2)

    def close(self) -> None:
        self._batcher.reset(NoLeaderError("the server is stopping"))
        self.destroy()
        thread = patches.tick_thread(self)
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5)


_FAIL_NAMES: Final = {
    value: name
    for name, value in vars(FAIL_REASON).items()
    if not name.startswith("_") and isinstance(value, int)
}


def _commit_error(error: int) -> Exception:
    """What a caller is told when raft did not apply its entry."""
    if error in (FAIL_REASON.MISSING_LEADER, FAIL_REASON.NOT_LEADER, FAIL_REASON.DISCARDED):
        return NoLeaderError(f"leadership changed before commit ({_FAIL_NAMES.get(error, error)})")
    if error == FAIL_REASON.QUEUE_FULL:
        return NoLeaderError("raft queue full, retry")
    return RaftError(f"raft refused the write ({_FAIL_NAMES.get(error, error)})")


def _failed(error: Exception) -> Future[ApplyResult]:
    future: Future[ApplyResult] = Future()
    future.set_exception(error)
    return future
