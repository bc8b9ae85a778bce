"""The reflective codec: dataclasses and protobuf messages agree field for field, and round-trip.

server/codec.py converts by field name, so the only thing that keeps it honest is that
every dataclass in scheduler/structs.py and its same-named message have the same fields,
of matching shapes. The round trips build random values reflectively from the message
descriptors (so every integer stays inside its wire type's range) and also start from the
mock factories with random overrides.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import pytest
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from drover.common import taskstate
from drover.scheduler import structs
from drover.scheduler.structs import TaskGroupSummary
from drover.server import codec
from drover.server.codec import from_proto, to_proto
from drover.v1 import raft_pb2, structs_pb2
from tests.fixtures import mock

# Dataclasses with no message of their own: scheduler-internal values never sent or stored.
NOT_ON_THE_WIRE = {"Plan", "PlanResult"}
# Messages a dataclass maps to that live outside structs.proto.
ELSEWHERE: dict[str, type[Message]] = {"AllocStop": raft_pb2.AllocStop}


# structs re-exports the task records it shares with the client agent; they are its own too.
STRUCTS_MODULES = {structs.__name__, taskstate.__name__}


def _dataclasses() -> dict[str, type]:
    return {
        name: obj
        for name, obj in vars(structs).items()
        if isinstance(obj, type) and dataclasses.is_dataclass(obj) and obj.__module__ in STRUCTS_MODULES
    }


DATACLASSES = _dataclasses()


def message_class(name: str) -> type[Message]:
    if name in ELSEWHERE:
        return ELSEWHERE[name]
    cls: type[Message] = getattr(structs_pb2, name)
    return cls


WIRE_CLASSES = sorted(name for name in DATACLASSES if name not in NOT_ON_THE_WIRE)


def hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls, vars(structs))


def _is_map(fd: Any) -> bool:
    return fd.message_type is not None and fd.message_type.GetOptions().map_entry


def _is_repeated(fd: Any) -> bool:
    return bool(fd.is_repeated)


def _optional_inner(tp: Any) -> Any:
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        return next(a for a in typing.get_args(tp) if a is not type(None))
    return None


# ---------------------------------------------------------------------------------------
# The two sides agree


def test_codec__every_dataclass__has_a_message_or_is_known_internal() -> None:
    missing = [
        name
        for name in DATACLASSES
        if name not in NOT_ON_THE_WIRE and name not in ELSEWHERE and not hasattr(structs_pb2, name)
    ]
    assert missing == [], f"dataclasses with no message in structs.proto: {missing}"


def test_codec__every_structs_message__has_a_dataclass() -> None:
    assert sorted(set(structs_pb2.DESCRIPTOR.message_types_by_name) - set(DATACLASSES)) == []


@pytest.mark.parametrize("name", WIRE_CLASSES)
def test_codec__dataclass_and_message__have_the_same_field_names(name: str) -> None:
    fields = {f.name for f in dataclasses.fields(DATACLASSES[name])}
    message_fields = set(message_class(name).DESCRIPTOR.fields_by_name)

    assert fields == message_fields, (
        f"{name}: only in the dataclass {sorted(fields - message_fields)}, "
        f"only in the message {sorted(message_fields - fields)}"
    )


_SCALAR_TYPES: dict[int, type] = {
    FieldDescriptor.TYPE_STRING: str,
    FieldDescriptor.TYPE_BYTES: bytes,
    FieldDescriptor.TYPE_BOOL: bool,
    FieldDescriptor.TYPE_INT32: int,
    FieldDescriptor.TYPE_INT64: int,
    FieldDescriptor.TYPE_UINT32: int,
    FieldDescriptor.TYPE_UINT64: int,
    FieldDescriptor.TYPE_SINT32: int,
    FieldDescriptor.TYPE_SINT64: int,
    FieldDescriptor.TYPE_DOUBLE: float,
}


def _shape_problems(name: str) -> list[str]:
    """Where a dataclass field's type does not fit its message field (repeated, map, message)."""
    cls = DATACLASSES[name]
    problems: list[str] = []
    for f in dataclasses.fields(cls):
        tp = hints(cls)[f.name]
        fd: Any = message_class(name).DESCRIPTOR.fields_by_name.get(f.name)
        if fd is None:
            continue  # reported by the field-name test
        where = f"{name}.{f.name}"
        origin, args = typing.get_origin(tp), typing.get_args(tp)
        if _is_map(fd):
            value_fd = fd.message_type.fields_by_name["value"]
            if origin not in (Mapping, dict) or args[0] is not str:
                problems.append(f"{where}: map<string, ...> in the message, {tp} in the dataclass")
            elif value_fd.message_type is not None:
                if getattr(args[1], "__name__", None) != value_fd.message_type.name:
                    problems.append(
                        f"{where}: map of {value_fd.message_type.name}, dataclass map of {args[1]}"
                    )
            elif _SCALAR_TYPES.get(value_fd.type) is not args[1]:
                problems.append(f"{where}: map value type differs ({args[1]})")
        elif _is_repeated(fd):
            if origin is not tuple or len(args) != 2 or args[1] is not Ellipsis:
                problems.append(f"{where}: repeated in the message, {tp} in the dataclass")
            elif fd.message_type is not None:
                if getattr(args[0], "__name__", None) != fd.message_type.name:
                    problems.append(f"{where}: repeated {fd.message_type.name}, dataclass tuple of {args[0]}")
            elif _SCALAR_TYPES.get(fd.type) is not args[0]:
                problems.append(f"{where}: repeated scalar type differs ({args[0]})")
        elif fd.message_type is not None:
            inner = _optional_inner(tp)
            if inner is None or inner.__name__ != fd.message_type.name:
                problems.append(f"{where}: message {fd.message_type.name}, dataclass {tp} (must be Optional)")
        elif _SCALAR_TYPES.get(fd.type) is not tp:
            problems.append(f"{where}: {FieldDescriptor.__name__} type {fd.type}, dataclass {tp}")
    return problems


