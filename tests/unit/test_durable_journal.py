"""The durable raft journal (server/raft/durable_journal.py) on crafted files.

Situations: a power loss keeps exactly what was synced; one sync covers a tick's entries;
term and vote are on disk (file fsynced, renamed, directory fsynced) before
``setCurrentTerm`` returns; a torn or corrupt tail is cut, logged and never replayed; a
follower's ack leaves only after the sync of the entries it covers; a journal in
pysyncobj's own format is converted with its term and vote; the offline reader reads
the new format.
"""

from __future__ import annotations

import dataclasses
import os
import struct
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import structlog
from pysyncobj.journal import FileJournal

from deploy.cluster import pick_free_ports, wait_for
from drover.server.fsm import FSM, encode_entry
from drover.server.raft import RaftNode, patches
from drover.server.raft.durable_journal import (
    LOG_MAGIC,
    DurableJournal,
    JournalCorruptError,
    OsStorage,
    encode_record,
)
from drover.server.raft.journal import read_journal
from drover.server.raft.tuning import RaftTuning
from drover.server.state_store import StateStore
from drover.v1 import raft_pb2
from tests.fixtures.power_loss import PowerLossStorage

_RECORD_HEADER = 24  # length, crc32, index, term


def _journal(path: Path, store: Any = None) -> DurableJournal:
    return DurableJournal(str(path), store if store is not None else OsStorage())


def _fill(journal: DurableJournal, first: int, count: int, term: int = 1) -> None:
    for index in range(first, first + count):
        journal.add(f"command-{index}".encode(), index, term)


def _indexes_and_terms(journal: DurableJournal) -> list[tuple[int, int]]:
    return [(int(journal[i][1]), int(journal[i][2])) for i in range(len(journal))]


def _journal_that_can_lose_power(tmp_path: Path) -> tuple[Path, PowerLossStorage, DurableJournal]:
    """A fresh journal on storage that keeps un-synced writes in memory: its path, to reopen
    it after ``store.cut_power()`` drops them; the storage; the journal. Every power-loss
    test starts here, so each reads back exactly what a sync made durable."""
    path = tmp_path / "journal.bin"
    store = PowerLossStorage()
    return path, store, _journal(path, store)


def _indexes(journal: DurableJournal) -> list[int]:
    return [int(journal[i][1]) for i in range(len(journal))]


# -- power loss and group commit ------------------------------------------------------------


def test_power_loss__keeps_synced_entries__loses_the_unsynced_tail(tmp_path: Path) -> None:
    path, store, journal = _journal_that_can_lose_power(tmp_path)
    _fill(journal, 1, 5)
    assert journal.sync()
    _fill(journal, 6, 3)

    assert store.cut_power() > 0
    reopened = _journal(path)

    assert _indexes(reopened) == [1, 2, 3, 4, 5]
    assert reopened[4][0] == b"command-5"


def test_group_commit__one_sync_covers_every_entry_of_the_tick(tmp_path: Path) -> None:
    path, store, journal = _journal_that_can_lose_power(tmp_path)
    _fill(journal, 1, 200)

    assert journal.sync()
    assert not journal.sync(), "nothing new: no second sync"
    assert store.sync_calls == 1 and journal.syncs == 1
    assert store.cut_power() == 0
    assert _indexes(_journal(path)) == list(range(1, 201))


def test_power_loss__truncation_not_synced__the_old_tail_is_back(tmp_path: Path) -> None:
    """A follower's dropped conflicting tail is as durable as an append: not before a sync."""
    path, store, journal = _journal_that_can_lose_power(tmp_path)
    _fill(journal, 1, 6)
    journal.sync()
    journal.deleteEntriesFrom(3)
    _fill(journal, 4, 2, term=2)

    store.cut_power()
    assert _indexes_and_terms(_journal(path)) == [(i, 1) for i in range(1, 7)]

    journal.deleteEntriesFrom(3)
    _fill(journal, 4, 2, term=2)
    journal.sync()
    store.cut_power()
    assert _indexes_and_terms(_journal(path)) == [
        (1, 1),
        (2, 1),
        (3, 1),
        (4, 2),
        (5, 2),
    ]


def test_compaction__rewrites_durably__keeps_unsynced_entries_it_kept(tmp_path: Path) -> None:
    path, store, journal = _journal_that_can_lose_power(tmp_path)
    _fill(journal, 1, 10)
    journal.sync()
    _fill(journal, 11, 5)  # not synced yet when the compaction comes

    journal.deleteEntriesTo(8)
    store.cut_power()

    assert _indexes(_journal(path)) == list(range(9, 16))


