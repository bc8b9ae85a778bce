"""deploy/examples/variables.nomad.hcl run on a dev agent through the CLI, as a user runs
it: ``-var`` overriding defaults reaches the stored job, and the allocs the job asks for
run; a file with several mistakes is refused with all of them and nothing is sent."""

from __future__ import annotations

from pathlib import Path

from deploy.cluster import wait_for
from drover.sdk import Client
from tests.cluster.cli import drover_cli
from tests.cluster.conftest import DevAgent

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "deploy" / "examples" / "variables.nomad.hcl"
JOB_ID = "variables-example"


def test_example__var_overrides_a_default__the_job_runs_with_it(dev_agent: DevAgent, tmp_path: Path) -> None:
    var_file = tmp_path / "prod.json"
    var_file.write_text('{"env": "staging", "replicas": 5}')

    result = drover_cli(
        "job", "run", "-detach", "-address", dev_agent.address,
        "-var-file", str(var_file), "-var", "env=prod", "-var", "replicas=2", str(EXAMPLE),
    )  # fmt: skip

    assert result.returncode == 0, result.stdout + result.stderr
    with Client(dev_agent.address) as client:
        job = client.get_job(JOB_ID).job
        # -var wins over the var file, which wins over the defaults ("dev", 1).
        assert job.groups[0].count == 2
        assert job.meta["env"] == "PROD" and job.meta["replicas"] == "2"
        task = job.groups[0].tasks[0]
        assert task.env["SERVICE_NAME"] == "prod-web"
        assert task.resources.memory_mb == 64
        # Runtime interpolation reaches the server as text, for the client.
        assert task.env["WHERE"] == "${node.unique.name}/${NOMAD_ALLOC_ID}"

        def both_running() -> bool:
            allocs = client.list_allocs(job_id=JOB_ID).allocs
            return sum(a.client_status == "running" for a in allocs) == 2

        wait_for(both_running, 60, message="the job's 2 allocs to run")


def test_several_mistakes__all_listed_with_lines__nothing_sent(dev_agent: DevAgent, tmp_path: Path) -> None:
    path = tmp_path / "bad.hcl"
    path.write_text(
        'variable "n" {\n  type = number\n}\n'
        'job "bad" {\n  priorty = 1\n  group "g" {\n    count = var.n\n'
        '    task "t" {\n      driver = "mock"\n      templat {}\n    }\n  }\n}\n'
    )
    # The agent is the module's: its jobs before the refused file are what must stay.
    with Client(dev_agent.address) as client:
        jobs_before = [j.id for j in client.list_jobs().jobs]

    result = drover_cli("job", "validate", "-address", dev_agent.address, str(path))

    assert result.returncode == 1, result
    assert result.stdout.splitlines() == [
        "Job validation errors:",
        f'  * {path}:5: job "bad": unknown key "priorty" (did you mean "priority"?)',
        f'  * {path}:7: variable "n" has no value: set it with -var n=... or -var-file',
        f'  * {path}:10: job "bad" group "g" task "t": unknown key "templat" (did you mean "template"?)',
    ]
    run = drover_cli("job", "run", "-address", dev_agent.address, "-var", "n=1", str(path))
    assert run.returncode == 1 and run.stderr.count(f"{path}:") == 2, run.stderr
    with Client(dev_agent.address) as client:
        assert [j.id for j in client.list_jobs().jobs] == jobs_before