@pytest.mark.parametrize("name", WIRE_CLASSES)
def test_codec__dataclass_and_message__fields_have_matching_shapes(name: str) -> None:
    assert _shape_problems(name) == []


# ---------------------------------------------------------------------------------------
# Random values, derived from the descriptors

_INT_RANGES = {
    FieldDescriptor.TYPE_INT32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_SINT32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_INT64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_SINT64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_UINT32: (0, 2**32 - 1),
    FieldDescriptor.TYPE_UINT64: (0, 2**64 - 1),
}
_text = st.text(st.characters(codec="utf-8"), max_size=6)  # protobuf strings are UTF-8


def _scalar(fd: Any) -> st.SearchStrategy[Any]:
    if fd.type in _INT_RANGES:
        lo, hi = _INT_RANGES[fd.type]
        return st.one_of(st.integers(-3, 3).filter(lambda v: lo <= v <= hi), st.integers(lo, hi))
    if fd.type == FieldDescriptor.TYPE_STRING:
        return _text
    if fd.type == FieldDescriptor.TYPE_BYTES:
        return st.binary(max_size=6)
    if fd.type == FieldDescriptor.TYPE_BOOL:
        return st.booleans()
    if fd.type == FieldDescriptor.TYPE_DOUBLE:
        return st.floats(allow_nan=False)  # NaN is never equal to itself
    raise AssertionError(f"no strategy for field {fd.full_name} of type {fd.type}")


def values(cls: type, descriptor: Any = None) -> st.SearchStrategy[Any]:
    """Any value of the dataclass ``cls`` that its message can carry."""
    descriptor = descriptor or message_class(cls.__name__).DESCRIPTOR
    kwargs: dict[str, st.SearchStrategy[Any]] = {}
    for f in dataclasses.fields(cls):
        tp = hints(cls)[f.name]
        fd = descriptor.fields_by_name[f.name]
        if _is_map(fd):
            value_fd = fd.message_type.fields_by_name["value"]
            value = values(typing.get_args(tp)[1]) if value_fd.message_type is not None else _scalar(value_fd)
            kwargs[f.name] = st.dictionaries(_text, value, max_size=2)
        elif _is_repeated(fd):
            elem = values(typing.get_args(tp)[0]) if fd.message_type is not None else _scalar(fd)
            kwargs[f.name] = st.lists(elem, max_size=2).map(tuple)
        elif fd.message_type is not None:
            kwargs[f.name] = st.none() | values(_optional_inner(tp))
        else:
            kwargs[f.name] = _scalar(fd)
    return st.builds(cls, **kwargs)


