"""Raft's measured settings, and the pysyncobj configuration they make.

Measured on a 2-core machine (docs/design.md, "Commit latency"): pysyncobj's defaults batch
appends every 100 ms, so each synchronous write would cost ~100 ms. We send append_entries
as soon as a command arrives (``appendEntriesUseBatch=False``) and tick every 5 ms: ~0.4 ms
commit latency at ~10,000 commits/s on loopback. Elections use 1-2 s timeouts so a busy
2-core machine does not flap leaders; a leader that hears from no majority for 5 s steps
down.

Its own module because the benchmark's bare pysyncobj (tests/bench/raft_bare.py) builds
the same configuration without a drover node, so "the same settings" stays true.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pysyncobj import SyncObjConf

from drover.server.raft.frames import frame_limit

__all__ = ["RaftTuning", "tuned_conf"]


@dataclass(frozen=True, slots=True)
class RaftTuning:
    auto_tick_period: float = 0.005
    append_entries_period: float = 0.05
    raft_min_timeout: float = 1.0
    raft_max_timeout: float = 2.0
    leader_fallback_timeout: float = 5.0
    connection_retry_time: float = 0.5
    compaction_min_entries: int = 20_000
    compaction_min_time: float = 600.0
    commands_queue_size: int = 100_000
    append_entries_batch_bytes: int = 16 * 1024 * 1024
    # The largest entry a member proposes (``RaftNode`` refuses larger ones). Half the
    # batch size: a pickled entry takes up to twice its bytes, so every entry still fits in
    # one message, and none is chunked (the defect in ``tuned_conf``). Plans are split far
    # below it (2,000 allocs are ~0.5 MiB).
    max_entry_bytes: int = 8 * 1024 * 1024
    # A follower whose TCP connection to the leader closes (the leader's process died, its
    # kernel reset the socket) calls an election within a fraction of a second instead of
    # waiting out the full 1-2 s timeout; the followers go in a fixed order, one step apart,
    # so they do not split the vote (see patches.leader_lost_delay). A paused or cut-off
    # leader closes nothing and is caught by the timeout.
    leader_lost_first_s: float = 0.1
    leader_lost_step_s: float = 0.35
    leader_lost_jitter_s: float = 0.05

    def frame_limit_bytes(self) -> int:
        """The longest frame a member accepts from a peer whose session is established: a
        few MiB above the largest message these settings let an honest member send."""
        return frame_limit(self.append_entries_batch_bytes, self.max_entry_bytes)


def tuned_conf(tuning: RaftTuning, *, journal_file: str, full_dump_file: str, **hooks: Any) -> SyncObjConf:
    """pysyncobj's configuration for ``tuning``; ``hooks`` add snapshot and state callbacks."""
    return SyncObjConf(
        autoTick=True,
        autoTickPeriod=tuning.auto_tick_period,
        appendEntriesUseBatch=False,
        appendEntriesPeriod=tuning.append_entries_period,
        raftMinTimeout=tuning.raft_min_timeout,
        raftMaxTimeout=tuning.raft_max_timeout,
        leaderFallbackTimeout=tuning.leader_fallback_timeout,
        connectionRetryTime=tuning.connection_retry_time,
        commandsQueueSize=tuning.commands_queue_size,
        # pysyncobj 0.3.17 marks the last chunk of a chunked entry by the raw command's
        # length, not the pickled one: followers fail to unpickle every entry above this
        # size several times ("failed _onTick") before the real last chunk lands. No entry
        # of ours comes near 16 MiB (plans are split at 2,000 allocs), so none is chunked.
        appendEntriesBatchSizeBytes=tuning.append_entries_batch_bytes,
        logCompactionMinEntries=tuning.compaction_min_entries,
        logCompactionMinTime=tuning.compaction_min_time,
        journalFile=journal_file,
        fullDumpFile=full_dump_file,
        useFork=False,
        **hooks,
    )
