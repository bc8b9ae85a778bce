"""Conversion between the domain dataclasses (scheduler/structs.py) and protobuf messages.

The two sides share field names, so the converters are derived from the dataclasses: the
per-class plan (which fields are nested messages, repeated, maps, optional) is computed
once per class, and from it one specialised Python function per direction is generated
(as the stdlib ``dataclasses`` module generates ``__init__``), so a conversion does no
per-field dispatch and no reflection at run time. Conversion sits on the write path (every
Jobs.Register converts its job three times) and in snapshots.

The generated code does what the plan says, field by field, in the dataclass's field
order: a scalar is copied when truthy, an optional message when not ``None`` (marked
present even if empty), repeated fields and maps when non-empty. tests/unit/test_codec.py
checks it against a straightforward reflective reference implementation.

Decoding also shares what repeats, because the state store keeps every decoded record
(an alloc is decoded twice on the leader: the plan applier's expected state and the FSM)
and most of an alloc's strings are the same for all the allocs of a job, a node or an
eval. Equal values only, so equality, encoding and state digests are unchanged:

* the ``str`` fields listed in ``INTERNED_FIELDS`` (and the keys of the maps listed
  there) go through ``sys.intern``: one string per distinct value, not one per record;
* a record of a class in ``SHARED_CLASSES`` (small, immutable all the way down, often
  equal: an alloc's resources) is looked up by its field values in a bounded per-class
  cache and the first equal one is reused;
* an empty map decodes to one shared empty ``dict``. Records are frozen and their map
  fields are typed ``Mapping``: nobody may change a record's map in place, this one least.
"""

from __future__ import annotations

import dataclasses
import itertools
import sys
import threading
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any, Final, TypeVar

from google.protobuf.message import Message

from drover.scheduler import structs
from drover.scheduler._records import construction

T = TypeVar("T")
M = TypeVar("M", bound=Message)

_SCALAR, _OPTIONAL_MSG, _MSG, _REPEATED_SCALAR, _REPEATED_MSG, _MAP_SCALAR, _MAP_MSG = range(7)
_NESTED_KINDS = frozenset({_OPTIONAL_MSG, _MSG, _REPEATED_MSG, _MAP_MSG})

FieldPlan = tuple[str, int, Any]  # (name, kind, dataclass type for nested kinds)

# Decode-side sharing (see the module docstring). Interned: fields whose values repeat
# across the many records the state keeps (per alloc: its job, eval, node, group,
# statuses), and a node's ID and name, which every alloc on the node repeats (interned on
# both sides, they are one string). Never a value found once (an alloc's own ID and name,
# free-form messages): interning it would only add an entry to the interned table.
INTERNED_FIELDS: Final[Mapping[type, frozenset[str]]] = {
    structs.Allocation: frozenset(
        {
            "namespace",
            "eval_id",
            "node_id",
            "node_name",
            "job_id",
            "task_group",
            "desired_status",
            "desired_description",
            "client_status",
            "client_description",
            "followup_eval_id",
            "deployment_id",
            "task_states",  # keys: the group's task names
        }
    ),
    structs.NodeScoreMeta: frozenset({"node_id", "scores"}),
    structs.AllocatedPort: frozenset({"label", "host_ip"}),
    structs.TaskState: frozenset({"state"}),
    structs.TaskEvent: frozenset({"type"}),
    structs.AllocStateChange: frozenset({"field", "value"}),
    structs.RescheduleEvent: frozenset({"prev_node_id"}),
    structs.Evaluation: frozenset(
        {"namespace", "type", "triggered_by", "job_id", "node_id", "status", "queued_allocations"}
    ),
    structs.Node: frozenset({"id", "name", "datacenter", "node_class", "status", "scheduling_eligibility"}),
}
# Shared: equal records decode to one object (every alloc of a group asks the same).
# A placement's top node scores repeat across the allocs of an eval (a node at the same fill
# level scores the same), so they are shared too; a scalar map field is part of the key,
# sorted: a map's order is not kept through a protobuf round trip, and digests sort keys.
SHARED_CLASSES: Final = frozenset(
    {structs.AllocatedResources, structs.Resources, structs.NodeResources, structs.NodeScoreMeta}
)
# Shared maps: small scalar maps whose equal values decode to one dict (a placement's
# counts by datacenter, filter reason and exhausted dimension: the same for most allocs).
SHARED_MAPS: Final[Mapping[type, frozenset[str]]] = {
    structs.AllocMetric: frozenset(
        {"nodes_available", "class_filtered", "constraint_filtered", "class_exhausted", "dimension_exhausted"}
    ),
}
# Entries per shared class; a full cache starts over (it only has to hold a few values).
SHARED_CACHE_SIZE: Final = 512
# What every empty map decodes to. Never to be changed: see the module docstring.
EMPTY_MAP: Final[dict[Any, Any]] = {}