def round_trip(obj: Any) -> Any:
    msg = to_proto(obj, message_class(type(obj).__name__)())
    wire = msg.SerializeToString(deterministic=True)
    return from_proto(type(msg).FromString(wire), type(obj))


ROUND_TRIP_SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.mark.parametrize("name", ["Job", "Node", "Allocation", "Evaluation", "JobSummary"])
def test_codec__random_value__round_trips(name: str) -> None:
    @ROUND_TRIP_SETTINGS
    @given(obj=values(DATACLASSES[name]))
    def check(obj: Any) -> None:
        assert round_trip(obj) == obj

    check()


@pytest.mark.parametrize(
    "name", [n for n in WIRE_CLASSES if n not in ("Job", "Node", "Allocation", "Evaluation", "JobSummary")]
)
def test_codec__random_value_of_every_other_record__round_trips(name: str) -> None:
    @settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(obj=values(DATACLASSES[name]))
    def check(obj: Any) -> None:
        assert round_trip(obj) == obj

    check()


def test_codec__unset_optional_message__comes_back_none_and_empty_one_comes_back_empty() -> None:
    assert round_trip(mock.node(resources=None, drain_strategy=None)).resources is None
    drained = round_trip(mock.node(drain_strategy=structs.DrainStrategy(deadline_ns=0)))
    assert drained.drain_strategy == structs.DrainStrategy(deadline_ns=0)
    assert drained.drain


# ---------------------------------------------------------------------------------------
# From the mock factories, with random overrides

_names = st.sampled_from(["web", "api", "cache", "a/b", "ünïcödé"])


@ROUND_TRIP_SETTINGS
@given(
    factory=st.sampled_from(
        [mock.job, mock.batch_job, mock.system_job, mock.sysbatch_job, mock.periodic_job]
    ),
    priority=st.integers(1, 100),
    count=st.integers(0, 1000),
    meta=st.dictionaries(_text, _text, max_size=3),
    status=st.sampled_from(["", "pending", "running", "dead"]),
    version=st.integers(0, 2**64 - 1),
    payload=st.binary(max_size=8),
)
def test_codec__mock_job_with_overrides__round_trips(
    factory: Any, priority: int, count: int, meta: dict[str, str], status: str, version: int, payload: bytes
) -> None:
    job = factory(priority=priority, meta=meta, status=status, version=version, payload=payload)
    job = replace(job, groups=(replace(job.groups[0], count=count),))

    assert round_trip(job) == job


@ROUND_TRIP_SETTINGS
@given(
    name=_names,
    status=st.sampled_from(structs.NODE_STATUSES),
    drain=st.booleans(),
    attributes=st.dictionaries(_text, _text, max_size=3),
    events=st.lists(
        st.builds(structs.NodeEvent, message=_text, details=st.dictionaries(_text, _text, max_size=2)),
        max_size=3,
    ),
)
def test_codec__mock_node_with_overrides__round_trips(
    name: str, status: str, drain: bool, attributes: dict[str, str], events: list[structs.NodeEvent]
) -> None:
    factory = mock.drain_node if drain else mock.node
    node = factory(name=name, status=status, attributes=attributes, events=tuple(events))

    assert round_trip(node) == node


@ROUND_TRIP_SETTINGS
@given(
    client_status=st.sampled_from(structs.ALLOC_CLIENT_STATUSES),
    task_states=st.dictionaries(_names, values(structs.TaskState), max_size=2),
    history=st.lists(values(structs.AllocStateChange), max_size=3),
    index=st.integers(0, 2**32 - 1),
)
def test_codec__mock_alloc_with_overrides__round_trips(
    client_status: str,
    task_states: dict[str, structs.TaskState],
    history: list[structs.AllocStateChange],
    index: int,
) -> None:
    alloc = mock.alloc(
        mock.job(),
        mock.node(),
        index,
        client_status=client_status,
        task_states=task_states,
        state_history=tuple(history),
    )

    assert round_trip(alloc) == alloc


