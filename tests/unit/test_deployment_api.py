"""The Deployments servicer and Jobs.Revert/Scale/Validate, on a real FSM without gRPC.

Each servicer method is called unwrapped (below the rpc decorator's ACL, forwarding and
limits, which tests/unit/test_api_base.py and test_acl_rights.py cover) on a core whose
raft applies a proposal to the FSM at once. Bad input must be refused with the field named
and change nothing; unknown IDs are NOT_FOUND; refusals FAILED_PRECONDITION.
"""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import pytest

from drover.scheduler import validate
from drover.scheduler.structs import (
    ALLOC_CLIENT_RUNNING,
    DEPLOYMENT_DESC_AUTO_PROMOTION,
    DEPLOYMENT_DESC_PAUSED,
    DEPLOYMENT_STATUS_FAILED,
    DEPLOYMENT_STATUS_PAUSED,
    DEPLOYMENT_STATUS_RUNNING,
    TRIGGER_DEPLOYMENT_WATCHER,
    TRIGGER_JOB_REGISTER,
    TRIGGER_JOB_SCALING,
    Deployment,
    DeploymentState,
    Job,
    TaskGroup,
)
from drover.server.acl.acl import compile_acl
from drover.server.acl.policy import parse_policy
from drover.server.acl.resolve import Identity, acting_as
from drover.server.api.deployments import DeploymentsServicer
from drover.server.api.jobs import JobsServicer
from drover.server.codec import to_proto
from drover.server.endpoints import Endpoints
from drover.server.errors import ConflictError, NotFoundError, PermissionDeniedError, ValidationError
from drover.server.fsm import FSM, ApplyResult
from drover.server.snapshot import state_digest
from drover.server.state_store import StateStore, Txn
from drover.v1 import api_pb2, structs_pb2
from tests.fixtures import mock

NOW = mock.NOW
MIN = mock.MINUTE


class _Raft:
    """Applies what is proposed at the next index: the single-server case, without raft."""

    def __init__(self, fsm: FSM, store: StateStore) -> None:
        self.fsm = fsm
        self.store = store

    def propose(self, data: bytes, timeout: float) -> ApplyResult:
        return self.fsm.apply(data, self.store.index + 1)

    def leader_address(self) -> str:
        return "127.0.0.1:4647"


def _core() -> Any:
    store = StateStore()
    raft, clock, ids = _Raft(FSM(store), store), SimpleNamespace(now_ns=lambda: NOW), mock.Counter("id")
    return SimpleNamespace(
        store=store,
        raft=raft,
        clock=clock,
        ids=ids,
        cfg=SimpleNamespace(job_max_group_count=100),
        name="s1",
        endpoints=Endpoints(raft, store, clock, ids),
    )


def _seed(core: Any, fn: Any) -> None:
    txn = Txn(core.store.snapshot().tables, core.store.index + 1)
    fn(txn)
    core.store.commit(txn.commit(), txn.changes)


def _register(core: Any, job: Job) -> Job:
    response = _call(
        JobsServicer(core), "Register", api_pb2.JobRegisterRequest(job=to_proto(job, structs_pb2.Job()))
    )
    assert response.eval_id
    stored = core.store.snapshot().job(job.namespace, job.id)
    assert stored is not None
    return stored


def _call(servicer: Any, method: str, request: Any) -> Any:
    """The servicer's own method, below the rpc decorator."""
    return getattr(type(servicer), method).__wrapped__(servicer, request, None)


def _refused(core: Any, servicer: Any, method: str, request: Any, error: type[Exception], match: str) -> None:
    before = state_digest(core.store.snapshot().tables)
    with pytest.raises(error, match=match):
        _call(servicer, method, request)
    assert state_digest(core.store.snapshot().tables) == before, "a refused call changed the state"


