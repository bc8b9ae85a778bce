"""Generated code that builds the frozen records of scheduler/structs.py on the hot write path.

Two users: ``replacer`` here (``dataclasses.replace`` specialised per class and changed
fields; canonicalizing and the FSM use it) and server/codec.py's generated converters.

``dataclasses.replace(obj, **changes)`` walks ``fields(obj)`` and builds a keyword dict on
every call, which costs several times the constructor it ends in; and a frozen
dataclass's generated ``__init__`` sets each field through ``object.__setattr__``. For a
class where that ``__init__`` is all construction does (frozen, slotted, dataclass-made
``__init__``, no ``__post_init__``, every field an ``__init__`` argument), ``construction``
emits code that allocates the instance and stores each field through its slot descriptor:
the same stores ``__init__`` makes, so the same value. Any other class is built by calling
it, as ``dataclasses.replace`` does.
"""

from __future__ import annotations

import dataclasses
import inspect
import types
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

T = TypeVar("T")


def slot_setters(cls: type) -> dict[str, Any] | None:
    """Each field's slot ``__set__``, if storing through them is exactly what ``cls(...)`` does."""
    if not (isinstance(cls, type) and dataclasses.is_dataclass(cls)):
        return None
    params = getattr(cls, "__dataclass_params__", None)
    if params is None or not params.frozen or not params.init:
        return None
    if hasattr(cls, "__post_init__") or cls.__new__ is not object.__new__:
        return None
    init = cls.__dict__.get("__init__")
    # dataclasses exec()s the __init__ it generates; one written in the class body has a file.
    if not isinstance(init, types.FunctionType) or init.__code__.co_filename != "<string>":
        return None
    fields = dataclasses.fields(cls)
    if any(not f.init for f in fields):
        return None
    if [p for p in inspect.signature(cls).parameters] != [f.name for f in fields]:
        return None  # an InitVar, or a signature dataclasses did not make
    setters: dict[str, Any] = {}
    for f in fields:
        descriptor = inspect.getattr_static(cls, f.name, None)
        if not isinstance(descriptor, types.MemberDescriptorType):
            return None
        setters[f.name] = descriptor.__set__
    return setters


def positional_init(cls: type) -> bool:
    """Whether ``cls(*field values in field order)`` is how its ``__init__`` takes them."""
    params = list(inspect.signature(cls).parameters.values())
    return [p.name for p in params] == [f.name for f in dataclasses.fields(cls)] and all(
        p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD for p in params
    )


def construction(
    cls: type, values: Sequence[str], namespace: dict[str, Any], tag: str, indent: str
) -> tuple[list[str], str]:
    """Code building a ``cls`` from ``values`` (one expression per field, in field order).

    Returns the statements to run first (each starting with ``indent``) and the expression
    for the new instance. Registers what the code refers to in ``namespace`` under names
    starting with ``_{tag}``. The expressions may be evaluated in any order.
    """
    names = [f.name for f in dataclasses.fields(cls)]
    if len(values) != len(names):
        raise TypeError(f"{cls.__name__}: {len(values)} values for {len(names)} fields")
    namespace[f"_{tag}_cls"] = cls
    setters = slot_setters(cls)
    if setters is not None:
        namespace["_object_new"] = object.__new__
        lines = [f"{indent}_new = _object_new(_{tag}_cls)"]
        for i, (name, value) in enumerate(zip(names, values, strict=True)):
            namespace[f"_{tag}_set{i}"] = setters[name]
            lines.append(f"{indent}_{tag}_set{i}(_new, {value})")
        return lines, "_new"
    if positional_init(cls):
        args = [f"({value})" for value in values]
    else:
        args = [f"{name}=({value})" for name, value in zip(names, values, strict=True)]
    return [], f"_{tag}_cls({', '.join(args)})"


def replacer(cls: type[T], *names: str) -> Callable[..., T]:
    """``f(obj, *values)`` (or with keywords) == ``dataclasses.replace(obj, **dict(zip(names, values)))``.

    Made for exactly ``cls``: an instance of another class goes to ``dataclasses.replace``.
    """
    if not (isinstance(cls, type) and dataclasses.is_dataclass(cls)):
        raise TypeError(f"replacer: {cls!r} is not a dataclass")
    fields = dataclasses.fields(cls)
    field_names = [f.name for f in fields]
    unknown = [n for n in names if n not in field_names]
    if unknown or len(set(names)) != len(names):
        raise TypeError(f"replacer: {names} are not distinct fields of {cls.__name__} (unknown: {unknown})")
    if any(not f.init for f in fields):
        raise TypeError(f"replacer: {cls.__name__} has init=False fields")
    if any(name.startswith("_") for name in field_names):
        raise TypeError(f"replacer: {cls.__name__} has a field named like a generated-code name")
    namespace: dict[str, Any] = {"_replace": dataclasses.replace}
    values = [name if name in names else f"_obj.{name}" for name in field_names]
    statements, result = construction(cls, values, namespace, "r", "    ")
    changes = ", ".join(f"{name}={name}" for name in names)
    source = "\n".join(
        [
            f"def replace_{cls.__name__}({', '.join(('_obj', *names))}):",
            "    if _obj.__class__ is not _r_cls:",
            f"        return _replace(_obj, {changes})",
            *statements,
            f"    return {result}",
        ]
    )
    exec(compile(source + "\n", f"<replacer {cls.__qualname__}>", "exec"), namespace)
    fn: Callable[..., T] = namespace[f"replace_{cls.__name__}"]
    return fn
