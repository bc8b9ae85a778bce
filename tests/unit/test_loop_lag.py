"""``drover_api_loop_lag_seconds`` (server/telemetry/loop_lag.py): the probe records how
late its loop woke it, so a callback that holds the loop shows as that much lag. A real
asyncio loop, no server."""

from __future__ import annotations

import asyncio
import time

from drover.server.telemetry.loop_lag import probe_loop_lag

INTERVAL_S = 0.01
HOLD_S = 0.2


def test_a_held_loop_shows_as_lag_of_about_the_hold() -> None:
    observed: list[float] = []

    async def scenario() -> None:
        probe = asyncio.create_task(probe_loop_lag(INTERVAL_S, observed.append))
        # Let it record a few idle rounds, then hold the loop with a blocking callback.
        while len(observed) < 3:
            await asyncio.sleep(INTERVAL_S)
        idle = len(observed)
        asyncio.get_running_loop().call_soon(time.sleep, HOLD_S)
        while len(observed) < idle + 2:
            await asyncio.sleep(INTERVAL_S)
        probe.cancel()

    asyncio.run(asyncio.wait_for(scenario(), 10))
    # The round the hold fell in woke at least the hold minus one interval late.
    assert max(observed) >= HOLD_S - INTERVAL_S
    assert min(observed) >= 0.0


def test_lag_is_measured_on_the_clock_it_is_given() -> None:
    ticks = iter([0.0, 5.0])
    observed: list[float] = []

    def record(lag: float) -> None:
        observed.append(lag)
        raise asyncio.CancelledError

    async def scenario() -> None:
        try:
            await probe_loop_lag(0.0, record, lambda: next(ticks))
        except asyncio.CancelledError:
            pass

    asyncio.run(scenario())
    assert observed == [5.0]
