"""The ``drover`` CLI against an IN-PROCESS FAKE gRPC server (not the real drover server).

``FakeDrover`` below serves a few canned answers for the Jobs, Evals, Allocs and Operator
services, records every request it gets, and can be told to fail calls with a given status.
It checks what the CLI sends and how it reports what comes back; the real servicers are
tested elsewhere.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import types
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf.message import Message

from drover import sdk
from drover.cli import format_table, main, parse_duration_ns
from drover.scheduler import structs
from drover.server.codec import to_proto
from drover.server.config import ServerConfig
from drover.v1 import api_pb2, api_pb2_grpc, raft_pb2, structs_pb2
from tests.fixtures.fake_grpc import run, serving_fake

EVAL_ID = "6f1c2d3e-0000-4000-8000-000000000001"
EVAL_ID_2 = "6f1c9999-0000-4000-8000-000000000002"
ALLOC_ID = "a11c0000-0000-4000-8000-000000000001"
NODE_ID = "b0de0000-0000-4000-8000-000000000001"
EVAL_INDEX = 10
ALLOCS_INDEX = 20
ALLOC_ID_2 = "a22c0000-0000-4000-8000-000000000002"
NODE_ID_2 = "b0de2222-0000-4000-8000-000000000002"
BLOCKED_EVAL_ID = "b10c0000-0000-4000-8000-000000000003"
SUBMIT_NS = 1_700_000_000_000_000_000


# ---------------------------------------------------------------------------------------
# The in-process fake


@dataclass
class FakeDrover:
    """IN-PROCESS FAKE drover server state: canned answers plus a request log."""

    requests: list[tuple[str, Message]] = field(default_factory=list)
    # method -> statuses to fail the next calls with, consumed in order.
    faults: dict[str, list[tuple[grpc.StatusCode, str]]] = field(default_factory=lambda: defaultdict(list))
    # method -> status every call fails with.
    outage: dict[str, tuple[grpc.StatusCode, str]] = field(default_factory=dict)
    jobs: dict[str, structs_pb2.Job] = field(default_factory=dict)
    evals: dict[str, structs_pb2.Evaluation] = field(default_factory=dict)
    allocs: list[structs_pb2.Allocation] = field(default_factory=list)
    nodes: dict[str, structs_pb2.Node] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    # eval ID -> the states successive Evals.Get calls return (the last one then sticks).
    eval_script: dict[str, list[structs_pb2.Evaluation]] = field(default_factory=dict)
    # N -> allocs that appear while the Nth Evals.Get call is served ("between polls").
    alloc_script: dict[int, list[structs_pb2.Allocation]] = field(default_factory=dict)
    plan_response: api_pb2.JobPlanResponse = field(default_factory=api_pb2.JobPlanResponse)
    # The alloc table's index; Allocs.List blocks on it like the real server.
    allocs_index: int = ALLOCS_INDEX
    allocs_changed: threading.Condition = field(default_factory=threading.Condition)

    def enter(self, method: str, request: Message, context: grpc.ServicerContext) -> None:
        with self.lock:
            self.requests.append((method, request))
            fault = self.outage.get(method) or (self.faults[method].pop(0) if self.faults[method] else None)
        if fault is not None:
            context.abort(*fault)

    def calls(self, method: str) -> list[Any]:
        return [req for name, req in self.requests if name == method]

    def add_allocs(self, *allocs: structs_pb2.Allocation) -> None:
        """New allocs at a new alloc table index, waking blocked Allocs.List queries."""
        with self.allocs_changed:
            self.allocs_index += 1
            for alloc in allocs:
                placed = structs_pb2.Allocation()
                placed.CopyFrom(alloc)
                placed.create_index = placed.modify_index = self.allocs_index
                self.allocs.append(placed)
            self.allocs_changed.notify_all()


class _Jobs(api_pb2_grpc.JobsServicer):
    def __init__(self, fake: FakeDrover) -> None:
        self.fake = fake

    def Register(self, request: Any, context: grpc.ServicerContext) -> api_pb2.JobRegisterResponse:
        self.fake.enter("Jobs.Register", request, context)
        job = structs_pb2.Job()
        job.CopyFrom(request.job)
        job.status = "pending"
        job.submit_time_ns = SUBMIT_NS
        self.fake.jobs[job.id] = job
        if job.periodic.enabled or job.HasField("parameterized"):
            return api_pb2.JobRegisterResponse(meta=api_pb2.WriteMeta(index=EVAL_INDEX), version=job.version)
        pending = structs_pb2.Evaluation(
            id=EVAL_ID,
            job_id=job.id,
            status="pending",
            triggered_by="job-register",
            create_index=EVAL_INDEX,
            modify_index=EVAL_INDEX,
        )
        self.fake.evals[EVAL_ID] = pending
        if EVAL_ID not in self.fake.eval_script:
            # By default the scheduler finishes the eval by the second read.
            done = structs_pb2.Evaluation()
            done.CopyFrom(pending)
            done.status = "complete"
            done.modify_index += 1
            self.fake.eval_script[EVAL_ID] = [pending, done]
        return api_pb2.JobRegisterResponse(
            meta=api_pb2.WriteMeta(index=EVAL_INDEX), eval_id=EVAL_ID, version=job.version
        )

    def Deregister(self, request: Any, context: grpc.ServicerContext) -> api_pb2.JobDeregisterResponse:
        self.fake.enter("Jobs.Deregister", request, context)
        return api_pb2.JobDeregisterResponse(eval_id=EVAL_ID_2)

    def Get(self, request: Any, context: grpc.ServicerContext) -> api_pb2.JobGetResponse:
        self.fake.enter("Jobs.Get", request, context)
        job = self.fake.jobs.get(request.job_id)
        if job is None:
            context.abort(grpc.StatusCode.NOT_FOUND, f'job "{request.job_id}" not found')
        summary = structs_pb2.JobSummary(job_id=job.id)
        summary.summary["web"].running = 2
        summary.summary["web"].queued = 1
        return api_pb2.JobGetResponse(meta=api_pb2.QueryMeta(index=5), job=job, summary=summary)

    def List(self, request: Any, context: grpc.ServicerContext) -> api_pb2.JobListResponse:
        self.fake.enter("Jobs.List", request, context)
        jobs = [j for j in self.fake.jobs.values() if j.id.startswith(request.prefix)]
        return api_pb2.JobListResponse(meta=api_pb2.QueryMeta(index=5), jobs=jobs)

    def Plan(self, request: Any, context: grpc.ServicerContext) -> api_pb2.JobPlanResponse:
        self.fake.enter("Jobs.Plan", request, context)
        return self.fake.plan_response


class _Evals(api_pb2_grpc.EvalsServicer):
    def __init__(self, fake: FakeDrover) -> None:
        self.fake = fake

    def Get(self, request: Any, context: grpc.ServicerContext) -> api_pb2.EvalGetResponse:
        self.fake.enter("Evals.Get", request, context)
        served = len(self.fake.calls("Evals.Get"))
        if served in self.fake.alloc_script:
            self.fake.add_allocs(*self.fake.alloc_script.pop(served))
        script = self.fake.eval_script.get(request.eval_id)
        if script:
            self.fake.evals[request.eval_id] = script.pop(0) if len(script) > 1 else script[0]
        ev = self.fake.evals.get(request.eval_id)
        if ev is None:
            context.abort(grpc.StatusCode.NOT_FOUND, f'eval "{request.eval_id}" not found')
        return api_pb2.EvalGetResponse(meta=api_pb2.QueryMeta(index=ev.modify_index), eval=ev)

    def List(self, request: Any, context: grpc.ServicerContext) -> api_pb2.EvalListResponse:
        self.fake.enter("Evals.List", request, context)
        return api_pb2.EvalListResponse(evals=list(self.fake.evals.values()))


class _Allocs(api_pb2_grpc.AllocsServicer):
    def __init__(self, fake: FakeDrover) -> None:
        self.fake = fake

    def List(self, request: Any, context: grpc.ServicerContext) -> api_pb2.AllocListResponse:
        self.fake.enter("Allocs.List", request, context)
        fake = self.fake
        with fake.allocs_changed:
            if request.options.min_index:
                # A blocking query, as on the real server (capped so a broken test ends).
                wait_s = min(request.options.wait_ns / 1e9 if request.options.wait_ns > 0 else 5.0, 5.0)
                fake.allocs_changed.wait_for(lambda: fake.allocs_index > request.options.min_index, wait_s)
            allocs = [
                a
                for a in fake.allocs
                if (not request.job_id or a.job_id == request.job_id)
                and (not request.node_id or a.node_id == request.node_id)
            ]
            return api_pb2.AllocListResponse(meta=api_pb2.QueryMeta(index=fake.allocs_index), allocs=allocs)


class _Nodes(api_pb2_grpc.NodesServicer):
    def __init__(self, fake: FakeDrover) -> None:
        self.fake = fake

    def List(self, request: Any, context: grpc.ServicerContext) -> api_pb2.NodeListResponse:
        self.fake.enter("Nodes.List", request, context)
        nodes = [n for n in self.fake.nodes.values() if n.id.startswith(request.prefix)]
        return api_pb2.NodeListResponse(meta=api_pb2.QueryMeta(index=5), nodes=nodes)

    def Get(self, request: Any, context: grpc.ServicerContext) -> api_pb2.NodeGetResponse:
        self.fake.enter("Nodes.Get", request, context)
        node = self.fake.nodes.get(request.node_id)
        if node is None:
            context.abort(grpc.StatusCode.NOT_FOUND, f'node "{request.node_id}" not found')
        return api_pb2.NodeGetResponse(meta=api_pb2.QueryMeta(index=5), node=node)

    def UpdateDrain(self, request: Any, context: grpc.ServicerContext) -> api_pb2.NodeUpdateDrainResponse:
        self.fake.enter("Nodes.UpdateDrain", request, context)
        return api_pb2.NodeUpdateDrainResponse(meta=api_pb2.WriteMeta(index=30), eval_ids=[EVAL_ID_2])

    def UpdateEligibility(
        self, request: Any, context: grpc.ServicerContext
    ) -> api_pb2.NodeUpdateEligibilityResponse:
        self.fake.enter("Nodes.UpdateEligibility", request, context)
        return api_pb2.NodeUpdateEligibilityResponse(meta=api_pb2.WriteMeta(index=31))


class _Operator(api_pb2_grpc.OperatorServicer):
    def __init__(self, fake: FakeDrover) -> None:
        self.fake = fake

    def StateDigest(self, request: Any, context: grpc.ServicerContext) -> api_pb2.StateDigestResponse:
        self.fake.enter("Operator.StateDigest", request, context)
        return api_pb2.StateDigestResponse(
            digest="abc123", applied_index=42, commit_index=43, server="s1", leader=True, term=3
        )

    def SnapshotSave(self, request: Any, context: grpc.ServicerContext) -> api_pb2.SnapshotSaveResponse:
        self.fake.enter("Operator.SnapshotSave", request, context)
        return api_pb2.SnapshotSaveResponse(snapshot=snapshot_fixture())

    def SnapshotRestore(self, request: Any, context: grpc.ServicerContext) -> api_pb2.SnapshotRestoreResponse:
        self.fake.enter("Operator.SnapshotRestore", request, context)
        return api_pb2.SnapshotRestoreResponse(meta=api_pb2.WriteMeta(index=100))


def snapshot_fixture() -> raft_pb2.StateSnapshot:
    snap = raft_pb2.StateSnapshot(index=77, jobs=[structs_pb2.Job(id="web")])
    snap.table_index["jobs"] = 77
    return snap


@pytest.fixture
def fake() -> Iterator[tuple[FakeDrover, str]]:
    """An IN-PROCESS FAKE drover server on a free port: (state, "127.0.0.1:port")."""
    with serving_fake(FakeDrover(), _Jobs, _Evals, _Allocs, _Nodes, _Operator, max_workers=8) as served:
        yield served


@dataclass
class SpecCli:
    """The CLI against the IN-PROCESS FAKE on job files ``fake_jobspec`` parses: the run and
    plan tests differ in the spec and the fake's answers, not in how the command is run, so
    they take this one fixture instead of each restating the four it is made of."""

    state: FakeDrover
    addr: str
    tmp_path: Path
    capsys: pytest.CaptureFixture[str]

    def job(self, verb: str, spec: str, *flags: str, name: str = "web") -> tuple[int, str, list[str]]:
        """`job <verb>` on a file ``<name>.hcl`` holding ``spec`` (a line ``fake_jobspec`` parses)."""
        path = self.tmp_path / f"{name}.hcl"
        path.write_text(spec)
        return run(self.capsys, "job", verb, *flags, "-address", self.addr, str(path))


@pytest.fixture
def cli(
    fake: tuple[FakeDrover, str],
    fake_jobspec: types.ModuleType,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> SpecCli:
    return SpecCli(*fake, tmp_path, capsys)


def web_job(count: int = 2) -> structs.Job:
    task = structs.Task(name="app", driver="mock")
    return structs.Job(id="web", groups=(structs.TaskGroup(name="web", count=count, tasks=(task,)),))


def periodic_job() -> structs.Job:
    task = structs.Task(name="app", driver="mock")
    return structs.Job(
        id="nightly",
        type="batch",
        periodic=structs.PeriodicConfig(spec="0 3 * * *"),
        groups=(structs.TaskGroup(name="report", count=1, tasks=(task,)),),
    )


@pytest.fixture
def fake_jobspec(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    """A stand-in ``drover.server.jobspec``: "web N" parses to web_job(N), "periodic" to periodic_job(),
    "bad" raises JobspecError."""
    mod = types.ModuleType("drover.server.jobspec")

    class JobspecError(ValueError):
        pass

    def parse_jobspec(text: str, *, filename: str = "", variables: object = None) -> structs.Job:
        words = text.split()
        if words[0] == "periodic":
            return periodic_job()
        if words[0] != "web":
            raise JobspecError(f"{filename}:1,1: unexpected {words[0]!r}")
        return web_job(int(words[1]))

    mod.JobspecError = JobspecError  # type: ignore[attr-defined]
    mod.parse_jobspec = parse_jobspec  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "drover.server.jobspec", mod)
    return mod


# ---------------------------------------------------------------------------------------
# job run


def test_job_run__detach__sends_the_parsed_job(
    fake: tuple[FakeDrover, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    jobspec = pytest.importorskip("drover.server.jobspec")
    state, addr = fake
    path = tmp_path / "web.hcl"
    path.write_text(
        """
