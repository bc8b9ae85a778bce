"""deploy/examples/variables.nomad.hcl run on a dev agent through the CLI, as a user runs
it: ``-var`` overriding defaults reaches the stored job, and the allocs the job asks for
run; a file with several mistakes is refused with all of them and nothing is sent."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from deploy.cluster import pick_free_ports, query_state_digest, wait_for
from drover.sdk import Client
from tests.cluster.cli import drover_cli

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "deploy" / "examples" / "variables.nomad.hcl"
JOB_ID = "variables-example"


@pytest.fixture
def dev_agent(tmp_path: Path) -> Iterator[str]:
    """``drover agent -dev`` on free ports, once it leads: its gRPC address."""
    grpc_port, http_port = pick_free_ports(2)
    address = f"127.0.0.1:{grpc_port}"
    argv = [sys.executable, "-m", "drover.cli", "agent", "-dev", "-grpc-port", str(grpc_port)]
    argv += ["-http-port", str(http_port), "-data-dir", str(tmp_path / "dev")]
    log_path = tmp_path / "dev.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:

        def leading() -> bool:
            if proc.poll() is not None:
                raise AssertionError(f"the dev agent exited {proc.returncode}:\n{log_path.read_text()}")
            answer = query_state_digest(address)
            return answer is not None and answer.leader

        wait_for(leading, 60, message="the dev agent to lead")
        yield address
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def test_example__var_overrides_a_default__the_job_runs_with_it(dev_agent: str, tmp_path: Path) -> None:
    var_file = tmp_path / "prod.json"
    var_file.write_text('{"env": "staging", "replicas": 5}')

    result = drover_cli(
        "job", "run", "-detach", "-address", dev_agent,
        "-var-file", str(var_file), "-var", "env=prod", "-var", "replicas=2", str(EXAMPLE),
    )  # fmt: skip

    assert result.returncode == 0, result.stdout + result.stderr
    with Client(dev_agent) as client:
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


def test_several_mistakes__all_listed_with_lines__nothing_sent(dev_agent: str, tmp_path: Path) -> None:
    path = tmp_path / "bad.hcl"
    path.write_text(
        'variable "n" {\n  type = number\n}\n'
        'job "bad" {\n  priorty = 1\n  group "g" {\n    count = var.n\n'
        '    task "t" {\n      driver = "mock"\n      templat {}\n    }\n  }\n}\n'
    )

    result = drover_cli("job", "validate", "-address", dev_agent, str(path))

    assert result.returncode == 1, result
    assert result.stdout.splitlines() == [
        "Job validation errors:",
        f'  * {path}:5: job "bad": unknown key "priorty" (did you mean "priority"?)',
        f'  * {path}:7: variable "n" has no value: set it with -var n=... or -var-file',
        f'  * {path}:10: job "bad" group "g" task "t": unknown key "templat"',
    ]
    run = drover_cli("job", "run", "-address", dev_agent, "-var", "n=1", str(path))
    assert run.returncode == 1 and run.stderr.count(f"{path}:") == 2, run.stderr
    with Client(dev_agent) as client:
        assert [j.id for j in client.list_jobs().jobs] == []
