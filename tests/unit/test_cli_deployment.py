"""``drover deployment`` and the job lifecycle commands (``history``, ``revert``, ``scale``,
``inspect``, ``validate``, ``deployments``, and ``run`` following a deployment) against an
IN-PROCESS FAKE gRPC server (not the real drover server), plus the pure formatting they
share (the per-group table, the -json shape, version diffs).

``FakeDrover`` below serves scripted answers for the Jobs, Evals, Allocs and Deployments
services and records every request. A scripted deployment moves one state per Get, with a
new index each time, the way a blocking query returns when the deployment changes. The
real servicers are tested elsewhere; tests/cluster/test_job_lifecycle.py runs these
commands against real servers and a real client agent.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf.message import Message

from drover.cli import main
from drover.cli._deployments import deployment_json, group_table
from drover.cli._jobdiff import ABSENT, diff_jobs, fmt_value
from drover.v1 import api_pb2, api_pb2_grpc, structs_pb2
from tests.fixtures.fake_grpc import run, serving_fake

DEP_ID = "d3e10000-0000-4000-8000-000000000001"
DEP_ID_2 = "d3e12222-0000-4000-8000-000000000002"
ROLLBACK_ID = "0b0b0000-0000-4000-8000-000000000003"
EVAL_ID = "e7a10000-0000-4000-8000-000000000001"
ALLOC_A = "a1100000-0000-4000-8000-00000000000a"
ALLOC_B = "a2200000-0000-4000-8000-00000000000b"
SUBMIT_NS = 1_700_000_000_000_000_000
DEADLINE_NS = 1_700_000_600_000_000_000


# ---------------------------------------------------------------------------------------
# The in-process fake


@dataclass
class FakeDrover:
    """IN-PROCESS FAKE drover server state: scripted answers plus a request log."""

    requests: list[tuple[str, Message]] = field(default_factory=list)
    jobs: dict[str, structs_pb2.Job] = field(default_factory=dict)
    versions: dict[str, list[structs_pb2.Job]] = field(default_factory=dict)
    # The eval every write returns; Evals.Get answers it as it is.
    eval: structs_pb2.Evaluation = field(
        default_factory=lambda: structs_pb2.Evaluation(
            id=EVAL_ID, job_id="web", status="complete", create_index=10
        )
    )
    # deployment ID -> the states successive Gets return (the last one then sticks).
    deployment_script: dict[str, list[structs_pb2.Deployment]] = field(default_factory=dict)
    # Listed beside the scripted ones (say, a rollback's deployment).
    extra_deployments: list[structs_pb2.Deployment] = field(default_factory=list)
    deployment_allocs: list[structs_pb2.Allocation] = field(default_factory=list)
    validate_response: api_pb2.JobValidateResponse = field(default_factory=api_pb2.JobValidateResponse)
    write_response: api_pb2.DeploymentWriteResponse = field(
        default_factory=lambda: api_pb2.DeploymentWriteResponse(eval_id=EVAL_ID)
    )
    index: int = 100

    def enter(self, method: str, request: Message) -> None:
        self.requests.append((method, request))

    def calls(self, method: str) -> list[Any]:
        return [req for name, req in self.requests if name == method]

    def current(self, deployment_id: str) -> structs_pb2.Deployment | None:
        script = self.deployment_script.get(deployment_id)
        if script:
            return script[0]
        return next((d for d in self.extra_deployments if d.id == deployment_id), None)


class _Jobs(api_pb2_grpc.JobsServicer):
    def __init__(self, fake: FakeDrover) -> None:
        self.fake = fake

    def Register(self, request: Any, context: grpc.ServicerContext) -> api_pb2.JobRegisterResponse:
        self.fake.enter("Jobs.Register", request)
        return api_pb2.JobRegisterResponse(eval_id=EVAL_ID, version=1)

    def Get(self, request: Any, context: grpc.ServicerContext) -> api_pb2.JobGetResponse:
        self.fake.enter("Jobs.Get", request)
        job = self.fake.jobs.get(request.job_id)
        if job is None:
            context.abort(grpc.StatusCode.NOT_FOUND, f'job "{request.job_id}" not found')
        return api_pb2.JobGetResponse(meta=api_pb2.QueryMeta(index=5), job=job)

    def List(self, request: Any, context: grpc.ServicerContext) -> api_pb2.JobListResponse:
        self.fake.enter("Jobs.List", request)
        jobs = [j for j in self.fake.jobs.values() if j.id.startswith(request.prefix)]
        return api_pb2.JobListResponse(meta=api_pb2.QueryMeta(index=5), jobs=jobs)

    def Versions(self, request: Any, context: grpc.ServicerContext) -> api_pb2.JobVersionsResponse:
        self.fake.enter("Jobs.Versions", request)
        return api_pb2.JobVersionsResponse(versions=self.fake.versions.get(request.job_id, []))

    def Revert(self, request: Any, context: grpc.ServicerContext) -> api_pb2.JobRevertResponse:
        self.fake.enter("Jobs.Revert", request)
        return api_pb2.JobRevertResponse(eval_id=EVAL_ID, job_version=7)

    def Scale(self, request: Any, context: grpc.ServicerContext) -> api_pb2.JobScaleResponse:
        self.fake.enter("Jobs.Scale", request)
        return api_pb2.JobScaleResponse(eval_id=EVAL_ID, job_version=8)

    def Validate(self, request: Any, context: grpc.ServicerContext) -> api_pb2.JobValidateResponse:
        self.fake.enter("Jobs.Validate", request)
        return self.fake.validate_response


class _Evals(api_pb2_grpc.EvalsServicer):
    def __init__(self, fake: FakeDrover) -> None:
        self.fake = fake

    def Get(self, request: Any, context: grpc.ServicerContext) -> api_pb2.EvalGetResponse:
        self.fake.enter("Evals.Get", request)
        return api_pb2.EvalGetResponse(meta=api_pb2.QueryMeta(index=11), eval=self.fake.eval)


class _Allocs(api_pb2_grpc.AllocsServicer):
    def __init__(self, fake: FakeDrover) -> None:
        self.fake = fake

    def List(self, request: Any, context: grpc.ServicerContext) -> api_pb2.AllocListResponse:
        self.fake.enter("Allocs.List", request)
        return api_pb2.AllocListResponse(meta=api_pb2.QueryMeta(index=20))


class _Deployments(api_pb2_grpc.DeploymentsServicer):
    def __init__(self, fake: FakeDrover) -> None:
        self.fake = fake

    def List(self, request: Any, context: grpc.ServicerContext) -> api_pb2.DeploymentListResponse:
        self.fake.enter("Deployments.List", request)
        listed = [s[0] for s in self.fake.deployment_script.values()] + self.fake.extra_deployments
        if request.job_id:
            listed = [d for d in listed if d.job_id == request.job_id]
        return api_pb2.DeploymentListResponse(
            meta=api_pb2.QueryMeta(index=self.fake.index), deployments=listed
        )

    def Get(self, request: Any, context: grpc.ServicerContext) -> api_pb2.DeploymentGetResponse:
        self.fake.enter("Deployments.Get", request)
        script = self.fake.deployment_script.get(request.deployment_id)
        if script and len(script) > 1 and request.options.min_index:
            script.pop(0)
            self.fake.index += 1
        deployment = self.fake.current(request.deployment_id)
        if deployment is None:
            context.abort(grpc.StatusCode.NOT_FOUND, f'deployment "{request.deployment_id}" not found')
        return api_pb2.DeploymentGetResponse(
            meta=api_pb2.QueryMeta(index=self.fake.index), deployment=deployment
        )

    def Allocations(self, request: Any, context: grpc.ServicerContext) -> api_pb2.AllocListResponse:
        self.fake.enter("Deployments.Allocations", request)
        return api_pb2.AllocListResponse(allocs=self.fake.deployment_allocs)

    def Promote(self, request: Any, context: grpc.ServicerContext) -> api_pb2.DeploymentWriteResponse:
        self.fake.enter("Deployments.Promote", request)
        return self.fake.write_response

    def Pause(self, request: Any, context: grpc.ServicerContext) -> api_pb2.DeploymentWriteResponse:
        self.fake.enter("Deployments.Pause", request)
        return self.fake.write_response

    def Fail(self, request: Any, context: grpc.ServicerContext) -> api_pb2.DeploymentWriteResponse:
        self.fake.enter("Deployments.Fail", request)
        return self.fake.write_response

    def SetAllocHealth(self, request: Any, context: grpc.ServicerContext) -> api_pb2.DeploymentWriteResponse:
        self.fake.enter("Deployments.SetAllocHealth", request)
        return self.fake.write_response


@pytest.fixture
def fake() -> Iterator[tuple[FakeDrover, str]]:
    """An IN-PROCESS FAKE drover server on a free port: (state, "127.0.0.1:port")."""
    with serving_fake(FakeDrover(), _Jobs, _Evals, _Allocs, _Deployments, max_workers=4) as served:
        yield served


def deployment(
    status: str = "running",
    *,
    deployment_id: str = DEP_ID,
    description: str = "Deployment is running",
    placed: int = 0,
    healthy: int = 0,
    **group: Any,
) -> structs_pb2.Deployment:
    """A deployment of web version 1 with one group "web" of 2."""
    d = structs_pb2.Deployment(
        id=deployment_id,
        job_id="web",
        job_version=1,
        status=status,
        status_description=description,
        create_index=50,
        modify_index=60,
    )
    d.task_groups["web"].CopyFrom(
        structs_pb2.DeploymentState(desired_total=2, placed_allocs=placed, healthy_allocs=healthy, **group)
    )
    return d


def web_job(version: int = 1, count: int = 2, run_for: str = "1h", **fields: Any) -> structs_pb2.Job:
    task = structs_pb2.Task(name="server", driver="mock", config_json=json.dumps({"run_for": run_for}))
    return structs_pb2.Job(
        id="web",
        type="service",
        version=version,
        submit_time_ns=SUBMIT_NS + version * 1_000_000_000,
        groups=[structs_pb2.TaskGroup(name="web", count=count, tasks=[task])],
        **fields,
    )


# ---------------------------------------------------------------------------------------
# Pure formatting


def test_group_table__plain_rolling_update__only_the_fixed_columns() -> None:
    headers, rows = group_table(deployment(placed=1, healthy=1))
    assert headers == ["Task Group", "Desired", "Placed", "Healthy", "Unhealthy"]
    assert rows == [["web", "2", "1", "1", "0"]]


def test_group_table__canaries_auto_revert_deadline__every_optional_column() -> None:
    d = deployment(
        auto_revert=True, desired_canaries=1, progress_deadline_ns=600, require_progress_by_ns=DEADLINE_NS
    )
    d.task_groups["api"].CopyFrom(structs_pb2.DeploymentState(desired_total=3, progress_deadline_ns=600))
    headers, rows = group_table(d)
    assert headers == [
        "Task Group",
        "Auto Revert",
        "Promoted",
        "Desired",
        "Canaries",
        "Placed",
        "Healthy",
        "Unhealthy",
        "Progress Deadline",
    ]
    assert rows == [
        # A group without canaries has nothing to promote; one without a deadline yet, none.
        ["api", "false", "N/A", "3", "0", "0", "0", "0", "N/A"],
        ["web", "true", "false", "2", "1", "0", "0", "0", "2023-11-14T22:23:20Z"],
    ]


def test_deployment_json__always_has_the_documented_keys() -> None:
    out = deployment_json(deployment())
    assert (out["id"], out["job_id"], out["job_version"], out["status"], out["status_description"]) == (
        DEP_ID,
        "web",
        1,
        "running",
        "Deployment is running",
    )
    group = out["task_groups"]["web"]  # type: ignore[index]
    # Zeros and false too, which proto JSON would leave out.
    assert {k: group[k] for k in ("desired", "placed", "healthy", "unhealthy", "canaries", "promoted")} == {
        "desired": 2,
        "placed": 0,
        "healthy": 0,
        "unhealthy": 0,
        "canaries": 0,
        "promoted": False,
    }
    assert group["desired_total"] == 2  # the rest of the record stays
    json.dumps(out)


def test_diff_jobs__paths_by_name_config_opened_bookkeeping_ignored() -> None:
    old = web_job(version=0, count=2, run_for="1h")
    new = web_job(version=1, count=3, run_for="2h", stable=True, meta={"team": "a"})
    new.groups.add(name="cache", count=1)
    changes = {c.path: (fmt_value(c.old), fmt_value(c.new)) for c in diff_jobs(old, new)}
    assert changes["groups[web].count"] == ("2", "3")
    assert changes["groups[web].tasks[server].config.run_for"] == ('"1h"', '"2h"')
    assert changes["meta[team]"] == ("(none)", '"a"')
    assert changes["groups[cache].count"] == ("(none)", "1")
    assert not {"version", "stable", "submit_time_ns"} & set(changes)


def test_diff_jobs__same_spec__no_changes() -> None:
    assert diff_jobs(web_job(version=0), web_job(version=3, stable=True)) == []
    removed = diff_jobs(web_job(meta={"a": "b"}), web_job())
    assert [(c.path, c.new) for c in removed] == [("meta[a]", ABSENT)]


# ---------------------------------------------------------------------------------------
# deployment list / status


def test_deployment_list__newest_first(
    fake: tuple[FakeDrover, str], capsys: pytest.CaptureFixture[str]
) -> None:
    state, addr = fake
    older = deployment("successful", deployment_id=DEP_ID_2, description="Deployment completed successfully")
    older.create_index = 10
    state.deployment_script = {DEP_ID: [deployment()], DEP_ID_2: [older]}
    code, out, err = run(capsys, "deployment", "list", "-address", addr)
    assert (code, err) == (0, [])
    assert out.splitlines() == [
        "ID        Job ID  Job Version  Status      Description",
        f"{DEP_ID[:8]}  web     1            running     Deployment is running",
        f"{DEP_ID_2[:8]}  web     1            successful  Deployment completed successfully",
    ]


def test_deployment_status__by_prefix(
    fake: tuple[FakeDrover, str], capsys: pytest.CaptureFixture[str]
) -> None:
    state, addr = fake
    state.deployment_script = {DEP_ID: [deployment(placed=2, healthy=1)]}
    code, out, err = run(capsys, "deployment", "status", "-address", addr, DEP_ID[:6])
    assert (code, err) == (0, [])
    assert out.splitlines() == [
        f"ID          = {DEP_ID[:8]}",
        "Job ID      = web",
        "Job Version = 1",
        "Status      = running",
        "Description = Deployment is running",
        "",
        "Deployed",
        "Task Group  Desired  Placed  Healthy  Unhealthy",
        "web         2        2       1        0",
    ]
    # The prefix missed by Get, then matched in the listing, then read whole.
    assert [r.deployment_id for r in state.calls("Deployments.Get")] == [DEP_ID[:6], DEP_ID]


def test_deployment_status__verbose__lists_allocations_with_health(
    fake: tuple[FakeDrover, str], capsys: pytest.CaptureFixture[str]
) -> None:
    state, addr = fake
    state.deployment_script = {DEP_ID: [deployment()]}
    state.deployment_allocs = [
        structs_pb2.Allocation(
            id=ALLOC_A,
            node_id="n1",
            task_group="web",
            job_version=1,
            desired_status="run",
            client_status="running",
            deployment_status=structs_pb2.AllocDeploymentStatus(health="healthy", canary=True),
        )
    ]
    code, out, _ = run(capsys, "deployment", "status", "-verbose", "-address", addr, DEP_ID)
    assert code == 0
    lines = out.splitlines()
    assert lines[0] == f"ID          = {DEP_ID}"
    allocs = lines[lines.index("Allocations") + 1 :]
    assert allocs[0].split() == [
        "ID",
        "Node",
        "ID",
        "Task",
        "Group",
        "Version",
        "Desired",
        "Status",
        "Health",
        "Canary",
        "Created",
    ]
    assert allocs[1].split() == [ALLOC_A, "n1", "web", "1", "run", "running", "healthy", "true"]


def test_deployment_status__json(fake: tuple[FakeDrover, str], capsys: pytest.CaptureFixture[str]) -> None:
    state, addr = fake
    state.deployment_script = {
        DEP_ID: [deployment("failed", description="Failed due to unhealthy allocations")]
    }
    code, out, _ = run(capsys, "deployment", "status", "-json", "-address", addr, DEP_ID)
    assert code == 0
    got = json.loads(out)
    assert (got["status"], got["status_description"], got["job_version"]) == (
        "failed",
        "Failed due to unhealthy allocations",
        1,
    )
    assert got["task_groups"]["web"]["desired"] == 2


def test_deployment_status__ambiguous_prefix__one_error_line(
    fake: tuple[FakeDrover, str], capsys: pytest.CaptureFixture[str]
) -> None:
    state, addr = fake
    state.deployment_script = {DEP_ID: [deployment()], DEP_ID_2: [deployment(deployment_id=DEP_ID_2)]}
    code, out, err = run(capsys, "deployment", "status", "-address", addr, "d3e1")
    assert (code, out) == (1, "")
    assert err == [f'Error: prefix "d3e1" matched 2 deployments: {DEP_ID}, {DEP_ID_2}']


def test_deployment_status__unknown__one_error_line(
    fake: tuple[FakeDrover, str], capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run(capsys, "deployment", "status", "-address", fake[1], "ffff")
    assert (code, err) == (1, ['Error: deployment "ffff" not found'])


def test_deployment_status__missing_id__usage_error() -> None:
    with pytest.raises(SystemExit) as info:
        main(["deployment", "status"])
    assert info.value.code == 2


# ---------------------------------------------------------------------------------------
# deployment writes


def test_deployment_promote__groups_then_monitors_to_success(
    fake: tuple[FakeDrover, str], capsys: pytest.CaptureFixture[str]
) -> None:
    state, addr = fake
    state.eval.deployment_id = DEP_ID
    state.deployment_script = {
        DEP_ID: [
            deployment(placed=2, healthy=1),
            deployment("successful", description="Deployment completed successfully", placed=2, healthy=2),
        ]
    }
    code, out, err = run(
        capsys, "deployment", "promote", "-group", "web", "-group", "api,web", "-address", addr, DEP_ID[:8]
    )
    assert (code, err) == (0, [])
    [request] = state.calls("Deployments.Promote")
    assert (request.deployment_id, list(request.groups)) == (DEP_ID, ["web", "api"])
    lines = out.splitlines()
    assert lines[0] == f'Promoted groups web, api of deployment "{DEP_ID[:8]}"'
    assert f'==> Monitoring deployment "{DEP_ID[:8]}"' in lines
    assert lines[-1] == f'==> Deployment "{DEP_ID[:8]}" successful: Deployment completed successfully'
    # The table is printed each time it changed: healthy 1, then 2.
    assert [line.split()[3] for line in lines if line.strip().startswith("web ")] == ["1", "2"]


def test_deployment_pause__no_monitor(
    fake: tuple[FakeDrover, str], capsys: pytest.CaptureFixture[str]
) -> None:
    state, addr = fake
    state.deployment_script = {DEP_ID: [deployment()]}
    state.write_response = api_pb2.DeploymentWriteResponse()
    code, out, err = run(capsys, "deployment", "pause", "-address", addr, DEP_ID)
    assert (code, err, out) == (0, [], f'Deployment "{DEP_ID[:8]}" paused\n')
    [request] = state.calls("Deployments.Pause")
    assert request.pause is True


def test_deployment_resume__detach(fake: tuple[FakeDrover, str], capsys: pytest.CaptureFixture[str]) -> None:
    state, addr = fake
    state.deployment_script = {DEP_ID: [deployment("paused")]}
    code, out, _ = run(capsys, "deployment", "resume", "-detach", "-address", addr, DEP_ID)
    assert code == 0
    [request] = state.calls("Deployments.Pause")
    assert request.pause is False
    assert out.splitlines() == [f'Deployment "{DEP_ID[:8]}" resumed', f"Evaluation {EVAL_ID[:8]}"]
    assert state.calls("Evals.Get") == []


def test_deployment_fail__reverted_is_said(
    fake: tuple[FakeDrover, str], capsys: pytest.CaptureFixture[str]
) -> None:
    state, addr = fake
    state.deployment_script = {DEP_ID: [deployment()]}
    state.write_response = api_pb2.DeploymentWriteResponse(
        eval_id=EVAL_ID, reverted=True, reverted_job_version=0
    )
    code, out, _ = run(capsys, "deployment", "fail", "-detach", "-address", addr, DEP_ID)
    assert code == 0
    assert out.splitlines()[:2] == [
        f'Deployment "{DEP_ID[:8]}" failed',
        "Job rolled back to version 0 (as a new version)",
    ]


def test_deployment_alloc_health__prefixes_resolved_within_the_deployment(
    fake: tuple[FakeDrover, str], capsys: pytest.CaptureFixture[str]
) -> None:
    state, addr = fake
    state.deployment_script = {DEP_ID: [deployment()]}
    state.deployment_allocs = [structs_pb2.Allocation(id=ALLOC_A), structs_pb2.Allocation(id=ALLOC_B)]
    code, out, err = run(
        capsys,
        "deployment",
        "alloc-health",
        "-detach",
        "-healthy",
        "a11",
        "-unhealthy",
        ALLOC_B,
        "-address",
        addr,
        DEP_ID,
    )
    assert (code, err) == (0, [])
    [request] = state.calls("Deployments.SetAllocHealth")
    assert (list(request.healthy_alloc_ids), list(request.unhealthy_alloc_ids)) == ([ALLOC_A], [ALLOC_B])
    assert out.splitlines()[0] == f'Deployment "{DEP_ID[:8]}": marked 1 healthy and 1 unhealthy'


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        ([], "Error: give at least one allocation with -healthy or -unhealthy"),
        (
            ["-healthy", "a,b", "-unhealthy", "b"],
            "Error: allocation b is given as both healthy and unhealthy",
        ),
    ],
    ids=["no-allocs", "both"],
)
def test_deployment_alloc_health__argument_errors__nothing_sent(
    fake: tuple[FakeDrover, str], capsys: pytest.CaptureFixture[str], flags: list[str], message: str
) -> None:
    state, addr = fake
    code, out, err = run(capsys, "deployment", "alloc-health", *flags, "-address", addr, DEP_ID)
    assert (code, out, err) == (1, "", [message])
    assert state.requests == []


def test_deployment_alloc_health__alloc_not_in_deployment(
    fake: tuple[FakeDrover, str], capsys: pytest.CaptureFixture[str]
) -> None:
    state, addr = fake
    state.deployment_script = {DEP_ID: [deployment()]}
    state.deployment_allocs = [structs_pb2.Allocation(id=ALLOC_A)]
    code, _, err = run(capsys, "deployment", "alloc-health", "-healthy", "ffff", "-address", addr, DEP_ID)
    assert (code, err) == (1, [f'Error: no allocation of deployment "{DEP_ID[:8]}" matches "ffff"'])
    assert state.calls("Deployments.SetAllocHealth") == []


# ---------------------------------------------------------------------------------------
# job run follows the deployment


@pytest.fixture
def job_file(tmp_path: Path) -> Path:
    path = tmp_path / "web.hcl"
    path.write_text(
        'job "web" {\n  group "web" {\n    count = 2\n    task "server" {\n      driver = "mock"\n    }\n  }\n}\n'
    )
    return path


def test_job_run__follows_the_deployment_to_success(
    fake: tuple[FakeDrover, str], job_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state, addr = fake
    state.eval.deployment_id = DEP_ID
    state.deployment_script = {
        DEP_ID: [
            deployment(placed=1),
            deployment(placed=1),  # unchanged: printed once
            deployment(placed=2, healthy=1),
            deployment("successful", description="Deployment completed successfully", placed=2, healthy=2),
        ]
    }
    code, out, err = run(capsys, "job", "run", "-address", addr, str(job_file))
    assert (code, err) == (0, [])
    lines = out.splitlines()
    start = lines.index(f'==> Monitoring deployment "{DEP_ID[:8]}"')
    assert lines[start:] == [
        f'==> Monitoring deployment "{DEP_ID[:8]}"',
        "    Status      = running",
        "    Description = Deployment is running",
        "",
        "    Task Group  Desired  Placed  Healthy  Unhealthy",
        "    web         2        1       0        0",
        "",
        "    Status      = running",
        "    Description = Deployment is running",
        "",
        "    Task Group  Desired  Placed  Healthy  Unhealthy",
        "    web         2        2       1        0",
        "",
        "    Status      = successful",
        "    Description = Deployment completed successfully",
        "",
        "    Task Group  Desired  Placed  Healthy  Unhealthy",
        "    web         2        2       2        0",
        f'==> Deployment "{DEP_ID[:8]}" successful: Deployment completed successfully',
    ]
    assert f'    Evaluation within deployment: "{DEP_ID[:8]}"' in lines
    # After the first read, each Get is a blocking query from the last index seen.
    gets = state.calls("Deployments.Get")
    assert gets[0].options.min_index == 0
    assert all(g.options.min_index > 0 and g.options.wait_ns > 0 for g in gets[1:])


def test_job_run__deployment_failed__exit_1_one_error_line(
    fake: tuple[FakeDrover, str], job_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state, addr = fake
    state.eval.deployment_id = DEP_ID
    failed = deployment("failed", description="Failed due to unhealthy allocations", placed=2)
    state.deployment_script = {DEP_ID: [deployment(placed=2), failed]}
    code, out, err = run(capsys, "job", "run", "-address", addr, str(job_file))
    assert code == 1
    assert err == [f'Error: deployment "{DEP_ID[:8]}" failed: Failed due to unhealthy allocations']
    assert (
        out.splitlines()[-1] == f'==> Deployment "{DEP_ID[:8]}" failed: Failed due to unhealthy allocations'
    )


def test_job_run__auto_reverted__says_so_follows_the_rollback_still_exit_1(
    fake: tuple[FakeDrover, str], job_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state, addr = fake
    state.eval.deployment_id = DEP_ID
    desc = "Failed due to unhealthy allocations - rolling back to job version 0"
    state.deployment_script = {DEP_ID: [deployment(placed=2), deployment("failed", description=desc)]}
    rollback = deployment(
        "successful", deployment_id=ROLLBACK_ID, description="Deployment completed successfully", healthy=2
    )
    rollback.job_version = 2  # the rollback registers version 0's spec as version 2
    # An older deployment of the job, and one of the failed version: neither is followed.
    stale = deployment("successful", deployment_id=DEP_ID_2, description="Deployment completed successfully")
    stale.job_version, stale.create_index = 0, 10
    state.extra_deployments = [stale, rollback]
    code, out, err = run(capsys, "job", "run", "-address", addr, str(job_file))
    assert code == 1  # Nomad >= 1.2.4: the deployment failed, whatever the rollback did
    assert err == [
        f'Error: deployment "{DEP_ID[:8]}" failed: {desc}; the rollback\'s deployment "{ROLLBACK_ID[:8]}" successful'
    ]
    lines = out.splitlines()
    assert f'==> Job rolled back to version 0: following deployment "{ROLLBACK_ID[:8]}"' in lines
    assert lines[-1] == f'==> Deployment "{ROLLBACK_ID[:8]}" successful: Deployment completed successfully'


def test_job_run__placement_failed__cleared_by_successful_deployment(
    fake: tuple[FakeDrover, str], job_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state, addr = fake
    state.eval.queued_allocations["web"] = 1
    state.deployment_script = {
        DEP_ID: [deployment("successful", description="Deployment completed successfully")]
    }
    code, _, err = run(capsys, "job", "run", "-address", addr, str(job_file))
    assert (code, err) == (0, [])
    # The eval named no deployment: the one made for version 1 after the eval was found.
    [listing] = state.calls("Deployments.List")
    assert listing.job_id == "web"


def test_job_run__placement_failed__no_deployment__exit_2(
    fake: tuple[FakeDrover, str], job_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state, addr = fake
    state.eval.queued_allocations["web"] = 1
    code, _, err = run(capsys, "job", "run", "-address", addr, str(job_file))
    assert (code, err) == (2, [])


def test_job_run__detach__no_deployment_followed(
    fake: tuple[FakeDrover, str], job_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state, addr = fake
    state.eval.deployment_id = DEP_ID
    code, _, _ = run(capsys, "job", "run", "-detach", "-address", addr, str(job_file))
    assert code == 0
    assert state.calls("Deployments.Get") == [] and state.calls("Evals.Get") == []


# ---------------------------------------------------------------------------------------
# job history / revert / scale / inspect / validate / deployments


def test_job_history__table_newest_first(
    fake: tuple[FakeDrover, str], capsys: pytest.CaptureFixture[str]
) -> None:
    state, addr = fake
    state.jobs["web"] = web_job(version=1)
    state.versions["web"] = [web_job(version=0, stable=True), web_job(version=1, count=3)]
    code, out, err = run(capsys, "job", "history", "-address", addr, "we")
    assert (code, err) == (0, [])
    assert out.splitlines() == [
        "Version  Stable  Submit Date",
        "1        false   2023-11-14T22:13:21Z",
        "0        true    2023-11-14T22:13:20Z",
    ]


def test_job_history__p__diff_against_the_version_before(
    fake: tuple[FakeDrover, str], capsys: pytest.CaptureFixture[str]
) -> None:
    state, addr = fake
    state.jobs["web"] = web_job(version=2)
    state.versions["web"] = [
        web_job(version=2),
        web_job(version=1, count=3, run_for="2h"),
        web_job(version=0),
    ]
    code, out, _ = run(capsys, "job", "history", "-p", "-address", addr, "web")
    assert code == 0
    assert out.split("\n\n") == [
        "Version     = 2\nStable      = false\nSubmit Date = 2023-11-14T22:13:22Z\nDiff        = (from version 1)\n"
        "  groups[web].count: 3 -> 2\n"
        '  groups[web].tasks[server].config.run_for: "2h" -> "1h"',
        "Version     = 1\nStable      = false\nSubmit Date = 2023-11-14T22:13:21Z\nDiff        = (from version 0)\n"
        "  groups[web].count: 2 -> 3\n"
        '  groups[web].tasks[server].config.run_for: "1h" -> "2h"',
        "Version     = 0\nStable      = false\nSubmit Date = 2023-11-14T22:13:20Z\n",
    ]


def test_job_history__json_p(fake: tuple[FakeDrover, str], capsys: pytest.CaptureFixture[str]) -> None:
    state, addr = fake
    state.jobs["web"] = web_job(version=1)
    state.versions["web"] = [web_job(version=0), web_job(version=1, count=3)]
    code, out, _ = run(capsys, "job", "history", "-p", "-json", "-address", addr, "web")
    assert code == 0
    newest, oldest = json.loads(out)
    assert (newest["version"], newest["diff"]) == (1, [{"path": "groups[web].count", "old": "2", "new": "3"}])
    assert "diff" not in oldest


def test_job_revert__sends_version_and_monitors(
    fake: tuple[FakeDrover, str], capsys: pytest.CaptureFixture[str]
) -> None:
    state, addr = fake
    state.jobs["web"] = web_job(version=6)
    code, out, err = run(capsys, "job", "revert", "-address", addr, "web", "0")
    assert (code, err) == (0, [])
    [request] = state.calls("Jobs.Revert")
    assert (request.job_id, request.job_version) == ("web", 0)
    lines = out.splitlines()
    assert lines[0] == 'Job "web" reverted to version 0 as version 7'
    assert f'==> Monitoring evaluation "{EVAL_ID[:8]}"' in lines


def test_job_revert__bad_version__one_error_line(
    fake: tuple[FakeDrover, str], capsys: pytest.CaptureFixture[str]
) -> None:
    state, addr = fake
    code, out, err = run(capsys, "job", "revert", "-address", addr, "web", "v1")
    assert (code, out, err) == (1, "", ['Error: VERSION must be a non-negative integer, got "v1"'])
    assert state.requests == []


def test_job_scale__group_omitted_when_the_job_has_one(
    fake: tuple[FakeDrover, str], capsys: pytest.CaptureFixture[str]
) -> None:
    state, addr = fake
    state.jobs["web"] = web_job()
    code, out, err = run(capsys, "job", "scale", "-detach", "-address", addr, "web", "5")
    assert (code, err) == (0, [])
    [request] = state.calls("Jobs.Scale")
    assert (request.job_id, request.group, request.count) == ("web", "web", 5)
    assert out.splitlines()[0] == 'Job "web" group "web" scaled to 5 (version 8)'


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["web", "3"], 'Error: job "web" has 2 task groups (web, cache): name one'),
        (["web", "db", "3"], 'Error: job "web" has no task group "db"'),
        (["web", "web", "-1"], 'Error: COUNT must be a non-negative integer, got "-1"'),
    ],
    ids=["two-groups-none-named", "unknown-group", "negative"],
)
def test_job_scale__argument_errors__nothing_scaled(
    fake: tuple[FakeDrover, str], capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    state, addr = fake
    job = web_job()
    job.groups.add(name="cache", count=1)
    state.jobs["web"] = job
    code, out, err = run(capsys, "job", "scale", "-address", addr, *argv)
    assert (code, out, err) == (1, "", [message])
    assert state.calls("Jobs.Scale") == []


def test_job_scale__too_many_arguments__usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["job", "scale", "web", "a", "b", "3"])
    assert info.value.code == 2
    assert "unrecognized arguments: 3" in capsys.readouterr().err


def test_job_inspect__stored_spec_as_json(
    fake: tuple[FakeDrover, str], capsys: pytest.CaptureFixture[str]
) -> None:
    state, addr = fake
    state.jobs["web"] = web_job(version=1, count=3)
    state.versions["web"] = [web_job(version=0), web_job(version=1, count=3)]
    code, out, _ = run(capsys, "job", "inspect", "-address", addr, "web")
    assert code == 0
    assert json.loads(out)["groups"][0]["count"] == 3
    code, out, _ = run(capsys, "job", "inspect", "-version", "0", "-address", addr, "web")
    assert (code, json.loads(out)["groups"][0]["count"]) == (0, 2)
    code, _, err = run(capsys, "job", "inspect", "-version", "9", "-address", addr, "web")
    assert (code, err) == (1, ['Error: job "web" has no version 9'])


def test_job_validate__every_problem_at_once__exit_1(
    fake: tuple[FakeDrover, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state, addr = fake
    path = tmp_path / "bad.hcl"
    path.write_text(
        'job "web" {\n  priority = 500\n  group "web" {\n    count = -1\n'
        '    task "server" {\n      driver = "mock"\n    }\n  }\n}\n'
    )
    # The server knows one more (and repeats one the local check found).
    state.validate_response = api_pb2.JobValidateResponse(
        errors=["job.groups[0].count: must be >= 0, got -1", "job.groups[0].tasks[0].driver: no node has it"],
        warnings=["job.update: ignored"],
    )
    code, out, err = run(capsys, "job", "validate", "-address", addr, str(path))
    assert code == 1
    assert err == [f"Error: {path}: job validation failed: 3 problem(s)"]
    lines = out.splitlines()
    assert lines[:2] == ["Job Warnings:", "  * job.update: ignored"]
    problems = lines[lines.index("Job validation errors:") + 1 :]
    assert len(problems) == 3 and len(set(problems)) == 3
    # Each with the line of its field in the file, the server's too.
    assert any(p.startswith(f"  * {path}:2: job.priority:") for p in problems)
    assert f"  * {path}:4: job.groups[0].count: must be >= 0, got -1" in problems
    assert problems[-1] == f"  * {path}:6: job.groups[0].tasks[0].driver: no node has it"
    [request] = state.calls("Jobs.Validate")
    assert request.job.id == "web"


def test_job_validate__valid__exit_0(
    fake: tuple[FakeDrover, str], job_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(capsys, "job", "validate", "-address", fake[1], str(job_file))
    assert (code, out, err) == (0, "Job validation successful\n", [])


def test_job_validate__unreadable_file__its_line(
    fake: tuple[FakeDrover, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state, addr = fake
    path = tmp_path / "broken.hcl"
    path.write_text('job "web" {\n  group "web" {\n')
    code, out, err = run(capsys, "job", "validate", "-address", addr, str(path))
    assert (code, out) == (1, "")
    assert len(err) == 1 and err[0].startswith(f"Error: {path}:")
    assert state.requests == []


def test_job_deployments__table(fake: tuple[FakeDrover, str], capsys: pytest.CaptureFixture[str]) -> None:
    state, addr = fake
    state.jobs["web"] = web_job()
    state.deployment_script = {DEP_ID: [deployment()]}
    code, out, _ = run(capsys, "job", "deployments", "-address", addr, "web")
    assert code == 0
    assert out.splitlines()[1].split()[:4] == [DEP_ID[:8], "web", "1", "running"]
    code, out, _ = run(capsys, "job", "deployments", "-json", "-address", addr, "web")
    assert [d["id"] for d in json.loads(out)] == [DEP_ID]


@pytest.mark.parametrize(
    ("buckets", "queued", "code"),
    [
        ({"ignore": 3}, {}, 0),
        ({"ignore": 2, "reschedule_later": 1}, {}, 0),
        ({"place": 0, "stop": 0}, {"web": 0}, 0),
        ({"inplace": 1}, {}, 1),
        ({"stop": 1}, {}, 1),
        ({"canary": 1}, {}, 1),
        ({}, {"web": 2}, 1),
    ],
    ids=["ignore", "reschedule-later", "zeros", "in-place", "stop", "canary", "queued"],
)
def test_job_plan__exit_status__1_only_when_allocations_would_change(
    buckets: dict[str, int], queued: dict[str, int], code: int
) -> None:
    from drover.cli.job import _plan_exit_status

    plan = api_pb2.JobPlanResponse(queued=queued)
    plan.groups["web"].buckets.update(buckets)
    assert _plan_exit_status(plan) == code
