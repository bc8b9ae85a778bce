"""The only module that imports pysyncobj: raft wiring, tuning, and snapshot hooks.

Tuning (measured on a 2-core machine, see design.md): pysyncobj's defaults batch appends
every 100 ms, so each synchronous write would cost ~100 ms. We send append_entries as soon
as a command arrives (``appendEntriesUseBatch=False``) and tick every 5 ms: ~0.4 ms commit
latency at ~10,000 commits/s on loopback. Elections use 1-2 s timeouts so a busy 2-core
machine does not flap leaders; a leader that hears from no majority for 5 s steps down.

Snapshots (log compaction) are written in drover's own protobuf format (server/snapshot.py)
from a background thread: the tick thread only takes the O(1) state-store snapshot, so
compaction never stalls raft. pysyncobj 0.3.17 has a defect (design.md): a follower
truncates its log on every append_entries whose prevLogIdx is behind its end, and when that
races with a finishing compaction the log can be emptied for good (IndexError on every
tick). Followers now take appends by Raft's rule (``_take_append_entries``,
server/raft_append.py), so they no longer truncate on stale appends; as a second guard
``_SnapshotWriter.check`` refuses to report success while the log is shorter than the
snapshot it would compact to; the compaction is retried later instead. The snapshot file
only changes together with a compaction that pysyncobj will actually perform.

The transport unpickles whatever a peer sends: a non-loopback raft bind requires a cluster
key (``password``), enforced by ``server.agent``.
"""

from __future__ import annotations

import codecs
import io
import os
import pickle
import random
import struct
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

import structlog
from pysyncobj import SyncObj, SyncObjConf, replicated
from pysyncobj.config import FAIL_REASON, SERIALIZER_STATE
from pysyncobj.journal import APP_NAME as JOURNAL_APP_NAME
from pysyncobj.journal import FIRST_RECORD_OFFSET, LAST_RECORD_OFFSET_OFFSET
from pysyncobj.monotonic import monotonic as pysyncobj_monotonic
from pysyncobj.node import TCPNode
from pysyncobj.syncobj import _COMMAND_TYPE
from pysyncobj.version import VERSION as PYSYNCOBJ_VERSION

from drover.v1 import raft_pb2
from server.errors import CommitTimeoutError, NoLeaderError, NotLeaderError, RaftError
from server.fsm import FSM, ApplyResult
from server.raft_append import plan_append
from server.snapshot import from_snapshot, to_snapshot

log = structlog.get_logger("drover.raft")

# The private attributes we read are those of this release; another release must be
# re-checked against the defects listed above before it is allowed in.
SUPPORTED_PYSYNCOBJ: Final = "0.3.17"


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
    # A follower whose TCP connection to the leader closes (the leader's process died, its
    # kernel reset the socket) calls an election within a fraction of a second instead of
    # waiting out the full 1-2 s timeout; the followers go in a fixed order, one step apart,
    # so they do not split the vote (see leader_lost_delay). A paused or cut-off leader
    # closes nothing and is caught by the timeout.
    leader_lost_first_s: float = 0.1
    leader_lost_step_s: float = 0.35
    leader_lost_jitter_s: float = 0.05


def tuned_conf(tuning: RaftTuning, *, journal_file: str, full_dump_file: str, **hooks: Any) -> SyncObjConf:
    """pysyncobj's configuration for ``tuning`` (the benchmark's bare pysyncobj uses it too,
    so "the same settings" stays true); ``hooks`` add snapshot and state callbacks."""
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


class _SnapshotWriter:
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
        self._raft: RaftNode | None = None

    def attach(self, raft: RaftNode) -> None:
        self._raft = raft

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
            with open(path, "wb") as f:
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
                log_end = self._raft.log_end_index() if self._raft is not None else self._compact_to + 1
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


_WRITTEN: Final = -1  # internal: written to disk, not yet reported


def _entry_ref(entry: Any) -> raft_pb2.RaftEntryRef:
    return raft_pb2.RaftEntryRef(command=bytes(entry[0]), index=int(entry[1]), term=int(entry[2]))


