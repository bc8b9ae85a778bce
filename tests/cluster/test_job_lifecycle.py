"""A job's life through the CLI, as an operator lives it: three real servers, one real
client agent running ``mock`` tasks, ``drover`` in its own process each time.

Version 0, then version 1, each run followed through its deployment to success; ``job
history -p`` shows both and what changed; ``job revert web 0`` registers version 2 with
version 0's spec; ``job scale`` makes version 3 with the new count and the allocations to
match; ``job inspect`` prints the stored spec; ``job validate`` lists every problem of a
bad file and exits 1; ``job plan`` exits 0 for no change and 1 for one; ``job
deployments`` and ``deployment status`` show the rollouts.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from deploy.cluster import LocalCluster, wait_for
from drover.cli._jobdiff import diff_jobs
from drover.sdk import DroverClient
from tests.cluster.cli import run_cli
from tests.cluster.conftest import wait_settled
from tests.cluster.jobs import running_allocs


# Short health times so each deployment ends in seconds: healthy after 1 s running.
def _mock_job(
    name: str, *, run_for: str, count: int = 2, canary: int | None = None, health_check: str = ""
) -> str:
    """A job ``name`` of one group ``name`` of ``count`` mock tasks running for ``run_for``
    (a new value makes a new version); ``canary`` and ``health_check`` go into its update
    block when given, else the update block leaves them at their defaults."""
    steering = "".join(
        [
            f"\n      canary            = {canary}" if canary is not None else "",
            f'\n      health_check      = "{health_check}"' if health_check else "",
        ]
    )
    return f"""
