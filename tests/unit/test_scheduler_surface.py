"""scheduler's public surface: what ``scheduler/__init__.py`` and each module's ``__all__``
promise is there, and importing the model alone stays cheap.

A newcomer (or another package) reads ``__all__`` to learn what to import: a name listed
but missing, or a module of the package without a list, sends them to the source instead.
"""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest

from drover import scheduler

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "scheduler"
# Modules that need no __all__: the private generated-code helper and the data model,
# whose every public name is the surface.
WITHOUT_ALL = frozenset({"drover.scheduler._records", "drover.scheduler.structs"})


def _modules() -> list[str]:
    names = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(REPO).with_suffix("").parts
        names.append("drover." + ".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


MODULES = _modules()


def test_surface__every_module_is_found() -> None:
    assert {
        "drover.scheduler",
        "drover.scheduler.placement",
        "drover.scheduler.reconciler.vocabulary",
    } <= set(MODULES)


@pytest.mark.parametrize("name", [m for m in MODULES if m not in WITHOUT_ALL])
def test_surface__module_lists_what_it_exports(name: str) -> None:
    module = importlib.import_module(name)
    exported = getattr(module, "__all__", None)

    assert exported is not None, f"{name} has no __all__"
    missing = [n for n in exported if not hasattr(module, n)]
    assert missing == [], f"{name}.__all__ lists names it lacks: {missing}"
    assert len(set(exported)) == len(exported), f"{name}.__all__ repeats a name"


def test_surface__package_names_load_on_first_use() -> None:
    assert sorted(scheduler.__all__) == sorted(scheduler._HOMES)
    for name in scheduler.__all__:
        assert getattr(scheduler, name) is getattr(importlib.import_module(scheduler._HOMES[name]), name)


def test_surface__unknown_name__attribute_error() -> None:
    with pytest.raises(AttributeError, match="no_such_name"):
        scheduler.no_such_name  # noqa: B018


def test_surface__importing_the_model__loads_no_scheduler() -> None:
    """Every drover process imports drover.scheduler.structs; the schedulers load only when used."""
    probe = "import sys, drover.scheduler.structs; print(sorted(m for m in sys.modules if m.startswith('drover.scheduler')))"
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, check=True, timeout=60
    ).stdout

    assert "drover.scheduler.generic" not in out and "drover.scheduler.placement" not in out, out
    assert "drover.scheduler.structs" in out
