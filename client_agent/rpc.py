"""The client agent's only gRPC module: the server pool and the Nodes RPCs it uses.

``ServerPool`` holds one channel per configured server and a current pick. A call that
fails with UNAVAILABLE or DEADLINE_EXCEEDED moves the pick to the next server (failover)
and raises ``ServerUnreachable``; the caller's loop waits its backoff and tries again, so
every loop owns its own retry policy. Every other status is a ``RequestRejected`` (or
``NotFound``, ``Refused``), and the pick stays.

Every call has a deadline: a paused or partitioned server cannot hang a loop. The
heartbeat is a message on one stream held open (``HeartbeatStream``), each with its own.

With ``tls`` every channel is TLS (``drover.common.tls``): the servers' certificates are
checked against the CA and the server name, and this node presents its own certificate
when it has one.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Final, TypeVar

import grpc

from drover.client.errors import NotFound, Refused, RequestRejected, RpcFailed, ServerUnreachable
from drover.client.taskstate import AllocStatus
from drover.common.grpc_options import MESSAGE_SIZE_OPTIONS, fast_reconnect_options
from drover.common.tls import TLSMaterial, open_channel
from drover.v1 import api_pb2, api_pb2_grpc, structs_pb2

__all__ = ["HeartbeatStream", "NodesRpc", "ServerPool", "TunnelStream", "alloc_update_message"]

_UNREACHABLE: Final = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})
# Statuses that mean "this node must register (again) before it is heard".
_REFUSED: Final = frozenset({grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.PERMISSION_DENIED})
# How often a cancellable call looks at its cancel flag.
_CANCEL_POLL_S: Final = 0.1
_CHANNEL_OPTIONS: Final = (*fast_reconnect_options(max_backoff_ms=1000), *MESSAGE_SIZE_OPTIONS)

T = TypeVar("T")


class ServerPool:
    def __init__(self, addresses: Sequence[str], *, tls: TLSMaterial | None = None) -> None:
        if not addresses:
            raise ValueError("at least one server address is required")
        self._addresses = list(dict.fromkeys(addresses))
        self._tls = tls
        self._lock = threading.Lock()
        self._index = 0
        self._stubs: dict[str, tuple[grpc.Channel, api_pb2_grpc.NodesStub]] = {}
        self._closed = False

    @property
    def addresses(self) -> list[str]:
        return list(self._addresses)

    def current(self) -> str:
        with self._lock:
            return self._addresses[self._index]

    def failed(self, address: str) -> None:
        """``address`` did not answer: move on, unless another thread already did."""
        with self._lock:
            if self._addresses[self._index] == address:
                self._index = (self._index + 1) % len(self._addresses)

    def stub(self, address: str) -> api_pb2_grpc.NodesStub:
        with self._lock:
            if self._closed:
                raise ServerUnreachable(address, "CANCELLED", "the agent is shutting down")
            entry = self._stubs.get(address)
            if entry is None:
                channel = open_channel(address, self._tls, _CHANNEL_OPTIONS)
                entry = (channel, api_pb2_grpc.NodesStub(channel))
                self._stubs[address] = entry
            return entry[1]

    def close(self) -> None:
        """Close every channel; calls in flight fail (CANCELLED) and new ones are refused."""
        with self._lock:
            self._closed = True
            channels = [c for c, _ in self._stubs.values()]
            self._stubs.clear()
        for channel in channels:
            channel.close()

    def call_services(self, fn: Callable[[api_pb2_grpc.ServicesStub], T]) -> T:
        """``call`` for the Services API, on the same channel as the Nodes calls."""
        address = self.current()
        try:
            self.stub(address)
            with self._lock:
                channel = self._stubs[address][0]
            return fn(api_pb2_grpc.ServicesStub(channel))
        except KeyError:
            raise ServerUnreachable(address, "CANCELLED", "the agent is shutting down") from None
        except grpc.FutureCancelledError:
            # Cancelled by this agent (its alloc stopped): not the server's fault.
            raise ServerUnreachable(address, "CANCELLED", "the call was cancelled") from None
        except grpc.RpcError as exc:
            raise self._translate(address, exc) from exc

    def call(self, fn: Callable[[api_pb2_grpc.NodesStub], T]) -> T:
        address = self.current()
        try:
            return fn(self.stub(address))
        except grpc.RpcError as exc:
            raise self._translate(address, exc) from exc

    def _translate(self, address: str, exc: grpc.RpcError) -> RpcFailed:
        code = exc.code() if isinstance(exc, grpc.Call) else grpc.StatusCode.UNKNOWN
        details = (exc.details() if isinstance(exc, grpc.Call) else str(exc)) or ""
        if code in _UNREACHABLE or code == grpc.StatusCode.CANCELLED:
            self.failed(address)
            return ServerUnreachable(address, code.name, details)
        if code == grpc.StatusCode.NOT_FOUND:
            return NotFound(address, code.name, details)
        if code in _REFUSED:
            return Refused(address, code.name, details)
        return RequestRejected(address, code.name, details)

    def tunnel(self, address: str, answers: Iterator[api_pb2.ClientTunnelUp]) -> TunnelStream:
        """Open ``Nodes.Connect`` to ``address``: ``answers`` goes up (the hello first), and
        the returned stream yields what the server asks. No deadline: it stays open for as
        long as both ends live (client_agent/tunnel.py)."""
        return TunnelStream(self, address, self.stub(address).Connect(answers))


class TunnelStream:
    """The server's requests on an open tunnel; a broken stream raises ``RpcFailed``."""

    def __init__(self, pool: ServerPool, address: str, call: Iterator[api_pb2.ClientTunnelDown]) -> None:
        self._pool = pool
        self.address = address
        self._call = call

    def __iter__(self) -> Iterator[api_pb2.ClientTunnelDown]:
        try:
            yield from self._call
        except grpc.RpcError as exc:
            raise self._pool._translate(self.address, exc) from exc

    def cancel(self) -> None:
        cancel = getattr(self._call, "cancel", None)
        if cancel is not None:
            cancel()


