"""drover's version, as the installed package says it (what ``drover version`` prints and
every agent reports in ``Operator.AgentInfo`` and ``server members``)."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from typing import Final

__all__ = ["UNKNOWN_VERSION", "drover_version"]

# A source tree run without ``pip install -e .``: no metadata to read.
UNKNOWN_VERSION: Final = "0.0.0+unknown"


def drover_version() -> str:
    try:
        return version("drover")
    except PackageNotFoundError:
        return UNKNOWN_VERSION
