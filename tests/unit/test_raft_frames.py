"""The raft frame bound (server/raft/frames.py) and the frame guard (server/raft/patches.py).

The bound must sit above every frame an honest member sends (else a follower never catches
up) and the guard must close a connection on a frame over it, or not sealed with the key,
before the frame is buffered, decompressed or unpickled. The guard runs here on a real
pysyncobj ``TcpConnection`` over a socket pair; tests/cluster/test_raft_security.py
attacks real servers.
"""

from __future__ import annotations

import dataclasses
import os
import pickle
import socket
import struct
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from pysyncobj.encryptor import getEncryptor
from pysyncobj.poller import POLL_EVENT_TYPE
from pysyncobj.tcp_connection import CONNECTION_STATE, TcpConnection

from deploy.cluster import pick_free_ports, wait_for
from drover.server.errors import ValidationError
from drover.server.fsm import FSM, encode_entry
from drover.server.raft import RaftNode, frames, patches, seal
from drover.server.raft.tuning import RaftTuning
from drover.server.state_store import StateStore
from drover.v1 import raft_pb2
from tests.raft_wire import MakeDir, frame

KEY = "the-cluster-key-for-these-tests"
TUNING = RaftTuning()


# --- the bound ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("sizes", "budget", "expected"),
    [
        ([], 100, 0),
        ([10_000], 100, 1),  # the first entry always goes, whatever its size
        ([10, 10, 10], 3 * frames.pickled_bound(10), 3),
        ([10, 10, 10], 3 * frames.pickled_bound(10) - 1, 2),  # the crossing entry waits
        ([10, 10_000, 10], 1_000, 1),
    ],
    ids=["empty", "first-always", "exact-fit", "crossing-waits", "big-second-waits"],
)
def test_batch_length__cuts_before_the_entry_that_crosses_the_budget(
    sizes: list[int], budget: int, expected: int
) -> None:
    assert frames.batch_length(sizes, budget) == expected


def test_batch_length__reads_no_further_than_the_cut() -> None:
    read: list[int] = []

    def sizes() -> Iterator[int]:
        for size in [10] * 1000:
            read.append(size)
            yield size

    assert frames.batch_length(sizes(), 2 * frames.pickled_bound(10)) == 2
    assert len(read) == 3


def _high_bytes(n: int) -> bytes:
    """Incompressible bytes >= 0x80: protocol-2 pickle writes each as two."""
    return bytes(b | 0x80 for b in os.urandom(n))


def _sealed_length(message: Any) -> int:
    """The frame pysyncobj's own send path makes of ``message`` on an established session."""
    conn = TcpConnection(poller=None)
    conn.encryptor = getEncryptor(KEY)
    conn.sendRandKey = os.urandom(32)
    conn.send(message)
    length = conn.getSendBufferSize() - 4
    assert length > 0
    return length


def _append_entries(entries: list[tuple[bytes, int, int]]) -> dict[str, Any]:
    return {
        "type": "append_entries",
        "term": 2**40,
        "commit_index": 2**40,
        "entries": entries,
        "prevLogIdx": 2**40,
        "prevLogTerm": 2**40,
    }


@pytest.mark.timeout(120)
@pytest.mark.parametrize("content", [os.urandom, _high_bytes], ids=["random", "high-bytes"])
def test_frame_limit__above_the_largest_entry_an_honest_leader_sends(content: Callable[[int], bytes]) -> None:
    entry = (content(TUNING.max_entry_bytes), 2**40, 2**40)

    length = _sealed_length(_append_entries([entry]))

    # The bound assumes zlib saves nothing (provable); measured, it saves a little even on
    # random bytes, so the bound is above the worst frame but within twice it.
    assert length <= TUNING.frame_limit_bytes() < 2 * length


@pytest.mark.timeout(120)
def test_frame_limit__above_a_full_batch_of_small_entries() -> None:
    sizes = [200] * 200_000
    count = frames.batch_length(sizes, TUNING.append_entries_batch_bytes)
    entries = [(_high_bytes(200), 2**40 + i, 2**40) for i in range(count)]

    assert _sealed_length(_append_entries(entries)) <= TUNING.frame_limit_bytes()


