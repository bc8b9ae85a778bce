"""Jobspec files (Nomad-shaped HCL, or JSON) to a canonical ``Job``.

Theory of operation
-------------------
python-hcl2 parses HCL into a tree; ``drover.server.jobspec_eval`` evaluates it as Nomad
does (``variable`` and ``locals`` blocks, ``var.x``, operators, functions, templates) into
plain Python data shaped as python-hcl2's own serializer would give it: a block is a
*list* of bodies (``update { ... }`` -> ``{"update": [{...}]}``), a labelled block nests its
label (``group "api" { ... }`` -> ``{"group": [{"api": {...}}]}``), and an attribute is its
value (``count = 1 + 2`` -> ``{"count": 3}``). Runtime interpolation (``${node.*}``,
``${attr.*}``, ``${meta.*}``, ``${env.*}``, ``${NOMAD_*}``) stays text for the client.
Each body also carries the line of each of its keys and its block's own line
(``Located``), and a label is a ``Labelled`` wrapper, so a block whose label was left out
(``group { meta = {} }``) is not taken for a group called "meta".

What that data cannot tell us, a key written twice (the evaluator keeps the first), is
found on the parse tree first (``_check_tree``), every repeat at its own line.

The converter (``_job`` and friends) then walks the data with a ``_Body`` per block. Every
block lists the keys it knows, so a typo is an error naming the key and the place, and
each getter checks the value's type. A problem does not stop the walk: a bad value is
reported and its default read on; a block with its label left out or doubled is reported
and read as if it had one; a second ``update`` (or any block allowed once) or a second
``job`` is reported at its line and read too, for the problems inside it. Every problem of
the file (evaluation's and the converter's) is collected with its line and raised as one
``JobspecError``, in line order (``web.hcl:12: job "web" group "api": duplicate key
"count"``); a file with any problem gives no job. Only what ends the reading itself stops
it at once: a syntax error, the evaluation's budget, JSON that does not parse.

JSON with a top-level ``"job"`` key goes through the same converter (it also accepts
HCL-JSON's ``{"label": {...}}`` object for labelled blocks), and so does Nomad's API JSON
(``{"Job": ...}``, by ``jobspec_api``); both are read by ``jobspec_api.load_json``, which
gives each object its line and keeps the keys written twice in one, to be reported. Any
other JSON object is the protobuf JSON of ``drover.v1.Job``.

Parsing never validates: the caller runs ``drover.scheduler.validate.validate_job`` on the
result, so one rule set serves the API and the CLI.

Any text is an answer, never a traceback: whatever the parsers raise on hostile input
(nesting deeper than the interpreter's stack, integers of 10,000 digits, python-hcl2's
assorted internal errors, an evaluation past its budget) becomes a one-line ``JobspecError``, and no message quotes more
than a few dozen characters of the input (tests/unit/test_fuzz_jobspec.py).
"""

from __future__ import annotations

import difflib
import json
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Final, TypeVar

import hcl2
from google.protobuf import json_format
from hcl2.rules.base import AttributeRule, BlockRule
from lark.exceptions import UnexpectedEOF, UnexpectedInput, UnexpectedToken

from drover.common.duration import parse_duration
from drover.common.gotemplate import TemplateError, parse_template
from drover.scheduler.structs import (
    JOB_TYPE_SERVICE,
    Affinity,
    Artifact,
    CheckRestart,
    Constraint,
    DisconnectStrategy,
    DispatchPayload,
    Job,
    MigrateStrategy,
    NetworkResource,
    ParameterizedConfig,
    PeriodicConfig,
    Port,
    ReschedulePolicy,
    Resources,
    RestartPolicy,
    ScalingPolicy,
    Service,
    ServiceCheck,
    Spread,
    SpreadTarget,
    Task,
    TaskGroup,
    TaskLifecycle,
    Template,
    UpdateStrategy,
)
from drover.scheduler.validate import canonicalize_job, default_reschedule_policy, default_restart_policy
from drover.server.codec import from_proto
from drover.server.jobspec_api import JsonObject, is_nomad_api_json, load_json, nomad_api_to_jobspec
from drover.server.jobspec_eval import EvalError, Labelled, Located, VariableInputs, evaluate_document
from drover.v1 import structs_pb2

__all__ = ["JobspecError", "VariableInputs", "locate_problems", "parse_duration", "parse_jobspec"]

T = TypeVar("T")


# At most this many problems are listed, in at most this many characters; the rest are counted.
MAX_REPORTED_PROBLEMS: Final = 20
MAX_MESSAGE_CHARS: Final = 4000


class JobspecError(ValueError):
    """A jobspec that cannot be read: every problem found, each naming its place and its
    line. ``str()`` is one line (problems joined by "; "), so any caller can print it;
    ``errors`` has each problem alone (``web.hcl:12: job "web": unknown key "x"``), as many
    as ``str()`` shows; ``all_errors`` has every one, for a listing (``job validate``)."""

    def __init__(
        self, message: str = "", *, problems: Sequence[tuple[int, str]] = (), filename: str = ""
    ) -> None:
        self.problems: tuple[tuple[int, str], ...] = tuple(problems) or ((0, message),)
        self.filename = filename
        shown: list[str] = []
        for line, text in self.problems[:MAX_REPORTED_PROBLEMS]:
            rendered = _render_problem(filename, line, text)
            if shown and sum(len(e) + 2 for e in shown) + len(rendered) > MAX_MESSAGE_CHARS:
                break
            shown.append(rendered)
        self.errors: tuple[str, ...] = tuple(shown)
        self.all_errors: tuple[str, ...] = tuple(
            _render_problem(filename, line, text) for line, text in self.problems
        )
        more = len(self.problems) - len(shown)
        super().__init__("; ".join(self.errors) + (f"; and {more} more" if more else ""))


def _render_problem(filename: str, line: int, text: str) -> str:
    if filename and line:
        return f"{filename}:{line}: {text}"
    if filename:
        return f"{filename}: {text}"
    if line:
        return f"line {line}: {text}"
    return text


_HCL_OPTIONS: Final = hcl2.SerializationOptions(
    strip_string_quotes=True,
    explicit_blocks=False,
    with_comments=False,
    # Heredocs otherwise come back with their <<EOF markers still in the text.
    preserve_heredocs=False,
)

# Slotted dataclasses keep no class-level defaults, so defaults are read off instances.
_GROUP_DEFAULTS: Final = TaskGroup()
_TASK_DEFAULTS: Final = Task()
_RESOURCES_DEFAULTS: Final = Resources()
_CONSTRAINT_DEFAULTS: Final = Constraint()
_AFFINITY_DEFAULTS: Final = Affinity()
_SPREAD_DEFAULTS: Final = Spread()
_PERIODIC_DEFAULTS: Final = PeriodicConfig()
_PARAMETERIZED_DEFAULTS: Final = ParameterizedConfig()
_SERVICE_DEFAULTS: Final = Service()
_CHECK_DEFAULTS: Final = ServiceCheck()
_TEMPLATE_DEFAULTS: Final = Template()
_MIGRATE_DEFAULTS: Final = MigrateStrategy()