job "web" {
  group "web" {
    count = 2
    task "app" {
      driver = "mock"
    }
  }
}
"""
    )
    code, out, err = run(capsys, "job", "run", "-detach", "-address", addr, str(path))
    assert (code, err) == (0, [])
    [request] = state.calls("Jobs.Register")
    expected = to_proto(jobspec.parse_jobspec(path.read_text(), filename=str(path)), structs_pb2.Job())
    assert request.job == expected
    assert out == f'Job "web" registered (version 0), evaluation {EVAL_ID}\n'
    assert state.calls("Evals.Get") == []


def test_job_run__detach__with_stand_in_jobspec(cli: SpecCli) -> None:
    state = cli.state
    path = cli.tmp_path / "web.hcl"
    path.write_text("web 3")
    code, out, _ = run(cli.capsys, "job", "run", "--detach", f"--address={cli.addr}", str(path))
    assert code == 0
    [request] = state.calls("Jobs.Register")
    assert request.job == to_proto(web_job(3), structs_pb2.Job())
    assert "evaluation" in out


def web_alloc(alloc_id: str, node_id: str, eval_id: str = EVAL_ID) -> structs_pb2.Allocation:
    return structs_pb2.Allocation(
        id=alloc_id,
        eval_id=eval_id,
        node_id=node_id,
        job_id="web",
        task_group="web",
        desired_status="run",
        client_status="pending",
    )


def scripted_eval(status: str, index: int, **fields: Any) -> structs_pb2.Evaluation:
    return structs_pb2.Evaluation(
        id=EVAL_ID,
        job_id="web",
        status=status,
        triggered_by="job-register",
        create_index=EVAL_INDEX,
        modify_index=index,
        **fields,
    )


def test_job_run__monitor_prints_allocs_as_they_appear(cli: SpecCli) -> None:
    state = cli.state
    # An alloc of an older eval of the job: not this registration's, never printed.
    state.add_allocs(web_alloc("0bd00000-0000-4000-8000-000000000009", NODE_ID, eval_id=EVAL_ID_2))
    state.eval_script[EVAL_ID] = [
        scripted_eval("pending", EVAL_INDEX),
        scripted_eval("pending", EVAL_INDEX),
        scripted_eval("complete", EVAL_INDEX + 1),
    ]
    # One alloc shows up before the 2nd eval read, the other before the 3rd.
    state.alloc_script = {2: [web_alloc(ALLOC_ID, NODE_ID)], 3: [web_alloc(ALLOC_ID_2, NODE_ID_2)]}
    code, out, err = cli.job("run", "web 2")
    assert (code, err) == (0, [])
    assert out.splitlines() == [
        f'Job "web" registered (version 0), evaluation {EVAL_ID}',
        f'==> Monitoring evaluation "{EVAL_ID[:8]}"',
        '    Evaluation triggered by job "web"',
        '    Evaluation status "pending"',
        f'    Allocation "{ALLOC_ID[:8]}" created: node "{NODE_ID[:8]}", group "web"',
        '    Evaluation status changed: "pending" -> "complete"',
        f'    Allocation "{ALLOC_ID_2[:8]}" created: node "{NODE_ID_2[:8]}", group "web"',
        f'==> Evaluation "{EVAL_ID[:8]}" finished with status "complete"',
    ]
    # Eval reads do not block; the job's allocs are read with blocking queries.
    assert [g.options.min_index for g in state.calls("Evals.Get")] == [0, 0, 0]
    lists = state.calls("Allocs.List")
    assert {(r.job_id, r.namespace) for r in lists} == {("web", "")}
    assert lists[0].options.min_index == 0
    blocking = [r for r in lists if r.options.min_index]
    assert blocking and all(r.options.wait_ns > 0 for r in blocking)
    assert blocking[0].options.min_index == ALLOCS_INDEX + 1


def test_job_run__monitor_wakes_on_new_alloc(cli: SpecCli) -> None:
    """The alloc list query blocks on the server until the placement lands."""
    state = cli.state
    state.eval_script[EVAL_ID] = [scripted_eval("pending", EVAL_INDEX)]

    def scheduler_finishes() -> None:
        state.eval_script.pop(EVAL_ID)
        state.evals[EVAL_ID] = scripted_eval("complete", EVAL_INDEX + 1)
        state.add_allocs(web_alloc(ALLOC_ID, NODE_ID))

    timer = threading.Timer(0.3, scheduler_finishes)
    timer.start()
    try:
        code, out, err = cli.job("run", "web 1")
    finally:
        timer.cancel()
    assert (code, err) == (0, [])
    assert f'Allocation "{ALLOC_ID[:8]}" created: node "{NODE_ID[:8]}", group "web"' in out
    assert out.endswith(f'==> Evaluation "{EVAL_ID[:8]}" finished with status "complete"\n')
    # Woken by the new alloc, not by a poll: one blocking query, then the final look.
    blocking = [r for r in state.calls("Allocs.List") if r.options.min_index]
    assert [r.options.min_index for r in blocking] == [ALLOCS_INDEX]


def test_job_run__blocked_eval__queued_allocs_and_blocked_eval_id(cli: SpecCli) -> None:
    state = cli.state
    done = scripted_eval(
        "complete",
        EVAL_INDEX + 1,
        blocked_eval=BLOCKED_EVAL_ID,
        queued_allocations={"web": 2},
        failed_tg_allocs={"web": "resources exhausted on 3 nodes"},
    )
    state.eval_script[EVAL_ID] = [scripted_eval("pending", EVAL_INDEX), done]
    state.alloc_script = {2: [web_alloc(ALLOC_ID, NODE_ID)]}
    code, out, err = cli.job("run", "web 3")
    # Placements failed: Nomad's exit status 2, no error line.
    assert (code, err) == (2, [])
    lines = out.splitlines()
    assert lines[lines.index('    Evaluation status changed: "pending" -> "complete"') + 1 :] == [
        f'    Allocation "{ALLOC_ID[:8]}" created: node "{NODE_ID[:8]}", group "web"',
        f'==> Evaluation "{EVAL_ID[:8]}" finished with status "complete" but failed to place all allocations:',
        '    Task Group "web": 2 allocation(s) queued, could not be placed now',
        "      * resources exhausted on 3 nodes",
        f'    Evaluation "{BLOCKED_EVAL_ID[:8]}" waiting for additional capacity to place the remainder',
    ]


def test_job_run__follow_up_eval_is_shown(cli: SpecCli) -> None:
    state = cli.state
    done = scripted_eval("complete", EVAL_INDEX + 1, next_eval=EVAL_ID_2)
    state.eval_script[EVAL_ID] = [done]
    code, out, _ = cli.job("run", "web 1", "-verbose")
    assert code == 0
    assert f'    Follow-up evaluation "{EVAL_ID_2}" created' in out.splitlines()
    # Already complete at the first read: one eval read, one alloc read, no blocking.
    assert len(state.calls("Evals.Get")) == 1
    assert [r.options.min_index for r in state.calls("Allocs.List")] == [0]


def test_job_run__failed_eval__exit_1(cli: SpecCli) -> None:
    state = cli.state
    failed = scripted_eval("failed", EVAL_INDEX + 1, status_description="maximum attempts reached (5)")
    state.eval_script[EVAL_ID] = [scripted_eval("pending", EVAL_INDEX), failed]
    code, out, err = cli.job("run", "web 1")
    assert code == 1
    assert err == [f'Error: evaluation "{EVAL_ID[:8]}" failed: maximum attempts reached (5)']
    assert 'finished with status "failed"' in out


def test_job_run__monitor_timeout__exit_0(cli: SpecCli) -> None:
    state = cli.state
    state.eval_script[EVAL_ID] = [scripted_eval("pending", EVAL_INDEX)]
    code, out, err = cli.job("run", "web 1", "-monitor-timeout", "0.5")
    assert (code, err) == (0, [])
    # It stopped when its 0.5 s were up: the blocking queries it sent, each held open for
    # its full wait by the fake, asked for no more than that in all (on a slow machine
    # there may be none: the time can run out before the first).
    waits = [r.options.wait_ns for r in state.calls("Allocs.List") if r.options.min_index]
    assert sum(waits) <= 500_000_000, waits
    assert f'==> Evaluation "{EVAL_ID[:8]}" still "pending" after 0.5s; stopped monitoring' in out
    assert f'Run "drover eval status {EVAL_ID}" to check on it' in out


def test_job_run__periodic_job__nothing_to_monitor(cli: SpecCli) -> None:
    state = cli.state
    code, out, err = cli.job("run", "periodic", name="nightly")
    assert (code, err) == (0, [])
    assert out.splitlines() == [
        'Job "nightly" registered (version 0)',
        "Job is periodic: each run it launches is evaluated then; nothing to monitor now",
    ]
    assert state.calls("Evals.Get") == []


def test_job_run__default_monitor_timeout_is_60s() -> None:
    from drover.cli import build_parser

    args = build_parser().parse_args(["job", "run", "web.hcl"])
    assert args.monitor_timeout == 60.0


def test_job_run__bad_job_file__one_error_line(cli: SpecCli) -> None:
    state = cli.state
    code, _, err = cli.job("run", "bad", name="bad")
    assert code == 1
    assert err == [f"Error: {cli.tmp_path / 'bad.hcl'}:1,1: unexpected 'bad'"]
    assert state.requests == []


def test_job_run__invalid_job__rejected_locally(cli: SpecCli) -> None:
    state = cli.state
    code, _, err = cli.job("run", "web -1")
    assert code == 1
    assert len(err) == 1 and err[0].startswith("Error: job.groups[0].count")
    assert state.requests == []


def test_job_run__missing_file(fake: tuple[FakeDrover, str], capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "job", "run", "-address", fake[1], "/nonexistent/web.hcl")
    assert code == 1
    assert err == ["Error: /nonexistent/web.hcl: No such file or directory"]


def test_job_run__invalid_argument_from_server__exit_1_one_line(cli: SpecCli) -> None:
    state = cli.state
    state.outage["Jobs.Register"] = (
        grpc.StatusCode.INVALID_ARGUMENT,
        "job.groups[0].tasks[0].driver: unknown driver\n(second line)",
    )
    code, out, err = cli.job("run", "web 1")
    assert code == 1
    assert err == ["Error: job.groups[0].tasks[0].driver: unknown driver (second line)"]
    assert out == ""
    assert len(state.calls("Jobs.Register")) == 1


def test_job_run__write_not_retried_after_deadline_exceeded(cli: SpecCli) -> None:
    state = cli.state
    state.faults["Jobs.Register"].append((grpc.StatusCode.DEADLINE_EXCEEDED, "commit timed out"))
    code, _, err = cli.job("run", "web 1", "-detach")
    assert (code, err) == (1, ["Error: commit timed out"])
    assert len(state.calls("Jobs.Register")) == 1


def test_job_run__write_retried_while_no_leader(cli: SpecCli) -> None:
    state = cli.state
    state.faults["Jobs.Register"] += [(grpc.StatusCode.UNAVAILABLE, "no leader")] * 2
    code, _, err = cli.job("run", "web 1", "-detach")
    assert (code, err) == (0, [])
    assert len(state.calls("Jobs.Register")) == 3


# ---------------------------------------------------------------------------------------
# Reads, -json, prefixes


def test_job_status__list_table(fake: tuple[FakeDrover, str], capsys: pytest.CaptureFixture[str]) -> None:
    state, addr = fake
    state.jobs["web"] = structs_pb2.Job(id="web", type="service", priority=50, status="running")
    state.jobs["batch-nightly"] = structs_pb2.Job(
        id="batch-nightly", type="batch", priority=70, status="dead", submit_time_ns=SUBMIT_NS
    )
    code, out, _ = run(capsys, "job", "status", "-address", addr, "-stale")
    assert code == 0
    assert out.splitlines() == [
        "ID             Type     Priority  Status   Submit Date",
        "batch-nightly  batch    70        dead     2023-11-14T22:13:20Z",
        "web            service  50        running",
    ]
    assert state.calls("Jobs.List")[0].options.stale is True


def test_job_status__json_is_snake_case(
    fake: tuple[FakeDrover, str], capsys: pytest.CaptureFixture[str]
) -> None:
    state, addr = fake
    state.jobs["web"] = structs_pb2.Job(id="web", submit_time_ns=SUBMIT_NS, job_modify_index=9)
    code, out, _ = run(capsys, "job", "status", "-json", "-address", addr)
    assert code == 0
    [job] = json.loads(out)
    # Every field under its proto (snake_case) name, zero values included, 64-bit ints as numbers.
    assert list(job) == [f.name for f in structs_pb2.Job.DESCRIPTOR.fields]
    assert (job["id"], job["submit_time_ns"], job["job_modify_index"]) == ("web", SUBMIT_NS, 9)
    assert (job["version"], job["stop"], job["datacenters"], job["periodic"]) == (0, False, [], None)


def test_job_status__one_job__by_prefix(
    fake: tuple[FakeDrover, str], capsys: pytest.CaptureFixture[str]
) -> None:
    state, addr = fake
    state.jobs["web"] = structs_pb2.Job(id="web", type="service", status="running")
    state.allocs.append(structs_pb2.Allocation(id=ALLOC_ID, job_id="web", task_group="web"))
    code, out, _ = run(capsys, "job", "status", "-address", addr, "we")
    assert code == 0
    assert "ID          = web" in out
    assert "Task Group  Queued  Starting  Running  Failed  Complete  Lost  Unknown" in out
    assert "web         1       0         2        0       0         0     0" in out
    assert ALLOC_ID[:8] in out


def test_job_status__one_job__json(fake: tuple[FakeDrover, str], capsys: pytest.CaptureFixture[str]) -> None:
    state, addr = fake
    state.jobs["web"] = structs_pb2.Job(id="web", status_description="ok")
    code, out, _ = run(capsys, "job", "status", "-json", "-address", addr, "web")
    assert code == 0
    doc = json.loads(out)
    assert {k: v for k, v in doc["job"].items() if v not in ("", 0, [], {}, None)} == {
        "id": "web",
        "status_description": "ok",
    }
    assert doc["summary"]["job_id"] == "web"
    assert doc["allocations"] == []


def test_job_status__not_found(fake: tuple[FakeDrover, str], capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "job", "status", "-address", fake[1], "nope")
    assert (code, out, err) == (1, "", ['Error: job "nope" not found'])


def test_job_stop__purge__detach(fake: tuple[FakeDrover, str], capsys: pytest.CaptureFixture[str]) -> None:
    state, addr = fake
    state.jobs["web"] = structs_pb2.Job(id="web")
    code, out, _ = run(capsys, "job", "stop", "-purge", "-detach", "-address", addr, "web")
    assert code == 0
    [request] = state.calls("Jobs.Deregister")
    assert (request.job_id, request.purge) == ("web", True)
    assert out == f'Job "web" purged, evaluation {EVAL_ID_2}\n'


def test_eval_status__unique_prefix(fake: tuple[FakeDrover, str], capsys: pytest.CaptureFixture[str]) -> None:
    state, addr = fake
    for eid in (EVAL_ID, EVAL_ID_2):
        state.evals[eid] = structs_pb2.Evaluation(id=eid, job_id="web", status="complete")
    code, out, _ = run(capsys, "eval", "status", "-address", addr, "6f1c2")
    assert code == 0
    assert f"ID                 = {EVAL_ID}" in out
    code, _, err = run(capsys, "eval", "status", "-address", addr, "6f1c")
    assert code == 1
    assert err == [f'Error: prefix "6f1c" matched 2 evaluations: {EVAL_ID}, {EVAL_ID_2}']


def test_eval_status__details_and_its_allocs(
    fake: tuple[FakeDrover, str], capsys: pytest.CaptureFixture[str]
) -> None:
    state, addr = fake
    state.evals[EVAL_ID] = structs_pb2.Evaluation(
        id=EVAL_ID,
        namespace="default",
        priority=50,
        type="service",
        triggered_by="job-register",
        job_id="web",
        status="complete",
        previous_eval=EVAL_ID_2,
        blocked_eval=BLOCKED_EVAL_ID,
        queued_allocations={"web": 1, "db": 0},
        failed_tg_allocs={"web": "resources exhausted on 3 nodes"},
        create_time_ns=SUBMIT_NS,
        modify_time_ns=SUBMIT_NS + 2_000_000_000,
        wait_until_ns=SUBMIT_NS + 60_000_000_000,
    )
    state.add_allocs(web_alloc(ALLOC_ID, NODE_ID), web_alloc(ALLOC_ID_2, NODE_ID_2, eval_id=EVAL_ID_2))
    code, out, err = run(capsys, "eval", "status", "-address", addr, EVAL_ID)
    assert (code, err) == (0, [])
    assert out.splitlines() == [
        f"ID                 = {EVAL_ID}",
        "Status             = complete",
        "Status Description = <none>",
        "Type               = service",
        "Triggered By       = job-register",
        "Job ID             = web",
        "Namespace          = default",
        "Node ID            = <none>",
        "Priority           = 50",
        "Create Time        = 2023-11-14T22:13:20Z",
        "Modify Time        = 2023-11-14T22:13:22Z",
        "Wait Until         = 2023-11-14T22:14:20Z",
        f"Previous Eval      = {EVAL_ID_2[:8]}",
        "Next Eval          = <none>",
        f"Blocked Eval       = {BLOCKED_EVAL_ID[:8]}",
        "",
        "Queued Allocations (could not be placed)",
        "Task Group  Queued",
        "web         1",
        "",
        "Failed Placements",
        "Task Group  Reason",
        "web         resources exhausted on 3 nodes",
        "",
        "Allocations",
        "ID        Node ID   Task Group  Version  Desired  Status   Created  Modified",
        f"{ALLOC_ID[:8]}  {NODE_ID[:8]}  web         0        run      pending",
    ]
    [listing] = state.calls("Allocs.List")
    assert (listing.job_id, listing.namespace) == ("web", "default")

    code, out, _ = run(capsys, "eval", "status", "-json", "-address", addr, EVAL_ID[:6])
    assert code == 0
    doc = json.loads(out)
    assert doc["eval"]["id"] == EVAL_ID
    assert doc["eval"]["queued_allocations"] == {"web": 1, "db": 0}
    assert [a["id"] for a in doc["allocations"]] == [ALLOC_ID]


def test_eval_status__no_allocs(fake: tuple[FakeDrover, str], capsys: pytest.CaptureFixture[str]) -> None:
    state, addr = fake
    state.evals[EVAL_ID] = structs_pb2.Evaluation(id=EVAL_ID, job_id="web", status="pending")
    code, out, _ = run(capsys, "eval", "status", "-address", addr, EVAL_ID)
    assert code == 0
    assert out.endswith("\nAllocations\nNo allocations placed\n")
    assert "Queued Allocations" not in out and "Failed Placements" not in out


# ---------------------------------------------------------------------------------------
# job plan


def plan_fixture(*, changed: bool = True, version: int = 3) -> api_pb2.JobPlanResponse:
    plan = api_pb2.JobPlanResponse(
        meta=api_pb2.QueryMeta(index=40), current_version=version, job_changed=changed
    )
    plan.groups["web"].buckets.update(
        {"place": 1, "update_destructive": 2, "ignore": 1, "reschedule_now": 1, "canary": 1}
    )
    plan.groups["old"].buckets.update({"stop": 3})
    plan.queued.update({"web": 1, "old": 0})
    return plan


def test_job_plan__table_of_buckets(cli: SpecCli) -> None:
    state = cli.state
    state.jobs["web"] = structs_pb2.Job(id="web", version=3)
    state.plan_response = plan_fixture()
    code, out, err = cli.job("plan", "web 4")
    # Allocations would be created and updated: Nomad's exit status 1, no error line.
    assert (code, err) == (1, [])
    assert out.splitlines() == [
        'Job: "web" (changes: version 3 -> 4)',
        "",
        "Group  Place  Update (destructive)  Update (in-place)  Stop  Migrate  Lost  Ignore  canary"
        "  Reschedule (now)",
        "web    1      2                     0                  0     0        0     1       1       1",
        "old    0      0                     0                  3     0        0     0       0       0",
        "",
        "Scheduler dry-run: 1 allocation(s) could not be placed now (would be queued):",
        "Group  Queued",
        "web    1",
    ]
    [request] = state.calls("Jobs.Plan")
    assert request.job == to_proto(web_job(4), structs_pb2.Job())
    assert state.calls("Jobs.Register") == []


def test_job_plan__new_job(cli: SpecCli) -> None:
    state = cli.state
    plan = api_pb2.JobPlanResponse(job_changed=True)
    plan.groups["web"].buckets["place"] = 2
    state.plan_response = plan
    code, out, _ = cli.job("plan", "web 2")
    assert code == 1  # two allocations would be created
    lines = out.splitlines()
    assert lines[0] == 'Job: "web" (new)'
    assert lines[3].split() == ["web", "2", "0", "0", "0", "0", "0", "0"]
    assert lines[-1] == "Scheduler dry-run: all allocations can be placed."


def test_job_plan__no_changes__exit_0(cli: SpecCli) -> None:
    state = cli.state
    state.jobs["web"] = structs_pb2.Job(id="web", version=2)
    plan = api_pb2.JobPlanResponse(current_version=2, job_changed=False)
    plan.groups["web"].buckets["ignore"] = 2
    state.plan_response = plan
    code, out, _ = cli.job("plan", "web 2")
    assert code == 0
    assert out.splitlines()[0] == 'Job: "web" (no changes)'


def test_job_plan__group_without_buckets_gets_a_zero_row(cli: SpecCli) -> None:
    state = cli.state
    state.plan_response = api_pb2.JobPlanResponse(job_changed=True)
    code, out, _ = cli.job("plan", "web 0")
    assert code == 0
    assert out.splitlines()[3].split() == ["web", "0", "0", "0", "0", "0", "0", "0"]


def test_job_plan__json(cli: SpecCli) -> None:
    state = cli.state
    state.plan_response = plan_fixture()
    code, out, _ = cli.job("plan", "web 4", "-json")
    assert code == 1  # the same exit status as without -json: allocations would change
    assert json.loads(out) == {
        "meta": {"index": 40, "known_leader": False, "served_by": ""},
        "groups": {
            "web": {
                "buckets": {
                    "place": 1,
                    "update_destructive": 2,
                    "ignore": 1,
                    "reschedule_now": 1,
                    "canary": 1,
                }
            },
            "old": {"buckets": {"stop": 3}},
        },
        "current_version": 3,
        "job_changed": True,
        "queued": {"web": 1, "old": 0},
        "warnings": [],
        "new_job": False,
        "failed_tg_metrics": {},
    }
    assert state.calls("Jobs.Get") == []


def test_job_plan__periodic_job(cli: SpecCli) -> None:
    state = cli.state
    state.plan_response = api_pb2.JobPlanResponse(job_changed=True)
    code, out, _ = cli.job("plan", "periodic", name="nightly")
    assert code == 0
    assert out.splitlines() == [
        'Job: "nightly" (new)',
        "",
        "Job is periodic: registering it places no allocations by itself; each child job it launches"
        " is scheduled then.",
    ]


def test_job_plan__read_retried_after_deadline_exceeded(cli: SpecCli) -> None:
    state = cli.state
    state.faults["Jobs.Plan"].append((grpc.StatusCode.DEADLINE_EXCEEDED, "slow"))
    state.faults["Jobs.Plan"].append((grpc.StatusCode.UNAVAILABLE, "no leader"))
    code, _, err = cli.job("plan", "web 1")
    assert (code, err) == (0, [])
    assert len(state.calls("Jobs.Plan")) == 3


def test_job_plan__invalid_argument__exit_1(cli: SpecCli) -> None:
    state = cli.state
    state.outage["Jobs.Plan"] = (grpc.StatusCode.INVALID_ARGUMENT, "job.type: can not change")
    code, out, err = cli.job("plan", "web 1")
    assert (code, out, err) == (1, "", ["Error: job.type: can not change"])


def test_job_plan__help_documents_exit_codes(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["job", "plan", "--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert "Exit status:" in out
    assert "0  nothing would change: no allocation would be created, destroyed or updated" in out
    assert "1  allocations would be created, destroyed or updated" in out


# ---------------------------------------------------------------------------------------
# node


def node_fixture(events: int = 0) -> structs_pb2.Node:
    node = structs_pb2.Node(
        id=NODE_ID,
        name="client-1",
        datacenter="dc1",
        status="ready",
        scheduling_eligibility="eligible",
        secret_id="s3cr3t",
    )
    for i in range(events):
        node.events.add(message=f"event {i}", subsystem="Cluster", timestamp_ns=SUBMIT_NS + i * 10**9)
    return node


def test_node_status__last_10_events_and_allocs(
    fake: tuple[FakeDrover, str], capsys: pytest.CaptureFixture[str]
) -> None:
    state, addr = fake
    state.nodes[NODE_ID] = node_fixture(events=12)
    state.add_allocs(web_alloc(ALLOC_ID, NODE_ID), web_alloc(ALLOC_ID_2, NODE_ID_2))
    code, out, err = run(capsys, "node", "status", "-address", addr, "client-1")
    assert (code, err) == (0, [])
    lines = out.splitlines()
    events = lines[lines.index("Node Events") + 2 : lines.index("Allocations") - 2]
    assert [line.split()[-1] for line in events] == [str(i) for i in range(11, 1, -1)]
    assert "(2 older events not shown; -verbose shows all)" in lines
    assert ALLOC_ID[:8] in out and ALLOC_ID_2[:8] not in out
    assert state.calls("Allocs.List")[0].node_id == NODE_ID
    code, out, _ = run(capsys, "node", "status", "-json", "-address", addr, NODE_ID[:4])
    assert code == 0
    doc = json.loads(out)
    assert doc["node"]["id"] == NODE_ID and doc["node"]["secret_id"] == ""
    assert [a["id"] for a in doc["allocations"]] == [ALLOC_ID]


def test_node_drain__enable_and_disable(
    fake: tuple[FakeDrover, str], capsys: pytest.CaptureFixture[str]
) -> None:
    state, addr = fake
    state.nodes[NODE_ID] = node_fixture()
    # -detach: this fake server never completes a drain (tests/cluster/test_drain.py follows one).
    code, out, err = run(
        capsys, "node", "drain", "-enable", "-detach", "-deadline", "30m", "-address", addr, "client-1"
    )
    assert (code, err) == (0, [])
    assert out.startswith(f'Node "{NODE_ID[:8]}" drain strategy set (deadline 30m)')
    code, _, _ = run(capsys, "node", "drain", "-enable", "-detach", "-force", "-address", addr, NODE_ID)
    assert code == 0
    code, out, _ = run(capsys, "node", "drain", "-disable", "-address", addr, NODE_ID[:6])
    assert code == 0
    assert out.startswith(f'Node "{NODE_ID[:8]}" drain strategy unset')
    first, forced, off = state.calls("Nodes.UpdateDrain")
    assert first.node_id == NODE_ID and first.drain_strategy.deadline_ns == 30 * 60 * 10**9
    # The server rejects negative deadlines: "force" is a deadline that has already passed.
    assert forced.drain_strategy.deadline_ns == 1
    assert not off.HasField("drain_strategy") and off.mark_eligible


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["-enable", "-force", "-no-deadline"], "Error: -no-deadline and -force can not be combined"),
        (
            ["-enable", "-deadline", "0"],
            'Error: -deadline must be positive, got "0" (see -no-deadline, -force)',
        ),
        (["-disable", "-deadline", "1h"], "Error: -deadline only applies with -enable"),
        (["-enable", "-keep-ineligible"], "Error: -keep-ineligible only applies with -disable"),
        (["-disable", "-detach"], "Error: -detach only applies with -enable"),
    ],
    ids=[
        "force-and-no-deadline",
        "zero-deadline",
        "deadline-with-disable",
        "keep-ineligible-with-enable",
        "detach-with-disable",
    ],
)
def test_node_drain__conflicting_flags(
    fake: tuple[FakeDrover, str], capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    code, out, err = run(capsys, "node", "drain", *argv, "-address", fake[1], NODE_ID)
    assert (code, out, err) == (1, "", [message])
    assert fake[0].requests == []


def test_node_eligibility(fake: tuple[FakeDrover, str], capsys: pytest.CaptureFixture[str]) -> None:
    state, addr = fake
    state.nodes[NODE_ID] = node_fixture()
    assert run(capsys, "node", "eligibility", "-disable", "-address", addr, "client-1")[0] == 0
    assert run(capsys, "node", "eligibility", "-enable", "-address", addr, "client-1")[0] == 0
    assert [r.eligibility for r in state.calls("Nodes.UpdateEligibility")] == ["ineligible", "eligible"]
    assert [r.node_id for r in state.calls("Nodes.UpdateEligibility")] == [NODE_ID, NODE_ID]


def test_operator_state__json(fake: tuple[FakeDrover, str], capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "operator", "state", "-json", "-address", fake[1])
    assert code == 0
    assert json.loads(out) == {
        "digest": "abc123",
        "applied_index": 42,
        "commit_index": 43,
        "server": "s1",
        "leader": True,
        "term": 3,
    }


def test_operator_state__address_from_env(
    fake: tuple[FakeDrover, str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DROVER_ADDR", fake[1])
    code, out, _ = run(capsys, "operator", "state")
    assert code == 0
    assert "Digest        = abc123" in out


def test_operator_snapshot__save_then_restore(
    fake: tuple[FakeDrover, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state, addr = fake
    path = tmp_path / "state.snap"
    code, out, _ = run(capsys, "operator", "snapshot", "save", "-address", addr, str(path))
    assert code == 0
    assert path.read_bytes() == snapshot_fixture().SerializeToString()
    assert "index 77" in out
    code, _, _ = run(capsys, "operator", "snapshot", "restore", "-address", addr, str(path))
    assert code == 0
    [request] = state.calls("Operator.SnapshotRestore")
    assert request.snapshot == snapshot_fixture()


def test_operator_snapshot__restore_garbage(
    fake: tuple[FakeDrover, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "garbage.snap"
    path.write_bytes(b"\xff\xff\xff\xff")
    code, _, err = run(capsys, "operator", "snapshot", "restore", "-address", fake[1], str(path))
    assert code == 1 and len(err) == 1 and "not a drover snapshot" in err[0]
    assert fake[0].requests == []


# ---------------------------------------------------------------------------------------
# Retries and unreachable servers


def test_unavailable__retried_until_success(
    fake: tuple[FakeDrover, str], capsys: pytest.CaptureFixture[str]
) -> None:
    state, addr = fake
    state.faults["Operator.StateDigest"] += [(grpc.StatusCode.UNAVAILABLE, "no cluster leader")] * 2
    code, out, err = run(capsys, "operator", "state", "-address", addr)
    assert (code, err) == (0, [])
    assert len(state.calls("Operator.StateDigest")) == 3
    assert "abc123" in out


def test_unavailable__gives_up_after_retry_deadline(
    fake: tuple[FakeDrover, str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    state, addr = fake
    state.outage["Jobs.List"] = (grpc.StatusCode.UNAVAILABLE, "no cluster leader")
    backoffs: list[float] = []

    def recorded_sleep(seconds: float) -> None:
        backoffs.append(seconds)
        time.sleep(seconds)

    monkeypatch.setattr(sdk, "time", types.SimpleNamespace(monotonic=time.monotonic, sleep=recorded_sleep))
    code, out, err = run(capsys, "job", "status", "-retry-deadline", "0.5", "-address", addr)
    assert code == 1 and out == ""
    assert len(err) == 1
    assert err[0].startswith("Error: no server answered after")
    assert err[0].endswith(": no cluster leader")
    attempts = len(state.calls("Jobs.List"))
    assert attempts >= 3
    # It gave up within its deadline: every attempt it reports was made, one backoff
    # between each two, and those backoffs fit in the 0.5 s it was given.
    assert err[0].startswith(f"Error: no server answered after {attempts} attempt(s) in 0.5s")
    assert len(backoffs) == attempts - 1 and sum(backoffs) <= 0.5, backoffs


def test_connection_refused__one_error_line(capsys: pytest.CaptureFixture[str]) -> None:
    # Port 1 on localhost: nothing listens there, so every attempt is refused.
    code, out, err = run(capsys, "job", "status", "-retry-deadline", "0.2", "-address", "127.0.0.1:1")
    assert code == 1 and out == ""
    assert err == ["Error: no drover server at 127.0.0.1:1: connection refused"]


def test_unavailable__rotates_to_next_address(
    fake: tuple[FakeDrover, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state, addr = fake
    path = tmp_path / "state.snap"
    code, _, err = run(capsys, "operator", "snapshot", "save", "-address", f"127.0.0.1:1,{addr}", str(path))
    assert (code, err) == (0, [])
    assert len(state.calls("Operator.SnapshotSave")) == 1
    assert path.read_bytes() == snapshot_fixture().SerializeToString()


def test_snapshot_save__to_a_device_writes_in_place(
    fake: tuple[FakeDrover, str], capsys: pytest.CaptureFixture[str]
) -> None:
    # /dev/null must stay a device: an atomic rename over it would replace the node.
    code, _, err = run(capsys, "operator", "snapshot", "save", "-address", fake[1], os.devnull)
    assert (code, err) == (0, [])
    assert not os.path.isfile(os.devnull)


# ---------------------------------------------------------------------------------------
# agent


@pytest.fixture
def fake_agents(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """Stand-in agent modules that record the config they are started with."""
    started: list[object] = []

    def record(cfg: object) -> int:
        started.append(cfg)
        return 0

    server_mod = types.ModuleType("drover.server.agent")
    server_mod.run_server = record  # type: ignore[attr-defined]
    server_mod.run_dev = record  # type: ignore[attr-defined]
    client_mod = types.ModuleType("drover.client.agent")
    client_mod.run_client = record  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "drover.server.agent", server_mod)
    monkeypatch.setitem(sys.modules, "drover.client.agent", client_mod)
    return started


def test_agent_server__flags_over_config_file(
    fake_agents: list[object], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg_file = tmp_path / "server.hcl"
    cfg_file.write_text('node_name = "from-file"\ndata_dir = "/d"\nraft_port = 9001\n')
    argv = [
        "agent",
        "-server",
        "-config",
        str(cfg_file),
        "-node-name",
        "s1",
        "-peers",
        "a:1,b:2",
        "-log-json",
    ]
    code, _, _ = run(capsys, *argv)
    assert code == 0
    assert fake_agents == [
        ServerConfig(node_name="s1", data_dir="/d", raft_port=9001, peers=("a:1", "b:2"), log_json=True)
    ]


def test_agent_client__meta_flags(fake_agents: list[object], capsys: pytest.CaptureFixture[str]) -> None:
    argv = [
        "agent",
        "-client",
        "-node-name",
        "c1",
        "-data-dir",
        "/d",
        "-servers",
        "s:4646",
        "-meta",
        "rack=r1",
    ]
    code, _, _ = run(capsys, *argv)
    assert code == 0
    [cfg] = fake_agents
    assert getattr(cfg, "servers") == ("s:4646",)  # noqa: B009
    assert getattr(cfg, "meta") == {"rack": "r1"}  # noqa: B009


def test_agent_server__missing_data_dir(
    fake_agents: list[object], capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run(capsys, "agent", "-server", "-node-name", "s1")
    assert code == 1 and len(err) == 1 and "'data_dir'" in err[0]
    assert fake_agents == []


def test_agent_dev__rejects_server_flags(
    fake_agents: list[object], capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run(capsys, "agent", "-dev", "-peers", "a:1")
    assert (code, err) == (1, ["Error: flag -peers does not apply to agent -dev"])


def test_usage_error_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["node", "drain", "n1"])
    assert info.value.code == 2


# ---------------------------------------------------------------------------------------
# Helpers


def test_format_table__aligned_no_trailing_space() -> None:
    assert format_table(["ID", "Status"], [["a", "running"], ["bbbb", ""]]).splitlines() == [
        "ID    Status",
        "a     running",
        "bbbb",
    ]


@pytest.mark.parametrize(
    ("text", "ns"),
    [
        ("1h", 3_600_000_000_000),
        ("1h30m", 5_400_000_000_000),
        ("90s", 90_000_000_000),
        ("-1s", -1_000_000_000),
        ("0", 0),
    ],
    ids=["hour", "compound", "seconds", "negative", "zero"],
)
def test_parse_duration(text: str, ns: int) -> None:
    assert parse_duration_ns(text) == ns
