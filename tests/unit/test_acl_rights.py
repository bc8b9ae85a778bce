"""The RPC -> rights table (server/acl/rights.py), the compiled ACL, and the checks on real messages."""

from __future__ import annotations

import pytest

from drover.server.acl.acl import ACL, DENY_ALL, MANAGEMENT, compile_acl
from drover.server.acl.policy import parse_policy
from drover.server.acl.rights import NODE_SECRET_RPCS, RIGHTS, Scope, check_request, check_response, need_for
from drover.server.api.acl import ACLServicer
from drover.server.api.deployments import DeploymentsServicer
from drover.server.api.evals_allocs import AllocsServicer, EvalsServicer
from drover.server.api.events import EventsServicer
from drover.server.api.jobs import JobsServicer
from drover.server.api.nodes import NodesServicer
from drover.server.api.operator import OperatorServicer
from drover.server.api.services import ServicesServicer
from drover.server.errors import PermissionDeniedError
from drover.v1 import api_pb2, structs_pb2

SERVICERS = {
    "Jobs": JobsServicer,
    "Nodes": NodesServicer,
    "Evals": EvalsServicer,
    "Allocs": AllocsServicer,
    "Operator": OperatorServicer,
    "ACL": ACLServicer,
    "Deployments": DeploymentsServicer,
    "Events": EventsServicer,
    "Services": ServicesServicer,
}
PROTO_RPCS = sorted(
    f"{service.name}.{method.name}"
    for service in api_pb2.DESCRIPTOR.services_by_name.values()
    for method in service.methods
)


def acl_of(*texts: str) -> ACL:
    return compile_acl(parse_policy(t) for t in texts)


# ---------------------------------------------------------------------------------------
# The table covers the API exactly


def test_rights__table__lists_exactly_the_rpcs_of_api_proto() -> None:
    assert sorted(RIGHTS) == PROTO_RPCS


def test_rights__every_service__has_a_servicer_here() -> None:
    assert sorted(SERVICERS) == sorted(api_pb2.DESCRIPTOR.services_by_name)


@pytest.mark.parametrize("rpc", PROTO_RPCS)
def test_rights__every_servicer_method__goes_through_the_check_or_is_a_node_rpc(rpc: str) -> None:
    service, method = rpc.split(".")
    implementation = getattr(SERVICERS[service], method)
    # The rpc decorator (server/api/_base.py) is where the check runs; functools.wraps marks it.
    decorated = hasattr(implementation, "__wrapped__")
    assert decorated or rpc in NODE_SECRET_RPCS, f"{rpc} is neither decorated with @rpc nor a node RPC"


def _carries_a_node_secret(rpc: str) -> bool:
    """Whether ``rpc``'s request holds a node's secret_id (at its top level, or in the Node it
    registers): what a client agent proves itself with instead of an ACL token. Read from
    api.proto, so the exempt set is checked against the messages, not against a copy of it."""
    service, method = rpc.split(".")
    request = api_pb2.DESCRIPTOR.services_by_name[service].methods_by_name[method].input_type
    return "secret_id" in request.fields_by_name or any(
        field.message_type == structs_pb2.Node.DESCRIPTOR for field in request.fields
    )


def test_rights__token_exempt_rpcs__are_the_client_agents_node_rpcs_and_bootstrap() -> None:
    exempt = sorted(rpc for rpc, need in RIGHTS.items() if need.scope is Scope.OPEN)
    # Pinned: widening what a node's secret opens without an ACL token is a security
    # decision, so it takes an edit here, not only in server/acl/rights.py.
    assert {
        "Nodes.Register",
        "Nodes.UpdateStatus",
        "Nodes.Heartbeat",
        "Nodes.GetClientAllocs",
        "Nodes.WatchClientAllocs",
        "Nodes.UpdateAllocs",
        "Nodes.Connect",
        "Services.ClientInfo",
    } == NODE_SECRET_RPCS
    # And derived: every RPC whose request carries a node secret is in the set, no other.
    assert {rpc for rpc in PROTO_RPCS if _carries_a_node_secret(rpc)} == NODE_SECRET_RPCS
    assert exempt == sorted({*NODE_SECRET_RPCS, "ACL.Bootstrap"})
    assert all(RIGHTS[rpc].why for rpc in exempt), "every exemption says why"


