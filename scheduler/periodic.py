"""Cron schedules of periodic jobs, and the jobs a periodic or parameterized parent derives.

Pure: no clock. Callers pass times in (Unix nanoseconds); launch slots come out as Unix
nanoseconds on whole seconds.

Cron forms (Nomad's, from hashicorp/cronexpr)
---------------------------------------------
=========  ==========================================================
5 fields   minute hour day-of-month month day-of-week
6 fields   minute hour day-of-month month day-of-week **year**
7 fields   **second** minute hour day-of-month month day-of-week year
macros     @yearly @annually @monthly @weekly @daily @midnight @hourly
=========  ==========================================================

Items are ``*``, ``n``, ``a-b``, each with an optional ``/step``, joined by commas; months
and weekdays may be names (JAN, MON); day-of-month takes ``L`` (last day) and ``nW``
(nearest weekday); day-of-week takes ``nL`` (last such weekday of the month) and ``n#k``
(k-th such weekday); ``?`` means ``*`` in either day field. When both day fields are
restricted, a day matching either one matches (classic cron).

Theory of operation
-------------------
croniter does the calendar arithmetic, on *wall-clock* times: the local time is handed to it
labelled UTC, so it never sees a zone or a daylight-saving change. Each wall-clock match is
then placed in the job's zone:

* a local time that does not exist (the hour skipped when clocks spring forward) is
  skipped: that launch does not happen;
* a local time that exists twice (the hour repeated when clocks fall back) runs once, at
  its first occurrence.

What croniter lacks is wrapped here: Nomad's 6-field form (croniter would read a sixth
field as seconds), the year field (croniter has one, but fails to find dates such as
``0 0 1 1 * 0 2030``; years are filtered here), and ``nL`` (croniter spells it ``Ln``).
croniter's random (``R``) and hashed (``H``) fields are refused: every server must compute
the same launch slots from the same job.
"""

from __future__ import annotations

import functools
import re
import zoneinfo
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Final

from croniter import CroniterBadDateError, CroniterError, croniter

from drover.scheduler.structs import Job, PeriodicConfig

__all__ = [
    "CRON_MACROS",
    "DISPATCH_SUFFIX",
    "PERIODIC_SUFFIX",
    "CronError",
    "CronSchedule",
    "cron_error",
    "derive_dispatched_child",
    "derive_periodic_child",
    "dispatched_child_id",
    "due_launch",
    "launch_ns_from_id",
    "next_launch",
    "next_periodic_launch",
    "parse_cron",
    "periodic_child_id",
    "prev_launch",
    "prev_periodic_launch",
    "time_zone_error",
]

SECOND_NS: Final = 1_000_000_000
PERIODIC_SUFFIX: Final = "/periodic-"
DISPATCH_SUFFIX: Final = "/dispatch-"
MIN_YEAR: Final = 1970
MAX_YEAR: Final = 2099

CRON_MACROS: Final = {
    # Nomad's 7-field equivalents: second minute hour dom month dow year.
    "@yearly": "0 0 0 1 1 * *",
    "@annually": "0 0 0 1 1 * *",
    "@monthly": "0 0 0 1 * * *",
    "@weekly": "0 0 0 * * 0 *",
    "@daily": "0 0 0 * * * *",
    "@midnight": "0 0 0 * * * *",
    "@hourly": "0 0 * * * * *",
}

# A wall-clock match may be skipped (a daylight-saving gap, a fall-back repeat already run):
# at most an hour or two of matches in any real zone, even for a cron that fires every second.
_MAX_CANDIDATES: Final = 20_000

_MONTHS: Final = {
    m: i + 1
    for i, m in enumerate(
        ["JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC"]
    )
}
_WEEKDAYS: Final = {d: i for i, d in enumerate(["SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"])}
_ITEM: Final = re.compile(r"(?P<base>\*|[0-9A-Za-z]+(?:-[0-9A-Za-z]+)?)(?:/(?P<step>[0-9]+))?")
_LAST_WEEKDAY: Final = re.compile(r"(?P<day>[0-9A-Za-z]+)L")
_NTH_WEEKDAY: Final = re.compile(r"(?P<day>[0-9A-Za-z]+)#(?P<nth>[1-5])")
_NEAREST_WEEKDAY: Final = re.compile(r"(?P<day>[0-9]+)W")


