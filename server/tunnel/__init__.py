"""The servers' end of the client tunnel (``Nodes.Connect``): who holds which node, and the
requests in flight on each.

Clients never listen on a port. Each client agent keeps one ``Nodes.Connect`` stream open
to the server it talks to; that server registers a ``NodeSession`` for the node here, and
whatever only the node can answer (alloc logs, restart, signal, node meta) is sent down
that stream as a ``ClientTunnelDown`` with a fresh ``request_id``. The client answers each
by request_id with zero or more ``data`` chunks and one ``done``; the session routes every
answer to the queue of the request that asked (``PendingRequest``).

Bounds: at most ``MAX_REQUESTS_PER_NODE`` requests in flight per node (a caller past that
is RESOURCE_EXHAUSTED, refused before anything is sent), and each queue holds at most
``MAX_QUEUED_CHUNKS`` answers: a caller that stops reading a followed log makes the client
wait, not the server's memory grow. A caller that goes away sends ``cancel`` for its
request_id; a tunnel that breaks ends every request on it with UNAVAILABLE.

One registry per server (``tunnels_for(core)``), holding only the sessions this server
accepted: a call for a node held elsewhere is relayed by server/api/tunnel.py.
"""

from __future__ import annotations

import itertools
import queue
import threading
import weakref
from collections.abc import AsyncIterator, Iterator
from typing import TYPE_CHECKING, Final

import grpc

from drover.server.errors import DroverError
from drover.server.loop_wakers import LoopWakers
from drover.v1 import api_pb2

if TYPE_CHECKING:
    from drover.server.core import ServerCore

__all__ = [
    "MAX_REQUESTS_PER_NODE",
    "NodeSession",
    "PendingRequest",
    "TunnelError",
    "TunnelRegistry",
    "tunnels_for",
]

MAX_REQUESTS_PER_NODE: Final = 32
MAX_QUEUED_CHUNKS: Final = 64
# How long a blocked hand-off to a slow reader may wait before the answer is dropped and the
# request ended: the client then sees nothing more asked of it and the caller an error.
_QUEUE_PUT_WAIT_S: Final = 30.0


class TunnelError(DroverError):
    """A failure the node reported (its code and words), or the tunnel's own."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code


def _status_code(name: str) -> grpc.StatusCode:
    """The code a client named in ``error_code``; UNKNOWN for a name that is none."""
    try:
        return grpc.StatusCode[name]
    except KeyError:
        return grpc.StatusCode.UNKNOWN


_CLOSED: Final = api_pb2.ClientTunnelUp(done=True, error_code="UNAVAILABLE", error="")


class PendingRequest:
    """One request sent to a node, with the queue its answers arrive on.

    Use it as a context manager: leaving it before the ``done`` answer cancels the request
    on the client (the caller went away, or timed out)."""

    def __init__(self, session: NodeSession, request_id: int) -> None:
        self.session = session
        self.request_id = request_id
        self.answers: queue.Queue[api_pb2.ClientTunnelUp] = queue.Queue(MAX_QUEUED_CHUNKS)
        self.finished = False

    def __enter__(self) -> PendingRequest:
        return self

    def __exit__(self, *exc: object) -> None:
        self.session._forget(self, cancel=not self.finished)

    def next_answer(self, timeout_s: float) -> api_pb2.ClientTunnelUp | None:
        """The next answer, None if none came within ``timeout_s``. A failed ``done`` raises
        ``TunnelError`` with the client's code and words (UNAVAILABLE if the tunnel broke)."""
        try:
            answer = self.answers.get(timeout=timeout_s)
        except queue.Empty:
            if self.session.closed:
                answer = _CLOSED
            else:
                return None
        if answer.done:
            self.finished = True
            if answer is _CLOSED:
                raise TunnelError(
                    grpc.StatusCode.UNAVAILABLE,
                    f"node {self.session.node_id} disconnected before it answered",
                )
            if answer.error_code:
                raise TunnelError(_status_code(answer.error_code), answer.error or answer.error_code)
        return answer


