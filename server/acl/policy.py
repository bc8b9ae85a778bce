"""Nomad's ACL policy language (HCL), parsed strictly into a ``Policy``.

A policy is a list of rule blocks::

    namespace "default" {            # a name, or a glob with "*": "prod-*", "*"
      policy       = "write"         # read | write | scale | deny
      capabilities = ["alloc-node-exec"]
    }
    node     { policy = "read" }     # read | write | deny
    agent    { policy = "read" }
    operator {
      policy       = "read"
      capabilities = ["snapshot-save"]
    }

A namespace ``policy`` is shorthand for a set of capabilities (``NAMESPACE_POLICIES``, as
Nomad's ``expandNamespacePolicy``); ``capabilities`` adds to it. ``deny`` anywhere in a
namespace rule denies everything in that namespace.

Parsing is strict, as Nomad's is since 1.11 for writes (and for the reason of
CVE-2023-3072, where a label-less block quietly applied to a namespace called "policy"):
an unknown block, key, policy or capability, a repeated key or block, a namespace block
without exactly one label, and an empty policy are all refused, naming the place. Only
what drover can enforce or Nomad defines is known: every Nomad namespace capability is
accepted (so a Nomad policy file ports unchanged), even those no drover RPC checks yet.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

import hcl2
from hcl2.rules.base import AttributeRule, BlockRule
from lark.exceptions import LarkError, UnexpectedInput

__all__ = [
    "AGENT_POLICIES",
    "CAP_DENY",
    "LEVEL_POLICIES",
    "MAX_RULES_BYTES",
    "NAMESPACE_CAPABILITIES",
    "NAMESPACE_POLICIES",
    "OPERATOR_CAPABILITIES",
    "POLICY_DENY",
    "POLICY_READ",
    "POLICY_SCALE",
    "POLICY_WRITE",
    "NamespaceRule",
    "Policy",
    "PolicyError",
    "check_policy_name",
    "parse_policy",
]

POLICY_READ: Final = "read"
POLICY_WRITE: Final = "write"
POLICY_SCALE: Final = "scale"
POLICY_DENY: Final = "deny"
CAP_DENY: Final = "deny"

# Nomad's namespace policies and what each expands to (acl/policy.go expandNamespacePolicy).
_READ_CAPS: Final = frozenset(
    {
        "list-jobs",
        "parse-job",
        "read-job",
        "csi-list-volume",
        "csi-read-volume",
        "read-job-scaling",
        "list-scaling-policies",
        "read-scaling-policy",
        "host-volume-read",
    }
)
_WRITE_CAPS: Final = _READ_CAPS | {
    "scale-job",
    "submit-job",
    "dispatch-job",
    "read-logs",
    "read-fs",
    "alloc-exec",
    "alloc-lifecycle",
    "csi-mount-volume",
    "csi-write-volume",
    "submit-recommendation",
    "host-volume-create",
}
_SCALE_CAPS: Final = frozenset(
    {
        "list-scaling-policies",
        "read-scaling-policy",
        "read-job-scaling",
        "scale-job",
        "read-job",
        "submit-recommendation",
    }
)
NAMESPACE_POLICIES: Final[Mapping[str, frozenset[str]]] = {
    POLICY_READ: _READ_CAPS,
    POLICY_WRITE: _WRITE_CAPS,
    POLICY_SCALE: _SCALE_CAPS,
    POLICY_DENY: frozenset({CAP_DENY}),
}
# Named only explicitly: no namespace policy includes them (Nomad 2.0's fine-grained job and
# deployment capabilities among them; a handler accepts submit-job or the fine one).
_EXPLICIT_ONLY_CAPS: Final = frozenset(
    {
        "alloc-node-exec",
        "csi-register-plugin",
        "host-volume-register",
        "host-volume-write",
        "host-volume-delete",
        "sentinel-override",
        "register-job",
        "revert-job",
        "deregister-job",
        "purge-job",
        "evaluate-job",
        "plan-job",
        "stable-job",
        "tag-job-version",
        "fail-deployment",
        "pause-deployment",
        "promote-deployment",
        "unblock-deployment",
        "cancel-deployment",
        "set-alloc-health-deployment",
        "gc-allocation",
        "pause-allocation",
        "force-periodic-job",
        "delete-service-registration",
    }
)
NAMESPACE_CAPABILITIES: Final = _WRITE_CAPS | _SCALE_CAPS | _EXPLICIT_ONLY_CAPS | {CAP_DENY}
# node, agent and operator take a level, not capabilities (operator adds a few, below).
LEVEL_POLICIES: Final = (POLICY_READ, POLICY_WRITE, POLICY_DENY)
AGENT_POLICIES: Final = LEVEL_POLICIES
# Nomad 2.0's operator capabilities; drover checks snapshot-save (Operator.SnapshotSave).
OPERATOR_CAPABILITIES: Final = frozenset(
    {"snapshot-save", "license-read", "keyring-read", "keyring-rotate", "keyring-delete"}
)

# A policy larger than this is a mistake or an attack; Nomad's are a few hundred bytes.
MAX_RULES_BYTES: Final = 64 * 1024
_NAMESPACE_NAME: Final = re.compile(r"[a-zA-Z0-9*-]{1,128}")
_POLICY_NAME: Final = re.compile(r"[a-zA-Z0-9-]{1,128}")
_BLOCKS: Final = ("namespace", "node", "agent", "operator")
_HCL_OPTIONS: Final = hcl2.SerializationOptions(
    strip_string_quotes=True, explicit_blocks=False, with_comments=False, preserve_heredocs=False
)
# Values keep their quotes, so that a bare word (``policy = read``, which HCL reads as a
# variable reference) is told apart from the string "read" and refused.
_VALUE_OPTIONS: Final = hcl2.SerializationOptions(
    strip_string_quotes=False, explicit_blocks=False, with_comments=False, preserve_heredocs=False
)


class PolicyError(ValueError):
    """Policy rules that can not be accepted. The message is one line and names the place."""


@dataclass(frozen=True, slots=True)
class NamespaceRule:
    """One ``namespace`` block: its name (or glob) and every capability it grants, expanded."""

    name: str
    capabilities: frozenset[str]

    @property
    def denies(self) -> bool:
        return CAP_DENY in self.capabilities


@dataclass(frozen=True, slots=True)
class Policy:
    """What one policy's rules say; ``""`` for a level means the block is absent."""

    namespaces: tuple[NamespaceRule, ...] = ()
    node: str = ""
    agent: str = ""
    operator: str = ""
    operator_capabilities: frozenset[str] = frozenset()