# Blocks that carry exactly one label; every other block in the jobspec carries none.
_LABELLED_BLOCKS: Final = frozenset({"job", "group", "task", "port"})


def parse_jobspec(text: str, *, filename: str = "", variables: VariableInputs | None = None) -> Job:
    """Parse HCL or JSON jobspec text into a canonical (not yet validated) ``Job``.

    ``variables`` fills the file's ``variable`` blocks (``-var``, ``-var-file``,
    ``NOMAD_VAR_*``; see ``drover.server.jobspec_eval``). Raises ``JobspecError`` listing
    every problem; when ``filename`` is given each starts with it (and its line).
    """
    try:
        try:
            return canonicalize_job(_parse(text, variables or VariableInputs()))
        except RecursionError as exc:
            raise JobspecError("nested too deeply to read") from exc
    except JobspecError as exc:
        if filename:
            raise JobspecError(problems=exc.problems, filename=filename) from exc
        raise


def _parse(text: str, variables: VariableInputs) -> Job:
    if text.lstrip().startswith("{"):
        if variables.cli or variables.files:
            # JSON has no variable blocks to fill: a -var given anyway would change nothing.
            raise JobspecError(
                "-var and -var-file fill an HCL job file's variable blocks; this job file is JSON, "
                "which has none: write the values into it"
            )
        try:
            data = load_json(text)
        except json.JSONDecodeError as exc:
            raise JobspecError(f"line {exc.lineno}, column {exc.colno}: invalid JSON: {exc.msg}") from exc
        except ValueError as exc:  # an integer past the interpreter's digit limit
            raise JobspecError(f"invalid JSON: {_parser_failure(exc)}") from exc
        if isinstance(data, dict) and "job" in data:
            return _root(data)
        if is_nomad_api_json(data):
            return _root(*nomad_api_to_jobspec(data))
        return _proto_json(text)
    data, problems = _load_hcl(text, variables)
    return _root(data, problems)


def _proto_json(text: str) -> Job:
    try:
        msg = json_format.Parse(text, structs_pb2.Job())
    except (json_format.ParseError, ValueError) as exc:
        raise JobspecError(f"invalid drover.v1.Job JSON: {_cut(_one_line(str(exc)))}") from exc
    return from_proto(msg, Job)


# ---------------------------------------------------------------------------------------
# HCL


# A heredoc's opening: ``<<EOT`` or ``<<-EOT`` ending its line.
_HEREDOC_OPEN: Final = re.compile(r"<<-?([A-Za-z_][A-Za-z0-9_]*)[ \t]*$")


def _trim_heredoc_ends(text: str) -> str:
    """Drop trailing blanks after each heredoc's closing marker. Nomad's HCL parser accepts
    ``EOT   `` as the end of ``<<EOT``; python-hcl2's grammar does not, and Nomad's own
    example files have such lines. Only the closing line changes: a heredoc's body is kept
    byte for byte."""
    lines = text.split("\n")
    marker = ""
    for i, line in enumerate(lines):
        if marker:
            if line.strip() == marker:
                lines[i] = line.rstrip()
                marker = ""
            continue
        opened = _HEREDOC_OPEN.search(line)
        if opened:
            marker = opened.group(1)
    return "\n".join(lines)


def _load_hcl(text: str, variables: VariableInputs) -> tuple[Mapping[str, Any], list[tuple[int, str]]]:
    text = _trim_heredoc_ends(text)
    try:
        tree = hcl2.parses(text)
    except UnexpectedInput as exc:
        raise JobspecError(_syntax_message(exc)) from exc
    except RecursionError:
        raise
    except Exception as exc:  # python-hcl2 has no error tree of its own: any failure is "does not parse"
        raise JobspecError(f"syntax error: {_parser_failure(exc)}") from exc
    problems: list[tuple[int, str]] = []
    _check_tree(tree.body, "", problems)
    try:
        data, errors = evaluate_document(tree.body, variables)
    except RecursionError:
        raise
    except EvalError as exc:  # the evaluation budget, which ends it
        raise JobspecError(problems=[(exc.line, exc.message)]) from exc
    except Exception as exc:  # a gap in the evaluator: an answer, never a traceback
        raise JobspecError(f"cannot evaluate the file ({type(exc).__name__})") from exc
    return data, problems + [(error.line, error.message) for error in errors]


def _syntax_message(exc: UnexpectedInput) -> str:
    where = f"line {exc.line}, column {exc.column}"
    if isinstance(exc, UnexpectedEOF) or (isinstance(exc, UnexpectedToken) and exc.token.type == "$END"):
        return f"{where}: syntax error: unexpected end of file (unclosed block or string?)"
    if isinstance(exc, UnexpectedToken):
        return f"{where}: syntax error near {json.dumps(str(exc.token).strip()[:20])}"
    return f"{where}: syntax error"


def _check_tree(body: Any, where: str, problems: list[tuple[int, str]]) -> None:
    """Catch what the serialized data hides: an attribute set twice (python-hcl2 keeps the
    last, the evaluator the first), or both set and written as a block. Each repeat goes on
    ``problems`` at its own line and the walk goes on. Labels are the converter's to
    check (``_Body.labelled``): it sees ``dynamic`` blocks' labels too.
    """
    attributes: dict[str, int] = {}
    blocks: dict[str, int] = {}
    for child in body.children:
        line = getattr(getattr(child, "_meta", None), "line", 0)
        line = line if isinstance(line, int) else 0
        if isinstance(child, AttributeRule):
            name = str(child.identifier.serialize(_HCL_OPTIONS))
            first = attributes.get(name, blocks.get(name))
            if first is not None:
                problems.append((line, f"{_place(where)}: duplicate key {_quote(name)}{_first_at(first)}"))
            attributes.setdefault(name, line)
        elif isinstance(child, BlockRule):
            labels = [str(label.serialize(_HCL_OPTIONS)) for label in child.labels]
            kind = labels[0]
            if kind in attributes:
                problems.append(
                    (line, f"{_place(where)}: duplicate key {_quote(kind)}{_first_at(attributes[kind])}")
                )
            blocks.setdefault(kind, line)
            if not where and kind == "locals":
                continue  # the evaluator reports a local defined twice, in one block or two
            # Named as the converter names it: the first label only, none if left out.
            name = " ".join([kind, *(_quote(label) for label in labels[1:2])])
            _check_tree(child.body, f"{where} {name}".strip(), problems)


def _first_at(line: int) -> str:
    return f" (the first is on line {line})" if line else ""


