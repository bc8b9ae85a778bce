"""The gRPC health service, saying what is true: SERVING only with a leader and a quorum.

A load balancer or probe that sees SERVING sends work here. A server that knows no
leader, or can reach fewer voters than a majority (itself counted), can answer no write
and no default read, so it says NOT_SERVING, for the overall service ("") and for each
drover service by name alike, and SERVING again once both hold. ``serving`` is the rule,
pure; ``HealthReporter.refresh`` reads the raft member and sets the statuses, and is
called by the membership loop (server/membership.py) every half second, so a lost quorum
is reported within a second of the connections dropping, or of the election timeout when
nothing drops (a partition).

Health stays open with ACLs on: it says SERVING or NOT_SERVING and nothing else.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from drover.server.autopilot import quorum
from drover.v1 import api_pb2

if TYPE_CHECKING:
    from drover.server.raft import RaftNode

__all__ = ["HealthReporter", "serving"]


def serving(*, leader_known: bool, voters: int, reachable_voters: int) -> bool:
    """Whether a server can serve: it knows a leader and reaches a majority of the voters
    (``reachable_voters`` counts itself)."""
    return leader_known and reachable_voters >= quorum(max(voters, 1))


def service_names() -> list[str]:
    """ "" (the server as a whole) and every drover gRPC service's full name."""
    return ["", *sorted(svc.full_name for svc in api_pb2.DESCRIPTOR.services_by_name.values())]


class HealthReporter:
    """grpc_health's servicer, with every name set together from the raft member's view."""

    def __init__(self) -> None:
        self.servicer = health.HealthServicer()
        self._lock = threading.Lock()
        self._serving: bool | None = None
        # NOT_SERVING until the first refresh has seen a leader.
        self._set(False)

    def add_to_server(self, server: grpc.Server | grpc.aio.Server) -> None:
        health_pb2_grpc.add_HealthServicer_to_server(self.servicer, server)

    def refresh(self, raft: RaftNode) -> bool:
        connected = sum(1 for _address, up in raft.peers() if up)
        now_serving = serving(
            leader_known=raft.leader_address() is not None,
            voters=len(raft.members()),
            reachable_voters=1 + connected,
        )
        self._set(now_serving)
        return now_serving

    def _set(self, now_serving: bool) -> None:
        with self._lock:
            if self._serving == now_serving:
                return
            self._serving = now_serving
            status = (
                health_pb2.HealthCheckResponse.SERVING
                if now_serving
                else health_pb2.HealthCheckResponse.NOT_SERVING
            )
            for name in service_names():
                self.servicer.set(name, status)
