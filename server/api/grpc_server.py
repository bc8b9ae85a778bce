"""Assemble the gRPC server: drover's services, health checking and reflection.

The server is grpc.aio, on one event loop thread shared by every server in the process
(``api_loop``): a waiting caller (a blocking query, an alloc watch) costs a coroutine, not
a thread. Plain handlers stay sync and run in a pool of ``API_THREADS``; a write runs on the
loop itself and awaits its commit there (server/inline.py), except the few operator writes
that wait otherwise, which run in one of ``WRITE_THREADS``. The bridge between the two, and
what each kind of handler costs, is server/api/_aio.py. ``ApiServer`` gives
``ServerCore`` the sync start/stop it had with ``grpc.server``.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from concurrent import futures
from typing import TYPE_CHECKING, Any, Final, TypeVar

import grpc
from grpc_health.v1 import health
from grpc_reflection.v1alpha import reflection

from drover.common.grpc_options import SERVER_MESSAGE_SIZE_OPTIONS
from drover.common.tls import server_credentials
from drover.server.api._aio import SyncBridge
from drover.server.api._decode import AioDecodeGuard
from drover.server.api._limits import MAX_PARKED_TOTAL, caller_limits
from drover.server.api._notify import IndexNotifier, attach_notifier
from drover.server.api.acl import ACLServicer
from drover.server.api.deployments import DeploymentsServicer
from drover.server.api.evals_allocs import AllocsServicer, EvalsServicer
from drover.server.api.events import EventsServicer
from drover.server.api.jobs import JobsServicer
from drover.server.api.nodes import NodesServicer
from drover.server.api.operator import OperatorServicer
from drover.server.api.services import ServicesServicer
from drover.server.telemetry.loop_lag import start_loop_lag_probe
from drover.server.telemetry.rpc import AioRpcMetrics
from drover.v1 import api_pb2, api_pb2_grpc

if TYPE_CHECKING:
    from drover.server.core import ServerCore

# The sync handlers' pool: they read a snapshot, then return. No handler waits in it for a
# change (those park on the loop), so it is sized for the calls in flight at once on two
# cores, not for the callers connected.
API_THREADS: Final = 32
# The pool of the write RPCs declared ``rpc(..., "write", inline=False)`` (the operator's
# restores, recounts, collections and membership changes); every other write runs on the
# loop (server/inline.py). It used to serve every write, which waited in its thread for
# its raft commit, so it bounded the writes per commit round (group commit,
# server/write_batch.py, packs whatever is in flight into one entry). At 32, with a commit round of ~1 s on
# a loaded machine, 2,000 fleet clients registering got ~30 writes/s while heartbeats
# queued behind them past their 5 s deadline and their nodes were marked down.
WRITE_THREADS: Final = 256
# Calls that reach grpc's core before the aio server has asked for them wait in its pending
# queue, and core cancels (CANCELLED, at once) what arrives past max_pending_requests_hard_limit
# (3,000 by default; the soft limit of 1,000 lets only quick ones in). A burst of that many
# is what a fleet makes when its watches are re-issued together (a failover, a big placement):
# 5,000 fleet clients saw 22,259 watches cancelled, each followed by a re-registration. The
# queue must take a whole server's parked calls at once (MAX_PARKED_TOTAL), with room.
API_SERVER_OPTIONS: Final[tuple[tuple[str, int], ...]] = (
    *SERVER_MESSAGE_SIZE_OPTIONS,
    ("grpc.so_reuseport", 0),
    ("grpc.server.max_pending_requests", 2 * MAX_PARKED_TOTAL),
    ("grpc.server.max_pending_requests_hard_limit", 3 * MAX_PARKED_TOTAL),
)
# How long stop() waits for the loop to finish stopping the server, beyond the grace.
_STOP_MARGIN_S: Final = 5.0

T = TypeVar("T")

_LOOP_LOCK: Final = threading.Lock()
_LOOP: list[asyncio.AbstractEventLoop] = []


def api_loop() -> asyncio.AbstractEventLoop:
    """The process's one API event loop, on its own daemon thread (started on first use).

    One loop for every server in the process (tests run several): grpc.aio shares one
    completion queue per process, and loops in several threads contend for it."""
    with _LOOP_LOCK:
        if not _LOOP:
            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, name="api-loop", daemon=True).start()
            start_loop_lag_probe(loop)
            _LOOP.append(loop)
        return _LOOP[0]


def _on_loop(coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
    return asyncio.run_coroutine_threadsafe(coro, api_loop()).result(timeout)


class ApiServer:
    """One server's grpc.aio server, driven from any thread."""

    def __init__(
        self,
        server: grpc.aio.Server,
        bridge: SyncBridge,
        notifier: IndexNotifier,
        pools: tuple[futures.ThreadPoolExecutor, ...],
    ) -> None:
        self._server = server
        self._bridge = bridge
        self._notifier = notifier
        self._pools = pools

    def start(self) -> None:
        _on_loop(self._server.start())

    def stop(self, grace: float | None) -> threading.Event:
        """Stop serving (calls in flight get ``grace`` seconds); the event is set once done."""
        stopped = threading.Event()
        self._notifier.stop()
        try:
            _on_loop(self._stop(grace), None if grace is None else grace + _STOP_MARGIN_S)
        finally:
            for pool in self._pools:
                pool.shutdown(wait=False, cancel_futures=True)
            stopped.set()
        return stopped

    async def _stop(self, grace: float | None) -> None:
        await self._server.stop(grace)
        await self._bridge.close()