def test_rights__operator_writes__need_operator_write_or_management() -> None:
    assert need_for("Operator", "ReconcileSummaries").any_of == ("write",)
    assert need_for("Operator", "SnapshotSave").any_of == ("write",)
    assert need_for("Operator", "SnapshotRestore").scope is Scope.MANAGEMENT
    assert need_for("Operator", "GarbageCollect").scope is Scope.MANAGEMENT
    assert need_for("Operator", "RaftJoin").scope is Scope.MANAGEMENT
    assert need_for("Operator", "RaftRemovePeer").any_of == ("write",)
    assert need_for("Operator", "RaftTransferLeadership").any_of == ("write",)


def test_rights__unknown_rpc__has_no_default() -> None:
    with pytest.raises(KeyError):
        need_for("Jobs", "Teleport")


# ---------------------------------------------------------------------------------------
# Compiling policies (Nomad's NewACL)


def test_compile__union_of_policies__capabilities_add_up() -> None:
    acl = acl_of(
        'namespace "default" { policy = "read" }', 'namespace "default" { capabilities = ["submit-job"] }'
    )

    assert acl.allows_namespace("default", ["read-job"])
    assert acl.allows_namespace("default", ["submit-job"])
    assert not acl.allows_namespace("default", ["dispatch-job"])


def test_compile__deny_in_any_policy__wins_over_write() -> None:
    acl = acl_of('namespace "default" { policy = "write" }', 'namespace "default" { policy = "deny" }')

    assert not acl.allows_namespace("default", ["read-job"])
    assert not acl.allows_some_namespace(["read-job"])


def test_compile__exact_name__beats_a_glob() -> None:
    acl = acl_of('namespace "*" { policy = "write" }\nnamespace "prod" { policy = "read" }')

    assert not acl.allows_namespace("prod", ["submit-job"])
    assert acl.allows_namespace("prod", ["read-job"])
    assert acl.allows_namespace("dev", ["submit-job"])


def test_compile__closest_glob__wins_and_globs_do_not_union() -> None:
    acl = acl_of('namespace "*" { policy = "write" }\nnamespace "prod-*" { policy = "deny" }')

    assert not acl.allows_namespace("prod-eu", ["read-job"])
    assert acl.allows_namespace("dev-eu", ["read-job"])


def test_compile__levels__strongest_wins_and_deny_is_strongest() -> None:
    assert acl_of('node { policy = "read" }', 'node { policy = "write" }').allows_level("node", "write")
    denied = acl_of('node { policy = "write" }', 'node { policy = "deny" }')
    assert not denied.allows_level("node", "read")
    read_only = acl_of('operator { policy = "read" }')
    assert read_only.allows_level("operator", "read")
    assert not read_only.allows_level("operator", "write")


def test_compile__no_policies__grants_nothing() -> None:
    # CVE-2023-1299: an identity without policies must never be management.
    empty = compile_acl([])
    assert not empty.management
    assert not empty.allows_some_namespace(["read-job"])
    assert not empty.allows_level("node", "read")
    assert not DENY_ALL.allows_level("agent", "read")


def test_compile__operator_deny__drops_operator_capabilities() -> None:
    acl = acl_of('operator { capabilities = ["snapshot-save"] }', 'operator { policy = "deny" }')
    assert not acl.allows_operator_capability("snapshot-save")


# ---------------------------------------------------------------------------------------
# The checks, on the requests and responses the servicers see

READ_DEFAULT = 'namespace "default" { policy = "read" }'
WRITE_DEFAULT = 'namespace "default" { policy = "write" }'
NODE_READ = 'node { policy = "read" }'
OPERATOR_READ = 'operator { policy = "read" }'
OPERATOR_WRITE = 'operator { policy = "write" }'
SNAPSHOT_SAVE = 'operator { capabilities = ["snapshot-save"] }'


def _job(namespace: str = "default") -> structs_pb2.Job:
    return structs_pb2.Job(id="web", namespace=namespace)