def _is_dataclass_type(tp: Any) -> bool:
    return isinstance(tp, type) and dataclasses.is_dataclass(tp)


def _build_plan(cls: type) -> tuple[FieldPlan, ...]:
    hints = typing.get_type_hints(cls, vars(structs))
    plan: list[FieldPlan] = []
    interned = INTERNED_FIELDS.get(cls, frozenset())
    unknown = interned - {f.name for f in dataclasses.fields(cls)}
    if unknown:
        raise TypeError(f"codec: INTERNED_FIELDS names no field {sorted(unknown)} of {cls.__name__}")
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        if (
            f.name in interned
            and tp is not str
            and not (typing.get_origin(tp) in (Mapping, dict) and typing.get_args(tp)[0] is str)
        ):
            raise TypeError(f"codec: {cls.__name__}.{f.name} is neither a str nor a map keyed by str")
        origin = typing.get_origin(tp)
        args = typing.get_args(tp)
        if origin in (typing.Union, types.UnionType):
            inner = next(a for a in args if a is not type(None))
            plan.append((f.name, _OPTIONAL_MSG, inner))
        elif _is_dataclass_type(tp):
            plan.append((f.name, _MSG, tp))
        elif origin is tuple:
            elem = args[0]
            plan.append((f.name, _REPEATED_MSG if _is_dataclass_type(elem) else _REPEATED_SCALAR, elem))
        elif origin in (Mapping, dict, typing.Mapping):
            value = args[1]
            plan.append((f.name, _MAP_MSG if _is_dataclass_type(value) else _MAP_SCALAR, value))
        else:
            plan.append((f.name, _SCALAR, None))
    return tuple(plan)


# ---------------------------------------------------------------------------------------
# Code generation

ToFn = Callable[[Any, Any], Any]
FromFn = Callable[[Any], Any]
F = TypeVar("F", ToFn, FromFn)

# Published converters; a class appears here only once it and every class it reaches are
# compiled, so readers never need the lock.
_TO: dict[type, ToFn] = {}
_FROM: dict[type, FromFn] = {}
# The generated functions' globals: they call each other by name (``_to_3``, ``_from_3``),
# so recursive records need no special care; scheduler/_records.py adds what builds them.
_NAMESPACE: dict[str, Any] = {
    "_intern": sys.intern,
    "_EMPTY_MAP": EMPTY_MAP,
    "_map_shared": lambda d: _shared_map(d),
    "_SHARED_CACHE_SIZE": SHARED_CACHE_SIZE,
}
_NUMBERS: dict[type, int] = {}
_NEXT_NUMBER = itertools.count()
_COMPILE_LOCK = threading.Lock()