class RaftNode(SyncObj):  # type: ignore[misc]
    """One raft member whose only replicated method applies a drover ``LogEntry``."""

    def __init__(
        self,
        self_address: str,
        peers: list[str],
        fsm: FSM,
        data_dir: str,
        *,
        password: str | None = None,
        tuning: RaftTuning | None = None,
        on_state_changed: Callable[[bool], None] | None = None,
    ) -> None:
        if PYSYNCOBJ_VERSION != SUPPORTED_PYSYNCOBJ:
            raise RuntimeError(
                f"pysyncobj {PYSYNCOBJ_VERSION} is not the audited {SUPPORTED_PYSYNCOBJ}: see server/_raft.py"
            )
        tuning = tuning or RaftTuning()
        os.makedirs(data_dir, exist_ok=True)
        self._fsm = fsm
        self._on_state_changed = on_state_changed
        dump_file = os.path.join(data_dir, "snapshot.pb")
        self._writer = _SnapshotWriter(dump_file, fsm)
        conf = tuned_conf(
            tuning,
            journal_file=os.path.join(data_dir, "journal.bin"),
            full_dump_file=dump_file,
            serializer=self._writer.serialize,
            deserializer=self._writer.deserialize,
            serializeChecker=self._writer.check,
            password=password,
            onStateChanged=self._state_changed,
        )
        super().__init__(self_address, peers, conf)
        self._writer.attach(self)
        self._install_next_index_patch()
        self._install_leader_lost_election(tuning)

    def _install_next_index_patch(self) -> None:
        """Keep the leader's nextIndex for a follower from moving backwards on a late ack.

        pysyncobj advances nextIndex optimistically as it sends, but on each successful
        ack sets it to the acked position, which is behind what is already in flight. It
        then re-sends entries the follower has, and the follower (defect above) truncates
        and re-appends its log, applied entries included: wasted work, and the race that
        can empty a log during compaction. nextIndex is only a hint in Raft (a follower that
        lacks entries answers with reset=True, which still sets it exactly), so keeping the
        larger value is safe.
        """
        transport = self._SyncObj__transport
        original = self._SyncObj__onMessageReceived
        next_index: dict[Any, int] = self._SyncObj__raftNextIndex

        def on_message(node: Any, message: Any) -> None:
            kind = message.get("type")
            if kind == "apply_command" and not _forwardable(message.get("command", b"")):
                # Only member announcements are forwarded through raft. Anything else comes
                # from a deposed leader's queue (e.g. a plan its applier checked while it
                # led): appending it here would bypass this leader's plan applier.
                request_id = message.get("request_id")
                if request_id is not None:
                    transport.send(
                        node,
                        {
                            "type": "apply_command_response",
                            "request_id": request_id,
                            "error": FAIL_REASON.NOT_LEADER,
                        },
                    )
                log.warning("raft.forwarded_command_refused", peer=str(node))
                return
            if kind == "append_entries":
                self._take_append_entries(original, node, message)
                return
            if kind != "next_node_idx" or message.get("reset") or not message.get("success"):
                original(node, message)
                return
            before = next_index.get(node)
            original(node, message)
            after = next_index.get(node)
            if before is not None and after is not None and after < before:
                next_index[node] = before

        transport.setOnMessageReceivedCallback(on_message)

    def _install_leader_lost_election(self, tuning: RaftTuning) -> None:
        """Call an election soon after the leader's connection closes.

        pysyncobj notices a dead leader only when its election timeout (1-2 s, kept long
        so a busy machine does not flap) runs out. A SIGKILLed or crashed leader's kernel
        closes its sockets at once, so the followers can know within milliseconds. A leader
        that is in fact alive reconnects and its next append_entries puts the deadline back
        to the full timeout before it fires.
        """
        transport = self._SyncObj__transport
        original = self._SyncObj__onNodeDisconnected
        rng = random.Random()
        members = [str(self._SyncObj__selfNode), *(str(n) for n in self._SyncObj__otherNodes)]
        me = str(self._SyncObj__selfNode)

        def on_disconnected(node: Any) -> None:
            original(node)
            if self._isLeader() or node != self._SyncObj__raftLeader:
                return
            now = pysyncobj_monotonic()
            delay = leader_lost_delay(me, members, str(node), tuning, rng.random())
            deadline = now + delay
            if deadline < getattr(self, "_SyncObj__raftElectionDeadline"):  # noqa: B009
                setattr(self, "_SyncObj__raftElectionDeadline", deadline)  # noqa: B010
                log.info("raft.leader_connection_lost", leader=str(node), election_in_s=round(delay, 3))

        transport.setOnNodeDisconnectedCallback(on_disconnected)

    def _take_append_entries(self, original: Callable[[Any, Any], None], node: Any, message: Any) -> None:
        """Follow Raft's AppendEntries receiver rule around pysyncobj's handler (see
        server/raft_append.py): never delete entries that match the leader's, never let a
        stale message lift the commit index over entries it did not carry."""
        if (
            message.get("term", -1) < self._SyncObj__raftCurrentTerm
            or "prevLogIdx" not in message
            or "transmission" in message
        ):
            original(node, message)
            return
        raft_log = self._SyncObj__raftLog
        first_index = int(raft_log[0][1])
        last_index = int(raft_log[-1][1])

        def term_at(index: int) -> int:
            return int(raft_log[index - first_index][2])

        plan = plan_append(
            prev_index=int(message["prevLogIdx"]),
            prev_term=int(message["prevLogTerm"]),
            entries=message.get("entries") or [],
            first_index=first_index,
            last_index=last_index,
            term_at=term_at,
            applied_floor=max(self._SyncObj__raftCommitIndex, self._SyncObj__raftLastApplied),
        )
        if plan.delete_from is not None:
            log.info(
                "raft.conflicting_tail_dropped",
                peer=str(node),
                from_index=plan.delete_from,
                last_index=last_index,
                retry_from=plan.hint,
            )
            self._SyncObj__deleteEntriesFrom(plan.delete_from)
        rewritten = dict(message)
        rewritten["prevLogIdx"] = plan.prev_index
        rewritten["prevLogTerm"] = plan.prev_term
        rewritten["entries"] = list(plan.entries)
        rewritten["commit_index"] = min(int(message["commit_index"]), plan.commit_limit)
        if plan.keep_tail:
            # pysyncobj deletes whatever follows prevLogIdx; here all of it may be entries
            # this follower acknowledged. Suppress that one call (instance attribute shadows
            # the name-mangled method for the duration of this synchronous handler).
            setattr(self, "_SyncObj__deleteEntriesFrom", _keep_log)  # noqa: B010
            try:
                original(node, rewritten)
            finally:
                delattr(self, "_SyncObj__deleteEntriesFrom")
        else:
            original(node, rewritten)
        if plan.hint is not None:
            self._SyncObj__transport.send(
                node, {"type": "next_node_idx", "next_node_idx": plan.hint, "reset": True, "success": False}
            )

    @replicated  # type: ignore[untyped-decorator]
    def apply_entry(self, data: bytes) -> ApplyResult:
        # Entries are contiguous: the one being applied is the one after the last applied.
        return self._fsm.apply(data, self.raftLastApplied + 1)

    # -- proposing ---------------------------------------------------------------------
    def propose(self, data: bytes, timeout: float) -> ApplyResult:
        """Append ``data`` to the log on this leader and wait until it is applied here."""
        if not self._isLeader():
            raise NotLeaderError(self.leader_address())
        done = threading.Event()
        box: list[Any] = [None, None]

        def on_result(result: Any, error: int) -> None:
            box[0], box[1] = result, error
            done.set()

        self.apply_entry(data, callback=on_result)
        if not done.wait(timeout):
            raise CommitTimeoutError(f"not committed within {timeout:.1f}s; the write may still apply")
        result, error = box
        if error == FAIL_REASON.SUCCESS:
            assert isinstance(result, ApplyResult)
            return result
        if error in (FAIL_REASON.MISSING_LEADER, FAIL_REASON.NOT_LEADER, FAIL_REASON.DISCARDED):
            raise NoLeaderError(f"leadership changed before commit ({_FAIL_NAMES.get(error, error)})")
        if error == FAIL_REASON.QUEUE_FULL:
            raise NoLeaderError("raft queue full, retry")
        raise RaftError(f"raft refused the write ({_FAIL_NAMES.get(error, error)})")

    def propose_async(self, data: bytes, on_done: Callable[[ApplyResult | None, str], None]) -> None:
        """Append ``data`` without waiting; ``on_done(result, error)`` runs on raft's thread."""
        if not self._isLeader():
            on_done(None, "not the leader")
            return

        def on_result(result: Any, error: int) -> None:
            if error == FAIL_REASON.SUCCESS:
                on_done(result, "")
            else:
                on_done(None, str(_FAIL_NAMES.get(error, error)))

        self.apply_entry(data, callback=on_result)

    # -- status ------------------------------------------------------------------------
    def is_leader(self) -> bool:
        return bool(self._isLeader())

    def leader_ready(self) -> bool:
        """Leader, and every entry of earlier terms is applied here (our no-op committed)."""
        if not self._isLeader():
            return False
        noop = self._SyncObj__noopIDx
        return noop is not None and self.raftLastApplied >= noop

    def leader_address(self) -> str | None:
        leader = self._getLeader()
        return None if leader is None else str(leader.id)

    def self_address(self) -> str:
        return str(self.selfNode.id)

    def peers(self) -> list[tuple[str, bool]]:
        """(raft address, connected) for every other member."""
        return [(str(n.id), bool(self.isNodeConnected(n))) for n in sorted(self.otherNodes, key=str)]

    def term(self) -> int:
        return int(self.raftCurrentTerm)

    def commit_index(self) -> int:
        return int(self.raftCommitIndex)

    def applied_index(self) -> int:
        return int(self.raftLastApplied)

    def log_end_index(self) -> int:
        return int(self._SyncObj__getCurrentLogIndex())

    def _state_changed(self, old: int, new: int) -> None:
        if self._on_state_changed is not None:
            self._on_state_changed(new == 2)

    def close(self) -> None:
        self.destroy()
        thread = self._SyncObj__thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5)


