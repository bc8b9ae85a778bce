"""drover's raft journal: checksummed records, synced before anyone relies on them.

Theory of operation. pysyncobj 0.3.17's ``FileJournal`` writes into an mmap it never
flushes (msync only at a clean shutdown), renames its term/vote file without an fsync, and
its records carry no checksum: a power loss of a majority could lose acknowledged writes,
forget a vote, or leave a torn tail that is replayed as an entry. This journal replaces it
(installed by ``patches.install_durable_journal``) behind pysyncobj's ``Journal`` interface:

- ``add``/``deleteEntriesFrom``/``clear`` only write to the page cache and mark the journal
  dirty; ``sync`` makes all of it durable with one ``fdatasync``. Group commit: the node
  calls ``sync`` once at the end of each raft tick (``patches._install_durable_acks``), so
  one sync covers every entry appended in that tick, and durability costs a sync's latency
  per tick, not one per entry.
- Contract kept by the caller (patches): no ``next_node_idx`` (a follower's ack) leaves the
  node while the journal is dirty, and the leader counts itself in a quorum only in a later
  tick than the one that appended, i.e. after that tick's ``sync``.
- ``setCurrentTerm`` (term and vote) is durable before it returns: file written, fsynced,
  renamed over the old one, directory fsynced. pysyncobj calls it before it sends a vote
  request or a vote, so no vote is sent that a restart could forget.
- Every record carries a CRC-32 of its length, index, term and command. On open, the first
  record that is torn (runs past the end of the file), fails its checksum or breaks the
  index sequence ends the log: it and everything after it are cut from the file (and the
  cut logged, ``raft.journal_tail_cut``), never replayed.
- Compaction (``deleteEntriesTo``) writes the kept entries to a new file and renames it
  over the journal, durably: the journal is never half rewritten.

All file operations go through a ``JournalStorage`` (``OsStorage`` in production): the one
seam a power-loss test replaces with a layer that keeps only what was synced.

On-disk format (little-endian): ``LOG_MAGIC`` (16 bytes), then records of
``length u32, crc32 u32, index u64, term u64, command[length]``. The term/vote file
(``<journal>.meta``): ``META_MAGIC``, ``crc32 u32``, then the JSON object
``{"term", "voted_for", "commit_index"}``. A journal in pysyncobj's own format (a server
upgraded in place) is converted on open, its entries, term and vote kept.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import struct
import threading
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Final, Protocol

import structlog
from pysyncobj.journal import APP_NAME as LEGACY_APP_NAME
from pysyncobj.journal import FIRST_RECORD_OFFSET as LEGACY_FIRST_RECORD_OFFSET
from pysyncobj.journal import LAST_RECORD_OFFSET_OFFSET as LEGACY_LAST_RECORD_OFFSET_OFFSET
from pysyncobj.journal import Journal

from drover.server.datadir import open_private

__all__ = [
    "LOG_MAGIC",
    "META_MAGIC",
    "DurableJournal",
    "JournalCorruptError",
    "JournalStorage",
    "LogFile",
    "OsStorage",
    "ScannedLog",
    "encode_record",
    "scan_log",
    "set_storage",
    "storage",
]

log = structlog.get_logger("drover.raft")

LOG_MAGIC: Final = b"DROVER-RAFT-LOG1"
META_MAGIC: Final = b"DROVER-RAFT-META"
_RECORD: Final = struct.Struct("<IIQQ")  # length, crc32, index, term
_CRC_FIELDS: Final = struct.Struct("<IQQ")  # what the crc covers besides the command
_CRC: Final = struct.Struct("<I")

Entry = tuple[bytes, int, int]  # pysyncobj's (command, index, term)


class JournalCorruptError(Exception):
    """A journal or term/vote file that is not drover's, or whose term/vote record is
    damaged: the node must not start on it (a forgotten vote could elect two leaders)."""


# ---------------------------------------------------------------------------------------
# The format, pure


def encode_record(command: bytes, index: int, term: int) -> bytes:
    crc = zlib.crc32(command, zlib.crc32(_CRC_FIELDS.pack(len(command), index, term)))
    return _RECORD.pack(len(command), crc, index, term) + command


@dataclass(frozen=True, slots=True)
class ScannedLog:
    """What ``scan_log`` found: the good entries, where each starts, and where the good
    part ends. ``problem`` says why the rest (``cut_bytes``) is not part of the log."""

    entries: list[Entry]
    offsets: list[int]
    end: int
    cut_bytes: int
    problem: str


def scan_log(blob: bytes) -> ScannedLog:
    """Every good record of a journal file in this format, up to the first bad one."""
    if not blob.startswith(LOG_MAGIC):
        raise JournalCorruptError("not a drover raft journal")
    entries: list[Entry] = []
    offsets: list[int] = []
    offset = len(LOG_MAGIC)
    problem = ""
    while offset < len(blob):
        if offset + _RECORD.size > len(blob):
            problem = "torn record header"
            break
        length, crc, index, term = _RECORD.unpack_from(blob, offset)
        start = offset + _RECORD.size
        if start + length > len(blob):
            problem = f"torn record at index {index}" if entries else "torn first record"
            break
        command = blob[start : start + length]
        if zlib.crc32(command, zlib.crc32(_CRC_FIELDS.pack(length, index, term))) != crc:
            problem = "checksum mismatch"
            break
        if entries and index != entries[-1][1] + 1:
            problem = f"index {index} does not follow {entries[-1][1]}"
            break
        entries.append((command, index, term))
        offsets.append(offset)
        offset = start + length
    return ScannedLog(entries, offsets, offset, len(blob) - offset, problem)


def encode_meta(term: int, voted_for: str | None, commit_index: int) -> bytes:
    body = json.dumps({"term": term, "voted_for": voted_for, "commit_index": commit_index}).encode()
    return META_MAGIC + _CRC.pack(zlib.crc32(body)) + body


def decode_meta(blob: bytes) -> tuple[int, str | None, int]:
    """(term, voted_for, commit_index) from a term/vote file; raises if it is damaged."""
    head = len(META_MAGIC) + _CRC.size
    if not blob.startswith(META_MAGIC) or len(blob) < head:
        raise JournalCorruptError("not a drover raft term/vote file")
    (crc,) = _CRC.unpack_from(blob, len(META_MAGIC))
    body = blob[head:]
    if zlib.crc32(body) != crc:
        raise JournalCorruptError("term/vote file fails its checksum")
    value = json.loads(body)
    voted_for = value["voted_for"]
    return int(value["term"]), None if voted_for is None else str(voted_for), int(value["commit_index"])


def legacy_entries(blob: bytes) -> Iterator[Entry]:
    """The entries of a journal in pysyncobj 0.3.17's ``FileJournal`` format."""
    (end,) = struct.unpack_from("<I", blob, LEGACY_LAST_RECORD_OFFSET_OFFSET)
    offset = LEGACY_FIRST_RECORD_OFFSET
    while offset < min(end, len(blob)):
        (size,) = struct.unpack_from("<I", blob, offset)
        if size < 16 or offset + 8 + size > len(blob):
            return
        body = blob[offset + 4 : offset + 4 + size]
        index, term = struct.unpack_from("<QQ", body)
        yield bytes(body[16:]), int(index), int(term)
        offset += size + 8