def _one_line(text: str) -> str:
    return " ".join(text.split())


# How much of a user's value a message quotes.
_QUOTE_CHARS: Final = 64
# Longer digit strings are not numbers we accept (int64 has 19 digits); converting one of
# 10,000 digits would raise past the interpreter's limit instead.
_MAX_DIGITS: Final = 40


def _parser_failure(exc: Exception) -> str:
    """A third-party parser's exception as a short reason."""
    text = _one_line(str(exc))
    if isinstance(exc, ValueError) and "integer string conversion" in text:
        return f"a number with more than {sys.get_int_max_str_digits()} digits"
    return _cut(text) or type(exc).__name__


def _cut(text: str) -> str:
    return text if len(text) <= 4 * _QUOTE_CHARS else text[: 4 * _QUOTE_CHARS] + "..."


def _quote(label: str) -> str:
    if len(label) > _QUOTE_CHARS:
        return json.dumps(label[:_QUOTE_CHARS], ensure_ascii=False) + "..."
    return json.dumps(label, ensure_ascii=False)


def _place(where: str) -> str:
    return where or "top level"


# ---------------------------------------------------------------------------------------
# The converter: plain data (from HCL or HCL-shaped JSON) to a Job


def _describe(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return _quote(value)
    if isinstance(value, int) and abs(value) >= 10**_MAX_DIGITS:
        return f"an integer of {value.bit_length()} bits"
    if isinstance(value, int | float):
        return str(value)
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "a block"
    return type(value).__name__


_PLAIN_KEY: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,63}(\[\d{1,9}\])?")


@dataclass(frozen=True, slots=True)
class _Body:
    """One block's attributes, with ``where`` naming it as ``job "web" group "api"``.

    A problem does not stop the reading: it goes on ``problems`` (shared by every body of
    the file) with its line, the getter returns the default, and ``_root`` raises them
    all at the end, so a file's mistakes are listed in one go.
    """

    where: str
    data: Mapping[str, Any]
    problems: list[tuple[int, str]] = field(default_factory=list)
    line: int = 0

    def line_of(self, key: str) -> int:
        lines = getattr(self.data, "lines", None)
        found = lines.get(key, 0) if isinstance(lines, dict) else 0
        return found if isinstance(found, int) and found else self.line

    def report(self, message: str, key: str = "") -> None:
        self.problems.append((self.line_of(key) if key else self.line, message))

    def check_keys(self, allowed: frozenset[str]) -> None:
        for key in list(self.data):
            if key not in allowed:
                close = (
                    difflib.get_close_matches(key, sorted(allowed), n=1) if len(key) <= _QUOTE_CHARS else []
                )
                hint = f' (did you mean "{close[0]}"?)' if close else ""
                self.report(f"{_place(self.where)}: unknown key {_quote(key)}{hint}", key)

    def get(self, key: str) -> Any:
        """The raw value, ``None`` when absent; HCL's ``null`` also means "not set"."""
        return self.data.get(key)

    def fail(self, key: str, expected: str, got: Any) -> None:
        where = key.split("[", 1)[0]
        # A map's key is the user's text (meta { "a b\n" = ... }): quoted unless a plain name.
        shown = key if _PLAIN_KEY.fullmatch(key) else _quote(key)
        self.report(f"{self.where} {shown}: expected {expected}, got {_describe(got)}".strip(), where)

    def child(self, where: str, data: Mapping[str, Any], line: int) -> _Body:
        body = _Body(where, data, self.problems, line or self.line)
        body.report_repeats()
        return body

    def report_repeats(self) -> None:
        """A JSON object's repeated keys (HCL's are found on its parse tree, ``_check_tree``)."""
        for key in self.data.repeated if isinstance(self.data, JsonObject) else ():
            self.report(f"{_place(self.where)}: duplicate key {_quote(key)}", key)

    def scalar(self, key: str, convert: Callable[[Any], T | None], expected: str, default: T) -> T:
        raw = self.get(key)
        if raw is None:
            return default
        value = convert(raw)
        if value is None:
            self.fail(key, expected, raw)
            return default
        return value

    def get_int(self, key: str, default: int) -> int:
        return self.scalar(key, _as_int, "a number", default)

    def get_str(self, key: str, default: str = "") -> str:
        return self.scalar(key, _as_str, "a string", default)

    def get_bool(self, key: str, default: bool) -> bool:
        return self.scalar(key, _as_bool, "true or false", default)

    def get_duration(self, key: str, default: int) -> int:
        return self.scalar(key, _as_duration, 'a duration like "30s" or "1h30m"', default)

    def str_list(self, key: str) -> tuple[str, ...]:
        raw = self.get(key)
        if raw is None:
            return ()
        if not isinstance(raw, list):
            self.fail(key, "a list of strings", raw)
            return ()
        items = [_as_str(item) for item in raw]
        for i, item in enumerate(items):
            if item is None:
                self.fail(f"{key}[{i}]", "a string", raw[i])
        return tuple(item for item in items if item is not None)

    def str_map(self, key: str) -> dict[str, str]:
        """``meta { k = "v" }`` or ``meta = { k = "v" }``; values become strings, like Nomad's."""
        found: dict[str, str] = {}
        for body in self.single_blocks(key):
            found.update({k: body.get_str(k) for k in body.data if body.get(k) is not None})
        return found

    def blocks(self, key: str) -> list[_Body]:
        """``key``'s blocks, each with its own line. A label on one of these (``update
        "x" { }``) shows as a key of its body: unknown, or not a value."""
        raw = self.get(key)
        if raw is None:
            return []
        items = raw if isinstance(raw, list) else [raw]
        bodies = []
        for i, item in enumerate(items):
            if not isinstance(item, dict):
                self.fail(key, "a block", item)
                continue
            name = key if len(items) == 1 else f"{key}[{i}]"
            line = _block_line(item) or self.line_of(key)
            bodies.append(self.child(f"{self.where} {name}".strip(), item, line))
        return bodies

    def single_blocks(self, key: str) -> list[_Body]:
        """``key``'s blocks where one is allowed: each after the first is reported at its
        own line, and all are returned, so the caller reads them all for their problems."""
        bodies = self.blocks(key)
        for body in bodies[1:]:
            self.problems.append(
                (
                    body.line,
                    f'{_place(self.where)}: only one "{key}" block is allowed{_first_at(bodies[0].line)}',
                )
            )
        return bodies

    def block(self, key: str) -> _Body | None:
        """The one ``key`` block; a second is reported (``single_blocks``), not read."""
        bodies = self.single_blocks(key)
        return bodies[0] if bodies else None

    def one(self, key: str, convert: Callable[[_Body], T]) -> T | None:
        """The one ``key`` block, converted; every repeat is reported and converted too,
        so the problems inside it are found as well."""
        results = [convert(body) for body in self.single_blocks(key)]
        return results[0] if results else None

    def labelled(self, key: str) -> list[tuple[str, _Body]]:
        """``group "a" {...}`` blocks: HCL gives ``[{"a": {...}}]``, HCL-JSON ``{"a": {...}}``.

        A block of HCL with its label left out (``group { ... }``) or with more than one
        (``task "a" "b" { ... }``) is reported and still read (as ``""`` or its first
        label), so the problems inside it are found too; the file gives no job anyway.
        """
        raw = self.get(key)
        if raw is None:
            return []
        items = raw if isinstance(raw, list) else [raw]
        found: list[tuple[str, _Body]] = []
        wrong = f'{_place(self.where)}: {key} block must be written as {key} "NAME" {{ ... }}'
        for item in items:
            if not isinstance(item, dict):
                self.fail(key, f'a block like {key} "NAME" {{ ... }}', item)
                continue
            if isinstance(item, Located) and not isinstance(item, Labelled):  # HCL, no label
                line = _block_line(item) or self.line_of(key)
                self.problems.append((line, f"{wrong} (its name is missing)"))
                found.append(("", self.child(f"{self.where} {key}".strip(), item, line)))
                continue
            for label, body in item.items():
                line = item.lines.get(label, 0) if isinstance(item, Located) else _block_line(body)
                if isinstance(body, Labelled):
                    self.problems.append(
                        (line or self.line_of(key), f"{wrong} (it has the labels {_labels(item)})")
                    )
                    body = _unwrap_labels(body)
                if not isinstance(body, dict):
                    self.report(wrong, key)
                    continue
                found.append((label, self.child(f"{self.where} {key} {_quote(label)}".strip(), body, line)))
        return found


