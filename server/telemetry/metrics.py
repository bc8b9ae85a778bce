"""The server's metric families, and the collector that reads its gauges when scraped
(its registry: drover/common/prometheus.py).

Counted where they happen (hot paths pay one ``inc`` or ``observe``):

========================================  ===============================================
``drover_rpc_requests_total``             gRPC calls served, by ``method`` and ``code``
``drover_rpc_request_seconds``            their latency, by ``method`` and ``code``
``drover_fsm_apply_seconds``              ``FSM.apply`` per raft entry, by entry ``type``
``drover_raft_append_seconds``            leader: an append to a follower until its answer
``drover_raft_commit_seconds``            leader: proposal until committed and applied here
``drover_raft_batch_requests``            leader: writes per raft entry (group commit)
``drover_worker_evals_processed_total``   evals a worker finished, by ``scheduler`` type and
                                          ``outcome`` (the status written, or ``nacked``)
``drover_worker_schedule_seconds``        one scheduler pass, by ``scheduler`` type
``drover_broker_evals_failed_total``      evals past the broker's delivery limit
``drover_heartbeat_invalidations_total``  nodes whose heartbeat timer ran out
``drover_heartbeat_ttl_seconds``          the TTLs the leader hands out
``drover_gc_frozen_objects``              a server agent's objects frozen out of the cyclic
                                          collector's view (server/gc_freeze.py)
``drover_api_loop_lag_seconds``           how late the API's event loop woke a timer: the
                                          wait before every call's handler (loop_lag.py)
========================================  ===============================================

Defined where they were first needed, and kept there: ``drover_plan_apply_seconds``,
``drover_plan_commit_seconds``, ``drover_plan_node_rejected_total``,
``drover_plan_node_marked_ineligible_total`` (server/plan_apply.py) and
``drover_invariant_violations`` (server/leader.py's periodic check).

Every agent, server or client, also exports ``drover_gc_pause_seconds``: how long the
process stopped for each cyclic garbage collection (drover/common/gc_pauses.py).

Read at scrape time (``ServerCollector``): raft term, commit and applied index, leader,
last contact per peer (by server name); broker evals by state and scheduler type; plan
queue depth; active heartbeat timers.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Final

import structlog
from prometheus_client import Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from drover.scheduler.structs import JOB_TYPES
from drover.v1 import raft_pb2

if TYPE_CHECKING:
    from drover.server.core import ServerCore

__all__ = [
    "BROKER_EVALS_FAILED",
    "FSM_APPLY_SECONDS",
    "GC_FROZEN_OBJECTS",
    "HEARTBEAT_INVALIDATIONS",
    "HEARTBEAT_TTL_SECONDS",
    "RAFT_APPEND_SECONDS",
    "RAFT_BATCH_REQUESTS",
    "RAFT_COMMIT_SECONDS",
    "RPC_REQUESTS",
    "RPC_SECONDS",
    "WORKER_EVALS",
    "WORKER_SCHEDULE_SECONDS",
    "ServerCollector",
    "entry_type_label",
]

log = structlog.get_logger("drover.telemetry")

# Sub-millisecond to tens of seconds: reads answer in well under a millisecond, blocking
# queries and raft writes take up to their timeouts.
LATENCY_BUCKETS: Final = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
)  # fmt: skip
TTL_BUCKETS: Final = (5.0, 10.0, 15.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0)

RPC_REQUESTS = Counter("drover_rpc_requests_total", "gRPC calls served by this server", ["method", "code"])
RPC_SECONDS = Histogram(
    "drover_rpc_request_seconds",
    "Time to serve one gRPC call (a stream: until its last message)",
    ["method", "code"],
    buckets=LATENCY_BUCKETS,
)
FSM_APPLY_SECONDS = Histogram(
    "drover_fsm_apply_seconds", "Time to apply one raft entry to the state", ["type"], buckets=LATENCY_BUCKETS
)
RAFT_APPEND_SECONDS = Histogram(
    "drover_raft_append_seconds",
    "On the leader: from its oldest unanswered append to a follower until that follower answers",
    buckets=LATENCY_BUCKETS,
)
RAFT_BATCH_REQUESTS = Histogram(
    "drover_raft_batch_requests",
    "On the leader: how many writes one raft entry carried (server/write_batch.py)",
    buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256),
)
RAFT_COMMIT_SECONDS = Histogram(
    "drover_raft_commit_seconds",
    "On the leader: time from proposing an entry until it is committed and applied here",
    buckets=LATENCY_BUCKETS,
)
WORKER_EVALS = Counter(
    "drover_worker_evals_processed_total",
    "Evaluations a scheduling worker finished: the status it wrote, or nacked",
    ["scheduler", "outcome"],
)
WORKER_SCHEDULE_SECONDS = Histogram(
    "drover_worker_schedule_seconds",
    "Time of one scheduler pass over a snapshot (a worker may make several per eval)",
    ["scheduler"],
    buckets=LATENCY_BUCKETS,
)
BROKER_EVALS_FAILED = Counter(
    "drover_broker_evals_failed_total",
    "Evaluations that reached the broker's delivery limit",
    ["scheduler"],
)
GC_FROZEN_OBJECTS = Gauge(
    "drover_gc_frozen_objects",
    "Objects a server agent moved out of the cyclic collector's view after its last full collection (server/gc_freeze.py)",
)
HEARTBEAT_INVALIDATIONS = Counter(
    "drover_heartbeat_invalidations_total", "Nodes whose heartbeat timer ran out on the leader"
)
HEARTBEAT_TTL_SECONDS = Histogram(
    "drover_heartbeat_ttl_seconds", "Heartbeat TTLs the leader handed to client agents", buckets=TTL_BUCKETS
)

_ENTRY_TYPE_PREFIX: Final = "ENTRY_TYPE_"


def entry_type_label(data: bytes) -> str:
    """The entry type of a serialized ``LogEntry``, read from its first field without
    decoding the payload: ``job_register``, or ``unknown``.

    ``type`` is field 1, a varint, and serialized first; a zero type is not serialized."""
    if not data or data[0] != 0x08:
        return "unknown"
    value = shift = 0
    for byte in data[1:11]:
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return _TYPE_NAMES.get(value, "unknown")
        shift += 7
    return "unknown"


_TYPE_NAMES: Final[dict[int, str]] = {
    int(number): name.removeprefix(_ENTRY_TYPE_PREFIX).lower()
    for name, number in raft_pb2.EntryType.items()
    if name != "ENTRY_TYPE_UNSPECIFIED"
}


class ServerCollector(Collector):
    """Gauges read from one server when it is scraped."""

    def __init__(self, core: ServerCore) -> None:
        self._core = core

    def collect(self) -> Iterator[Metric]:
        try:
            yield from self._raft()
            yield from self._leader_services()
        except Exception:
            # A scrape must still return the rest; a half-built server (starting or stopping)
            # is the usual cause.
            log.exception("telemetry.server_collect_failed")

    def _raft(self) -> Iterator[Metric]:
        raft = self._core.raft
        yield _gauge("drover_raft_term", "This server's current raft term", raft.term())
        yield _gauge(
            "drover_raft_commit_index",
            "The highest raft index this server knows committed",
            raft.commit_index(),
        )
        yield _gauge(
            "drover_raft_applied_index",
            "The highest raft index applied to this server's state",
            raft.applied_index(),
        )
        yield _gauge("drover_raft_leader", "1 while this server is the raft leader", int(raft.is_leader()))
        names = {m.raft_address: m.name for m in self._core.store.snapshot().servers()}
        contact = GaugeMetricFamily(
            "drover_raft_last_contact_seconds",
            "On the leader: seconds since each follower last answered an append",
            labels=["peer"],
        )
        for address, seconds in sorted(raft.last_contact().items()):
            contact.add_metric([names.get(address, address)], seconds)
        yield contact

    def _leader_services(self) -> Iterator[Metric]:
        leader = self._core.leader
        evals = GaugeMetricFamily(
            "drover_broker_evals",
            "Evaluations the leader's broker holds, by state (ready, unacked, waiting, delayed, "
            "failed, blocked) and scheduler type",
            labels=["state", "scheduler"],
        )
        counts = {**leader.broker.counts_by_type(), **leader.blocked.counts_by_type()}
        for state in ("ready", "unacked", "waiting", "delayed", "failed", "blocked"):
            for job_type in JOB_TYPES:
                evals.add_metric([state, job_type], counts.get((state, job_type), 0))
        yield evals
        yield _gauge(
            "drover_plan_queue_depth", "Plans waiting for the plan applier", leader.plan_queue.depth()
        )
        yield _gauge(
            "drover_heartbeat_active_timers",
            "Nodes the leader has a heartbeat timer for",
            self._core.heartbeats.tracked(),
        )


def _gauge(name: str, documentation: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, documentation, value=value)
