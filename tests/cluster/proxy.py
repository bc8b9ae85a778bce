"""A fault-injecting TCP proxy: put it between a client agent and a server, then cut the wire.

::

    with TcpProxy("127.0.0.1:4646") as proxy:      # listens on a free loopback port
        start_client(servers=[proxy.address])
        proxy.cut()                                 # every live connection is reset,
        ...                                         # new ones are reset on connect
        proxy.heal()                                # new connections are forwarded again

``cut(mode)`` first aborts every live connection (both sides get a TCP reset, so neither
waits for a timeout), then treats new connections according to ``mode``:

* ``REFUSE`` (the default): a new connection is accepted and reset at once. To the
  connecting side that is a failed connect, which gRPC reports as UNAVAILABLE, exactly
  like ECONNREFUSED; the listening port stays bound, so ``heal()`` can never lose it to
  another process.
* ``BLACKHOLE``: a new connection is accepted and then held open, never read from, never
  forwarded, never answered (a peer that vanished). gRPC's calls then end by their
  deadline (DEADLINE_EXCEEDED), not by an error. Held connections are reset on ``heal()``
  so the other side reconnects through the healed proxy.

Threads: one listener, plus two pumps per forwarded connection (one per direction).
``close()`` (or leaving the ``with`` block) stops and joins all of them, whatever state the
proxy is in; a pump is woken by ``shutdown()`` of its sockets, never by closing a file
descriptor another thread may still be blocked on.
"""

from __future__ import annotations

import contextlib
import selectors
import socket
import struct
import threading
from dataclasses import dataclass
from typing import Final

__all__ = ["BLACKHOLE", "REFUSE", "ProxyStats", "TcpProxy", "proxies_for"]

REFUSE: Final = "refuse"
BLACKHOLE: Final = "blackhole"
_MODES: Final = (REFUSE, BLACKHOLE)
_CHUNK: Final = 64 * 1024
_ACCEPT_POLL_S: Final = 0.05
_CONNECT_TIMEOUT_S: Final = 2.0
_JOIN_TIMEOUT_S: Final = 5.0
# SO_LINGER on, 0 s: close() sends RST instead of FIN and drops unsent data.
_LINGER_RST: Final = struct.pack("ii", 1, 0)


def _parse(address: str | tuple[str, int]) -> tuple[str, int]:
    if isinstance(address, tuple):
        return address
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"{address!r} is not a host:port address")
    return host, int(port)