def _block_line(item: Any) -> int:
    """The line a block (HCL) or object (JSON) opens on, 0 where unknown."""
    return item.line if isinstance(item, Located | JsonObject) else 0


def _labels(wrapper: Any) -> str:
    """A block's labels as written: ``"a" "b"``."""
    labels: list[str] = []
    item: Any = wrapper
    while isinstance(item, Labelled) and len(labels) < 4:
        label = next(iter(item))
        labels.append(_quote(label))
        item = item[label]
    return " ".join(labels) + (" ..." if isinstance(item, Labelled) else "")


def _unwrap_labels(item: Labelled) -> Mapping[str, Any]:
    """The body inside a block's labels."""
    body: Mapping[str, Any] = item
    while isinstance(body, Labelled):
        body = body[next(iter(body))]
    return body


def _as_int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and len(value) <= _MAX_DIGITS and re.fullmatch(r"[+-]?\d+", value.strip()):
        return int(value)  # HCL converts "3" to 3 where a number is wanted
    return None


def _as_str(value: Any) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    return None


def _as_bool(value: Any) -> bool | None:
    if isinstance(value, bool):
        return value
    if value in ("true", "false"):
        return bool(value == "true")
    return None


def _as_duration(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value * 1_000_000_000  # bare numbers are seconds
    if isinstance(value, str):
        try:
            return parse_duration(value)
        except ValueError:
            return None
    return None


# A record's field as a jobspec key, where the two differ.
_FIELD_KEYS: Final = {
    "groups": "group",
    "tasks": "task",
    "constraints": "constraint",
    "affinities": "affinity",
    "spreads": "spread",
    "services": "service",
    "checks": "check",
    "reserved_ports": "port",
    "dynamic_ports": "port",
    "cpu_mhz": "cpu",
    "ephemeral_disk_mb": "ephemeral_disk",
    "spec": "cron",
    "specs": "crons",
    "config_json": "config",
}
_FIELD_PATH_STEP: Final = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)(?:\[(\d+)\])?")


def locate_problems(errors: Sequence[str], text: str, *, filename: str = "") -> list[str]:
    """Validation problems (``job.groups[0].count: must be >= 0``, from
    ``drover.scheduler.validate``) with the line their field was written on, where the
    file says it: ``web.hcl:4: job.groups[0].count: must be >= 0``. A field the file left
    out (a default) gets its block's line, and in JSON (HCL-shaped or Nomad's API JSON)
    every field gets the line its object opens on; a problem with no place in the file
    (or in drover's protobuf JSON) is kept as it is. Reads ``text`` again, so a caller
    that has only the ``Job`` can use it."""
    try:
        data = _data_for_lines(text)
    except Exception:  # the file parsed once already; if not now, keep the problems as they are
        return list(errors)
    if data is None:
        return list(errors)
    located = []
    for error in errors:
        path, sep, _ = error.partition(": ")
        line = _line_of_field(data, path) if sep else 0
        located.append(_render_problem(filename, line, error) if line else error)
    return located


def _data_for_lines(text: str) -> Mapping[str, Any] | None:
    """The jobspec-shaped data of ``text``, with its lines; ``None`` for protobuf JSON."""
    if not text.lstrip().startswith("{"):
        tree = hcl2.parses(_trim_heredoc_ends(text))
        data, _ = evaluate_document(tree.body, VariableInputs())
        return data
    loaded = load_json(text)
    if isinstance(loaded, dict) and "job" in loaded:
        return loaded
    if is_nomad_api_json(loaded):
        return nomad_api_to_jobspec(loaded)[0]
    return None


def _line_of_field(root: Mapping[str, Any], path: str) -> int:
    steps = path.split(".")
    if not steps or steps[0] != "job":
        return 0
    jobs = _labelled_bodies(root.get("job"))
    if not jobs:
        return 0
    body, line = jobs[0]
    for step in steps[1:]:
        match = _FIELD_PATH_STEP.fullmatch(step)
        if match is None:
            break
        name, index = match.group(1), int(match.group(2) or 0)
        candidates = [name, _FIELD_KEYS.get(name, name), re.sub(r"_(ns|mb|mhz)$", "", name)]
        key = next((c for c in candidates if c in body), None)
        if key is None:
            break
        line = body.lines.get(key, line) if isinstance(body, Located) else line
        value = body[key]
        if key in _LABELLED_BLOCKS:
            labelled = _labelled_bodies(value)
            if len(labelled) <= index:
                break
            body, line = labelled[index]
            continue
        blocks = [item for item in (value if isinstance(value, list) else [value]) if isinstance(item, dict)]
        if not blocks:
            break
        body = blocks[min(index, len(blocks) - 1)]
        line = _block_line(body) or line
    return line


def _labelled_bodies(raw: Any) -> list[tuple[Mapping[str, Any], int]]:
    """Each body of labelled blocks (HCL's ``[{"a": {...}}]``, JSON's ``{"a": {...}}``)
    with its line."""
    found: list[tuple[Mapping[str, Any], int]] = []
    for item in raw if isinstance(raw, list) else [raw]:
        if not isinstance(item, dict) or (isinstance(item, Located) and not isinstance(item, Labelled)):
            continue
        for label, body in item.items():
            if isinstance(body, dict):
                line = item.lines.get(label, 0) if isinstance(item, Located) else _block_line(body)
                found.append((body, line))
    return found


