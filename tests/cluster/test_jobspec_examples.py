"""Each scheduling-key example of deploy/examples/ (node_pool, migrate/reschedule, spread
targets, memory_max, network mode host, scaling, the old disconnect names, Nomad's API
JSON, a service with http and script checks and a check_restart) run with ``drover job run`` on a dev agent and placed; scaling bounds kept by ``job
scale``; ``node pool list``; and a key drover does not support refused in one line, exit 1."""

from __future__ import annotations

import json
from pathlib import Path

from deploy.cluster import wait_for
from drover.sdk import Client
from tests.cluster.cli import drover_cli
from tests.cluster.conftest import DevAgent
from tests.cluster.test_task_runtime import EXAMPLES, task_stdout

# Example file -> (job ID, how many allocs it places, the client status they reach).
_EXAMPLES = {
    "node-pool.nomad.hcl": ("node-pool", 1, "running"),
    "migrate-reschedule.nomad.hcl": ("migrate-reschedule", 2, "running"),
    "spread-targets.nomad.hcl": ("spread-targets", 3, "running"),
    "resources-memory-max.nomad.hcl": ("resources-memory-max", 1, "complete"),
    "network-host.nomad.hcl": ("network-host", 1, "running"),
    "scaling.nomad.hcl": ("scaling", 1, "running"),
    "disconnect-aliases.nomad.hcl": ("disconnect-aliases", 1, "running"),
    "nomad-api.json": ("nomad-api", 1, "running"),
    "service-checks.nomad.hcl": ("service-checks", 1, "running"),
}


def _cli(address: str, *args: str) -> tuple[int, str]:
    result = drover_cli(*args[:2], "-address", address, *args[2:])
    return result.returncode, result.stdout + result.stderr


def test_jobspec_examples__each_runs_and_places(dev_agent: DevAgent, tmp_path: Path) -> None:
    address = dev_agent.address
    for name in _EXAMPLES:
        code, out = _cli(address, "job", "run", "-detach", str(EXAMPLES / name))
        assert code == 0, f"{name}: {out}"
    with Client(address) as client:
        for name, (job_id, count, status) in _EXAMPLES.items():

            def reached(job_id: str = job_id, count: int = count, status: str = status) -> bool:
                allocs = client.list_allocs(job_id=job_id).allocs
                failed = [a for a in allocs if a.client_status == "failed"]
                assert not failed, f"{job_id}: {[client.get_alloc(a.id).alloc for a in failed]}"
                return sum(a.client_status == status for a in allocs) == count

            wait_for(reached, 90, message=f"{count} allocs of {name} {status}")
        (report,) = client.list_allocs(job_id="resources-memory-max").allocs
    assert task_stdout(dev_agent.data_dir, report.id, "report").strip() == "memory=32 memory_max=64"

    code, out = _cli(address, "job", "inspect", "scaling")
    assert code == 0, out
    scaling = json.loads(out)["groups"][0]["scaling"]
    assert (int(scaling["min"]), int(scaling["max"])) == (1, 4)
    # A scale waits for the job's first deployment to end (refused while it is active).
    answers: list[tuple[int, str]] = []

    def scaled_past_the_deployment() -> bool:
        answers[:] = [_cli(address, "job", "scale", "-detach", "scaling", "web", "9")]
        return "active deployment" not in answers[0][1]

    wait_for(scaled_past_the_deployment, 90, message="the scaling job's deployment to end")
    code, out = answers[0]
    assert code == 1, out
    assert "must be <= the scaling policy's max 4, got 9" in out
    code, out = _cli(address, "job", "scale", "-detach", "scaling", "web", "3")
    assert code == 0, out

    # The checked service's instance passes both its checks (an http server the task runs,
    # a script in the task's directory): the list counts it passing.
    def checked_passing() -> bool:
        code, out = _cli(address, "service", "list", "-json")
        assert code == 0, out
        return any(s["service_name"] == "web-checked" and s.get("passing") == 1 for s in json.loads(out))

    wait_for(checked_passing, 60, message="web-checked passing its checks")

    result = drover_cli("node", "pool", "list", "-address", address)
    out = result.stdout + result.stderr
    assert result.returncode == 0, out
    rows = {line.split()[0]: line.split()[1] for line in out.splitlines()[1:]}
    assert rows == {"all": "1", "default": "1"}


def test_jobspec_refused_keys__one_line_and_exit_1(dev_agent: DevAgent, tmp_path: Path) -> None:
    address = dev_agent.address
    job_file = tmp_path / "vault.nomad.hcl"
    job_file.write_text(
        'job "v" {\n  group "g" {\n    task "t" {\n      driver = "raw_exec"\n'
        '      vault { policies = ["x"] }\n      config { command = "/bin/true" }\n    }\n  }\n}\n'
    )
    for command in ("run", "plan", "validate"):
        result = drover_cli("job", command, "-address", address, str(job_file))
        assert result.returncode == 1, result.stdout + result.stderr
        lines = (result.stdout + result.stderr).strip().splitlines()
        assert lines == [
            f'Error: {job_file}:5: job "v" group "g" task "t": "vault" is not supported by drover (no Vault here)'
        ]
