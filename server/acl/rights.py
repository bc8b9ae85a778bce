"""What each RPC needs, in one table, and the checks that apply it.

``RIGHTS`` maps every RPC of proto/drover/v1/api.proto, by ``"Service.Method"``, to a
``Need`` (tests/unit/test_acl_rights.py proves the table and the proto list the same RPCs,
and that every servicer method goes through the check). The rights follow Nomad's table
(its ``*_endpoint.go`` handlers):

==========================  ===============================================================
RPC                         needs (a management token passes every check)
==========================  ===============================================================
Jobs.Register               namespace of the job: submit-job or register-job
Jobs.Deregister             namespace: submit-job or deregister-job (purge: submit-job or purge-job)
Jobs.Plan                   namespace of the job: submit-job or plan-job
Jobs.Dispatch               namespace: dispatch-job or submit-job
Jobs.PeriodicForce          namespace: submit-job or force-periodic-job
Jobs.List                   list-jobs; results filtered to the namespaces that allow it
Jobs.Get/Versions/Summary   read-job, checked on the namespace of what is returned
Jobs.Revert                 namespace: submit-job or revert-job
Jobs.Scale                  namespace: scale-job or submit-job
Jobs.Validate               namespace of the job: read-job
Deployments.List/Get/Allocations  read-job, checked on the namespace of what is returned
Deployments.Promote/Pause/Fail    submit-job, or promote-/pause-/fail-deployment, on the
                            deployment's namespace (checked by the servicer once found:
                            the request names only the deployment)
Deployments.SetAllocHealth  the same with set-alloc-health-deployment
Evals.List, Allocs.List     read-job; results filtered per namespace
Services.List/Info          read-job, checked on the namespace of what is returned
Services.ClientInfo         no token: the node's secret, and an alloc of that node
Evals.Get, Allocs.Get       read-job on the object's own namespace (CVE-2019-16742)
Allocs.Stop/Restart/Signal  alloc-lifecycle on the alloc's namespace (checked by the
                            servicer once found, as for deployments)
Allocs.Logs                 read-logs on the alloc's namespace (likewise)
Events.Stream               read-job for Job/Allocation/Evaluation/Deployment events (each
                            event kept only if its namespace allows it), node read for Node
Nodes.List, Nodes.Get       node read
Nodes.UpdateDrain           node write
Nodes.UpdateEligibility     node write
Nodes.MetaRead              node read
Nodes.MetaApply             node write
Nodes.Register ...          no token: the node's secret (see NODE_SECRET below)
Operator.RaftPeers          operator read
Operator.StateDigest        operator read
Operator.Invariants         operator read
Operator.Metrics            agent read (this server's own metrics)
Operator.AgentInfo          agent read
Operator.ServerMembers      operator read
Operator.SchedulerGetConfig operator read
Operator.SchedulerSetConfig operator write
Operator.ReconcileSummaries operator write
Operator.SnapshotSave       operator write, or the operator capability snapshot-save
Operator.GarbageCollect     management, as Nomad's /v1/system/gc: it deletes history
                            every namespace's operators may still want
Operator.SnapshotRestore    management: a restore replaces the ACL tables too, so any
                            lesser right could make itself management with it
Operator.RaftJoin           management: a voter holds and rewrites every table
Operator.RaftRemovePeer     operator write (Nomad's raft remove-peer)
Operator.RaftTransferLeadership  operator write
ACL.Bootstrap               nothing: it works once (the FSM refuses a second bootstrap)
ACL.TokenSelf               any valid token
ACL.ListPolicies/GetPolicy  any valid token; a client token sees only its own policies
other ACL RPCs              management
==========================  ===============================================================

Namespaced reads are authorized on the namespace of each object returned, not on the
namespace the request names: a listing over every namespace passes the gate when some
namespace allows the capability, then each result is kept only if its own namespace does.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any, Final

from google.protobuf.message import Message

from drover.scheduler.structs import DEFAULT_NAMESPACE
from drover.server.acl.acl import ACL
from drover.server.acl.policy import POLICY_READ, POLICY_WRITE
from drover.server.errors import PermissionDeniedError

__all__ = [
    "NODE_SECRET_RPCS",
    "RIGHTS",
    "Need",
    "Scope",
    "check_request",
    "check_response",
    "need_for",
]


class Scope(Enum):
    NAMESPACE = "namespace"
    NODE = "node"
    AGENT = "agent"
    OPERATOR = "operator"
    MANAGEMENT = "management"
    # Any token that resolves (not anonymous).
    TOKEN = "token"
    # No token needed: ACL.Bootstrap, and the node RPCs of NODE_SECRET_RPCS.
    OPEN = "open"


@dataclass(frozen=True, slots=True)
class Need:
    """What one RPC needs.

    ``any_of``: for NAMESPACE, capabilities of which one suffices; for NODE, AGENT and
    OPERATOR, the level ("read" or "write"). ``namespace``: for a write, how to read the
    target namespace off the request. ``results``: for a read, the response fields whose
    objects carry the namespace they are checked against (a repeated field is filtered, a
    single one refused). ``alternative``: an operator capability that also suffices.
    ``when_purge``: the capabilities a purging Jobs.Deregister needs instead of ``any_of``.
    """

    scope: Scope
    any_of: tuple[str, ...] = ()
    namespace: Callable[[Any], str] | None = None
    results: tuple[str, ...] = ()
    alternative: str = ""
    when_purge: tuple[str, ...] = ()
    why: str = ""


def _ns(read: Callable[[Any], str]) -> Callable[[Any], str]:
    """The request's namespace, the empty one meaning "default" as the servicers read it."""
    return lambda request: read(request) or DEFAULT_NAMESPACE


