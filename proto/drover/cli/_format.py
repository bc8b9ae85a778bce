"""Output formatting for the ``drover`` CLI: tables, key = value lists,
JSON, times and durations, and the ``job plan`` bucket table.

Nothing here talks to a server; everything takes plain values or protobuf messages.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Final, cast

from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.json_format import MessageToDict
from google.protobuf.message import Message

from drover.cli._errors import CLIError
from drover.common.duration import parse_duration
from drover.v1 import structs_pb2

__all__ = [
    "ALLOC_HEADERS",
    "ALLOC_LEAD_HEADERS",
    "SHORT_ID_LEN",
    "alloc_lead_cells",
    "alloc_rows",
    "fmt_duration",
    "fmt_time",
    "format_kv",
    "format_table",
    "jsonable",
    "message_json",
    "oldest_allocs_first",
    "parse_duration_ns",
    "plan_header",
    "plan_table",
    "print_allocs_table",
    "print_json",
    "print_kv",
    "print_table",
    "short_id",
]

SHORT_ID_LEN: Final = 8


def short_id(value: str, verbose: bool) -> str:
    return value if verbose else value[:SHORT_ID_LEN]


# ---------------------------------------------------------------------------------------
# Tables, key = value lists, JSON


def format_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Left-aligned columns two spaces apart, no trailing spaces."""
    widths = [max(len(str(row[i])) for row in [headers, *rows]) for i in range(len(headers))]
    lines = [
        "  ".join(str(cell).ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in [headers, *rows]
    ]
    return "\n".join(lines)


def print_table(headers: Sequence[str], rows: Sequence[Sequence[str]], *, empty: str = "") -> None:
    if not rows and empty:
        print(empty)
        return
    print(format_table(headers, rows))


def format_kv(pairs: Sequence[tuple[str, str]]) -> str:
    """``key = value`` lines, the keys padded to one width, no trailing spaces."""
    width = max(len(k) for k, _ in pairs)
    return "\n".join(f"{key.ljust(width)} = {value}".rstrip() for key, value in pairs)


def print_kv(pairs: Sequence[tuple[str, str]]) -> None:
    print(format_kv(pairs))


def jsonable(value: object) -> object:
    """``value`` as JSON-ready data: a protobuf message as :func:`message_json` has it,
    mappings and sequences element by element, anything else as it is."""
    if isinstance(value, Message):
        return message_json(value)
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, Sequence) and not isinstance(value, str | bytes):
        return [jsonable(v) for v in value]
    return value


def print_json(value: object) -> None:
    print(json.dumps(jsonable(value), indent=2))


def message_json(message: Message) -> dict[str, object]:
    """A message as ``-json`` prints it, so that a script can read any field without first
    asking whether it is there: every field under its proto name, in the proto's order,
    zero values included (``0``, ``""``, ``false``, ``[]``, ``{}``), an unset sub-message as
    ``null``, and 64-bit integers as JSON numbers.

    ProtoJSON writes 64-bit integers as strings (JavaScript's numbers lose precision past
    2**53); a script in Python, jq or Go reads them exactly as numbers, and a nanosecond
    time is past 2**53. Which fields are 64-bit comes from the message's descriptor, never
    from what a string looks like: a job ID of "123" stays a string.
    """
    data = MessageToDict(message, preserving_proto_field_name=True, always_print_fields_with_no_presence=True)
    return _complete(data, cast(Descriptor, message.DESCRIPTOR))


_INT64_TYPES: Final = frozenset(
    {
        FieldDescriptor.TYPE_INT64,
        FieldDescriptor.TYPE_UINT64,
        FieldDescriptor.TYPE_SINT64,
        FieldDescriptor.TYPE_FIXED64,
        FieldDescriptor.TYPE_SFIXED64,
    }
)


def _complete(data: dict[str, object], descriptor: Descriptor) -> dict[str, object]:
    """``descriptor``'s ProtoJSON ``data`` in field order, with 64-bit integer strings
    back to ints and unset sub-messages as None, through every nested message, list and
    map value."""
    out: dict[str, object] = {}
    for field in descriptor.fields:
        if field.name not in data:
            # Only fields with presence are missing: a sub-message (null says "unset"), or
            # a oneof member that is not the chosen one (left out, as ProtoJSON does).
            if field.containing_oneof is None:
                out[field.name] = None
            continue
        value = data[field.name]
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            entry = field.message_type.fields_by_name["value"]
            if isinstance(value, dict):
                value = {key: _field_value(item, entry) for key, item in value.items()}
        elif _is_repeated(field):
            if isinstance(value, list):
                value = [_field_value(item, field) for item in value]
        else:
            value = _field_value(value, field)
        out[field.name] = value
    # Anything the descriptor does not name (none today) is kept, after the fields.
    out.update((key, value) for key, value in data.items() if key not in out)
    return out


def _is_repeated(field: FieldDescriptor) -> bool:
    # protobuf 7 has only ``is_repeated``; older releases had ``label`` first.
    repeated: bool | None = getattr(field, "is_repeated", None)
    if repeated is None:
        repeated = getattr(field, "label", None) == FieldDescriptor.LABEL_REPEATED
    return repeated