def test_frame_limit__refuses_the_64_mib_frame_that_deposed_a_leader() -> None:
    assert TUNING.frame_limit_bytes() < 64 * 1024 * 1024
    assert _handshake_length() <= frames.HANDSHAKE_FRAME_BYTES


def _handshake_length() -> int:
    conn = TcpConnection(poller=None)
    conn.encryptor = getEncryptor(KEY)
    conn.send(os.urandom(32))
    return conn.getSendBufferSize() - 4


# --- the rate-limited log -----------------------------------------------------------------


def test_reject_log__one_line_per_peer_per_window_counting_the_rest() -> None:
    log = frames.RejectLog(window_s=60.0)

    assert log.admit("10.0.0.1", now=0.0) == 0
    assert log.admit("10.0.0.1", now=1.0) is None
    assert log.admit("10.0.0.1", now=59.0) is None
    assert log.admit("10.0.0.2", now=59.0) == 0, "another peer has its own window"
    assert log.admit("10.0.0.1", now=60.0) == 2, "the next line says how many were kept quiet"
    assert log.admit("10.0.0.1", now=61.0) is None


def test_reject_log__forgets_the_oldest_peers_past_its_bound() -> None:
    log = frames.RejectLog(window_s=60.0, max_peers=2)
    log.admit("a", now=0.0)
    log.admit("b", now=0.0)
    log.admit("c", now=0.0)

    assert log.admit("a", now=1.0) == 0, "a was forgotten, so it is logged again"
    assert log.admit("c", now=1.0) is None


# --- the guard on a real connection -------------------------------------------------------


class _Poller:
    """Just enough of pysyncobj's poller: remembers the callback, fires it on demand."""

    def __init__(self) -> None:
        self.callbacks: dict[int, Callable[[int, int], None]] = {}

    def subscribe(self, fd: int, callback: Callable[[int, int], None], _events: int) -> None:
        self.callbacks[fd] = callback

    def unsubscribe(self, fd: int) -> None:
        self.callbacks.pop(fd, None)


class _Wire:
    """A guarded ``TcpConnection`` on one end of a socket pair, a raw socket on the other."""

    def __init__(self) -> None:
        patches.install_frame_guard(TUNING.frame_limit_bytes())
        self.ours, self.peer = socket.socketpair()
        self.ours.setblocking(False)
        self.poller = _Poller()
        self.received: list[Any] = []
        self.conn = TcpConnection(
            poller=self.poller, socket=self.ours, onMessageReceived=self.received.append
        )
        self.conn.encryptor = getEncryptor(KEY)
        self.fd = self.ours.fileno()

    def deliver(self, data: bytes) -> None:
        """Send ``data`` (from a thread: it may not fit the socket's buffer) and fire the
        connection's read events until it has taken all of it, or closed."""
        sender = threading.Thread(target=self._send, args=(data,))
        sender.start()
        deadline = time.monotonic() + 30
        while not self.closed and time.monotonic() < deadline:
            callback = self.poller.callbacks.get(self.fd)
            if callback is None:
                break
            if self._pending():
                callback(self.fd, POLL_EVENT_TYPE.READ)
            elif not sender.is_alive():
                break
            else:
                time.sleep(0.001)
        sender.join(timeout=30)
        assert not sender.is_alive()

    def _send(self, data: bytes) -> None:
        try:
            self.peer.sendall(data)
        except OSError:  # the connection closed on us: what some tests expect
            pass

    def _pending(self) -> bool:
        try:
            return bool(self.ours.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT))
        except BlockingIOError:
            return False

    @property
    def closed(self) -> bool:
        return bool(self.conn.state == CONNECTION_STATE.DISCONNECTED)

    def close(self) -> None:
        self.conn.disconnect()
        self.peer.close()


@pytest.fixture
def wire() -> Iterator[_Wire]:
    w = _Wire()
    yield w
    w.close()


def _sealed(message: Any, key: str = KEY, *, timestamp: int = 1) -> bytes:
    return frame(
        getEncryptor(key).encrypt_at_time(zlib.compress(pickle.dumps(message, protocol=2), 3), timestamp)
    )


def test_guard__a_frame_sealed_with_the_key_is_delivered(wire: _Wire) -> None:
    wire.deliver(_sealed(b"k" * 32))

    assert wire.received == [b"k" * 32]
    assert not wire.closed


