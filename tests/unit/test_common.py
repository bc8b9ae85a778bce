"""``common`` is what every drover process shares, so it may depend on none of them."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "proto" / "drover" / "common"
THIRD_PARTY = {"structlog", "grpc", "cryptography", "prometheus_client"}


def _modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def _part(name: str) -> str:
    """The top-level package; for ours, the part of the drover namespace (drover.server)."""
    parts = name.split(".")
    return ".".join(parts[:2]) if parts[0] == "drover" else parts[0]


def _top_level_imports(source: str) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names |= {_part(alias.name) for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(_part(node.module))
    return names


@pytest.mark.parametrize("path", _modules(), ids=lambda p: p.name)
def test_boundary__common__imports_only_stdlib_and_third_party(path: Path) -> None:
    imports = _top_level_imports(path.read_text())

    ours = {name for name in imports if name not in sys.stdlib_module_names and name not in THIRD_PARTY}

    assert ours <= {"drover.common"}, f"{path.name} imports {sorted(ours)}"


def test_boundary__common__checker_catches_an_import_of_ours() -> None:
    assert _top_level_imports("from drover.server.fsm import FSM\nimport drover.client.rpc") == {
        "drover.server",
        "drover.client",
    }
    assert "logs.py" in {p.name for p in _modules()}