def _write(*caps: str, namespace: Callable[[Any], str]) -> Need:
    return Need(Scope.NAMESPACE, caps, namespace=namespace)


def _read(*caps: str, results: tuple[str, ...]) -> Need:
    return Need(Scope.NAMESPACE, caps, results=results)


def _deployment_write(*caps: str) -> Need:
    """A write naming a deployment, not a namespace: the gate asks for ``caps`` in some
    namespace, server/api/deployments.py then on the deployment's own."""
    return Need(Scope.NAMESPACE, caps, why="the deployment's namespace is checked once it is found")


def _alloc_op(*caps: str) -> Need:
    """An RPC naming an alloc, not a namespace: the gate asks for ``caps`` in some
    namespace, server/api/evals_allocs.py then on the alloc's own."""
    return Need(Scope.NAMESPACE, caps, why="the alloc's namespace is checked once it is found")


def _level(scope: Scope, level: str, alternative: str = "") -> Need:
    return Need(scope, (level,), alternative=alternative)


# Client agents call these with the node's own secret in the request, not an ACL token
# (Nomad's AuthenticateClientOnly): a client agent holds no ACL token, and the node secret
# check (server/endpoints.py) is what stops one node from acting for another. They are the
# only token-exempt RPCs besides ACL.Bootstrap.
NODE_SECRET_RPCS: Final = frozenset(
    {
        "Nodes.Register",
        "Nodes.UpdateStatus",
        # UpdateStatus as a stream: each request on it is checked as one UpdateStatus.
        "Nodes.Heartbeat",
        "Nodes.GetClientAllocs",
        "Nodes.WatchClientAllocs",
        "Nodes.UpdateAllocs",
        "Nodes.Connect",
        "Services.ClientInfo",
    }
)
_NODE_SECRET: Final = Need(Scope.OPEN, why="a client agent's call, authenticated by the node's secret")