def check_policy_name(name: str) -> None:
    """Policy names as Nomad allows them: letters, digits and dashes, 1 to 128."""
    if not _POLICY_NAME.fullmatch(name):
        raise PolicyError(
            f"name: {json.dumps(name[:40])} is not a policy name (letters, digits and '-', 1 to 128)"
        )


def parse_policy(text: str) -> Policy:
    """The ``Policy`` that ``text`` (policy HCL) says; ``PolicyError`` for anything else."""
    if len(text.encode("utf-8", "surrogatepass")) > MAX_RULES_BYTES:
        raise PolicyError(f"rules: larger than {MAX_RULES_BYTES} bytes")
    try:
        tree = hcl2.parses(text)
    except UnexpectedInput as exc:
        raise PolicyError(f"line {exc.line}, column {exc.column}: syntax error") from exc
    except RecursionError as exc:
        raise PolicyError("rules: nested too deeply to read") from exc
    except (LarkError, RuntimeError, ValueError) as exc:
        if isinstance(exc.__context__, RecursionError) or "recursion" in str(exc):
            raise PolicyError("rules: nested too deeply to read") from exc
        raise PolicyError(f"syntax error: {_one_line(str(exc))}") from exc
    namespaces: list[NamespaceRule] = []
    levels: dict[str, str] = {}
    operator_caps: frozenset[str] = frozenset()
    seen: set[str] = set()
    for child in tree.body.children:
        line = getattr(getattr(child, "_meta", None), "line", "?")
        if isinstance(child, AttributeRule):
            key = child.identifier.serialize(_HCL_OPTIONS)
            raise PolicyError(f"line {line}: unknown key {json.dumps(key)} (drover knows {_known_blocks()})")
        if not isinstance(child, BlockRule):
            continue  # newlines and comments
        labels = [str(label.serialize(_HCL_OPTIONS)) for label in child.labels]
        kind, names = labels[0], labels[1:]
        if kind not in _BLOCKS:
            raise PolicyError(
                f"line {line}: unknown block {json.dumps(kind)} (drover knows {_known_blocks()})"
            )
        body = _attributes(child, kind if kind != "namespace" or not names else f'{kind} "{names[0]}"', line)
        if kind == "namespace":
            if len(names) != 1:
                raise PolicyError(
                    f'line {line}: namespace block must be written as namespace "NAME" {{ ... }}'
                )
            name = names[0]
            where = f"namespace {json.dumps(name)}"
            if not _NAMESPACE_NAME.fullmatch(name):
                raise PolicyError(
                    f"{where}: not a namespace name or glob (letters, digits, '-', '*'; 1 to 128)"
                )
            if where in seen:
                raise PolicyError(f"{where}: duplicate block (line {line})")
            seen.add(where)
            namespaces.append(_namespace_rule(name, where, body))
            continue
        if names:
            raise PolicyError(f"line {line}: {kind} block takes no label, got {json.dumps(names[0])}")
        if kind in seen:
            raise PolicyError(f"{kind}: duplicate block (line {line})")
        seen.add(kind)
        allowed = {"policy", "capabilities"} if kind == "operator" else {"policy"}
        _check_keys(body, kind, allowed)
        level = _string(body, "policy", kind)
        if kind != "operator" or level:
            _check_choice(level, LEVEL_POLICIES, f"{kind}: policy")
        if kind == "operator":
            operator_caps = _capabilities(body, kind, OPERATOR_CAPABILITIES)
            if not level and not operator_caps:
                raise PolicyError("operator: needs policy or capabilities")
        levels[kind] = level
    if not seen:
        raise PolicyError(f"rules: empty policy (write at least one of {_known_blocks()} blocks)")
    return Policy(
        namespaces=tuple(namespaces),
        node=levels.get("node", ""),
        agent=levels.get("agent", ""),
        operator=levels.get("operator", ""),
        operator_capabilities=operator_caps,
    )