def alloc_update_message(node_id: str, status: AllocStatus) -> structs_pb2.Allocation:
    alloc = structs_pb2.Allocation(
        id=status.alloc_id,
        node_id=node_id,
        client_status=status.client_status,
        client_description=status.description,
    )
    for name, ts in status.task_states.items():
        msg = alloc.task_states[name]
        msg.state = ts.state
        msg.failed = ts.failed
        msg.restarts = ts.restarts
        msg.started_at_ns = ts.started_at_ns
        msg.finished_at_ns = ts.finished_at_ns
        msg.pid = ts.pid
        for ev in ts.events:
            msg.events.add(type=ev.type, message=ev.message, time_ns=ev.time_ns, exit_code=ev.exit_code)
    for check in status.checks:
        alloc.check_statuses.add(
            task=check.task,
            service=check.service,
            check=check.check,
            status=check.status,
            output=check.output,
            timestamp_ns=check.timestamp_ns,
        )
    if status.deployment_health is not None:
        # The deployment judged rides along: the servers ignore a verdict on another one.
        alloc.deployment_id = status.deployment_health.deployment_id
        alloc.deployment_status.CopyFrom(status.deployment_health.to_proto())
    return alloc


class _OpenHeartbeats:
    """One open ``Nodes.Heartbeat`` stream: beats go up ``requests``; a reader thread puts
    each answer, the error that ended the stream, or ``None`` for an end without one, on
    ``answers``."""

    def __init__(self, address: str, stub: api_pb2_grpc.NodesStub) -> None:
        self.address = address
        self.requests: queue.SimpleQueue[api_pb2.NodeUpdateStatusRequest | None] = queue.SimpleQueue()
        self.answers: queue.SimpleQueue[api_pb2.NodeUpdateStatusResponse | grpc.RpcError | None] = (
            queue.SimpleQueue()
        )
        self._call = stub.Heartbeat(iter(self.requests.get, None))
        threading.Thread(target=self._read, name="client-heartbeat-stream", daemon=True).start()

    def _read(self) -> None:
        try:
            for answer in self._call:
                self.answers.put(answer)
            self.answers.put(None)
        except grpc.RpcError as exc:
            self.answers.put(exc)

    def close(self) -> None:
        self.requests.put(None)  # ends grpc's thread that sends the requests
        cancel = getattr(self._call, "cancel", None)
        if cancel is not None:
            cancel()


class HeartbeatStream:
    """The heartbeat as messages on one ``Nodes.Heartbeat`` stream to the current server,
    opened on the first beat and again after anything goes wrong.

    Why a stream: the server accepts new calls one at a time (grpc.aio), and with a fleet
    of clients each heartbeat call waited its turn there, seconds under load, where a message
    on a stream already open is read with every other. Each beat still has its own deadline:
    one unanswered in time closes the stream (a late answer is never taken for the next
    beat's) and fails over as an unanswered call does; an error ends the stream with the
    status its UpdateStatus call would have had, and is translated the same way."""

    def __init__(self, pool: ServerPool) -> None:
        self._pool = pool
        self._lock = threading.Lock()
        self._open: _OpenHeartbeats | None = None
        self._closed = False

    def beat(
        self, request: api_pb2.NodeUpdateStatusRequest, timeout_s: float
    ) -> api_pb2.NodeUpdateStatusResponse:
        address = self._pool.current()
        stream = self._stream_to(address)
        stream.requests.put(request)
        try:
            answer = stream.answers.get(timeout=timeout_s)
        except queue.Empty:
            self._drop(stream)
            self._pool.failed(address)
            raise ServerUnreachable(
                address, "DEADLINE_EXCEEDED", f"no heartbeat answer in {timeout_s:.1f}s"
            ) from None
        if isinstance(answer, api_pb2.NodeUpdateStatusResponse):
            return answer
        self._drop(stream)
        if answer is None:
            self._pool.failed(address)
            raise ServerUnreachable(address, "UNAVAILABLE", "the server ended the heartbeat stream")
        raise self._pool._translate(address, answer) from answer

    def _stream_to(self, address: str) -> _OpenHeartbeats:
        with self._lock:
            if self._closed:
                raise ServerUnreachable(address, "CANCELLED", "the agent is shutting down")
            stream = self._open
            # Beats wait for their answers one at a time, so anything already on ``answers``
            # is the stream's end, come while it was idle (its server restarted): a beat
            # sent on it would fail at once without reaching a server.
            if stream is not None and (stream.address != address or not stream.answers.empty()):
                stream.close()  # ended, or the pool moved on (failover): a new stream
                stream = None
            if stream is None:
                stream = self._open = _OpenHeartbeats(address, self._pool.stub(address))
            return stream

    def _drop(self, stream: _OpenHeartbeats) -> None:
        with self._lock:
            if self._open is stream:
                self._open = None
        stream.close()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            stream, self._open = self._open, None
        if stream is not None:
            stream.close()


