"""The write path's specialised record helpers agree with the plain dataclasses operations.

scheduler/_records.py generates ``dataclasses.replace`` per class and changed fields (and
builds frozen slotted records through their slots); server/fsm.py compares job specs field
by field. Each is checked here against the straightforward code it stands in for.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from drover.scheduler import structs
from drover.scheduler._records import replacer, slot_setters
from drover.server.codec import from_proto, to_proto
from drover.server.fsm import _spec_equal
from tests.unit.test_codec import DATACLASSES, WIRE_CLASSES, assert_identical, message_class, values

SETTINGS = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def replacements(draw: st.DrawFn, cls: type) -> tuple[Any, tuple[str, ...], tuple[Any, ...]]:
    """A record, some of its fields (in any order), and new values for them."""
    obj = draw(values(cls))
    donor = draw(values(cls))
    names = tuple(draw(st.permutations([f.name for f in dataclasses.fields(cls)])))
    names = names[: draw(st.integers(0, len(names)))]
    return obj, names, tuple(getattr(donor, name) for name in names)


@pytest.mark.parametrize("name", WIRE_CLASSES)
def test_replacer__matches_dataclasses_replace(name: str) -> None:
    cls = DATACLASSES[name]

    @SETTINGS
    @given(case=replacements(cls))
    def check(case: tuple[Any, tuple[str, ...], tuple[Any, ...]]) -> None:
        obj, names, new = case
        expected = dataclasses.replace(obj, **dict(zip(names, new, strict=True)))

        assert_identical(replacer(cls, *names)(obj, *new), expected)
        assert_identical(replacer(cls, *names)(obj, **dict(zip(names, new, strict=True))), expected)

    check()


def test_replacer__every_record__is_built_through_its_slots() -> None:
    assert [name for name in WIRE_CLASSES if slot_setters(DATACLASSES[name]) is None] == []


def test_replacer__shares_unchanged_field_values() -> None:
    job = structs.Job(id="a", meta={"k": "v"}, groups=(structs.TaskGroup(name="g"),))

    moved = replacer(structs.Job, "version")(job, 3)

    assert moved.version == 3
    assert moved.meta is job.meta
    assert moved.groups is job.groups


def test_replacer__unknown_or_repeated_field__is_refused() -> None:
    with pytest.raises(TypeError):
        replacer(structs.Job, "nope")
    with pytest.raises(TypeError):
        replacer(structs.Job, "version", "version")


@dataclasses.dataclass(frozen=True)
class _Clamped:
    """A record whose __post_init__ matters, and without slots."""

    low: int = 0
    high: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "high", max(self.low, self.high))


@dataclasses.dataclass(frozen=True, slots=True)
class _Derived(structs.Resources):
    extra: int = 0


def test_replacer__class_with_post_init__goes_through_its_constructor() -> None:
    assert slot_setters(_Clamped) is None
    assert replacer(_Clamped, "low")(_Clamped(1, 2), 5) == dataclasses.replace(_Clamped(1, 2), low=5)
    assert replacer(_Clamped, "low")(_Clamped(1, 2), 5).high == 5


def test_replacer__instance_of_a_subclass__is_replaced_as_dataclasses_would() -> None:
    derived = _Derived(cpu_mhz=1, memory_mb=2, disk_mb=3, extra=4)

    moved = replacer(structs.Resources, "cpu_mhz")(derived, 9)

    assert type(moved) is _Derived
    assert moved == _Derived(cpu_mhz=9, memory_mb=2, disk_mb=3, extra=4)


# ---------------------------------------------------------------------------------------
# fsm._spec_equal: the two replaces it used to do, field by field

_BOOKKEEPING: dict[str, Any] = {
    "status": "",
    "status_description": "",
    "version": 0,
    "stable": False,
    "submit_time_ns": 0,
    "create_index": 0,
    "modify_index": 0,
    "job_modify_index": 0,
}


def reference_spec_equal(a: structs.Job, b: structs.Job) -> bool:
    return dataclasses.replace(a, **_BOOKKEEPING) == dataclasses.replace(b, **_BOOKKEEPING)


def _copy(job: structs.Job) -> structs.Job:
    """An equal job sharing no objects with ``job`` (as the FSM's decoded one is)."""
    return from_proto(to_proto(job, message_class("Job")()), structs.Job)


@SETTINGS
@given(case=replacements(structs.Job), rebuilt=st.booleans())
def test_spec_equal__matches_comparing_the_jobs_with_bookkeeping_blanked(
    case: tuple[structs.Job, tuple[str, ...], tuple[Any, ...]], rebuilt: bool
) -> None:
    old, names, new = case
    job = dataclasses.replace(_copy(old) if rebuilt else old, **dict(zip(names, new, strict=True)))

    assert _spec_equal(old, job) == reference_spec_equal(old, job)
    assert _spec_equal(job, old) == reference_spec_equal(job, old)


@SETTINGS
@given(job=values(structs.Job), bookkeeping=values(structs.Job))
def test_spec_equal__bookkeeping_only_change__is_equal(job: structs.Job, bookkeeping: structs.Job) -> None:
    other = dataclasses.replace(_copy(job), **{name: getattr(bookkeeping, name) for name in _BOOKKEEPING})

    assert _spec_equal(job, other)
    assert reference_spec_equal(job, other)


def test_spec_equal__bookkeeping_fields__are_the_ones_the_fsm_ignores() -> None:
    from drover.server import fsm

    assert set(fsm.JOB_BOOKKEEPING_FIELDS) == set(_BOOKKEEPING)
