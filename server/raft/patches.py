"""Every change drover makes to pysyncobj's behaviour, and every private name it touches.

pysyncobj 0.3.17 is pinned: the names below are private to that release, so ``RaftNode``
refuses any other (``check_version``), and a new release must be re-checked against the
defects in docs/design.md ("Defects found") before it is allowed in. Nothing outside this
module names a private attribute of ``SyncObj`` (tests/unit/test_raft_patches.py checks
that, and that this table names exactly the private names the code below uses).

Patches, installed by ``install`` right after ``SyncObj.__init__``:

| patch | why | private names |
|---|---|---|
| refuse forwarded commands (``forwardable``) | a deposed leader's queue can still hold a plan its applier checked; appended by the new leader it would bypass that leader's plan applier, so only member announcements are accepted | ``_SyncObj__onMessageReceived`` (wrapped), ``_SyncObj__transport`` (send the refusal) |
| append entries by Raft's rule (``_take_append_entries``, server/raft/append.py) | a follower truncates on every stale append, re-applying entries and briefly losing acknowledged ones; with compaction this emptied logs for good | ``_SyncObj__raftCurrentTerm``, ``_SyncObj__raftLog``, ``_SyncObj__raftCommitIndex``, ``_SyncObj__raftLastApplied`` (read), ``_SyncObj__deleteEntriesFrom`` (called, and shadowed on the instance for one call), ``_SyncObj__transport`` (send the retry hint) |
| keep the leader's next index (``_install_message_hook``) | late acks set a follower's next index behind what is in flight, so the leader re-sends entries the follower holds | ``_SyncObj__raftNextIndex`` |
| leader-confirmed reads (``_install_message_hook``, server/raft/read_confirm.py) | a deposed leader must not answer a default read: a probe follows each append to a follower while a read waits, and the follower acks it while the probe's term is its own | ``_SyncObj__transport`` (its ``send`` wrapped on the instance; the follower's ack), ``_SyncObj__raftCurrentTerm`` (read) |
| time appends (``_install_message_hook``) | ``drover_raft_append_seconds``: from the leader's oldest unanswered append to a follower until its answer, as Nomad's appendEntries timer | ``_SyncObj__transport`` (its ``send`` wrapped on the instance) |
| elect soon after the leader's socket closes (``_install_leader_lost_election``) | pysyncobj waits out its 1-2 s election timeout even when the leader's kernel closed its sockets at once | ``_SyncObj__onNodeDisconnected`` (wrapped), ``_SyncObj__transport``, ``_SyncObj__selfNode``, ``_SyncObj__otherNodes``, ``_SyncObj__raftLeader`` (read), ``_SyncObj__raftElectionDeadline`` (moved earlier) |
| batches stop before the entry that would take them over the batch size (``_install_bounded_batches``) | pysyncobj sends the entry that crosses the batch size along with the batch, so a message could be the batch size plus one whole entry, over the frame bound below: the follower would never catch up | ``_SyncObj__getEntries`` (shadowed on the instance) |
| durable journal (``install_durable_journal``, on the ``pysyncobj.syncobj`` module, once per process) | pysyncobj's ``FileJournal`` never syncs its mmap or its term/vote file and has no checksums; ``createJournal`` (the module function ``SyncObj.__init__`` calls) is replaced so a node with a journal file gets server/raft/durable_journal.py's ``DurableJournal`` | none (``createJournal`` is a public module function) |
| acknowledge only what is on disk (``_install_durable_acks``) | one ``fdatasync`` at the end of every tick covers every entry that tick appended (group commit); until it returns, every ``next_node_idx`` (a follower's ack, or its retry hint, kept in order) is held, and the leader's own count happens in the next tick's commit loop, after that sync | ``_SyncObj__raftLog``, ``_SyncObj__conf`` (read: the dump file a received snapshot is renamed to, fsynced before the log is cleared for it), ``_SyncObj__transport`` (its ``send`` wrapped on the instance), ``_onTick`` (wrapped on the instance) |
| bounded, checked frames (``install_frame_guard``, on the ``TcpConnection`` class, once per process) | pysyncobj buffers whatever length a peer declares before checking anything (a 64 MiB frame from a socket deposed a leader) and drops bad frames silently; here a declared length over the bound (``frames.frame_limit``, or ``frames.HANDSHAKE_FRAME_BYTES`` before the session keys are exchanged) closes the connection before more is buffered, the seal is checked before anything is decompressed or unpickled, and every refusal is logged, once per peer address per minute | ``_TcpConnection__processRead``, ``_TcpConnection__processParseMessage`` (replaced), ``_TcpConnection__socket``, ``_TcpConnection__recvBufferSize``, ``_TcpConnection__readBuffer`` |
| AES-GCM seal where the peer offers it (``install_frame_guard`` too; server/raft/seal.py) | Fernet's per-frame AES-CBC, HMAC and base64 were a quarter of the tick thread at one writer; a node offers GCM in the session key it sends (``recvRandKey`` becomes a property that appends the offer), seals with GCM for a peer that offered it and with Fernet for one that did not (an older release), and opens both; ``getEncryptor`` (the module function ``SyncObj.__init__`` calls) is wrapped to keep the GCM key beside the Fernet one | ``_TcpConnection__writeBuffer``, ``_TcpConnection__trySendBuffer`` (``send`` replaced) |

Outside pysyncobj, at import:

| patch | why | private names |
|---|---|---|
| ``socket.inet_ntop`` restored (``_restore_inet_ntop``) | importing pysyncobj (``win_inet_pton``) replaces it on every OS with a Windows-only stand-in that raises ``TypeError``, so in any process that imported raft, psutil's connection list (and anything else formatting an address) failed | none |

Reads, which change nothing:

| read | why | private names |
|---|---|---|
| ``noop_index`` | a leader serves reads only once its no-op of this term is applied | ``_SyncObj__noopIDx`` |
| ``log_end_index`` | the snapshot writer's guard: never compact past the log's end | ``_SyncObj__getCurrentLogIndex`` |
| ``tick_thread`` | ``RaftNode.close`` joins the tick thread | ``_SyncObj__thread`` |
| ``hurry_appends`` (a write, of a deadline only) | a read waiting for its confirmation gets the next appends (and probes) at the next tick, not at the next heartbeat | ``_SyncObj__newAppendEntriesTime`` |
| ``last_contact_ages`` | the leader's last contact per follower, a metric (server/telemetry/metrics.py) | ``_SyncObj__lastResponseTime`` |
| pysyncobj's command types (server/raft/journal.py) | the journal and forwarded commands start with a type byte | ``_COMMAND_TYPE`` (from ``pysyncobj.syncobj``) |

``_isLeader`` and ``_getLeader`` are not listed: they are single-underscore methods with
docstrings, pysyncobj's own way to ask who leads, and not name-mangled.
"""

