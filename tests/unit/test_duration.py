"""drover.common.duration against Go's own table for ``time.ParseDuration`` (src/time/time_test.go).

Every row here is a case Go's test suite pins, so drover reads a duration exactly as Nomad
(a Go program) does, rounding included.
"""

from __future__ import annotations

import pytest

from drover.common.duration import parse_duration

NS = 1
US = 1_000
MS = 1_000_000
S = 1_000_000_000
M = 60 * S
H = 60 * M


@pytest.mark.parametrize(
    ("text", "ns"),
    [
        ("0", 0),
        ("5s", 5 * S),
        ("30s", 30 * S),
        ("1478s", 1478 * S),
        ("-5s", -5 * S),
        ("+5s", 5 * S),
        ("-0", 0),
        ("+0", 0),
        ("5.0s", 5 * S),
        ("5.6s", 5 * S + 600 * MS),
        ("5.s", 5 * S),
        (".5s", 500 * MS),
        ("1.0s", S),
        ("1.00s", S),
        ("1.004s", S + 4 * MS),
        ("1.0040s", S + 4 * MS),
        ("100.00100s", 100 * S + MS),
        ("10ns", 10 * NS),
        ("11us", 11 * US),
        ("12µs", 12 * US),
        ("12μs", 12 * US),
        ("13ms", 13 * MS),
        ("14s", 14 * S),
        ("15m", 15 * M),
        ("16h", 16 * H),
        ("3h30m", 3 * H + 30 * M),
        ("10.5s4m", 4 * M + 10 * S + 500 * MS),
        ("-2m3.4s", -(2 * M + 3 * S + 400 * MS)),
        ("1h2m3s4ms5us6ns", H + 2 * M + 3 * S + 4 * MS + 5 * US + 6 * NS),
        ("39h9m14.425s", 39 * H + 9 * M + 14 * S + 425 * MS),
        ("52763797000ns", 52763797000 * NS),
        ("0.3333333333333333333h", 20 * M),
        ("9007199254740993ns", (1 << 53) + 1),
        ("9223372036854775807ns", (1 << 63) - 1),
        ("9223372036854775.807us", (1 << 63) - 1),
        ("9223372036s854ms775us807ns", (1 << 63) - 1),
        ("-9223372036854775808ns", -(1 << 63)),
        ("-9223372036854775.808us", -(1 << 63)),
        ("-9223372036s854ms775us808ns", -(1 << 63)),
        ("-2562047h47m16.854775808s", -(1 << 63)),
        ("0.100000000000000000000h", 6 * M),
        ("0.830103483285477580700h", 49 * M + 48 * S + 372539827 * NS),
        # Truncated toward zero, never rounded: 1.5 ns is 1 ns, as in Go.
        ("1.5ns", 1),
        ("0.0000000015s", 1),
        ("-1.5ns", -1),
        ("0.3s", 300 * MS),
    ],
)
def test_parse_duration__as_go_parses_it(text: str, ns: int) -> None:
    assert parse_duration(text) == ns


@pytest.mark.parametrize(
    "text",
    [
        "",
        "3",
        "-",
        "s",
        ".",
        "-.",
        ".s",
        "+.s",
        "1d",
        "\x85\x85",
        "\xffff",
        "hello \xffff world",
        "9223372036854775808ns",
        "9223372036854775.808us",
        "9223372036854ms775us808ns",
        "-9223372036854775809ns",
        "1h 30m",
        " 1s",
        "--1s",
        "1s-1s",
    ],
)
def test_parse_duration__refused_as_go_refuses_it(text: str) -> None:
    with pytest.raises(ValueError, match="invalid duration"):
        parse_duration(text)


def test_parse_duration__message__says_what_is_wrong() -> None:
    with pytest.raises(ValueError, match=r'^invalid duration "5": missing unit$'):
        parse_duration("5")
    with pytest.raises(ValueError, match=r'^invalid duration "1d": unknown unit "d"$'):
        parse_duration("1d")
