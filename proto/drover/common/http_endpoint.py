"""The agents' small HTTP port: a few read-only GET routes on a standard-library server.

Servers, client agents and the dev agent all serve metrics and health over HTTP (Nomad's
port 4646 carries them; drover's gRPC port does the API, so this is a second port,
``-http-port``, 4649 by default). The routes are plain functions from a ``Request`` to a
``Response``; this module owns only the serving: one daemon thread per agent plus one per
connection (``ThreadingHTTPServer``), TLS with the agent's own certificate when it has one,
GET only, 404 for any other path. Who may read what is decided by the routes (the server's
check the caller's ACL token), never here.

The client agent uses it too, so it lives in ``drover.common`` and imports no drover code.
"""

from __future__ import annotations

import json
import socket
import ssl
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Final, Protocol
from urllib.parse import parse_qs, urlsplit

import structlog

from drover.common.tls import TLSFiles

__all__ = [
    "DEFAULT_HTTP_PORT",
    "Headers",
    "HttpEndpoint",
    "Request",
    "Response",
    "Route",
    "json_response",
    "server_ssl_context",
    "token_of",
]

DEFAULT_HTTP_PORT: Final = 4649
# A scrape that stalls (a client that connects and sends nothing) must not hold a thread
# for ever.
REQUEST_TIMEOUT_S: Final = 10.0
# Request headers the ACL token may arrive in: Nomad's, drover's gRPC metadata key, and
# the Bearer form Prometheus' ``authorization`` config sends.
TOKEN_HEADERS: Final = ("X-Nomad-Token", "X-Drover-Token")

log = structlog.get_logger("drover.http")


class Headers(Protocol):
    """A request's headers: http.server's (case-insensitive) message, or a plain dict."""

    def get(self, name: str, /) -> str | None: ...


@dataclass(frozen=True, slots=True)
class Request:
    path: str
    query: Mapping[str, list[str]] = field(default_factory=dict)
    headers: Headers = field(default_factory=lambda: dict[str, str]())

    def param(self, name: str) -> str:
        values = self.query.get(name)
        return values[0] if values else ""


@dataclass(frozen=True, slots=True)
class Response:
    status: int
    body: bytes
    content_type: str = "text/plain; charset=utf-8"


Route = Callable[[Request], Response]


def json_response(status: int, value: object) -> Response:
    return Response(status, json.dumps(value).encode() + b"\n", "application/json")


def token_of(headers: Headers) -> str:
    """The ACL secret a request presents; empty when it presents none.

    Header names are matched as ``headers`` matches them: http.server's are case-insensitive."""
    for name in TOKEN_HEADERS:
        value = headers.get(name)
        if value:
            return value.strip()
    auth = headers.get("Authorization") or ""
    scheme, _, credentials = auth.partition(" ")
    if scheme.lower() == "bearer":
        return credentials.strip()
    return ""


def server_ssl_context(files: TLSFiles, *, require_client_cert: bool) -> ssl.SSLContext:
    """HTTPS with the agent's gRPC certificate; with ``require_client_cert`` a caller
    without a certificate from the CA fails the handshake, as on the gRPC port."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(files.cert_file, files.key_file)
    if require_client_cert:
        context.load_verify_locations(cafile=files.ca_file)
        context.verify_mode = ssl.CERT_REQUIRED
    return context


class HttpEndpoint:
    """``routes`` served on ``host:port`` (0: any free port) until ``stop``.

    Binds in the constructor, so a port that is taken fails the agent's start (``OSError``)
    before anything else runs, as the gRPC port does."""

    def __init__(
        self,
        host: str,
        port: int,
        routes: Mapping[str, Route],
        *,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self._routes = dict(routes)
        self._server = _Server((host, port), _handler_for(self._routes), ssl_context)
        self.host = host
        self.port = int(self._server.server_address[1])
        self.scheme = "https" if ssl_context is not None else "http"
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.2}, name="http", daemon=True
        )

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def start(self) -> None:
        self._thread.start()
        log.info("http.started", address=self.address, scheme=self.scheme, paths=sorted(self._routes))

    def stop(self) -> None:
        if self._thread.is_alive():
            self._server.shutdown()
            self._thread.join(timeout=5)
        self._server.server_close()


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(
        self,
        address: tuple[str, int],
        handler: type[BaseHTTPRequestHandler],
        ssl_context: ssl.SSLContext | None,
    ) -> None:
        self._ssl_context = ssl_context
        super().__init__(address, handler)

    def get_request(self) -> tuple[socket.socket, object]:
        sock, addr = self.socket.accept()
        sock.settimeout(REQUEST_TIMEOUT_S)
        if self._ssl_context is None:
            return sock, addr
        # The handshake waits for the connection's own thread (finish_request), so one slow
        # or plaintext caller blocks no one else's accept.
        return self._ssl_context.wrap_socket(sock, server_side=True, do_handshake_on_connect=False), addr

    def finish_request(
        self, request: socket.socket | tuple[bytes, socket.socket], client_address: object
    ) -> None:
        if isinstance(request, ssl.SSLSocket):
            request.do_handshake()
        super().finish_request(request, client_address)

    def handle_error(self, request: object, client_address: object) -> None:
        # A failed TLS handshake or a dropped connection: the caller's problem, not a traceback.
        log.debug("http.connection_failed", peer=str(client_address))


def _handler_for(routes: Mapping[str, Route]) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "drover"
        sys_version = ""
        protocol_version = "HTTP/1.1"
        timeout = REQUEST_TIMEOUT_S

        def do_GET(self) -> None:
            parts = urlsplit(self.path)
            route = routes.get(parts.path)
            if route is None:
                self._send(json_response(404, {"error": f"no such path: {parts.path}"}))
                return
            request = Request(parts.path, parse_qs(parts.query), self.headers)
            try:
                response = route(request)
            except Exception:
                log.exception("http.route_failed", path=parts.path)
                response = json_response(500, {"error": "internal error"})
            self._send(response)

        def _refuse_method(self) -> None:
            self._send(
                json_response(405, {"error": f"method {self.command} not allowed: GET only"}), allow=True
            )

        do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = do_OPTIONS = _refuse_method

        def _send(self, response: Response, *, allow: bool = False) -> None:
            self.send_response(response.status)
            self.send_header("Content-Type", response.content_type)
            self.send_header("Content-Length", str(len(response.body)))
            if allow:
                self.send_header("Allow", "GET")
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(response.body)

        def log_message(self, format: str, *args: object) -> None:
            log.debug("http.request", line=format % args)

    return Handler
