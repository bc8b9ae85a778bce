"""HCL2 as Nomad evaluates a job file: variables, locals, functions and expressions.

Why a walker of python-hcl2's parse tree
----------------------------------------
python-hcl2 gives literal data and leaves every expression as its ``${...}`` source text.
Re-parsing that text would be a second grammar to keep in step with the first, so this
module evaluates the parse tree itself (the rule classes in ``hcl2.rules``), which also
gives every attribute its line for error messages. The output has the shape
``hcl2.serialize`` gives with ``jobspec._HCL_OPTIONS`` (a block is a list of bodies, a
label nests its body), so the converter in ``jobspec`` reads it unchanged; every body is
a ``Located`` dict that also knows the line of each key.

What is evaluated, and what is left alone
-----------------------------------------
- ``variable "x" { type, default, description, sensitive, validation { condition,
  error_message } }`` blocks, filled in Nomad's order: the default, then ``NOMAD_VAR_x``
  from the environment, then each ``-var-file`` in turn, then each ``-var`` (later wins).
- ``locals { ... }`` blocks (any number), evaluated on first use; a cycle is an error.
- ``dynamic "KIND" { for_each, labels, iterator, content { ... } }`` blocks.
- ``var.x`` and ``local.x``; operators, conditionals, ``for`` expressions, splats,
  templates and heredocs with ``${...}``, and the functions in ``FUNCTIONS``. A function
  not in that table is refused by name.
- Runtime interpolation stays text for the client: a reference rooted at ``node``,
  ``attr``, ``meta``, ``env`` or a ``NOMAD_*`` name comes out as ``${node.unique.name}``,
  inside a template or alone. Only a template may hold one: ``upper(node.class)`` is an
  error, since its value is known only on the node.
- Template directives (``%{ if }``, ``%{ for }``, ``~`` strip markers), in strings and in
  heredocs (whose body python-hcl2 leaves as one token: it is re-read as the quoted
  template it means, ``text_template``).

Hostile input: nothing here calls Python's ``eval``; every node visited costs one step
of a fixed budget (``MAX_STEPS``), every string and collection built is bounded
(``MAX_STRING_CHARS``, ``MAX_ITEMS``, ``MAX_VALUE_SIZE``), numbers are bounded
(``MAX_NUMBER_BITS``), and regular expressions are RE2's (linear time). Values share
parts (``[local.a, local.a]``), so a value's size is its size as a tree, computed once per
list or map from its parts' sizes: sixty doublings are refused at the twentieth instead of
being walked (``_Evaluator.size``). A function whose result can dwarf its arguments
(``replace``, ``regex_replace``, ``join``, ``format``'s width) checks before it builds. Nesting deeper than the interpreter's stack
raises ``RecursionError``, which ``jobspec.parse_jobspec`` turns into its one-line error.

``file(path)`` reads relative to the job file's directory and refuses a path that
leaves it (``..``, an absolute path, a symlink out): a job file reviewed on its own
should not be able to pull in, say, a key from the operator's home directory. Without a
directory (a job given as text, as the API does) ``file`` is refused.
"""

from __future__ import annotations

import base64
import json
import math
import os
import re
import urllib.parse
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, TypeVar

import hcl2
import re2
from hcl2.rules.base import AttributeRule, BlockRule, BodyRule
from hcl2.rules.containers import ObjectElemKeyExpressionRule, ObjectElemKeyRule, ObjectRule, TupleRule
from hcl2.rules.directives import TemplateForRule, TemplateIfRule
from hcl2.rules.expressions import BinaryOpRule, ConditionalRule, ExprTermRule, UnaryOpRule
from hcl2.rules.for_expressions import ForObjectExprRule, ForTupleExprRule
from hcl2.rules.functions import FunctionCallRule
from hcl2.rules.indexing import (
    AttrSplatExprTermRule,
    FullSplatExprTermRule,
    GetAttrExprTermRule,
    GetAttrRule,
    IndexExprTermRule,
    ShortIndexRule,
    SqbIndexRule,
)
from hcl2.rules.literal_rules import FloatLitRule, IdentifierRule, IntLitRule, KeywordRule, LiteralValueRule
from hcl2.rules.strings import (
    HeredocTemplateRule,
    HeredocTrimTemplateRule,
    InterpolationRule,
    StringPartRule,
    StringRule,
    TemplateStringRule,
)
from hcl2.utils import SerializationOptions, process_escape_sequences

__all__ = [
    "FUNCTIONS",
    "MAX_ITEMS",
    "MAX_STEPS",
    "MAX_STRING_CHARS",
    "EvalError",
    "Labelled",
    "Located",
    "VariableInputs",
    "evaluate_document",
]

MAX_STEPS: Final = 1_000_000
MAX_STRING_CHARS: Final = 1 << 20
MAX_ITEMS: Final = 10_000
MAX_NUMBER_BITS: Final = 1024
# A value's size: a string counts its characters, a list or map 1 plus its items' sizes,
# counted as a tree (a list holding the same big list twice counts it twice, which is what
# printing it would cost). Bounded per value and over everything a file's attributes hold.
MAX_VALUE_SIZE: Final = 4 << 20
MAX_DOCUMENT_SIZE: Final = 16 << 20
MAX_FORMAT_WIDTH: Final = 4096
MAX_STRING_TOTAL: Final = 64 << 20
# What ``file()`` reads at most.
MAX_FILE_BYTES: Final = 1 << 20

_LABEL_OPTIONS: Final = SerializationOptions(strip_string_quotes=True, with_comments=False)

# Roots of runtime interpolation, resolved on the client (besides any NOMAD_* name).
_RUNTIME_ROOTS: Final = frozenset({"node", "attr", "meta", "env"})
_VARIABLE_KEYS: Final = frozenset({"type", "default", "description", "sensitive", "validation"})


class EvalError(ValueError):
    """One problem in a job file's expressions, at ``line`` (0 when unknown)."""

    def __init__(self, message: str, line: int = 0, *, echo: bool = False) -> None:
        super().__init__(message)
        self.message = message
        self.line = line
        # An echo of a problem already reported (a use of a local that failed): not listed again.
        self.echo = echo


class Located(dict[str, Any]):
    """A block's body as plain data, with the line each key was written on and, for a
    block, the line of the block itself (0 for an object value: ``meta = { ... }``)."""

    __slots__ = ("line", "lines")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.lines: dict[str, int] = {}
        self.line = 0


class Labelled(Located):
    """A block's label around its body (``group "api" { ... }`` -> ``{"api": {...}}``).

    A type of its own because the data alone cannot say it: ``group { api = {} }`` (a
    label left out) gives the same dict. The converter tells a missing or extra label
    from the wrapper, so it can report one and still read what is inside."""

    __slots__ = ()


@dataclass(frozen=True, slots=True)
class VariableInputs:
    """What the command line and the environment give a job file's variables.

    ``cli`` is every ``-var NAME=VALUE`` in order; ``files`` every ``-var-file`` as
    (name, text), in order; ``env`` the ``NOMAD_VAR_`` variables with the prefix
    dropped; ``file_root`` the job file's directory for ``file()`` ("" refuses it).
    """

    cli: tuple[tuple[str, str], ...] = ()
    files: tuple[tuple[str, str], ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    file_root: str = ""

    @staticmethod
    def from_args(
        var_args: Sequence[str] = (),
        var_files: Sequence[str] = (),
        environ: Mapping[str, str] | None = None,
        file_root: str = "",
    ) -> VariableInputs:
        """Read ``-var`` strings and ``-var-file`` paths; raises ``EvalError`` for a
        ``-var`` without ``=`` and ``OSError`` for a file that cannot be read."""
        cli = []
        for item in var_args:
            name, sep, value = item.partition("=")
            if not sep or not name.strip():
                raise EvalError(f"-var {_quote(item)}: expected NAME=VALUE")
            cli.append((name.strip(), value))
        files = []
        for path in var_files:
            with open(path, encoding="utf-8") as fh:
                files.append((path, fh.read(MAX_FILE_BYTES + 1)))
        env = tuple(
            (key.removeprefix("NOMAD_VAR_"), value)
            for key, value in sorted((environ or {}).items())
            if key.startswith("NOMAD_VAR_") and len(key) > len("NOMAD_VAR_")
        )
        return VariableInputs(cli=tuple(cli), files=tuple(files), env=env, file_root=file_root)


@dataclass(frozen=True, slots=True)
class _Runtime:
    """A reference known only on the client, kept as its source text."""

    text: str

    def __str__(self) -> str:
        return "${" + self.text + "}"


def _quote(text: str) -> str:
    return json.dumps(text if len(text) <= 64 else text[:64] + "...", ensure_ascii=False)


_NAME: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_-]{0,63}")


def _one_line(text: str) -> str:
    """A user's text (an error_message) as one line of at most 200 characters."""
    flat = " ".join(text.split())
    return flat if len(flat) <= 200 else flat[:200] + "..."


def _line(node: Any, default: int = 0) -> int:
    line = getattr(getattr(node, "_meta", None), "line", None)
    return line if isinstance(line, int) else default


# ---------------------------------------------------------------------------------------
# Types: the ``type`` of a variable block


@dataclass(frozen=True, slots=True)
class _Type:
    kind: str  # string number bool any list set map tuple object
    element: _Type | None = None
    fields: tuple[tuple[str, _Type], ...] = ()

    def __str__(self) -> str:
        if self.kind in ("list", "set", "map"):
            return f"{self.kind}({self.element})"
        if self.kind == "tuple":
            return "tuple([" + ", ".join(str(t) for _, t in self.fields) + "])"
        if self.kind == "object":
            return "object({" + ", ".join(f"{k} = {t}" for k, t in self.fields) + "})"
        return self.kind