def is_legacy(blob: bytes) -> bool:
    return blob.startswith(LEGACY_APP_NAME) and len(blob) >= LEGACY_FIRST_RECORD_OFFSET


# ---------------------------------------------------------------------------------------
# The storage seam


class LogFile(Protocol):
    """An open journal file. Writes may sit in a cache until ``sync`` returns."""

    def write_at(self, offset: int, data: bytes) -> None: ...
    def truncate(self, size: int) -> None: ...
    def sync(self) -> None: ...
    def close(self) -> None: ...


class JournalStorage(Protocol):
    def read(self, path: str) -> bytes | None:
        """The file's bytes, None if there is none."""
        ...

    def replace(self, path: str, data: bytes) -> None:
        """Make ``path`` hold ``data``, durably and atomically: written beside it, synced,
        renamed over it, directory synced. After a crash it holds the old bytes or these."""
        ...

    def open_log(self, path: str) -> LogFile: ...
    def remove(self, path: str) -> None: ...


class _OsLogFile:
    def __init__(self, path: str) -> None:
        self._fd = open_private(path, os.O_RDWR)

    def write_at(self, offset: int, data: bytes) -> None:
        view = memoryview(data)
        while view:
            written = os.pwrite(self._fd, view, offset)
            view, offset = view[written:], offset + written

    def truncate(self, size: int) -> None:
        os.ftruncate(self._fd, size)

    def sync(self) -> None:
        # fdatasync also flushes the file size (needed to read the data back).
        os.fdatasync(self._fd)

    def close(self) -> None:
        os.close(self._fd)