@pytest.mark.parametrize("key", [None, "another-clusters-key"], ids=["unsealed", "wrong-key"])
def test_guard__a_frame_not_sealed_with_the_key_is_never_unpickled(
    wire: _Wire, tmp_path: Path, key: str | None
) -> None:
    marker = tmp_path / "ran"
    attack = (
        frame(zlib.compress(pickle.dumps(MakeDir(marker), protocol=2)))
        if key is None
        else _sealed(MakeDir(marker), key)
    )

    wire.deliver(attack)

    assert wire.closed
    assert wire.received == []
    assert not marker.exists()


@pytest.mark.parametrize("declared", [frames.HANDSHAKE_FRAME_BYTES + 1, 64 * 1024 * 1024, -1])
def test_guard__before_the_session_a_frame_over_the_handshake_bound_closes_it(
    wire: _Wire, declared: int
) -> None:
    wire.deliver(struct.pack("i", declared) + b"\0" * 60_000)

    assert wire.closed
    assert wire.received == []


def _establish(wire: _Wire, peer_key: bytes = b"k" * 32) -> bytes:
    """The key exchange, as pysyncobj's transport does it: the peer's first frame is its
    session key, and ours (returned: with the guard installed it carries the GCM offer) is
    what every later frame of the peer's must carry."""
    wire.deliver(_sealed(peer_key))
    wire.conn.sendRandKey = wire.received[-1]
    wire.conn.recvRandKey = b"r" * 32
    own = wire.conn.recvRandKey
    assert isinstance(own, bytes)
    return own


def test_guard__until_the_session_is_established_the_handshake_bound_holds(wire: _Wire) -> None:
    wire.deliver(_sealed(b"k" * 32))

    wire.deliver(_sealed(os.urandom(frames.HANDSHAKE_FRAME_BYTES)))

    assert wire.closed
    assert wire.received == [b"k" * 32]


def test_guard__an_established_session_takes_frames_up_to_the_frame_limit(wire: _Wire) -> None:
    own = _establish(wire)
    big = os.urandom(256 * 1024)

    wire.deliver(_sealed((own, big), timestamp=2))

    assert wire.received == [b"k" * 32, big]
    wire.deliver(struct.pack("i", TUNING.frame_limit_bytes() + 1))
    assert wire.closed


def test_guard__a_replayed_frame_from_another_session_is_refused(wire: _Wire) -> None:
    _establish(wire)

    wire.deliver(_sealed((b"x" * 32, "from another connection"), timestamp=2))

    assert wire.closed
    assert wire.received == [b"k" * 32]


# --- the GCM seal (server/raft/seal.py) on a real connection --------------------------------


@pytest.fixture
def gcm_wire() -> Iterator[_Wire]:
    """A wire whose connection has a node's encryptor: pysyncobj's ``getEncryptor`` as the
    guard replaces it, which also keeps the cluster's GCM key."""
    w = _Wire()
    w.conn.encryptor = patches._get_encryptor(KEY)
    yield w
    w.close()


def _gcm_sealed(message: Any, session_key: bytes, key: str = KEY, *, count: int = 1) -> bytes:
    """A GCM frame as a peer seals it for the session keyed on ``session_key``: the
    ``count``-th of that session."""
    session = seal.Session(seal.cluster_key(key), session_key)
    body = b""
    for _ in range(count):
        body = session.seal(zlib.compress(pickle.dumps(message, protocol=2), 3))
    return frame(body)


def _sent(wire: _Wire) -> bytes:
    """The body of the one frame the connection sent to the peer."""
    data = b""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            data += wire.peer.recv(1 << 20, socket.MSG_DONTWAIT)
        except BlockingIOError:
            if len(data) >= 4 and len(data) >= 4 + struct.unpack("i", data[:4])[0]:
                break
            time.sleep(0.001)
    (length,) = struct.unpack("i", data[:4])
    assert len(data) == 4 + length
    return data[4:]


def test_seal__a_drover_nodes_session_key_offers_gcm() -> None:
    patches.install_frame_guard(TUNING.frame_limit_bytes())
    conn = TcpConnection(poller=None)
    conn.recvRandKey = os.urandom(32)

    assert seal.offered(conn.recvRandKey)
    assert not seal.offered(os.urandom(32))  # what an older release sends
    conn.recvRandKey = None  # pysyncobj clears it on disconnect
    assert conn.recvRandKey is None