RIGHTS: Final[Mapping[str, Need]] = {
    "Jobs.Register": _write("submit-job", "register-job", namespace=_ns(lambda r: r.job.namespace)),
    "Jobs.Deregister": Need(
        Scope.NAMESPACE,
        ("submit-job", "deregister-job"),
        namespace=_ns(lambda r: r.namespace),
        when_purge=("submit-job", "purge-job"),
    ),
    "Jobs.Plan": _write("submit-job", "plan-job", namespace=_ns(lambda r: r.job.namespace)),
    "Jobs.Dispatch": _write("dispatch-job", "submit-job", namespace=_ns(lambda r: r.namespace)),
    "Jobs.PeriodicForce": _write("submit-job", "force-periodic-job", namespace=_ns(lambda r: r.namespace)),
    "Jobs.List": _read("list-jobs", results=("jobs", "summaries")),
    "Jobs.Get": _read("read-job", results=("job", "summary")),
    "Jobs.Versions": _read("read-job", results=("versions",)),
    "Jobs.Summary": _read("read-job", results=("summary",)),
    "Jobs.Revert": _write("submit-job", "revert-job", namespace=_ns(lambda r: r.namespace)),
    "Jobs.Scale": _write("scale-job", "submit-job", namespace=_ns(lambda r: r.namespace)),
    "Jobs.Validate": _write("read-job", namespace=_ns(lambda r: r.job.namespace)),
    "Deployments.List": _read("read-job", results=("deployments",)),
    "Services.List": _read("read-job", results=("services",)),
    "Services.Info": _read("read-job", results=("registrations",)),
    "Deployments.Get": _read("read-job", results=("deployment",)),
    "Deployments.Allocations": _read("read-job", results=("allocs",)),
    "Deployments.Promote": _deployment_write("submit-job", "promote-deployment"),
    "Deployments.Pause": _deployment_write("submit-job", "pause-deployment"),
    "Deployments.Fail": _deployment_write("submit-job", "fail-deployment"),
    "Deployments.SetAllocHealth": _deployment_write("submit-job", "set-alloc-health-deployment"),
    "Evals.List": _read("read-job", results=("evals",)),
    "Evals.Get": _read("read-job", results=("eval",)),
    "Allocs.List": _read("read-job", results=("allocs",)),
    "Allocs.Get": _read("read-job", results=("alloc",)),
    "Allocs.Stop": _alloc_op("alloc-lifecycle"),
    "Allocs.Restart": _alloc_op("alloc-lifecycle"),
    "Allocs.Signal": _alloc_op("alloc-lifecycle"),
    "Allocs.Logs": _alloc_op("read-logs"),
    "Events.Stream": Need(
        Scope.TOKEN, why="server/events/ keeps each event only if the token may read its topic and namespace"
    ),
    "Nodes.List": _level(Scope.NODE, POLICY_READ),
    "Nodes.Get": _level(Scope.NODE, POLICY_READ),
    "Nodes.UpdateDrain": _level(Scope.NODE, POLICY_WRITE),
    "Nodes.UpdateEligibility": _level(Scope.NODE, POLICY_WRITE),
    "Nodes.MetaRead": _level(Scope.NODE, POLICY_READ),
    "Nodes.MetaApply": _level(Scope.NODE, POLICY_WRITE),
    **dict.fromkeys(sorted(NODE_SECRET_RPCS), _NODE_SECRET),
    "Operator.RaftPeers": _level(Scope.OPERATOR, POLICY_READ),
    "Operator.StateDigest": _level(Scope.OPERATOR, POLICY_READ),
    "Operator.Invariants": _level(Scope.OPERATOR, POLICY_READ),
    "Operator.Metrics": _level(Scope.AGENT, POLICY_READ),
    "Operator.AgentInfo": _level(Scope.AGENT, POLICY_READ),
    "Operator.ServerMembers": _level(Scope.OPERATOR, POLICY_READ),
    "Operator.SchedulerGetConfig": _level(Scope.OPERATOR, POLICY_READ),
    "Operator.SchedulerSetConfig": _level(Scope.OPERATOR, POLICY_WRITE),
    "Operator.ReconcileSummaries": _level(Scope.OPERATOR, POLICY_WRITE),
    "Operator.SnapshotSave": _level(Scope.OPERATOR, POLICY_WRITE, alternative="snapshot-save"),
    "Operator.SnapshotRestore": Need(Scope.MANAGEMENT, why="a restore replaces the ACL tables"),
    "Operator.RaftJoin": Need(Scope.MANAGEMENT, why="a voter holds and can rewrite every table"),
    "Operator.RaftRemovePeer": _level(Scope.OPERATOR, POLICY_WRITE),
    "Operator.RaftTransferLeadership": _level(Scope.OPERATOR, POLICY_WRITE),
    "Operator.GarbageCollect": Need(
        Scope.MANAGEMENT, why="deletes every namespace's history, as Nomad's system gc"
    ),
    "ACL.Bootstrap": Need(Scope.OPEN, why="works once: the FSM refuses a second bootstrap"),
    "ACL.TokenSelf": Need(Scope.TOKEN),
    "ACL.ListPolicies": Need(Scope.TOKEN, why="the servicer shows a client token only its own policies"),
    "ACL.GetPolicy": Need(Scope.TOKEN, why="the servicer shows a client token only its own policies"),
    "ACL.UpsertPolicy": Need(Scope.MANAGEMENT),
    "ACL.DeletePolicy": Need(Scope.MANAGEMENT),
    "ACL.CreateToken": Need(Scope.MANAGEMENT),
    "ACL.DeleteToken": Need(Scope.MANAGEMENT),
    "ACL.ListTokens": Need(Scope.MANAGEMENT),
    "ACL.GetToken": Need(Scope.MANAGEMENT),
}