from __future__ import annotations

import _socket
import errno
import os
import random
import socket
import struct
import time
import weakref
import zlib
from collections.abc import Callable
from typing import Any, Final

import structlog
from cryptography.fernet import InvalidToken
from pysyncobj import SyncObj
from pysyncobj import pickle as pysyncobj_pickle
from pysyncobj import syncobj as pysyncobj_syncobj
from pysyncobj.config import FAIL_REASON
from pysyncobj.encryptor import getEncryptor as pysyncobj_getEncryptor
from pysyncobj.journal import MemoryJournal
from pysyncobj.monotonic import monotonic as pysyncobj_monotonic
from pysyncobj.syncobj import _COMMAND_TYPE
from pysyncobj.tcp_connection import TcpConnection
from pysyncobj.version import VERSION as PYSYNCOBJ_VERSION

from drover.server.raft import seal
from drover.server.raft.append import plan_append
from drover.server.raft.durable_journal import DurableJournal
from drover.server.raft.frames import HANDSHAKE_FRAME_BYTES, RejectLog, batch_length
from drover.server.raft.journal import command_bytes
from drover.server.raft.read_confirm import ACK, PROBE, ReadConfirmations, answer_probe
from drover.server.raft.tuning import RaftTuning
from drover.server.telemetry.metrics import RAFT_APPEND_SECONDS
from drover.v1 import raft_pb2

__all__ = [
    "SUPPORTED_PYSYNCOBJ",
    "check_version",
    "forwardable",
    "frame_limit_installed",
    "hurry_appends",
    "install",
    "install_durable_journal",
    "install_frame_guard",
    "journal_of",
    "leader_lost_delay",
    "log_end_index",
    "noop_index",
    "tick_thread",
]

log = structlog.get_logger("drover.raft")


def _restore_inet_ntop() -> None:
    """Undo pysyncobj's import-time replacement of ``socket.inet_ntop`` (table above)."""
    socket.inet_ntop = _socket.inet_ntop