job "{name}" {{
  datacenters = ["dc1"]
  group "{name}" {{
    count = {count}
    update {{
      max_parallel      = 2{steering}
      min_healthy_time  = "1s"
      healthy_deadline  = "30s"
      progress_deadline = "1m"
    }}
    task "server" {{
      driver = "mock"
      config {{
        run_for = "{run_for}"
      }}
      resources {{
        cpu    = 50
        memory = 32
      }}
    }}
  }}
}}
"""


# Three problems in one file: validate must name them all.
_BAD = """
job "web" {
  priority = 500
  group "web" {
    count = -1
    task "server" {
      driver = "mock"
      resources {
        memory = -5
      }
    }
  }
}
"""

_CLI_TIMEOUT_S = 120


@pytest.fixture
def cluster_with_client(tmp_path: Path) -> Iterator[LocalCluster]:
    """Three servers and one client agent, real processes, always stopped afterwards."""
    with LocalCluster(tmp_path / "cluster", servers=3, clients=1) as c:
        wait_settled(c)
        with DroverClient(c.grpc_addresses, retry_deadline=60) as client:
            wait_for(
                lambda: any(n.status == "ready" for n in client.list_nodes().nodes),
                60,
                0.2,
                lambda: "a ready node\n" + c.logs_tail(),
            )
        yield c


def _cli(cluster: LocalCluster, *args: str) -> subprocess.CompletedProcess[str]:
    return run_cli(cluster, *args, timeout=_CLI_TIMEOUT_S)


def _said(result: subprocess.CompletedProcess[str]) -> str:
    return f"exit {result.returncode}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"


def test_job_lifecycle__run_history_revert_scale_inspect_validate_plan(
    cluster_with_client: LocalCluster, tmp_path: Path
) -> None:
    cluster = cluster_with_client
    v0, v1, bad = tmp_path / "v0.hcl", tmp_path / "v1.hcl", tmp_path / "bad.hcl"
    v0.write_text(_mock_job("web", run_for="1h"))
    v1.write_text(_mock_job("web", run_for="2h"))
    bad.write_text(_BAD)

    # A new job: allocations would be created, so plan says 1; nothing is registered.
    planned = _cli(cluster, "job", "plan", str(v0))
    assert planned.returncode == 1 and planned.stderr == "", _said(planned)

    ran = _cli(cluster, "job", "run", str(v0))
    assert ran.returncode == 0, _said(ran)
    assert "==> Monitoring deployment" in ran.stdout, _said(ran)
    assert "successful: Deployment completed successfully" in ran.stdout, _said(ran)

    # The same file again: nothing would change.
    planned = _cli(cluster, "job", "plan", str(v0))
    assert planned.returncode == 0, _said(planned)
    assert 'Job: "web" (no changes)' in planned.stdout, _said(planned)
    # A new version would replace both allocations.
    planned = _cli(cluster, "job", "plan", str(v1))
    assert planned.returncode == 1, _said(planned)

    ran = _cli(cluster, "job", "run", str(v1))
    assert ran.returncode == 0, _said(ran)
    assert "registered (version 1)" in ran.stdout, _said(ran)

    history = _cli(cluster, "job", "history", "-p", "web")
    assert history.returncode == 0, _said(history)
    blocks = history.stdout.strip().split("\n\n")
    assert [b.splitlines()[0] for b in blocks] == ["Version     = 1", "Version     = 0"], _said(history)
    # Both deployments succeeded, so both versions are stable.
    assert all("Stable      = true" in b for b in blocks), _said(history)
    assert '  groups[web].tasks[server].config.run_for: "1h" -> "2h"' in blocks[0], _said(history)

    reverted = _cli(cluster, "job", "revert", "web", "0")
    assert reverted.returncode == 0, _said(reverted)
    assert 'Job "web" reverted to version 0 as version 2' in reverted.stdout, _said(reverted)
    with DroverClient(cluster.grpc_addresses, retry_deadline=60) as client:
        versions = {v.version: v for v in client.job_versions("web").versions}
        assert sorted(versions) == [0, 1, 2]
        assert diff_jobs(versions[0], versions[2]) == []
        assert diff_jobs(versions[1], versions[2]) != []

    scaled = _cli(cluster, "job", "scale", "web", "3")
    assert scaled.returncode == 0, _said(scaled)
    assert 'Job "web" group "web" scaled to 3 (version 3)' in scaled.stdout, _said(scaled)
    with DroverClient(cluster.grpc_addresses, retry_deadline=60) as client:
        allocs = wait_for(
            lambda: a if len(a := running_allocs(client, "web")) == 3 else None,
            60,
            0.2,
            lambda: "3 running allocs\n" + cluster.logs_tail(),
        )
        assert allocs is not None and {a.job_version for a in allocs} == {3}

    inspected = _cli(cluster, "job", "inspect", "web")
    assert inspected.returncode == 0, _said(inspected)
    spec = json.loads(inspected.stdout)
    assert (spec["id"], spec["version"], spec["groups"][0]["count"]) == ("web", 3, 3)
    assert json.loads(spec["groups"][0]["tasks"][0]["config_json"]) == {"run_for": "1h"}

    validated = _cli(cluster, "job", "validate", str(bad))
    assert validated.returncode == 1, _said(validated)
    assert len(validated.stderr.splitlines()) == 1 and "job validation failed" in validated.stderr
    problems = [line for line in validated.stdout.splitlines() if line.startswith("  * ")]
    for field in ("job.priority", "job.groups[0].count", "job.groups[0].tasks[0].resources.memory_mb"):
        # Each with the line of its field in the file: "  * bad.hcl:4: job.groups[0].count: ...".
        assert any(re.match(rf"  \* {re.escape(str(bad))}:\d+: {re.escape(field)}:", p) for p in problems), (
            _said(validated)
        )
    valid = _cli(cluster, "job", "validate", str(v1))
    assert (valid.returncode, valid.stdout) == (0, "Job validation successful\n"), _said(valid)

    listed = _cli(cluster, "job", "deployments", "-json", "web")
    assert listed.returncode == 0, _said(listed)
    deployments = json.loads(listed.stdout)
    # One per version that changed the group; newest first; every one finished well.
    assert [d["job_version"] for d in deployments] == [3, 2, 1, 0], _said(listed)
    assert {d["status"] for d in deployments} == {"successful"}, _said(listed)

    shown = _cli(cluster, "deployment", "status", deployments[0]["id"][:8])
    assert shown.returncode == 0, _said(shown)
    assert "Job Version = 3" in shown.stdout and "Status      = successful" in shown.stdout, _said(shown)
    table = shown.stdout.split("Deployed\n", 1)[1].splitlines()
    assert table[0].split()[:5] == ["Task", "Group", "Desired", "Placed", "Healthy"], _said(shown)


def _deployment_json(cluster: LocalCluster, ref: str) -> dict[str, object]:
    shown = _cli(cluster, "deployment", "status", "-json", ref)
    assert shown.returncode == 0, _said(shown)
    got: dict[str, object] = json.loads(shown.stdout)
    return got


def test_deployment_commands__promote_a_canary_then_set_health_by_hand(
    cluster_with_client: LocalCluster, tmp_path: Path
) -> None:
    cluster = cluster_with_client
    files = {name: tmp_path / f"{name}.hcl" for name in ("v0", "canary", "manual")}
    files["v0"].write_text(_mock_job("api", canary=0, health_check="task_states", run_for="1h"))
    files["canary"].write_text(_mock_job("api", canary=1, health_check="task_states", run_for="2h"))
    files["manual"].write_text(_mock_job("api", canary=0, health_check="manual", run_for="3h"))
    ran = _cli(cluster, "job", "run", str(files["v0"]))
    assert ran.returncode == 0, _said(ran)

    # Version 1 places one canary beside the old allocs and waits for promotion.
    ran = _cli(cluster, "job", "run", "-detach", str(files["canary"]))
    assert ran.returncode == 0, _said(ran)
    listed = _cli(cluster, "job", "deployments", "-json", "api")
    assert listed.returncode == 0, _said(listed)
    canary_id = json.loads(listed.stdout)[0]["id"]

    def waiting_for_promotion() -> dict[str, object] | None:
        got = _deployment_json(cluster, canary_id[:8])
        group = got["task_groups"]["api"]  # type: ignore[index]
        return got if group["canaries"] == 1 and group["healthy"] == 1 else None

    waiting = wait_for(waiting_for_promotion, 60, 0.5, lambda: "a healthy canary\n" + cluster.logs_tail())
    assert waiting is not None
    group = waiting["task_groups"]["api"]  # type: ignore[index]
    assert (waiting["status"], group["promoted"], group["desired"]) == ("running", False, 2)
    assert "requires manual promotion" in str(waiting["status_description"])
    promoted = _cli(cluster, "deployment", "promote", canary_id[:8])
    assert promoted.returncode == 0, _said(promoted)
    assert f'==> Deployment "{canary_id[:8]}" successful' in promoted.stdout, _said(promoted)
    done = _deployment_json(cluster, canary_id)
    assert (done["status"], done["task_groups"]["api"]["promoted"]) == ("successful", True)  # type: ignore[index]

    # Version 2: only an operator says whether its allocs are healthy.
    ran = _cli(cluster, "job", "run", "-detach", str(files["manual"]))
    assert ran.returncode == 0, _said(ran)
    listed = _cli(cluster, "job", "deployments", "-json", "api")
    manual_id = json.loads(listed.stdout)[0]["id"]
    assert manual_id != canary_id

    def placed_unset() -> list[str] | None:
        shown = _cli(cluster, "deployment", "status", "-verbose", manual_id)
        assert shown.returncode == 0, _said(shown)
        rows = shown.stdout.split("\nAllocations\n", 1)[1].splitlines()[1:]
        unset = [r.split()[0] for r in rows if r.split()[6] == "unset" and r.split()[5] == "running"]
        return unset if len(unset) == 2 else None

    allocs = wait_for(
        placed_unset, 60, 0.5, lambda: "2 running allocs of unset health\n" + cluster.logs_tail()
    )
    assert allocs is not None
    # Prefixes of the deployment's own allocs do; the command then follows it to the end.
    marked = _cli(
        cluster, "deployment", "alloc-health", "-healthy", ",".join(a[:8] for a in allocs), manual_id[:8]
    )
    assert marked.returncode == 0, _said(marked)
    assert "marked 2 healthy" in marked.stdout, _said(marked)
    assert f'==> Deployment "{manual_id[:8]}" successful' in marked.stdout, _said(marked)