@pytest.fixture
def core() -> Any:
    """Job "web" at version 1 (count 3; version 0 had count 2 and is stable), rolling out
    in running deployment d1 (auto_revert) with alloc a1; d0 is an old failed one."""
    c = _core()
    _register(c, replace(mock.job(id="web"), groups=(replace(mock.job().groups[0], count=2),)))
    _seed(c, lambda txn: txn.mark_version_stable(("default", "web"), 0))
    v1 = _register(c, replace(mock.job(id="web"), groups=(replace(mock.job().groups[0], count=3),)))
    assert v1.version == 1
    state = DeploymentState(auto_revert=True, progress_deadline_ns=10 * MIN, desired_total=3)

    def seed(txn: Txn) -> None:
        txn.put_deployment(
            Deployment(
                id="d0", job_id="web", job_version=0, status=DEPLOYMENT_STATUS_FAILED, create_index=txn.index
            )
        )
        txn.put_deployment(mock.deployment(v1, state, create_index=txn.index + 1))
        txn.put_alloc(
            mock.alloc(
                v1, mock.node(id="n1"), id="a1", deployment_id="d1", client_status=ALLOC_CLIENT_RUNNING
            )
        )
        txn.put_alloc(mock.alloc(v1, mock.node(id="n1"), 1, id="b1", deployment_id="d0"))

    _seed(c, seed)
    return c


# ---------------------------------------------------------------------------------------
# Deployments: reads


def test_list__job__newest_first(core: Any) -> None:
    response = _call(DeploymentsServicer(core), "List", api_pb2.DeploymentListRequest(job_id="web"))

    assert [d.id for d in response.deployments] == ["d1", "d0"]


def test_list__other_namespace__empty(core: Any) -> None:
    response = _call(DeploymentsServicer(core), "List", api_pb2.DeploymentListRequest(namespace="prod"))

    assert list(response.deployments) == []


def test_get_and_allocations__known__the_deployment_and_only_its_allocs(core: Any) -> None:
    servicer = DeploymentsServicer(core)

    got = _call(servicer, "Get", api_pb2.DeploymentGetRequest(deployment_id="d1"))
    allocs = _call(servicer, "Allocations", api_pb2.DeploymentGetRequest(deployment_id="d1"))

    assert got.deployment.status == DEPLOYMENT_STATUS_RUNNING
    assert [a.id for a in allocs.allocs] == ["a1"]


@pytest.mark.parametrize("method", ["Get", "Allocations"])
def test_reads__unknown_or_empty_id__not_found_or_required(core: Any, method: str) -> None:
    servicer = DeploymentsServicer(core)
    with pytest.raises(NotFoundError, match="deployment 'nope' not found"):
        _call(servicer, method, api_pb2.DeploymentGetRequest(deployment_id="nope"))
    with pytest.raises(ValidationError, match=r"^deployment_id: required$"):
        _call(servicer, method, api_pb2.DeploymentGetRequest())


# ---------------------------------------------------------------------------------------
# Deployments: writes


BAD_WRITES = [
    ("fail-no-id", "Fail", api_pb2.DeploymentFailRequest(), ValidationError, "^deployment_id: required$"),
    (
        "fail-unknown",
        "Fail",
        api_pb2.DeploymentFailRequest(deployment_id="d9"),
        NotFoundError,
        "'d9' not found",
    ),
    (
        "fail-terminal",
        "Fail",
        api_pb2.DeploymentFailRequest(deployment_id="d0"),
        ConflictError,
        "^Cannot fail terminal deployment$",
    ),
    (
        "pause-terminal",
        "Pause",
        api_pb2.DeploymentPauseRequest(deployment_id="d0", pause=True),
        ConflictError,
        "^Cannot pause terminal deployment$",
    ),
    (
        "resume-terminal",
        "Pause",
        api_pb2.DeploymentPauseRequest(deployment_id="d0"),
        ConflictError,
        "^Cannot resume terminal deployment$",
    ),
    (
        "promote-terminal",
        "Promote",
        api_pb2.DeploymentPromoteRequest(deployment_id="d0"),
        ConflictError,
        "^Cannot promote terminal deployment$",
    ),
    (
        "promote-unknown-group",
        "Promote",
        api_pb2.DeploymentPromoteRequest(deployment_id="d1", groups=["web", "db"]),
        ValidationError,
        r"^groups\[1\]: deployment d1 has no task group 'db'$",
    ),
    (
        "promote-no-healthy-canary",
        "Promote",
        api_pb2.DeploymentPromoteRequest(deployment_id="d1"),
        ConflictError,
        r'^Task group "web" has 0/1 healthy allocations$',
    ),
    (
        "health-nothing",
        "SetAllocHealth",
        api_pb2.DeploymentAllocHealthRequest(deployment_id="d1"),
        ValidationError,
        "^healthy_alloc_ids: at least one",
    ),
    (
        "health-other-deployments-alloc",
        "SetAllocHealth",
        api_pb2.DeploymentAllocHealthRequest(deployment_id="d1", healthy_alloc_ids=["a1", "b1"]),
        ValidationError,
        r"^healthy_alloc_ids\[1\]: alloc 'b1' is not part of deployment d1$",
    ),
    (
        "health-both",
        "SetAllocHealth",
        api_pb2.DeploymentAllocHealthRequest(
            deployment_id="d1", healthy_alloc_ids=["a1"], unhealthy_alloc_ids=["a1"]
        ),
        ValidationError,
        r"^unhealthy_alloc_ids\[0\]: alloc 'a1' is also listed as healthy$",
    ),
    (
        "health-unknown-alloc",
        "SetAllocHealth",
        api_pb2.DeploymentAllocHealthRequest(deployment_id="d1", unhealthy_alloc_ids=["zz"]),
        NotFoundError,
        "alloc 'zz' not found",
    ),
]