class CronError(ValueError):
    """A cron expression that does not parse; the message says what and where."""


@dataclass(frozen=True, slots=True)
class _Field:
    name: str
    low: int
    high: int
    names: dict[str, int] | None = None


_SECOND = _Field("second", 0, 59)
_MINUTE = _Field("minute", 0, 59)
_HOUR = _Field("hour", 0, 23)
_DOM = _Field("day-of-month", 1, 31)
_MONTH = _Field("month", 1, 12, _MONTHS)
_DOW = _Field("day-of-week", 0, 7, _WEEKDAYS)
_YEAR = _Field("year", MIN_YEAR, MAX_YEAR)


@dataclass(frozen=True, slots=True)
class CronSchedule:
    """A parsed cron expression: croniter's 6-field form (seconds last) plus a year filter."""

    spec: str
    expr: str
    years: frozenset[int] | None  # None: every year

    def year_ok(self, year: int) -> bool:
        return MIN_YEAR <= year <= MAX_YEAR and (self.years is None or year in self.years)

    def next_year(self, after: int) -> int | None:
        """The first allowed year after ``after``."""
        if self.years is None:
            return after + 1 if after < MAX_YEAR else None
        return min((y for y in self.years if y > after), default=None)

    def prev_year(self, before: int) -> int | None:
        if self.years is None:
            return before - 1 if before > MIN_YEAR else None
        return max((y for y in self.years if y < before), default=None)


# ---------------------------------------------------------------------------------------
# Parsing


def cron_error(spec: str) -> str:
    """Why ``spec`` is not a valid cron expression, or "" if it is."""
    try:
        parse_cron(spec)
    except CronError as exc:
        return str(exc)
    return ""


def time_zone_error(name: str) -> str:
    """Why ``name`` is not a usable IANA time zone, or "" if it is."""
    try:
        zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError, OSError):
        return f"unknown time zone {name!r} (use an IANA name such as 'America/New_York' or 'UTC')"
    return ""


@functools.lru_cache(maxsize=1024)
def parse_cron(spec: str) -> CronSchedule:
    """Parse one of Nomad's cron forms; raise :class:`CronError` naming the bad part."""
    fields = spec.split()
    if not fields:
        raise CronError("must not be empty")
    if fields[0].startswith("@"):
        macro = CRON_MACROS.get(fields[0].lower()) if len(fields) == 1 else None
        if macro is None:
            raise CronError(f"unknown macro {spec!r}; use one of {', '.join(sorted(CRON_MACROS))}")
        fields = macro.split()
    if len(fields) == 5:
        fields = ["0", *fields, "*"]
    elif len(fields) == 6:
        fields = ["0", *fields]
    elif len(fields) != 7:
        raise CronError(
            f"{spec!r} has {len(fields)} fields; use 5 (minute hour day-of-month month day-of-week), "
            "6 (... year) or 7 (second ... year)"
        )
    sec, minute, hour, dom, month, dow, year = fields
    parts = [
        _plain(minute, _MINUTE),
        _plain(hour, _HOUR),
        _day_of_month(dom),
        _plain(month, _MONTH),
        _day_of_week(dow),
        _plain(sec, _SECOND),
    ]
    years = _years(year)
    expr = " ".join(parts)
    try:
        croniter(expr, datetime(2000, 1, 1, tzinfo=UTC))
    except CroniterError as exc:
        raise CronError(f"{spec!r}: {exc}") from exc
    return CronSchedule(spec=spec, expr=expr, years=years)


def _value(text: str, field: _Field) -> int:
    if text.isdigit():
        value = int(text)
    elif field.names is not None and text.upper() in field.names:
        value = field.names[text.upper()]
    else:
        raise CronError(f"{field.name} field: {text!r} is not a number" + _names_hint(field))
    if not field.low <= value <= field.high:
        raise CronError(f"{field.name} field: {value} is out of range {field.low}-{field.high}")
    return value


def _names_hint(field: _Field) -> str:
    if field.names is None:
        return ""
    return f" or one of {', '.join(field.names)}"