def test_seal__to_a_peer_that_offered_gcm__frames_are_gcm_sealed_for_its_session(gcm_wire: _Wire) -> None:
    peer_key = seal.with_offer(os.urandom(32))
    _establish(gcm_wire, peer_key)

    gcm_wire.conn.send("hello")

    body = _sent(gcm_wire)
    assert seal.is_sealed(body)
    opened = seal.Session(seal.cluster_key(KEY), peer_key).open(body)
    assert pickle.loads(zlib.decompress(opened)) == (peer_key, "hello")


def test_seal__to_a_peer_of_an_older_release__frames_stay_fernet(gcm_wire: _Wire) -> None:
    peer_key = os.urandom(32)
    _establish(gcm_wire, peer_key)

    gcm_wire.conn.send("hello")

    body = _sent(gcm_wire)
    assert body[:1] == b"g"  # a Fernet token, which that release opens
    assert pickle.loads(zlib.decompress(getEncryptor(KEY).decrypt(body))) == (peer_key, "hello")


def test_seal__a_gcm_frame_for_this_session_is_delivered_and_its_replay_refused(gcm_wire: _Wire) -> None:
    own = _establish(gcm_wire)
    sealed = _gcm_sealed((own, "first"), own)

    gcm_wire.deliver(sealed)
    assert gcm_wire.received == [b"k" * 32, "first"]
    assert not gcm_wire.closed

    gcm_wire.deliver(sealed)
    assert gcm_wire.closed
    assert gcm_wire.received == [b"k" * 32, "first"]


@pytest.mark.parametrize("sealed_as", ["another-clusters-key", "another-session"])
def test_seal__a_gcm_frame_not_sealed_for_this_session_is_never_unpickled(
    gcm_wire: _Wire, tmp_path: Path, sealed_as: str
) -> None:
    own = _establish(gcm_wire)
    marker = tmp_path / "ran"
    if sealed_as == "another-clusters-key":
        attack = _gcm_sealed((own, MakeDir(marker)), own, key="another-clusters-key")
    else:
        attack = _gcm_sealed((own, MakeDir(marker)), seal.with_offer(os.urandom(32)))

    gcm_wire.deliver(attack)

    assert gcm_wire.closed
    assert gcm_wire.received == [b"k" * 32]
    assert not marker.exists()


def test_seal__a_node_without_the_gcm_key_refuses_gcm_frames(wire: _Wire) -> None:
    """The plain wire's encryptor is pysyncobj's own (no GCM key known for it)."""
    own = _establish(wire)

    wire.deliver(_gcm_sealed((own, "gcm"), own))

    assert wire.closed
    assert wire.received == [b"k" * 32]


def test_guard__install_is_idempotent_and_keeps_the_largest_bound() -> None:
    patches.install_frame_guard(1)
    patches.install_frame_guard(TUNING.frame_limit_bytes())

    assert patches.frame_limit_installed() >= TUNING.frame_limit_bytes()


# --- the entry bound ----------------------------------------------------------------------


@pytest.mark.timeout(60)
def test_raft_node__refuses_an_entry_over_max_entry_bytes_before_it_is_in_the_log(tmp_path: Path) -> None:
    (port,) = pick_free_ports(1)
    node = RaftNode(
        f"127.0.0.1:{port}",
        [],
        FSM(StateStore()),
        str(tmp_path / "raft"),
        password=KEY,
        tuning=dataclasses.replace(TUNING, max_entry_bytes=1024),
    )
    try:
        wait_for(node.leader_ready, 30, message="a single node to lead")
        member = raft_pb2.ServerMemberEntry()
        member.member.name = "s1"
        small = encode_entry(raft_pb2.ENTRY_TYPE_SERVER_MEMBER, member)
        assert len(small) <= 1024
        index = node.propose(small, timeout=10).index

        with pytest.raises(ValidationError, match="over the 1024-byte limit"):
            node.propose(b"x" * 1025, timeout=10)
        outcomes: list[tuple[object, str]] = []
        node.propose_async(b"x" * 1025, lambda result, error: outcomes.append((result, error)))

        assert outcomes and outcomes[0][0] is None and "over the 1024-byte limit" in outcomes[0][1]
        assert node.log_end_index() == index, "nothing reached the log"
    finally:
        node.close()