def _root(data: Mapping[str, Any], problems: Sequence[tuple[int, str]] = ()) -> Job:
    """The job, or every problem of the file (those found before, in ``problems``) as one
    ``JobspecError``, in line order. A second ``job`` block is reported and read too, for
    the problems inside it; a file with any problem gives no job."""
    root = _Body("", data, list(problems), _block_line(data))
    root.report_repeats()
    root.check_keys(frozenset({"job"}))
    jobs = [_job(job_id, body) for job_id, body in root.labelled("job")]
    lines = _block_lines(data.get("job"))
    if len(jobs) != 1:
        where = lines[1] if len(lines) > 1 else 0
        first = _first_at(lines[0]) if len(lines) > 1 else ""
        root.problems.append((where, f"expected exactly one job block, found {len(jobs)}{first}"))
    if root.problems:
        raise JobspecError(problems=_in_line_order(root.problems))
    return jobs[0]


def _block_lines(raw: Any) -> list[int]:
    """The line of each block in ``raw`` (a list of HCL block bodies), 0 where unknown."""
    items = raw if isinstance(raw, list) else [raw] if raw is not None else []
    return [_block_line(item) if isinstance(item, dict) else 0 for item in items]


def _in_line_order(problems: Sequence[tuple[int, str]]) -> list[tuple[int, str]]:
    """Sorted by line (stable: one line's problems stay in the order found), each once: a
    value read twice (a group's ``count`` is its scaling's ``min`` too) is one problem."""
    unique = list(dict.fromkeys(problems))
    return sorted(unique, key=lambda problem: problem[0])


_JOB_KEYS: Final = frozenset(
    {"name", "type", "priority", "datacenters", "namespace", "meta", "constraint", "affinity", "spread"}
    | {"update", "periodic", "parameterized", "group", "node_pool", "migrate", "reschedule"}
)

# Nomad jobspec keys drover does not support, by the block they are written in, each with
# why. They are refused by name ("is not supported by drover"), apart from a typo's
# "unknown key", so a Nomad file says what it needs instead of running without it. (A
# service's Consul keys, connect and canary_tags among them, stay "unknown key"s of
# ``_SERVICE_KEYS``, as before.)
_NO_NETWORK_NAMESPACES: Final = "no network namespaces here: tasks share the host's network"
_NOT_SUPPORTED: Final[Mapping[str, Mapping[str, str]]] = {
    "job": {
        "vault": "no Vault here",
        "consul": "no Consul here",
        "multiregion": "one region only",
        "region": "one region only",
        "all_at_once": "placements are always made group by group",
        "ui": "no web UI",
        "vault_token": "no Vault here",
        "consul_token": "no Consul here",
    },
    "group": {
        "vault": "no Vault here",
        "consul": "no Consul here",
        "volume": "no host or CSI volumes here",
        "prevent_reschedule_on_lost": "use disconnect { replace = false }",
    },
    "task": {
        "vault": "no Vault here",
        "consul": "no Consul here",
        "identity": "no workload identities here",
        "csi_plugin": "no CSI here",
        "volume_mount": "no host or CSI volumes here",
        "scaling": "no vertical autoscaler here",
        "kind": "no Consul Connect here",
    },
    "resources": {
        "device": "no device plugins here",
        "numa": "no NUMA-aware placement here",
        "network": "write network { ... } in the group (Nomad's old place for it)",
        "iops": "removed from Nomad too",
    },
    "network": {
        "dns": _NO_NETWORK_NAMESPACES,
        "hostname": f'it needs mode = "bridge"; {_NO_NETWORK_NAMESPACES}',
    },
    "port": {
        "host_network": "no host networks here: ports bind the node's address",
    },
    "template": {
        "change_script": 'use change_mode = "restart", "signal" or "noop"',
        "uid": "rendered files belong to the agent's user",
        "gid": "rendered files belong to the agent's user",
        "error_on_missing_key": "a missing key is an error already",
        "vault_grace": "no Vault here",
        "once": "templates follow their services",
    },
    "artifact": {
        "options": "only local paths and file:// URLs: nothing remote is fetched",
        "headers": "only local paths and file:// URLs: nothing remote is fetched",
        "chown": "copied files belong to the agent's user",
    },
}
# Task drivers of Nomad's that drover has not, and the raw_exec config keys that are
# other drivers' (Docker's mostly): refused when the file is read, not when a node tries.
_NOT_SUPPORTED_DRIVERS: Final[Mapping[str, str]] = {
    name: "no container or VM drivers here: raw_exec runs a command on the node"
    for name in ("docker", "podman", "containerd-driver", "exec", "exec2", "java", "qemu", "lxc")
}
_RAW_EXEC_FOREIGN_CONFIG: Final = frozenset(
    {"image", "ports", "volumes", "mount", "mounts", "network_mode", "entrypoint", "auth", "labels"}
    | {"privileged", "cap_add", "cap_drop", "devices", "dns_servers", "extra_hosts", "hostname"}
    | {"image_pull_timeout", "force_pull", "logging", "work_dir", "pid_mode", "ipc_mode", "shm_size"}
    | {"cgroup_v2_cpuset", "oom_score_adj", "cpu_hard_limit", "security_opt", "sysctl", "ulimit"}
)
# Network modes drover runs ("" is "host").
_NETWORK_MODES: Final = frozenset({"", "host"})


def _refuse_unsupported_driver(task: _Body) -> None:
    driver = task.get("driver")
    if isinstance(driver, str) and driver in _NOT_SUPPORTED_DRIVERS:
        task.report(
            f"{task.where} driver: {_quote(driver)} is not supported by drover ({_NOT_SUPPORTED_DRIVERS[driver]})",
            "driver",
        )
        return
    config = task.get("config")
    configs = config if isinstance(config, list) else [config]
    for item in configs:
        if driver == "raw_exec" and isinstance(item, dict):
            for key in sorted(set(item) & _RAW_EXEC_FOREIGN_CONFIG):
                task.report(
                    f"{task.where} config: {_quote(key)} is not supported by drover "
                    "(another driver's option: raw_exec takes command and args)",
                    "config",
                )


def _check_keys(body: _Body, block: str, allowed: frozenset[str]) -> None:
    """``body.check_keys``, with the keys of ``_NOT_SUPPORTED[block]`` refused by name."""
    unsupported = _NOT_SUPPORTED.get(block, {})
    for key in body.data:
        reason = unsupported.get(key)
        if reason is not None and key not in allowed:
            body.report(f"{_place(body.where)}: {_quote(key)} is not supported by drover ({reason})", key)
    body.check_keys(allowed | frozenset(unsupported))