_ANY: Final = _Type("any")


def _type_of(node: Any) -> _Type:
    while isinstance(node, ExprTermRule):
        node = node.expression
    if isinstance(node, IdentifierRule):
        name = str(node.serialize(_LABEL_OPTIONS))
        if name in ("string", "number", "bool", "any"):
            return _Type(name)
        raise EvalError(f"unknown type {_quote(name)}", _line(node))
    if isinstance(node, FunctionCallRule):
        name = str(node.identifiers[0].serialize(_LABEL_OPTIONS))
        args = node.arguments.arguments if node.arguments else []
        if name in ("list", "set", "map") and len(args) == 1:
            return _Type(name, element=_type_of(args[0]))
        if name == "tuple" and len(args) == 1:
            inner = _unwrap(args[0])
            if isinstance(inner, TupleRule):
                return _Type(
                    "tuple", fields=tuple((str(i), _type_of(e)) for i, e in enumerate(inner.elements))
                )
        if name == "object" and len(args) == 1:
            inner = _unwrap(args[0])
            if isinstance(inner, ObjectRule):
                fields = []
                for elem in inner.elements:
                    key = elem.key
                    if not isinstance(key, ObjectElemKeyRule):
                        raise EvalError("object type keys must be names", _line(elem))
                    fields.append((str(key.value.serialize(_LABEL_OPTIONS)), _type_of(elem.expression)))
                return _Type("object", fields=tuple(fields))
        raise EvalError(f"unknown type {_quote(name + '(...)')}", _line(node))
    raise EvalError(
        "a type must be string, number, bool, any, list(T), set(T), map(T), object or tuple", _line(node)
    )


def _unwrap(node: Any) -> Any:
    while isinstance(node, ExprTermRule):
        node = node.expression
    return node