_restore_inet_ntop()

# The private attributes we read are those of this release; another release must be
# re-checked against the defects in docs/design.md before it is allowed in.
SUPPORTED_PYSYNCOBJ: Final = "0.3.17"


def check_version() -> None:
    if PYSYNCOBJ_VERSION != SUPPORTED_PYSYNCOBJ:
        raise RuntimeError(
            f"pysyncobj {PYSYNCOBJ_VERSION} is not the audited {SUPPORTED_PYSYNCOBJ}: see server/raft/patches.py"
        )


def install(raft: SyncObj, tuning: RaftTuning, reads: ReadConfirmations | None = None) -> None:
    """Every per-node patch in the table above, on a node whose ``SyncObj.__init__`` has run
    (``install_frame_guard`` and ``install_durable_journal`` must run before it: connections
    open, and the journal is read, during ``__init__``)."""
    _install_durable_acks(raft)
    _install_message_hook(raft, reads)
    _install_leader_lost_election(raft, tuning)
    _install_bounded_batches(raft)


# ---------------------------------------------------------------------------------------
# Reads


def noop_index(raft: SyncObj) -> int | None:
    """The index of this leader's no-op for its term (None before it is appended)."""
    noop: int | None = raft._SyncObj__noopIDx
    return noop


def log_end_index(raft: SyncObj) -> int:
    return int(raft._SyncObj__getCurrentLogIndex())


def hurry_appends(raft: SyncObj) -> None:
    """Have the tick thread send appends (and read probes) at its next tick. Written from
    a reader's thread: one deadline, which the tick thread at worst overwrites with the
    next heartbeat's, so a read then waits that one heartbeat more."""
    raft._SyncObj__newAppendEntriesTime = 0


def tick_thread(raft: SyncObj) -> Any:
    """pysyncobj's auto-tick thread (None once destroyed or before it starts)."""
    return raft._SyncObj__thread


def last_contact_ages(raft: SyncObj) -> dict[str, float]:
    """On the leader: seconds since each follower (by raft address) last answered an append;
    pysyncobj stamps this dict on every append response, with its own clock."""
    times: dict[Any, float] = dict(raft._SyncObj__lastResponseTime)
    now = pysyncobj_monotonic()
    return {str(node.id): max(0.0, now - float(at)) for node, at in times.items()}


# ---------------------------------------------------------------------------------------
# Durable journal and acks


def install_durable_journal() -> None:
    """Make every ``SyncObj`` of this process with a journal file use ``DurableJournal``
    (without one, pysyncobj's in-memory journal, as before). Idempotent."""
    if pysyncobj_syncobj.createJournal is _create_journal:
        return
    pysyncobj_syncobj.createJournal = _create_journal


def _create_journal(journal_file: str | None = None) -> Any:
    if journal_file is None:
        return MemoryJournal()
    return DurableJournal(journal_file)


def journal_of(raft: SyncObj) -> DurableJournal | None:
    """The node's durable journal (None for an in-memory one)."""
    journal = raft._SyncObj__raftLog
    return journal if isinstance(journal, DurableJournal) else None


def _install_durable_acks(raft: SyncObj) -> None:
    """Sync the journal once per tick, and hold acks until the entries they cover are synced.

    pysyncobj's tick (``_onTick``) counts the leader's quorum first, then appends queued
    commands, then polls the sockets, where a follower appends and answers each
    append_entries at once. Syncing after the whole tick makes one ``fdatasync`` cover every
    entry of the tick, on leader and follower alike; the leader's own entries are then on
    disk before the next tick counts it. A follower's answers (``next_node_idx``) written
    while the journal is dirty wait for that sync, all of them, so they stay in order.
    A failed sync ends the process: after an fsync error the kernel may have dropped the
    pages, and a later sync that succeeds would prove nothing (PostgreSQL's "fsyncgate").
    """
    journal = journal_of(raft)
    if journal is None:
        return
    dump_file = raft._SyncObj__conf.fullDumpFile
    if dump_file is not None:
        journal.sync_before_clear(dump_file)
    transport = raft._SyncObj__transport
    original_send = transport.send
    held: list[tuple[Any, Any]] = []

    def send(node: Any, message: Any) -> Any:
        if isinstance(message, dict) and message.get("type") == "next_node_idx" and (journal.dirty or held):
            held.append((node, message))
            return None
        return original_send(node, message)

    transport.send = send
    original_tick = raft._onTick

    def on_tick(time_to_wait: float = 0.0) -> None:
        try:
            original_tick(time_to_wait)
        finally:
            try:
                journal.sync()
            except OSError:
                log.critical("raft.journal_sync_failed", exc_info=True)
                os._exit(70)  # EX_SOFTWARE: nothing after a failed fsync can be trusted
            released = held[:]
            held.clear()
            for node, message in released:
                original_send(node, message)

    raft._onTick = on_tick