def _item(item: str, field: _Field) -> list[int] | None:
    """Check one comma-separated item; its values, or None for ``*`` without a step."""
    match = _ITEM.fullmatch(item)
    if match is None:
        raise CronError(f"{field.name} field: {item!r} is not a valid item")
    base, step_text = match.group("base"), match.group("step")
    step = 1
    if step_text is not None:
        step = int(step_text)
        if step < 1:
            raise CronError(f"{field.name} field: step in {item!r} must be at least 1")
    if base == "*":
        if step_text is None:
            return None
        low, high = field.low, field.high
    elif "-" in base:
        first, last = base.split("-", 1)
        low, high = _value(first, field), _value(last, field)
        if low > high:
            raise CronError(f"{field.name} field: range {base!r} goes backwards")
    else:
        low = _value(base, field)
        # cronexpr: "a/n" means "a through the end, every n".
        high = field.high if step_text is not None else low
    return list(range(low, high + 1, step))


def _plain(text: str, field: _Field) -> str:
    for item in text.split(","):
        _item(item, field)
    return text


def _day_of_month(text: str) -> str:
    if text == "?":
        return "*"
    for item in text.split(","):
        if item == "L":
            continue
        nearest = _NEAREST_WEEKDAY.fullmatch(item)
        if nearest is not None:
            _value(nearest.group("day"), _DOM)
            continue
        _item(item, _DOM)
    return text


def _day_of_week(text: str) -> str:
    if text == "?":
        return "*"
    out: list[str] = []
    for item in text.split(","):
        last = _LAST_WEEKDAY.fullmatch(item)
        if last is not None:
            out.append(f"L{_value(last.group('day'), _DOW) % 7}")
            continue
        nth = _NTH_WEEKDAY.fullmatch(item)
        if nth is not None:
            out.append(f"{_value(nth.group('day'), _DOW) % 7}#{nth.group('nth')}")
            continue
        _item(item, _DOW)
        out.append(item)
    return ",".join(out)


def _years(text: str) -> frozenset[int] | None:
    if text in ("*", "?"):
        return None
    years: set[int] = set()
    for item in text.split(","):
        values = _item(item, _YEAR)
        if values is None:
            return None
        years.update(values)
    return frozenset(years)


# ---------------------------------------------------------------------------------------
# Evaluation


def next_launch(spec: str, time_zone: str, after_ns: int) -> int | None:
    """The first launch of ``spec`` strictly after ``after_ns`` (Unix ns), or None if it
    never launches again. Raises :class:`CronError` or ``zoneinfo`` errors on bad input."""
    schedule = parse_cron(spec)
    tz = zoneinfo.ZoneInfo(time_zone)
    after_s = after_ns // SECOND_NS
    wall = _wall(datetime.fromtimestamp(after_s, tz))
    it = croniter(schedule.expr, wall)
    for _ in range(_MAX_CANDIDATES):
        try:
            cand: datetime = it.get_next(datetime)
        except CroniterBadDateError:
            return None
        if not schedule.year_ok(cand.year):
            year = schedule.next_year(cand.year)
            if year is None:
                return None
            it = croniter(schedule.expr, datetime(year, 1, 1, tzinfo=UTC) - timedelta(seconds=1))
            continue
        instant = _instant(cand, tz)
        if instant is not None and instant > after_s:
            return instant * SECOND_NS
    return None


def prev_launch(spec: str, time_zone: str, at_or_before_ns: int) -> int | None:
    """The last launch of ``spec`` at or before ``at_or_before_ns``, or None if none."""
    schedule = parse_cron(spec)
    tz = zoneinfo.ZoneInfo(time_zone)
    limit_s = at_or_before_ns // SECOND_NS
    local = datetime.fromtimestamp(limit_s, tz)
    # In the second pass of a repeated hour, wall times up to an hour *later* were first
    # passed (and run) before now: start the backwards walk after them.
    shift = (local.replace(fold=0).utcoffset() or timedelta()) - (local.utcoffset() or timedelta())
    start = _wall(local) + max(shift, timedelta()) + timedelta(seconds=1)
    it = croniter(schedule.expr, start)
    for _ in range(_MAX_CANDIDATES):
        try:
            cand: datetime = it.get_prev(datetime)
        except CroniterBadDateError:
            return None
        if not schedule.year_ok(cand.year):
            year = schedule.prev_year(cand.year)
            if year is None:
                return None
            it = croniter(schedule.expr, datetime(year + 1, 1, 1, tzinfo=UTC))
            continue
        instant = _instant(cand, tz)
        if instant is not None and instant <= limit_s:
            return instant * SECOND_NS
    return None