@pytest.mark.parametrize(
    ("method", "request_msg", "error", "match"), [c[1:] for c in BAD_WRITES], ids=[c[0] for c in BAD_WRITES]
)
def test_writes__bad_input__refused_naming_the_field_and_nothing_changes(
    core: Any, method: str, request_msg: Any, error: type[Exception], match: str
) -> None:
    if method == "Promote" and not request_msg.groups and request_msg.deployment_id == "d1":
        state = replace(core.store.snapshot().deployment("d1").task_groups["web"], desired_canaries=1)
        _seed(core, lambda txn: txn.put_deployment(replace(txn.deployment("d1"), task_groups={"web": state})))
    _refused(core, DeploymentsServicer(core), method, request_msg, error, match)


def test_pause_then_resume__status_moves_and_only_resume_has_an_eval(core: Any) -> None:
    servicer = DeploymentsServicer(core)

    paused = _call(servicer, "Pause", api_pb2.DeploymentPauseRequest(deployment_id="d1", pause=True))
    deployment = core.store.snapshot().deployment("d1")
    assert (deployment.status, deployment.status_description) == (
        DEPLOYMENT_STATUS_PAUSED,
        DEPLOYMENT_DESC_PAUSED,
    )
    assert paused.eval_id == ""

    resumed = _call(servicer, "Pause", api_pb2.DeploymentPauseRequest(deployment_id="d1", pause=False))
    assert core.store.snapshot().deployment("d1").status == DEPLOYMENT_STATUS_RUNNING
    ev = core.store.snapshot().eval(resumed.eval_id)
    assert ev is not None and ev.triggered_by == TRIGGER_DEPLOYMENT_WATCHER and ev.deployment_id == "d1"


def test_resume__only_auto_promote_canaries_left__says_the_watcher_promotes(core: Any) -> None:
    """Resume describes the deployment by the rule its creation used: a group promoted by
    hand no longer waits for anyone, so the watcher's auto-promotion is what is left."""
    d1 = core.store.snapshot().deployment("d1")
    by_hand = DeploymentState(desired_canaries=1, promoted=True, desired_total=3)
    auto = DeploymentState(desired_canaries=1, auto_promote=True, desired_total=2)
    _seed(core, lambda txn: txn.put_deployment(replace(d1, task_groups={"web": by_hand, "api": auto})))
    servicer = DeploymentsServicer(core)
    _call(servicer, "Pause", api_pb2.DeploymentPauseRequest(deployment_id="d1", pause=True))

    _call(servicer, "Pause", api_pb2.DeploymentPauseRequest(deployment_id="d1", pause=False))

    deployment = core.store.snapshot().deployment("d1")
    assert (deployment.status, deployment.status_description) == (
        DEPLOYMENT_STATUS_RUNNING,
        DEPLOYMENT_DESC_AUTO_PROMOTION,
    )