def _job(job_id: str, body: _Body) -> Job:
    for name, _ in body.labelled("task"):
        # Nomad's HCL1 parser wrapped such a task in a group of its name; its HCL2 parser,
        # which drover follows, refuses it. Say how to fix the file instead of "unknown key".
        body.report(
            f"{body.where}: task {_quote(name)} must be inside a group: wrap it in "
            f"group {_quote(name)} {{ task {_quote(name)} {{ ... }} }}",
            "task",
        )
    _check_keys(body, "job", _JOB_KEYS | {"task"})
    job_type = body.get_str("type", JOB_TYPE_SERVICE)
    update = body.one("update", lambda b: _update(b, UpdateStrategy()))
    reschedule = body.one(
        "reschedule", lambda b: _reschedule(b, default_reschedule_policy(job_type) or ReschedulePolicy())
    )
    migrate = body.one("migrate", _migrate)
    return Job(
        id=job_id,
        name=body.get_str("name"),
        namespace=body.get_str("namespace"),
        type=job_type,
        priority=body.get_int("priority", 0),
        datacenters=body.str_list("datacenters"),
        constraints=tuple(_constraint(b) for b in body.blocks("constraint")),
        affinities=tuple(_affinity(b) for b in body.blocks("affinity")),
        spreads=tuple(_spread(b) for b in body.blocks("spread")),
        update=update,
        periodic=body.one("periodic", _periodic),
        parameterized=body.one("parameterized", _parameterized),
        meta=body.str_map("meta"),
        node_pool=body.get_str("node_pool"),
        migrate=migrate,
        reschedule=reschedule,
        groups=tuple(
            _group(name, b, job_type, update, job_reschedule=reschedule, job_migrate=migrate)
            for name, b in body.labelled("group")
        ),
    )


def _ephemeral_disk_mb(body: _Body) -> int:
    body.check_keys(frozenset({"size"}))
    return body.get_int("size", _GROUP_DEFAULTS.ephemeral_disk_mb)


_GROUP_KEYS: Final = frozenset(
    {"count", "constraint", "affinity", "spread", "update", "reschedule", "restart", "disconnect"}
    | {"ephemeral_disk", "network", "meta", "task", "service", "migrate", "scaling"}
    | {"max_client_disconnect", "stop_after_client_disconnect", "max_run_duration"}
)


def _group(
    name: str,
    body: _Body,
    job_type: str,
    job_update: UpdateStrategy | None,
    *,
    job_reschedule: ReschedulePolicy | None = None,
    job_migrate: MigrateStrategy | None = None,
) -> TaskGroup:
    """Policies a group sets partly are filled from the job's (update, reschedule, migrate)
    or the type's defaults."""
    _check_keys(body, "group", _GROUP_KEYS)
    group_restart = body.one("restart", lambda b: _restart(b, default_restart_policy(job_type)))
    task_restart_base = group_restart or default_restart_policy(job_type)
    disk_mb = body.one("ephemeral_disk", _ephemeral_disk_mb)
    return TaskGroup(
        name=name,
        count=body.get_int("count", 1),
        tasks=tuple(_task(task_name, b, task_restart_base) for task_name, b in body.labelled("task")),
        constraints=tuple(_constraint(b) for b in body.blocks("constraint")),
        affinities=tuple(_affinity(b) for b in body.blocks("affinity")),
        spreads=tuple(_spread(b) for b in body.blocks("spread")),
        network=body.one("network", _network),
        update=body.one("update", lambda b: _update(b, job_update or UpdateStrategy())),
        reschedule=body.one(
            "reschedule",
            lambda b: _reschedule(
                b, job_reschedule or default_reschedule_policy(job_type) or ReschedulePolicy()
            ),
        ),
        restart=group_restart,
        disconnect=_group_disconnect(body),
        migrate=body.one("migrate", lambda b: _migrate(b, job_migrate or _MIGRATE_DEFAULTS)),
        scaling=body.one("scaling", lambda b: _scaling(b, body.get_int("count", 1))),
        ephemeral_disk_mb=_GROUP_DEFAULTS.ephemeral_disk_mb if disk_mb is None else disk_mb,
        meta=body.str_map("meta"),
        services=tuple(_service(b) for b in body.blocks("service")),
        max_run_duration_ns=body.get_duration("max_run_duration", 0),
    )


_TASK_KEYS: Final = frozenset(
    {"driver", "config", "env", "meta", "resources", "constraint", "kill_timeout", "leader", "service"}
    | {"lifecycle", "kill_signal", "shutdown_delay", "restart", "user"}
    | {"template", "artifact", "dispatch_payload"}
)


def _task(name: str, body: _Body, group_restart: RestartPolicy) -> Task:
    """A task's ``restart`` block is laid over its group's policy, as Nomad merges them."""
    _check_keys(body, "task", _TASK_KEYS)
    _refuse_unsupported_driver(body)
    config = body.block("config")
    return Task(
        name=name,
        driver=body.get_str("driver"),
        # Sorted so an unchanged config is byte-identical and does not look like an update.
        config_json=json.dumps(dict(config.data) if config else {}, sort_keys=True, separators=(",", ":")),
        env=body.str_map("env"),
        meta=body.str_map("meta"),
        resources=body.one("resources", _resources),
        constraints=tuple(_constraint(b) for b in body.blocks("constraint")),
        kill_timeout_ns=body.get_duration("kill_timeout", _TASK_DEFAULTS.kill_timeout_ns),
        leader=body.get_bool("leader", False),
        services=tuple(_service(b) for b in body.blocks("service")),
        lifecycle=body.one("lifecycle", _lifecycle),
        kill_signal=body.get_str("kill_signal"),
        shutdown_delay_ns=body.get_duration("shutdown_delay", 0),
        restart=body.one("restart", lambda b: _restart(b, group_restart)),
        user=body.get_str("user"),
        templates=tuple(_template(b) for b in body.blocks("template")),
        artifacts=tuple(_artifact(b) for b in body.blocks("artifact")),
        dispatch_payload=body.one("dispatch_payload", _dispatch_payload),
    )


_TEMPLATE_KEYS: Final = frozenset(
    {"data", "source", "destination", "change_mode", "change_signal", "env", "perms"}
    | {"splay", "wait", "left_delimiter", "right_delimiter"}
)