def _wall(local: datetime) -> datetime:
    """A zone-aware local time as croniter should see it: its wall clock, labelled UTC."""
    return local.replace(tzinfo=UTC, fold=0)


def _instant(wall: datetime, tz: zoneinfo.ZoneInfo) -> int | None:
    """The Unix second at which wall-clock time ``wall`` first happens in ``tz``; None if
    the clocks skip it."""
    naive = wall.replace(tzinfo=None)
    local = naive.replace(tzinfo=tz, fold=0)
    if local.astimezone(UTC).astimezone(tz).replace(tzinfo=None) != naive:
        return None
    return int(local.timestamp())


def next_periodic_launch(periodic: PeriodicConfig, after_ns: int) -> int | None:
    """The earliest next launch over all of the job's cron expressions."""
    found = [next_launch(s, periodic.time_zone, after_ns) for s in periodic.schedules()]
    return min((t for t in found if t is not None), default=None)


def prev_periodic_launch(periodic: PeriodicConfig, at_or_before_ns: int) -> int | None:
    found = [prev_launch(s, periodic.time_zone, at_or_before_ns) for s in periodic.schedules()]
    return max((t for t in found if t is not None), default=None)


def due_launch(periodic: PeriodicConfig, last_ns: int, now_ns: int) -> int | None:
    """The latest launch slot in ``(last_ns, now_ns]``, or None.

    However many slots passed since ``last_ns`` (a slow tick, a leader that was down), one
    launch is due: the most recent. Stamping a launch with its slot (not with "now") is what
    lets the FSM refuse a second launch of the same slot, whichever server proposes it.
    """
    slot = prev_periodic_launch(periodic, now_ns)
    if slot is None or slot <= last_ns:
        return None
    return slot


# ---------------------------------------------------------------------------------------
# Children


def periodic_child_id(parent_id: str, launch_ns: int) -> str:
    return f"{parent_id}{PERIODIC_SUFFIX}{launch_ns // SECOND_NS}"


def dispatched_child_id(parent_id: str, now_ns: int, suffix: str) -> str:
    """``<parent>/dispatch-<unix seconds>-<suffix>``; ``suffix`` is 8 hex characters."""
    return f"{parent_id}{DISPATCH_SUFFIX}{now_ns // SECOND_NS}-{suffix}"


def launch_ns_from_id(child_id: str) -> int | None:
    """The launch time encoded in a periodic child's ID (after its last ``/periodic-``)."""
    _, sep, tail = child_id.rpartition(PERIODIC_SUFFIX)
    if not sep or not tail.isdigit():
        return None
    return int(tail) * SECOND_NS


def _fresh(parent: Job, child_id: str, now_ns: int) -> Job:
    """A new job made from ``parent``: nothing about the parent's life carries over.

    docs/field-reports.md#field-report-2: a child that inherited the parent's "running"
    status skewed the parent's
    children counts forever. Status, version and indexes start from zero here, and the
    FSM ignores a submitted status for a new job anyway.
    """
    return replace(
        parent,
        id=child_id,
        name=child_id,
        parent_id=parent.id,
        stop=False,
        status="",
        status_description="",
        version=0,
        stable=False,
        submit_time_ns=now_ns,
        create_index=0,
        modify_index=0,
        job_modify_index=0,
    )


def derive_periodic_child(parent: Job, launch_ns: int, now_ns: int) -> Job:
    """The child a periodic parent launches for the slot ``launch_ns``."""
    return replace(_fresh(parent, periodic_child_id(parent.id, launch_ns), now_ns), periodic=None)


def derive_dispatched_child(
    parent: Job,
    child_id: str,
    now_ns: int,
    meta: dict[str, str],
    payload: bytes,
    idempotency_token: str = "",
) -> Job:
    """The child a parameterized parent dispatches: its meta merged over the parent's."""
    child = _fresh(parent, child_id, now_ns)
    return replace(
        child,
        dispatched=True,
        meta={**parent.meta, **meta},
        payload=payload,
        dispatch_idempotency_token=idempotency_token,
    )