# ---------------------------------------------------------------------------------------
# Message hook: forwarded commands, append entries, next index


def _install_message_hook(raft: SyncObj, reads: ReadConfirmations | None = None) -> None:
    """Route pysyncobj's incoming messages through the three message patches.

    Keep the leader's nextIndex for a follower from moving backwards on a late ack:
    pysyncobj advances nextIndex optimistically as it sends, but on each successful ack
    sets it to the acked position, which is behind what is already in flight. It then
    re-sends entries the follower has, and the follower (defect in server/raft/append.py)
    truncates and re-appends its log, applied entries included: wasted work, and the race
    that can empty a log during compaction. nextIndex is only a hint in Raft (a follower
    that lacks entries answers with reset=True, which still sets it exactly), so keeping
    the larger value is safe.
    """
    transport = raft._SyncObj__transport
    original = raft._SyncObj__onMessageReceived
    next_index: dict[Any, int] = raft._SyncObj__raftNextIndex
    # The term and send time of each follower's oldest unanswered append (the tick thread
    # alone sends and receives, so no lock). One left unanswered by an earlier term (the
    # leader was deposed before the answer) is replaced, not timed.
    append_sent: dict[Any, tuple[Any, float]] = {}
    original_send = transport.send

    def _send(node: Any, message: Any) -> Any:
        if isinstance(message, dict) and message.get("type") == "append_entries":
            term = message.get("term")
            pending = append_sent.get(node)
            if pending is None or pending[0] != term:
                append_sent[node] = (term, time.perf_counter())
            sent = original_send(node, message)
            probe = (
                reads.probe_for(str(node.id), term) if reads is not None and isinstance(term, int) else None
            )
            if probe is not None:
                original_send(node, probe)  # after the append, on the same connection
            return sent
        return original_send(node, message)

    transport.send = _send

    def _on_message(peer: Any, message: Any) -> None:
        kind = message.get("type")
        if kind == PROBE:
            answer = answer_probe(message, int(raft._SyncObj__raftCurrentTerm))
            if answer is not None:
                transport.send(peer, answer)
            return
        if kind == ACK:
            if reads is not None:
                reads.on_ack(str(peer.id), message)
            return
        if kind == "next_node_idx":
            pending = append_sent.pop(peer, None)
            if pending is not None:
                RAFT_APPEND_SECONDS.observe(time.perf_counter() - pending[1])
        if kind == "apply_command" and not forwardable(message.get("command", b"")):
            # Only member announcements are forwarded through raft. Anything else comes
            # from a deposed leader's queue (e.g. a plan its applier checked while it
            # led): appending it here would bypass this leader's plan applier.
            request_id = message.get("request_id")
            if request_id is not None:
                transport.send(
                    peer,
                    {
                        "type": "apply_command_response",
                        "request_id": request_id,
                        "error": FAIL_REASON.NOT_LEADER,
                    },
                )
            log.warning("raft.forwarded_command_refused", peer=str(peer))
            return
        if kind == "append_entries":
            _take_append_entries(raft, original, peer, message)
            return
        if kind != "next_node_idx" or message.get("reset") or not message.get("success"):
            original(peer, message)
            return
        before = next_index.get(peer)
        original(peer, message)
        after = next_index.get(peer)
        if before is not None and after is not None and after < before:
            next_index[peer] = before

    transport.setOnMessageReceivedCallback(_on_message)


def forwardable(command: bytes) -> bool:
    """Whether a command forwarded by a follower may be appended: member announcements only."""
    if not command or command[0] != _COMMAND_TYPE.REGULAR:
        return True  # pysyncobj's own commands (no-ops, membership) are not ours to judge
    try:
        entry = raft_pb2.LogEntry.FromString(command_bytes(command[1:]))
    except Exception:
        return False
    return entry.type == raft_pb2.ENTRY_TYPE_SERVER_MEMBER


