"""How late the API's event loop runs what is due: ``drover_api_loop_lag_seconds``.

Every gRPC call a server answers is taken from grpc's queue by the one API loop
(server/api/grpc_server.py ``api_loop``) before its handler starts, so a loop that is held
(a long callback, a garbage collection, another thread keeping the GIL) delays every call
that arrives meanwhile, while ``drover_rpc_request_seconds``, which starts with the handler,
shows nothing of it. A probe on the loop sleeps ``PROBE_INTERVAL_S`` and records how much
later than that it woke: the wait a call arriving at a random moment adds before its
handler. The fleet benchmark (tests/bench/fleet.py) reads it beside the served latency.

It costs one timer and one ``observe`` per interval, on the loop it measures.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Final

from prometheus_client import Histogram

__all__ = ["API_LOOP_LAG_SECONDS", "PROBE_INTERVAL_S", "probe_loop_lag", "start_loop_lag_probe"]

PROBE_INTERVAL_S: Final = 0.1
# From well under a millisecond (an idle loop) to the multi-second stalls a loaded leader
# has shown (deploy/RUNBOOK.md says what to look at then).
LAG_BUCKETS: Final = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)

API_LOOP_LAG_SECONDS = Histogram(
    "drover_api_loop_lag_seconds",
    "How much later than due the API event loop woke a timer: the wait before any call's handler",
    buckets=LAG_BUCKETS,
)


async def probe_loop_lag(
    interval: float = PROBE_INTERVAL_S,
    observe: Callable[[float], None] = API_LOOP_LAG_SECONDS.observe,
    clock: Callable[[], float] = time.monotonic,
) -> None:
    """Sleep ``interval`` and ``observe`` the lateness, until cancelled."""
    while True:
        due = clock() + interval
        await asyncio.sleep(interval)
        observe(max(0.0, clock() - due))


def start_loop_lag_probe(loop: asyncio.AbstractEventLoop) -> None:
    """Run the probe on ``loop`` (from any thread) for as long as the loop runs."""
    asyncio.run_coroutine_threadsafe(probe_loop_lag(), loop)