def need_for(service: str, method: str) -> Need:
    """The table's entry; a KeyError here means an RPC was added without deciding its rights."""
    return RIGHTS[f"{service}.{method}"]


def _denied(rpc: str, what: str) -> PermissionDeniedError:
    return PermissionDeniedError(f"Permission denied: {rpc} needs {what}")


def _any_of(caps: tuple[str, ...]) -> str:
    return " or ".join(caps)


def check_request(rpc: str, need: Need, acl: ACL, request: Message, *, anonymous: bool) -> None:
    """Refuse (``PermissionDeniedError``) what ``acl`` can not do before anything runs."""
    scope = need.scope
    if scope is Scope.OPEN or acl.management:
        return
    if scope is Scope.TOKEN:
        if anonymous:
            raise _denied(rpc, "an ACL token (-token or DROVER_TOKEN)")
        return
    if scope is Scope.MANAGEMENT:
        raise _denied(rpc, "a management token")
    if scope is Scope.NAMESPACE:
        caps = need.when_purge if need.when_purge and getattr(request, "purge", False) else need.any_of
        if need.namespace is not None:
            namespace = need.namespace(request)
            if not acl.allows_namespace(namespace, caps):
                raise _denied(rpc, f"{_any_of(caps)} on namespace {namespace!r}")
        elif not acl.allows_some_namespace(caps):
            raise _denied(rpc, f"{_any_of(caps)} on some namespace")
        return
    level = need.any_of[0]
    if acl.allows_level(scope.value, level):
        return
    if need.alternative and acl.allows_operator_capability(need.alternative):
        return
    extra = f" (or the operator capability {need.alternative})" if need.alternative else ""
    raise _denied(rpc, f'{scope.value} = "{level}"{extra}')


def check_response(rpc: str, need: Need, acl: ACL, response: Message) -> Message:
    """Keep only what ``acl`` may read of ``response``: objects of namespaces it may not read
    are dropped from lists, and a single such object refuses the whole call."""
    if not need.results or acl.management:
        return response
    caps = need.any_of
    for name in need.results:
        value = getattr(response, name)
        if hasattr(value, "add"):  # a repeated message field
            kept = [item for item in value if acl.allows_namespace(item.namespace, caps)]
            if len(kept) != len(value):
                del value[:]
                value.extend(kept)
        elif response.HasField(name) and not acl.allows_namespace(value.namespace, caps):
            raise _denied(rpc, f"{_any_of(caps)} on namespace {value.namespace!r}")
    return response
