"""Go-style durations ("250ms", "30s", "1h30m") or plain numbers of seconds, to nanoseconds."""

from __future__ import annotations

import re
from typing import Final

from client_agent.errors import DriverConfigError

__all__ = ["parse_duration_ns"]

_UNITS: Final = {
    "ns": 1,
    "us": 1_000,
    "µs": 1_000,
    "ms": 1_000_000,
    "s": 1_000_000_000,
    "m": 60_000_000_000,
    "h": 3_600_000_000_000,
}
_PART: Final = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")


def parse_duration_ns(value: object, key: str) -> int:
    """``value`` as nanoseconds; numbers are seconds. Raises DriverConfigError naming ``key``."""
    if isinstance(value, bool):
        raise DriverConfigError(f"{key}: expected a duration, got {value!r}")
    if isinstance(value, int | float):
        if value < 0:
            raise DriverConfigError(f"{key}: must not be negative, got {value!r}")
        return int(value * 1_000_000_000)
    if not isinstance(value, str):
        raise DriverConfigError(f"{key}: expected a duration like '30s', got {value!r}")
    text = value.strip()
    if text in ("0", ""):
        return 0
    pos, total = 0, 0.0
    while pos < len(text):
        m = _PART.match(text, pos)
        if m is None:
            raise DriverConfigError(f"{key}: invalid duration {value!r} (use e.g. '250ms', '30s', '1h30m')")
        total += float(m.group(1)) * _UNITS[m.group(2)]
        pos = m.end()
    return int(total)
