"""The client agent's metric families, and what its HTTP port serves.

Counted where they happen: ``drover_client_task_restarts_total`` (a task started again by
its restart policy) and ``drover_client_driver_start_seconds`` (one driver ``start``), both
by ``driver`` (a driver this node has: mock, raw_exec). Read at scrape time
(``ClientCollector``): ``drover_client_allocs`` by ``client_status`` and
``drover_client_registered``.

A client-only agent holds no ACL state, so its port checks no token: it serves its own
metrics (counts by status and driver, no job, alloc or node names) and health, on the
address of ``-bind`` (loopback unless told), and ``/v1/status/leader`` is left to the
servers. docs/SECURITY.md says the same.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Final, Protocol

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from drover.client.taskstate import (
    CLIENT_COMPLETE,
    CLIENT_FAILED,
    CLIENT_PENDING,
    CLIENT_RUNNING,
    AllocStatus,
)
from drover.common.http_endpoint import (
    HttpEndpoint,
    Request,
    Response,
    Route,
    json_response,
    server_ssl_context,
)
from drover.common.prometheus import agent_registry, metrics_response
from drover.common.tls import TLSFiles

__all__ = [
    "DRIVER_START_SECONDS",
    "TASK_RESTARTS",
    "ClientCollector",
    "MonitoredClient",
    "client_health",
    "client_routes",
    "open_client_endpoint",
]

# Statuses a scrape always shows, at 0 when none: a dashboard's series never vanish.
CLIENT_STATUSES: Final = (CLIENT_PENDING, CLIENT_RUNNING, CLIENT_COMPLETE, CLIENT_FAILED, "lost", "unknown")

TASK_RESTARTS = Counter(
    "drover_client_task_restarts_total", "Tasks started again by their restart policy", ["driver"]
)
DRIVER_START_SECONDS = Histogram(
    "drover_client_driver_start_seconds",
    "Time of one driver start call (process spawned, or the start refused)",
    ["driver"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
)


class MonitoredClient(Protocol):
    """What the metrics read of a client agent (``ClientAgent`` fits)."""

    @property
    def registered(self) -> bool: ...
    def alloc_ids(self) -> list[str]: ...
    def alloc_status(self, alloc_id: str) -> AllocStatus | None: ...


class ClientCollector(Collector):
    def __init__(self, agent: MonitoredClient) -> None:
        self._agent = agent

    def collect(self) -> Iterator[Metric]:
        counts = dict.fromkeys(CLIENT_STATUSES, 0)
        for alloc_id in self._agent.alloc_ids():
            status = self._agent.alloc_status(alloc_id)
            if status is not None:
                counts[status.client_status] = counts.get(status.client_status, 0) + 1
        allocs = GaugeMetricFamily(
            "drover_client_allocs",
            "Allocations this client agent runs, by client status",
            labels=["client_status"],
        )
        for name, count in sorted(counts.items()):
            allocs.add_metric([name], count)
        yield allocs
        yield GaugeMetricFamily(
            "drover_client_registered",
            "1 while the servers hear this client (registered, last heartbeat succeeded)",
            value=int(self._agent.registered),
        )


def client_health(agent: MonitoredClient) -> dict[str, object]:
    """``/v1/agent/health``'s ``client`` part."""
    if agent.registered:
        return {"ok": True, "message": "ok"}
    return {"ok": False, "message": "not registered with any server"}


def client_routes(agent: MonitoredClient, registry: CollectorRegistry) -> Mapping[str, Route]:
    """A client-only agent's paths (the dev agent serves the server's, with this client's
    health and metrics in them)."""

    def metrics(request: Request) -> Response:
        return metrics_response(registry, request)

    def health(_request: Request) -> Response:
        part = client_health(agent)
        return json_response(200 if part["ok"] else 500, {"client": part})

    def leader(_request: Request) -> Response:
        return json_response(404, {"error": "a client agent does not track the leader: ask a server"})

    return {
        "/v1/metrics": metrics,
        "/metrics": metrics,
        "/v1/agent/health": health,
        "/v1/status/leader": leader,
    }


class EndpointSettings(Protocol):
    @property
    def bind(self) -> str: ...
    @property
    def http_port(self) -> int: ...
    @property
    def tls(self) -> TLSFiles | None: ...


def open_client_endpoint(agent: MonitoredClient, cfg: EndpointSettings) -> HttpEndpoint:
    """Bound on ``cfg.bind:cfg.http_port``; ``start`` it to serve. HTTPS with the client's
    certificate when it has one (a CA alone is for checking the servers)."""
    files = cfg.tls
    context = (
        server_ssl_context(files, require_client_cert=False)
        if files is not None and files.has_identity
        else None
    )
    registry = agent_registry(ClientCollector(agent))
    return HttpEndpoint(cfg.bind, cfg.http_port, client_routes(agent, registry), ssl_context=context)
