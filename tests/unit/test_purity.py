"""Import and call rules that keep the core pure and the FSM deterministic (docs/design.md).

(a) scheduler/ is the functional core: no gRPC, raft, threads, clock, randomness, IDs,
    sockets, processes or OS access, and nothing of ours outside scheduler/. Imports under
    ``if TYPE_CHECKING:`` are annotations only and allowed.
(b) The FSM's apply path (server/fsm.py, the Txn in server/state_store.py, and the codec
    and snapshot code it calls) never reads a clock or draws randomness: IDs and timestamps
    travel inside the entry. ``StateStore`` methods may use ``time.monotonic`` to wait,
    because waiting is not applying.
(c) pysyncobj sits behind one adapter: of our product code, only the modules of
    ``server/raft/`` import it (the package docstring says why it is a package).

Both walk the AST, so a rule broken through an alias (``import time as t``,
``from uuid import uuid4``) is still found; self-tests below prove the walkers catch what
they are meant to catch.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCHEDULER = REPO / "scheduler"
# Every module of the package, its sub-packages (placement/, reconciler/) included.
SCHEDULER_MODULES = sorted(SCHEDULER.rglob("*.py"))

FORBIDDEN_IN_SCHEDULER = frozenset(
    {
        "grpc",
        "pysyncobj",
        "threading",
        "time",
        "random",
        "uuid",
        "socket",
        "os",
        "subprocess",
        "server",
        "client_agent",
        "drover",
    }
)

# What of ours scheduler/ may import: itself, under its installed name, and the task-state
# record it shares with the client agent, a module held to the scheduler's own rules below
# (every other drover.* is forbidden through "drover" above).
PURE_PACKAGES = ("drover.scheduler", "drover.common.taskstate")
SHARED_PURE_MODULES = [REPO / "proto/drover/common/taskstate.py"]


def _within(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def _pure(name: str) -> bool:
    return any(_within(name, package) for package in PURE_PACKAGES)


# Modules whose every call is a source of non-determinism, and single functions that are.
NONDETERMINISTIC_MODULES = frozenset({"time", "random", "uuid", "secrets"})
NONDETERMINISTIC_FUNCTIONS = frozenset(
    {
        ("datetime", "now"),
        ("datetime", "utcnow"),
        ("datetime", "today"),
        ("date", "today"),
        ("os", "urandom"),
        ("os", "getrandom"),
    }
)


@dataclass(frozen=True)
class Finding:
    path: str
    line: int
    what: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.what}"


def _rel(path: Path) -> str:
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _runtime_nodes(tree: ast.AST) -> Iterator[ast.AST]:
    """Every node except those under ``if TYPE_CHECKING:`` (its ``else`` still runs)."""
    stack = [tree]
    while stack:
        node = stack.pop()
        yield node
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend(node.orelse)
            continue
        stack.extend(ast.iter_child_nodes(node))


def forbidden_imports(source: str, path: str, forbidden: frozenset[str]) -> list[Finding]:
    findings = []
    for node in _runtime_nodes(ast.parse(source)):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        elif isinstance(node, ast.Call):
            # __import__("time") / importlib.import_module("time")
            func = node.func
            dynamic = (isinstance(func, ast.Name) and func.id == "__import__") or (
                isinstance(func, ast.Attribute) and func.attr == "import_module"
            )
            if (
                dynamic
                and node.args
                and isinstance(node.args[0], ast.Constant)
                and isinstance(node.args[0].value, str)
            ):
                names = [node.args[0].value]
        for name in names:
            if name.split(".")[0] in forbidden and not _pure(name):
                findings.append(Finding(path, getattr(node, "lineno", 0), f"imports {name}"))
    return findings


class _CallFinder(ast.NodeVisitor):
    """Calls into clock/randomness sources, through any import alias, outside allowed classes."""

    def __init__(self, path: str, allowed_classes: frozenset[str]) -> None:
        self.path = path
        self.allowed_classes = allowed_classes
        self.findings: list[Finding] = []
        # local name -> module it stands for ("t" -> "time"), or (module, attr) for from-imports
        self.modules: dict[str, str] = {}
        self.functions: dict[str, tuple[str, str]] = {}
        self._class_stack: list[str] = []

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self.modules[(alias.asname or alias.name).split(".")[0]] = alias.name.split(".")[0]

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.module and node.level == 0:
            root = node.module.split(".")[0]
            for alias in node.names:
                local = alias.asname or alias.name
                if root in NONDETERMINISTIC_MODULES:
                    self.functions[local] = (root, alias.name)
                elif alias.name in ("datetime", "date"):
                    self.modules[local] = alias.name
                elif (root, alias.name) in NONDETERMINISTIC_FUNCTIONS:
                    self.functions[local] = (root, alias.name)

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self._class_stack.append(node.name)
        self.generic_visit(node)
        self._class_stack.pop()

    def _resolve(self, func: ast.expr) -> tuple[str, str] | None:
        if isinstance(func, ast.Name) and func.id in self.functions:
            return self.functions[func.id]
        if isinstance(func, ast.Attribute):
            base = func.value
            # datetime.datetime.now(), module.attr()
            if (
                isinstance(base, ast.Attribute)
                and isinstance(base.value, ast.Name)
                and self.modules.get(base.value.id) == "datetime"
                and base.attr in ("datetime", "date")
            ):
                return (base.attr, func.attr)
            if isinstance(base, ast.Name) and base.id in self.modules:
                return (self.modules[base.id], func.attr)
        return None

    def visit_Call(self, node: ast.Call) -> None:
        target = self._resolve(node.func)
        if target is not None and not (set(self._class_stack) & self.allowed_classes):
            module, attr = target
            if module in NONDETERMINISTIC_MODULES or target in NONDETERMINISTIC_FUNCTIONS:
                self.findings.append(Finding(self.path, node.lineno, f"calls {module}.{attr}()"))
        self.generic_visit(node)


def nondeterministic_calls(
    source: str, path: str, allowed_classes: frozenset[str] = frozenset()
) -> list[Finding]:
    finder = _CallFinder(path, allowed_classes)
    finder.visit(ast.parse(source))
    return finder.findings


# ---------------------------------------------------------------------------------------
# (a) scheduler/ imports


def _in_scheduler(path: Path) -> str:
    return path.relative_to(SCHEDULER).as_posix()


def test_purity__scheduler_package__has_modules_to_check() -> None:
    assert {_in_scheduler(p) for p in SCHEDULER_MODULES} >= {
        "__init__.py",
        "structs.py",
        "validate.py",
        "placement/__init__.py",
        "placement/ranking.py",
        "reconciler/__init__.py",
        "reconciler/vocabulary.py",
    }


# Known violations, reported; each must fail until fixed (strict), then be removed here.
KNOWN_IMPURE: dict[str, str] = {}


@pytest.mark.parametrize(
    "path",
    [
        pytest.param(
            p,
            id=_in_scheduler(p),
            marks=pytest.mark.xfail(strict=True, reason=KNOWN_IMPURE[_in_scheduler(p)]),
        )
        if _in_scheduler(p) in KNOWN_IMPURE
        else pytest.param(p, id=_in_scheduler(p))
        for p in SCHEDULER_MODULES
    ],
)
def test_purity__scheduler_module__imports_nothing_impure(path: Path) -> None:
    findings = forbidden_imports(path.read_text(), _rel(path), FORBIDDEN_IN_SCHEDULER)

    assert findings == [], "scheduler/ is the pure core:\n" + "\n".join(map(str, findings))


@pytest.mark.parametrize("path", SHARED_PURE_MODULES, ids=[_rel(p) for p in SHARED_PURE_MODULES])
def test_purity__shared_module_the_scheduler_imports__is_as_pure_as_the_scheduler(path: Path) -> None:
    source = path.read_text()

    findings = forbidden_imports(source, _rel(path), FORBIDDEN_IN_SCHEDULER)
    findings += nondeterministic_calls(source, _rel(path))

    assert findings == [], "the scheduler imports this module:\n" + "\n".join(map(str, findings))


# ---------------------------------------------------------------------------------------
# (b) the FSM's apply path

# (file, classes whose methods may call the clock)
APPLY_PATH = [
    ("server/fsm.py", frozenset()),
    ("server/state_store.py", frozenset({"StateStore"})),
    ("server/codec.py", frozenset()),
    ("server/snapshot.py", frozenset()),
    # Runs on the apply thread after each entry: every server must derive the same events.
    ("server/events/derive.py", frozenset()),
    # Service registrations are derived from each alloc inside the apply.
    ("server/services/registrations.py", frozenset()),
]


@pytest.mark.parametrize(("path", "allowed"), APPLY_PATH, ids=[p for p, _ in APPLY_PATH])
def test_purity__fsm_apply_path__calls_no_clock_or_randomness(path: str, allowed: frozenset[str]) -> None:
    findings = nondeterministic_calls((REPO / path).read_text(), path, allowed)

    assert findings == [], "the FSM must be deterministic:\n" + "\n".join(map(str, findings))


def test_purity__state_store_allowance__covers_only_monotonic_waits() -> None:
    """The allowance is real: StateStore does read the clock, and only there."""
    source = (REPO / "server/state_store.py").read_text()

    inside = nondeterministic_calls(source, "server/state_store.py")

    assert inside, "expected StateStore.wait_for to read time.monotonic"
    assert {f.what for f in inside} <= {"calls time.monotonic()"}


# ---------------------------------------------------------------------------------------
# (c) the pysyncobj adapter

PRODUCT_PACKAGES = ("server", "scheduler", "client_agent")
# Every module that may import pysyncobj. A new one is a decision: add it here, and keep
# private pysyncobj names in server/raft/patches.py (tests/unit/test_raft_patches.py).
PYSYNCOBJ_ADAPTER = frozenset(
    {
        "server/raft/durable_journal.py",
        "server/raft/journal.py",
        "server/raft/node.py",
        "server/raft/patches.py",
        "server/raft/snapshot_writer.py",
        "server/raft/tuning.py",
    }
)


def _pysyncobj_importers() -> set[str]:
    importers = set()
    for package in PRODUCT_PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            if forbidden_imports(path.read_text(), _rel(path), frozenset({"pysyncobj"})):
                importers.add(_rel(path))
    return importers


def test_purity__pysyncobj__imported_only_by_the_raft_adapter() -> None:
    importers = _pysyncobj_importers()

    assert importers == PYSYNCOBJ_ADAPTER, (
        "pysyncobj must be imported only inside server/raft/ (and every module listed there "
        f"must still need it): outside {sorted(importers - PYSYNCOBJ_ADAPTER)}, "
        f"listed but not importing {sorted(PYSYNCOBJ_ADAPTER - importers)}"
    )


def test_purity__pysyncobj__walker_finds_an_import_outside_the_adapter() -> None:
    assert forbidden_imports(
        "from pysyncobj.config import FAIL_REASON", "server/x.py", frozenset({"pysyncobj"})
    )


# ---------------------------------------------------------------------------------------
# The walkers catch what they must


@pytest.mark.parametrize(
    "source",
    [
        "import time",
        "import os.path",
        "from threading import Lock",
        "from drover.server.state_store import Txn",
        "import drover.v1.structs_pb2",
        "from drover import sdk",
        "import drover.scheduler_extra",
        "from drover.common.tls import TLSFiles",
        "import drover.common.taskstate_extra",
        "import random as r",
        "def f():\n    import uuid",
        "mod = __import__('socket')",
        "import importlib\nm = importlib.import_module('subprocess')",
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    pass\nelse:\n    import grpc",
    ],
    ids=[
        "import",
        "dotted",
        "from",
        "ours",
        "generated",
        "namespace-root",
        "look-alike",
        "common-but-not-shared",
        "shared-look-alike",
        "alias",
        "nested",
        "dunder",
        "importlib",
        "else-branch",
    ],
)
def test_purity__import_walker__finds_forbidden_import(source: str) -> None:
    assert forbidden_imports(source, "x.py", FORBIDDEN_IN_SCHEDULER) != []


@pytest.mark.parametrize(
    "source",
    [
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import random",
        "import typing\nif typing.TYPE_CHECKING:\n    from drover.server.state_store import Txn",
        "from drover.scheduler.structs import Job\nfrom . import structs\nimport hashlib",
        "import timeit\nimport osmosis",
        "from drover.common.taskstate import TaskState",
    ],
    ids=["type-checking", "typing-dot-type-checking", "ours-and-stdlib", "similar-names", "shared-record"],
)
def test_purity__import_walker__allows_annotations_and_pure_modules(source: str) -> None:
    assert forbidden_imports(source, "x.py", FORBIDDEN_IN_SCHEDULER) == []


@pytest.mark.parametrize(
    "source",
    [
        "import time\ndef apply():\n    return time.time_ns()",
        "import time as t\nx = t.monotonic()",
        "from time import time_ns\ny = time_ns()",
        "from uuid import uuid4 as new_id\nz = new_id()",
        "import random\nrandom.shuffle([])",
        "from random import Random\nRandom()",
        "import datetime\ndatetime.datetime.now()",
        "from datetime import datetime\ndatetime.now()",
        "from datetime import date\ndate.today()",
        "import os\nos.urandom(8)",
        "import secrets\nsecrets.token_hex()",
        "import time\nclass Txn:\n    def commit(self):\n        return time.time()",
    ],
    ids=[
        "time",
        "alias",
        "from-import",
        "uuid-alias",
        "random",
        "random-class",
        "datetime-module",
        "datetime-class",
        "date-today",
        "urandom",
        "secrets",
        "txn-method",
    ],
)
def test_purity__call_walker__finds_clock_and_randomness(source: str) -> None:
    assert nondeterministic_calls(source, "x.py", frozenset({"StateStore"})) != []


@pytest.mark.parametrize(
    "source",
    [
        "import time\nclass StateStore:\n    def wait_for(self):\n        return time.monotonic()",
        "import os\nos.path.join('a', 'b')",
        "from datetime import timedelta\ntimedelta(seconds=1)",
        "import hashlib\nhashlib.sha256(b'')",
    ],
    ids=["allowed-class", "os-path", "timedelta", "hashlib"],
)
def test_purity__call_walker__allows_waiting_and_pure_calls(source: str) -> None:
    assert nondeterministic_calls(source, "x.py", frozenset({"StateStore"})) == []
