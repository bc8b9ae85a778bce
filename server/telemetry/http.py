"""A server's HTTP port (``-http-port``, 4649): metrics, the leader, health.

============================================  ==========================================
``GET /v1/metrics?format=prometheus``,        this server's registry in Prometheus' text
``GET /metrics``                              format; with ACLs on, a token with
                                              ``agent`` read (header ``X-Nomad-Token``,
                                              ``X-Drover-Token`` or ``Authorization:
                                              Bearer``), else 403
``GET /v1/status/leader``                     the leader's gRPC address as a JSON string
                                              (``"127.0.0.1:4646"``), ``""`` when none is
                                              known; open
``GET /v1/agent/health``                      ``{"server": {"ok": ..., "message": ...}}``
                                              (and ``"client"`` on a dev agent); 200 when
                                              every part is ok, else 500; open
============================================  ==========================================

The leader and health stay open with ACLs on, as Nomad's do: load balancers and probes
hold no token, and neither says more than the gRPC health service does. With TLS the port
is HTTPS with the gRPC port's certificate, and with ``-tls-verify-client`` a caller needs a
certificate from the CA here too. The token is resolved exactly as a gRPC call's
(server/acl/resolve.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from drover.client.metrics import MonitoredClient, client_health
from drover.common.http_endpoint import (
    HttpEndpoint,
    Request,
    Response,
    Route,
    json_response,
    server_ssl_context,
    token_of,
)
from drover.common.prometheus import metrics_response
from drover.server.acl.resolve import resolve
from drover.server.errors import PermissionDeniedError

if TYPE_CHECKING:
    from drover.server.core import ServerCore

__all__ = ["open_server_endpoint", "server_health", "server_routes"]


def server_health(core: ServerCore) -> dict[str, object]:
    """``/v1/agent/health``'s ``server`` part: ok while a leader is known."""
    leader = core.raft.leader_address()
    if leader is None:
        return {"ok": False, "message": "no known leader"}
    return {"ok": True, "message": "ok"}


def refusal(core: ServerCore, request: Request) -> Response | None:
    """None if the caller may read this agent's metrics; else the 403 to send."""
    if not core.cfg.acl_enabled:
        return None
    try:
        identity = resolve(core.store.snapshot(), token_of(request.headers))
    except PermissionDeniedError as exc:
        return json_response(403, {"error": str(exc)})
    if not identity.acl.allows_level("agent", "read"):
        return json_response(403, {"error": "Permission denied: reading metrics needs agent read"})
    return None


def server_routes(core: ServerCore, *, client: MonitoredClient | None = None) -> Mapping[str, Route]:
    """The paths a server serves; ``client``: the dev agent's embedded client, whose health
    joins the server's (its metrics are in ``core.metrics`` already)."""

    def metrics(request: Request) -> Response:
        refused = refusal(core, request)
        return refused if refused is not None else metrics_response(core.metrics, request)

    def leader(_request: Request) -> Response:
        return json_response(200, core.leader_grpc_address() or "")

    def health(_request: Request) -> Response:
        parts = {"server": server_health(core)}
        if client is not None:
            parts["client"] = client_health(client)
        ok = all(part["ok"] for part in parts.values())
        return json_response(200 if ok else 500, parts)

    return {
        "/v1/metrics": metrics,
        "/metrics": metrics,
        "/v1/status/leader": leader,
        "/v1/agent/health": health,
    }


def open_server_endpoint(core: ServerCore, *, client: MonitoredClient | None = None) -> HttpEndpoint:
    """Bound on the server's ``-bind`` address and ``-http-port``; ``start`` it to serve."""
    cfg = core.cfg
    files = cfg.tls
    context = (
        server_ssl_context(files, require_client_cert=cfg.tls_verify_https_client)
        if files is not None
        else None
    )
    return HttpEndpoint(cfg.bind, cfg.http_port, server_routes(core, client=client), ssl_context=context)
