"""Time and identity, injected: the shell reads them once and passes values down."""

from __future__ import annotations

import time
import uuid
from typing import Protocol


class Clock(Protocol):
    def now_ns(self) -> int: ...


class IdSource(Protocol):
    def new(self) -> str: ...


class SystemClock:
    def now_ns(self) -> int:
        return time.time_ns()


class UuidIds:
    def new(self) -> str:
        return str(uuid.uuid4())
