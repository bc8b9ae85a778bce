"""The client's end of the tunnel (``Nodes.Connect``): what the servers ask only a node can answer.

Clients never listen on a port. ``ClientTunnel`` keeps one ``Nodes.Connect`` stream open to
the server the agent talks to (``ServerPool.current()``), once the node is registered: its
first message is the hello (node ID and secret), and every request the server sends down
it is answered on its own thread by ``TunnelService``, by request_id: zero or more ``data``
chunks (at most ``CHUNK_BYTES`` each), then one ``done`` (with a status code name and
words if it failed). A ``cancel`` from the server stops that request (a followed log whose
caller went away). A broken stream is opened again with backoff, to the next server if
that one did not answer; a stream to a server the agent no longer talks to (its other
calls failed over) is closed and opened to the new one, so the tunnel follows the agent.

What is answered:

- logs: a task's ``stdout.log`` / ``stderr.log`` in its directory (raw_exec writes them,
  client_agent/drivers/raw_exec.py), from the start, the last N lines or the last N bytes;
  with follow, new bytes are polled for every ``FOLLOW_POLL_S`` until the request is
  cancelled, or the alloc's tasks are all dead and the file was sent to its end.
- restart / signal: one named task or every running task (``TaskRunner.restart/signal``).
- node meta: read, or apply a change (the agent stores it and registers again).

Every request names an alloc on this node, or this node: anything else is NOT_FOUND, so a
confused server never gets another node's data.
"""

from __future__ import annotations

import os
import queue
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import structlog

from drover.client.errors import ClientAgentError, DriverConfigError, RpcFailed, ServerUnreachable
from drover.client.sync import Backoff
from drover.common.signals import SignalNameError, parse_signal
from drover.v1 import api_pb2

if TYPE_CHECKING:
    from drover.client.rpc import ServerPool
    from drover.client.runner import AllocRunner
    from drover.client.taskrunner import TaskRunner

__all__ = [
    "CHUNK_BYTES",
    "ClientTunnel",
    "TunnelRequestError",
    "TunnelService",
    "apply_meta_change",
    "merge_meta",
    "send_file",
    "tail_offset",
]

CHUNK_BYTES: Final = 64 * 1024
FOLLOW_POLL_S: Final = 0.25
# A stream that stayed up this long was healthy: the next failure starts backoff afresh.
_HEALTHY_STREAM_S: Final = 5.0
# How often an open stream checks that its server is still the agent's current one.
_FOLLOW_SERVER_S: Final = 1.0
_OUTGOING_QUEUE: Final = 64
_PUT_POLL_S: Final = 0.5

log = structlog.get_logger("drover.client.tunnel")


class TunnelRequestError(ClientAgentError):
    """A request the node refuses: ``code`` is a grpc status code name."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


# -- pure parts ---------------------------------------------------------------------------


def tail_offset(
    size: int,
    read_at: Callable[[int, int], bytes],
    *,
    lines: int = 0,
    nbytes: int = 0,
    block: int = CHUNK_BYTES,
) -> int:
    """Where to start reading a file of ``size`` bytes to send its last ``lines`` lines or
    its last ``nbytes`` bytes (neither: 0, the whole file). ``read_at(offset, n)`` reads the
    file; it is called backwards one ``block`` at a time, so a long file is not read whole.

    A final newline ends the last line rather than starting an empty one, as tail(1) counts.
    """
    if nbytes > 0:
        return max(0, size - nbytes)
    if lines <= 0 or size <= 0:
        return 0
    end = size - 1 if read_at(size - 1, 1) == b"\n" else size
    found = 0
    pos = end
    while pos > 0:
        start = max(0, pos - block)
        chunk = read_at(start, pos - start)
        i = len(chunk)
        while True:
            i = chunk.rfind(b"\n", 0, i)
            if i < 0:
                break
            found += 1
            if found == lines:
                return start + i + 1
        pos = start
    return 0


def merge_meta(static: Mapping[str, str], dynamic: Mapping[str, str]) -> dict[str, str]:
    """What the node registers with: its config's meta, with the dynamic meta winning."""
    return {**static, **dynamic}


