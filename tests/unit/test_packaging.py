"""One installable namespace, ``drover.*``, built from the repo's own folders.

pyproject.toml maps proto/drover to ``drover`` and scheduler/, server/ and client_agent/ to
``drover.scheduler``, ``drover.server`` and ``drover.client``. Two ways that goes wrong
without a test: setuptools installs only the packages it lists, so a sub-package left off
the list imports in a checkout and is missing from a wheel; and the folders still sit at
the repo root, so code that imports a folder by its name (or runs ``python -m`` on it from
the repo root) works there, loading a second copy of every module under another name.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
import tomllib
from importlib.metadata import entry_points
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SETUPTOOLS = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
PACKAGE_DIRS: dict[str, str] = SETUPTOOLS["package-dir"]
# First path parts of the mapped folders (proto, server, ...): never an import name.
FOLDER_NAMES = frozenset(Path(folder).parts[0] for folder in PACKAGE_DIRS.values())
NOT_OURS = {".git", ".venv", "build", "dist", "__pycache__", "bench-results"}


def _packages_on_disk() -> set[str]:
    found = set()
    for name, folder in PACKAGE_DIRS.items():
        root = REPO / folder
        for init in root.rglob("__init__.py"):
            if "__pycache__" not in init.parts:
                found.add(".".join((name, *init.parent.relative_to(root).parts)))
    return found


def _python_files() -> list[Path]:
    files = []
    for dirpath, dirnames, filenames in os.walk(REPO):
        dirnames[:] = [d for d in dirnames if d not in NOT_OURS and not d.endswith(".egg-info")]
        files += [Path(dirpath, f) for f in filenames if f.endswith(".py") and "_pb2" not in f]
    return sorted(files)


def _is_module_path(dotted: str) -> bool:
    """``<folder>.<name>...`` where <name> is a module of that folder or of the root package."""
    folder, _, rest = dotted.partition(".")
    first = rest.split(".")[0]
    places = (REPO / folder, REPO / PACKAGE_DIRS["drover"])
    return any(
        (place / f"{first}.py").is_file() or (place / first / "__init__.py").is_file() for place in places
    )


def test_packaging__every_package_on_disk__is_listed_for_the_wheel() -> None:
    listed, on_disk = set(SETUPTOOLS["packages"]), _packages_on_disk()

    assert listed == on_disk, (
        f"[tool.setuptools] packages lacks {sorted(on_disk - listed)}, lists {sorted(listed - on_disk)} in vain"
    )


def test_packaging__no_code__names_a_folder_instead_of_its_package() -> None:
    dotted = re.compile(rf"(?:{'|'.join(sorted(FOLDER_NAMES))})(?:\.\w+)+")
    findings = []
    for path in _python_files():
        rel = path.relative_to(REPO)
        for node in ast.walk(ast.parse(path.read_text(), str(rel))):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            findings += [
                f"{rel}:{node.lineno}: imports {n}" for n in names if n.split(".")[0] in FOLDER_NAMES
            ]
            # "-m <module>" argv, sys.modules keys, monkeypatch targets
            if (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and dotted.fullmatch(node.value)
                and _is_module_path(node.value)
            ):
                findings.append(f"{rel}:{node.lineno}: names module {node.value!r}")
    assert findings == [], "import through the drover namespace:\n" + "\n".join(findings)


def test_packaging__the_checker__finds_a_folder_import() -> None:
    assert _is_module_path(PACKAGE_DIRS["drover.server"] + ".fsm")
    assert not _is_module_path(PACKAGE_DIRS["drover.server"] + ".hcl")


def test_packaging__drover_console_script__is_the_cli_main() -> None:
    from drover.cli import main

    (script,) = entry_points(group="console_scripts", name="drover")

    assert script.load() is main


@pytest.mark.parametrize("module", ["drover.cli", "drover.server.agent", "drover.client.agent"])
def test_packaging__outside_the_checkout__the_namespace_imports(module: str, tmp_path: Path) -> None:
    """From another directory the repo root is not on sys.path: only the install can help."""
    run = subprocess.run(
        [sys.executable, "-c", f"import {module}"],
        cwd=tmp_path,
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
        capture_output=True,
        text=True,
        timeout=60,
    )

    assert run.returncode == 0, run.stderr


def test_packaging__python_m_drover_cli__prints_usage(tmp_path: Path) -> None:
    run = subprocess.run(
        [sys.executable, "-m", "drover.cli", "--help"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )

    assert run.returncode == 0, run.stderr
    assert "usage: drover" in run.stdout