def test_client_health_report__one_watcher_eval_per_job_at_the_deployments_priority(core: Any) -> None:
    """The eval a health report adds is built as the operator RPCs build theirs."""
    d1 = core.store.snapshot().deployment("d1")
    _seed(core, lambda txn: txn.put_deployment(replace(d1, eval_priority=70)))
    core.endpoints.register_node(replace(mock.node(id="n1"), secret_id="secret-1"))
    report = structs_pb2.Allocation(id="a1", client_status=ALLOC_CLIENT_RUNNING, deployment_id="d1")
    report.deployment_status.health = "healthy"
    report.deployment_status.timestamp_ns = NOW

    result = core.endpoints.update_allocs([report], node_id="n1", secret_id="secret-1")

    evals = [e for e in core.store.snapshot().evals() if e.modify_index == result.index]
    assert [(e.triggered_by, e.deployment_id, e.job_id, e.priority) for e in evals] == [
        (TRIGGER_DEPLOYMENT_WATCHER, "d1", "web", 70)
    ]


def test_fail__auto_revert__reverts_to_the_stable_version_as_a_new_one(core: Any) -> None:
    response = _call(DeploymentsServicer(core), "Fail", api_pb2.DeploymentFailRequest(deployment_id="d1"))

    snap = core.store.snapshot()
    assert (
        snap.deployment("d1").status_description
        == "Deployment marked as failed - rolling back to job version 0"
    )
    assert (response.reverted, response.reverted_job_version) == (True, 0)
    job = snap.job("default", "web")
    assert (job.version, job.groups[0].count, job.stable) == (2, 2, False)
    assert snap.eval(response.eval_id) is not None


def test_set_alloc_health__unhealthy__fails_and_reverts(core: Any) -> None:
    response = _call(
        DeploymentsServicer(core),
        "SetAllocHealth",
        api_pb2.DeploymentAllocHealthRequest(deployment_id="d1", unhealthy_alloc_ids=["a1"]),
    )

    deployment = core.store.snapshot().deployment("d1")
    assert deployment.status == DEPLOYMENT_STATUS_FAILED
    assert deployment.status_description.startswith("Failed due to unhealthy allocations - rolling back")
    assert deployment.task_groups["web"].unhealthy_allocs == 1
    assert response.reverted


# ---------------------------------------------------------------------------------------
# Jobs.Revert, Jobs.Scale, Jobs.Validate


def test_revert__older_version__a_new_version_with_its_spec_and_an_eval(core: Any) -> None:
    response = _call(JobsServicer(core), "Revert", api_pb2.JobRevertRequest(job_id="web", job_version=0))

    job = core.store.snapshot().job("default", "web")
    assert (response.job_version, job.groups[0].count, job.stable) == (2, 2, False)
    ev = core.store.snapshot().eval(response.eval_id)
    assert ev is not None and ev.triggered_by == TRIGGER_JOB_REGISTER


BAD_REVERTS = [
    ("no-job", api_pb2.JobRevertRequest(), ValidationError, "^job_id: required$"),
    ("unknown-job", api_pb2.JobRevertRequest(job_id="nope"), NotFoundError, "job 'nope' not found"),
    (
        "current",
        api_pb2.JobRevertRequest(job_id="web", job_version=1),
        ConflictError,
        "can't revert to current version",
    ),
    (
        "unknown-version",
        api_pb2.JobRevertRequest(job_id="web", job_version=7),
        NotFoundError,
        "at version 7 not found",
    ),
    (
        "prior-mismatch",
        api_pb2.JobRevertRequest(job_id="web", job_version=0, enforce_prior_version=True, prior_version=4),
        ConflictError,
        "current job has version 1; enforcing version 4",
    ),
]


@pytest.mark.parametrize(
    ("request_msg", "error", "match"), [c[1:] for c in BAD_REVERTS], ids=[c[0] for c in BAD_REVERTS]
)
def test_revert__bad_input__refused(core: Any, request_msg: Any, error: type[Exception], match: str) -> None:
    _refused(core, JobsServicer(core), "Revert", request_msg, error, match)


def test_scale__active_deployment__refused(core: Any) -> None:
    _refused(
        core,
        JobsServicer(core),
        "Scale",
        api_pb2.JobScaleRequest(job_id="web", count=5),
        ConflictError,
        "^job scaling blocked due to active deployment$",
    )


def _without_active_deployment(core: Any) -> None:
    _seed(
        core, lambda txn: txn.put_deployment(replace(txn.deployment("d1"), status=DEPLOYMENT_STATUS_FAILED))
    )


