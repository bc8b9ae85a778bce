"""The subset of Go's text/template that Nomad job templates use, parsed once and rendered
many times.

Pure, and shared: the job file reader (server/jobspec.py) parses a job's ``template {
data }``, so a Consul or Vault function is refused with the file, not when a node first
renders it; the client renders it before each start, and again when the services it reads
change.

Supported: text and ``{{ }}`` actions (or other delimiters: ``parse_template``'s ``left``
and ``right``) with ``{{-``/``-}}`` trimming and ``{{/* */}}`` comments; ``if``/``else if``/``else``, ``range`` (with ``$v :=`` or ``$i, $v :=`` and
``else``), ``with``, ``end``; pipelines ``a | f x`` (the value goes last, as in Go);
``.``, ``.Field``, ``$var``, ``$var.Field``, strings (``"..."`` and raw), numbers, booleans,
parentheses. Functions: ``env``, ``nomadService``, and the key-free helpers below. Every
other function is refused by name; the Consul, Vault and Nomad-variable ones say why.

Bounded: rendering stops past ``MAX_OUTPUT`` characters or ``MAX_STEPS`` steps, so a
template from a job file can not make a node render without end.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

__all__ = [
    "MAX_OUTPUT",
    "RenderContext",
    "Template",
    "TemplateError",
    "parse_template",
]

MAX_OUTPUT: Final = 1 << 20
MAX_STEPS: Final = 1_000_000

# Functions consul-template has that drover can not back, each with why.
_REFUSED: Final[Mapping[str, str]] = {
    **dict.fromkeys(
        (
            "key",
            "keyExists",
            "keyOrDefault",
            "ls",
            "safeLs",
            "tree",
            "safeTree",
            "service",
            "services",
            "connect",
        ),
        "no Consul here: use nomadService for services",
    ),
    **dict.fromkeys(("secret", "secrets", "pkiCert", "caRoots", "caLeaf"), "no Vault here"),
    **dict.fromkeys(
        ("nomadVar", "nomadVarList", "nomadVarExists", "nomadVarListSafe"), "no Nomad variables here"
    ),
    "nomadServices": 'list one service with nomadService "name"',
    "writeToFile": "a template writes only its own destination",
    "executeTemplate": "no named templates here",
    "plugin": "no template plugins here",
}


class TemplateError(ValueError):
    """A template that does not parse or render, said in one line."""


@dataclass(frozen=True, slots=True)
class RenderContext:
    """What a render may read: the task's environment, and the registrations of a service
    by name (each a mapping of Nomad's field names: Address, Port, Tags, ...)."""

    env: Mapping[str, str] = field(default_factory=dict)
    services: Callable[[str], Sequence[Mapping[str, Any]]] = lambda name: ()


# -- lexing the inside of an action ---------------------------------------------------

_TOKEN: Final = re.compile(
    r"""\s*(?:
      (?P<str>"(?:[^"\\]|\\.)*")
    | (?P<raw>`[^`]*`)
    | (?P<num>-?\d+(?:\.\d+)?)
    | (?P<decl>:=)
    | (?P<var>\$[A-Za-z0-9_]*)
    | (?P<field>(?:\.[A-Za-z_][A-Za-z0-9_]*)+|\.)
    | (?P<ident>[A-Za-z_][A-Za-z0-9_]*)
    | (?P<punct>[|(),])
    )""",
    re.VERBOSE,
)


def _lex(text: str) -> list[tuple[str, str]]:
    tokens: list[tuple[str, str]] = []
    pos = 0
    while pos < len(text):
        if text[pos:].strip() == "":
            break
        m = _TOKEN.match(text, pos)
        if m is None or m.end() == pos:
            raise TemplateError(f"unexpected {text[pos:].strip()[:20]!r} in {{{{{text.strip()[:60]}}}}}")
        kind = m.lastgroup or ""
        value = m.group(kind)
        pos = m.end()
        # A field right after a variable or a closing parenthesis selects from it: $s.Port
        if (
            kind == "field"
            and value != "."
            and tokens
            and m.start(kind) == m.start()
            and tokens[-1][0] == "var"
        ):
            tokens[-1] = ("var", tokens[-1][1] + value)
            continue
        tokens.append((kind, value))
    return tokens


# -- the parse tree ---------------------------------------------------------------------

Node = Any  # one of the tuples below: ("text", s) ("print", pipe) ("if", ...) ...


@dataclass(frozen=True, slots=True)
class Template:
    """A parsed template: render it with a ``RenderContext``; ``service_names`` are the
    services its ``nomadService`` calls name (what a client watches for changes)."""

    nodes: tuple[Node, ...]
    service_names: frozenset[str]

    def render(self, context: RenderContext) -> str:
        out: list[str] = []
        _Renderer(context, out).block(self.nodes, None, {})
        return "".join(out)


class _Parser:
    def __init__(self, text: str, left: str, right: str) -> None:
        self.items = list(_split(text, left, right))
        self.pos = 0
        self.services: set[str] = set()

    def parse(self) -> tuple[Node, ...]:
        nodes, stop = self.block(())
        if stop is not None:
            raise TemplateError(f"unexpected {{{{{stop[0]}}}}}")
        return nodes

    def block(
        self, stops: tuple[str, ...]
    ) -> tuple[tuple[Node, ...], tuple[str, list[tuple[str, str]]] | None]:
        nodes: list[Node] = []
        while self.pos < len(self.items):
            kind, value = self.items[self.pos]
            self.pos += 1
            if kind == "text":
                nodes.append(("text", value))
                continue
            tokens = _lex(value)
            if not tokens:
                raise TemplateError("empty action {{}}")
            head = tokens[0][1] if tokens[0][0] == "ident" else ""
            if head in ("end", "else"):
                if head not in stops:
                    raise TemplateError(f"{{{{{head}}}}} without if, range or with")
                return tuple(nodes), (head, tokens[1:])
            if head in ("if", "with"):
                nodes.append(self.conditional(head, tokens[1:]))
            elif head == "range":
                nodes.append(self.range(tokens[1:]))
            elif head in ("define", "template", "block"):
                raise TemplateError(f"{{{{{head}}}}} is not supported by drover (no named templates here)")
            else:
                nodes.append(("print", self.pipeline(tokens)))
        if stops:
            raise TemplateError("missing {{end}}: an if, range or with is not closed")
        return tuple(nodes), None

    def conditional(self, head: str, tokens: list[tuple[str, str]]) -> Node:
        pipe = self.pipeline(tokens)
        body, stop = self.block(("end", "else"))
        otherwise: tuple[Node, ...] = ()
        assert stop is not None
        if stop[0] == "else":
            rest = stop[1]
            if rest and rest[0] == ("ident", "if") and head == "if":
                otherwise = (self.conditional("if", rest[1:]),)
                return (head, pipe, body, otherwise)
            otherwise, stop = self.block(("end",))
        return (head, pipe, body, otherwise)

    def range(self, tokens: list[tuple[str, str]]) -> Node:
        names: list[str] = []
        if any(kind == "decl" for kind, _ in tokens):
            split = [kind for kind, _ in tokens].index("decl")
            names = [value for kind, value in tokens[:split] if kind == "var"]
            if not names or len(names) > 2:
                raise TemplateError("range declares $value or $index, $value")
            tokens = tokens[split + 1 :]
        pipe = self.pipeline(tokens)
        body, stop = self.block(("end", "else"))
        otherwise: tuple[Node, ...] = ()
        assert stop is not None
        if stop[0] == "else":
            otherwise, _ = self.block(("end",))
        return ("range", tuple(names), pipe, body, otherwise)

    def pipeline(self, tokens: list[tuple[str, str]]) -> Node:
        if not tokens:
            raise TemplateError("missing value in action")
        commands: list[list[Node]] = [[]]
        depth = 0
        current: list[tuple[str, str]] = []
        groups: list[list[tuple[str, str]]] = []
        for token in tokens:
            if token == ("punct", "(") or token == ("punct", ")"):
                depth += 1 if token[1] == "(" else -1
            if token == ("punct", "|") and depth == 0:
                groups.append(current)
                current = []
            else:
                current.append(token)
        groups.append(current)
        commands = [self.command(g) for g in groups]
        return ("pipe", tuple(tuple(c) for c in commands))

    def command(self, tokens: list[tuple[str, str]]) -> list[Node]:
        args: list[Node] = []
        i = 0
        while i < len(tokens):
            kind, value = tokens[i]
            if (kind, value) == ("punct", "("):
                depth, j = 1, i + 1
                while j < len(tokens) and depth:
                    depth += {"(": 1, ")": -1}.get(tokens[j][1], 0) if tokens[j][0] == "punct" else 0
                    j += 1
                if depth:
                    raise TemplateError("unclosed parenthesis")
                args.append(self.pipeline(tokens[i + 1 : j - 1]))
                i = j
                continue
            args.append(self.operand(kind, value))
            i += 1
        if not args:
            raise TemplateError("missing command in pipeline")
        head = args[0]
        if head[0] == "func" and head[1] == "nomadService":
            if len(args) != 2 or args[1][0] != "lit":
                raise TemplateError('nomadService takes one service name: nomadService "name"')
            self.services.add(str(args[1][1]))
        return args

    def operand(self, kind: str, value: str) -> Node:
        if kind == "str":
            return ("lit", json.loads(value))
        if kind == "raw":
            return ("lit", value[1:-1])
        if kind == "num":
            return ("lit", float(value) if "." in value else int(value))
        if kind == "field":
            return ("field", "", tuple(p for p in value.split(".") if p))
        if kind == "var":
            name, _, path = value.partition(".")
            return ("field", name, tuple(p for p in path.split(".") if p))
        if kind == "ident":
            if value in ("true", "false"):
                return ("lit", value == "true")
            if value == "nil":
                return ("lit", None)
            if value in _REFUSED:
                raise TemplateError(f"function {value!r} is not supported by drover ({_REFUSED[value]})")
            if value not in _FUNCTIONS:
                raise TemplateError(f"function {value!r} is not defined")
            return ("func", value)
        raise TemplateError(f"unexpected {value!r}")


DEFAULT_LEFT: Final = "{{"
DEFAULT_RIGHT: Final = "}}"


def _action_pattern(left: str, right: str) -> re.Pattern[str]:
    """An action between the delimiters, with Go's trim markers (``{{- `` and `` -}}``)."""
    return re.compile(rf"{re.escape(left)}(-\s)?(.*?)(\s-)?{re.escape(right)}", re.DOTALL)


_ACTION: Final = _action_pattern(DEFAULT_LEFT, DEFAULT_RIGHT)


def _split(text: str, left: str, right: str) -> Iterator[tuple[str, str]]:
    """("text", s) and ("action", inside) items, trim markers applied, comments dropped."""
    pos = 0
    pending_trim = False
    items: list[tuple[str, str]] = []
    action = _ACTION if (left, right) == (DEFAULT_LEFT, DEFAULT_RIGHT) else _action_pattern(left, right)
    for m in action.finditer(text):
        chunk = text[pos : m.start()]
        if pending_trim:
            chunk = chunk.lstrip()
        if m.group(1):
            chunk = chunk.rstrip()
        if chunk:
            items.append(("text", chunk))
        inside = m.group(2).strip()
        if not (inside.startswith("/*") and inside.endswith("*/")):
            items.append(("action", inside))
        pending_trim = bool(m.group(3))
        pos = m.end()
    rest = text[pos:]
    if pending_trim:
        rest = rest.lstrip()
    if left in rest:
        raise TemplateError(f"unclosed action: {left} without {right}")
    if rest:
        items.append(("text", rest))
    return iter(items)


def parse_template(text: str, left: str = "", right: str = "") -> Template:
    """``text`` parsed; TemplateError (one line) for what drover can not render.
    ``left``/``right``: the action delimiters (a template's ``left_delimiter`` and
    ``right_delimiter``; "" is Go's ``{{`` and ``}}``), for text full of literal braces."""
    parser = _Parser(text, left or DEFAULT_LEFT, right or DEFAULT_RIGHT)
    return Template(nodes=parser.parse(), service_names=frozenset(parser.services))


# -- rendering --------------------------------------------------------------------------


def _truth(value: Any) -> bool:
    return bool(value) if not isinstance(value, (int, float)) or isinstance(value, bool) else value != 0


def _text(value: Any) -> str:
    """Go's fmt of a value: lists as [a b], maps as map[k:v], nil as <no value>."""
    if value is None:
        return "<no value>"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return "[" + " ".join(_text(v) for v in value) + "]"
    if isinstance(value, Mapping):
        return "map[" + " ".join(f"{k}:{_text(v)}" for k, v in sorted(value.items())) + "]"
    return str(value)


def _printf(fmt: str, *args: Any) -> str:
    converted = re.sub(r"%v|%q", lambda m: "%s" if m.group() == "%v" else "%r", fmt)
    try:
        return converted % tuple(_text(a) if isinstance(a, (list, tuple, Mapping)) else a for a in args)
    except (TypeError, ValueError) as exc:
        raise TemplateError(f"printf {fmt!r}: {exc}") from None


def _index(value: Any, *keys: Any) -> Any:
    for key in keys:
        try:
            value = value[key]
        except (KeyError, IndexError, TypeError):
            raise TemplateError(f"index {key!r}: not found") from None
    return value


def _split_func(sep: str, text: str) -> list[str]:
    return text.split(sep)


_FUNCTIONS: Final[Mapping[str, Callable[..., Any]]] = {
    "env": lambda name: name,  # replaced per render (it reads the context)
    "nomadService": lambda name: name,  # likewise
    "toUpper": lambda s: str(s).upper(),
    "toLower": lambda s: str(s).lower(),
    "trimSpace": lambda s: str(s).strip(),
    "join": lambda sep, items: str(sep).join(_text(i) for i in items),
    "split": _split_func,
    "contains": lambda needle, haystack: str(needle) in str(haystack),
    "replaceAll": lambda old, new, s: str(s).replace(str(old), str(new)),
    "eq": lambda a, *bs: any(a == b for b in bs),
    "ne": lambda a, b: a != b,
    "lt": lambda a, b: a < b,
    "le": lambda a, b: a <= b,
    "gt": lambda a, b: a > b,
    "ge": lambda a, b: a >= b,
    "not": lambda a: not _truth(a),
    "and": lambda *xs: next((x for x in xs if not _truth(x)), xs[-1]),
    "or": lambda *xs: next((x for x in xs if _truth(x)), xs[-1]),
    "len": lambda x: len(x),
    "print": lambda *xs: "".join(_text(x) for x in xs),
    "printf": _printf,
    "index": _index,
    "toJSON": lambda x: json.dumps(x, sort_keys=True, separators=(",", ":")),
    "parseInt": lambda s: int(str(s)),
}


class _Renderer:
    def __init__(self, context: RenderContext, out: list[str]) -> None:
        self.context = context
        self.out = out
        self.size = 0
        self.steps = 0

    def step(self) -> None:
        self.steps += 1
        if self.steps > MAX_STEPS:
            raise TemplateError(f"rendering took more than {MAX_STEPS} steps")

    def emit(self, text: str) -> None:
        self.size += len(text)
        if self.size > MAX_OUTPUT:
            raise TemplateError(f"rendered output is larger than {MAX_OUTPUT} characters")
        self.out.append(text)

    def block(self, nodes: Sequence[Node], dot: Any, variables: dict[str, Any]) -> None:
        for node in nodes:
            self.step()
            kind = node[0]
            if kind == "text":
                self.emit(node[1])
            elif kind == "print":
                self.emit(_text(self.pipe(node[1], dot, variables)))
            elif kind in ("if", "with"):
                value = self.pipe(node[1], dot, variables)
                if _truth(value):
                    self.block(node[2], value if kind == "with" else dot, variables)
                else:
                    self.block(node[3], dot, variables)
            elif kind == "range":
                self.range(node, dot, variables)

    def range(self, node: Node, dot: Any, variables: dict[str, Any]) -> None:
        _, names, pipe, body, otherwise = node
        value = self.pipe(pipe, dot, variables)
        if isinstance(value, Mapping):
            pairs = sorted(value.items())
        elif isinstance(value, (list, tuple)):
            pairs = list(enumerate(value))
        elif isinstance(value, int) and not isinstance(value, bool):
            pairs = [(i, i) for i in range(value)]
        elif value is None:
            pairs = []
        else:
            raise TemplateError(f"range can not iterate over {_text(value)[:40]!r}")
        if not pairs:
            self.block(otherwise, dot, variables)
            return
        for key, item in pairs:
            scope = dict(variables)
            if len(names) == 1:
                scope[names[0]] = item
            elif len(names) == 2:
                scope[names[0]], scope[names[1]] = key, item
            self.block(body, item, scope)

    def pipe(self, pipe: Node, dot: Any, variables: dict[str, Any]) -> Any:
        value: Any = None
        for i, command in enumerate(pipe[1]):
            value = self.command(command, dot, variables, (value,) if i else ())
        return value

    def command(
        self, command: Sequence[Node], dot: Any, variables: dict[str, Any], piped: tuple[Any, ...]
    ) -> Any:
        self.step()
        head = command[0]
        if head[0] != "func":
            if len(command) > 1 or piped:
                raise TemplateError("only a function takes arguments")
            return self.operand(head, dot, variables)
        args = [self.operand(a, dot, variables) for a in command[1:]] + list(piped)
        name = head[1]
        if name == "env":
            if len(args) != 1:
                raise TemplateError('env takes one name: env "NAME"')
            return self.context.env.get(str(args[0]), "")
        if name == "nomadService":
            return [dict(r) for r in self.context.services(str(args[0]))]
        try:
            return _FUNCTIONS[name](*args)
        except TemplateError:
            raise
        except (TypeError, ValueError) as exc:
            raise TemplateError(f"{name}: {exc}") from None

    def operand(self, node: Node, dot: Any, variables: dict[str, Any]) -> Any:
        kind = node[0]
        if kind == "lit":
            return node[1]
        if kind == "pipe":
            return self.pipe(node, dot, variables)
        if kind == "func":
            return self.command((node,), dot, variables, ())
        _, var, path = node
        if var == "$":
            value = dot
        elif var:
            if var not in variables:
                raise TemplateError(f"undefined variable {var}")
            value = variables[var]
        else:
            value = dot
        for part in path:
            if not isinstance(value, Mapping) or part not in value:
                raise TemplateError(f"can not evaluate field {part} in {_text(value)[:40]!r}")
            value = value[part]
        return value