def _take_append_entries(
    raft: SyncObj, original: Callable[[Any, Any], None], peer: Any, message: Any
) -> None:
    """Follow Raft's AppendEntries receiver rule around pysyncobj's handler (see
    server/raft/append.py): never delete entries that match the leader's, never let a
    stale message lift the commit index over entries it did not carry."""
    if (
        message.get("term", -1) < raft._SyncObj__raftCurrentTerm
        or "prevLogIdx" not in message
        or "transmission" in message
    ):
        original(peer, message)
        return
    raft_log = raft._SyncObj__raftLog
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
        applied_floor=max(raft._SyncObj__raftCommitIndex, raft._SyncObj__raftLastApplied),
    )
    if plan.delete_from is not None:
        log.info(
            "raft.conflicting_tail_dropped",
            peer=str(peer),
            from_index=plan.delete_from,
            last_index=last_index,
            retry_from=plan.hint,
        )
        raft._SyncObj__deleteEntriesFrom(plan.delete_from)
    rewritten = dict(message)
    rewritten["prevLogIdx"] = plan.prev_index
    rewritten["prevLogTerm"] = plan.prev_term
    rewritten["entries"] = list(plan.entries)
    rewritten["commit_index"] = min(int(message["commit_index"]), plan.commit_limit)
    if plan.keep_tail:
        # pysyncobj deletes whatever follows prevLogIdx; here all of it may be entries
        # this follower acknowledged. Suppress that one call (instance attribute shadows
        # the name-mangled method for the duration of this synchronous handler).
        raft._SyncObj__deleteEntriesFrom = _keep_log
        try:
            original(peer, rewritten)
        finally:
            del raft._SyncObj__deleteEntriesFrom
    else:
        original(peer, rewritten)
    if plan.hint is not None:
        raft._SyncObj__transport.send(
            peer, {"type": "next_node_idx", "next_node_idx": plan.hint, "reset": True, "success": False}
        )


def _keep_log(_from_index: int) -> None:
    """Stands in for pysyncobj's log truncation when the message's tail must be kept."""


# ---------------------------------------------------------------------------------------
# Leader-lost election


def _install_leader_lost_election(raft: SyncObj, tuning: RaftTuning) -> None:
    """Call an election soon after the leader's connection closes.

    pysyncobj notices a dead leader only when its election timeout (1-2 s, kept long
    so a busy machine does not flap) runs out. A SIGKILLed or crashed leader's kernel
    closes its sockets at once, so the followers can know within milliseconds. A leader
    that is in fact alive reconnects and its next append_entries puts the deadline back
    to the full timeout before it fires.
    """
    transport = raft._SyncObj__transport
    original = raft._SyncObj__onNodeDisconnected
    rng = random.Random()
    members = [str(raft._SyncObj__selfNode), *(str(n) for n in raft._SyncObj__otherNodes)]
    me = str(raft._SyncObj__selfNode)

    def on_disconnected(peer: Any) -> None:
        original(peer)
        if raft._isLeader() or peer != raft._SyncObj__raftLeader:
            return
        now = pysyncobj_monotonic()
        delay = leader_lost_delay(me, members, str(peer), tuning, rng.random())
        deadline = now + delay
        if deadline < raft._SyncObj__raftElectionDeadline:
            raft._SyncObj__raftElectionDeadline = deadline
            log.info("raft.leader_connection_lost", leader=str(peer), election_in_s=round(delay, 3))

    transport.setOnNodeDisconnectedCallback(on_disconnected)


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


# ---------------------------------------------------------------------------------------
# Bounded batches


def _install_bounded_batches(raft: SyncObj) -> None:
    """Cut every append_entries batch so its pickled entries fit in the batch size.

    pysyncobj's ``__getEntries`` keeps the entry that crosses ``maxSizeBytes``, so a batch
    could carry the batch size plus one whole entry: a frame over the bound followers
    accept, which they would drop on every retry and never catch up. Only the leader's
    send path passes ``maxSizeBytes``; every other call is left exactly as it was.
    """
    original = raft._SyncObj__getEntries

    def get_entries(from_index: Any, count: Any = None, max_size_bytes: Any = None) -> Any:
        entries = original(from_index, count)
        if max_size_bytes is None:
            return entries
        return entries[: batch_length((len(entry[0]) for entry in entries), int(max_size_bytes))]

    raft._SyncObj__getEntries = get_entries


