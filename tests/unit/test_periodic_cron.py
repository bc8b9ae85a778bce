"""Cron evaluation (scheduler/periodic.py): Nomad's forms, time zones and daylight saving.

Times are written as local wall-clock times in the zone under test and compared as such,
so each case reads like the calendar it is about.
"""

from __future__ import annotations

from datetime import datetime
from zoneinfo import ZoneInfo

import pytest

from drover.scheduler.periodic import (
    CronError,
    cron_error,
    derive_dispatched_child,
    derive_periodic_child,
    due_launch,
    launch_ns_from_id,
    next_launch,
    next_periodic_launch,
    parse_cron,
    periodic_child_id,
    prev_launch,
)
from drover.scheduler.structs import JOB_STATUS_RUNNING, PeriodicConfig
from tests.fixtures import mock

NY = "America/New_York"
S = 1_000_000_000


def at(text: str, tz: str = NY) -> int:
    """Unix ns of a wall-clock time ("2024-03-10 01:30:00") in ``tz``, first occurrence."""
    return int(datetime.fromisoformat(text).replace(tzinfo=ZoneInfo(tz)).timestamp()) * S


def wall(ns: int | None, tz: str = NY) -> str:
    """The wall-clock time and UTC offset of ``ns`` in ``tz``: "2024-03-10 03:00:00-04:00"."""
    assert ns is not None
    return datetime.fromtimestamp(ns / S, ZoneInfo(tz)).isoformat(sep=" ")


def launches(spec: str, start: int, n: int, tz: str = NY) -> list[str]:
    out = []
    t = start
    for _ in range(n):
        nxt = next_launch(spec, tz, t)
        assert nxt is not None
        out.append(wall(nxt, tz))
        t = nxt
    return out


# ---------------------------------------------------------------------------------------
# Forms


@pytest.mark.parametrize(
    ("spec", "start", "expected"),
    [
        ("*/15 * * * *", "2024-01-01 10:07:00", ["2024-01-01 10:15:00", "2024-01-01 10:30:00"]),
        ("0 9 * * MON-FRI", "2024-01-05 10:00:00", ["2024-01-08 09:00:00", "2024-01-09 09:00:00"]),
        # 6 fields: the sixth is a year (not seconds, as croniter would read it).
        ("30 3 1 1 * 2030", "2024-01-01 00:00:00", ["2030-01-01 03:30:00", None]),
        # 7 fields: seconds first, year last.
        ("*/20 * * * * * *", "2024-01-01 00:00:00", ["2024-01-01 00:00:20", "2024-01-01 00:00:40"]),
        ("0 0 0 1 1 * 2030,2032", "2024-06-01 00:00:00", ["2030-01-01 00:00:00", "2032-01-01 00:00:00"]),
        ("@hourly", "2024-01-01 10:07:00", ["2024-01-01 11:00:00", "2024-01-01 12:00:00"]),
        ("@daily", "2024-01-01 10:07:00", ["2024-01-02 00:00:00", "2024-01-03 00:00:00"]),
        ("@weekly", "2024-01-01 10:07:00", ["2024-01-07 00:00:00", "2024-01-14 00:00:00"]),
        ("@monthly", "2024-01-01 10:07:00", ["2024-02-01 00:00:00", "2024-03-01 00:00:00"]),
        ("@yearly", "2024-01-01 10:07:00", ["2025-01-01 00:00:00", "2026-01-01 00:00:00"]),
        ("0 0 L * *", "2024-02-01 00:00:00", ["2024-02-29 00:00:00", "2024-03-31 00:00:00"]),
        ("0 0 * * 5L", "2024-03-01 00:00:00", ["2024-03-29 00:00:00", "2024-04-26 00:00:00"]),
        ("0 0 * * 1#2", "2024-03-01 00:00:00", ["2024-03-11 00:00:00", "2024-04-08 00:00:00"]),
        ("0 12 ? * SUN", "2024-03-01 00:00:00", ["2024-03-03 12:00:00", "2024-03-10 12:00:00"]),
        ("0 0 29 2 *", "2024-03-01 00:00:00", ["2028-02-29 00:00:00", "2032-02-29 00:00:00"]),
        ("0 0 30 2 *", "2024-03-01 00:00:00", [None]),
    ],
    ids=[
        "5-fields-step",
        "5-fields-weekday-names",
        "6-fields-year-last",
        "7-fields-seconds-first",
        "7-fields-year-list",
        "macro-hourly",
        "macro-daily",
        "macro-weekly",
        "macro-monthly",
        "macro-yearly",
        "last-day-of-month",
        "last-friday",
        "second-monday",
        "question-mark",
        "leap-day",
        "never",
    ],
)
def test_next_launch__nomad_cron_forms(spec: str, start: str, expected: list[str | None]) -> None:
    got: list[str | None] = []
    t = at(start, "UTC")
    for _ in expected:
        nxt = next_launch(spec, "UTC", t)
        got.append(None if nxt is None else wall(nxt, "UTC")[:19])
        if nxt is None:
            break
        t = nxt
    assert got == expected


