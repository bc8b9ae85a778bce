"""Time, injected: every timer-driven part reads it through a ``Clock``."""

from __future__ import annotations

import time
from typing import Protocol

__all__ = ["Clock", "SystemClock"]


class Clock(Protocol):
    def now_ns(self) -> int:
        """Wall-clock Unix nanoseconds: timestamps that are persisted or sent to servers."""
        ...

    def monotonic_ns(self) -> int:
        """Monotonic nanoseconds: ages and intervals that live only in this process."""
        ...


class SystemClock:
    def now_ns(self) -> int:
        return time.time_ns()

    def monotonic_ns(self) -> int:
        return time.monotonic_ns()
