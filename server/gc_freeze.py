"""A server's long-lived objects leave the cyclic collector's view, so its pauses stay short.

Why
---
A collection of the oldest generation walks every tracked object while holding the GIL:
every thread stops for it. On the fleet benchmark's leader (5,000 clients,
tests/bench/fleet.py) ``drover_gc_pause_seconds`` counted 16 such collections in the
first minute, 5.3 s stopped in all, about 330 ms each, and heartbeats waited out every
one. Nearly all of what they walk is the state (immutable maps and records kept alive by
snapshots), which no collection can free: an old state goes by reference counting once
nothing reads it.

Policy
------
Once at start, and after each full collection, what survived it is frozen (``gc.freeze``: moved to the
permanent generation, never walked again), so the next full collections walk only what is
newer. The freeze runs on a thread of its own, woken from the collector's callback, never
inside the collection. A frozen object that later becomes part of an unreachable cycle is
not reclaimed while frozen, so every ``THAW_INTERVAL_S`` the freezer unfreezes everything
and runs one full collection itself, on a schedule (the one long pause of the interval),
then freezes again. Only ``drover agent -server`` processes install it (server/agent.py):
a ``-dev`` agent, and a test process running several servers, keep the interpreter's own
policy.
"""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Callable
from typing import Any, Final

import structlog

from drover.server.telemetry.metrics import GC_FROZEN_OBJECTS

__all__ = ["THAW_INTERVAL_S", "GcFreezer"]

log = structlog.get_logger("drover.gc_freeze")

THAW_INTERVAL_S: Final = 600.0
_OLDEST: Final = 2


class GcFreezer:
    """Freezes the survivors of every full collection; thaws and collects once an interval."""

    def __init__(
        self, thaw_interval_s: float = THAW_INTERVAL_S, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._thaw_interval_s = thaw_interval_s
        self._clock = clock
        self._full_collection = threading.Event()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gc-freezer", daemon=True)
        self.freezes = 0
        self.thaws = 0

    def start(self) -> None:
        gc.callbacks.append(self._on_gc)
        self._thread.start()

    def stop(self) -> None:
        if self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)
        self._stopping.set()
        self._full_collection.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    def _on_gc(self, phase: str, info: dict[str, Any]) -> None:
        """The ``gc.callbacks`` hook: runs inside the collection, so it only sets an event."""
        if phase == "stop" and info.get("generation") == _OLDEST:
            self._full_collection.set()

    def _run(self) -> None:
        # What the process built to start (modules, the state it loaded) is long-lived:
        # one collection now, and its "stop" callback has the loop freeze the survivors.
        gc.collect()
        thaw_at = self._clock() + self._thaw_interval_s
        while not self._stopping.is_set():
            self._full_collection.wait(max(0.0, thaw_at - self._clock()))
            if self._stopping.is_set():
                return
            if self._full_collection.is_set():
                self._full_collection.clear()
                gc.freeze()
                self.freezes += 1
                GC_FROZEN_OBJECTS.set(gc.get_freeze_count())
            if self._clock() >= thaw_at:
                self._thaw_and_collect()
                thaw_at = self._clock() + self._thaw_interval_s

    def _thaw_and_collect(self) -> None:
        frozen = gc.get_freeze_count()
        started = time.perf_counter()
        gc.unfreeze()
        # Its "stop" callback sets the event: the next turn of the loop freezes again.
        unreachable = gc.collect()
        self.thaws += 1
        log.info(
            "gc.thawed",
            frozen_before=frozen,
            unreachable=unreachable,
            pause_ms=round((time.perf_counter() - started) * 1000, 1),
        )
