"""Go's ``time.ParseDuration``: the one duration syntax drover reads.

Job files, agent flags, driver configs and the CLI all take durations as Nomad does, in
Go's syntax. One parser means ``"0.3s"`` is the same number of nanoseconds everywhere (three
copies used to round three ways: exact fractions, ``round()`` of a float, ``int()`` of a
float). The rules are Go's, step by step (``src/time/format.go``):

- an optional sign, then one or more ``<number><unit>`` parts with nothing between them:
  ``"1h30m"``, ``"-1.5s"``, ``".5ms"``, ``"1.s"``; ``"0"`` alone needs no unit; no spaces;
- units ``ns``, ``us`` (also ``µs`` U+00B5 and ``μs`` U+03BC), ``ms``, ``s``, ``m``, ``h``;
- a fraction is truncated toward zero to whole nanoseconds, computed as Go computes it
  (``fraction * (unit / scale)`` in float64, nanosecond-exact for fractions of an hour);
- beyond 2**63 - 1 ns (about 292 years) is an error, where Go's int64 ``Duration`` ends.

Callers add their own policy on top (bare numbers meaning seconds in a job file, negative
durations refused in a driver config): that is not syntax, so it is not here.
"""

from __future__ import annotations

import json
from typing import Final

__all__ = ["parse_duration"]

_UNITS: Final = {
    "ns": 1,
    "us": 1_000,
    "µs": 1_000,  # U+00B5 micro sign
    "μs": 1_000,  # U+03BC Greek small letter mu
    "ms": 1_000_000,
    "s": 1_000_000_000,
    "m": 60_000_000_000,
    "h": 3_600_000_000_000,
}
_LIMIT: Final = 1 << 63  # Go's uint64 accumulator bound; a positive result must stay below it


def _is_digit(c: str) -> bool:
    return "0" <= c <= "9"  # str.isdigit would also take other scripts' digits


def parse_duration(text: str) -> int:
    """``text`` in nanoseconds; ValueError (its message names ``text``) if Go would refuse it."""
    s = text
    negative = False
    if s[:1] in ("-", "+"):
        negative = s[0] == "-"
        s = s[1:]
    if s == "0":
        return 0
    if not s:
        raise _invalid(text)
    total = 0
    pos, end = 0, len(s)
    while pos < end:
        if not (s[pos] == "." or _is_digit(s[pos])):
            raise _invalid(text)
        # The integer part (Go's leadingInt).
        start, whole = pos, 0
        while pos < end and _is_digit(s[pos]):
            whole = whole * 10 + int(s[pos])
            if whole > _LIMIT:
                raise _invalid(text, "out of range")
            pos += 1
        has_whole = pos != start
        # The fraction (Go's leadingFraction: digits past int64's precision are skipped).
        fraction, scale, has_fraction = 0, 1.0, False
        if pos < end and s[pos] == ".":
            pos += 1
            start, overflow = pos, False
            while pos < end and _is_digit(s[pos]):
                if not overflow:
                    longer = fraction * 10 + int(s[pos])
                    if fraction > (_LIMIT - 1) // 10 or longer > _LIMIT:
                        overflow = True
                    else:
                        fraction, scale = longer, scale * 10
                pos += 1
            has_fraction = pos != start
        if not has_whole and not has_fraction:
            raise _invalid(text)  # ".s", "-.s"
        start = pos
        while pos < end and not (s[pos] == "." or _is_digit(s[pos])):
            pos += 1
        if pos == start:
            raise _invalid(text, "missing unit")
        unit = _UNITS.get(s[start:pos])
        if unit is None:
            raise _invalid(text, f"unknown unit {json.dumps(s[start:pos], ensure_ascii=False)}")
        if whole > _LIMIT // unit:
            raise _invalid(text, "out of range")
        part = whole * unit
        if fraction > 0:
            part += int(float(fraction) * (float(unit) / scale))
            if part > _LIMIT:
                raise _invalid(text, "out of range")
        total += part
        if total > _LIMIT:
            raise _invalid(text, "out of range")
    if negative:
        return -total
    if total > _LIMIT - 1:
        raise _invalid(text, "out of range")
    return total


def _invalid(text: str, why: str = "") -> ValueError:
    quoted = json.dumps(text, ensure_ascii=False)
    return ValueError(f"invalid duration {quoted}: {why}" if why else f"invalid duration {quoted}")