def _template(body: _Body) -> Template:
    """Inline ``data`` is parsed here, so a function drover has not (Consul's ``key``,
    Vault's ``secret``) is refused with the file; a ``source`` file lives on the node and is
    parsed where it is rendered."""
    _check_keys(body, "template", _TEMPLATE_KEYS)
    left, right = body.get_str("left_delimiter"), body.get_str("right_delimiter")
    data = body.get("data")
    if isinstance(data, str):
        try:
            parse_template(data, left, right)
        except TemplateError as exc:
            body.report(f"{body.where} data: {exc}", "data")
    wait = body.block("wait")
    if wait is not None:
        wait.check_keys(frozenset({"min", "max"}))
    return Template(
        data=body.get_str("data"),
        source=body.get_str("source"),
        destination=body.get_str("destination"),
        change_mode=body.get_str("change_mode", _TEMPLATE_DEFAULTS.change_mode),
        change_signal=body.get_str("change_signal"),
        env=body.get_bool("env", False),
        perms=body.get_str("perms"),
        splay_ns=body.get_duration("splay", 0),
        wait_min_ns=wait.get_duration("min", 0) if wait is not None else 0,
        wait_max_ns=wait.get_duration("max", 0) if wait is not None else 0,
        left_delimiter=left,
        right_delimiter=right,
    )


def _artifact(body: _Body) -> Artifact:
    _check_keys(body, "artifact", frozenset({"source", "destination", "mode"}))
    return Artifact(
        source=body.get_str("source"),
        destination=body.get_str("destination"),
        mode=body.get_str("mode"),
    )


def _dispatch_payload(body: _Body) -> DispatchPayload:
    body.check_keys(frozenset({"file"}))
    return DispatchPayload(file=body.get_str("file"))


def _lifecycle(body: _Body) -> TaskLifecycle:
    body.check_keys(frozenset({"hook", "sidecar"}))
    return TaskLifecycle(hook=body.get_str("hook"), sidecar=body.get_bool("sidecar", False))


def _resources(body: _Body) -> Resources:
    """``cores`` replaces ``cpu`` (the scheduler counts whole cores); both is refused, as Nomad."""
    _check_keys(body, "resources", frozenset({"cpu", "memory", "disk", "memory_max", "cores"}))
    cores = body.get_int("cores", 0)
    if cores and body.get("cpu") is not None:
        body.report(f"{body.where}: set cpu or cores, not both", "cores")
    return Resources(
        cpu_mhz=0 if cores else body.get_int("cpu", _RESOURCES_DEFAULTS.cpu_mhz),
        memory_mb=body.get_int("memory", _RESOURCES_DEFAULTS.memory_mb),
        disk_mb=body.get_int("disk", _RESOURCES_DEFAULTS.disk_mb),
        memory_max_mb=body.get_int("memory_max", 0),
        cores=cores,
    )


def _network(body: _Body) -> NetworkResource:
    """``port "x" { static = N }`` reserves N; a port without ``static`` is picked by the scheduler."""
    _check_keys(body, "network", frozenset({"mbits", "port", "mode"}))
    mode = body.get_str("mode")
    if mode not in _NETWORK_MODES:
        body.report(
            f'{body.where} mode: {_quote(mode)} is not supported by drover ({_NO_NETWORK_NAMESPACES}; use "host")',
            "mode",
        )
    reserved: list[Port] = []
    dynamic: list[Port] = []
    for label, port in body.labelled("port"):
        _check_keys(port, "port", frozenset({"static", "to"}))
        to = port.get_int("to", 0)
        if port.get("static") is not None:
            reserved.append(Port(label=label, value=port.get_int("static", 0), to=to))
        else:
            dynamic.append(Port(label=label, value=0, to=to))
    return NetworkResource(
        reserved_ports=tuple(reserved),
        dynamic_ports=tuple(dynamic),
        mbits=body.get_int("mbits", 0),
        mode=mode if mode in _NETWORK_MODES else "",
    )


def _constraint(body: _Body) -> Constraint:
    body.check_keys(frozenset({"attribute", "operator", "value"}))
    return Constraint(
        attribute=body.get_str("attribute"),
        operator=body.get_str("operator", _CONSTRAINT_DEFAULTS.operator),
        value=body.get_str("value"),
    )


def _affinity(body: _Body) -> Affinity:
    body.check_keys(frozenset({"attribute", "operator", "value", "weight"}))
    return Affinity(
        attribute=body.get_str("attribute"),
        operator=body.get_str("operator", _AFFINITY_DEFAULTS.operator),
        value=body.get_str("value"),
        weight=body.get_int("weight", _AFFINITY_DEFAULTS.weight),
    )


def _spread(body: _Body) -> Spread:
    """``target "VALUE" { percent = N }`` blocks say what share of the group each value gets."""
    body.check_keys(frozenset({"attribute", "weight", "target"}))
    targets = []
    for value, target in body.labelled("target"):
        target.check_keys(frozenset({"percent"}))
        targets.append(SpreadTarget(value=value, percent=target.get_int("percent", 0)))
    return Spread(
        attribute=body.get_str("attribute"),
        weight=body.get_int("weight", _SPREAD_DEFAULTS.weight),
        targets=tuple(targets),
    )


def _migrate(body: _Body, base: MigrateStrategy = _MIGRATE_DEFAULTS) -> MigrateStrategy:
    body.check_keys(frozenset({"max_parallel", "health_check", "min_healthy_time", "healthy_deadline"}))
    return MigrateStrategy(
        max_parallel=body.get_int("max_parallel", base.max_parallel),
        health_check=body.get_str("health_check", base.health_check),
        min_healthy_time_ns=body.get_duration("min_healthy_time", base.min_healthy_time_ns),
        healthy_deadline_ns=body.get_duration("healthy_deadline", base.healthy_deadline_ns),
    )


def _scaling(body: _Body, count: int) -> ScalingPolicy:
    """``min`` defaults to the group's count, as Nomad's; ``policy`` is kept as JSON for an
    autoscaler (drover has none)."""
    body.check_keys(frozenset({"min", "max", "enabled", "policy"}))
    policy = body.block("policy")
    return ScalingPolicy(
        min=body.get_int("min", count),
        max=body.get_int("max", 0),
        enabled=body.get_bool("enabled", True),
        policy_json=json.dumps(dict(policy.data), sort_keys=True, separators=(",", ":")) if policy else "",
    )


_UPDATE_KEYS: Final = frozenset(
    {"max_parallel", "stagger", "min_healthy_time", "healthy_deadline", "auto_revert"}
    | {"canary", "auto_promote", "progress_deadline", "health_check"}
)


def _update(body: _Body, base: UpdateStrategy) -> UpdateStrategy:
    body.check_keys(_UPDATE_KEYS)
    return replace(
        base,
        max_parallel=body.get_int("max_parallel", base.max_parallel),
        stagger_ns=body.get_duration("stagger", base.stagger_ns),
        min_healthy_time_ns=body.get_duration("min_healthy_time", base.min_healthy_time_ns),
        healthy_deadline_ns=body.get_duration("healthy_deadline", base.healthy_deadline_ns),
        auto_revert=body.get_bool("auto_revert", base.auto_revert),
        canary=body.get_int("canary", base.canary),
        auto_promote=body.get_bool("auto_promote", base.auto_promote),
        progress_deadline_ns=body.get_duration("progress_deadline", base.progress_deadline_ns),
        health_check=body.get_str("health_check", base.health_check),
    )