# ---------------------------------------------------------------------------------------
# Reading a stopped server's raft files (the offline operator tools, server/raft_tools.py)

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
    """The journal file is not one pysyncobj wrote, or it is damaged."""


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


def leader_lost_delay(me: str, members: list[str], lost_leader: str, tuning: RaftTuning, u: float) -> float:
    """How long this follower waits before its election after the leader's socket closed.

    All followers see the close at the same moment; random short deadlines within a few
    hundred ms still collide on a loaded machine (two candidates split the vote, and the
    retry costs a full 1-2 s timeout). So the survivors go in address order, one
    ``leader_lost_step_s`` apart: the first usually wins before the second starts, and the
    second runs only if the first is down too or its log is behind (refused votes do not
    reset the others' deadlines). ``u`` in [0, 1) adds a little jitter.
    """
    survivors = sorted(m for m in members if m != lost_leader)
    rank = survivors.index(me) if me in survivors else len(survivors)
    return tuning.leader_lost_first_s + rank * tuning.leader_lost_step_s + u * tuning.leader_lost_jitter_s


def _keep_log(_from_index: int) -> None:
    """Stands in for pysyncobj's log truncation when the message's tail must be kept."""


def _forwardable(command: bytes) -> bool:
    """Whether a command forwarded by a follower may be appended: member announcements only."""
    if not command or command[0] != _COMMAND_TYPE.REGULAR:
        return True  # pysyncobj's own commands (no-ops, membership) are not ours to judge
    try:
        entry = raft_pb2.LogEntry.FromString(_command_bytes(command[1:]))
    except Exception:
        return False
    return entry.type == raft_pb2.ENTRY_TYPE_SERVER_MEMBER