@ROUND_TRIP_SETTINGS
@given(
    status=st.sampled_from(["pending", "blocked", "complete", "failed", "canceled"]),
    queued=st.dictionaries(_names, st.integers(0, 2**31 - 1), max_size=2),
    failed=st.dictionaries(_names, _text, max_size=2),
)
def test_codec__mock_eval_and_summary__round_trip(
    status: str, queued: dict[str, int], failed: dict[str, str]
) -> None:
    job = mock.job()
    ev = mock.eval_for(job, status=status, queued_allocations=queued, failed_tg_allocs=failed)
    summary = structs.JobSummary(
        job_id=job.id,
        summary={group: structs.TaskGroupSummary(queued=n) for group, n in queued.items()},
        children=structs.JobChildrenSummary(pending=1),
    )

    assert round_trip(ev) == ev
    assert round_trip(summary) == summary


# ---------------------------------------------------------------------------------------
# The generated converters against a reflective reference
#
# server/codec.py generates one function per class and direction. The reference below is
# the reflective converter it replaced, kept verbatim in spirit: per field, dispatch on
# the field's kind, recurse on the value's own type. Both must build the same dataclass
# values (same field types, same map order) and messages that serialize to the same bytes.

_R_SCALAR, _R_OPTIONAL_MSG, _R_MSG, _R_REPEATED_SCALAR, _R_REPEATED_MSG, _R_MAP_SCALAR, _R_MAP_MSG = range(7)


def _is_dataclass_type(tp: Any) -> bool:
    return isinstance(tp, type) and dataclasses.is_dataclass(tp)


def _reference_plan(cls: type) -> tuple[tuple[str, int, Any], ...]:
    plan: list[tuple[str, int, Any]] = []
    for f in dataclasses.fields(cls):
        tp = hints(cls)[f.name]
        origin, args = typing.get_origin(tp), typing.get_args(tp)
        if origin in (typing.Union, types.UnionType):
            plan.append((f.name, _R_OPTIONAL_MSG, next(a for a in args if a is not type(None))))
        elif _is_dataclass_type(tp):
            plan.append((f.name, _R_MSG, tp))
        elif origin is tuple:
            kind = _R_REPEATED_MSG if _is_dataclass_type(args[0]) else _R_REPEATED_SCALAR
            plan.append((f.name, kind, args[0]))
        elif origin in (Mapping, dict, typing.Mapping):
            plan.append((f.name, _R_MAP_MSG if _is_dataclass_type(args[1]) else _R_MAP_SCALAR, args[1]))
        else:
            plan.append((f.name, _R_SCALAR, None))
    return tuple(plan)


def reference_to_proto(obj: Any, msg: Any) -> Any:
    for name, kind, _sub in _reference_plan(type(obj)):
        value = getattr(obj, name)
        if kind == _R_SCALAR:
            if value:
                setattr(msg, name, value)
        elif kind in (_R_OPTIONAL_MSG, _R_MSG):
            if value is not None:
                reference_to_proto(value, getattr(msg, name))
                if kind == _R_OPTIONAL_MSG:
                    getattr(msg, name).SetInParent()
        elif kind == _R_REPEATED_SCALAR:
            if value:
                getattr(msg, name).extend(value)
        elif kind == _R_REPEATED_MSG:
            if value:
                target = getattr(msg, name)
                for item in value:
                    reference_to_proto(item, target.add())
        elif kind == _R_MAP_SCALAR:
            if value:
                getattr(msg, name).update(value)
        elif value:
            target = getattr(msg, name)
            for key, item in value.items():
                reference_to_proto(item, target[key])
    return msg