# -- term and vote --------------------------------------------------------------------------


def test_term_and_vote__on_disk_before_set_current_term_returns(tmp_path: Path) -> None:
    path, store, journal = _journal_that_can_lose_power(tmp_path)
    journal.setCurrentTerm(7, "127.0.0.1:4001")

    store.cut_power()
    reopened = _journal(path)

    assert (reopened.getCurrentTerm(), reopened.getVotedForNodeId()) == (7, "127.0.0.1:4001")


def test_term_and_vote__file_fsynced__renamed__directory_fsynced__in_that_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    journal = _journal(tmp_path / "journal.bin")
    calls: list[tuple[str, str]] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        calls.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    def replace(src: str, dst: str) -> None:
        calls.append(("rename", f"{src} -> {dst}"))
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    journal.setCurrentTerm(3, "b")

    meta = str(tmp_path / "journal.bin.meta")
    assert calls == [
        ("fsync", meta + ".tmp"),
        ("rename", f"{meta}.tmp -> {meta}"),
        ("fsync", str(tmp_path)),
    ]


def test_term_and_vote__damaged_file__refuses_to_start(tmp_path: Path) -> None:
    path = tmp_path / "journal.bin"
    _journal(path).setCurrentTerm(4, "a")
    meta = tmp_path / "journal.bin.meta"
    blob = bytearray(meta.read_bytes())
    blob[-3] ^= 0xFF
    meta.write_bytes(bytes(blob))

    with pytest.raises(JournalCorruptError, match="checksum"):
        _journal(path)


def test_snapshot_install__received_snapshot_fsynced_before_the_log_is_cleared_for_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    journal = _journal(tmp_path / "journal.bin")
    _fill(journal, 1, 3)
    dump = tmp_path / "snapshot.pb"
    dump.write_bytes(b"a snapshot pysyncobj renamed into place, unsynced")
    journal.sync_before_clear(str(dump))
    synced: list[str] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    journal.clear()

    assert synced == [str(dump), str(tmp_path)]
    assert len(journal) == 0 and journal.dirty


# -- torn and corrupt tails -----------------------------------------------------------------


def _crafted(path: Path, count: int) -> list[int]:
    """A journal file of ``count`` records from index 1; the byte offset of each."""
    offsets, blob = [], bytearray(LOG_MAGIC)
    for index in range(1, count + 1):
        offsets.append(len(blob))
        blob += encode_record(f"command-{index}".encode(), index, 1)
    path.write_bytes(bytes(blob))
    return offsets


def _flip(blob: bytes, at: int) -> bytes:
    return blob[:at] + bytes([blob[at] ^ 0x40]) + blob[at + 1 :]


# Each damage hits record 4 of 5 (its byte offset ``at``) or record 5 (``last``).
@pytest.mark.parametrize(
    ("damage", "reason", "last_good"),
    [
        (lambda blob, at, last: blob[: last + 10], "torn record header", 4),
        (lambda blob, at, last: blob[: last + _RECORD_HEADER + 3], "torn record at index 5", 4),
        (lambda blob, at, last: _flip(blob, len(blob) - 1), "checksum mismatch", 4),
        (lambda blob, at, last: _flip(blob, at + 5), "checksum mismatch", 3),
        (lambda blob, at, last: _flip(blob, at + _RECORD_HEADER + 2), "checksum mismatch", 3),
    ],
    ids=["header-torn", "body-torn", "last-byte-flipped", "crc-flipped", "command-flipped"],
)
def test_tail__torn_or_corrupt__cut_logged_never_replayed(
    tmp_path: Path, damage: Any, reason: str, last_good: int
) -> None:
    path = tmp_path / "journal.bin"
    offsets = _crafted(path, 5)
    path.write_bytes(damage(path.read_bytes(), offsets[3], offsets[4]))

    with structlog.testing.capture_logs() as logs:
        journal = _journal(path)

    assert _indexes(journal) == list(range(1, last_good + 1))
    cuts = [e for e in logs if e["event"] == "raft.journal_tail_cut"]
    assert len(cuts) == 1 and cuts[0]["reason"] == reason and cuts[0]["last_good_index"] == last_good
    assert path.stat().st_size == offsets[last_good], "the bad tail is cut from the file"
    _fill(journal, last_good + 1, 1)
    journal.sync()
    assert _indexes(_journal(path)) == list(range(1, last_good + 2))