def _command_bytes(raw: bytes) -> bytes:
    value = _CommandUnpickler(io.BytesIO(raw)).load()
    if isinstance(value, tuple) and len(value) == 2 and isinstance(value[1], tuple) and len(value[1]) == 1:
        data = value[1][0]
        if isinstance(data, bytes):
            return data
    raise JournalError("a command entry that is not drover's apply_entry(bytes)")


def read_journal(path: str) -> list[JournalRecord]:
    """Every entry of a pysyncobj ``FileJournal``, read-only (pysyncobj's own reader would
    open the file for writing and grow it)."""
    with open(path, "rb") as f:
        blob = f.read()
    if len(blob) < FIRST_RECORD_OFFSET or not blob.startswith(JOURNAL_APP_NAME):
        raise JournalError(f"{path}: not a pysyncobj journal")
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
        command = body[16:]
        kind = _RECORD_KINDS.get(command[0], RECORD_UNKNOWN) if command else RECORD_UNKNOWN
        data = command[1:]
        if kind == RECORD_COMMAND:
            try:
                data = _command_bytes(data)
            except (pickle.UnpicklingError, JournalError, EOFError, ValueError) as exc:
                raise JournalError(f"{path}: entry {index}: {exc}") from exc
        records.append(JournalRecord(index=index, term=term, kind=kind, data=data))
        offset += size + 8
    return records


def read_snapshot_file(path: str) -> raft_pb2.RaftSnapshotFile | None:
    """The raft snapshot (``snapshot.pb``), or None if the server never wrote one."""
    try:
        with open(path, "rb") as f:
            return raft_pb2.RaftSnapshotFile.FromString(f.read())
    except FileNotFoundError:
        return None


_FAIL_NAMES: Final = {
    value: name
    for name, value in vars(FAIL_REASON).items()
    if not name.startswith("_") and isinstance(value, int)
}