def reference_from_proto(msg: Any, cls: type) -> Any:
    kwargs: dict[str, Any] = {}
    for name, kind, sub in _reference_plan(cls):
        if kind == _R_SCALAR:
            kwargs[name] = getattr(msg, name)
        elif kind == _R_OPTIONAL_MSG:
            kwargs[name] = reference_from_proto(getattr(msg, name), sub) if msg.HasField(name) else None
        elif kind == _R_MSG:
            kwargs[name] = reference_from_proto(getattr(msg, name), sub)
        elif kind == _R_REPEATED_SCALAR:
            kwargs[name] = tuple(getattr(msg, name))
        elif kind == _R_REPEATED_MSG:
            kwargs[name] = tuple(reference_from_proto(item, sub) for item in getattr(msg, name))
        elif kind == _R_MAP_SCALAR:
            kwargs[name] = dict(getattr(msg, name))
        else:
            kwargs[name] = {key: reference_from_proto(item, sub) for key, item in getattr(msg, name).items()}
    return cls(**kwargs)


def assert_identical(ours: Any, ref: Any, where: str = "value", any_order: bool = False) -> None:
    """Stricter than ``==``: the same types all the way down, and dicts in the same order,
    except a shared map (``any_order``): the codec hands out the first equal one it decoded,
    in that one's order, since protobuf does not keep a map's order through a round trip."""
    assert type(ours) is type(ref), f"{where}: {type(ours).__name__} vs {type(ref).__name__}"
    if dataclasses.is_dataclass(ref):
        shared = codec.SHARED_MAPS.get(type(ref), frozenset())
        for f in dataclasses.fields(ref):
            unordered = any_order or type(ref) in codec.SHARED_CLASSES or f.name in shared
            assert_identical(getattr(ours, f.name), getattr(ref, f.name), f"{where}.{f.name}", unordered)
    elif isinstance(ref, tuple):
        assert len(ours) == len(ref), f"{where}: length {len(ours)} vs {len(ref)}"
        for i, (a, b) in enumerate(zip(ours, ref, strict=True)):
            assert_identical(a, b, f"{where}[{i}]", any_order)
    elif isinstance(ref, dict):
        if any_order:
            assert sorted(ours) == sorted(ref), f"{where}: keys {sorted(ours)} vs {sorted(ref)}"
        else:
            assert list(ours) == list(ref), f"{where}: keys {list(ours)} vs {list(ref)}"
        for key in ref:
            assert_identical(ours[key], ref[key], f"{where}[{key!r}]", any_order)
    else:
        assert ours == ref, f"{where}: {ours!r} vs {ref!r}"
    assert ours == ref


def check_against_reference(obj: Any) -> None:
    msg_cls = message_class(type(obj).__name__)
    ours, ref = to_proto(obj, msg_cls()), reference_to_proto(obj, msg_cls())
    # Byte-equal as written (map entries in insertion order) and in deterministic form.
    assert ours.SerializeToString() == ref.SerializeToString()
    assert ours.SerializeToString(deterministic=True) == ref.SerializeToString(deterministic=True)
    assert ours == ref
    # From the message as built (presence as set) and as it comes off the wire.
    for msg in (ref, msg_cls.FromString(ref.SerializeToString())):
        assert_identical(from_proto(msg, type(obj)), reference_from_proto(msg, type(obj)))


# The records the state holds most of get more examples than the rest.
_MAIN_RECORDS = ("Job", "Node", "Allocation", "Evaluation")