def apply_meta_change(
    dynamic: Mapping[str, str], set_: Mapping[str, str], unset: Sequence[str]
) -> dict[str, str]:
    """The dynamic meta after ``node meta apply``: ``unset`` keys removed, ``set_`` laid over.

    Unsetting a key that only the static config has leaves it in the merged view: dynamic
    meta can override static meta but not delete it (as Nomad's)."""
    both = sorted(set(set_) & set(unset))
    if both:
        raise TunnelRequestError("INVALID_ARGUMENT", f"meta: key(s) {', '.join(both)} both set and unset")
    out = {k: v for k, v in dynamic.items() if k not in set(unset)}
    out.update(set_)
    return out


def send_file(
    path: Path,
    start: int,
    *,
    follow: bool,
    finished: Callable[[], bool],
    cancelled: threading.Event,
    send: Callable[[bytes], None],
    poll_s: float = FOLLOW_POLL_S,
    chunk: int = CHUNK_BYTES,
) -> None:
    """Send ``path`` from ``start`` in chunks; with ``follow`` keep sending what is appended.

    Following ends when ``cancelled`` is set, or once ``finished()`` (the task will write no
    more) was true before a read that reached the end. A file that shrank (truncated) is
    read again from its start. A file that does not exist yet is waited for when following.
    """
    offset = start
    while not cancelled.is_set():
        done = finished()
        try:
            with open(path, "rb") as fh:
                size = os.fstat(fh.fileno()).st_size
                if size < offset:
                    offset = 0
                fh.seek(offset)
                while not cancelled.is_set():
                    data = fh.read(chunk)
                    if not data:
                        break
                    offset += len(data)
                    send(data)
        except FileNotFoundError:
            pass
        if not follow or done:
            return
        cancelled.wait(poll_s)


def _read_at(path: Path) -> Callable[[int, int], bytes]:
    def read(offset: int, n: int) -> bytes:
        with open(path, "rb") as fh:
            fh.seek(offset)
            return fh.read(n)

    return read


# -- answering requests -------------------------------------------------------------------