def _field_value(value: object, field: FieldDescriptor) -> object:
    if field.type in _INT64_TYPES and isinstance(value, str):
        return int(value)
    message_type = field.message_type
    # Well-known types (Timestamp, Struct, ...) have JSON forms of their own: left as they are.
    if (
        message_type is not None
        and isinstance(value, dict)
        and not message_type.full_name.startswith("google.protobuf.")
    ):
        return _complete(value, message_type)
    return value


def alloc_rows(allocs: Iterable[structs_pb2.Allocation], verbose: bool) -> list[list[str]]:
    """Rows for :data:`ALLOC_HEADERS`, oldest first."""
    return [
        [*alloc_lead_cells(a, verbose), fmt_time(a.create_time_ns), fmt_time(a.modify_time_ns)]
        for a in oldest_allocs_first(allocs)
    ]


def alloc_lead_cells(a: structs_pb2.Allocation, verbose: bool) -> list[str]:
    """The columns every alloc table opens with (:data:`ALLOC_LEAD_HEADERS`), so ``job
    status``, ``alloc list`` and ``deployment status`` name an alloc the same way."""
    return [
        short_id(a.id, verbose),
        short_id(a.node_id, verbose),
        a.task_group,
        str(a.job_version),
        a.desired_status,
        a.client_status,
    ]


def oldest_allocs_first(allocs: Iterable[structs_pb2.Allocation]) -> list[structs_pb2.Allocation]:
    """Every alloc table's row order: by creation, then name, then ID for a stable tie."""
    return sorted(allocs, key=lambda a: (a.create_index, a.name, a.id))


ALLOC_LEAD_HEADERS: Final = ("ID", "Node ID", "Task Group", "Version", "Desired", "Status")
ALLOC_HEADERS: Final = (*ALLOC_LEAD_HEADERS, "Created", "Modified")


def print_allocs_table(allocs: Iterable[structs_pb2.Allocation], verbose: bool) -> None:
    print_table(ALLOC_HEADERS, alloc_rows(allocs, verbose), empty="No allocations placed")


# ---------------------------------------------------------------------------------------
# Times and durations


def fmt_time(ns: int) -> str:
    if not ns:
        return ""
    return datetime.fromtimestamp(ns / 1e9, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_duration_ns(text: str) -> int:
    """A Go duration ("1h30m", "90s", "-1s") in nanoseconds (drover.common.duration's rules)."""
    try:
        return parse_duration(text)
    except ValueError:
        raise CLIError(f'invalid duration "{text}" (examples: 30s, 10m, 1h30m)') from None


def fmt_duration(ns: int) -> str:
    if ns < 0:
        return "force"
    if ns == 0:
        return "none"
    seconds = ns // 1_000_000_000
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return "".join(f"{v}{u}" for v, u in ((hours, "h"), (minutes, "m"), (secs, "s")) if v) or f"{ns}ns"


# ---------------------------------------------------------------------------------------
# job plan

# The scheduler's bucket names -> a column. Some schedulers name the update buckets
# "update_destructive"/"update_inplace", others "destructive"/"inplace": one column each.
PLAN_COLUMNS: Final[tuple[tuple[str, tuple[str, ...]], ...]] = (
    ("Place", ("place",)),
    ("Update (destructive)", ("destructive", "update_destructive")),
    ("Update (in-place)", ("inplace", "update_inplace")),
    ("Stop", ("stop",)),
    ("Migrate", ("migrate",)),
    ("Lost", ("lost",)),
    ("Ignore", ("ignore",)),
)
# Headers for other buckets the scheduler is known to report; any bucket not named here
# gets its own column headed by its raw name. Extra columns go in bucket-name order.
_EXTRA_BUCKET_HEADERS: Final = {
    "disconnecting": "Disconnecting",
    "reconnecting": "Reconnecting",
    "reschedule_now": "Reschedule (now)",
    "reschedule_later": "Reschedule (later)",
}
_KNOWN_BUCKETS: Final = frozenset(key for _, keys in PLAN_COLUMNS for key in keys)


def plan_header(job_id: str, *, new: bool, changed: bool, current_version: int) -> str:
    if new:
        what = "new"
    elif changed:
        what = f"changes: version {current_version} -> {current_version + 1}"
    else:
        what = "no changes"
    return f'Job: "{job_id}" ({what})'


def plan_table(
    groups: Mapping[str, Mapping[str, int]], group_order: Sequence[str] = ()
) -> tuple[list[str], list[list[str]]]:
    """Headers and rows of the per-group bucket counts.

    The fixed columns (:data:`PLAN_COLUMNS`) are always there; any other bucket that came
    back gets a column after them, sorted by bucket name. Groups come in ``group_order``
    (the job file's order), then any others (say, a group the new version removes) by name.
    """
    extra = sorted({key for buckets in groups.values() for key in buckets} - _KNOWN_BUCKETS)
    headers = [
        "Group",
        *(title for title, _ in PLAN_COLUMNS),
        *(_EXTRA_BUCKET_HEADERS.get(key, key) for key in extra),
    ]
    ordered = [g for g in dict.fromkeys(group_order) if g in groups]
    ordered += sorted(g for g in groups if g not in ordered)
    rows: list[list[str]] = []
    for group in ordered:
        buckets = groups[group]
        rows.append(
            [
                group,
                *(str(sum(buckets.get(key, 0) for key in keys)) for _, keys in PLAN_COLUMNS),
                *(str(buckets.get(key, 0)) for key in extra),
            ]
        )
    return headers, rows
