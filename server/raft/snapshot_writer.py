"""Log compaction in drover's own protobuf format, written off raft's tick thread.

By default pysyncobj pickles the whole state on its tick thread (seconds at 100,000
allocations: long enough to lose leadership) or forks a child to write it, which is unsafe
in a process running grpcio threads. Here the tick thread only takes the O(1) state-store
snapshot; a background thread writes it (server/snapshot.py's format), and pysyncobj learns
of progress through its ``serializeChecker`` hook.

Second guard against pysyncobj 0.3.17's truncation defect (docs/design.md, "Defects
found"): a follower that truncated its log while a compaction was finishing could empty the
log for good. ``check`` refuses to report success while the raft log is shorter than the
snapshot it would compact to; the compaction is retried later instead. The snapshot file
only changes together with a compaction that pysyncobj will actually perform.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any, Final

import structlog
from pysyncobj.config import SERIALIZER_STATE
from pysyncobj.node import TCPNode

from drover.server.datadir import open_private
from drover.server.fsm import FSM
from drover.server.snapshot import from_snapshot, to_snapshot
from drover.v1 import raft_pb2

__all__ = ["SnapshotWriter"]

log = structlog.get_logger("drover.raft")

_WRITTEN: Final = -1  # internal: written to disk, not yet reported


class SnapshotWriter:
    """pysyncobj's serializer/deserializer/serializeChecker, asynchronous and in protobuf.

    pysyncobj calls ``serialize(tmp_name, data)`` on its tick thread and then renames
    ``tmp_name`` over the dump file. We never create ``tmp_name`` (its rename fails quietly)
    and instead write ``<dump>.writing`` from a thread, renaming it over the dump file in
    ``check`` once the write is complete and the compaction is safe.
    """

    def __init__(self, dump_file: str, fsm: FSM) -> None:
        self._dump_file = dump_file
        self._fsm = fsm
        self._lock = threading.Lock()
        self._state = SERIALIZER_STATE.NOT_SERIALIZING
        self._compact_to = 0
        self._log_end_index: Callable[[], int] | None = None

    def attach(self, log_end_index: Callable[[], int]) -> None:
        """Give the writer the node's log end, once the node exists (it needs the writer first)."""
        self._log_end_index = log_end_index

    def serialize(self, _tmp_name: str, data: Any) -> None:
        last_entry, prev_entry, cluster = data
        tables = self._fsm.store.snapshot().tables
        with self._lock:
            self._state = SERIALIZER_STATE.SERIALIZING
            self._compact_to = int(prev_entry[1])
        thread = threading.Thread(
            target=self._write,
            args=(tables, last_entry, prev_entry, sorted(str(n) for n in cluster)),
            name="raft-snapshot-writer",
            daemon=True,
        )
        thread.start()

    def _write(self, tables: Any, last_entry: Any, prev_entry: Any, cluster: list[str]) -> None:
        try:
            msg = raft_pb2.RaftSnapshotFile(
                state=to_snapshot(tables),
                last_entry=_entry_ref(last_entry),
                prev_entry=_entry_ref(prev_entry),
                cluster=cluster,
            )
            path = self._dump_file + ".writing"
            # The whole state: the owner's alone, like everything in the data dir.
            with os.fdopen(open_private(path, os.O_WRONLY | os.O_TRUNC), "wb") as f:
                f.write(msg.SerializeToString())
                f.flush()
                os.fsync(f.fileno())
            state = _WRITTEN
        except Exception:
            log.exception("raft.snapshot_write_failed")
            state = SERIALIZER_STATE.FAILED
        with self._lock:
            self._state = state

    def check(self) -> int:
        """Called on the tick thread, right before pysyncobj compacts on SUCCESS."""
        with self._lock:
            state = self._state
            if state == _WRITTEN:
                log_end = self._log_end_index() if self._log_end_index is not None else self._compact_to + 1
                if log_end <= self._compact_to:
                    log.warning(
                        "raft.compaction_deferred",
                        reason="raft log shorter than the snapshot (pysyncobj truncation defect)",
                        log_end=log_end,
                        snapshot_index=self._compact_to,
                    )
                    os.unlink(self._dump_file + ".writing")
                    state = SERIALIZER_STATE.FAILED
                else:
                    os.replace(self._dump_file + ".writing", self._dump_file)
                    state = SERIALIZER_STATE.SUCCESS
                    log.info("raft.snapshot_written", compact_to=self._compact_to)
            if state in (SERIALIZER_STATE.SUCCESS, SERIALIZER_STATE.FAILED):
                self._state = SERIALIZER_STATE.NOT_SERIALIZING
            return int(state)

    def deserialize(self, file_name: str) -> tuple[Any, Any, Any]:
        with open(file_name, "rb") as f:
            msg = raft_pb2.RaftSnapshotFile.FromString(f.read())
        self._fsm.restore_tables(from_snapshot(msg.state))
        log.info("raft.snapshot_loaded", index=msg.state.index, last_entry=msg.last_entry.index)
        last = (msg.last_entry.command, msg.last_entry.index, msg.last_entry.term)
        prev = (msg.prev_entry.command, msg.prev_entry.index, msg.prev_entry.term)
        return last, prev, [TCPNode(a) for a in msg.cluster]


def _entry_ref(entry: Any) -> raft_pb2.RaftEntryRef:
    return raft_pb2.RaftEntryRef(command=bytes(entry[0]), index=int(entry[1]), term=int(entry[2]))
