"""Offline operator tools on a stopped server's data dir (as used in docs/field-reports.md#field-report-2).

* ``raft logs``: every raft log entry as one JSON object (index, term, type, decoded body);
* ``raft state``: the state at any raft index: the snapshot if it is not past that index,
  then the journal replayed through a fresh FSM, the same code the server runs;
* ``snapshot inspect``: what a snapshot file holds, per table.

They read the files a live server is writing, so they take the data dir's lock without
waiting and refuse while a server holds it (server/datadir.py). Nothing here writes to the
data dir (beyond the lock file's owner pid, as any holder does).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Final

from google.protobuf import json_format
from google.protobuf.message import DecodeError, Message

from drover.server.datadir import DataDirBusyError, DataDirLock
from drover.server.fsm import APPLIERS, FSM, ApplyResult
from drover.server.raft.journal import (
    JOURNAL_FILE,
    RECORD_COMMAND,
    SNAPSHOT_FILE,
    JournalError,
    JournalRecord,
    read_journal,
    read_snapshot_file,
)
from drover.server.snapshot import from_snapshot, to_snapshot
from drover.server.state_store import TABLES, StateStore, Tables
from drover.v1 import raft_pb2

__all__ = [
    "OfflineError",
    "RaftData",
    "ReplayStep",
    "inspect_snapshot",
    "log_entries",
    "open_data_dir",
    "replay",
    "state_json",
]

ET = raft_pb2.EntryType
RAFT_DIR: Final = "raft"

ENTRY_MESSAGES: Final[dict[int, type[Message]]] = {
    **{entry_type: msg_cls for entry_type, (msg_cls, _fn) in APPLIERS.items()},
    ET.ENTRY_TYPE_SNAPSHOT_RESTORE: raft_pb2.SnapshotRestoreEntry,
}


class OfflineError(Exception):
    """The tool cannot do what was asked; the message is one line for the operator."""


@dataclass(frozen=True, slots=True)
class RaftData:
    """What a stopped server left on disk: its raft snapshot (if any) and its journal."""

    data_dir: str
    snapshot: raft_pb2.RaftSnapshotFile | None
    records: list[JournalRecord]

    @property
    def last_index(self) -> int:
        if self.records:
            return self.records[-1].index
        return self.snapshot.state.index if self.snapshot is not None else 0


@dataclass(frozen=True, slots=True)
class ReplayStep:
    """The state right after one raft entry (``result`` None: not an FSM entry)."""

    record: JournalRecord
    result: ApplyResult | None
    tables: Tables


def _to_dict(msg: Message) -> dict[str, Any]:
    return json_format.MessageToDict(
        msg, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )


@contextmanager
def open_data_dir(data_dir: str) -> Iterator[RaftData]:
    """Read a data dir under its lock; refuse while its server runs."""
    raft_dir = os.path.join(data_dir, RAFT_DIR)
    journal = os.path.join(raft_dir, JOURNAL_FILE)
    if not os.path.isdir(data_dir):
        raise OfflineError(f"data dir {data_dir} does not exist")
    if not os.path.exists(journal):
        raise OfflineError(f"no raft journal in data dir {data_dir} (expected {journal})")
    lock = DataDirLock(data_dir)
    try:
        lock.acquire()
    except DataDirBusyError as exc:
        raise OfflineError(str(exc)) from None
    try:
        try:
            records = read_journal(journal)
            snapshot = read_snapshot_file(os.path.join(raft_dir, SNAPSHOT_FILE))
        except (JournalError, DecodeError) as exc:
            raise OfflineError(str(exc)) from exc
        yield RaftData(data_dir=data_dir, snapshot=snapshot, records=records)
    finally:
        lock.release()


# ---------------------------------------------------------------------------------------
# raft logs


def decode_record(record: JournalRecord) -> dict[str, Any]:
    """One entry as JSON: ``index``, ``term``, ``type`` and ``body`` (or ``error``)."""
    out: dict[str, Any] = {"index": record.index, "term": record.term}
    if record.kind != RECORD_COMMAND:
        out["type"] = f"RAFT_{record.kind.upper()}"
        return out
    try:
        entry = raft_pb2.LogEntry.FromString(record.data)
    except DecodeError as exc:
        out["type"] = "UNDECODABLE"
        out["error"] = f"not a drover log entry: {exc}"
        return out
    out.update(_decode_entry(entry))
    return out


def _decode_entry(entry: raft_pb2.LogEntry) -> dict[str, Any]:
    """``type`` and ``body`` (or ``error``) of one entry; a batch's ``requests``, each so."""
    out: dict[str, Any] = {}
    name = ET.Name(entry.type) if entry.type in ET.values() else str(entry.type)
    if entry.type == ET.ENTRY_TYPE_BATCH:
        out["type"] = name
        try:
            requests = raft_pb2.BatchEntry.FromString(entry.payload).entries
            out["requests"] = [_decode_entry(raft_pb2.LogEntry.FromString(data)) for data in requests]
        except DecodeError as exc:
            out["error"] = f"undecodable {name} payload: {exc}"
        return out
    out["type"] = name
    msg_cls = ENTRY_MESSAGES.get(entry.type)
    if msg_cls is None:
        out["error"] = "unknown entry type"
        return out
    try:
        out["body"] = _to_dict(msg_cls.FromString(entry.payload))
    except DecodeError as exc:
        out["error"] = f"undecodable {name} payload: {exc}"
    return out