class OsStorage:
    """The real file system."""

    def read(self, path: str) -> bytes | None:
        try:
            with open(path, "rb") as f:
                return f.read()
        except FileNotFoundError:
            return None

    def replace(self, path: str, data: bytes) -> None:
        tmp = path + ".tmp"
        fd = open_private(tmp, os.O_WRONLY | os.O_TRUNC)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
        sync_dir(os.path.dirname(path) or ".")

    def open_log(self, path: str) -> LogFile:
        return _OsLogFile(path)

    def remove(self, path: str) -> None:
        try:
            os.unlink(path)
        except FileNotFoundError:
            return
        sync_dir(os.path.dirname(path) or ".")


def sync_dir(path: str) -> None:
    """fsync a directory, so a rename or unlink in it survives a power loss."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_file(path: str) -> None:
    """fsync a file someone else wrote and renamed into place, and its directory."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    sync_dir(os.path.dirname(path) or ".")


_storage: list[JournalStorage] = [OsStorage()]


def storage() -> JournalStorage:
    """The storage new journals of this process use."""
    return _storage[0]


def set_storage(replacement: JournalStorage) -> None:
    """Give every journal this process opens from now on another storage. Only a test's
    own entry point calls it (tests/fixtures/power_loss.py); no configuration reaches it."""
    _storage[0] = replacement


# ---------------------------------------------------------------------------------------
# The journal


