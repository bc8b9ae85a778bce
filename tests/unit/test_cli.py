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
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest
from drover.v1 import api_pb2, api_pb2_grpc, raft_pb2, structs_pb2
from google.protobuf.message import Message

from scheduler import structs
from server.cli import format_table, main, parse_duration_ns
from server.codec import to_proto
from server.config import ServerConfig

EVAL_ID = "6f1c2d3e-0000-4000-8000-000000000001"
EVAL_ID_2 = "6f1c9999-0000-4000-8000-000000000002"
ALLOC_ID = "a11c0000-0000-4000-8000-000000000001"
NODE_ID = "b0de0000-0000-4000-8000-000000000001"
EVAL_INDEX = 10
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
    lock: threading.Lock = field(default_factory=threading.Lock)

    def enter(self, method: str, request: Message, context: grpc.ServicerContext) -> None:
        with self.lock:
            self.requests.append((method, request))
            fault = self.outage.get(method) or (self.faults[method].pop(0) if self.faults[method] else None)
        if fault is not None:
            context.abort(*fault)

    def calls(self, method: str) -> list[Any]:
        return [req for name, req in self.requests if name == method]


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
        self.fake.evals[EVAL_ID] = structs_pb2.Evaluation(
            id=EVAL_ID, job_id=job.id, status="pending", triggered_by="job-register", modify_index=EVAL_INDEX
        )
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

    def Versions(self, request: Any, context: grpc.ServicerContext) -> api_pb2.JobVersionsResponse:
        context.abort(grpc.StatusCode.UNIMPLEMENTED, "not in the fake")

    def Summary(self, request: Any, context: grpc.ServicerContext) -> api_pb2.JobSummaryResponse:
        context.abort(grpc.StatusCode.UNIMPLEMENTED, "not in the fake")


class _Evals(api_pb2_grpc.EvalsServicer):
    def __init__(self, fake: FakeDrover) -> None:
        self.fake = fake

    def Get(self, request: Any, context: grpc.ServicerContext) -> api_pb2.EvalGetResponse:
        self.fake.enter("Evals.Get", request, context)
        ev = self.fake.evals.get(request.eval_id)
        if ev is None:
            context.abort(grpc.StatusCode.NOT_FOUND, f'eval "{request.eval_id}" not found')
        # A blocking query past the eval's index "waits" for the scheduler, which completes it.
        if request.options.min_index >= ev.modify_index and ev.status == "pending":
            ev.status = "complete"
            ev.modify_index += 1
        return api_pb2.EvalGetResponse(meta=api_pb2.QueryMeta(index=ev.modify_index), eval=ev)

    def List(self, request: Any, context: grpc.ServicerContext) -> api_pb2.EvalListResponse:
        self.fake.enter("Evals.List", request, context)
        return api_pb2.EvalListResponse(evals=list(self.fake.evals.values()))