class TunnelService:
    """Answers one request at a time (called on the request's own thread)."""

    def __init__(
        self,
        node_id: str,
        runner_of: Callable[[str], AllocRunner | None],
        meta_read: Callable[[], api_pb2.NodeMetaResponse],
        meta_apply: Callable[[Mapping[str, str], Sequence[str]], api_pb2.NodeMetaResponse],
    ) -> None:
        self._node_id = node_id
        self._runner_of = runner_of
        self._meta_read = meta_read
        self._meta_apply = meta_apply

    def answer(
        self, down: api_pb2.ClientTunnelDown, cancelled: threading.Event, send: Callable[[bytes], None]
    ) -> api_pb2.NodeMetaResponse | None:
        """Answer ``down``; the meta response for a meta request. Raises TunnelRequestError."""
        op = down.WhichOneof("op")
        if op == "logs":
            self._logs(down.logs, cancelled, send)
        elif op == "restart":
            self._restart(down.restart)
        elif op == "signal":
            self._signal(down.signal)
        elif op == "meta_read":
            self._own_node(down.meta_read.node_id)
            return self._meta_read()
        elif op == "meta_apply":
            self._own_node(down.meta_apply.node_id)
            return self._meta_apply(dict(down.meta_apply.meta), list(down.meta_apply.unset))
        else:
            raise TunnelRequestError(
                "UNIMPLEMENTED", f"this client does not answer {op or 'an empty'} request"
            )
        return None

    def _own_node(self, node_id: str) -> None:
        if node_id != self._node_id:
            raise TunnelRequestError("NOT_FOUND", f"node {node_id!r} is not this node ({self._node_id})")

    def _runner(self, alloc_id: str) -> AllocRunner:
        runner = self._runner_of(alloc_id)
        if runner is None or runner.alloc.node_id != self._node_id:
            raise TunnelRequestError(
                "NOT_FOUND", f"alloc {alloc_id!r} is not running on node {self._node_id}"
            )
        return runner

    def _task(self, runner: AllocRunner, name: str, *, one_if_empty: bool) -> list[TaskRunner]:
        tasks = runner.task_runners()
        if name:
            task = tasks.get(name)
            if task is None:
                known = ", ".join(sorted(tasks)) or "none"
                raise TunnelRequestError(
                    "NOT_FOUND", f"task {name!r} not found in alloc {runner.alloc_id} (tasks: {known})"
                )
            return [task]
        if one_if_empty and len(tasks) != 1:
            raise TunnelRequestError(
                "INVALID_ARGUMENT",
                f"task: alloc {runner.alloc_id} has {len(tasks)} tasks ({', '.join(sorted(tasks))}): name one",
            )
        return [tasks[n] for n in sorted(tasks)]

    def _logs(
        self, request: api_pb2.AllocLogsRequest, cancelled: threading.Event, send: Callable[[bytes], None]
    ) -> None:
        if request.tail_lines < 0 or request.tail_bytes < 0:
            raise TunnelRequestError("INVALID_ARGUMENT", "tail_lines, tail_bytes: must be >= 0")
        runner = self._runner(request.alloc_id)
        (task,) = self._task(runner, request.task, one_if_empty=True)
        path = task.task_dir / ("stderr.log" if request.stderr else "stdout.log")
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            size = 0
        start = tail_offset(size, _read_at(path), lines=request.tail_lines, nbytes=request.tail_bytes)
        send_file(
            path, start, follow=request.follow, finished=runner.is_finished, cancelled=cancelled, send=send
        )

    def _restart(self, request: api_pb2.AllocRestartRequest) -> None:
        runner = self._runner(request.alloc_id)
        tasks = self._task(runner, request.task, one_if_empty=False)
        restarted = [t.name for t in tasks if t.restart()]
        if not restarted:
            raise TunnelRequestError("FAILED_PRECONDITION", _not_running(runner, request.task))

    def _signal(self, request: api_pb2.AllocSignalRequest) -> None:
        try:
            signum = parse_signal(request.signal)
        except SignalNameError as exc:
            raise TunnelRequestError("INVALID_ARGUMENT", str(exc)) from None
        runner = self._runner(request.alloc_id)
        tasks = self._task(runner, request.task, one_if_empty=False)
        try:
            signalled = [t.name for t in tasks if t.signal(signum, signum.name)]
        except DriverConfigError as exc:
            raise TunnelRequestError("FAILED_PRECONDITION", str(exc)) from None
        if not signalled:
            raise TunnelRequestError("FAILED_PRECONDITION", _not_running(runner, request.task))


def _not_running(runner: AllocRunner, task: str) -> str:
    if task:
        return f"task {task!r} of alloc {runner.alloc_id} is not running"
    return f"no task of alloc {runner.alloc_id} is running"


# -- the stream ---------------------------------------------------------------------------


