"""Nomad's policy HCL (server/acl/policy.py): what it grants, and every refusal naming its place."""

from __future__ import annotations

import pytest

from drover.server.acl.policy import (
    NAMESPACE_POLICIES,
    POLICY_READ,
    POLICY_WRITE,
    NamespaceRule,
    Policy,
    PolicyError,
    check_policy_name,
    parse_policy,
)

READ = NAMESPACE_POLICIES["read"]
WRITE = NAMESPACE_POLICIES["write"]

ACCEPTED = [
    (
        "namespace-read",
        'namespace "default" { policy = "read" }',
        Policy(namespaces=(NamespaceRule("default", READ),)),
    ),
    (
        "namespace-write-plus-explicit-capability",
        'namespace "default" {\n  policy = "write"\n  capabilities = ["alloc-node-exec"]\n}',
        Policy(namespaces=(NamespaceRule("default", WRITE | {"alloc-node-exec"}),)),
    ),
    (
        "namespace-capabilities-only",
        'namespace "prod-*" { capabilities = ["read-job", "list-jobs"] }',
        Policy(namespaces=(NamespaceRule("prod-*", frozenset({"read-job", "list-jobs"})),)),
    ),
    (
        "namespace-deny",
        'namespace "*" { policy = "deny" }',
        Policy(namespaces=(NamespaceRule("*", frozenset({"deny"})),)),
    ),
    (
        "scale",
        'namespace "default" { policy = "scale" }',
        Policy(namespaces=(NamespaceRule("default", NAMESPACE_POLICIES["scale"]),)),
    ),
    (
        "every-block",
        """
        # a comment
        namespace "default" { policy = "read" }
        namespace "batch" { policy = "write" }
        node { policy = "write" }
        agent { policy = "read" }
        operator {
          policy       = "read"
          capabilities = ["snapshot-save"]
        }
        """,
        Policy(
            namespaces=(NamespaceRule("default", READ), NamespaceRule("batch", WRITE)),
            node=POLICY_WRITE,
            agent=POLICY_READ,
            operator=POLICY_READ,
            operator_capabilities=frozenset({"snapshot-save"}),
        ),
    ),
    (
        "operator-capability-only",
        'operator { capabilities = ["snapshot-save"] }',
        Policy(operator_capabilities=frozenset({"snapshot-save"})),
    ),
    ("node-deny", 'node { policy = "deny" }', Policy(node="deny")),
]


@pytest.mark.parametrize(("text", "want"), [(t, w) for _, t, w in ACCEPTED], ids=[i for i, _, _ in ACCEPTED])
def test_parse_policy__valid__grants_what_it_says(text: str, want: Policy) -> None:
    assert parse_policy(text) == want


def test_parse_policy__write__is_read_plus_the_write_capabilities() -> None:
    assert READ < WRITE
    assert {"submit-job", "dispatch-job", "read-logs", "alloc-lifecycle"} <= WRITE
    # Named only explicitly, as in Nomad: write does not include them.
    assert not {"alloc-node-exec", "purge-job", "plan-job", "force-periodic-job"} & WRITE


REFUSED = [
    ("empty", "", "empty policy"),
    ("only-comments", "# nothing here\n", "empty policy"),
    ("syntax", 'namespace "a" {', "syntax error"),
    ("top-level-attribute", 'policy = "read"', 'unknown key "policy"'),
    ("unknown-block", 'plugin { policy = "read" }', 'unknown block "plugin"'),
    ("unlabelled-namespace", 'namespace { policy = "read" }', 'namespace "NAME"'),
    ("two-labels", 'namespace "a" "b" { policy = "read" }', 'namespace "NAME"'),
    ("bad-namespace-name", 'namespace "a b" { policy = "read" }', 'namespace "a b": not a namespace name'),
    ("unknown-namespace-policy", 'namespace "a" { policy = "admin" }', 'got "admin"'),
    (
        "unknown-capabilities",
        'namespace "a" { capabilities = ["read-job", "submit-jobs", "root"] }',
        'unknown capabilities "root", "submit-jobs"',
    ),
    ("unknown-namespace-key", 'namespace "a" {\n policy = "read"\n path = "x"\n}', 'unknown key "path"'),
    ("variables-block", 'namespace "a" { variables { path "*" { capabilities = ["read"] } } }', "variables"),
    ("namespace-without-rights", 'namespace "a" { }', 'namespace "a": needs policy or capabilities'),
    ("duplicate-key", 'namespace "a" {\n policy = "read"\n policy = "write"\n}', 'duplicate key "policy"'),
    (
        "duplicate-namespace",
        'namespace "a" { policy = "read" }\nnamespace "a" { policy = "write" }',
        'namespace "a": duplicate block',
    ),
    ("duplicate-node", 'node { policy = "read" }\nnode { policy = "write" }', "node: duplicate block"),
    ("node-label", 'node "n1" { policy = "read" }', "node block takes no label"),
    (
        "node-capabilities",
        'node { policy = "read"\n capabilities = ["x"] }',
        'node: unknown key "capabilities"',
    ),
    (
        "node-bad-level",
        'node { policy = "scale" }',
        'node: policy must be one of read, write, deny, got "scale"',
    ),
    ("agent-bad-level", 'agent { policy = "list" }', "agent: policy must be one of"),
    (
        "operator-unknown-capability",
        'operator { capabilities = ["raft-write"] }',
        'unknown capability "raft-write"',
    ),
    ("operator-empty", "operator { }", "operator: needs policy or capabilities"),
    ("policy-not-a-string", 'namespace "a" { policy = 3 }', "policy must be a string, got int"),
    ("bare-word", 'namespace "a" { policy = read }', 'expected a quoted string, got "read"'),
    ("interpolation", 'namespace "a" { policy = "${var.p}" }', "expected a quoted string"),
    ("capabilities-not-a-list", 'namespace "a" { capabilities = "read-job" }', "capabilities must be a list"),
    ("too-large", 'namespace "a" { policy = "read" }\n' + "#" * 70_000, "larger than"),
]


@pytest.mark.parametrize(("text", "message"), [(t, m) for _, t, m in REFUSED], ids=[i for i, _, _ in REFUSED])
def test_parse_policy__invalid__refused_naming_the_place(text: str, message: str) -> None:
    with pytest.raises(PolicyError) as caught:
        parse_policy(text)

    assert message in str(caught.value)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize("name", ["readonly", "ops-team", "a", "x" * 128])
def test_check_policy_name__valid__accepted(name: str) -> None:
    check_policy_name(name)


@pytest.mark.parametrize("name", ["", "has space", "under_score", "dot.ted", "x" * 129, "ünï"])
def test_check_policy_name__invalid__refused(name: str) -> None:
    with pytest.raises(PolicyError, match=r"^name: "):
        check_policy_name(name)


@pytest.mark.parametrize(
    "text",
    [
        'namespace "a" { capabilities = ' + "[" * 15000 + "]" * 15000 + " }",
        'namespace "a" { policy = ' + "(" * 15000 + "1" + ")" * 15000 + " }",
    ],
    ids=["lists", "parentheses"],
)
def test_parse_policy__deep_nesting__one_line_refusal_not_a_crash(text: str) -> None:
    with pytest.raises(PolicyError, match=r"^rules: nested too deeply to read$"):
        parse_policy(text)
