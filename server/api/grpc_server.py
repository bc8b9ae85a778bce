"""Assemble the gRPC server: drover's services, health checking and reflection."""

from __future__ import annotations

from concurrent import futures
from typing import TYPE_CHECKING, Final

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from drover.common.grpc_options import SERVER_MESSAGE_SIZE_OPTIONS
from drover.common.tls import server_credentials
from drover.server.api._decode import DecodeGuard
from drover.server.api.acl import ACLServicer
from drover.server.api.deployments import DeploymentsServicer
from drover.server.api.evals_allocs import AllocsServicer, EvalsServicer
from drover.server.api.events import EventsServicer
from drover.server.api.jobs import JobsServicer
from drover.server.api.nodes import NodesServicer
from drover.server.api.operator import OperatorServicer
from drover.server.api.services import ServicesServicer
from drover.server.telemetry.rpc import RpcMetrics
from drover.v1 import api_pb2, api_pb2_grpc

if TYPE_CHECKING:
    from drover.server.core import ServerCore

# Blocking queries and alloc watches park a thread each (at most MAX_PARKED_TOTAL, 160), and
# so does each client's tunnel (Nodes.Connect, for as long as the client is connected) and
# each followed log: size the pool for many clients beyond the parked queries. Threads are
# started only as calls need them.
MAX_WORKERS: Final = 768


def create_server(address: str, core: ServerCore) -> tuple[grpc.Server, int]:
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=MAX_WORKERS, thread_name_prefix="grpc"),
        options=[*SERVER_MESSAGE_SIZE_OPTIONS, ("grpc.so_reuseport", 0)],
        # Outermost first: every call counted and timed by method and code (drover_rpc_*,
        # server/telemetry/rpc.py), then undecodable requests refused with INVALID_ARGUMENT
        # and a rate-limited WARN (server/api/_decode.py).
        interceptors=[RpcMetrics(), DecodeGuard()],
    )
    api_pb2_grpc.add_JobsServicer_to_server(JobsServicer(core), server)
    api_pb2_grpc.add_NodesServicer_to_server(NodesServicer(core), server)
    api_pb2_grpc.add_EvalsServicer_to_server(EvalsServicer(core), server)
    api_pb2_grpc.add_AllocsServicer_to_server(AllocsServicer(core), server)
    api_pb2_grpc.add_OperatorServicer_to_server(OperatorServicer(core), server)
    api_pb2_grpc.add_ACLServicer_to_server(ACLServicer(core), server)
    api_pb2_grpc.add_DeploymentsServicer_to_server(DeploymentsServicer(core), server)
    api_pb2_grpc.add_EventsServicer_to_server(EventsServicer(core), server)
    api_pb2_grpc.add_ServicesServicer_to_server(ServicesServicer(core), server)
    health_servicer = health.HealthServicer()
    health_servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    # Health stays open with ACLs on: it says SERVING and nothing else (load balancers and
    # probes hold no token). Reflection describes the API to anyone who asks and checks no
    # token, so with ACLs on it is off (use proto/drover/v1/*.proto).
    if not core.cfg.acl_enabled:
        names = [svc.full_name for svc in api_pb2.DESCRIPTOR.services_by_name.values()]
        reflection.enable_server_reflection((*names, health.SERVICE_NAME, reflection.SERVICE_NAME), server)
    if core.tls is None:
        port = server.add_insecure_port(address)
    else:
        # TLS only: a plaintext caller fails the handshake, and with verification so does
        # one without a certificate from the CA.
        credentials = server_credentials(core.tls, require_client_cert=core.cfg.tls_verify_https_client)
        port = server.add_secure_port(address, credentials)
    if port == 0:
        raise OSError(f"can not bind gRPC to {address}")
    return server, port
