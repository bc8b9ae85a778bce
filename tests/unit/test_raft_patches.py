"""The table of pysyncobj patches (server/raft/patches.py) stays true to the code.

Whoever re-audits a pysyncobj release reads that table instead of the code: it must name
every private pysyncobj name drover touches, no name it does not, and no other module may
touch one.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PATCHES = REPO / "server" / "raft" / "patches.py"
PRODUCT_PACKAGES = ("server", "scheduler", "client_agent")
# A name-mangled SyncObj or TcpConnection attribute (``self.__raftLog`` inside pysyncobj is
# ``_SyncObj__raftLog``; ``self.__readBuffer`` in its connection ``_TcpConnection__readBuffer``).
MANGLED = re.compile(r"_(?:SyncObj|TcpConnection)__\w+")


def _code_without_docstrings(source: str) -> str:
    """The source with every docstring blanked, so only code (and comments) is searched."""
    tree = ast.parse(source)
    lines = source.splitlines(keepends=True)
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                doc = body[0]
                assert doc.end_lineno is not None
                for i in range(doc.lineno - 1, doc.end_lineno):
                    lines[i] = "\n"
    return "".join(lines)


def _private_pysyncobj_imports(source: str) -> set[str]:
    """Underscore names imported from pysyncobj (``from pysyncobj.syncobj import _COMMAND_TYPE``)."""
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "pysyncobj":
            names |= {alias.name for alias in node.names if alias.name.startswith("_")}
    return names


def _product_modules() -> list[Path]:
    return [p for package in PRODUCT_PACKAGES for p in sorted((REPO / package).rglob("*.py"))]


def test_patches__table__names_exactly_the_private_attributes_the_code_touches() -> None:
    source = PATCHES.read_text()
    table = ast.get_docstring(ast.parse(source)) or ""

    in_table = set(MANGLED.findall(table))
    in_code = set(MANGLED.findall(_code_without_docstrings(source)))

    assert in_code, "expected the patches to touch private SyncObj attributes"
    assert in_code - in_table == set(), "touched but not in the table"
    assert in_table - in_code == set(), "in the table but no longer touched"


def test_patches__only_module__that_names_a_private_syncobj_attribute() -> None:
    offenders = {
        str(path.relative_to(REPO)): sorted(set(MANGLED.findall(_code_without_docstrings(path.read_text()))))
        for path in _product_modules()
        if path != PATCHES
    }

    assert {path: names for path, names in offenders.items() if names} == {}


def test_patches__table__names_every_private_pysyncobj_import() -> None:
    table = ast.get_docstring(ast.parse(PATCHES.read_text())) or ""
    imported = set().union(*(_private_pysyncobj_imports(p.read_text()) for p in _product_modules()))

    assert imported, "expected at least pysyncobj's _COMMAND_TYPE to be imported"
    assert {name for name in imported if f"``{name}``" not in table} == set()


def test_patches__checkers__catch_what_they_must() -> None:
    code = '"""doc: _SyncObj__inDoc"""\ndef f(raft):\n    """doc: _SyncObj__x"""\n    return raft._SyncObj__raftLog\n'
    private_import = "from pysyncobj.syncobj import _COMMAND_TYPE, SyncObj"

    assert MANGLED.findall(_code_without_docstrings(code)) == ["_SyncObj__raftLog"]
    assert MANGLED.findall("conn._TcpConnection__readBuffer") == ["_TcpConnection__readBuffer"]
    assert _private_pysyncobj_imports(private_import) == {"_COMMAND_TYPE"}