def _to_source(n: int, plan: tuple[FieldPlan, ...], numbers: Mapping[type, int]) -> str:
    lines = [f"def _to_{n}(obj, msg):"]
    for name, kind, sub in plan:
        lines.append(f"    v = obj.{name}")
        if kind == _SCALAR:
            lines += ["    if v:", f"        msg.{name} = v"]
        elif kind == _OPTIONAL_MSG:
            lines += [
                "    if v is not None:",
                f"        m = msg.{name}",
                f"        _to_{numbers[sub]}(v, m)",
                "        m.SetInParent()",
            ]
        elif kind == _MSG:
            lines += ["    if v is not None:", f"        _to_{numbers[sub]}(v, msg.{name})"]
        elif kind == _REPEATED_SCALAR:
            lines += ["    if v:", f"        msg.{name}.extend(v)"]
        elif kind == _REPEATED_MSG:
            lines += [
                "    if v:",
                f"        add = msg.{name}.add",
                "        for item in v:",
                f"            _to_{numbers[sub]}(item, add())",
            ]
        elif kind == _MAP_SCALAR:
            # What MutableMapping.update does for a dict, minus its Python-level overhead.
            lines += [
                "    if v:",
                f"        m = msg.{name}",
                "        if type(v) is dict:",
                "            for k in v:",
                "                m[k] = v[k]",
                "        else:",
                "            m.update(v)",
            ]
        else:  # _MAP_MSG
            lines += [
                "    if v:",
                f"        m = msg.{name}",
                "        for k, item in v.items():",
                f"            _to_{numbers[sub]}(item, m[k])",
            ]
    lines.append("    return msg")
    return "\n".join(lines) + "\n"


def _from_source(n: int, cls: type, plan: tuple[FieldPlan, ...], numbers: Mapping[type, int]) -> str:
    lines = [f"def _from_{n}(msg):"]
    values: list[str] = []
    interned = INTERNED_FIELDS.get(cls, frozenset())
    for i, (name, kind, sub) in enumerate(plan):
        if kind == _SCALAR:
            values.append(f"_intern(msg.{name})" if name in interned else f"msg.{name}")
            continue
        if kind == _OPTIONAL_MSG:
            values.append(f"_from_{numbers[sub]}(msg.{name}) if msg.HasField({name!r}) else None")
            continue
        if kind == _MSG:
            values.append(f"_from_{numbers[sub]}(msg.{name})")
            continue
        # Containers: read once, skip the conversion when empty (the usual case).
        lines.append(f"    a{i} = msg.{name}")
        key = "_intern(k)" if name in interned else "k"
        if kind == _REPEATED_SCALAR:
            values.append(f"tuple(a{i}) if a{i} else ()")
        elif kind == _REPEATED_MSG:
            values.append(f"tuple([_from_{numbers[sub]}(x) for x in a{i}]) if a{i} else ()")
        elif kind == _MAP_SCALAR:
            # dict(a) reads a's keys through the Mapping ABC's Python-level KeysView.
            built = f"{{{key}: a{i}[k] for k in a{i}}}"
            if name in SHARED_MAPS.get(cls, frozenset()):
                built = f"_map_shared({built})"
            values.append(f"{built} if a{i} else _EMPTY_MAP")
        else:  # _MAP_MSG
            values.append(
                f"{{{key}: _from_{numbers[sub]}(x) for k, x in a{i}.items()}} if a{i} else _EMPTY_MAP"
            )
    if cls in SHARED_CLASSES:
        # Field values first, as the cache key; build the record only on a miss.
        for i, value in enumerate(values):
            lines.append(f"    v{i} = {value}")
        values = [f"v{i}" for i in range(len(values))]
        key_parts = [
            f"tuple(sorted({v}.items()))" if kind == _MAP_SCALAR else v
            for v, (_name, kind, _sub) in zip(values, plan, strict=True)
        ]
        lines += [
            f"    key = ({', '.join(key_parts)},)",
            f"    hit = _shared_{n}.get(key)",
            "    if hit is not None:",
            "        return hit",
        ]
        statements, result = construction(cls, values, _NAMESPACE, f"c{n}", "    ")
        lines += statements
        lines += [
            f"    obj = {result}",
            f"    if len(_shared_{n}) >= _SHARED_CACHE_SIZE:",
            f"        _shared_{n}.clear()",
            f"    _shared_{n}[key] = obj",
            "    return obj",
        ]
        return "\n".join(lines) + "\n"
    statements, result = construction(cls, values, _NAMESPACE, f"c{n}", "    ")
    lines += statements
    lines.append(f"    return {result}")
    return "\n".join(lines) + "\n"


