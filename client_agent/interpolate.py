"""Runtime interpolation: ``${...}`` names resolved on the node as a task starts.

The job file keeps ``${node.unique.name}``, ``${attr.<name>}``, ``${meta.<key>}``,
``${NOMAD_*}`` and ``${env.<NAME>}`` as text (server/jobspec_eval.py): only the node that
runs the task knows their values. Here they are replaced, in the task's driver config
(every string in it, nested lists and maps included) and in its ``env`` values, as Nomad's
``taskenv.ReplaceEnv`` does at task start.

Lookup order: a name of the task's environment (``NOMAD_ALLOC_ID``, the task's own ``env``
block), then the node's names (``node.*``, ``attr.*``, ``meta.*``), then ``env.<NAME>`` as
the task environment's ``<NAME>``. A name that resolves to nothing is left as written, as
Nomad leaves it, so a typo shows up verbatim in the task's arguments instead of vanishing.

``interpolate_env`` resolves each env value against the environment without the env block
itself, so a value cannot refer to itself or to another value of the block in an order that
would depend on dict iteration.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Final

__all__ = ["interpolate", "interpolate_config", "interpolate_env"]

_REFERENCE: Final = re.compile(r"\$\{([^{}]+)\}")
_ENV_PREFIX: Final = "env."


def _lookup(name: str, env: Mapping[str, str], node: Mapping[str, str]) -> str | None:
    if name in env:
        return env[name]
    if name in node:
        return node[name]
    if name.startswith(_ENV_PREFIX):
        return env.get(name[len(_ENV_PREFIX) :])
    return None


def interpolate(text: str, env: Mapping[str, str], node: Mapping[str, str]) -> str:
    """``text`` with every resolvable ``${name}`` replaced; the rest left as written."""

    def replace(match: re.Match[str]) -> str:
        value = _lookup(match.group(1).strip(), env, node)
        return match.group(0) if value is None else value

    return _REFERENCE.sub(replace, text)


def interpolate_config(config: Any, env: Mapping[str, str], node: Mapping[str, str]) -> Any:
    """A driver config (JSON-shaped) with every string value interpolated; keys and
    non-string values are kept."""
    if isinstance(config, str):
        return interpolate(config, env, node)
    if isinstance(config, list):
        return [interpolate_config(item, env, node) for item in config]
    if isinstance(config, dict):
        return {key: interpolate_config(value, env, node) for key, value in config.items()}
    return config


def interpolate_env(
    base: Mapping[str, str], block: Mapping[str, str], node: Mapping[str, str]
) -> dict[str, str]:
    """``base`` (the variables drover sets) overlaid with the task's ``env`` block, each
    value of the block interpolated against ``base`` and the node."""
    return {**base, **{name: interpolate(value, base, node) for name, value in block.items()}}