def test_tail__index_that_does_not_follow__cut(tmp_path: Path) -> None:
    path = tmp_path / "journal.bin"
    _crafted(path, 3)
    with path.open("ab") as f:
        f.write(encode_record(b"stray", 9, 1))

    with structlog.testing.capture_logs() as logs:
        journal = _journal(path)

    assert _indexes(journal) == [1, 2, 3]
    assert [e["reason"] for e in logs if e["event"] == "raft.journal_tail_cut"] == [
        "index 9 does not follow 3"
    ]


def test_commit_index__never_past_a_cut_tail(tmp_path: Path) -> None:
    path = tmp_path / "journal.bin"
    journal = _journal(path)
    _fill(journal, 1, 6)
    journal.setRaftCommitIndex(6)
    journal._destroy()
    blob = path.read_bytes()
    path.write_bytes(blob[:-4])

    assert _journal(path).getRaftCommitIndex() == 5


def test_not_a_journal__refused(tmp_path: Path) -> None:
    path = tmp_path / "journal.bin"
    path.write_bytes(b"something else entirely")

    with pytest.raises(JournalCorruptError):
        _journal(path)


# -- legacy format and the offline reader ---------------------------------------------------


def _command(index: int) -> bytes:
    """A pysyncobj REGULAR command carrying a drover entry, as the node journals it."""
    from pysyncobj import pickle as pysyncobj_pickle

    member = raft_pb2.ServerMemberEntry()
    member.member.name = f"s{index}"
    return b"\x00" + pysyncobj_pickle.dumps((0, (encode_entry(raft_pb2.ENTRY_TYPE_SERVER_MEMBER, member),)))


def test_legacy_journal__converted_with_its_entries_term_and_vote(tmp_path: Path) -> None:
    path = tmp_path / "journal.bin"
    legacy = FileJournal(str(path))
    for index in range(1, 5):
        legacy.add(_command(index), index, 2)
    legacy.setCurrentTerm(3, "127.0.0.1:4002")
    legacy.setRaftCommitIndex(4)
    legacy.onOneSecondTimer()
    legacy._destroy()

    with structlog.testing.capture_logs() as logs:
        journal = _journal(path)

    assert _indexes(journal) == [1, 2, 3, 4] and journal[2][0] == _command(3)
    assert (journal.getCurrentTerm(), journal.getVotedForNodeId(), journal.getRaftCommitIndex()) == (
        3,
        "127.0.0.1:4002",
        4,
    )
    assert path.read_bytes().startswith(LOG_MAGIC)
    assert any(e["event"] == "raft.journal_converted" for e in logs)
    assert [r.index for r in read_journal(str(path))] == [1, 2, 3, 4]


@pytest.mark.parametrize(
    "meta",
    [b"", b"\x80\x02cos\nsystem\nq\x00X\x04\x00\x00\x00truep\x01\x85q\x02Rq\x03."],
    ids=["empty-after-unsynced-rename", "pickled-call"],
)
def test_legacy_term_vote_file__unreadable__starts_as_pysyncobj_did_and_runs_nothing(
    tmp_path: Path, meta: bytes
) -> None:
    path = tmp_path / "journal.bin"
    legacy = FileJournal(str(path))
    legacy.add(_command(1), 1, 2)
    legacy._destroy()
    (tmp_path / "journal.bin.meta").write_bytes(meta)

    with structlog.testing.capture_logs() as logs:
        journal = _journal(path)

    assert (journal.getCurrentTerm(), journal.getVotedForNodeId()) == (0, None)
    assert _indexes(journal) == [1]
    assert any(e["event"] == "raft.legacy_term_vote_unreadable" for e in logs)


def test_offline_reader__new_format__leaves_out_a_corrupt_tail(tmp_path: Path) -> None:
    path = tmp_path / "journal.bin"
    journal = _journal(path)
    for index in range(1, 4):
        journal.add(_command(index), index, 1)
    journal._destroy()
    with path.open("ab") as f:
        f.write(struct.pack("<IIQQ", 100, 0, 4, 1) + b"half")

    records = read_journal(str(path))

    assert [(r.index, r.kind) for r in records] == [(1, "command"), (2, "command"), (3, "command")]
    assert raft_pb2.LogEntry.FromString(records[1].data).type == raft_pb2.ENTRY_TYPE_SERVER_MEMBER


# -- acks wait for the sync -----------------------------------------------------------------