# Only the client's own checks exist in drover: Consul's keys (connect, meta, canary_tags,
# on_update, ...) are refused by name instead of being read and ignored. check_restart is
# the client's (client_agent/checkwatch.py): in a service it applies to each of its checks,
# and a check's own block overrides it key by key (Nomad's merge).
_SERVICE_KEYS: Final = frozenset(
    {"name", "provider", "port", "tags", "check", "address_mode", "check_restart"}
)
_CHECK_KEYS: Final = frozenset(
    {"name", "type", "port", "path", "method", "protocol", "command", "args", "task", "interval", "timeout"}
    | {"check_restart"}
)
_CHECK_RESTART_KEYS: Final = frozenset({"limit", "grace", "ignore_warnings"})
_PROVIDER_NOMAD: Final = "nomad"


def _service(body: _Body) -> Service:
    _check_keys(body, "service", _SERVICE_KEYS)
    provider = body.get_str("provider", _SERVICE_DEFAULTS.provider)
    if provider != _PROVIDER_NOMAD:
        consul = ': "consul" is not supported by drover (no Consul here)' if provider == "consul" else ""
        body.report(
            f'{body.where} provider: only "nomad" is supported (the client runs the checks), got {_quote(provider)}'
            + consul,
            "provider",
        )
    restart_block = body.block("check_restart")
    service_restart = _check_restart(restart_block, None) if restart_block is not None else None
    return Service(
        name=body.get_str("name"),
        provider=provider,
        port=body.get_str("port"),
        tags=body.str_list("tags"),
        checks=tuple(_check(b, service_restart) for b in body.blocks("check")),
        address_mode=body.get_str("address_mode", _SERVICE_DEFAULTS.address_mode),
    )


def _check_restart(body: _Body, base: CheckRestart | None) -> CheckRestart:
    body.check_keys(_CHECK_RESTART_KEYS)
    base = base or CheckRestart()
    return CheckRestart(
        limit=body.get_int("limit", base.limit),
        grace_ns=body.get_duration("grace", base.grace_ns),
        ignore_warnings=body.get_bool("ignore_warnings", base.ignore_warnings),
    )


def _check(body: _Body, service_restart: CheckRestart | None) -> ServiceCheck:
    body.check_keys(_CHECK_KEYS)
    d = _CHECK_DEFAULTS
    restart_block = body.block("check_restart")
    own = _check_restart(restart_block, service_restart) if restart_block is not None else None
    return ServiceCheck(
        name=body.get_str("name"),
        type=body.get_str("type", d.type),
        port=body.get_str("port"),
        path=body.get_str("path", d.path),
        method=body.get_str("method", d.method),
        protocol=body.get_str("protocol", d.protocol),
        command=body.get_str("command"),
        args=body.str_list("args"),
        task=body.get_str("task"),
        interval_ns=body.get_duration("interval", d.interval_ns),
        timeout_ns=body.get_duration("timeout", d.timeout_ns),
        check_restart=own or service_restart,
    )


def _reschedule(body: _Body, base: ReschedulePolicy) -> ReschedulePolicy:
    body.check_keys(frozenset({"attempts", "interval", "delay", "delay_function", "max_delay", "unlimited"}))
    return replace(
        base,
        attempts=body.get_int("attempts", base.attempts),
        interval_ns=body.get_duration("interval", base.interval_ns),
        delay_ns=body.get_duration("delay", base.delay_ns),
        delay_function=body.get_str("delay_function", base.delay_function),
        max_delay_ns=body.get_duration("max_delay", base.max_delay_ns),
        unlimited=body.get_bool("unlimited", base.unlimited),
    )


def _restart(body: _Body, base: RestartPolicy) -> RestartPolicy:
    body.check_keys(frozenset({"attempts", "interval", "delay", "mode"}))
    return replace(
        base,
        attempts=body.get_int("attempts", base.attempts),
        interval_ns=body.get_duration("interval", base.interval_ns),
        delay_ns=body.get_duration("delay", base.delay_ns),
        mode=body.get_str("mode", base.mode),
    )


def _group_disconnect(body: _Body) -> DisconnectStrategy | None:
    """The ``disconnect`` block, or Nomad's older names for two of its keys:
    ``max_client_disconnect`` (lost_after) and ``stop_after_client_disconnect``
    (stop_on_client_after). Old and new together are refused: which one meant what?"""
    block = body.one("disconnect", _disconnect)
    old = [
        key for key in ("max_client_disconnect", "stop_after_client_disconnect") if body.get(key) is not None
    ]
    if block is not None:
        for key in old:
            body.report(
                f"{body.where}: {_quote(key)} is the old name of a disconnect key: set one, not both", key
            )
        return block
    if not old:
        return None
    base = DisconnectStrategy()
    return replace(
        base,
        lost_after_ns=body.get_duration("max_client_disconnect", base.lost_after_ns),
        stop_on_client_after_ns=body.get_duration(
            "stop_after_client_disconnect", base.stop_on_client_after_ns
        ),
    )


def _disconnect(body: _Body) -> DisconnectStrategy:
    body.check_keys(frozenset({"lost_after", "replace", "reconcile", "stop_on_client_after"}))
    base = DisconnectStrategy()
    return DisconnectStrategy(
        lost_after_ns=body.get_duration("lost_after", base.lost_after_ns),
        replace=body.get_bool("replace", base.replace),
        reconcile=body.get_str("reconcile", base.reconcile),
        stop_on_client_after_ns=body.get_duration("stop_on_client_after", base.stop_on_client_after_ns),
    )


def _periodic(body: _Body) -> PeriodicConfig:
    """``cron`` (one expression) or Nomad 1.6's ``crons`` (several: the earliest next wins)."""
    body.check_keys(frozenset({"cron", "crons", "time_zone", "prohibit_overlap", "enabled"}))
    if body.get("cron") is not None and body.get("crons") is not None:
        body.report(f"{body.where}: set cron or crons, not both", "crons")
    return PeriodicConfig(
        enabled=body.get_bool("enabled", True),
        spec=body.get_str("cron"),
        specs=body.str_list("crons"),
        time_zone=body.get_str("time_zone", _PERIODIC_DEFAULTS.time_zone),
        prohibit_overlap=body.get_bool("prohibit_overlap", False),
    )


def _parameterized(body: _Body) -> ParameterizedConfig:
    body.check_keys(frozenset({"payload", "meta_required", "meta_optional"}))
    return ParameterizedConfig(
        payload=body.get_str("payload", _PARAMETERIZED_DEFAULTS.payload),
        meta_required=body.str_list("meta_required"),
        meta_optional=body.str_list("meta_optional"),
    )