def log_entries(data: RaftData) -> Iterator[dict[str, Any]]:
    for record in data.records:
        yield decode_record(record)


# ---------------------------------------------------------------------------------------
# raft state


def replay(data: RaftData, last_index: int | None = None) -> Iterator[ReplayStep]:
    """Rebuild the state entry by entry up to ``last_index`` (None or 0: the end of the log;
    negative: that many entries before the end).

    Starts from the raft snapshot when it is not past ``last_index``, else from an empty
    state if the journal still starts at the beginning of the log. Yields the state after
    every journal entry replayed, so a caller can check an invariant at each index.
    """
    target = data.last_index
    if last_index is not None and last_index > 0:
        target = min(last_index, data.last_index)
    elif last_index is not None and last_index < 0:
        target = max(0, data.last_index + last_index)  # Nomad's "-last-index -N": N before the end
    store = StateStore()
    start = 0
    snap = data.snapshot
    if snap is not None and snap.state.index <= target:
        store = StateStore(from_snapshot(snap.state))
        start = snap.state.index
    first = next((r.index for r in data.records if r.index > start), None)
    if first is not None and first > start + 1:
        if start == 0 and snap is not None:
            raise OfflineError(
                f"index {target} is before the snapshot (index {snap.state.index}) and the log"
                f" entries before it were compacted: the earliest index available is {snap.state.index}"
            )
        raise OfflineError(f"missing log entries after index {start}: the journal continues at {first}")
    fsm = FSM(store)
    for record in data.records:
        if record.index <= start:
            continue
        if record.index > target:
            break
        result = fsm.apply(record.data, record.index) if record.kind == RECORD_COMMAND else None
        yield ReplayStep(record=record, result=result, tables=store.snapshot().tables)


def state_at(data: RaftData, last_index: int | None = None) -> tuple[Tables, int, int]:
    """The state after replaying up to ``last_index``: (tables, raft index, term)."""
    index, term = 0, 0
    tables: Tables | None = None
    for step in replay(data, last_index):
        tables, index, term = step.tables, step.record.index, step.record.term
    if tables is None:
        snap = data.snapshot
        if snap is not None and (not last_index or snap.state.index <= last_index):
            return from_snapshot(snap.state), snap.state.index, snap.last_entry.term
        return Tables(), 0, 0
    return tables, index, term


def state_json(data: RaftData, last_index: int | None = None) -> dict[str, Any]:
    """Every table at ``last_index`` as JSON (StateSnapshot's fields), plus where it is."""
    if last_index is not None and last_index > data.last_index:
        raise OfflineError(f"-last-index {last_index} is past the end of the log (index {data.last_index})")
    tables, index, term = state_at(data, last_index)
    out: dict[str, Any] = {"raft_index": index, "raft_term": term}
    out.update(_to_dict(to_snapshot(tables)))
    return out


# ---------------------------------------------------------------------------------------
# snapshot inspect


# The snapshot's repeated fields, one per table; the scheduler config is a single message.
_TABLE_FIELDS: Final = tuple(name for name in TABLES if name != "scheduler_config")


def inspect_snapshot(path: str) -> dict[str, Any]:
    """Index, size and per-table counts of a snapshot file: either a raft ``snapshot.pb`` or
    what ``drover operator snapshot save`` wrote."""
    with open(path, "rb") as f:
        blob = f.read()
    out: dict[str, Any] = {"file": path, "size": len(blob)}
    try:
        # Field 1 of a RaftSnapshotFile is a message (tag 0x0a); of a StateSnapshot, a varint.
        if blob[:1] == b"\x0a":
            raft = raft_pb2.RaftSnapshotFile.FromString(blob)
            state = raft.state
            out["format"] = "raft snapshot"
            out["last_entry"] = {"index": raft.last_entry.index, "term": raft.last_entry.term}
            out["cluster"] = list(raft.cluster)
        else:
            state = raft_pb2.StateSnapshot.FromString(blob)
            out["format"] = "state snapshot"
    except DecodeError as exc:
        raise OfflineError(f"{path}: not a drover snapshot ({exc})") from exc
    out["index"] = state.index
    tables = []
    for name in _TABLE_FIELDS:
        items = getattr(state, name)
        tables.append({"name": name, "count": len(items), "size": sum(m.ByteSize() for m in items)})
    tables.append(
        {
            "name": "scheduler_config",
            "count": int(state.HasField("scheduler_config")),
            "size": state.scheduler_config.ByteSize(),
        }
    )
    out["tables"] = tables
    return out