class _Transport:
    def __init__(self, store: PowerLossStorage) -> None:
        self.store = store
        self.sent: list[tuple[str, int | None, int]] = []

    def send(self, _node: Any, message: Any) -> None:
        # What a power off at this moment would lose: must be nothing for an ack.
        self.sent.append((message["type"], message.get("next_node_idx"), self.store.unsynced_bytes()))


class _FakeRaft:
    """pysyncobj's side as the ack patch sees it: a tick that appends and answers."""

    def __init__(self, journal: DurableJournal, store: PowerLossStorage) -> None:
        self._SyncObj__raftLog = journal
        self._SyncObj__transport = _Transport(store)
        self._SyncObj__conf = SimpleNamespace(fullDumpFile=None)
        self.next_index = 1

    def _onTick(self, _time_to_wait: float = 0.0) -> None:
        transport = self._SyncObj__transport
        for _ in range(3):  # three append_entries in one poll
            self._SyncObj__raftLog.add(b"entry", self.next_index, 1)
            self.next_index += 1
            transport.send("leader", {"type": "next_node_idx", "next_node_idx": self.next_index})
        transport.send("leader", {"type": "append_entries"})  # not an ack: not held


def test_acks__held_until_the_tick_sync__sent_in_order(tmp_path: Path) -> None:
    store = PowerLossStorage()
    journal = _journal(tmp_path / "journal.bin", store)
    raft = _FakeRaft(journal, store)
    patches._install_durable_acks(raft)  # type: ignore[arg-type]

    raft._onTick(0.0)

    sent = raft._SyncObj__transport.sent
    unsynced = 3 * (_RECORD_HEADER + len(b"entry"))
    assert sent == [
        ("append_entries", None, unsynced),
        ("next_node_idx", 2, 0),
        ("next_node_idx", 3, 0),
        ("next_node_idx", 4, 0),
    ]
    assert journal.syncs == 1


@pytest.mark.timeout(60)
def test_raft_node__a_committed_entry_is_on_disk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A single node commits alone: its own count must come after its sync."""
    store = PowerLossStorage()
    monkeypatch.setattr("drover.server.raft.durable_journal._storage", [store])
    (port,) = pick_free_ports(1)
    node = RaftNode(f"127.0.0.1:{port}", [], FSM(StateStore()), str(tmp_path / "raft"), password="k" * 32)
    try:
        assert patches.journal_of(node) is not None
        wait_for(node.leader_ready, 30, message="a single node to lead")
        for n in range(20):
            member = raft_pb2.ServerMemberEntry()
            member.member.name = f"s{n}"
            index = node.propose(encode_entry(raft_pb2.ENTRY_TYPE_SERVER_MEMBER, member), timeout=10).index
            # The real file holds only what the journal synced.
            on_disk = [r.index for r in read_journal(str(tmp_path / "raft" / "journal.bin"))]
            assert index in on_disk, f"entry {index} acknowledged but not on disk"
    finally:
        node.close()


@pytest.mark.timeout(90)
def test_raft_node__compacted_journal__restarts_with_every_entry(tmp_path: Path) -> None:
    """Compaction rewrites the journal (``deleteEntriesTo``): a restart finds the snapshot
    and the rest of the log, nothing lost, nothing twice."""
    tuning = dataclasses.replace(RaftTuning(), compaction_min_entries=30)
    raft_dir = str(tmp_path / "raft")
    (port,) = pick_free_ports(1)
    address = f"127.0.0.1:{port}"

    def member(n: int) -> bytes:
        entry = raft_pb2.ServerMemberEntry()
        entry.member.name = f"s{n}"
        return encode_entry(raft_pb2.ENTRY_TYPE_SERVER_MEMBER, entry)

    node = RaftNode(address, [], FSM(StateStore()), raft_dir, password="k" * 32, tuning=tuning)
    try:
        wait_for(node.leader_ready, 30, message="a single node to lead")
        last = 0
        for n in range(100):
            last = node.propose(member(n), timeout=10).index
        journal = patches.journal_of(node)
        assert journal is not None
        wait_for(lambda: journal[0][1] > 1, 30, message="a compaction")
    finally:
        node.close()
    first_kept = read_journal(os.path.join(raft_dir, "journal.bin"))[0].index
    assert first_kept > 1

    again = RaftNode(address, [], FSM(StateStore()), raft_dir, password="k" * 32, tuning=tuning)
    try:
        wait_for(again.leader_ready, 30, message="the restarted node to lead")
        assert again.applied_index() >= last
        assert again.propose(member(100), timeout=10).index > last
    finally:
        again.close()
