"""A token's rights: its policies compiled into one ``ACL`` that answers "may it do X?".

Compiling follows Nomad's ``acl.NewACL``:

* capabilities of every policy are unioned per namespace name, and a ``deny`` wins: it
  empties that name's set, whatever another policy grants;
* node, agent and operator levels take the strongest, with deny strongest of all
  (deny > write > read);
* a namespace name with ``*`` is a glob. An exact name always beats any glob; among the
  globs that match, the closest (the smallest length difference, ``*`` counted) wins, and
  globs are not unioned with each other;
* an empty set of policies grants nothing (CVE-2023-1299: an identity without policies was
  once treated as management). Only a management token is management.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Final

from drover.server.acl.policy import CAP_DENY, POLICY_DENY, POLICY_READ, POLICY_WRITE, Policy

__all__ = ["ACL", "DENY_ALL", "MANAGEMENT", "compile_acl"]

# Higher wins when policies are merged.
_STRENGTH: Final = {"": 0, POLICY_READ: 1, POLICY_WRITE: 2, POLICY_DENY: 3}
# What a level allows: read is allowed by read or write, write only by write.
_ALLOWS: Final = {POLICY_READ: (POLICY_READ, POLICY_WRITE), POLICY_WRITE: (POLICY_WRITE,)}


@dataclass(frozen=True, slots=True)
class ACL:
    """Compiled rights. Build with ``compile_acl``; ``MANAGEMENT`` and ``DENY_ALL`` are fixed."""

    management: bool = False
    # Exact namespace names and globs, each with its (merged) capabilities.
    exact: Mapping[str, frozenset[str]] = field(default_factory=dict)
    globs: tuple[tuple[str, frozenset[str]], ...] = ()
    node: str = ""
    agent: str = ""
    operator: str = ""
    operator_capabilities: frozenset[str] = frozenset()

    def namespace_capabilities(self, namespace: str) -> frozenset[str]:
        """What this ACL may do in ``namespace`` (empty when denied or not granted)."""
        caps = self.exact.get(namespace)
        if caps is None:
            caps = _closest_glob(self.globs, namespace)
        return frozenset() if CAP_DENY in caps else caps

    def allows_namespace(self, namespace: str, any_of: Iterable[str]) -> bool:
        if self.management:
            return True
        caps = self.namespace_capabilities(namespace)
        return any(c in caps for c in any_of)

    def allows_some_namespace(self, any_of: Iterable[str]) -> bool:
        """Whether some namespace allows one of ``any_of``: the gate before a listing over
        every namespace, whose results are then filtered one by one."""
        if self.management:
            return True
        wanted = tuple(any_of)
        rules = (*self.exact.values(), *(caps for _glob, caps in self.globs))
        return any(CAP_DENY not in caps and any(c in caps for c in wanted) for caps in rules)

    def allows_level(self, area: str, level: str) -> bool:
        """``area`` is node, agent or operator; ``level`` read or write."""
        if self.management:
            return True
        have: str = getattr(self, area)
        return have in _ALLOWS[level]

    def allows_operator_capability(self, capability: str) -> bool:
        if self.management:
            return True
        return self.operator != POLICY_DENY and capability in self.operator_capabilities


MANAGEMENT: Final = ACL(management=True)
DENY_ALL: Final = ACL()


def _closest_glob(globs: tuple[tuple[str, frozenset[str]], ...], name: str) -> frozenset[str]:
    best: tuple[int, str] | None = None
    found: frozenset[str] = frozenset()
    for pattern, caps in globs:
        if not fnmatch.fnmatchcase(name, pattern):
            continue
        rank = (abs(len(name) - len(pattern)), pattern)
        if best is None or rank < best:
            best, found = rank, caps
    return found


def _stronger(a: str, b: str) -> str:
    return a if _STRENGTH[a] >= _STRENGTH[b] else b


def compile_acl(policies: Iterable[Policy]) -> ACL:
    """One ACL from a token's policies (Nomad's union, deny wins)."""
    merged: dict[str, frozenset[str]] = {}
    node = agent = operator = ""
    operator_caps: frozenset[str] = frozenset()
    for policy in policies:
        for rule in policy.namespaces:
            caps = merged.get(rule.name, frozenset())
            merged[rule.name] = (
                frozenset({CAP_DENY}) if rule.denies or CAP_DENY in caps else caps | rule.capabilities
            )
        node = _stronger(node, policy.node)
        agent = _stronger(agent, policy.agent)
        operator = _stronger(operator, policy.operator)
        operator_caps |= policy.operator_capabilities
    exact = {name: caps for name, caps in merged.items() if "*" not in name}
    globs = tuple(sorted((name, caps) for name, caps in merged.items() if "*" in name))
    return ACL(
        exact=exact,
        globs=globs,
        node=node,
        agent=agent,
        operator=operator,
        operator_capabilities=frozenset() if operator == POLICY_DENY else operator_caps,
    )
