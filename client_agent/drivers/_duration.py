"""A driver config's durations: Go durations ("250ms", "30s", "1h30m") or numbers of seconds.

The syntax and its rounding are drover.common.duration's (Go's ``time.ParseDuration``); what is
added here is the driver's policy: a bare number means seconds, and a negative duration
is refused with an error naming the config key.
"""

from __future__ import annotations

from fractions import Fraction

from drover.client.errors import DriverConfigError
from drover.common.duration import parse_duration

__all__ = ["parse_duration_ns"]


def parse_duration_ns(value: object, key: str) -> int:
    """``value`` as nanoseconds; numbers are seconds. Raises DriverConfigError naming ``key``."""
    if isinstance(value, bool):
        raise DriverConfigError(f"{key}: expected a duration, got {value!r}")
    if isinstance(value, int | float):
        if value < 0:
            raise DriverConfigError(f"{key}: must not be negative, got {value!r}")
        # Through the decimal text, not a float product: 1.001 s is 1,001,000,000 ns,
        # where 1.001 * 1e9 gives 1,000,999,999.
        return int(Fraction(str(value)) * 1_000_000_000)
    if not isinstance(value, str):
        raise DriverConfigError(f"{key}: expected a duration like '30s', got {value!r}")
    try:
        ns = parse_duration(value)
    except ValueError:
        raise DriverConfigError(
            f"{key}: invalid duration {value!r} (use e.g. '250ms', '30s', '1h30m')"
        ) from None
    if ns < 0:
        raise DriverConfigError(f"{key}: must not be negative, got {value!r}")
    return ns