def test_next_launch__strictly_after_even_within_the_same_second() -> None:
    slot = at("2024-01-01 10:15:00", "UTC")
    assert next_launch("*/15 * * * *", "UTC", slot) == slot + 15 * 60 * S
    assert next_launch("*/15 * * * *", "UTC", slot - 1) == slot
    assert next_launch("* * * * * * *", "UTC", slot + 999_999_999) == slot + S


def test_prev_launch__at_or_before() -> None:
    slot = at("2024-01-01 10:15:00", "UTC")
    assert prev_launch("*/15 * * * *", "UTC", slot) == slot
    assert prev_launch("*/15 * * * *", "UTC", slot + 1) == slot
    assert prev_launch("*/15 * * * *", "UTC", slot - 1) == slot - 15 * 60 * S
    assert prev_launch("0 0 1 1 * 2030", "UTC", slot) is None


def test_several_crons__earliest_next_wins() -> None:
    periodic = PeriodicConfig(specs=("0 12 * * *", "30 6 * * *"), time_zone="UTC")
    assert wall(next_periodic_launch(periodic, at("2024-01-01 07:00:00", "UTC")), "UTC") == (
        "2024-01-01 12:00:00+00:00"
    )
    assert wall(next_periodic_launch(periodic, at("2024-01-01 12:00:00", "UTC")), "UTC") == (
        "2024-01-02 06:30:00+00:00"
    )


def test_time_zone__evaluated_in_the_jobs_zone() -> None:
    start = at("2024-01-01 00:00:00", "UTC")
    # 09:00 in Tokyo is midnight UTC: the one at `start` is not after it, the next day's is.
    assert wall(next_launch("0 9 * * *", "Asia/Tokyo", start), "UTC") == "2024-01-02 00:00:00+00:00"
    assert wall(next_launch("0 9 * * *", NY, start), NY) == "2024-01-01 09:00:00-05:00"


# ---------------------------------------------------------------------------------------
# Daylight saving in America/New_York (2024: spring forward Mar 10 02:00 -> 03:00, fall
# back Nov 3 02:00 -> 01:00)


def test_dst_spring_forward__launch_in_the_skipped_hour_is_skipped() -> None:
    assert launches("30 2 * * *", at("2024-03-09 12:00:00"), 3) == [
        "2024-03-11 02:30:00-04:00",  # Mar 10 02:30 does not exist: no launch that day
        "2024-03-12 02:30:00-04:00",
        "2024-03-13 02:30:00-04:00",
    ]


def test_dst_spring_forward__hourly_launches_jump_the_gap() -> None:
    assert launches("0 * * * *", at("2024-03-10 00:30:00"), 3) == [
        "2024-03-10 01:00:00-05:00",
        "2024-03-10 03:00:00-04:00",  # 02:00 never happened
        "2024-03-10 04:00:00-04:00",
    ]


def test_dst_fall_back__launch_in_the_repeated_hour_runs_once() -> None:
    assert launches("30 1 * * *", at("2024-11-02 12:00:00"), 2) == [
        "2024-11-03 01:30:00-04:00",  # the first 01:30 (EDT); the second (EST) does not launch
        "2024-11-04 01:30:00-05:00",
    ]


def test_dst_fall_back__every_20_minutes_through_the_repeated_hour() -> None:
    assert launches("*/20 * * * *", at("2024-11-03 00:50:00"), 5) == [
        "2024-11-03 01:00:00-04:00",
        "2024-11-03 01:20:00-04:00",
        "2024-11-03 01:40:00-04:00",
        # 01:00-01:59 EST repeats wall times that already launched: skipped.
        "2024-11-03 02:00:00-05:00",
        "2024-11-03 02:20:00-05:00",
    ]


def test_dst_fall_back__from_inside_the_second_pass__next_is_after_it() -> None:
    second_pass = at("2024-11-03 01:10:00") + 3600 * S  # 01:10 EST
    assert wall(next_launch("*/20 * * * *", NY, second_pass)) == "2024-11-03 02:00:00-05:00"
    # Looking back from there, the last launch was the first pass's 01:40.
    assert wall(prev_launch("*/20 * * * *", NY, second_pass)) == "2024-11-03 01:40:00-04:00"


