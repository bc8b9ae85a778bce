"""Placement metrics in the ``drover`` CLI: ``job plan`` and ``eval status`` say why groups
would not place, ``alloc status -verbose`` shows how the node was chosen and ``-json``
carries ``metrics.score_meta_data``. Against an IN-PROCESS FAKE gRPC server (canned
answers, not the real drover server); the formatting helpers are checked directly too."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from drover.cli._placement import failed_group_lines, metric_lines, score_table
from drover.v1 import api_pb2, api_pb2_grpc, structs_pb2
from tests.fixtures.fake_grpc import run as run_cli
from tests.fixtures.fake_grpc import serving

ALLOC_ID = "a11c0000-0000-4000-8000-000000000001"
EVAL_ID = "e7a10000-0000-4000-8000-000000000001"
NODE_A = "b0de0000-0000-4000-8000-00000000000a"
NODE_B = "b0de0000-0000-4000-8000-00000000000b"


def missing_drivers(nodes: int, failures: int = 1) -> structs_pb2.AllocMetric:
    return structs_pb2.AllocMetric(
        nodes_evaluated=nodes,
        nodes_filtered=nodes,
        nodes_in_pool=nodes,
        nodes_available={"dc1": nodes},
        constraint_filtered={"missing drivers": nodes},
        coalesced_failures=failures - 1,
    )


def placed_metric() -> structs_pb2.AllocMetric:
    return structs_pb2.AllocMetric(
        nodes_evaluated=3,
        nodes_filtered=1,
        nodes_in_pool=3,
        constraint_filtered={"constraint ${attr.kernel.name} = linux": 1},
        nodes_exhausted=0,
        score_meta_data=[
            structs_pb2.NodeScoreMeta(node_id=NODE_A, scores={"binpack": 0.52}, norm_score=0.52),
            structs_pb2.NodeScoreMeta(
                node_id=NODE_B,
                scores={"binpack": 0.61, "job-anti-affinity": -0.5, "node-reschedule-penalty": -1.0},
                norm_score=-0.296667,
            ),
        ],
    )


# ---------------------------------------------------------------------------------------
# The formatting, directly


def test_metric_lines__counts_reasons_and_dimensions() -> None:
    metric = structs_pb2.AllocMetric(
        nodes_evaluated=5,
        nodes_filtered=3,
        nodes_in_pool=5,
        nodes_available={"dc1": 5, "dc2": 0},
        constraint_filtered={"constraint ${attr.kernel.name} = linux": 1, "missing drivers": 2},
        class_filtered={"": 1, "gpu": 2},
        nodes_exhausted=2,
        dimension_exhausted={"memory": 2},
    )
    assert metric_lines(metric) == [
        "  * 5 nodes evaluated of 5 in the pool, 3 filtered, 2 exhausted",
        '  * No nodes are available in datacenter "dc2"',
        '  * Constraint "missing drivers": 2 nodes excluded by filter',
        '  * Constraint "${attr.kernel.name} = linux": 1 node excluded by filter',
        '  * Class "gpu": 2 nodes excluded by filter',
        "  * Resources exhausted on 2 nodes",
        '  * Dimension "memory" exhausted on 2 nodes',
    ]


def test_failed_group_lines__group_order_then_the_rest() -> None:
    lines = failed_group_lines({"z": missing_drivers(1), "web": missing_drivers(2, failures=3)}, ["web"])
    assert lines == [
        'Task Group "web" (failed to place 3 allocations):',
        "  * 2 nodes evaluated of 2 in the pool, 2 filtered, 0 exhausted",
        '  * Constraint "missing drivers": 2 nodes excluded by filter',
        'Task Group "z" (failed to place 1 allocation):',
        "  * 1 node evaluated of 1 in the pool, 1 filtered, 0 exhausted",
        '  * Constraint "missing drivers": 1 node excluded by filter',
    ]


def test_score_table__every_standard_column_and_missing_components_as_zero() -> None:
    headers, rows = score_table(placed_metric(), full_ids=False)
    assert headers == ["Node", "binpack", "job-anti-affinity", "node-reschedule-penalty", "final score"]
    assert rows == [[NODE_A[:8], "0.52", "0", "0", "0.52"], [NODE_B[:8], "0.61", "-0.5", "-1", "-0.297"]]
    spread = structs_pb2.AllocMetric(
        score_meta_data=[structs_pb2.NodeScoreMeta(node_id="n1", scores={"allocation-spread": 1.0})]
    )
    assert score_table(spread, full_ids=True)[0][-2:] == ["allocation-spread", "final score"]


# ---------------------------------------------------------------------------------------
# The commands, against an in-process fake


class FakeState:
    """IN-PROCESS FAKE server state: one alloc, one eval, one plan answer."""

    def __init__(self) -> None:
        self.alloc = structs_pb2.Allocation(
            id=ALLOC_ID,
            eval_id=EVAL_ID,
            name="web.web[0]",
            node_id=NODE_A,
            job_id="web",
            task_group="web",
            desired_status="run",
            client_status="running",
            metrics=placed_metric(),
        )
        self.eval = structs_pb2.Evaluation(
            id=EVAL_ID,
            job_id="web",
            status="complete",
            type="service",
            queued_allocations={"web": 2},
            failed_tg_allocs={"web": "no node is feasible"},
            failed_tg_metrics={"web": missing_drivers(3, failures=2)},
        )
        self.plan = api_pb2.JobPlanResponse(job_changed=True, new_job=True, queued={"web": 2})
        self.plan.groups["web"].buckets.update({"place": 2})
        self.plan.failed_tg_metrics["web"].CopyFrom(missing_drivers(3, failures=2))


class _Answering:
    """A fake servicer that answers from the one FakeState the test set up, so the CLI's
    alloc, eval and plan reads all see the same placement."""

    def __init__(self, state: FakeState) -> None:
        self.state = state


class _Allocs(_Answering, api_pb2_grpc.AllocsServicer):
    def Get(self, request: Any, context: grpc.ServicerContext) -> api_pb2.AllocGetResponse:
        if request.alloc_id != self.state.alloc.id:
            context.abort(grpc.StatusCode.NOT_FOUND, "no such alloc")
        return api_pb2.AllocGetResponse(alloc=self.state.alloc)

    def List(self, request: Any, context: grpc.ServicerContext) -> api_pb2.AllocListResponse:
        return api_pb2.AllocListResponse(allocs=[self.state.alloc])


class _Evals(_Answering, api_pb2_grpc.EvalsServicer):
    def Get(self, request: Any, context: grpc.ServicerContext) -> api_pb2.EvalGetResponse:
        if request.eval_id != self.state.eval.id:
            context.abort(grpc.StatusCode.NOT_FOUND, "no such eval")
        return api_pb2.EvalGetResponse(eval=self.state.eval)


class _Jobs(_Answering, api_pb2_grpc.JobsServicer):
    def Plan(self, request: Any, context: grpc.ServicerContext) -> api_pb2.JobPlanResponse:
        return self.state.plan

    def Get(self, request: Any, context: grpc.ServicerContext) -> api_pb2.JobGetResponse:
        context.abort(grpc.StatusCode.NOT_FOUND, "job not found")
        raise AssertionError("unreachable")


@pytest.fixture
def fake() -> Iterator[tuple[FakeState, str]]:
    state = FakeState()
    with serving(
        (api_pb2_grpc.add_AllocsServicer_to_server, _Allocs(state)),
        (api_pb2_grpc.add_EvalsServicer_to_server, _Evals(state)),
        (api_pb2_grpc.add_JobsServicer_to_server, _Jobs(state)),
        max_workers=4,
    ) as addr:
        yield state, addr


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, list[str]]:
    """Run the CLI; (exit code, stdout lines). Nothing here may write to stderr."""
    code, out, err = run_cli(capsys, *argv)
    assert err == []
    return code, out.splitlines()


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> Any:
    """Run the CLI with -json; it must succeed, and its stdout is one JSON document."""
    code, lines = run(capsys, *argv, "-json")
    assert code == 0
    return json.loads("\n".join(lines))


def section(lines: list[str], title: str) -> list[str]:
    start = lines.index(title)
    return lines[start:]


def test_alloc_status_verbose__placement_metrics_and_score_table(
    fake: tuple[FakeState, str], capsys: pytest.CaptureFixture[str]
) -> None:
    _, addr = fake
    code, lines = run(capsys, "alloc", "status", "-verbose", "-address", addr, ALLOC_ID)
    assert code == 0
    assert section(lines, "Placement Metrics") == [
        "Placement Metrics",
        "  * 3 nodes evaluated of 3 in the pool, 1 filtered, 0 exhausted",
        '  * Constraint "${attr.kernel.name} = linux": 1 node excluded by filter',
        "",
        "Node                                  binpack  job-anti-affinity  node-reschedule-penalty  final score",
        f"{NODE_A}  0.52     0                  0                        0.52",
        f"{NODE_B}  0.61     -0.5               -1                       -0.297",
    ]
    code, lines = run(capsys, "alloc", "status", "-address", addr, ALLOC_ID)
    assert code == 0 and "Placement Metrics" not in lines


def test_alloc_status_verbose__alloc_without_metrics(
    fake: tuple[FakeState, str], capsys: pytest.CaptureFixture[str]
) -> None:
    state, addr = fake
    state.alloc.ClearField("metrics")
    _, lines = run(capsys, "alloc", "status", "-verbose", "-address", addr, ALLOC_ID)
    assert section(lines, "Placement Metrics")[1].startswith("  <none")


def test_alloc_status_json__metrics_score_meta_data(
    fake: tuple[FakeState, str], capsys: pytest.CaptureFixture[str]
) -> None:
    _, addr = fake
    doc = run_json(capsys, "alloc", "status", "-address", addr, ALLOC_ID)
    metas = doc["metrics"]["score_meta_data"]
    assert [m["node_id"] for m in metas] == [NODE_A, NODE_B]
    assert metas[1]["scores"] == {"binpack": 0.61, "job-anti-affinity": -0.5, "node-reschedule-penalty": -1.0}
    assert metas[0]["norm_score"] == 0.52
    assert doc["metrics"]["constraint_filtered"] == {"constraint ${attr.kernel.name} = linux": 1}


def test_eval_status__failed_group_metrics(
    fake: tuple[FakeState, str], capsys: pytest.CaptureFixture[str]
) -> None:
    _, addr = fake
    code, lines = run(capsys, "eval", "status", "-address", addr, EVAL_ID)
    assert code == 0
    failed = section(lines, "Failed Placements")
    assert failed[:6] == [
        "Failed Placements",
        "Task Group  Reason",
        "web         no node is feasible",
        "",
        'Task Group "web" (failed to place 2 allocations):',
        "  * 3 nodes evaluated of 3 in the pool, 3 filtered, 0 exhausted",
    ]
    assert failed[6] == '  * Constraint "missing drivers": 3 nodes excluded by filter'


def test_eval_status_json__failed_group_metrics_with_every_count(
    fake: tuple[FakeState, str], capsys: pytest.CaptureFixture[str]
) -> None:
    _, addr = fake
    doc = run_json(capsys, "eval", "status", "-address", addr, EVAL_ID)
    assert doc["eval"]["failed_tg_allocs"] == {"web": "no node is feasible"}
    metric = doc["eval"]["failed_tg_metrics"]["web"]
    # The zeros a script asks about are there too: none exhausted, no class filtered.
    assert (metric["nodes_evaluated"], metric["nodes_filtered"], metric["nodes_exhausted"]) == (3, 3, 0)
    assert metric["constraint_filtered"] == {"missing drivers": 3}
    assert (metric["class_filtered"], metric["dimension_exhausted"], metric["coalesced_failures"]) == (
        {},
        {},
        1,
    )


def test_job_plan__names_missing_drivers_and_the_nodes_filtered(
    fake: tuple[FakeState, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("drover.server.jobspec")
    _, addr = fake
    path = tmp_path / "web.hcl"
    path.write_text(
        'job "web" {\n  group "web" {\n    count = 2\n    task "app" {\n      driver = "nspawn"\n    }\n  }\n}\n'
    )
    code, lines = run(capsys, "job", "plan", "-address", addr, str(path))
    assert code == 1
    tail = section(lines, "Scheduler dry-run: 2 allocation(s) could not be placed now (would be queued):")
    assert tail[3:] == [
        "",
        'Task Group "web" (failed to place 2 allocations):',
        "  * 3 nodes evaluated of 3 in the pool, 3 filtered, 0 exhausted",
        '  * Constraint "missing drivers": 3 nodes excluded by filter',
    ]