# ---------------------------------------------------------------------------------------
# Frame guard

# pysyncobj's frame header: a native 4-byte signed length.
_LENGTH: Final = struct.Struct("i")
_rejections: Final = RejectLog()
# The bound for established sessions: the largest any node of this process was given.
_frame_limit = [0]


def install_frame_guard(limit: int) -> None:
    """Bound and check every raft frame this process reads, and seal with AES-GCM where
    the peer offers it (server/raft/seal.py), on pysyncobj's one connection class (every
    connection, in or out, is a ``TcpConnection``). Idempotent."""
    _frame_limit[0] = max(_frame_limit[0], limit)
    if TcpConnection.__dict__.get("_TcpConnection__processRead") is _read_bounded:
        return
    TcpConnection._TcpConnection__processRead = _read_bounded
    TcpConnection._TcpConnection__processParseMessage = _parse_checked
    TcpConnection.send = _send_sealed
    TcpConnection.recvRandKey = property(_own_session_key, _set_own_session_key)
    pysyncobj_syncobj.getEncryptor = _get_encryptor


# The cluster's GCM key of each Fernet key pysyncobj made (one per node: its raft key).
_gcm_keys: Final[weakref.WeakKeyDictionary[Any, bytes]] = weakref.WeakKeyDictionary()


def _get_encryptor(password: str | bytes) -> Any:
    """pysyncobj's ``getEncryptor``, remembering the GCM key that goes with the Fernet one."""
    fernet = pysyncobj_getEncryptor(password)
    _gcm_keys[fernet] = seal.cluster_key(password)
    return fernet


def _own_session_key(conn: Any) -> Any:
    return conn.__dict__.get("_drover_recv_key")


def _set_own_session_key(conn: Any, value: Any) -> None:
    """pysyncobj makes this side's session key (``os.urandom(32)``) and sends it: with the
    offer appended, the peer learns that this node opens GCM (server/raft/seal.py)."""
    if isinstance(value, bytes) and len(value) == seal.SESSION_KEY_BYTES:
        value = seal.with_offer(value)
    conn.__dict__["_drover_recv_key"] = value


def _session(conn: Any, attr: str, session_key: Any, *, offered_only: bool = False) -> seal.Session | None:
    """The GCM state of one direction of ``conn``, keyed on ``session_key``: the one kept
    on the connection while its session key holds (every frame after the first takes this
    way), else made now. None when the node has no GCM key (no raft key), the session key
    is unset, or, with ``offered_only``, the key does not offer GCM (an older peer)."""
    current: seal.Session | None = conn.__dict__.get(attr)
    if current is not None and current.session_key == session_key:
        return current
    if offered_only and not seal.offered(session_key):
        return None
    key = _gcm_keys.get(conn.encryptor) if conn.encryptor is not None else None
    if key is None or not isinstance(session_key, bytes):
        return None
    current = conn.__dict__[attr] = seal.Session(key, session_key)
    return current


def _send_sealed(conn: Any, message: Any) -> None:
    """pysyncobj's ``TcpConnection.send``, sealing with GCM for a peer that offered it."""
    if conn.sendRandKey:
        message = (conn.sendRandKey, message)
    data = zlib.compress(pysyncobj_pickle.dumps(message), 3)
    if conn.encryptor:
        outgoing = _session(conn, "_drover_send_seal", conn.sendRandKey, offered_only=True)
        if outgoing is not None:
            data = outgoing.seal(data)
        else:
            data = conn.encryptor.encrypt_at_time(data, int(pysyncobj_monotonic()))
    conn._TcpConnection__writeBuffer += _LENGTH.pack(len(data)) + data
    conn._TcpConnection__trySendBuffer()


def frame_limit_installed() -> int:
    """The bound established sessions get in this process (0 before ``install_frame_guard``)."""
    return _frame_limit[0]


