"""Conversion between the domain dataclasses (scheduler/structs.py) and protobuf messages.

The two sides share field names, so one reflective converter serves every record. The
per-class plan (which fields are nested messages, repeated, maps, optional) is computed once
per class and cached: conversion sits on the write path and in snapshots.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from google.protobuf.message import Message

from scheduler import structs

T = TypeVar("T")
M = TypeVar("M", bound=Message)

_SCALAR, _OPTIONAL_MSG, _MSG, _REPEATED_SCALAR, _REPEATED_MSG, _MAP_SCALAR, _MAP_MSG = range(7)

FieldPlan = tuple[str, int, Any]  # (name, kind, dataclass type for nested kinds)


def _is_dataclass_type(tp: Any) -> bool:
    return isinstance(tp, type) and dataclasses.is_dataclass(tp)


_PLANS: dict[type, tuple[FieldPlan, ...]] = {}


def _plan(cls: type) -> tuple[FieldPlan, ...]:
    cached = _PLANS.get(cls)
    if cached is None:
        cached = _PLANS[cls] = _build_plan(cls)
    return cached


def _build_plan(cls: type) -> tuple[FieldPlan, ...]:
    hints = typing.get_type_hints(cls, vars(structs))
    plan: list[FieldPlan] = []
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
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


def to_proto(obj: Any, msg: M) -> M:
    """Fill ``msg`` (a fresh message of the matching type) from the dataclass ``obj``."""
    for name, kind, _sub in _plan(type(obj)):
        value = getattr(obj, name)
        if kind == _SCALAR:
            if value:
                setattr(msg, name, value)
        elif kind in (_OPTIONAL_MSG, _MSG):
            if value is not None:
                to_proto(value, getattr(msg, name))
                if kind == _OPTIONAL_MSG:
                    getattr(msg, name).SetInParent()
        elif kind == _REPEATED_SCALAR:
            if value:
                getattr(msg, name).extend(value)
        elif kind == _REPEATED_MSG:
            if value:
                target = getattr(msg, name)
                for item in value:
                    to_proto(item, target.add())
        elif kind == _MAP_SCALAR:
            if value:
                getattr(msg, name).update(value)
        else:  # _MAP_MSG
            if value:
                target = getattr(msg, name)
                for key, item in value.items():
                    to_proto(item, target[key])
    return msg


def from_proto(msg: Message, cls: type[T]) -> T:
    """Build the dataclass ``cls`` from ``msg``; unset optional messages become ``None``."""
    kwargs: dict[str, Any] = {}
    for name, kind, sub in _plan(cls):
        if kind == _SCALAR:
            kwargs[name] = getattr(msg, name)
        elif kind == _OPTIONAL_MSG:
            kwargs[name] = from_proto(getattr(msg, name), sub) if msg.HasField(name) else None
        elif kind == _MSG:
            kwargs[name] = from_proto(getattr(msg, name), sub)
        elif kind == _REPEATED_SCALAR:
            kwargs[name] = tuple(getattr(msg, name))
        elif kind == _REPEATED_MSG:
            kwargs[name] = tuple(from_proto(item, sub) for item in getattr(msg, name))
        elif kind == _MAP_SCALAR:
            kwargs[name] = dict(getattr(msg, name))
        else:
            kwargs[name] = {key: from_proto(item, sub) for key, item in getattr(msg, name).items()}
    return cls(**kwargs)


def encoder(msg_cls: type[M]) -> Callable[[Any], M]:
    """A function turning a dataclass into a new ``msg_cls`` message."""

    def encode(obj: Any) -> M:
        return to_proto(obj, msg_cls())

    return encode