def _check_shareable(
    cls: type, plan: tuple[FieldPlan, ...], plans: Mapping[type, tuple[FieldPlan, ...]]
) -> None:
    """A shared class's field values must be a hashable key whose equality is the record's:
    frozen dataclasses, scalars and tuples of them, scalar maps (keyed by their items
    sorted), no maps of records, all the way down."""
    params = getattr(cls, "__dataclass_params__", None)
    if params is None or not (params.frozen and params.eq):
        raise TypeError(f"codec: shared class {cls.__name__} is not a frozen dataclass with eq")
    for name, kind, sub in plan:
        if kind == _MAP_MSG:
            raise TypeError(f"codec: shared class {cls.__name__} has a map of records {name!r}")
        if kind in _NESTED_KINDS:
            _check_shareable(sub, plans.get(sub) or _build_plan(sub), plans)


_SHARED_MAP_CACHE: dict[tuple[tuple[Any, Any], ...], dict[Any, Any]] = {}


def _shared_map(d: dict[Any, Any]) -> dict[Any, Any]:
    """The one dict equal to ``d``, whatever its key order: protobuf does not keep a map's
    order through a round trip, so an order-sensitive key would miss now and then
    (bounded like the shared records' caches)."""
    key = tuple(sorted(d.items()))
    hit = _SHARED_MAP_CACHE.get(key)
    if hit is not None:
        return hit
    if len(_SHARED_MAP_CACHE) >= SHARED_CACHE_SIZE:
        _SHARED_MAP_CACHE.clear()
    _SHARED_MAP_CACHE[key] = d
    return d


def _compile(root: type) -> None:
    """Generate the converters of ``root`` and of every dataclass it reaches; call locked."""
    plans: dict[type, tuple[FieldPlan, ...]] = {}
    pending = [root]
    while pending:
        cls = pending.pop()
        if cls in plans or cls in _TO:
            continue
        if not _is_dataclass_type(cls):
            raise TypeError(f"codec: {cls!r} is not a dataclass")
        plans[cls] = plan = _build_plan(cls)
        pending.extend(sub for _name, kind, sub in plan if kind in _NESTED_KINDS)
    for cls, plan in plans.items():
        if cls in SHARED_CLASSES:
            _check_shareable(cls, plan, plans)
    for cls in plans:
        _NUMBERS[cls] = next(_NEXT_NUMBER)
    for cls, plan in plans.items():
        n = _NUMBERS[cls]
        if cls in SHARED_CLASSES:
            _NAMESPACE[f"_shared_{n}"] = {}
        source = _to_source(n, plan, _NUMBERS) + _from_source(n, cls, plan, _NUMBERS)
        exec(compile(source, f"<codec {cls.__qualname__}>", "exec"), _NAMESPACE)
    for cls in plans:
        n = _NUMBERS[cls]
        _FROM[cls] = _NAMESPACE[f"_from_{n}"]
        _TO[cls] = _NAMESPACE[f"_to_{n}"]


def _compiled(table: Mapping[type, F], cls: type) -> F:
    """``cls``'s converter in ``table`` (``_TO`` or ``_FROM``), compiled on its first use.
    The callers look ``table`` up without the lock first (the fast path: every class after
    its first message); ``_compile`` fills both tables at once, under the lock, so two
    threads asking for a new class compile it once."""
    with _COMPILE_LOCK:
        if cls not in table:
            _compile(cls)
    return table[cls]


# ---------------------------------------------------------------------------------------
# Public API


def to_proto(obj: Any, msg: M) -> M:
    """Fill ``msg`` (a fresh message of the matching type) from the dataclass ``obj``."""
    fn = _TO.get(type(obj)) or _compiled(_TO, type(obj))
    fn(obj, msg)
    return msg


def from_proto(msg: Message, cls: type[T]) -> T:
    """Build the dataclass ``cls`` from ``msg``; unset optional messages become ``None``."""
    fn = _FROM.get(cls) or _compiled(_FROM, cls)
    value: T = fn(msg)
    return value