class _Allocs(api_pb2_grpc.AllocsServicer):
    def __init__(self, fake: FakeDrover) -> None:
        self.fake = fake

    def List(self, request: Any, context: grpc.ServicerContext) -> api_pb2.AllocListResponse:
        self.fake.enter("Allocs.List", request, context)
        allocs = [a for a in self.fake.allocs if not request.job_id or a.job_id == request.job_id]
        return api_pb2.AllocListResponse(allocs=allocs)

    def Get(self, request: Any, context: grpc.ServicerContext) -> api_pb2.AllocGetResponse:
        context.abort(grpc.StatusCode.UNIMPLEMENTED, "not in the fake")


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

    def RaftPeers(self, request: Any, context: grpc.ServicerContext) -> api_pb2.RaftPeersResponse:
        context.abort(grpc.StatusCode.UNIMPLEMENTED, "not in the fake")

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
    state = FakeDrover()
    pool = futures.ThreadPoolExecutor(max_workers=4)
    server = grpc.server(pool)
    api_pb2_grpc.add_JobsServicer_to_server(_Jobs(state), server)
    api_pb2_grpc.add_EvalsServicer_to_server(_Evals(state), server)
    api_pb2_grpc.add_AllocsServicer_to_server(_Allocs(state), server)
    api_pb2_grpc.add_OperatorServicer_to_server(_Operator(state), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield state, f"127.0.0.1:{port}"
    finally:
        server.stop(None).wait()
        pool.shutdown(wait=True)


def web_job(count: int = 2) -> structs.Job:
    task = structs.Task(name="app", driver="mock")
    return structs.Job(id="web", groups=(structs.TaskGroup(name="web", count=count, tasks=(task,)),))


@pytest.fixture
def fake_jobspec(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    """A stand-in ``server.jobspec``: "web N" parses to web_job(N), "bad" raises JobspecError."""
    mod = types.ModuleType("server.jobspec")

    class JobspecError(ValueError):
        pass

    def parse_jobspec(text: str, *, filename: str = "") -> structs.Job:
        words = text.split()
        if words[0] != "web":
            raise JobspecError(f"{filename}:1,1: unexpected {words[0]!r}")
        return web_job(int(words[1]))

    mod.JobspecError = JobspecError  # type: ignore[attr-defined]
    mod.parse_jobspec = parse_jobspec  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "server.jobspec", mod)
    return mod


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, list[str]]:
    """Run the CLI; return (exit code, stdout, stderr lines)."""
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err.splitlines()


# ---------------------------------------------------------------------------------------
# job run