def _matches_the_reference_on_random(name: str, max_examples: int) -> None:
    @settings(max_examples=max_examples, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(obj=values(DATACLASSES[name]))
    def check(obj: Any) -> None:
        check_against_reference(obj)

    check()


@pytest.mark.parametrize("name", _MAIN_RECORDS)
def test_codec__generated_converters__match_the_reference_on_random_records(name: str) -> None:
    _matches_the_reference_on_random(name, 150)


@pytest.mark.parametrize("name", [n for n in WIRE_CLASSES if n not in _MAIN_RECORDS])
def test_codec__generated_converters__match_the_reference_on_every_other_record(name: str) -> None:
    _matches_the_reference_on_random(name, 25)


@ROUND_TRIP_SETTINGS
@given(
    factory=st.sampled_from(
        [mock.job, mock.batch_job, mock.system_job, mock.sysbatch_job, mock.periodic_job]
    ),
    meta=st.dictionaries(_text, _text, max_size=4),
)
def test_codec__generated_converters__match_the_reference_on_mock_jobs(
    factory: Any, meta: dict[str, str]
) -> None:
    check_against_reference(factory(meta=meta))
    check_against_reference(mock.node(attributes=meta))
    job = factory(meta=meta)
    check_against_reference(mock.alloc(job, mock.node(), 7))
    check_against_reference(mock.eval_for(job, queued_allocations={"web": 3}))


def test_codec__map_that_is_not_a_dict__is_written_like_the_reference() -> None:
    meta = {"z": "1", "a": "2", "m": "3"}
    job = mock.job(meta=types.MappingProxyType(meta))
    ours = to_proto(job, structs_pb2.Job())
    ref = reference_to_proto(job, structs_pb2.Job())

    assert ours.SerializeToString() == ref.SerializeToString()
    assert dict(ours.meta) == meta


def test_codec__optional_message_left_empty__is_present() -> None:
    job = mock.job(
        update=structs.UpdateStrategy(
            max_parallel=0, stagger_ns=0, min_healthy_time_ns=0, healthy_deadline_ns=0
        )
    )
    msg = to_proto(job, structs_pb2.Job())

    assert msg.HasField("update")
    assert from_proto(msg, structs.Job).update == job.update


@dataclasses.dataclass(frozen=True, slots=True)
class _Normalized:
    """Not a record of structs.py: its __post_init__ must run, so the codec calls the class."""

    cpu_mhz: int = 0
    memory_mb: int = 0
    disk_mb: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "disk_mb", self.disk_mb or self.memory_mb)


def test_codec__class_with_post_init__is_built_through_its_constructor() -> None:
    value = from_proto(structs_pb2.Resources(cpu_mhz=1, memory_mb=64), _Normalized)

    assert value == _Normalized(cpu_mhz=1, memory_mb=64, disk_mb=64)


# ---------------------------------------------------------------------------------------
# Decode-side sharing: interned strings, shared small records, one empty map
#
# The state store keeps every decoded alloc (twice on the leader), so decoding shares what
# repeats. Sharing must be invisible but for identity: equal values, the same types, the
# same bytes when encoded again (state digests hash the encoded state).


_JOB = mock.job()
_NODE = mock.node()


def _alloc_msg(i: int, **overrides: Any) -> structs_pb2.Allocation:
    """An alloc of one job's group on one node, placed by one eval: slot ``i``."""
    alloc = mock.alloc(_JOB, _NODE, i, eval_id="eval-1", followup_eval_id="eval-2")
    msg = to_proto(alloc, structs_pb2.Allocation())
    for name, value in overrides.items():
        if isinstance(value, Message):
            getattr(msg, name).CopyFrom(value)
        else:
            setattr(msg, name, value)
    # Off the wire, as the FSM decodes them: every string a fresh object.
    return structs_pb2.Allocation.FromString(msg.SerializeToString())


def test_codec__interned_fields__are_str_fields_or_maps_keyed_by_str() -> None:
    for cls, names in codec.INTERNED_FIELDS.items():
        field_types = hints(cls)
        for name in names:
            tp = field_types[name]
            assert tp is str or (typing.get_origin(tp) is Mapping and typing.get_args(tp)[0] is str), (
                f"{cls.__name__}.{name}: {tp}"
            )


def test_codec__decoded_allocs__share_their_repeated_strings_and_not_their_ids() -> None:
    a = from_proto(
        _alloc_msg(0, client_description="started", desired_description="run it"), structs.Allocation
    )
    b = from_proto(
        _alloc_msg(1, client_description="started", desired_description="run it"), structs.Allocation
    )

    for name in sorted(codec.INTERNED_FIELDS[structs.Allocation] - {"task_states"}):
        assert getattr(a, name) == getattr(b, name), name
        assert getattr(a, name) is getattr(b, name), f"{name} is not shared"
    assert a.id != b.id
    assert a.name is not b.name


def test_codec__interned_map_keys__are_shared_and_values_are_not_touched() -> None:
    states = {"server": structs_pb2.TaskState(state="running", restarts=1)}
    msg_a, msg_b = structs_pb2.Allocation(task_states=states), structs_pb2.Allocation(task_states=states)
    a = from_proto(structs_pb2.Allocation.FromString(msg_a.SerializeToString()), structs.Allocation)
    b = from_proto(structs_pb2.Allocation.FromString(msg_b.SerializeToString()), structs.Allocation)

    (key_a,), (key_b,) = a.task_states, b.task_states
    assert key_a is key_b
    assert a.task_states["server"].state is b.task_states["server"].state
    assert a.task_states == b.task_states == {"server": structs.TaskState(state="running", restarts=1)}