def _reset(sock: socket.socket) -> None:
    """Close ``sock`` with a TCP reset (only call once no other thread uses it)."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_RST)
    with contextlib.suppress(OSError):
        sock.close()


def _wake(sock: socket.socket) -> None:
    """Make any recv/send blocked on ``sock`` in another thread return at once."""
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)


@dataclass(frozen=True, slots=True)
class ProxyStats:
    accepted: int  # every connection the listener accepted
    forwarded: int  # of those, connected through to the target
    refused: int  # reset on arrival while cut (REFUSE)
    blackholed: int  # held silently while cut (BLACKHOLE)
    aborted: int  # live connections reset by cut()
    live: int  # forwarded connections open now
    bytes_up: int  # client -> target
    bytes_down: int  # target -> client


class _Link:
    """One forwarded connection: two sockets and the two pumps between them."""

    def __init__(self, proxy: TcpProxy, downstream: socket.socket, upstream: socket.socket) -> None:
        self._proxy = proxy
        self.downstream = downstream
        self.upstream = upstream
        self._lock = threading.Lock()
        self._running = 2
        self.aborted = False
        self.threads = [
            threading.Thread(target=self._pump, args=(downstream, upstream, True), daemon=True),
            threading.Thread(target=self._pump, args=(upstream, downstream, False), daemon=True),
        ]
        for i, t in enumerate(self.threads):
            t.name = f"{proxy.name}-pump-{'up' if i == 0 else 'down'}"

    def start(self) -> None:
        for t in self.threads:
            t.start()

    def abort(self) -> None:
        """Reset both sides; the pumps notice, end, and the last one closes the sockets."""
        with self._lock:
            self.aborted = True
        _wake(self.downstream)
        _wake(self.upstream)

    def _pump(self, src: socket.socket, dst: socket.socket, up: bool) -> None:
        try:
            while True:
                data = src.recv(_CHUNK)
                if not data:
                    break
                dst.sendall(data)
                self._proxy._count_bytes(len(data), up)
        except OSError:
            pass
        finally:
            # One direction ended: end the other too (a half-open link is of no use here).
            _wake(dst)
            _wake(src)
            with self._lock:
                self._running -= 1
                last = self._running == 0
                aborted = self.aborted
            if last:
                if aborted:
                    _reset(self.downstream)
                    _reset(self.upstream)
                else:
                    self.downstream.close()
                    self.upstream.close()
                self._proxy._forget(self)


class TcpProxy:
    """Forward connections from a free loopback port to ``target`` until cut (module doc)."""

    def __init__(
        self,
        target: str | tuple[str, int],
        *,
        listen_host: str = "127.0.0.1",
        listen_port: int = 0,
        name: str = "",
    ) -> None:
        self.target = _parse(target)
        self.name = name or f"proxy->{self.target[0]}:{self.target[1]}"
        self._lock = threading.Lock()
        self._mode: str | None = None
        self._links: set[_Link] = set()
        self._held: list[socket.socket] = []
        self._stopping = threading.Event()
        self._listener: threading.Thread | None = None
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((listen_host, listen_port))
        self._sock.listen(128)
        self._sock.setblocking(False)
        self.host, self.port = self._sock.getsockname()[:2]
        self._accepted = self._forwarded = self._refused = self._blackholed = self._aborted = 0
        self._bytes_up = self._bytes_down = 0
        self._closed = False

    # -- lifecycle ------------------------------------------------------------------------

    @property
    def address(self) -> str:
        """``host:port`` to give the client instead of the target's address."""
        return f"{self.host}:{self.port}"

    def start(self) -> TcpProxy:
        if self._listener is not None:
            raise RuntimeError(f"{self.name} already started")
        if self._closed:
            raise RuntimeError(f"{self.name} is closed")
        self._listener = threading.Thread(target=self._accept_loop, name=f"{self.name}-listen", daemon=True)
        self._listener.start()
        return self

    def __enter__(self) -> TcpProxy:
        if self._listener is None:
            self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop listening, reset every connection, join every thread. Safe to call again."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._mode = REFUSE
        self._stopping.set()
        if self._listener is not None:
            self._listener.join(_JOIN_TIMEOUT_S)
        with contextlib.suppress(OSError):
            self._sock.close()
        self._abort_all()
        self._release_held()

    # -- faults ---------------------------------------------------------------------------

    @property
    def mode(self) -> str | None:
        """None while forwarding, else the mode of the current cut."""
        with self._lock:
            return self._mode

    @property
    def is_cut(self) -> bool:
        return self.mode is not None

    def cut(self, mode: str = REFUSE) -> None:
        """Reset every live connection; until ``heal()``, treat new ones per ``mode``.

        Returns once no byte flows through the proxy any more. Cutting again switches mode.
        """
        if mode not in _MODES:
            raise ValueError(f"mode must be one of {_MODES}, got {mode!r}")
        with self._lock:
            if self._closed:
                raise RuntimeError(f"{self.name} is closed")
            self._mode = mode
        self._abort_all()
        if mode == REFUSE:
            self._release_held()

    def heal(self) -> None:
        """Forward new connections again; blackholed ones are reset so their side retries."""
        with self._lock:
            if self._closed:
                raise RuntimeError(f"{self.name} is closed")
            self._mode = None
        self._release_held()

    def stats(self) -> ProxyStats:
        with self._lock:
            return ProxyStats(
                accepted=self._accepted,
                forwarded=self._forwarded,
                refused=self._refused,
                blackholed=self._blackholed,
                aborted=self._aborted,
                live=len(self._links),
                bytes_up=self._bytes_up,
                bytes_down=self._bytes_down,
            )

    def threads_alive(self) -> int:
        """Threads of this proxy still running (0 after ``close()``)."""
        with self._lock:
            links = list(self._links)
        alive = sum(1 for link in links for t in link.threads if t.is_alive())
        return alive + (1 if self._listener is not None and self._listener.is_alive() else 0)

    # -- internals ------------------------------------------------------------------------

    def _abort_all(self) -> None:
        with self._lock:
            links = list(self._links)
            self._aborted += len(links)
        for link in links:
            link.abort()
        for link in links:
            for t in link.threads:
                t.join(_JOIN_TIMEOUT_S)

    def _release_held(self) -> None:
        with self._lock:
            held, self._held = self._held, []
        for sock in held:
            _reset(sock)

    def _forget(self, link: _Link) -> None:
        with self._lock:
            self._links.discard(link)

    def _count_bytes(self, n: int, up: bool) -> None:
        with self._lock:
            if up:
                self._bytes_up += n
            else:
                self._bytes_down += n

    def _accept_loop(self) -> None:
        with selectors.DefaultSelector() as sel:
            sel.register(self._sock, selectors.EVENT_READ)
            while not self._stopping.is_set():
                if not sel.select(_ACCEPT_POLL_S):
                    continue
                try:
                    conn, _ = self._sock.accept()
                except (BlockingIOError, InterruptedError):
                    continue
                except OSError:
                    if self._stopping.is_set():
                        return
                    continue
                conn.setblocking(True)
                self._admit(conn)

    def _admit(self, conn: socket.socket) -> None:
        # Decided under the lock, so a cut() that returned has seen every link made before.
        with self._lock:
            self._accepted += 1
            mode = self._mode
            if mode == BLACKHOLE:
                self._blackholed += 1
                self._held.append(conn)
                return
            if mode == REFUSE:
                self._refused += 1
            else:
                try:
                    upstream = socket.create_connection(self.target, timeout=_CONNECT_TIMEOUT_S)
                except OSError:
                    upstream = None
                if upstream is not None:
                    upstream.settimeout(None)
                    with contextlib.suppress(OSError):
                        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                        upstream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                    link = _Link(self, conn, upstream)
                    self._links.add(link)
                    self._forwarded += 1
                    link.start()
                    return
        _reset(conn)  # refused, or the target is down: the client sees a reset


def proxies_for(targets: list[str], name: str = "") -> list[TcpProxy]:
    """One started proxy per target address (a client's view of every server)."""
    out: list[TcpProxy] = []
    try:
        for i, target in enumerate(targets):
            out.append(TcpProxy(target, name=f"{name or 'proxy'}-{i}").start())
    except BaseException:
        for p in out:
            p.close()
        raise
    return out