class ClientTunnel:
    """The loop that keeps the node's tunnel open, and the threads answering on it."""

    def __init__(
        self,
        pool: ServerPool,
        node_id: str,
        secret_id: str,
        service: TunnelService,
        *,
        registered: threading.Event,
        stopping: threading.Event,
        backoff: Backoff,
        log_fields: Mapping[str, Any] | None = None,
    ) -> None:
        self._pool = pool
        self._node_id = node_id
        self._secret_id = secret_id
        self._service = service
        self._registered = registered
        self._stopping = stopping
        self._backoff = backoff
        self._log = log.bind(**(log_fields or {}))
        self._lock = threading.Lock()
        self._stream_cancel: Callable[[], None] | None = None
        self._connected = threading.Event()

    @property
    def connected(self) -> bool:
        return self._connected.is_set()

    def run(self) -> None:
        while not self._stopping.is_set():
            if not self._registered.wait(0.5):
                continue
            address = self._pool.current()
            opened = time.monotonic()
            try:
                self._serve(address)
                error = "the server ended the tunnel"
            except RpcFailed as exc:
                error = str(exc)
                if isinstance(exc, ServerUnreachable) and self._stopping.is_set():
                    return
            finally:
                self._connected.clear()
            if self._stopping.is_set():
                return
            if time.monotonic() - opened > _HEALTHY_STREAM_S:
                self._backoff.reset()
            delay = self._backoff.next()
            self._log.info("tunnel.reconnecting", server=address, error=error, delay_s=round(delay, 2))
            self._stopping.wait(delay)

    def stop(self) -> None:
        """End the open stream, if any (the agent is stopping)."""
        with self._lock:
            cancel = self._stream_cancel
        if cancel is not None:
            cancel()

    def _serve(self, address: str) -> None:
        outgoing: queue.Queue[api_pb2.ClientTunnelUp | None] = queue.Queue(_OUTGOING_QUEUE)
        ended = threading.Event()
        cancels: dict[int, threading.Event] = {}
        cancels_lock = threading.Lock()

        def answers() -> Iterator[api_pb2.ClientTunnelUp]:
            yield api_pb2.ClientTunnelUp(node_id=self._node_id, secret_id=self._secret_id)
            while not ended.is_set():
                try:
                    up = outgoing.get(timeout=_PUT_POLL_S)
                except queue.Empty:
                    continue
                if up is None:
                    return
                yield up

        def put(up: api_pb2.ClientTunnelUp, cancelled: threading.Event) -> None:
            while not ended.is_set() and not cancelled.is_set():
                try:
                    outgoing.put(up, timeout=_PUT_POLL_S)
                    return
                except queue.Full:
                    continue

        def work(down: api_pb2.ClientTunnelDown, cancelled: threading.Event) -> None:
            rid = down.request_id

            def send(data: bytes) -> None:
                put(api_pb2.ClientTunnelUp(request_id=rid, data=data), cancelled)

            done = api_pb2.ClientTunnelUp(request_id=rid, done=True)
            try:
                meta = self._service.answer(down, cancelled, send)
                if meta is not None:
                    done.meta.CopyFrom(meta)
            except TunnelRequestError as exc:
                done.error_code, done.error = exc.code, exc.message
            except Exception as exc:
                self._log.exception("tunnel.request_crashed", op=down.WhichOneof("op"))
                done.error_code, done.error = "INTERNAL", f"the client failed to answer: {exc}"
            finally:
                with cancels_lock:
                    cancels.pop(rid, None)
            # A cancelled request's caller is gone; its done is still sent (the server drops it).
            put(done, ended)

        stream = self._pool.tunnel(address, answers())
        with self._lock:
            self._stream_cancel = stream.cancel
        self._connected.set()
        self._log.info("tunnel.open", server=address)

        def follow_server() -> None:
            while not ended.wait(_FOLLOW_SERVER_S):
                if self._pool.current() != address:
                    self._log.info("tunnel.server_changed", server=address, current=self._pool.current())
                    stream.cancel()
                    return

        threading.Thread(target=follow_server, name="tunnel-follow", daemon=True).start()
        try:
            for down in stream:
                if down.WhichOneof("op") == "cancel":
                    with cancels_lock:
                        event = cancels.get(down.request_id)
                    if event is not None:
                        event.set()
                    continue
                cancelled = threading.Event()
                with cancels_lock:
                    cancels[down.request_id] = cancelled
                threading.Thread(
                    target=work, args=(down, cancelled), name=f"tunnel-req-{down.request_id}", daemon=True
                ).start()
        finally:
            ended.set()
            with cancels_lock:
                for event in cancels.values():
                    event.set()
            with self._lock:
                self._stream_cancel = None
            stream.cancel()
            try:
                outgoing.put_nowait(None)
            except queue.Full:
                pass