def test_codec__equal_resources__decode_to_one_object_and_different_ones_do_not() -> None:
    a = from_proto(_alloc_msg(0), structs.Allocation)
    b = from_proto(_alloc_msg(1), structs.Allocation)
    bigger = structs_pb2.AllocatedResources(cpu_mhz=a.resources.cpu_mhz + 1 if a.resources else 1)
    c = from_proto(_alloc_msg(2, resources=bigger), structs.Allocation)

    assert a.resources is not None and a.resources is b.resources
    assert c.resources is not a.resources
    assert c.resources == structs.AllocatedResources(cpu_mhz=bigger.cpu_mhz)


def test_codec__shared_records_with_ports__are_shared_only_when_the_ports_are_equal() -> None:
    def resources(port: int) -> structs.AllocatedResources:
        msg = structs_pb2.AllocatedResources(
            cpu_mhz=100, ports=[structs_pb2.AllocatedPort(label="http", value=port, host_ip="10.0.0.1")]
        )
        return from_proto(
            structs_pb2.AllocatedResources.FromString(msg.SerializeToString()), structs.AllocatedResources
        )

    assert resources(20001) is resources(20001)
    assert resources(20001) is not resources(20002)
    assert resources(20002).ports == (structs.AllocatedPort(label="http", value=20002, host_ip="10.0.0.1"),)


def test_codec__shared_record_cache__stays_bounded_and_keeps_decoding_right() -> None:
    limit = codec.SHARED_CACHE_SIZE
    decoded = [
        from_proto(structs_pb2.Resources(cpu_mhz=i, memory_mb=1), structs.Resources)
        for i in range(3 * limit + 7)
    ]
    caches = [v for k, v in codec._NAMESPACE.items() if k.startswith("_shared_")]

    assert caches and all(len(cache) <= limit for cache in caches)
    assert [r.cpu_mhz for r in decoded] == list(range(3 * limit + 7))
    assert all(r.memory_mb == 1 for r in decoded)


def test_codec__empty_maps__decode_to_one_empty_dict_that_stays_empty() -> None:
    job = from_proto(to_proto(mock.job(meta={}), structs_pb2.Job()), structs.Job)
    alloc = from_proto(_alloc_msg(0), structs.Allocation)
    ev = from_proto(structs_pb2.Evaluation(id="e"), structs.Evaluation)

    assert type(alloc.task_states) is dict
    maps: list[Mapping[str, Any]] = [alloc.task_states, ev.queued_allocations, ev.failed_tg_allocs, job.meta]
    assert all(m is codec.EMPTY_MAP for m in maps)
    # Whatever ran before in this process (every codec test) left it empty.
    assert codec.EMPTY_MAP == {}


def test_codec__sharing__changes_neither_equality_nor_the_encoded_bytes() -> None:
    msgs = [_alloc_msg(i, client_status="running", client_description="ok") for i in range(3)]
    for msg in msgs:
        ours = from_proto(msg, structs.Allocation)
        ref = reference_from_proto(msg, structs.Allocation)
        assert_identical(ours, ref)
        again = to_proto(ours, structs_pb2.Allocation())
        assert again.SerializeToString(deterministic=True) == msg.SerializeToString(deterministic=True)


@dataclasses.dataclass(frozen=True, slots=True)
class _Interned:
    label: str = ""
    count: int = 0


@dataclasses.dataclass(frozen=True, slots=True)
class _RecordMapHolder:
    """Shaped like structs.JobSummary's ``summary``: a map of records can not be a cache key."""

    summary: Mapping[str, TaskGroupSummary] = dataclasses.field(default_factory=dict)


def test_codec__interning_a_field_that_is_not_a_str__is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(codec.INTERNED_FIELDS, _Interned, frozenset({"count"}))

    with pytest.raises(TypeError, match="neither a str"):
        from_proto(structs_pb2.Port(label="x"), _Interned)


