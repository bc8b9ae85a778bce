"""Feasibility by driver and placement metrics, whole: three real servers and a real client
agent (``mock`` and ``raw_exec``, no ``nspawn``: a community driver plugin, so the file is
accepted where container drivers are refused), jobs planned, run and inspected with the
``drover`` CLI as an operator would.

* A job whose task asks for a driver no node has is refused at plan time with the reason
  (``job plan`` names "missing drivers" and how many nodes it filtered); run anyway, it
  places nothing and its evaluation carries the same metrics (``failed_tg_metrics``).
* A placed ``raw_exec`` alloc keeps how its node was chosen: ``alloc status -verbose``
  shows "Placement Metrics" and the score table, ``-json`` has ``metrics.score_meta_data``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from deploy.cluster import LocalCluster, wait_for
from drover.sdk import DroverClient
from tests.cluster.cli import run_cli
from tests.cluster.conftest import ready_cluster


def _job(job_id: str, driver: str, config: str) -> str:
    return f"""
job "{job_id}" {{
  datacenters = ["dc1"]
  group "g" {{
    count = 1
    task "t" {{
      driver = "{driver}"
      config {{
        {config}
      }}
      resources {{
        cpu    = 50
        memory = 32
      }}
    }}
  }}
}}
"""


@pytest.fixture
def one_client(tmp_path: Path) -> Iterator[LocalCluster]:
    """Three real servers and one real client agent, always stopped afterwards."""
    with ready_cluster(tmp_path / "cluster", servers=3, clients=1) as cluster:
        yield cluster


def _write(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / f"{name}.hcl"
    path.write_text(text)
    return str(path)


def _eval_done(client: DroverClient, eval_id: str) -> bool:
    return client.get_eval(eval_id).eval.status in ("complete", "failed", "canceled")


def _run_detached(cluster: LocalCluster, path: str) -> str:
    result = run_cli(cluster, "job", "run", "-detach", path)
    assert result.returncode == 0, result.stderr
    match = re.search(r"evaluation ([0-9a-f-]{36})", result.stdout)
    assert match is not None, result.stdout
    return match.group(1)


def test_placement_metrics__driver_no_node_has__refused_at_plan_with_the_reason(
    one_client: LocalCluster, tmp_path: Path
) -> None:
    cluster = one_client
    path = _write(tmp_path, "dockerized", _job("dockerized", "nspawn", 'image = "debian"'))

    plan = run_cli(cluster, "job", "plan", path)
    assert plan.returncode == 1, plan.stderr  # allocations would be queued: not "all can be placed"
    assert "Scheduler dry-run: all allocations can be placed." not in plan.stdout
    assert 'Task Group "g" (failed to place 1 allocation):' in plan.stdout, plan.stdout
    assert '* Constraint "missing drivers": 1 node excluded by filter' in plan.stdout, plan.stdout
    assert "* 1 node evaluated of 1 in the pool, 1 filtered, 0 exhausted" in plan.stdout, plan.stdout

    eval_id = _run_detached(cluster, path)
    with DroverClient(cluster.grpc_addresses, retry_deadline=30) as client:
        wait_for(
            lambda: _eval_done(client, eval_id), 60, 0.2, lambda: "the eval done\n" + cluster.logs_tail()
        )
        assert client.list_allocs(job_id="dockerized").allocs == []  # never sent to a node without nspawn

    shown = run_cli(cluster, "eval", "status", "-json", eval_id)
    assert shown.returncode == 0, shown.stderr
    metric = json.loads(shown.stdout)["eval"]["failed_tg_metrics"]["g"]
    assert metric["constraint_filtered"] == {"missing drivers": 1}
    assert metric["nodes_evaluated"] == 1 and metric["nodes_filtered"] == 1
    text = run_cli(cluster, "eval", "status", eval_id)
    assert text.returncode == 0, text.stderr
    assert '* Constraint "missing drivers": 1 node excluded by filter' in text.stdout, text.stdout


def test_placement_metrics__placed_alloc_shows_how_its_node_was_chosen(
    one_client: LocalCluster, tmp_path: Path
) -> None:
    cluster = one_client
    config = 'command = "/bin/sh"\n        args = ["-c", "sleep 300"]'
    path = _write(tmp_path, "sleeper", _job("sleeper", "raw_exec", config))
    plan = run_cli(cluster, "job", "plan", path)
    assert "Scheduler dry-run: all allocations can be placed." in plan.stdout, plan.stdout + plan.stderr

    _run_detached(cluster, path)
    with DroverClient(cluster.grpc_addresses, retry_deadline=30) as client:
        allocs = wait_for(
            lambda: client.list_allocs(job_id="sleeper").allocs,
            60,
            0.2,
            lambda: "the sleeper placed\n" + cluster.logs_tail(),
        )
        assert allocs is not None
        (alloc,) = allocs
        node_id = alloc.node_id

    verbose = run_cli(cluster, "alloc", "status", "-verbose", alloc.id)
    assert verbose.returncode == 0, verbose.stderr
    lines = verbose.stdout.splitlines()
    at = lines.index("Placement Metrics")
    assert lines[at + 1] == "  * 1 node evaluated of 1 in the pool, 0 filtered, 0 exhausted", verbose.stdout
    header = lines.index(
        "Node                                  binpack  job-anti-affinity  node-reschedule-penalty  final score"
    )
    row = lines[header + 1].split()
    assert row[0] == node_id and 0.0 < float(row[1]) <= 1.0 and row[-1] == row[1], verbose.stdout

    as_json = run_cli(cluster, "alloc", "status", "-json", alloc.id)
    assert as_json.returncode == 0, as_json.stderr
    metas = json.loads(as_json.stdout)["metrics"]["score_meta_data"]
    assert [m["node_id"] for m in metas] == [node_id]
    assert metas[0]["scores"]["binpack"] == pytest.approx(metas[0]["norm_score"])
