"""What changed between two versions of a job (``drover job history -p``): every field path
whose value differs, with the old and the new value.

Paths name things the way an operator does: groups and tasks by name, not by position
(``groups[web].tasks[server].resources.memory_mb``), so reordering groups is no change and
the path still reads right after one is added. A task's ``config_json`` is opened up
(``groups[web].tasks[server].config.run_for``): a driver setting changing is the most
common edit, and the whole JSON string on both sides would hide which one. Bookkeeping the
servers set (version, stability, indexes, status, submit time) is not spec: never a
difference, as the servers' own "did the spec change" check ignores them.

Pure: protobuf messages in, values out.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from google.protobuf.message import Message

from drover.scheduler.structs import JOB_BOOKKEEPING_FIELDS
from drover.v1 import structs_pb2

__all__ = ["FieldChange", "diff_jobs", "fmt_value", "spec_fields"]

# Shown when a path exists on one side only (a group added, a block removed).
ABSENT: Final = object()


@dataclass(frozen=True, slots=True)
class FieldChange:
    path: str
    old: object
    new: object


def spec_fields(job: structs_pb2.Job) -> dict[str, object]:
    """Every spec field of ``job`` as ``path -> value`` (scalars, and lists of scalars as
    one value), in the message's field order; unset sub-messages contribute nothing."""
    out: dict[str, object] = {}
    _flatten(job, "", out, skip=JOB_BOOKKEEPING_FIELDS)
    return out


def diff_jobs(old: structs_pb2.Job, new: structs_pb2.Job) -> list[FieldChange]:
    """The paths whose value differs from ``old`` to ``new``: the new version's order first,
    then paths only the old version had. :data:`ABSENT` stands for a missing side."""
    before, after = spec_fields(old), spec_fields(new)
    changes = [
        FieldChange(path, before.get(path, ABSENT), value)
        for path, value in after.items()
        if before.get(path, ABSENT) != value
    ]
    changes += [FieldChange(path, value, ABSENT) for path, value in before.items() if path not in after]
    return changes


def fmt_value(value: object) -> str:
    """A value as it reads in a diff: strings quoted, lists and maps as JSON."""
    if value is ABSENT:
        return "(none)"
    if isinstance(value, bytes):
        return f"<{len(value)} bytes>"
    return json.dumps(value, sort_keys=True)


def _flatten(msg: Message, prefix: str, out: dict[str, object], skip: frozenset[str] = frozenset()) -> None:
    for field in msg.DESCRIPTOR.fields:
        if field.name in skip:
            continue
        value = getattr(msg, field.name)
        path = f"{prefix}.{field.name}" if prefix else field.name
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            _flatten_map(value, path, out)
        elif field.is_repeated:
            if field.message_type is None:
                out[path] = list(value)
            else:
                for position, item in enumerate(value):
                    _flatten(item, f"{path}[{_item_key(item, position)}]", out)
        elif field.message_type is not None:
            if msg.HasField(field.name):
                _flatten(value, path, out)
        elif field.name == "config_json":
            _flatten_config(value, f"{prefix}.config" if prefix else "config", out)
        else:
            out[path] = value


def _flatten_map(value: Mapping[str, object], path: str, out: dict[str, object]) -> None:
    for key in sorted(value):
        item = value[key]
        if isinstance(item, Message):
            _flatten(item, f"{path}[{key}]", out)
        else:
            out[f"{path}[{key}]"] = item


def _item_key(item: Message, position: int) -> str:
    """A named item (group, task, service, check) by its name; others by position."""
    name = getattr(item, "name", "")
    return name if isinstance(name, str) and name else str(position)


def _flatten_config(text: str, path: str, out: dict[str, object]) -> None:
    if not text:
        return
    try:
        config = json.loads(text)
    except ValueError:
        out[path] = text
        return
    if not isinstance(config, dict):
        out[path] = config
        return
    for key in sorted(config):
        out[f"{path}.{key}"] = config[key]