def create_server(address: str, core: ServerCore) -> tuple[ApiServer, int]:
    return _on_loop(_create(address, core))


async def _create(address: str, core: ServerCore) -> tuple[ApiServer, int]:
    loop = asyncio.get_running_loop()
    pool = futures.ThreadPoolExecutor(max_workers=API_THREADS, thread_name_prefix="grpc")
    write_pool = futures.ThreadPoolExecutor(max_workers=WRITE_THREADS, thread_name_prefix="grpc-write")
    notifier = IndexNotifier(core.store, loop)
    attach_notifier(core, notifier)
    bridge = SyncBridge(pool, notifier, caller_limits(core), core.tls, write_pool=write_pool)
    server = grpc.aio.server(
        migration_thread_pool=pool,
        options=list(API_SERVER_OPTIONS),
        # Outermost first: every call counted and timed by method and code (drover_rpc_*,
        # server/telemetry/rpc.py), then undecodable requests refused with INVALID_ARGUMENT
        # and a rate-limited WARN (server/api/_decode.py), then sync handlers bridged to
        # the pool or a thread of their own, and blocking ones parked on the loop.
        interceptors=[AioRpcMetrics(), AioDecodeGuard(), bridge],
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
    # SERVING only with a leader and a quorum, per service and overall (server/api/health.py).
    core.health.add_to_server(server)
    # Health stays open with ACLs on: it says SERVING or NOT_SERVING and nothing else
    # (load balancers and probes hold no token). Reflection describes the API to anyone
    # who asks and checks no token, so with ACLs on it is off (use proto/drover/v1/*.proto).
    if not core.cfg.acl_enabled:
        names = [svc.full_name for svc in api_pb2.DESCRIPTOR.services_by_name.values()]
        reflection.enable_server_reflection((*names, health.SERVICE_NAME, reflection.SERVICE_NAME), server)
    try:
        if core.tls is None:
            port = server.add_insecure_port(address)
        else:
            # TLS only: a plaintext caller fails the handshake, and with verification so does
            # one without a certificate from the CA.
            credentials = server_credentials(core.tls, require_client_cert=core.cfg.tls_verify_https_client)
            port = server.add_secure_port(address, credentials)
    except RuntimeError:  # grpc.aio refuses a port it can not bind, where grpc.server said 0
        port = 0
    if port == 0:
        notifier.stop()
        pool.shutdown(wait=False)
        write_pool.shutdown(wait=False)
        raise OSError(f"can not bind gRPC to {address}")
    return ApiServer(server, bridge, notifier, (pool, write_pool)), port