class NodesRpc:
    """The four calls a client makes, each with a deadline (the RPC timeout, the heartbeat's
    its own)."""

    def __init__(self, pool: ServerPool, *, timeout_s: float = 5.0) -> None:
        self.pool = pool
        self._timeout_s = timeout_s
        self._heartbeats = HeartbeatStream(pool)

    def close(self) -> None:
        """End the heartbeat stream; before ``pool.close()``, so its threads end with it."""
        self._heartbeats.close()

    def register(self, node: structs_pb2.Node) -> int:
        """Register (or re-register) the node; the heartbeat TTL in ns."""
        req = api_pb2.NodeRegisterRequest(node=node)
        resp = self.pool.call(lambda s: s.Register(req, timeout=self._timeout_s))
        return int(resp.heartbeat_ttl_ns)

    def heartbeat(self, node_id: str, secret_id: str, *, timeout_s: float) -> int:
        """UpdateStatus(ready), on the heartbeat stream: the next TTL in ns. Its own deadline,
        not the RPC timeout: it may wait while the TTL allows (client_agent/sync.py
        ``heartbeat_timeout_s``)."""
        req = api_pb2.NodeUpdateStatusRequest(node_id=node_id, status="ready", secret_id=secret_id)
        return int(self._heartbeats.beat(req, timeout_s).heartbeat_ttl_ns)

    def get_allocs(
        self, node_id: str, secret_id: str, *, min_index: int, wait_s: float
    ) -> api_pb2.ClientAllocsResponse:
        """Blocking query: returns once the node's allocs pass ``min_index`` or after ``wait_s``."""
        req = api_pb2.ClientAllocsRequest(
            node_id=node_id,
            secret_id=secret_id,
            options=api_pb2.QueryOptions(min_index=min_index, wait_ns=int(wait_s * 1e9)),
        )
        # The server answers by wait_s at the latest; the margin covers forwarding and load.
        deadline = wait_s + self._timeout_s
        return self.pool.call(lambda s: s.GetClientAllocs(req, timeout=deadline))

    def service_registrations(
        self,
        node_id: str,
        secret_id: str,
        alloc_id: str,
        names: Sequence[str],
        *,
        min_index: int,
        wait_s: float,
        cancel: threading.Event | None = None,
    ) -> api_pb2.ServiceInfoResponse:
        """The registrations of ``names`` in ``alloc_id``'s namespace, from any server's own
        state; with ``min_index``, once the registrations pass it or after ``wait_s``.
        ``cancel`` set ends a waiting call at once (CANCELLED): an alloc that stops must not
        wait out a blocking query."""
        req = api_pb2.ServiceClientInfoRequest(
            node_id=node_id,
            secret_id=secret_id,
            alloc_id=alloc_id,
            service_names=list(names),
            options=api_pb2.QueryOptions(stale=True, min_index=min_index, wait_ns=int(wait_s * 1e9)),
        )
        deadline = wait_s + self._timeout_s

        def call(stub: api_pb2_grpc.ServicesStub) -> api_pb2.ServiceInfoResponse:
            future = stub.ClientInfo.future(req, timeout=deadline)
            while cancel is not None and not future.done():
                if cancel.wait(_CANCEL_POLL_S):
                    future.cancel()
            response: api_pb2.ServiceInfoResponse = future.result()
            return response

        return self.pool.call_services(call)

    def update_allocs(self, node_id: str, secret_id: str, statuses: Sequence[AllocStatus]) -> None:
        req = api_pb2.AllocUpdateRequest(
            node_id=node_id,
            secret_id=secret_id,
            allocs=[alloc_update_message(node_id, s) for s in statuses],
        )
        self.pool.call(lambda s: s.UpdateAllocs(req, timeout=self._timeout_s))