class NodeSession:
    """One node's open tunnel on this server: the messages waiting to go down it, and the
    requests waiting for answers."""

    def __init__(self, node_id: str, *, max_requests: int = MAX_REQUESTS_PER_NODE) -> None:
        self.node_id = node_id
        self._max_requests = max_requests
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._pending: dict[int, PendingRequest] = {}
        self._outgoing: queue.Queue[api_pb2.ClientTunnelDown | None] = queue.Queue()
        self._closed = threading.Event()
        # The stream's coroutine waiting in ``outgoing_async``, woken from the callers'
        # threads whenever something is queued to go down.
        self._wakers = LoopWakers()

    @property
    def closed(self) -> bool:
        return self._closed.is_set()

    def open(self, down: api_pb2.ClientTunnelDown) -> PendingRequest:
        """Send ``down`` (its request_id is set here) and return the request to read from."""
        with self._lock:
            if self._closed.is_set():
                raise TunnelError(grpc.StatusCode.UNAVAILABLE, f"node {self.node_id} is not connected")
            if len(self._pending) >= self._max_requests:
                raise TunnelError(
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    f"node {self.node_id} already has {len(self._pending)} requests in flight"
                    f" (at most {self._max_requests}); retry later",
                )
            request = PendingRequest(self, next(self._ids))
            self._pending[request.request_id] = request
        sent = api_pb2.ClientTunnelDown()
        sent.CopyFrom(down)
        sent.request_id = request.request_id
        self._send(sent)
        return request

    def _send(self, down: api_pb2.ClientTunnelDown | None) -> None:
        self._outgoing.put(down)
        with self._lock:
            self._wakers.wake_all()

    def in_flight(self) -> int:
        with self._lock:
            return len(self._pending)

    def _forget(self, request: PendingRequest, *, cancel: bool) -> None:
        with self._lock:
            self._pending.pop(request.request_id, None)
        if cancel and not self._closed.is_set():
            self._send(api_pb2.ClientTunnelDown(request_id=request.request_id, cancel=True))

    def try_deliver(self, up: api_pb2.ClientTunnelUp) -> bool:
        """``deliver`` without waiting: False when the request's queue is full (its caller
        reads slowly), and then nothing was done; the stream's coroutine must not block
        the API loop, so it hands that answer to ``deliver`` in a thread."""
        with self._lock:
            request = self._pending.get(up.request_id)
        if request is None:
            return True
        try:
            request.answers.put_nowait(up)
        except queue.Full:
            return False
        return True

    def deliver(self, up: api_pb2.ClientTunnelUp) -> None:
        """Route one answer from the client to its request; an answer to a request nobody
        waits for any more (cancelled, timed out) is dropped."""
        with self._lock:
            request = self._pending.get(up.request_id)
        if request is None:
            return
        try:
            request.answers.put(up, timeout=_QUEUE_PUT_WAIT_S)
        except queue.Full:
            # The caller stopped reading: end the request rather than hold the tunnel.
            self._forget(request, cancel=True)

    def outgoing(self) -> Iterator[api_pb2.ClientTunnelDown]:
        """What to send down the stream, until the session closes."""
        while not self._closed.is_set():
            try:
                down = self._outgoing.get(timeout=0.5)
            except queue.Empty:
                continue
            if down is None:
                return
            yield down

    async def outgoing_async(self) -> AsyncIterator[api_pb2.ClientTunnelDown]:
        """``outgoing``, as the stream's coroutine reads it: the same messages, with no
        thread held while nothing is queued."""
        with self._wakers.waiting(self._lock) as ready:
            while not self._closed.is_set():
                # Cleared before the look: a message queued after it sets the event again.
                ready.clear()
                try:
                    down = self._outgoing.get_nowait()
                except queue.Empty:
                    await ready.wait()
                    continue
                if down is None:
                    return
                yield down

    def close(self) -> None:
        """The tunnel broke or was replaced: every waiting request ends UNAVAILABLE."""
        with self._lock:
            if self._closed.is_set():
                return
            self._closed.set()
            pending = list(self._pending.values())
        self._send(None)
        for request in pending:
            try:
                request.answers.put_nowait(_CLOSED)
            except queue.Full:
                # A full queue is read by its caller, who reaches the end marker next time
                # it finds the queue empty and the session closed.
                pass


class TunnelRegistry:
    """node_id -> the session this server holds for it (a node has at most one)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sessions: dict[str, NodeSession] = {}

    def attach(self, session: NodeSession) -> None:
        """Hold ``session`` for its node; a session the node had before is closed (the
        client reconnected, so the old stream is dead even if TCP has not noticed)."""
        with self._lock:
            old = self._sessions.get(session.node_id)
            self._sessions[session.node_id] = session
        if old is not None and old is not session:
            old.close()

    def detach(self, session: NodeSession) -> None:
        """Forget ``session`` (only if it is still the node's current one) and close it."""
        with self._lock:
            if self._sessions.get(session.node_id) is session:
                del self._sessions[session.node_id]
        session.close()

    def get(self, node_id: str) -> NodeSession | None:
        with self._lock:
            session = self._sessions.get(node_id)
        return session if session is not None and not session.closed else None

    def node_ids(self) -> list[str]:
        with self._lock:
            return sorted(n for n, s in self._sessions.items() if not s.closed)


_BY_CORE: weakref.WeakKeyDictionary[ServerCore, TunnelRegistry] = weakref.WeakKeyDictionary()
_BY_CORE_LOCK = threading.Lock()


def tunnels_for(core: ServerCore) -> TunnelRegistry:
    """The registry of ``core`` (made on first use, one per server)."""
    with _BY_CORE_LOCK:
        registry = _BY_CORE.get(core)
        if registry is None:
            registry = _BY_CORE[core] = TunnelRegistry()
        return registry