def _read_bounded(conn: Any) -> bool:
    """pysyncobj's read step, bounded: read once, then stop (return False) as soon as the
    buffer holds one whole frame, and close the connection as soon as a header declares
    more than the bound. pysyncobj reads until the socket is drained, so a peer that keeps
    sending grew the buffer (by copying it, every 64 KiB) without limit."""
    sock = conn._TcpConnection__socket
    try:
        incoming = sock.recv(conn._TcpConnection__recvBufferSize)
    except OSError as exc:
        if exc.errno not in (errno.EAGAIN, errno.EWOULDBLOCK):
            conn.disconnect()
        return False
    if sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) or not incoming:
        conn.disconnect()
        return False
    buffer = conn._TcpConnection__readBuffer
    if not isinstance(buffer, bytearray):  # pysyncobj resets it to bytes() on (re)connect
        buffer = conn._TcpConnection__readBuffer = bytearray(buffer)
    buffer += incoming
    if len(buffer) < _LENGTH.size:
        return True
    declared = _declared_length(conn, buffer)
    return declared is not None and len(buffer) < _LENGTH.size + declared


def _parse_checked(conn: Any) -> Any:
    """pysyncobj's frame parser, with nothing decompressed or unpickled before the seal
    (AES-GCM's tag, or Fernet's HMAC-SHA256, with the cluster key) is verified, and every
    refusal logged.
    None when there is no whole frame yet, or the connection was closed."""
    buffer = conn._TcpConnection__readBuffer
    if len(buffer) < _LENGTH.size:
        return None
    if not isinstance(buffer, bytearray):
        buffer = conn._TcpConnection__readBuffer = bytearray(buffer)
    declared = _declared_length(conn, buffer)
    if declared is None or len(buffer) < _LENGTH.size + declared:
        return None
    data = bytes(buffer[_LENGTH.size : _LENGTH.size + declared])
    del buffer[: _LENGTH.size + declared]
    encryptor = conn.encryptor
    if encryptor is not None and seal.is_sealed(data):
        incoming = _session(conn, "_drover_recv_seal", conn.recvRandKey)
        if incoming is None:
            _refuse(conn, "not sealed with this cluster's raft key", frame_bytes=declared)
            return None
        try:
            data = incoming.open(data)  # the tag is checked before anything is decrypted
        except seal.SealError as exc:
            _refuse(conn, str(exc), frame_bytes=declared)
            return None
    elif encryptor is not None:
        try:
            # Fernet checks the HMAC here, and again in decrypt, before it decrypts.
            timestamp = encryptor.extract_timestamp(data)
            data = encryptor.decrypt(data)
        except (InvalidToken, TypeError, ValueError):
            _refuse(conn, "not sealed with this cluster's raft key", frame_bytes=declared)
            return None
        if timestamp < conn.recvLastTimestamp:
            _refuse(conn, "replayed or reordered frame", frame_bytes=declared)
            return None
        conn.recvLastTimestamp = timestamp
    try:
        message = pysyncobj_pickle.loads(zlib.decompress(data))
    except Exception:  # a key holder's garbage: the same refusal, whatever the decoder raised
        _refuse(conn, "sealed but undecodable", frame_bytes=declared)
        return None
    if conn.recvRandKey:
        # Each session key is fresh per connection: a frame replayed from another carries
        # the wrong one.
        if not (isinstance(message, tuple) and len(message) == 2 and message[0] == conn.recvRandKey):
            _refuse(conn, "frame from another session", frame_bytes=declared)
            return None
        message = message[1]
    return message


def _declared_length(conn: Any, buffer: bytearray) -> int | None:
    """The next frame's declared length; None, the connection closed, if over the bound.

    Before the session keys are exchanged the only frame is a sealed 32-byte key, so a
    peer without the cluster key never gets more than ``HANDSHAKE_FRAME_BYTES`` buffered.
    """
    (declared,) = _LENGTH.unpack_from(buffer, 0)
    established = conn.encryptor is None or bool(conn.sendRandKey)
    limit = _frame_limit[0] if established else HANDSHAKE_FRAME_BYTES
    if 0 <= declared <= limit:
        return int(declared)
    _refuse(conn, "frame over the size bound", frame_bytes=declared, limit_bytes=limit)
    return None


def _refuse(conn: Any, reason: str, **fields: int) -> None:
    """Close the connection; log it unless this peer address was logged within the minute."""
    peer = _peer_host(conn)
    suppressed = _rejections.admit(peer, pysyncobj_monotonic())
    conn.disconnect()
    if suppressed is not None:
        log.warning(
            "raft.frame_refused", peer=peer, reason=reason, suppressed_since_last=suppressed, **fields
        )


def _peer_host(conn: Any) -> str:
    try:
        return str(conn._TcpConnection__socket.getpeername()[0])
    except (OSError, AttributeError, IndexError):
        return "unknown"