def test_codec__interning_a_field_that_does_not_exist__is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(codec.INTERNED_FIELDS, _Interned, frozenset({"nope"}))

    with pytest.raises(TypeError, match="names no field"):
        from_proto(structs_pb2.Port(label="x"), _Interned)


def test_codec__sharing_a_class_with_a_map_of_records__is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(codec, "SHARED_CLASSES", codec.SHARED_CLASSES | {_RecordMapHolder})

    with pytest.raises(TypeError, match="map of records"):
        from_proto(structs_pb2.JobSummary(), _RecordMapHolder)


def test_codec__shared_class_with_a_scalar_map__equal_values_decode_to_one_record() -> None:
    """A placement's node scores (structs.NodeScoreMeta) repeat across allocs: equal ones
    are one object whatever their key order (protobuf does not keep a map's order through a
    round trip); a different score is its own record."""
    msg = structs_pb2.NodeScoreMeta(node_id="n1", norm_score=0.5)
    msg.scores["binpack"] = 0.5
    msg.scores["job-anti-affinity"] = -0.25
    first = from_proto(msg, structs.NodeScoreMeta)
    again = from_proto(structs_pb2.NodeScoreMeta.FromString(msg.SerializeToString()), structs.NodeScoreMeta)
    assert again is first
    reordered = structs_pb2.NodeScoreMeta(node_id="n1", norm_score=0.5)
    reordered.scores["job-anti-affinity"] = -0.25
    reordered.scores["binpack"] = 0.5
    assert from_proto(reordered, structs.NodeScoreMeta) is first
    other = structs_pb2.NodeScoreMeta(node_id="n1", norm_score=0.5)
    other.scores["binpack"] = 0.75
    assert from_proto(other, structs.NodeScoreMeta).scores == {"binpack": 0.75}


def test_codec__shared_maps__equal_counts_decode_to_one_dict() -> None:
    msg = structs_pb2.AllocMetric(nodes_evaluated=3)
    msg.nodes_available["dc1"] = 20
    first = from_proto(msg, structs.AllocMetric)
    second = from_proto(structs_pb2.AllocMetric.FromString(msg.SerializeToString()), structs.AllocMetric)
    assert first.nodes_available == {"dc1": 20}
    assert second.nodes_available is first.nodes_available
    two = structs_pb2.AllocMetric(nodes_evaluated=3)
    two.nodes_available["dc1"] = 20
    two.nodes_available["dc2"] = 5
    owt = structs_pb2.AllocMetric(nodes_evaluated=3)
    owt.nodes_available["dc2"] = 5
    owt.nodes_available["dc1"] = 20
    assert (
        from_proto(owt, structs.AllocMetric).nodes_available
        is from_proto(two, structs.AllocMetric).nodes_available
    )


@dataclasses.dataclass(frozen=True, slots=True)
class _SharedNormalized(_Normalized):
    """``_Normalized`` made shared: a class of its own, so the codec's per-class plans and
    caches never carry the sharing over to ``_Normalized``'s test."""


def test_codec__shared_class_built_through_its_constructor__is_built_once_and_reused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(codec, "SHARED_CLASSES", codec.SHARED_CLASSES | {_SharedNormalized})
    msg = structs_pb2.Resources(cpu_mhz=1, memory_mb=64)

    first = from_proto(msg, _SharedNormalized)
    second = from_proto(structs_pb2.Resources.FromString(msg.SerializeToString()), _SharedNormalized)

    assert first == _SharedNormalized(cpu_mhz=1, memory_mb=64, disk_mb=64)
    assert second is first


def test_codec__decoded_node_and_its_allocs__share_the_node_id_and_name() -> None:
    node_msg = to_proto(mock.node(id="node-77", name="node-seventy-seven"), structs_pb2.Node())
    node = from_proto(structs_pb2.Node.FromString(node_msg.SerializeToString()), structs.Node)
    alloc = from_proto(_alloc_msg(0, node_id="node-77", node_name="node-seventy-seven"), structs.Allocation)

    assert alloc.node_id is node.id
    assert alloc.node_name is node.name