def test_scale__only_group_implied__new_version_and_a_job_scaling_eval(core: Any) -> None:
    _without_active_deployment(core)

    response = _call(JobsServicer(core), "Scale", api_pb2.JobScaleRequest(job_id="web", count=5))

    job = core.store.snapshot().job("default", "web")
    assert (response.job_version, job.groups[0].count) == (2, 5)
    ev = core.store.snapshot().eval(response.eval_id)
    assert ev is not None and ev.triggered_by == TRIGGER_JOB_SCALING


BAD_SCALES = [
    # The register path's own checks: drover.scheduler.validate's error, INVALID_ARGUMENT at the API.
    (
        "negative",
        api_pb2.JobScaleRequest(job_id="web", count=-1),
        validate.ValidationError,
        r"^job.groups\[0\].count: must be >= 0, got -1$",
    ),
    (
        "over-the-limit",
        api_pb2.JobScaleRequest(job_id="web", count=101),
        validate.ValidationError,
        r"count: must be at most 100",
    ),
    (
        "unknown-group",
        api_pb2.JobScaleRequest(job_id="web", group="db", count=1),
        ValidationError,
        "^group: task group 'db' specified for scaling does not exist in job$",
    ),
    ("unknown-job", api_pb2.JobScaleRequest(job_id="nope", count=1), NotFoundError, "job 'nope' not found"),
    (
        "long-message",
        api_pb2.JobScaleRequest(job_id="web", count=1, message="m" * 100_000),
        ValidationError,
        "^message:",
    ),
]


@pytest.mark.parametrize(
    ("request_msg", "error", "match"), [c[1:] for c in BAD_SCALES], ids=[c[0] for c in BAD_SCALES]
)
def test_scale__bad_input__refused(core: Any, request_msg: Any, error: type[Exception], match: str) -> None:
    _without_active_deployment(core)
    _refused(core, JobsServicer(core), "Scale", request_msg, error, match)


def test_scale__several_groups_and_none_named__refused() -> None:
    core = _core()
    job = mock.job(id="two")
    _register(core, replace(job, groups=(job.groups[0], replace(job.groups[0], name="api"))))

    _refused(
        core,
        JobsServicer(core),
        "Scale",
        api_pb2.JobScaleRequest(job_id="two", count=1),
        ValidationError,
        "^group: required, job 'two' has 2 groups$",
    )


def test_validate__every_error_at_once_with_field_paths() -> None:
    job = mock.job(id="bad", priority=500)
    group = replace(job.groups[0], count=-1)
    bad = replace(job, groups=(group, TaskGroup(name="web", count=1)))

    response = _call(
        JobsServicer(_core()), "Validate", api_pb2.JobValidateRequest(job=to_proto(bad, structs_pb2.Job()))
    )

    assert len(response.errors) >= 3
    assert any(e.startswith("job.priority: ") for e in response.errors)
    assert any(e.startswith("job.groups[0].count: must be >= 0") for e in response.errors)
    assert any(e.startswith("job.groups[1]") for e in response.errors)


def test_validate__valid_job__no_errors_and_nothing_written() -> None:
    core = _core()

    response = _call(
        JobsServicer(core),
        "Validate",
        api_pb2.JobValidateRequest(job=to_proto(mock.job(), structs_pb2.Job())),
    )

    assert list(response.errors) == []
    assert core.store.index == 0


def test_validate__no_job__required() -> None:
    with pytest.raises(ValidationError, match=r"^job: required$"):
        _call(JobsServicer(_core()), "Validate", api_pb2.JobValidateRequest())


# ---------------------------------------------------------------------------------------
# ACLs: a deployment write is checked on the deployment's own namespace


def test_write__token_without_rights_in_the_deployments_namespace__denied(core: Any) -> None:
    _seed(core, lambda txn: txn.put_deployment(replace(txn.deployment("d1"), id="dp", namespace="prod")))
    writer = Identity(acl=compile_acl([parse_policy('namespace "default" { policy = "write" }')]))

    with acting_as(writer):
        _refused(
            core,
            DeploymentsServicer(core),
            "Fail",
            api_pb2.DeploymentFailRequest(deployment_id="dp"),
            PermissionDeniedError,
            r"^Permission denied: Deployments.Fail needs submit-job or fail-deployment on namespace 'prod'$",
        )
        _call(
            DeploymentsServicer(core), "Pause", api_pb2.DeploymentPauseRequest(deployment_id="d1", pause=True)
        )

    assert core.store.snapshot().deployment("d1").status == DEPLOYMENT_STATUS_PAUSED