def test_dst_spring_forward__due_launch_after_the_gap() -> None:
    periodic = PeriodicConfig(spec="30 2 * * *", time_zone=NY)
    # Down from Mar 9 03:00 to Mar 11 12:00: the Mar 10 slot never existed, Mar 11's did.
    slot = due_launch(periodic, at("2024-03-09 03:00:00"), at("2024-03-11 12:00:00"))
    assert wall(slot) == "2024-03-11 02:30:00-04:00"


# ---------------------------------------------------------------------------------------
# Due launches: at most one, the latest


def test_due_launch__several_missed__only_the_latest() -> None:
    periodic = PeriodicConfig(spec="*/10 * * * *", time_zone="UTC")
    last = at("2024-01-01 10:00:00", "UTC")
    assert due_launch(periodic, last, at("2024-01-01 10:35:00", "UTC")) == at("2024-01-01 10:30:00", "UTC")
    assert due_launch(periodic, last, at("2024-01-01 10:09:59", "UTC")) is None
    assert due_launch(periodic, last, last) is None


# ---------------------------------------------------------------------------------------
# Bad expressions


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("", "must not be empty"),
        ("* * * *", "has 4 fields"),
        ("* * * * * * * *", "has 8 fields"),
        ("61 * * * *", "minute field: 61 is out of range 0-59"),
        ("* 24 * * *", "hour field: 24 is out of range 0-23"),
        ("* * 0 * *", "day-of-month field: 0 is out of range 1-31"),
        ("* * * 13 *", "month field: 13 is out of range 1-12"),
        ("* * * * 8", "day-of-week field: 8 is out of range 0-7"),
        ("60 * * * * * *", "second field: 60 is out of range 0-59"),
        ("0 0 1 1 * 1969", "year field: 1969 is out of range 1970-2099"),
        ("*/0 * * * *", "step in '*/0' must be at least 1"),
        ("30-10 * * * *", "range '30-10' goes backwards"),
        ("* * * FOO *", "month field: 'FOO' is not a number"),
        ("@fortnightly", "unknown macro"),
        ("@daily 5", "unknown macro"),
        # croniter extensions that would make servers disagree on launch times.
        ("R * * * *", "minute field: 'R' is not a number"),
        ("H * * * *", "minute field: 'H' is not a number"),
        ("* * * * $", "not a valid item"),
    ],
)
def test_cron_error__names_the_problem(spec: str, message: str) -> None:
    assert message in cron_error(spec)
    with pytest.raises(CronError):
        parse_cron(spec)


# ---------------------------------------------------------------------------------------
# Derived children start fresh (docs/field-reports.md#field-report-2)


def test_derive_periodic_child__nothing_of_the_parents_life_carries_over() -> None:
    parent = mock.periodic_job(
        id="report",
        status=JOB_STATUS_RUNNING,
        version=7,
        create_index=3,
        modify_index=90,
        job_modify_index=80,
    )
    child = derive_periodic_child(parent, at("2024-01-01 10:00:00", "UTC") + 123, now_ns=5)

    assert child.id == child.name == "report/periodic-1704103200"
    assert (child.parent_id, child.periodic, child.status, child.version) == ("report", None, "", 0)
    assert (child.create_index, child.modify_index, child.job_modify_index, child.submit_time_ns) == (
        0,
        0,
        0,
        5,
    )
    assert child.groups == parent.groups
    assert launch_ns_from_id(child.id) == at("2024-01-01 10:00:00", "UTC")
    assert periodic_child_id("a/periodic-1/b", 2 * S) == "a/periodic-1/b/periodic-2"
    assert launch_ns_from_id("a/periodic-1/b/periodic-2") == 2 * S


def test_derive_dispatched_child__meta_merged_payload_set_status_reset() -> None:
    parent = mock.batch_job(id="encode", meta={"team": "media", "preset": "fast"}, status=JOB_STATUS_RUNNING)
    child = derive_dispatched_child(
        parent, "encode/dispatch-1-abcd1234", 9, {"preset": "slow", "file": "x"}, b"p"
    )

    assert (child.id, child.parent_id, child.dispatched, child.payload) == (
        "encode/dispatch-1-abcd1234",
        "encode",
        True,
        b"p",
    )
    assert dict(child.meta) == {"team": "media", "preset": "slow", "file": "x"}
    assert (child.status, child.version, child.create_index) == ("", 0, 0)
