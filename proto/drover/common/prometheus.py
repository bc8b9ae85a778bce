"""One agent's Prometheus registry and the HTTP answer a scrape gets from it.

Shared by servers and client agents (the dev agent is both): each agent's gauges are
collectors that read its own objects at scrape time, registered on a registry of its own,
to which this process's module-level counters and histograms (prometheus-client's default
registry) are forwarded. Two agents in one process (tests) then never collide, and a dev
agent's one registry holds its server's and its client's families alike.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from drover.common.gc_pauses import gc_pause_collector
from drover.common.http_endpoint import Request, Response, json_response

__all__ = ["FORMATS", "agent_registry", "metrics_response"]

# ``/v1/metrics?format=...``: Prometheus' text format is the only one (Nomad's JSON form is
# not served); no ``format`` means the same.
FORMATS: Final = ("prometheus",)


class _ProcessDefaults(Collector):
    """prometheus-client's default registry, forwarded: the module-level families, and
    the process and GC collectors."""

    def collect(self) -> Iterable[Metric]:
        return REGISTRY.collect()


def agent_registry(*collectors: Collector) -> CollectorRegistry:
    """A registry of this process's module-level families, its GC pauses
    (drover/common/gc_pauses.py) and ``collectors``."""
    # auto_describe off: the forwarded default registry would otherwise be collected at
    # registration just to learn its names (nothing here can collide: each agent has one).
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_ProcessDefaults())
    registry.register(gc_pause_collector())
    for collector in collectors:
        registry.register(collector)
    return registry


def metrics_response(registry: CollectorRegistry, request: Request) -> Response:
    """The Prometheus text exposition of ``registry``; 400 for a format not served."""
    wanted = request.param("format") or FORMATS[0]
    if wanted not in FORMATS:
        return json_response(400, {"error": f"format {wanted!r} not supported: use format=prometheus"})
    return Response(200, generate_latest(registry), CONTENT_TYPE_LATEST)
