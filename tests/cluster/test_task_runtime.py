"""What a task sees and when it runs, on a dev agent with real raw_exec tasks, as a user
runs deploy/examples/: Nomad's NOMAD_* environment (ports, merged meta), runtime
interpolation of ``${node.unique.name}`` in a task's args and env, and (the lifecycle
examples) prestart/poststart/poststop ordering, sidecars and ``leader = true``."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from deploy.cluster import wait_for
from drover.sdk import Client
from drover.v1 import structs_pb2
from tests.cluster.cli import drover_cli
from tests.cluster.conftest import DevAgent

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "deploy" / "examples"


def run_example(address: str, name: str) -> None:
    result = drover_cli("job", "run", "-detach", "-address", address, str(EXAMPLES / name))
    assert result.returncode == 0, result.stdout + result.stderr


def only_alloc(client: Client, job_id: str, status: str) -> structs_pb2.Allocation:
    """The job's one alloc, once its client status is ``status`` (fails at once on failed)."""
    found: list[structs_pb2.Allocation] = []

    def reached() -> bool:
        allocs = client.list_allocs(job_id=job_id).allocs
        if any(a.client_status == "failed" for a in allocs) and status != "failed":
            full = [client.get_alloc(a.id).alloc for a in allocs]
            raise AssertionError(f"an alloc of {job_id} failed: {full}")
        found[:] = [a for a in allocs if a.client_status == status]
        return len(found) == 1

    wait_for(reached, 60, message=f"one alloc of {job_id} {status}")
    return client.get_alloc(found[0].id).alloc


def task_stdout(data_dir: Path, alloc_id: str, task: str) -> str:
    paths = list(data_dir.glob(f"**/allocs/{alloc_id}/{task}/stdout.log"))
    assert len(paths) == 1, paths
    return paths[0].read_text()


def test_runtime_env__nomad_variables_ports_meta_and_interpolated_args(dev_agent: DevAgent) -> None:
    run_example(dev_agent.address, "runtime-env.nomad.hcl")

    with Client(dev_agent.address) as client:
        alloc = only_alloc(client, "runtime-env", "complete")
        node = client.list_nodes().nodes[0]
    lines = task_stdout(dev_agent.data_dir, alloc.id, "report").splitlines()
    env = dict(line.split("=", 1) for line in lines[1:])

    # ${node.unique.name} and ${NOMAD_ALLOC_INDEX} in args, resolved on the node; an
    # unknown name is left as written.
    assert lines[0] == f"node={node.name} index=0 missing=${{meta.no_such_key}}"
    port = next(p for p in alloc.resources.ports if p.label == "http")
    assert port.value > 0
    assert env["NOMAD_PORT_http"] == env["NOMAD_HOST_PORT_http"] == str(port.value)
    assert env["NOMAD_ADDR_http"].endswith(f":{port.value}")
    assert env["WHERE"] == f"{node.name}:{port.value}"
    assert env["NOMAD_ALLOC_ID"] == alloc.id
    assert env["NOMAD_SHORT_ALLOC_ID"] == alloc.id[:8]
    assert env["NOMAD_ALLOC_NAME"] == "runtime-env.report[0]"
    assert env["NOMAD_JOB_ID"] == env["NOMAD_JOB_NAME"] == "runtime-env"
    assert env["NOMAD_GROUP_NAME"] == env["NOMAD_TASK_NAME"] == "report"
    assert env["NOMAD_NAMESPACE"] == "default"
    assert env["NOMAD_REGION"] == "global"
    assert env["NOMAD_DC"] == node.datacenter
    assert (env["NOMAD_CPU_LIMIT"], env["NOMAD_MEMORY_LIMIT"]) == ("50", "32")
    assert env["NOMAD_TASK_DIR"].endswith(f"{alloc.id}/report")
    assert env["NOMAD_ALLOC_DIR"].endswith(alloc.id)
    assert Path(env["NOMAD_SECRETS_DIR"]).is_dir()
    # Job, group and task meta merged, the task's winning; as written and upper-cased.
    assert env["NOMAD_META_tier"] == env["NOMAD_META_TIER"] == "task"
    assert env["NOMAD_META_zone"] == env["NOMAD_META_ZONE"] == "z1"
    assert env["NOMAD_META_owner"] == env["NOMAD_META_OWNER"] == "ops"


def order_log(data_dir: Path, alloc_id: str) -> list[str]:
    paths = list(data_dir.glob(f"**/allocs/{alloc_id}/order.log"))
    assert len(paths) == 1, paths
    return paths[0].read_text().split()


def events(alloc: structs_pb2.Allocation, task: str) -> list[str]:
    return [e.type for e in alloc.task_states[task].events]


def test_lifecycle__prestart_sidecar_poststart_poststop_in_nomads_order(dev_agent: DevAgent) -> None:
    run_example(dev_agent.address, "lifecycle.nomad.hcl")

    with Client(dev_agent.address) as client:
        alloc = only_alloc(client, "lifecycle", "complete")
    order = order_log(dev_agent.data_dir, alloc.id)

    assert sorted(order) == sorted(
        ["init", "proxy-start", "main", "main-done", "announce", "proxy-stop", "cleanup"]
    )
    at = {name: i for i, name in enumerate(order)}
    # Main only after the ephemeral prestart completed and the sidecar started.
    assert at["init"] < at["main"] and at["proxy-start"] < at["main"]
    # Poststart after main started; the sidecar stopped only once main was done; poststop last.
    assert at["announce"] > at["init"] and at["announce"] > at["proxy-start"]
    assert at["proxy-stop"] > at["main-done"] and at["proxy-stop"] > at["announce"]
    assert order[-1] == "cleanup"
    states = alloc.task_states
    assert all(s.state == "dead" and not s.failed for s in states.values()), states
    assert "Main Tasks Dead" in events(alloc, "proxy")


def test_leader__its_exit_stops_the_worker_with_shutdown_delay_and_kill_signal(dev_agent: DevAgent) -> None:
    run_example(dev_agent.address, "leader.nomad.hcl")

    with Client(dev_agent.address) as client:
        alloc = only_alloc(client, "leader", "complete")
    order = order_log(dev_agent.data_dir, alloc.id)

    # The worker ran for ever: it ended because the leader did, by SIGINT, not TERM.
    assert order == ["worker-start", "leader-done", "worker-got-INT"]
    worker = alloc.task_states["worker"]
    assert worker.state == "dead" and not worker.failed
    assert "Leader Task Dead" in events(alloc, "worker")
    messages = [e.message for e in worker.events]
    assert any("shutdown_delay of 1s" in m for m in messages), messages
    # The shutdown delay was waited: the worker ended at least 1 s after the leader.
    assert worker.finished_at_ns - alloc.task_states["leader"].finished_at_ns >= 1_000_000_000


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="switching users needs root")
def test_user__a_root_agent_runs_the_task_as_that_user(dev_agent: DevAgent) -> None:
    run_example(dev_agent.address, "user.nomad.hcl")

    with Client(dev_agent.address) as client:
        alloc = only_alloc(client, "user", "complete")
    assert task_stdout(dev_agent.data_dir, alloc.id, "whoami").strip() == "nobody"