def _namespace_rule(name: str, where: str, body: Mapping[str, Any]) -> NamespaceRule:
    _check_keys(body, where, {"policy", "capabilities"})
    policy = _string(body, "policy", where)
    caps = _capabilities(body, where, NAMESPACE_CAPABILITIES)
    if policy:
        _check_choice(policy, tuple(NAMESPACE_POLICIES), f"{where}: policy")
        caps = caps | NAMESPACE_POLICIES[policy]
    elif not caps:
        raise PolicyError(f"{where}: needs policy or capabilities")
    return NamespaceRule(name=name, capabilities=caps)


def _attributes(block: BlockRule, where: str, line: Any) -> dict[str, Any]:
    """The block's attributes as values; nested blocks and repeated keys are refused."""
    out: dict[str, Any] = {}
    for child in block.body.children:
        if isinstance(child, BlockRule):
            kind = str(child.labels[0].serialize(_HCL_OPTIONS))
            raise PolicyError(f"{where}: unknown block {json.dumps(kind)} (line {line})")
        if not isinstance(child, AttributeRule):
            continue
        key = str(child.identifier.serialize(_HCL_OPTIONS))
        if key in out:
            raise PolicyError(f"{where}: duplicate key {json.dumps(key)}")
        try:
            serialized = child.serialize(_VALUE_OPTIONS)
        except (LarkError, RuntimeError, ValueError) as exc:
            raise PolicyError(f"{where}: {key}: {_one_line(str(exc))}") from exc
        value = serialized[key] if isinstance(serialized, dict) and key in serialized else serialized
        out[key] = _unquote(value, f"{where}: {key}")
    return out


def _unquote(value: Any, where: str) -> Any:
    """String literals lose their quotes; anything else that came back as text (a bare word,
    an expression, a template) is refused, never read as the word it spells."""
    if isinstance(value, list):
        return [_unquote(item, where) for item in value]
    if not isinstance(value, str):
        return value
    if len(value) < 2 or value[0] != '"' or value[-1] != '"' or "${" in value or "%{" in value:
        raise PolicyError(f"{where}: expected a quoted string, got {json.dumps(value[:40])}")
    return value[1:-1]


def _check_keys(body: Mapping[str, Any], where: str, allowed: set[str]) -> None:
    for key in body:
        if key not in allowed:
            raise PolicyError(
                f"{where}: unknown key {json.dumps(key)} (allowed: {', '.join(sorted(allowed))})"
            )


def _string(body: Mapping[str, Any], key: str, where: str) -> str:
    value = body.get(key)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise PolicyError(f"{where}: {key} must be a string, got {_describe(value)}")
    return value


def _check_choice(value: str, choices: tuple[str, ...], where: str) -> None:
    if value not in choices:
        raise PolicyError(f"{where} must be one of {', '.join(choices)}, got {json.dumps(value[:40])}")


def _capabilities(body: Mapping[str, Any], where: str, known: frozenset[str]) -> frozenset[str]:
    raw = body.get("capabilities")
    if raw is None:
        return frozenset()
    if not isinstance(raw, list) or not all(isinstance(c, str) for c in raw):
        raise PolicyError(f"{where}: capabilities must be a list of strings, got {_describe(raw)}")
    unknown = sorted({c for c in raw if c not in known})
    if unknown:
        names = ", ".join(json.dumps(c[:40]) for c in unknown[:5])
        raise PolicyError(f"{where}: unknown capabilit{'y' if len(unknown) == 1 else 'ies'} {names}")
    return frozenset(raw)


def _known_blocks() -> str:
    return ", ".join(_BLOCKS)


def _describe(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "a block"
    return json.dumps(value) if isinstance(value, str) else type(value).__name__


def _one_line(text: str) -> str:
    return " ".join(text.split())[:200]