def test_job_run__detach__sends_the_parsed_job(
    fake: tuple[FakeDrover, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    jobspec = pytest.importorskip("server.jobspec")
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


def test_job_run__detach__with_stand_in_jobspec(
    fake: tuple[FakeDrover, str],
    fake_jobspec: types.ModuleType,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    state, addr = fake
    path = tmp_path / "web.hcl"
    path.write_text("web 3")
    code, out, _ = run(capsys, "job", "run", "--detach", f"--address={addr}", str(path))
    assert code == 0
    [request] = state.calls("Jobs.Register")
    assert request.job == to_proto(web_job(3), structs_pb2.Job())
    assert "evaluation" in out


def test_job_run__monitors_eval_with_blocking_query(
    fake: tuple[FakeDrover, str],
    fake_jobspec: types.ModuleType,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    state, addr = fake
    state.allocs.append(
        structs_pb2.Allocation(
            id=ALLOC_ID,
            node_id=NODE_ID,
            job_id="web",
            task_group="web",
            desired_status="run",
            client_status="pending",
        )
    )
    path = tmp_path / "web.hcl"
    path.write_text("web 1")
    code, out, err = run(capsys, "job", "run", "-address", addr, str(path))
    assert (code, err) == (0, [])
    gets = state.calls("Evals.Get")
    assert [g.options.min_index for g in gets] == [0, EVAL_INDEX]
    assert gets[1].options.wait_ns > 0
    assert 'Evaluation status changed: "pending" -> "complete"' in out
    assert f'Evaluation "{EVAL_ID[:8]}" finished with status "complete"' in out
    assert ALLOC_ID[:8] in out and NODE_ID[:8] in out


def test_job_run__bad_job_file__one_error_line(
    fake: tuple[FakeDrover, str],
    fake_jobspec: types.ModuleType,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    state, addr = fake
    path = tmp_path / "bad.hcl"
    path.write_text("bad")
    code, _, err = run(capsys, "job", "run", "-address", addr, str(path))
    assert code == 1
    assert err == [f"Error: {path}:1,1: unexpected 'bad'"]
    assert state.requests == []


def test_job_run__invalid_job__rejected_locally(
    fake: tuple[FakeDrover, str],
    fake_jobspec: types.ModuleType,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    state, addr = fake
    path = tmp_path / "web.hcl"
    path.write_text("web -1")
    code, _, err = run(capsys, "job", "run", "-address", addr, str(path))
    assert code == 1
    assert len(err) == 1 and err[0].startswith("Error: job.groups[0].count")
    assert state.requests == []


def test_job_run__missing_file(fake: tuple[FakeDrover, str], capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "job", "run", "-address", fake[1], "/nonexistent/web.hcl")
    assert code == 1
    assert err == ["Error: /nonexistent/web.hcl: No such file or directory"]


def test_job_run__invalid_argument_from_server__exit_1_one_line(
    fake: tuple[FakeDrover, str],
    fake_jobspec: types.ModuleType,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    state, addr = fake
    state.outage["Jobs.Register"] = (
        grpc.StatusCode.INVALID_ARGUMENT,
        "job.groups[0].tasks[0].driver: unknown driver\n(second line)",
    )
    path = tmp_path / "web.hcl"
    path.write_text("web 1")
    code, out, err = run(capsys, "job", "run", "-address", addr, str(path))
    assert code == 1
    assert err == ["Error: job.groups[0].tasks[0].driver: unknown driver (second line)"]
    assert out == ""
    assert len(state.calls("Jobs.Register")) == 1


def test_job_run__write_not_retried_after_deadline_exceeded(
    fake: tuple[FakeDrover, str],
    fake_jobspec: types.ModuleType,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    state, addr = fake
    state.faults["Jobs.Register"].append((grpc.StatusCode.DEADLINE_EXCEEDED, "commit timed out"))
    path = tmp_path / "web.hcl"
    path.write_text("web 1")
    code, _, err = run(capsys, "job", "run", "-detach", "-address", addr, str(path))
    assert (code, err) == (1, ["Error: commit timed out"])
    assert len(state.calls("Jobs.Register")) == 1


def test_job_run__write_retried_while_no_leader(
    fake: tuple[FakeDrover, str],
    fake_jobspec: types.ModuleType,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    state, addr = fake
    state.faults["Jobs.Register"] += [(grpc.StatusCode.UNAVAILABLE, "no leader")] * 2
    path = tmp_path / "web.hcl"
    path.write_text("web 1")
    code, _, err = run(capsys, "job", "run", "-detach", "-address", addr, str(path))
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
    assert json.loads(out) == [{"id": "web", "submit_time_ns": str(SUBMIT_NS), "job_modify_index": "9"}]


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
    assert doc["job"] == {"id": "web", "status_description": "ok"}
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


def test_operator_state__json(fake: tuple[FakeDrover, str], capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "operator", "state", "-json", "-address", fake[1])
    assert code == 0
    assert json.loads(out) == {
        "digest": "abc123",
        "applied_index": "42",
        "commit_index": "43",
        "server": "s1",
        "leader": True,
        "term": "3",
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
    fake: tuple[FakeDrover, str], capsys: pytest.CaptureFixture[str]
) -> None:
    state, addr = fake
    state.outage["Jobs.List"] = (grpc.StatusCode.UNAVAILABLE, "no cluster leader")
    start = time.monotonic()
    code, out, err = run(capsys, "job", "status", "-retry-deadline", "0.5", "-address", addr)
    elapsed = time.monotonic() - start
    assert code == 1 and out == ""
    assert len(err) == 1
    assert err[0].startswith("Error: no server answered after")
    assert err[0].endswith(": no cluster leader")
    assert len(state.calls("Jobs.List")) >= 3
    assert elapsed < 3


def test_connection_refused__one_error_line(capsys: pytest.CaptureFixture[str]) -> None:
    # Port 1 on localhost: nothing listens there, so every attempt is refused.
    code, out, err = run(capsys, "job", "status", "-retry-deadline", "0.2", "-address", "127.0.0.1:1")
    assert code == 1 and out == ""
    assert len(err) == 1 and err[0].startswith("Error: no server answered")


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

    server_mod = types.ModuleType("server.agent")
    server_mod.run_server = record  # type: ignore[attr-defined]
    server_mod.run_dev = record  # type: ignore[attr-defined]
    client_mod = types.ModuleType("client_agent.agent")
    client_mod.run_client = record  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "server.agent", server_mod)
    monkeypatch.setitem(sys.modules, "client_agent.agent", client_mod)
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
