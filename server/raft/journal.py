"""The raft on-disk formats, read without a running node: the journal and drover's snapshot.

The offline operator tools (server/raft_tools.py: `drover operator raft logs|state`,
`drover operator snapshot inspect`) read a stopped server's data dir through this module.
The journal is parsed here, read-only, in either format a data dir may hold: drover's
(server/raft/durable_journal.py) or pysyncobj's (a server not started since the upgrade).
The live node shares one piece: ``command_bytes`` decodes a queued command, which the
forwarding patch (patches.py) checks before appending it.
"""

from __future__ import annotations

import codecs
import io
import pickle
import struct
from dataclasses import dataclass
from typing import Any, Final

from pysyncobj.journal import APP_NAME as JOURNAL_APP_NAME
from pysyncobj.journal import FIRST_RECORD_OFFSET, LAST_RECORD_OFFSET_OFFSET
from pysyncobj.syncobj import _COMMAND_TYPE

from drover.server.raft.durable_journal import LOG_MAGIC, scan_log
from drover.v1 import raft_pb2

__all__ = [
    "JOURNAL_FILE",
    "RECORD_COMMAND",
    "RECORD_MEMBERSHIP",
    "RECORD_NOOP",
    "RECORD_UNKNOWN",
    "RECORD_VERSION",
    "SNAPSHOT_FILE",
    "JournalError",
    "JournalRecord",
    "command_bytes",
    "read_journal",
    "read_snapshot_file",
]

# A server's raft files, under its ``<data_dir>/raft`` (the node writes them, server/raft/node.py).
JOURNAL_FILE: Final = "journal.bin"
SNAPSHOT_FILE: Final = "snapshot.pb"

RECORD_COMMAND: Final = "command"
RECORD_NOOP: Final = "noop"
RECORD_MEMBERSHIP: Final = "membership"
RECORD_VERSION: Final = "version"
RECORD_UNKNOWN: Final = "unknown"
_RECORD_KINDS: Final = {
    _COMMAND_TYPE.REGULAR: RECORD_COMMAND,
    _COMMAND_TYPE.NO_OP: RECORD_NOOP,
    _COMMAND_TYPE.MEMBERSHIP: RECORD_MEMBERSHIP,
    _COMMAND_TYPE.VERSION: RECORD_VERSION,
}


class JournalError(Exception):
    """The journal file is not a raft journal, or it is damaged."""


@dataclass(frozen=True, slots=True)
class JournalRecord:
    """One raft log entry from the journal. ``data`` is drover's ``LogEntry`` bytes for a
    command, else the raw pysyncobj command."""

    index: int
    term: int
    kind: str
    data: bytes


class _CommandUnpickler(pickle.Unpickler):
    """pysyncobj pickles a command as ``(func_id, (entry_bytes,))``; protocol 2 spells bytes
    as ``_codecs.encode(text, "latin1")``. Nothing else may load: a damaged or foreign file
    must not run code in the operator's shell."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) == ("_codecs", "encode"):
            return codecs.encode
        raise pickle.UnpicklingError(f"refusing to load {module}.{name} from a raft journal")


def command_bytes(raw: bytes) -> bytes:
    """drover's ``LogEntry`` bytes from a pysyncobj command (its type byte removed)."""
    value = _CommandUnpickler(io.BytesIO(raw)).load()
    if isinstance(value, tuple) and len(value) == 2 and isinstance(value[1], tuple) and len(value[1]) == 1:
        data = value[1][0]
        if isinstance(data, bytes):
            return data
    raise JournalError("a command entry that is not drover's apply_entry(bytes)")


def read_journal(path: str) -> list[JournalRecord]:
    """Every entry of a journal, read-only: drover's checksummed format
    (server/raft/durable_journal.py) or pysyncobj's own ``FileJournal`` (a data dir from
    before it; pysyncobj's own reader would open the file for writing and grow it).

    A torn or corrupt tail of drover's format is left out, as the server cuts it when it
    starts: these are the entries it would replay."""
    with open(path, "rb") as f:
        blob = f.read()
    if blob.startswith(LOG_MAGIC):
        return [_record(path, *entry) for entry in scan_log(blob).entries]
    if len(blob) < FIRST_RECORD_OFFSET or not blob.startswith(JOURNAL_APP_NAME):
        raise JournalError(f"{path}: not a raft journal")
    (end,) = struct.unpack_from("<I", blob, LAST_RECORD_OFFSET_OFFSET)
    if end > len(blob):
        raise JournalError(f"{path}: truncated (records end at {end}, file has {len(blob)} bytes)")
    records: list[JournalRecord] = []
    offset = FIRST_RECORD_OFFSET
    while offset < end:
        (size,) = struct.unpack_from("<I", blob, offset)
        if size < 16 or offset + 8 + size > end:
            raise JournalError(f"{path}: damaged record at byte {offset}")
        body = blob[offset + 4 : offset + 4 + size]
        (trailer,) = struct.unpack_from("<I", blob, offset + 4 + size)
        if trailer != size:
            raise JournalError(f"{path}: damaged record at byte {offset}")
        index, term = struct.unpack_from("<QQ", body)
        records.append(_record(path, body[16:], index, term))
        offset += size + 8
    return records


def _record(path: str, command: bytes, index: int, term: int) -> JournalRecord:
    kind = _RECORD_KINDS.get(command[0], RECORD_UNKNOWN) if command else RECORD_UNKNOWN
    data = command[1:]
    if kind == RECORD_COMMAND:
        try:
            data = command_bytes(data)
        except (pickle.UnpicklingError, JournalError, EOFError, ValueError) as exc:
            raise JournalError(f"{path}: entry {index}: {exc}") from exc
    return JournalRecord(index=index, term=term, kind=kind, data=data)


def read_snapshot_file(path: str) -> raft_pb2.RaftSnapshotFile | None:
    """The raft snapshot (``snapshot.pb``), or None if the server never wrote one."""
    try:
        with open(path, "rb") as f:
            return raft_pb2.RaftSnapshotFile.FromString(f.read())
    except FileNotFoundError:
        return None