class DurableJournal(Journal):  # type: ignore[misc]
    """pysyncobj's ``Journal``, durable (see the module docstring for the contract)."""

    def __init__(self, path: str, store: JournalStorage | None = None) -> None:
        self._path = path
        self._meta_path = path + ".meta"
        self._store = store or storage()
        self._lock = threading.Lock()  # sync may come from the tick thread or close
        self._dirty = False
        self._meta_dirty = False
        self.syncs = 0
        self._sync_before_clear: str | None = None
        self._term, self._voted_for, self._commit_index = self._load_meta()
        self._entries, self._offsets, self._end = self._load_log()
        self._file = self._store.open_log(path)

    # -- opening -----------------------------------------------------------------------
    def _load_meta(self) -> tuple[int, str | None, int]:
        blob = self._store.read(self._meta_path)
        if blob is None:
            return 0, None, 1
        if blob.startswith(META_MAGIC):
            return decode_meta(blob)
        return _legacy_meta(blob)

    def _load_log(self) -> tuple[list[Entry], list[int], int]:
        blob = self._store.read(self._path)
        if blob is not None and is_legacy(blob):
            entries = list(legacy_entries(blob))
            self._write_image(entries)
            # The term and vote pysyncobj kept, rewritten in this format (same file; if the
            # power goes before this, the next start reads pysyncobj's file again).
            self._store.replace(self._meta_path, encode_meta(self._term, self._voted_for, self._commit_index))
            log.info("raft.journal_converted", path=self._path, entries=len(entries))
            blob = self._store.read(self._path)
        if blob is None or not blob:
            self._store.replace(self._path, LOG_MAGIC)
            return [], [], len(LOG_MAGIC)
        scanned = scan_log(blob)
        if scanned.cut_bytes:
            last = scanned.entries[-1][1] if scanned.entries else None
            log.warning(
                "raft.journal_tail_cut",
                path=self._path,
                reason=scanned.problem,
                at_byte=scanned.end,
                cut_bytes=scanned.cut_bytes,
                last_good_index=last,
            )
            self._store.replace(self._path, blob[: scanned.end])
        return scanned.entries, scanned.offsets, scanned.end

    def _write_image(self, entries: list[Entry]) -> None:
        """Replace the journal file with exactly ``entries``, durably."""
        records = [encode_record(*entry) for entry in entries]
        self._store.replace(self._path, LOG_MAGIC + b"".join(records))
        self._offsets = []
        offset = len(LOG_MAGIC)
        for record in records:
            self._offsets.append(offset)
            offset += len(record)
        self._end = offset

    # -- pysyncobj's Journal -----------------------------------------------------------
    def add(self, command: Any, idx: int, term: int) -> None:
        data = command if isinstance(command, bytes) else bytes(command, "utf-8")
        record = encode_record(data, int(idx), int(term))
        with self._lock:
            self._file.write_at(self._end, record)
            self._entries.append((data, int(idx), int(term)))
            self._offsets.append(self._end)
            self._end += len(record)
            self._dirty = True

    def sync_before_clear(self, path: str) -> None:
        """fsync ``path`` (and its directory) whenever the log is cleared.

        pysyncobj clears the log only to put a snapshot's entries in it, right after it
        renamed the snapshot it received over the dump file, unsynced. Without this, the
        cleared log (synced at the end of the tick, then acknowledged) could survive a power
        loss that the snapshot did not: a log starting at the snapshot's index, and no state.
        """
        self._sync_before_clear = path

    def clear(self) -> None:
        if self._sync_before_clear is not None and os.path.exists(self._sync_before_clear):
            fsync_file(self._sync_before_clear)
        with self._lock:
            self._file.truncate(len(LOG_MAGIC))
            self._entries, self._offsets, self._end = [], [], len(LOG_MAGIC)
            self._dirty = True

    def deleteEntriesFrom(self, entryFrom: int) -> None:
        with self._lock:
            if entryFrom >= len(self._entries):
                return
            self._end = self._offsets[entryFrom]
            self._file.truncate(self._end)
            del self._entries[entryFrom:]
            del self._offsets[entryFrom:]
            self._dirty = True

    def deleteEntriesTo(self, entryTo: int) -> None:
        # Compaction. The snapshot it rests on was fsynced before its rename
        # (snapshot_writer.py), and the rename is in this directory, whose fsync in
        # ``replace`` below makes it durable before the old entries are gone.
        with self._lock:
            kept = self._entries[entryTo:]
            self._file.close()  # its un-synced writes are in ``kept`` too
            self._write_image(kept)
            self._entries = kept
            self._file = self._store.open_log(self._path)
            self._dirty = False

    def __getitem__(self, item: Any) -> Any:
        return self._entries[item]

    def __len__(self) -> int:
        return len(self._entries)

    def _destroy(self) -> None:
        self.sync()
        with self._lock:
            if self._meta_dirty:
                self._store_meta()
            self._file.close()

    def flush(self) -> None:
        self.sync()

    def setRaftCommitIndex(self, raftCommitIndex: int) -> None:
        # Only a hint on restart (the leader's commit index rules), so it is stored with
        # the next one-second timer, not synced here.
        if raftCommitIndex != self._commit_index:
            self._commit_index = int(raftCommitIndex)
            self._meta_dirty = True

    def getRaftCommitIndex(self) -> int:
        # Never past the log's end: a cut tail takes its commit claims with it.
        last = self._entries[-1][1] if self._entries else 1
        return min(self._commit_index, int(last))

    def setCurrentTerm(self, term: int, votedForNodeId: Any) -> None:
        self._term = int(term)
        self._voted_for = None if votedForNodeId is None else str(votedForNodeId)
        with self._lock:
            self._store_meta()

    def getCurrentTerm(self) -> int:
        return self._term

    def getVotedForNodeId(self) -> str | None:
        return self._voted_for

    def onOneSecondTimer(self) -> None:
        if self._meta_dirty:
            with self._lock:
                self._store_meta()

    # -- drover's ----------------------------------------------------------------------
    @property
    def dirty(self) -> bool:
        """Written since the last sync: whatever the node acknowledges now must wait."""
        return self._dirty

    def sync(self) -> bool:
        """Make every write so far durable; False if there was nothing to sync."""
        with self._lock:
            if not self._dirty:
                return False
            self._file.sync()
            self._dirty = False
            self.syncs += 1
            return True

    def _store_meta(self) -> None:
        self._store.replace(self._meta_path, encode_meta(self._term, self._voted_for, self._commit_index))
        self._meta_dirty = False


class _PlainUnpickler(pickle.Unpickler):
    """Loads dicts, strings and numbers; refuses every class (the file must not run code)."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"refusing to load {module}.{name} from a raft term/vote file")


def _legacy_meta(blob: bytes) -> tuple[int, str | None, int]:
    """pysyncobj's pickled ``{currentTerm, votedForNodeId, raftCommitIndex}`` (plain
    values only: nothing in it may load a class). pysyncobj's ``max`` with the last log
    term still covers a term lost with it; a lost vote is what its format already risked."""
    try:
        value = _PlainUnpickler(io.BytesIO(blob)).load()
    except Exception as exc:
        value = None
        problem = str(exc) or type(exc).__name__
    else:
        problem = "not a dict"
    if not isinstance(value, dict):
        # pysyncobj itself started on such a file as if it were empty (its rename was not
        # synced, so a power loss could leave it so); refusing now would strand the upgrade.
        log.warning("raft.legacy_term_vote_unreadable", problem=problem)
        return 0, None, 1
    voted_for = value.get("votedForNodeId")
    return (
        int(value.get("currentTerm", 0)),
        None if voted_for is None else str(voted_for),
        int(value.get("raftCommitIndex", 1)),
    )