CHECKS = [
    ("register-with-write", "Jobs.Register", WRITE_DEFAULT, api_pb2.JobRegisterRequest(job=_job()), True),
    ("register-with-read", "Jobs.Register", READ_DEFAULT, api_pb2.JobRegisterRequest(job=_job()), False),
    (
        "register-other-namespace",
        "Jobs.Register",
        WRITE_DEFAULT,
        api_pb2.JobRegisterRequest(job=_job("prod")),
        False,
    ),
    (
        "register-fine-grained",
        "Jobs.Register",
        'namespace "default" { capabilities = ["register-job"] }',
        api_pb2.JobRegisterRequest(job=_job()),
        True,
    ),
    (
        "register-empty-namespace-is-default",
        "Jobs.Register",
        WRITE_DEFAULT,
        api_pb2.JobRegisterRequest(job=_job("")),
        True,
    ),
    (
        "stop-with-deregister-job",
        "Jobs.Deregister",
        'namespace "default" { capabilities = ["deregister-job"] }',
        api_pb2.JobDeregisterRequest(job_id="web"),
        True,
    ),
    (
        "purge-needs-purge-job",
        "Jobs.Deregister",
        'namespace "default" { capabilities = ["deregister-job"] }',
        api_pb2.JobDeregisterRequest(job_id="web", purge=True),
        False,
    ),
    (
        "purge-with-purge-job",
        "Jobs.Deregister",
        'namespace "default" { capabilities = ["purge-job"] }',
        api_pb2.JobDeregisterRequest(job_id="web", purge=True),
        True,
    ),
    ("plan-with-read", "Jobs.Plan", READ_DEFAULT, api_pb2.JobPlanRequest(job=_job()), False),
    ("dispatch-with-write", "Jobs.Dispatch", WRITE_DEFAULT, api_pb2.JobDispatchRequest(job_id="p"), True),
    ("list-with-read", "Jobs.List", READ_DEFAULT, api_pb2.JobListRequest(), True),
    ("list-with-node-read", "Jobs.List", NODE_READ, api_pb2.JobListRequest(), False),
    ("node-list-with-node-read", "Nodes.List", NODE_READ, api_pb2.NodeListRequest(), True),
    ("drain-with-node-read", "Nodes.UpdateDrain", NODE_READ, api_pb2.NodeUpdateDrainRequest(), False),
    ("peers-with-operator-read", "Operator.RaftPeers", OPERATOR_READ, api_pb2.RaftPeersRequest(), True),
    ("save-with-operator-read", "Operator.SnapshotSave", OPERATOR_READ, api_pb2.SnapshotSaveRequest(), False),
    (
        "save-with-operator-write",
        "Operator.SnapshotSave",
        OPERATOR_WRITE,
        api_pb2.SnapshotSaveRequest(),
        True,
    ),
    ("save-with-snapshot-save", "Operator.SnapshotSave", SNAPSHOT_SAVE, api_pb2.SnapshotSaveRequest(), True),
    (
        "restore-with-operator-write",
        "Operator.SnapshotRestore",
        OPERATOR_WRITE,
        api_pb2.SnapshotRestoreRequest(),
        False,
    ),
    (
        "system-gc-with-operator-write",
        "Operator.GarbageCollect",
        OPERATOR_WRITE,
        api_pb2.SystemGCRequest(),
        False,
    ),
    (
        "join-with-operator-write",
        "Operator.RaftJoin",
        OPERATOR_WRITE,
        api_pb2.RaftJoinRequest(),
        False,
    ),
    (
        "remove-peer-with-operator-read",
        "Operator.RaftRemovePeer",
        OPERATOR_READ,
        api_pb2.RaftRemovePeerRequest(),
        False,
    ),
    (
        "remove-peer-with-operator-write",
        "Operator.RaftRemovePeer",
        OPERATOR_WRITE,
        api_pb2.RaftRemovePeerRequest(),
        True,
    ),
    (
        "transfer-with-operator-write",
        "Operator.RaftTransferLeadership",
        OPERATOR_WRITE,
        api_pb2.RaftTransferLeadershipRequest(),
        True,
    ),
    (
        "reconcile-with-operator-read",
        "Operator.ReconcileSummaries",
        OPERATOR_READ,
        api_pb2.ReconcileSummariesRequest(),
        False,
    ),
    (
        "metrics-with-agent-read",
        "Operator.Metrics",
        'agent { policy = "read" }',
        api_pb2.MetricsRequest(),
        True,
    ),
    (
        "logs-with-read-logs",
        "Allocs.Logs",
        'namespace "default" { capabilities = ["read-logs"] }',
        api_pb2.AllocLogsRequest(),
        True,
    ),
    ("logs-with-node-read", "Allocs.Logs", NODE_READ, api_pb2.AllocLogsRequest(), False),
    ("restart-with-read", "Allocs.Restart", READ_DEFAULT, api_pb2.AllocRestartRequest(), False),
    (
        "signal-with-alloc-lifecycle",
        "Allocs.Signal",
        'namespace "default" { capabilities = ["alloc-lifecycle"] }',
        api_pb2.AllocSignalRequest(),
        True,
    ),
    ("meta-read-with-node-read", "Nodes.MetaRead", NODE_READ, api_pb2.NodeMetaReadRequest(), True),
    ("meta-apply-with-node-read", "Nodes.MetaApply", NODE_READ, api_pb2.NodeMetaApplyRequest(), False),
    ("token-create-with-write", "ACL.CreateToken", WRITE_DEFAULT, api_pb2.ACLTokenCreateRequest(), False),
    ("self-with-any-token", "ACL.TokenSelf", NODE_READ, api_pb2.ACLTokenSelfRequest(), True),
    # Any token may open a stream; each event is then kept only if the token may read it.
    ("events-with-any-token", "Events.Stream", NODE_READ, api_pb2.EventStreamRequest(), True),
]