def _type_name(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "list"
    if isinstance(value, dict):
        return "map"
    return "a value known only on the client"


def _convert(value: Any, want: _Type, where: str) -> Any:
    """``value`` as ``want``, with HCL's safe conversions (``"3"`` to a number, ``true``
    to ``"true"``); raises ``EvalError`` naming ``where`` on a mismatch."""
    if want.kind == "any" or value is None:
        return value
    if isinstance(value, _Runtime):
        raise EvalError(f"{where}: {value} is known only on the client")
    mismatch = EvalError(f"{where}: expected {want}, got {_type_name(value)}")
    if want.kind == "string":
        if isinstance(value, str | bool | int | float):
            return _to_string(value)
        raise mismatch
    if want.kind == "number":
        number = _to_number_or_none(value)
        if number is None:
            raise mismatch
        return number
    if want.kind == "bool":
        if isinstance(value, bool):
            return value
        if value in ("true", "false"):
            return value == "true"
        raise mismatch
    if want.kind in ("list", "set"):
        if not isinstance(value, list):
            raise mismatch
        element = want.element or _ANY
        items = [_convert(item, element, f"{where}[{i}]") for i, item in enumerate(value)]
        return _distinct(items) if want.kind == "set" else items
    if want.kind == "map":
        if not isinstance(value, dict):
            raise mismatch
        element = want.element or _ANY
        return {k: _convert(v, element, f"{where}[{_quote(k)}]") for k, v in value.items()}
    if want.kind == "tuple":
        if not isinstance(value, list) or len(value) != len(want.fields):
            raise mismatch
        return [
            _convert(v, t, f"{where}[{i}]")
            for i, (v, (_, t)) in enumerate(zip(value, want.fields, strict=True))
        ]
    if want.kind == "object":
        if not isinstance(value, dict):
            raise mismatch
        missing = [k for k, _ in want.fields if k not in value]
        if missing:
            raise EvalError(f"{where}: expected {want}, missing attribute {_quote(missing[0])}")
        return {k: _convert(value[k], t, f"{where}.{k}") for k, t in want.fields}
    raise mismatch


# ---------------------------------------------------------------------------------------
# Values


def _to_string(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() and abs(value) < 1e16 else repr(value)
    if isinstance(value, _Runtime):
        return str(value)
    if value is None:
        raise _FnError("a null value cannot be used as a string")
    raise _FnError(f"a {_type_name(value)} cannot be used as a string")


def _to_number_or_none(value: Any) -> int | float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return value
    if isinstance(value, str):
        text = value.strip()
        if len(text) > 40:
            return None
        if re.fullmatch(r"[+-]?\d+", text):
            return int(text)
        try:
            number = float(text)
        except ValueError:
            return None
        return _normal(number) if math.isfinite(number) else None
    return None


def _normal(number: int | float) -> int | float:
    """Integral floats as ints, so ``4 / 2`` is ``2`` where a count is wanted."""
    if isinstance(number, float):
        if not math.isfinite(number):
            raise _FnError("the result is not a finite number")
        if number.is_integer() and abs(number) < 2**53:
            return int(number)
        return number
    if number.bit_length() > MAX_NUMBER_BITS:
        raise _FnError("the result is too large a number")
    return number


def _distinct(items: list[Any]) -> list[Any]:
    """The first of each value, in order: linear, keyed on a value's JSON (values are
    normalised, so 2.0 is 2, and true is not 1)."""
    out: list[Any] = []
    seen: set[str] = set()
    for item in items:
        key = json.dumps(item, sort_keys=True, default=str)
        if key not in seen:
            seen.add(key)
            out.append(item)
    return out


def _equal(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return a == b
    return type(a) is type(b) and bool(a == b)


_V = TypeVar("_V")


class _FnError(Exception):
    """A function's or operator's complaint; the evaluator adds the line."""


def _check_size(value: _V) -> _V:
    if isinstance(value, str) and len(value) > MAX_STRING_CHARS:
        raise _FnError(f"a string longer than {MAX_STRING_CHARS} characters")
    if isinstance(value, list | dict) and len(value) > MAX_ITEMS:
        raise _FnError(f"a collection of more than {MAX_ITEMS} items")
    return value


# ---------------------------------------------------------------------------------------
# Functions


def _want_str(value: Any, what: str = "argument") -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, bool | int | float):
        return _to_string(value)
    raise _FnError(f"{what} must be a string, got {_type_name(value)}")


def _want_int(value: Any, what: str = "argument") -> int:
    number = _to_number_or_none(value)
    if number is None:
        raise _FnError(f"{what} must be a number, got {_type_name(value)}")
    if isinstance(number, float):
        if not number.is_integer():
            raise _FnError(f"{what} must be a whole number, got {number}")
        return int(number)
    return number


def _want_num(value: Any, what: str = "argument") -> int | float:
    number = _to_number_or_none(value)
    if number is None:
        raise _FnError(f"{what} must be a number, got {_type_name(value)}")
    return number


def _want_list(value: Any, what: str = "argument") -> list[Any]:
    if isinstance(value, list):
        return value
    raise _FnError(f"{what} must be a list, got {_type_name(value)}")


def _want_map(value: Any, what: str = "argument") -> dict[str, Any]:
    if isinstance(value, dict):
        return value
    raise _FnError(f"{what} must be a map, got {_type_name(value)}")


def _arity(args: Sequence[Any], low: int, high: int | None = None) -> None:
    high = low if high is None else high
    if not low <= len(args) <= high:
        want = str(low) if low == high else f"{low} to {high}" if high < 99 else f"at least {low}"
        raise _FnError(f"takes {want} argument(s), got {len(args)}")


def _title(text: str) -> str:
    """Go's ``strings.Title``: the first letter of each word upper-cased, the rest kept."""
    out = []
    previous = " "
    for char in text:
        out.append(char.upper() if not (previous.isalnum() or previous == "_") else char)
        previous = char
    return "".join(out)


_FORMAT_VERB: Final = re.compile(r"%([-+ 0#]*)(\d+)?(?:\.(\d+))?([a-zA-Z%])")


def _format(spec: str, args: Sequence[Any]) -> str:
    """HCL's ``format``: Go's verbs %s %d %f %t %v %q %x %X %o %b %e %% with flags,
    width and precision."""
    out: list[str] = []
    position = 0
    index = 0
    for match in _FORMAT_VERB.finditer(spec):
        out.append(spec[position : match.start()])
        position = match.end()
        flags, width, precision, verb = match.groups()
        if verb == "%":
            out.append("%")
            continue
        if index >= len(args):
            raise _FnError(f"format: not enough arguments for {match.group(0)}")
        value = args[index]
        index += 1
        if int(width or 0) > MAX_FORMAT_WIDTH or int(precision or 0) > MAX_FORMAT_WIDTH:
            raise _FnError(f"format: width and precision must be at most {MAX_FORMAT_WIDTH}")
        pyspec = flags.replace("#", "") + (width or "") + (f".{precision}" if precision else "")
        if verb in ("s", "v"):
            text = (
                json.dumps(value, separators=(",", ":"))
                if verb == "v" and isinstance(value, list | dict)
                else _want_str(value)
            )
            out.append(("%" + pyspec + "s") % text)
        elif verb == "q":
            out.append(("%" + pyspec + "s") % json.dumps(_want_str(value), ensure_ascii=False))
        elif verb == "t":
            if not isinstance(value, bool):
                raise _FnError(f"format: %t needs a bool, got {_type_name(value)}")
            out.append(("%" + pyspec + "s") % _to_string(value))
        elif verb in ("d", "x", "X", "o", "b"):
            number = _want_int(value, f"format: {match.group(0)}")
            if verb == "b":
                text = format(number, "b")
                out.append(("%" + flags.replace("#", "") + (width or "") + "s") % text)
            else:
                out.append(("%" + pyspec + verb) % number)
        elif verb in ("f", "F", "e", "E", "g", "G"):
            out.append(
                ("%" + pyspec + verb.lower() if verb == "F" else "%" + pyspec + verb) % _want_num(value)
            )
        else:
            raise _FnError(f"format: unsupported verb {match.group(0)}")
        _check_size(out[-1])
    out.append(spec[position:])
    if index < len(args):
        raise _FnError(f"format: {len(args) - index} argument(s) left over")
    return _check_size("".join(out))


def _formatlist(spec: str, args: Sequence[Any]) -> list[str]:
    lengths = {len(a) for a in args if isinstance(a, list)}
    if len(lengths) > 1:
        raise _FnError("formatlist: the list arguments must all have the same length")
    count = lengths.pop() if lengths else 1
    out: list[str] = []
    total = 0
    for i in range(count):
        out.append(_format(spec, [a[i] if isinstance(a, list) else a for a in args]))
        total += len(out[-1])
        if total > MAX_VALUE_SIZE:
            raise _FnError(f"formatlist: a value larger than {MAX_VALUE_SIZE} characters")
    return out


def _go_replacement(repl: str) -> str:
    """A Go ``ReplaceAllString`` template (``$1``, ``${name}``, ``$$``) for Python's ``sub``."""
    out = []
    i = 0
    while i < len(repl):
        char = repl[i]
        if char == "\\":
            out.append("\\\\")
        elif char == "$" and i + 1 < len(repl):
            rest = repl[i + 1 :]
            if rest.startswith("$"):
                out.append("$")
                i += 2
                continue
            named = re.match(r"\{(\w+)\}|(\d+)", rest)
            if named:
                out.append("\\g<" + (named.group(1) or named.group(2)) + ">")
                i += 1 + named.end()
                continue
            out.append("$")
        else:
            out.append(char)
        i += 1
    return "".join(out)


_RE2_OPTIONS: Final = re2.Options()
_RE2_OPTIONS.log_errors = False
_RE2_OPTIONS.max_mem = 8 << 20


def _regex_replace(text: str, pattern: str, repl: str) -> str:
    try:
        compiled = re2.compile(pattern, options=_RE2_OPTIONS)
    except (re2.error, UnicodeError) as exc:
        raise _FnError(f"invalid regular expression: {' '.join(str(exc).split())[:120]}") from exc
    if repl:
        # Each match adds at most the replacement's length (plus group text): bound the
        # result before building it.
        for matches, _ in enumerate(compiled.finditer(text), start=1):
            if len(text) + matches * len(repl) > MAX_STRING_CHARS:
                raise _FnError(f"a string longer than {MAX_STRING_CHARS} characters")
    try:
        result: str = compiled.sub(_go_replacement(repl), text)
    except (re2.error, IndexError, ValueError) as exc:
        raise _FnError(f"invalid replacement: {' '.join(str(exc).split())[:120]}") from exc
    return _check_size(result)


def _replace(text: str, old: str, new: str) -> str:
    """Terraform's and Nomad's ``replace``: ``/.../`` around the search string makes it a
    regular expression."""
    if len(old) >= 2 and old.startswith("/") and old.endswith("/"):
        return _regex_replace(text, old[1:-1], new)
    if old == "":
        raise _FnError("replace: the search string must not be empty")
    if len(new) > len(old) and len(text) + text.count(old) * (len(new) - len(old)) > MAX_STRING_CHARS:
        raise _FnError(f"a string longer than {MAX_STRING_CHARS} characters")
    return _check_size(text.replace(old, new))


def _substr(text: str, offset: int, length: int) -> str:
    if offset < 0:
        offset = max(len(text) + offset, 0)
    if length < 0:
        return text[offset:]
    return text[offset : offset + length]


def _range(args: Sequence[Any]) -> list[int | float]:
    _arity(args, 1, 3)
    numbers = [_want_num(a) for a in args]
    start: int | float = 0
    step: int | float = 1
    if len(numbers) == 1:
        (stop,) = numbers
    elif len(numbers) == 2:
        start, stop = numbers
        step = 1 if stop >= start else -1
    else:
        start, stop, step = numbers
    if step == 0:
        raise _FnError("range: step must not be zero")
    out: list[int | float] = []
    value = start
    while (value < stop) if step > 0 else (value > stop):
        if len(out) >= MAX_ITEMS:
            raise _FnError(f"range: more than {MAX_ITEMS} items")
        out.append(_normal(value))
        value += step
    return out


def _flatten(items: list[Any], depth: int = 0) -> list[Any]:
    out: list[Any] = []
    for item in items:
        if isinstance(item, list):
            out.extend(_flatten(item, depth + 1))
        else:
            out.append(item)
        _check_size(out)
    return out


def _coalesce(args: Sequence[Any]) -> Any:
    for arg in args:
        if arg is not None and arg != "":
            return arg
    raise _FnError("coalesce: no non-null, non-empty argument")


def _lookup(args: Sequence[Any]) -> Any:
    _arity(args, 2, 3)
    table = _want_map(args[0], "lookup: the first argument")
    key = _want_str(args[1], "lookup: the key")
    if key in table:
        return table[key]
    if len(args) == 3:
        return args[2]
    raise _FnError(f"lookup: no key {_quote(key)} and no default given")


def _element(items: list[Any], index: int) -> Any:
    if not items:
        raise _FnError("element: the list is empty")
    if index < 0:
        raise _FnError("element: the index must not be negative")
    return items[index % len(items)]


def _index(items: list[Any], value: Any) -> int:
    for i, item in enumerate(items):
        if _equal(item, value):
            return i
    raise _FnError("index: the value is not in the list")


def _slice(items: list[Any], start: int, end: int) -> list[Any]:
    if not 0 <= start <= end <= len(items):
        raise _FnError(f"slice: indexes {start} to {end} out of range for a list of {len(items)}")
    return items[start:end]


def _sort(items: list[Any]) -> list[str]:
    return sorted(_want_str(item, "sort: each item") for item in items)


def _zipmap(keys: list[Any], values: list[Any]) -> dict[str, Any]:
    if len(keys) != len(values):
        raise _FnError("zipmap: the lists must have the same length")
    return {_want_str(k, "zipmap: each key"): v for k, v in zip(keys, values, strict=True)}


def _merge(args: Sequence[Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for arg in args:
        if arg is not None:
            out.update(_want_map(arg, "merge: each argument"))
    return _check_size(out)


def _toset(items: list[Any]) -> list[Any]:
    distinct = _distinct(items)
    if all(isinstance(item, str) for item in distinct):
        return sorted(distinct)  # HCL orders a set of strings lexically
    return distinct


def _tobool(value: Any) -> bool | None:
    if value is None or isinstance(value, bool):
        return value
    if value in ("true", "false"):
        return bool(value == "true")
    raise _FnError(f"tobool: cannot convert {_type_name(value)} {_quote(str(value))} to bool")


def _tonumber(value: Any) -> int | float | None:
    if value is None:
        return None
    number = _to_number_or_none(value)
    if number is None:
        raise _FnError(f"tonumber: cannot convert {_type_name(value)} to a number")
    return number


def _parseint(text: str, base: int) -> int:
    if not 2 <= base <= 62:
        raise _FnError("parseint: the base must be between 2 and 62")
    if len(text) > 64 or base > 36:
        raise _FnError(f"parseint: cannot read {_quote(text)} in base {base}")
    try:
        return int(text, base)
    except ValueError:
        raise _FnError(f"parseint: cannot read {_quote(text)} in base {base}") from None


def _jsonencode(value: Any) -> str:
    return _check_size(json.dumps(_plain(value), ensure_ascii=False, separators=(",", ":")))


def _plain(value: Any) -> Any:
    if isinstance(value, _Runtime):
        raise _FnError(f"{value} is known only on the client")
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def _jsondecode(text: str) -> Any:
    if len(text) > MAX_STRING_CHARS:
        raise _FnError("jsondecode: the text is too long")
    try:
        value = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise _FnError(f"jsondecode: invalid JSON: {' '.join(str(exc).split())[:120]}") from None
    return _from_json(value)


def _from_json(value: Any) -> Any:
    if isinstance(value, float):
        return _normal(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return _normal(value)
    if isinstance(value, list):
        return _check_size([_from_json(v) for v in value])
    if isinstance(value, dict):
        return _check_size({str(k): _from_json(v) for k, v in value.items()})
    return value


def _base64decode(text: str) -> str:
    try:
        return base64.b64decode(text.encode("ascii"), validate=True).decode("utf-8")
    except (ValueError, UnicodeError):
        raise _FnError("base64decode: not valid base64 of UTF-8 text") from None


def _yamlencode(value: Any) -> str:
    try:
        import yaml
    except ImportError:  # not a declared dependency: refuse rather than fail to start
        raise _FnError("yamlencode is not available: PyYAML is not installed") from None
    return _check_size(str(yaml.safe_dump(_plain(value), sort_keys=True, default_flow_style=False)))


def _minmax(pick: Callable[..., Any], args: Sequence[Any]) -> int | float:
    if not args:
        raise _FnError("needs at least one number")
    return _normal(pick(_want_num(a) for a in args))


def _length(value: Any) -> int:
    if isinstance(value, str | list | dict):
        return len(value)
    raise _FnError(f"length: needs a string, list or map, got {_type_name(value)}")


def _concat(args: Sequence[Any]) -> list[Any]:
    out: list[Any] = []
    for arg in args:
        out.extend(_want_list(arg, "concat: each argument"))
        _check_size(out)
    return out


def _contains(items: Any, value: Any) -> bool:
    return any(_equal(item, value) for item in _want_list(items, "contains: the first argument"))


def _split(sep: str, text: str) -> list[str]:
    if sep == "":
        return list(text)[: MAX_ITEMS + 1]
    return text.split(sep, MAX_ITEMS)


def _join(args: Sequence[Any]) -> str:
    if len(args) < 2:
        raise _FnError("join: takes a separator and at least one list")
    sep = _want_str(args[0], "join: the separator")
    items = [_want_str(item, "join: each item") for arg in args[1:] for item in _want_list(arg)]
    if sum(len(item) for item in items) + len(sep) * len(items) > MAX_STRING_CHARS:
        raise _FnError(f"join: a string longer than {MAX_STRING_CHARS} characters")
    return sep.join(items)


def _fixed(arity: int, body: Callable[..., Any]) -> Callable[[Sequence[Any]], Any]:
    def call(args: Sequence[Any]) -> Any:
        _arity(args, arity)
        return body(*args)

    return call


def _s(fn: Callable[[str], Any]) -> Callable[[Sequence[Any]], Any]:
    return _fixed(1, lambda a: fn(_want_str(a)))


# The functions a job file may call, Nomad's names. Each takes the evaluated arguments.
FUNCTIONS: Final[Mapping[str, Callable[[Sequence[Any]], Any]]] = {
    # strings
    "upper": _s(str.upper),
    "lower": _s(str.lower),
    "title": _s(_title),
    "format": lambda args: _format(_want_str(args[0]), args[1:]) if args else _arity(args, 1, 99),
    "formatlist": lambda args: _formatlist(_want_str(args[0]), args[1:]) if args else _arity(args, 1, 99),
    "join": _join,
    "split": _fixed(2, lambda sep, text: _split(_want_str(sep), _want_str(text))),
    "replace": _fixed(3, lambda t, o, n: _replace(_want_str(t), _want_str(o), _want_str(n))),
    "regex_replace": _fixed(3, lambda t, p, r: _regex_replace(_want_str(t), _want_str(p), _want_str(r))),
    "trimspace": _s(str.strip),
    "trim": _fixed(2, lambda t, chars: _want_str(t).strip(_want_str(chars))),
    "trimprefix": _fixed(2, lambda t, p: _want_str(t).removeprefix(_want_str(p))),
    "trimsuffix": _fixed(2, lambda t, s: _want_str(t).removesuffix(_want_str(s))),
    "chomp": _s(lambda t: t.rstrip("\r\n")),
    "substr": _fixed(3, lambda t, o, n: _substr(_want_str(t), _want_int(o), _want_int(n))),
    "strlen": _s(len),
    "strrev": _s(lambda t: t[::-1]),
    # collections
    "length": _fixed(1, _length),
    "concat": _concat,
    "contains": _fixed(2, _contains),
    "keys": _fixed(1, lambda m: sorted(_want_map(m))),
    "values": _fixed(1, lambda m: [v for _, v in sorted(_want_map(m).items())]),
    "lookup": _lookup,
    "merge": _merge,
    "element": _fixed(2, lambda items, i: _element(_want_list(items), _want_int(i))),
    "index": _fixed(2, lambda items, v: _index(_want_list(items), v)),
    "range": _range,
    "flatten": _fixed(1, lambda items: _flatten(_want_list(items))),
    "distinct": _fixed(1, lambda items: _distinct(_want_list(items))),
    "coalesce": _coalesce,
    "compact": _fixed(1, lambda items: [i for i in _want_list(items) if i is not None and i != ""]),
    "slice": _fixed(3, lambda items, s, e: _slice(_want_list(items), _want_int(s), _want_int(e))),
    "sort": _fixed(1, lambda items: _sort(_want_list(items))),
    "reverse": _fixed(1, lambda items: list(reversed(_want_list(items)))),
    "zipmap": _fixed(2, lambda k, v: _zipmap(_want_list(k), _want_list(v))),
    "toset": _fixed(1, lambda items: _toset(_want_list(items))),
    "tolist": _fixed(1, lambda items: list(_want_list(items))),
    "tomap": _fixed(1, lambda m: dict(_want_map(m))),
    "tostring": _fixed(1, lambda v: None if v is None else _want_str(v)),
    "tonumber": _fixed(1, _tonumber),
    "tobool": _fixed(1, _tobool),
    # numbers
    "min": lambda args: _minmax(min, args),
    "max": lambda args: _minmax(max, args),
    "abs": _fixed(1, lambda n: _normal(abs(_want_num(n)))),
    "ceil": _fixed(1, lambda n: _normal(math.ceil(_want_num(n)))),
    "floor": _fixed(1, lambda n: _normal(math.floor(_want_num(n)))),
    "parseint": _fixed(2, lambda t, b: _parseint(_want_str(t), _want_int(b))),
    # encodings
    "jsonencode": _fixed(1, _jsonencode),
    "jsondecode": _fixed(1, lambda t: _jsondecode(_want_str(t))),
    "base64encode": _s(lambda t: _check_size(base64.b64encode(t.encode("utf-8")).decode("ascii"))),
    "base64decode": _s(_base64decode),
    "urlencode": _s(lambda t: urllib.parse.quote(t, safe="")),
    "yamlencode": _fixed(1, _yamlencode),
}


# ---------------------------------------------------------------------------------------
# The evaluator


@dataclass(slots=True)
class _Local:
    node: Any
    line: int
    value: Any = None
    state: str = "new"  # new, busy, done, failed


@dataclass(slots=True)
class _Evaluator:
    inputs: VariableInputs
    errors: list[EvalError] = field(default_factory=list)
    variables: dict[str, Any] = field(default_factory=dict)
    # Variables declared but not settable (no value anywhere): using one is the error.
    unset: dict[str, int] = field(default_factory=dict)
    locals: dict[str, _Local] = field(default_factory=dict)
    scopes: list[dict[str, Any]] = field(default_factory=list)
    steps: int = 0
    # Sizes of the lists and maps built so far, by id (the value kept alive beside it so
    # its id is not reused): a value made of shared parts is sized in linear time.
    sizes: dict[int, tuple[Any, int]] = field(default_factory=dict)
    document_size: int = 0
    # Every string an expression gave, summed (a reference to a big one counts each time):
    # what bounds the text a loop can build.
    string_chars: int = 0
    # Added to the lines of a heredoc's template, parsed on its own.
    line_offset: int = 0
    # Inside a variable's default or an input value: no var or local may be used.
    literal_only: bool = False

    def tick(self, node: Any) -> None:
        self.steps += 1
        if self.steps > MAX_STEPS:
            raise EvalError(f"too much to evaluate (more than {MAX_STEPS} steps)", self.at(node))

    def at(self, node: Any) -> int:
        """``node``'s line in the job file (a heredoc's template counts from the heredoc)."""
        line = _line(node)
        return line + self.line_offset if line else 0

    # -- expressions -------------------------------------------------------------------

    def ev(self, node: Any) -> Any:
        self.tick(node)
        try:
            result = self._ev(node)
            if isinstance(result, str):
                self.string_chars += len(result)
                if self.string_chars > MAX_STRING_TOTAL:
                    raise _FnError(f"too much text to evaluate (more than {MAX_STRING_TOTAL} characters)")
            elif isinstance(result, list | dict) and self.size(result) > MAX_VALUE_SIZE:
                raise _FnError(f"a value larger than {MAX_VALUE_SIZE} characters")
            return result
        except _FnError as exc:
            raise EvalError(str(exc), self.at(node)) from None

    def size(self, value: Any) -> int:
        if isinstance(value, str):
            return len(value)
        if not isinstance(value, list | dict):
            return 1
        known = self.sizes.get(id(value))
        if known is not None and known[0] is value:
            return known[1]
        total = 1
        for item in value.values() if isinstance(value, dict) else value:
            total += self.size(item)
            if total > MAX_DOCUMENT_SIZE:
                break  # already too big: the exact figure does not matter
        self.sizes[id(value)] = (value, total)
        return total

    def _ev(self, node: Any) -> Any:
        if isinstance(node, ExprTermRule):
            return self.ev(node.expression)
        if isinstance(node, IntLitRule | FloatLitRule):
            return _number_literal(str(node.token.value))
        if isinstance(node, LiteralValueRule):
            return {"true": True, "false": False, "null": None}[str(node.token.value)]
        if isinstance(node, StringRule):
            return self.template(node.string_parts, node)
        if isinstance(node, HeredocTemplateRule):
            return self.heredoc(node)
        if isinstance(node, TemplateStringRule):
            return node.inner_value
        if isinstance(node, TupleRule):
            items = []
            budget = _SizeBudget(self)
            for element in node.elements:
                items.append(budget.add(self.ev(element)))
            return _check_size(items)
        if isinstance(node, ObjectRule):
            out: dict[str, Any] = {}
            budget = _SizeBudget(self)
            for elem in node.elements:
                out[self.object_key(elem.key)] = budget.add(self.ev(elem.expression))
            return _check_size(out)
        if isinstance(node, IdentifierRule):
            return self.reference(node, [])
        if isinstance(node, GetAttrExprTermRule | IndexExprTermRule):
            return self.traversal(node)
        if isinstance(node, AttrSplatExprTermRule | FullSplatExprTermRule):
            return self.splat(node)
        if isinstance(node, FunctionCallRule):
            return self.call(node)
        if isinstance(node, ConditionalRule):
            condition = self.ev(node.condition)
            if not isinstance(condition, bool):
                raise _FnError(f"a condition must be true or false, got {_type_name(condition)}")
            return self.ev(node.if_true if condition else node.if_false)
        if isinstance(node, BinaryOpRule):
            return self.binary(node)
        if isinstance(node, UnaryOpRule):
            operand = self.ev(node.expr_term)
            if node.operator.strip() == "!":
                if not isinstance(operand, bool):
                    raise _FnError(f"! needs true or false, got {_type_name(operand)}")
                return not operand
            return _normal(-_want_num(operand, "-"))
        if isinstance(node, ForTupleExprRule | ForObjectExprRule):
            return self.for_expr(node)
        raise _FnError(f"this kind of expression ({type(node).__name__}) is not supported")

    def object_key(self, key: Any) -> str:
        if isinstance(key, ObjectElemKeyRule):
            inner = key.value
            if isinstance(inner, IdentifierRule | KeywordRule):
                return str(inner.serialize(_LABEL_OPTIONS))
            if isinstance(inner, IntLitRule | FloatLitRule):
                return _to_string(self.ev(inner))
            return _want_str(self.ev(inner), "an object key")
        if isinstance(key, ObjectElemKeyExpressionRule):
            return _want_str(self.ev(key.expression), "an object key")
        raise _FnError("an object key must be a name, a string or a (expression)")

    def template(self, parts: Sequence[Any], node: Any) -> Any:
        contents = [p.content if isinstance(p, StringPartRule) else p for p in parts]
        if len(contents) == 1 and isinstance(contents[0], InterpolationRule):
            # "${x}" alone is x itself, not its string: "${var.count}" stays a number.
            return self.ev(contents[0].expression)
        pieces = _Pieces()
        self.render(parts, pieces)
        return _check_size(_strip_and_join(pieces))

    def render(self, parts: Sequence[Any], pieces: _Pieces) -> None:
        """A template's parts as text pieces (``_Literal`` for the file's own text, which
        ``~`` strip markers may trim) and ``_STRIP_LEFT``/``_STRIP_RIGHT`` markers."""
        for part in parts:
            content = part.content if isinstance(part, StringPartRule) else part
            self.tick(content)
            if isinstance(content, InterpolationRule):
                value = self.ev(content.expression)
                pieces.append(str(value) if isinstance(value, _Runtime) else _to_string(value))
            elif isinstance(content, TemplateIfRule):
                self.render_if(content, pieces)
            elif isinstance(content, TemplateForRule):
                self.render_for(content, pieces)
            else:
                name = content.lark_name() if hasattr(content, "lark_name") else ""
                text = str(getattr(content, "value", ""))
                if name == "STRING_CHARS":
                    pieces.append(_Literal(process_escape_sequences(text)))
                elif name in ("ESCAPED_INTERPOLATION", "ESCAPED_DIRECTIVE"):
                    pieces.append(_Literal(text[1:]))
                else:
                    raise EvalError(
                        "a template directive out of place (an else or end without its start)",
                        self.at(content),
                    )
            if pieces.chars > MAX_STRING_CHARS:
                raise EvalError(f"a string longer than {MAX_STRING_CHARS} characters", self.at(content))

    def render_if(self, node: TemplateIfRule, pieces: _Pieces) -> None:
        start, else_rule, endif = node._if_start, node._else_rule, node._endif
        condition = self.ev(start.condition)
        if not isinstance(condition, bool):
            raise EvalError(f"%{{ if }} needs true or false, got {_type_name(condition)}", self.at(start))
        if start.strip_open:
            pieces.append(_STRIP_LEFT)
        if condition:
            if start.strip_close:
                pieces.append(_STRIP_RIGHT)
            self.render(node._if_body, pieces)
            if else_rule.strip_open if else_rule is not None else endif.strip_open:
                pieces.append(_STRIP_LEFT)
        elif else_rule is not None:
            if else_rule.strip_close:
                pieces.append(_STRIP_RIGHT)
            self.render(node._else_body, pieces)
            if endif.strip_open:
                pieces.append(_STRIP_LEFT)
        if endif.strip_close:
            pieces.append(_STRIP_RIGHT)

    def render_for(self, node: TemplateForRule, pieces: _Pieces) -> None:
        start, endfor = node._for_start, node._endfor
        names = [
            str(n.serialize(_LABEL_OPTIONS)) for n in (start.iterator, start.key_iterator) if n is not None
        ]
        collection = self.ev(start.collection)
        if isinstance(collection, dict):
            items: list[tuple[Any, Any]] = sorted(collection.items())
        elif isinstance(collection, list):
            items = list(enumerate(collection))
        else:
            raise EvalError(f"%{{ for }} needs a list or a map, got {_type_name(collection)}", self.at(start))
        if start.strip_open:
            pieces.append(_STRIP_LEFT)
        for key, item in items:
            self.scopes.append({names[0]: item} if len(names) == 1 else {names[0]: key, names[1]: item})
            try:
                if start.strip_close:
                    pieces.append(_STRIP_RIGHT)
                self.render(node._body, pieces)
                if endfor.strip_open:
                    pieces.append(_STRIP_LEFT)
            finally:
                self.scopes.pop()
        if endfor.strip_close:
            pieces.append(_STRIP_RIGHT)

    def heredoc(self, node: HeredocTemplateRule) -> Any:
        """A heredoc's body is one token to python-hcl2: its ``${...}`` are found here."""
        raw = str(node.heredoc.value)
        match = re.match(r"<<(-?)([A-Za-z][A-Za-z0-9._-]*)\r?\n(.*)\Z", raw, re.DOTALL)
        if not match:
            raise _FnError("invalid heredoc")
        body = match.group(3)
        # The closing marker's line is not part of the value; the newline that ends the last
        # line of text is (HCL's heredoc, as Nomad reads it: "a\nb\n" for two lines).
        body = re.sub(r"(?:^|(?<=\n))[ \t]*" + re.escape(match.group(2)) + r"\r?\n\Z", "", body)
        if isinstance(node, HeredocTrimTemplateRule) or match.group(1):
            lines = body.split("\n")
            indents = [len(line) - len(line.lstrip(" ")) for line in lines if line.strip()]
            cut = min(indents) if indents else 0
            body = "\n".join(line[cut:] for line in lines)
        if "${" not in body and "%{" not in body:
            return body
        return self.text_template(body, _line(node))

    def text_template(self, body: str, line: int) -> Any:
        """A heredoc body with ``${...}`` or ``%{...}`` in it, evaluated as the quoted
        template it means: its own text escaped, its interpolations and directives kept,
        parsed once (its lines counted from the heredoc's first) and rendered like any."""
        quoted: list[str] = []
        position = 0
        for marker in _TEMPLATE_MARKER.finditer(body):
            start = marker.start()
            if start < position:
                continue  # inside an interpolation or directive already copied
            quoted.append(body[position:start].replace("\\", "\\\\").replace('"', '\\"'))
            token = marker.group(0)
            if token in ("$${", "%%{"):
                quoted.append(token)
                position = marker.end()
                continue
            close = _interpolation_end(body, marker.end())
            if close == -1:
                raise EvalError(f"unclosed {token} in a heredoc", line + 1 + body.count("\n", 0, start))
            quoted.append(body[start : close + 1])
            position = close + 1
            # Charged before the parse: a heredoc of thousands is refused, not parsed.
            self.steps += _PARSE_STEPS
            self.tick(None)
        quoted.append(body[position:].replace("\\", "\\\\").replace('"', '\\"'))
        template = _unwrap(_parse_expression('"' + "".join(quoted) + '"', line + 1))
        if not isinstance(template, StringRule):
            raise EvalError("cannot read the heredoc as a template", line + 1)
        saved, self.line_offset = self.line_offset, line
        try:
            return self.template(template.string_parts, template)
        finally:
            self.line_offset = saved

    def reference(self, root: IdentifierRule, steps: list[Any]) -> Any:
        """``name`` followed by ``steps`` (``.attr``, ``[index]``)."""
        name = str(root.serialize(_LABEL_OPTIONS))
        for scope in reversed(self.scopes):
            if name in scope:
                return self.apply_steps(scope[name], steps)
        if name in _RUNTIME_ROOTS or name.startswith("NOMAD_"):
            return _Runtime(name + "".join(self.step_text(s) for s in steps))
        if name in ("var", "local"):
            if not steps or not isinstance(steps[0], GetAttrRule):
                raise _FnError(f"{name} must be followed by .NAME, as in {name}.example")
            key = str(steps[0].identifier.serialize(_LABEL_OPTIONS))
            if self.literal_only:
                raise _FnError(f"{name}.{key} cannot be used here: a value must not depend on variables")
            value = self.variable(key, root) if name == "var" else self.local(key, root)
            return self.apply_steps(value, steps[1:])
        raise _FnError(
            f"unknown variable {_quote(name)}: use var.{name} for a variable, or $${{{name}}} for literal text"
        )

    def variable(self, key: str, node: Any) -> Any:
        if key in self.unset:
            raise _FnError(f'variable "{key}" has no value: set it with -var {key}=... or -var-file')
        if key not in self.variables:
            raise _FnError(f"unknown variable var.{key}: declare it with variable {_quote(key)} {{ ... }}")
        return self.variables[key]

    def local(self, key: str, node: Any) -> Any:
        entry = self.locals.get(key)
        if entry is None:
            raise _FnError(f"unknown local value local.{key}: define it in a locals {{ ... }} block")
        if entry.state == "busy":
            raise _FnError(f"local.{key} refers to itself (through other locals)")
        if entry.state == "failed":
            raise EvalError(f"local.{key} has no value (see its error, line {entry.line})", echo=True)
        if entry.state == "new":
            entry.state = "busy"
            saved, self.scopes = self.scopes, []
            saved_offset, self.line_offset = self.line_offset, 0
            try:
                entry.value = self.ev(entry.node)
            except EvalError:
                entry.state = "failed"
                raise
            finally:
                self.scopes = saved
                self.line_offset = saved_offset
            entry.state = "done"
        return entry.value

    def step_text(self, step: Any) -> str:
        if isinstance(step, GetAttrRule):
            return "." + str(step.identifier.serialize(_LABEL_OPTIONS))
        if isinstance(step, ShortIndexRule):
            return "." + str(step.index.value)
        if isinstance(step, SqbIndexRule):
            key = self.ev(step.index_expression)
            return "[" + (json.dumps(key) if isinstance(key, str) else _to_string(key)) + "]"
        raise _FnError("unsupported traversal")

    def traversal(self, node: Any) -> Any:
        steps: list[Any] = []
        while isinstance(node, GetAttrExprTermRule | IndexExprTermRule | ExprTermRule):
            if isinstance(node, ExprTermRule):
                if node.parentheses:
                    break
                node = node.expression
                continue
            if isinstance(node, GetAttrExprTermRule):
                steps.append(node.get_attr)
                node = node.expr_term
            else:
                steps.append(node.children[1])
                node = node.children[0]
        steps.reverse()
        if isinstance(node, IdentifierRule):
            return self.reference(node, steps)
        return self.apply_steps(self.ev(node), steps)

    def apply_steps(self, value: Any, steps: Sequence[Any]) -> Any:
        for step in steps:
            self.tick(step)
            if isinstance(value, _Runtime):
                return _Runtime(value.text + "".join(self.step_text(s) for s in steps))
            if isinstance(step, GetAttrRule):
                key: Any = str(step.identifier.serialize(_LABEL_OPTIONS))
            elif isinstance(step, ShortIndexRule):
                key = int(str(step.index.value))
            elif isinstance(step, SqbIndexRule):
                key = self.ev(step.index_expression)
            else:
                raise _FnError("unsupported traversal")
            value = _index_value(value, key)
        return value

    def splat(self, node: Any) -> Any:
        base = self.ev(node.expr_term)
        splat = node.attr_splat
        steps = list(splat.get_attrs)
        if base is None:
            return []
        items = base if isinstance(base, list) else [base]
        return [self.apply_steps(item, steps) for item in items]

    def call(self, node: FunctionCallRule) -> Any:
        name = "::".join(str(i.serialize(_LABEL_OPTIONS)) for i in node.identifiers)
        function = FUNCTIONS.get(name)
        if function is None:
            if name == "file":
                function = self.read_file
            else:
                raise _FnError(f"function {_quote(name)} is not supported (see docs/job-files.md)")
        arguments = node.arguments
        args = [self.ev(a) for a in arguments.arguments] if arguments else []
        if arguments is not None and arguments.has_ellipsis:
            if not args or not isinstance(args[-1], list):
                raise _FnError(f"{name}: ... needs a list as the last argument")
            args = args[:-1] + args[-1]
        for arg in args:
            if isinstance(arg, _Runtime):
                raise _FnError(f"{name}: {arg} is known only on the client: it can only be used in a string")
        try:
            return _check_size(function(args))
        except _FnError as exc:
            text = str(exc)
            raise _FnError(text if text.startswith(name) else f"{name}: {text}") from None
        except RecursionError:
            raise
        except (TypeError, ValueError, OverflowError, IndexError) as exc:  # a builtin's own complaint
            raise _FnError(f"{name}: {' '.join(str(exc).split())[:120]}") from None

    def read_file(self, args: Sequence[Any]) -> str:
        _arity(args, 1)
        path = _want_str(args[0], "the path")
        root = self.inputs.file_root
        if not root:
            raise _FnError("file: only a job file read from disk may read files")
        base = os.path.realpath(root)
        full = os.path.realpath(os.path.join(base, path))
        if os.path.isabs(path) or os.path.commonpath([base, full]) != base:
            raise _FnError(f"file: {_quote(path)} is outside the job file's directory")
        try:
            with open(full, encoding="utf-8") as fh:
                text = fh.read(MAX_FILE_BYTES + 1)
        except (OSError, UnicodeError) as exc:
            raise _FnError(
                f"file: cannot read {_quote(path)}: {getattr(exc, 'strerror', None) or 'not UTF-8 text'}"
            ) from None
        if len(text) > MAX_FILE_BYTES:
            raise _FnError(f"file: {_quote(path)} is larger than {MAX_FILE_BYTES} bytes")
        return text

    def binary(self, node: BinaryOpRule) -> Any:
        op = str(node.binary_term.binary_operator.serialize(_LABEL_OPTIONS)).strip()
        left = self.ev(node.expr_term)
        if op in ("&&", "||"):
            if not isinstance(left, bool):
                raise _FnError(f"{op} needs true or false, got {_type_name(left)}")
            if (op == "&&" and not left) or (op == "||" and left):
                return left
            right = self.ev(node.binary_term.expr_term)
            if not isinstance(right, bool):
                raise _FnError(f"{op} needs true or false, got {_type_name(right)}")
            return right
        right = self.ev(node.binary_term.expr_term)
        if isinstance(left, _Runtime) or isinstance(right, _Runtime):
            known = left if isinstance(left, _Runtime) else right
            raise _FnError(f"{known} is known only on the client: it can only be used in a string")
        if op == "==":
            return _deep_equal(left, right)
        if op == "!=":
            return not _deep_equal(left, right)
        a, b = _want_num(left, op), _want_num(right, op)
        if op == "<":
            return a < b
        if op == ">":
            return a > b
        if op == "<=":
            return a <= b
        if op == ">=":
            return a >= b
        if op == "+":
            return _normal(a + b)
        if op == "-":
            return _normal(a - b)
        if op == "*":
            return _normal(a * b)
        if op in ("/", "%") and b == 0:
            raise _FnError("division by zero")
        if op == "/":
            return _normal(a / b if isinstance(a, float) or isinstance(b, float) or a % b else a // b)
        if op == "%":
            return _normal(math.fmod(a, b) if isinstance(a, float) or isinstance(b, float) else _go_mod(a, b))
        raise _FnError(f"unknown operator {op}")

    def for_expr(self, node: Any) -> Any:
        intro = node.for_intro
        collection = self.ev(intro.iterable)
        first = str(intro.first_iterator.serialize(_LABEL_OPTIONS))
        second = intro.second_iterator
        second_name = str(second.serialize(_LABEL_OPTIONS)) if second is not None else ""
        if isinstance(collection, dict):
            pairs: Iterator[tuple[Any, Any]] = iter(sorted(collection.items()))
        elif isinstance(collection, list):
            pairs = iter(enumerate(collection))
        else:
            raise _FnError(f"for needs a list or a map, got {_type_name(collection)}")
        is_object = isinstance(node, ForObjectExprRule)
        tuple_out: list[Any] = []
        object_out: dict[str, Any] = {}
        budget = _SizeBudget(self)
        grouped = is_object and node.ellipsis is not None
        for key, value in pairs:
            scope = {first: value} if not second_name else {first: key, second_name: value}
            self.scopes.append(scope)
            try:
                if node.condition is not None:
                    keep = self.ev(node.condition.condition_expr)
                    if not isinstance(keep, bool):
                        raise _FnError(f"a for condition must be true or false, got {_type_name(keep)}")
                    if not keep:
                        continue
                if is_object:
                    out_key = _want_str(self.ev(node.key_expr), "a for key")
                    out_value = self.ev(node.value_expr)
                    if grouped:
                        object_out.setdefault(out_key, []).append(budget.add(out_value))
                    elif out_key in object_out:
                        raise _FnError(f"for: duplicate key {_quote(out_key)} (use ... to group)")
                    else:
                        object_out[out_key] = budget.add(out_value)
                    _check_size(object_out)
                else:
                    tuple_out.append(budget.add(self.ev(node.value_expr)))
                    _check_size(tuple_out)
            finally:
                self.scopes.pop()
        return object_out if is_object else tuple_out

    # -- variables and locals ----------------------------------------------------------

    def literal(self, node: Any) -> Any:
        saved, self.literal_only = self.literal_only, True
        try:
            return self.ev(node)
        finally:
            self.literal_only = saved

    def declare(self, blocks: Sequence[BlockRule], validations: list[tuple[str, BodyRule]]) -> None:
        """Every ``variable`` block's value, in Nomad's order of precedence."""
        declared: dict[str, tuple[_Type, int]] = {}
        for block in blocks:
            labels = [str(label.serialize(_LABEL_OPTIONS)) for label in block.labels]
            line = _line(block)
            if len(labels) != 2:
                self.errors.append(
                    EvalError('variable block must be written as variable "NAME" { ... }', line)
                )
                continue
            name = labels[1]
            if not _NAME.fullmatch(name):
                # Names reach every message about the variable: a plain name keeps them one line.
                self.errors.append(
                    EvalError(f"variable {_quote(name)}: a variable's name must be a name like env", line)
                )
                continue
            if name in declared:
                self.errors.append(EvalError(f'variable "{name}" is declared twice', line))
                continue
            want = _ANY
            default: Any = _NO_VALUE
            for child in block.body.children:
                if isinstance(child, AttributeRule):
                    key = str(child.identifier.serialize(_LABEL_OPTIONS))
                    try:
                        if key == "type":
                            want = _type_of(child.expression)
                        elif key == "default":
                            default = self.literal(child.expression)
                        elif key in ("description", "sensitive"):
                            pass
                        else:
                            raise EvalError(
                                f'variable "{name}": unknown key {_quote(key)}', _line(child, line)
                            )
                    except EvalError as exc:
                        self.errors.append(
                            EvalError(f'variable "{name}": {exc.message}', exc.line or _line(child, line))
                        )
                elif isinstance(child, BlockRule):
                    kind = str(child.labels[0].serialize(_LABEL_OPTIONS))
                    if kind == "validation":
                        validations.append((name, child.body))
                    else:
                        self.errors.append(
                            EvalError(f'variable "{name}": unknown block {_quote(kind)}', _line(child, line))
                        )
            declared[name] = (want, line)
            if default is not _NO_VALUE:
                self.set_value(name, default, want, line, "default")
            else:
                self.unset[name] = line
        for name, raw in self.inputs.env:
            if name in declared:
                self.set_raw(name, raw, declared[name], f"NOMAD_VAR_{name}")
        for file_name, text in self.inputs.files:
            for name, value, where in self.var_file(file_name, text):
                if name not in declared:
                    self.errors.append(
                        EvalError(f"{where}: no variable {_quote(name)} is declared in the job file")
                    )
                    continue
                self.set_value(name, value, declared[name][0], declared[name][1], where)
        for name, raw in self.inputs.cli:
            if name not in declared:
                self.errors.append(
                    EvalError(f"-var {name}: no variable {_quote(name)} is declared in the job file")
                )
                continue
            self.set_raw(name, raw, declared[name], f"-var {name}")

    def set_raw(self, name: str, raw: str, declared: tuple[_Type, int], where: str) -> None:
        """A value from the command line or the environment: the text itself for a
        string (or untyped) variable, else an HCL expression (``-var 'ports=[80,443]'``)."""
        want, line = declared
        if want.kind in ("string", "any"):
            self.set_value(name, raw, want, line, where)
            return
        try:
            value: Any = self.literal(_parse_expression(raw, 0))
        except EvalError:
            value = raw  # not an expression: the type check says what was wanted
        self.set_value(name, value, want, line, where)

    def set_value(self, name: str, value: Any, want: _Type, line: int, where: str) -> None:
        try:
            converted = _convert(value, want, f'variable "{name}" ({where})')
        except EvalError as exc:
            self.errors.append(EvalError(exc.message, line if where == "default" else 0))
            return
        self.unset.pop(name, None)
        self.variables[name] = converted

    def var_file(self, file_name: str, text: str) -> Iterator[tuple[str, Any, str]]:
        """(name, value, where) for each value a ``-var-file`` sets: JSON for ``.json``
        (or text that starts with ``{``), else HCL attributes."""
        if len(text) > MAX_FILE_BYTES:
            self.errors.append(EvalError(f"{file_name}: larger than {MAX_FILE_BYTES} bytes"))
            return
        if file_name.endswith(".json") or text.lstrip().startswith("{"):
            try:
                data = json.loads(text)
            except (ValueError, RecursionError) as exc:
                self.errors.append(
                    EvalError(f"{file_name}: invalid JSON: {' '.join(str(exc).split())[:120]}")
                )
                return
            if not isinstance(data, dict):
                self.errors.append(EvalError(f"{file_name}: expected a JSON object of variable values"))
                return
            for name, value in data.items():
                try:
                    yield str(name), _from_json(value), file_name
                except _FnError as exc:
                    self.errors.append(EvalError(f"{file_name}: {name}: {exc}"))
            return
        try:
            tree = hcl2.parses(text)
        except RecursionError:
            raise
        except Exception as exc:  # python-hcl2 has no error tree of its own
            where = f"{file_name}:{getattr(exc, 'line', '?')}"
            self.errors.append(EvalError(f"{where}: syntax error in the variables file"))
            return
        for child in tree.body.children:
            if isinstance(child, BlockRule):
                self.errors.append(
                    EvalError(f"{file_name}:{_line(child)}: a variables file holds only NAME = VALUE")
                )
            elif isinstance(child, AttributeRule):
                name = str(child.identifier.serialize(_LABEL_OPTIONS))
                try:
                    yield name, self.literal(child.expression), f"{file_name}:{_line(child)}"
                except EvalError as exc:
                    self.errors.append(EvalError(f"{file_name}:{exc.line or _line(child)}: {exc.message}"))

    def validate(self, validations: Sequence[tuple[str, BodyRule]]) -> None:
        for name, body in validations:
            if name not in self.variables:
                continue
            condition: Any = None
            message: Any = None
            line = _line(body)
            for child in body.children:
                if isinstance(child, AttributeRule):
                    key = str(child.identifier.serialize(_LABEL_OPTIONS))
                    line = line or _line(child)
                    if key == "condition":
                        condition = child.expression
                    elif key == "error_message":
                        message = child.expression
                    else:
                        self.errors.append(
                            EvalError(
                                f'variable "{name}" validation: unknown key {_quote(key)}', _line(child)
                            )
                        )
            if condition is None:
                self.errors.append(EvalError(f'variable "{name}" validation: condition is required', line))
                continue
            try:
                passed = self.ev(condition)
                if not isinstance(passed, bool):
                    raise EvalError(
                        f"condition must be true or false, got {_type_name(passed)}", _line(condition)
                    )
                if not passed:
                    text = _want_str(self.ev(message)) if message is not None else "the value is not valid"
                    text = _one_line(text)
                    self.errors.append(EvalError(f'variable "{name}": {text}', _line(condition, line)))
            except _FnError as exc:
                self.errors.append(EvalError(f'variable "{name}" validation: {exc}', _line(condition, line)))
            except EvalError as exc:
                self.errors.append(
                    EvalError(f'variable "{name}" validation: {exc.message}', exc.line or line)
                )

    # -- bodies ------------------------------------------------------------------------

    def body(self, children: Sequence[Any]) -> Located:
        """A body's data. A key set twice (an attribute twice, or both an attribute and a
        block) keeps its first value: ``jobspec`` reports the repeat, and every value is
        still evaluated for its own problems."""
        out = Located()
        blocks: set[str] = set()
        for child in children:
            if isinstance(child, AttributeRule):
                name = str(child.identifier.serialize(_LABEL_OPTIONS))
                value = self.attribute(name, child)
                if name not in out:
                    out[name] = value
                    out.lines[name] = _line(child)
            elif isinstance(child, BlockRule):
                labels = [str(label.serialize(_LABEL_OPTIONS)) for label in child.labels]
                made: list[tuple[str, Located]]
                if labels[0] == "dynamic" and len(labels) == 2:
                    made = list(self.dynamic(labels[1], child))
                else:
                    made = [(labels[0], self.block_value(labels[1:], child.body.children, _line(child)))]
                for kind, value in made:
                    if kind in out and kind not in blocks:
                        if labels[0] == "dynamic":  # a plain block's repeat is jobspec's to report
                            self.errors.append(
                                EvalError(
                                    f"dynamic {_quote(kind)}: {_quote(kind)} is set already", _line(child)
                                )
                            )
                        continue
                    blocks.add(kind)
                    out.setdefault(kind, []).append(value)
                    out.lines.setdefault(kind, _line(child))
        return out

    def attribute(self, name: str, child: AttributeRule) -> Any:
        """An attribute's value as the converter reads it; ``None`` (not set) if it has a
        problem, which goes on ``errors``."""
        try:
            result = self.ev(child.expression)
            self.document_size += self.size(result)
            if self.document_size > MAX_DOCUMENT_SIZE:
                raise EvalError(f"the job is larger than {MAX_DOCUMENT_SIZE} characters", _line(child))
            return _output(result)
        except EvalError as exc:
            if not exc.echo:
                self.errors.append(EvalError(exc.message, exc.line or _line(child)))
        except RecursionError:
            raise
        except Exception as exc:  # a gap in this evaluator: an answer, not a traceback
            self.errors.append(
                EvalError(f"cannot evaluate {_quote(name)} ({type(exc).__name__})", _line(child))
            )
        return None

    def block_value(self, labels: Sequence[str], children: Sequence[Any], line: int) -> Located:
        """A block's body, nested in its labels as python-hcl2 nests them."""
        value: Located = self.body(children)
        value.line = line
        for label in reversed(labels):
            wrapper = Labelled({label: value})
            wrapper.lines[label] = line
            wrapper.line = line
            value = wrapper
        return value

    def dynamic(self, kind: str, block: BlockRule) -> Iterator[tuple[str, Located]]:
        """``dynamic "KIND" { for_each, labels, iterator, content { ... } }``: one ``KIND``
        block per item of ``for_each``, with ``ITERATOR.key`` and ``ITERATOR.value`` (the
        iterator is named ``KIND`` unless ``iterator`` names it)."""
        line = _line(block)
        settings: dict[str, Any] = {}
        content: BlockRule | None = None
        for child in block.body.children:
            if isinstance(child, AttributeRule):
                settings[str(child.identifier.serialize(_LABEL_OPTIONS))] = child.expression
            elif isinstance(child, BlockRule) and str(child.labels[0].serialize(_LABEL_OPTIONS)) == "content":
                content = child
            elif isinstance(child, BlockRule):
                self.errors.append(
                    EvalError(f"dynamic {_quote(kind)}: only a content block may be inside", _line(child))
                )
        unknown = sorted(set(settings) - {"for_each", "labels", "iterator"})
        if unknown or content is None or "for_each" not in settings:
            why = f"unknown key {_quote(unknown[0])}" if unknown else "needs for_each and a content block"
            self.errors.append(EvalError(f"dynamic {_quote(kind)}: {why}", line))
            return
        iterator = kind
        if "iterator" in settings:
            name = _unwrap(settings["iterator"])
            if not isinstance(name, IdentifierRule):
                self.errors.append(EvalError(f"dynamic {_quote(kind)}: iterator must be a name", line))
                return
            iterator = str(name.serialize(_LABEL_OPTIONS))
        try:
            collection = self.ev(settings["for_each"])
        except EvalError as exc:
            if not exc.echo:
                self.errors.append(
                    EvalError(f"dynamic {_quote(kind)} for_each: {exc.message}", exc.line or line)
                )
            return
        if isinstance(collection, dict):
            items: list[tuple[Any, Any]] = sorted(collection.items())
        elif isinstance(collection, list):
            items = list(enumerate(collection))
        else:
            self.errors.append(
                EvalError(
                    f"dynamic {_quote(kind)} for_each: needs a list or a map, got {_type_name(collection)}",
                    _line(settings["for_each"], line),
                )
            )
            return
        for key, item in items:
            self.scopes.append({iterator: {"key": key, "value": item}})
            try:
                labels: list[str] = []
                if "labels" in settings:
                    try:
                        raw = self.ev(settings["labels"])
                        labels = [_want_str(label, "each label") for label in _want_list(raw, "labels")]
                    except (EvalError, _FnError) as exc:
                        message = exc.message if isinstance(exc, EvalError) else str(exc)
                        self.errors.append(EvalError(f"dynamic {_quote(kind)} labels: {message}", line))
                        return
                yield kind, self.block_value(labels, content.body.children, _line(content, line))
            finally:
                self.scopes.pop()


_NO_VALUE: Final = object()


class _Pieces(list[Any]):
    """A template's pieces so far, with their characters counted as they come."""

    __slots__ = ("chars",)

    def __init__(self) -> None:
        super().__init__()
        self.chars = 0

    def append(self, piece: Any) -> None:
        if isinstance(piece, str):
            self.chars += len(piece)
        super().append(piece)


class _Literal(str):
    """Template text written in the file: what a ``~`` strip marker may trim."""

    __slots__ = ()


_STRIP_LEFT: Final = object()  # trim the whitespace of the literal text before
_STRIP_RIGHT: Final = object()  # trim the whitespace of the literal text after


def _strip_and_join(pieces: Sequence[Any]) -> str:
    out: list[str] = []
    strip_next = False
    for piece in pieces:
        if piece is _STRIP_LEFT:
            while out and isinstance(out[-1], _Literal):
                out[-1] = _Literal(out[-1].rstrip())
                if out[-1]:
                    break
                out.pop()
            continue
        if piece is _STRIP_RIGHT:
            strip_next = True
            continue
        if strip_next and isinstance(piece, _Literal):
            piece = _Literal(piece.lstrip())
            if not piece:
                continue
        strip_next = False
        out.append(piece)
    return "".join(out)


@dataclass(slots=True)
class _SizeBudget:
    """The running size of a list or map being built, refused as soon as it is too big
    (not once a loop has built all of it)."""

    evaluator: _Evaluator
    total: int = 1

    def add(self, value: Any) -> Any:
        self.total += self.evaluator.size(value)
        if self.total > MAX_VALUE_SIZE:
            raise _FnError(f"a value larger than {MAX_VALUE_SIZE} characters")
        return value


def _number_literal(text: str) -> int | float:
    if len(text) > 400:
        raise _FnError(f"a number of {len(text)} digits is too long")
    if re.fullmatch(r"-?\d+", text):
        return _normal(int(text))
    try:
        return _normal(float(text))
    except ValueError:
        raise _FnError(f"cannot read the number {_quote(text)}") from None


def _go_mod(a: int, b: int) -> int:
    """Go's ``%``: the sign follows the dividend."""
    result = abs(a) % abs(b)
    return -result if a < 0 else result


def _deep_equal(a: Any, b: Any) -> bool:
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_deep_equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_deep_equal(a[k], b[k]) for k in a)
    return _equal(a, b)


def _index_value(value: Any, key: Any) -> Any:
    if isinstance(value, dict):
        name = _want_str(key, "a map key")
        if name not in value:
            raise _FnError(f"no key {_quote(name)} (known: {', '.join(sorted(value))[:120]})")
        return value[name]
    if isinstance(value, list):
        index = _want_int(key, "a list index")
        if not 0 <= index < len(value):
            raise _FnError(f"index {index} out of range for a list of {len(value)}")
        return value[index]
    raise _FnError(f"cannot index {_type_name(value)}")


def _output(value: Any) -> Any:
    """A value as the converter reads it: runtime references as their ``${...}`` text."""
    if isinstance(value, _Runtime):
        return str(value)
    if isinstance(value, list):
        return [_output(v) for v in value]
    if isinstance(value, dict):
        return {k: _output(v) for k, v in value.items()}
    return value


# Where a heredoc's template text may change: an escape, an interpolation, a directive.
_TEMPLATE_MARKER: Final = re.compile(r"\$\$\{|%%\{|\$\{|%\{")
# What parsing one heredoc interpolation or directive costs against MAX_STEPS: a parse is
# far dearer than visiting one node, and a heredoc may hold thousands.
_PARSE_STEPS: Final = 500


def _interpolation_end(text: str, i: int) -> int:
    """Where the ``}`` closing an interpolation opened just before ``i`` is, or -1."""
    depth = 1
    while i < len(text):
        char = text[i]
        if char == '"':
            i += 1
            while i < len(text) and text[i] != '"':
                i += 2 if text[i] == "\\" else 1
        elif char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                return i
        i += 1
    return -1


def _parse_expression(text: str, line: int) -> Any:
    """One expression's parse tree (a heredoc's ``${...}``, a ``-var`` value)."""
    if len(text) > MAX_STRING_CHARS:
        raise EvalError("an expression too long to read", line)
    try:
        tree = hcl2.parses(f"v = {text}\n")
    except RecursionError:
        raise
    except Exception:  # python-hcl2 has no error tree of its own
        raise EvalError(f"cannot read the expression {_quote(text.strip())}", line) from None
    children = [c for c in tree.body.children if isinstance(c, AttributeRule | BlockRule)]
    if len(children) != 1 or not isinstance(children[0], AttributeRule):
        raise EvalError(f"cannot read the expression {_quote(text.strip())}", line)
    return children[0].expression


def evaluate_document(body: BodyRule, inputs: VariableInputs) -> tuple[Located, list[EvalError]]:
    """The file's data with every expression evaluated, and every problem found.

    ``variable`` and ``locals`` blocks are read first, wherever they are in the file, and
    are not part of the data.
    """
    evaluator = _Evaluator(inputs)
    variable_blocks: list[BlockRule] = []
    validations: list[tuple[str, BodyRule]] = []
    rest: list[Any] = []
    for child in body.children:
        kind = str(child.labels[0].serialize(_LABEL_OPTIONS)) if isinstance(child, BlockRule) else ""
        if kind == "variable":
            variable_blocks.append(child)
        elif kind == "locals":
            if len(child.labels) != 1:
                evaluator.errors.append(EvalError("locals block takes no label", _line(child)))
            for local in child.body.children:
                if isinstance(local, AttributeRule):
                    name = str(local.identifier.serialize(_LABEL_OPTIONS))
                    if name in evaluator.locals:
                        evaluator.errors.append(EvalError(f"local.{name} is defined twice", _line(local)))
                    evaluator.locals[name] = _Local(local.expression, _line(local))
                elif isinstance(local, BlockRule):
                    evaluator.errors.append(EvalError("a locals block holds only NAME = VALUE", _line(local)))
        else:
            rest.append(child)
    evaluator.declare(variable_blocks, validations)
    evaluator.validate(validations)
    for name, entry in evaluator.locals.items():
        if entry.state == "new":
            try:
                evaluator.local(name, entry.node)
            except (EvalError, _FnError) as exc:
                if isinstance(exc, EvalError) and exc.echo:
                    continue
                message = exc.message if isinstance(exc, EvalError) else str(exc)
                line = exc.line if isinstance(exc, EvalError) and exc.line else entry.line
                evaluator.errors.append(EvalError(f"local.{name}: {message}", line))
    data = evaluator.body(rest)
    return data, _dedupe(evaluator.errors)


def _dedupe(errors: list[EvalError]) -> list[EvalError]:
    seen: set[tuple[str, int]] = set()
    out = []
    for error in errors:
        if (error.message, error.line) not in seen:
            seen.add((error.message, error.line))
            out.append(error)
    return out