@pytest.mark.parametrize(
    ("rpc", "rules", "request_msg", "allowed"),
    [c[1:] for c in CHECKS],
    ids=[c[0] for c in CHECKS],
)
def test_check_request__client_token__allowed_only_with_the_right(
    rpc: str, rules: str, request_msg: object, allowed: bool
) -> None:
    need = RIGHTS[rpc]
    acl = acl_of(rules)

    if allowed:
        check_request(rpc, need, acl, request_msg, anonymous=False)  # type: ignore[arg-type]
    else:
        with pytest.raises(PermissionDeniedError, match=rf"^Permission denied: {rpc} needs "):
            check_request(rpc, need, acl, request_msg, anonymous=False)  # type: ignore[arg-type]


@pytest.mark.parametrize("rpc", sorted(r for r, n in RIGHTS.items() if n.scope is not Scope.OPEN))
def test_check_request__anonymous_without_policy__refused_everywhere_but_open_rpcs(rpc: str) -> None:
    service, method = rpc.split(".")
    request_cls = getattr(
        api_pb2, api_pb2.DESCRIPTOR.services_by_name[service].methods_by_name[method].input_type.name
    )
    with pytest.raises(PermissionDeniedError):
        check_request(rpc, RIGHTS[rpc], DENY_ALL, request_cls(), anonymous=True)


@pytest.mark.parametrize("rpc", PROTO_RPCS)
def test_check_request__management__allowed_everywhere(rpc: str) -> None:
    service, method = rpc.split(".")
    request_cls = getattr(
        api_pb2, api_pb2.DESCRIPTOR.services_by_name[service].methods_by_name[method].input_type.name
    )
    check_request(rpc, RIGHTS[rpc], MANAGEMENT, request_cls(), anonymous=False)


def test_check_response__listing__keeps_only_readable_namespaces() -> None:
    response = api_pb2.JobListResponse(
        jobs=[_job("default"), _job("prod"), _job("default")],
        summaries=[
            structs_pb2.JobSummary(job_id="web", namespace="default"),
            structs_pb2.JobSummary(job_id="web", namespace="prod"),
            structs_pb2.JobSummary(job_id="web", namespace="default"),
        ],
    )

    check_response("Jobs.List", RIGHTS["Jobs.List"], acl_of(READ_DEFAULT), response)

    assert [j.namespace for j in response.jobs] == ["default", "default"]
    assert [s.namespace for s in response.summaries] == ["default", "default"]


def test_check_response__single_object_of_another_namespace__refused() -> None:
    response = api_pb2.AllocGetResponse(alloc=structs_pb2.Allocation(id="a1", namespace="prod"))

    with pytest.raises(PermissionDeniedError, match="read-job on namespace 'prod'"):
        check_response("Allocs.Get", RIGHTS["Allocs.Get"], acl_of(READ_DEFAULT), response)


def test_check_response__management__sees_everything() -> None:
    response = api_pb2.EvalListResponse(evals=[structs_pb2.Evaluation(id="e1", namespace="prod")])

    check_response("Evals.List", RIGHTS["Evals.List"], MANAGEMENT, response)

    assert len(response.evals) == 1


def test_rights__service_reads__need_read_job_and_keep_only_readable_namespaces() -> None:
    need = need_for("Services", "List")
    assert (need.scope, need.any_of) == (Scope.NAMESPACE, ("read-job",))
    acl = acl_of('namespace "web" { policy = "read" }')
    listing = api_pb2.ServiceListResponse()
    listing.services.add(namespace="web", service_name="api")
    listing.services.add(namespace="billing", service_name="ledger")
    kept = check_response("Services.List", need, acl, listing)
    assert isinstance(kept, api_pb2.ServiceListResponse)
    assert [s.service_name for s in kept.services] == ["api"]
    info = api_pb2.ServiceInfoResponse()
    info.registrations.add(namespace="billing", service_name="ledger", alloc_id="a1")
    info.registrations.add(namespace="web", service_name="ledger", alloc_id="a2")
    kept_info = check_response("Services.Info", need_for("Services", "Info"), acl, info)
    assert isinstance(kept_info, api_pb2.ServiceInfoResponse)
    assert [r.alloc_id for r in kept_info.registrations] == ["a2"]
