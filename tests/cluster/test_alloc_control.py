"""``alloc logs|restart|signal`` and ``node meta apply|read`` end to end: the CLI in its own
process, real server and client agent processes, a raw_exec task, and the client's tunnel
(``Nodes.Connect``) carrying each request to the node and the answer back."""

from __future__ import annotations

import json
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from deploy.cluster import LocalCluster, wait_for
from drover.sdk import DroverClient
from drover.v1 import structs_pb2
from tests.cluster.cli import drover_cli, one_error_line, run_cli, run_job_file
from tests.cluster.conftest import DevAgentFactory, ready_cluster
from tests.cluster.jobs import NO_RESTARTS, raw_exec_hcl, wait_one_running

TASK = "t"
# Prints to both streams, answers USR1, and prints one more line whenever the test drops a
# file named "more" in its directory (its working directory), so a followed log sees a line
# appear. No double quotes and no "${": the script sits in an HCL string.
CHATTY = (
    "trap 'echo got-usr1' USR1; "
    "echo out-1; echo out-2; echo out-3; echo err-1 >&2; "
    "while true; do if [ -f more ]; then rm more; echo more-line; fi; sleep 0.1; done"
)


@pytest.fixture(scope="module")
def one_client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """One server and one raw_exec client agent, shared by this module's tests (each runs
    its own job)."""
    with ready_cluster(tmp_path_factory.mktemp("alloc-control"), servers=1, clients=1) as cluster:
        yield cluster


def _sdk(cluster: LocalCluster) -> DroverClient:
    return DroverClient(cluster.grpc_addresses, retry_deadline=30)


def _run_chatty(cluster: LocalCluster, directory: Path, job_id: str) -> structs_pb2.Allocation:
    """Run a CHATTY job (no restarts by policy) and return its alloc once it printed."""
    run_job_file(cluster, directory, job_id, raw_exec_hcl(job_id, CHATTY, restart=NO_RESTARTS, task=TASK))
    with _sdk(cluster) as client:

        def running() -> structs_pb2.Allocation | None:
            for alloc in client.list_allocs(job_id=job_id).allocs:
                full = client.get_alloc(alloc.id).alloc
                state = full.task_states.get(TASK)
                if full.client_status == "running" and state is not None and state.pid:
                    return full
            return None

        alloc = wait_for(running, 60, 0.2, lambda: f"{job_id} running\n" + cluster.logs_tail())
    out = wait_for(
        lambda: (r := run_cli(cluster, "alloc", "logs", alloc.id)).returncode == 0 and "out-3" in r.stdout,
        30,
        0.2,
        f"{job_id}'s output",
    )
    assert out
    return alloc


def _wait_usr1_trapped(cluster: LocalCluster, alloc_id: str, what: str) -> None:
    """Until the CHATTY task's USR1 trap has printed to its stdout, as ``alloc logs`` reads
    it: a signal counts as delivered once the task itself has answered it."""
    wait_for(lambda: "got-usr1" in run_cli(cluster, "alloc", "logs", alloc_id).stdout, 30, 0.2, what)


def _task_dir(cluster: LocalCluster, alloc_id: str) -> Path:
    return cluster.client_data_dir(0) / "allocs" / alloc_id / TASK


def _task_state(cluster: LocalCluster, alloc_id: str) -> structs_pb2.Allocation:
    with _sdk(cluster) as client:
        return client.get_alloc(alloc_id).alloc


def _lines_of(proc: subprocess.Popen[str]) -> queue.Queue[str]:
    """The process's stdout lines as they come, read on a thread (so a test can wait for
    one with a deadline)."""
    lines: queue.Queue[str] = queue.Queue()

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.put(line.rstrip("\n"))

    threading.Thread(target=pump, daemon=True).start()
    return lines


def _wait_line(lines: queue.Queue[str], wanted: str, timeout: float) -> list[str]:
    seen: list[str] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            break
        seen.append(line)
        if line == wanted:
            return seen
    raise AssertionError(f"no line {wanted!r} within {timeout:g}s; saw {seen}")


def test_alloc_logs__stdout_stderr_tail_and_follow(one_client: LocalCluster, tmp_path: Path) -> None:
    cluster = one_client
    alloc = _run_chatty(cluster, tmp_path, "chatty")
    prefix = alloc.id[:8]

    out = run_cli(cluster, "alloc", "logs", prefix)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[:3] == ["out-1", "out-2", "out-3"]
    assert "err-1" not in out.stdout

    err = run_cli(cluster, "alloc", "logs", "-stderr", prefix, TASK)
    assert err.returncode == 0, err.stderr
    assert err.stdout == "err-1\n"

    tail = run_cli(cluster, "alloc", "logs", "-tail", "-n", "2", prefix)
    assert tail.returncode == 0, tail.stderr
    assert tail.stdout == "out-2\nout-3\n"

    last_bytes = run_cli(cluster, "alloc", "logs", "-tail", "-c", "6", prefix)
    assert last_bytes.stdout == "out-3\n"

    follow = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "drover.cli",
            "alloc",
            "logs",
            "-f",
            "-address",
            ",".join(cluster.grpc_addresses),
            prefix,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
    )
    try:
        lines = _lines_of(follow)
        assert _wait_line(lines, "out-3", 30)[:3] == ["out-1", "out-2", "out-3"]
        (_task_dir(cluster, alloc.id) / "more").touch()
        _wait_line(lines, "more-line", 30)
    finally:
        follow.terminate()
        follow.wait(10)


def test_alloc_restart__new_pid_alloc_running_and_policy_not_spent(
    one_client: LocalCluster, tmp_path: Path
) -> None:
    cluster = one_client
    alloc = _run_chatty(cluster, tmp_path, "restarted")
    pids = [alloc.task_states[TASK].pid]
    # Twice, with a restart policy of no attempts at all: a user's restart spends none.
    for extra in ((), (TASK,)):
        result = run_cli(cluster, "alloc", "restart", alloc.id[:8], *extra)
        assert result.returncode == 0, result.stderr
        assert "Restarting" in result.stdout

        def restarted() -> structs_pb2.Allocation | None:
            now = _task_state(cluster, alloc.id)
            state = now.task_states[TASK]
            fresh = state.pid and state.pid not in pids and state.state == "running"
            return now if fresh else None

        now = wait_for(restarted, 30, 0.2, lambda: "a new pid\n" + cluster.logs_tail())
        pids.append(now.task_states[TASK].pid)
        assert now.client_status == "running" and now.desired_status == "run"
        assert not now.task_states[TASK].failed
        assert any(e.type == "Restart Signaled" for e in now.task_states[TASK].events)
    # The restarted task wrote its output again, to the same log.
    logs = run_cli(cluster, "alloc", "logs", alloc.id)
    wait_for(
        lambda: run_cli(cluster, "alloc", "logs", alloc.id).stdout.count("out-1") == 3,
        30,
        0.2,
        "three runs' output",
    )
    assert logs.returncode == 0


def test_alloc_signal__usr1_reaches_the_task(one_client: LocalCluster, tmp_path: Path) -> None:
    cluster = one_client
    alloc = _run_chatty(cluster, tmp_path, "signalled")
    result = run_cli(cluster, "alloc", "signal", "-s", "USR1", alloc.id[:8], TASK)
    assert result.returncode == 0, result.stderr
    _wait_usr1_trapped(cluster, alloc.id, "the task's USR1 trap to print")
    now = _task_state(cluster, alloc.id)
    assert now.client_status == "running"
    assert any(e.type == "Signaling" and "SIGUSR1" in e.message for e in now.task_states[TASK].events)


def test_alloc_commands__bad_input__one_error_line(one_client: LocalCluster, tmp_path: Path) -> None:
    cluster = one_client
    alloc = _run_chatty(cluster, tmp_path, "refused")
    unknown_alloc = one_error_line(run_cli(cluster, "alloc", "logs", "ffffffff"))
    assert "ffffffff" in unknown_alloc
    unknown_task = one_error_line(run_cli(cluster, "alloc", "logs", alloc.id, "nope"))
    assert "task 'nope' not found" in unknown_task
    unknown_restart = one_error_line(run_cli(cluster, "alloc", "restart", alloc.id, "nope"))
    assert "task 'nope' not found" in unknown_restart
    bad_signal = one_error_line(run_cli(cluster, "alloc", "signal", "-s", "SIGNOPE", alloc.id))
    assert "signal: unknown signal 'SIGNOPE'" in bad_signal
    both = one_error_line(run_cli(cluster, "alloc", "logs", "-n", "2", "-c", "3", alloc.id))
    assert "-n and -c" in both
    # Nothing was restarted or killed by the refused calls.
    assert _task_state(cluster, alloc.id).task_states[TASK].pid == alloc.task_states[TASK].pid


def test_node_meta__apply_then_read__servers_and_scheduler_see_it(
    one_client: LocalCluster, tmp_path: Path
) -> None:
    cluster = one_client
    applied = run_cli(cluster, "node", "meta", "apply", "foo=bar", "drop=me")
    assert applied.returncode == 0, applied.stderr
    read = run_cli(cluster, "node", "meta", "read", "-json")
    assert read.returncode == 0, read.stderr
    meta = json.loads(read.stdout)
    assert meta["dynamic"] == {"foo": "bar", "drop": "me"}
    assert meta["meta"]["foo"] == "bar"
    human = run_cli(cluster, "node", "meta", "read")
    assert "Dynamic Meta:" in human.stdout and "foo" in human.stdout

    # The servers have it at once: apply answers once the node registered with it.
    with _sdk(cluster) as client:
        (node,) = client.list_nodes().nodes
        assert client.get_node(node.id).node.meta["foo"] == "bar"
    unset = run_cli(cluster, "node", "meta", "apply", "-node-id", node.id[:8], "-unset", "drop")
    assert unset.returncode == 0, unset.stderr
    with _sdk(cluster) as client:
        assert "drop" not in client.get_node(node.id).node.meta
        assert client.node_meta_read(node.id).dynamic == {"foo": "bar"}

    # The scheduler sees it: a job constrained on a key the node does not have yet waits
    # blocked, and is placed once the key is applied.
    constrained = raw_exec_hcl("meta-pinned", "sleep 600").replace(
        '  group "g" {',
        '  constraint {\n    attribute = "${meta.zone}"\n    value     = "blue"\n  }\n  group "g" {',
    )
    run_job_file(cluster, tmp_path, "meta-pinned", constrained)
    with _sdk(cluster) as client:
        wait_for(
            lambda: any(e.status == "blocked" for e in client.list_evals(job_id="meta-pinned").evals),
            30,
            0.2,
            "the meta-constrained job's blocked eval",
        )
        assert not [a for a in client.list_allocs(job_id="meta-pinned").allocs if a.desired_status == "run"]
    blue = run_cli(cluster, "node", "meta", "apply", "zone=blue")
    assert blue.returncode == 0, blue.stderr
    with _sdk(cluster) as client:
        wait_one_running(cluster, client, "meta-pinned")

    refused = one_error_line(run_cli(cluster, "node", "meta", "apply"))
    assert "-unset or at least 1 key=value" in refused


def test_tunnel__three_servers__any_server_relays_to_the_one_holding_it(tmp_path: Path) -> None:
    """The client holds its tunnel on one server; asking each server in turn, at least two
    of them have to relay the call to that one."""
    with ready_cluster(tmp_path / "cluster", servers=3, clients=1) as cluster:
        alloc = _run_chatty(cluster, tmp_path, "relayed")
        for address in cluster.grpc_addresses:
            env = {"DROVER_ADDR": address}
            logs = drover_cli("alloc", "logs", "-tail", "-n", "1", "-stderr", alloc.id, env=env, timeout=60)
            assert (logs.returncode, logs.stdout) == (0, "err-1\n"), (address, logs.stderr)
            meta = drover_cli("node", "meta", "read", "-json", env=env, timeout=60)
            assert meta.returncode == 0, (address, meta.stderr)
        signalled = drover_cli(
            "alloc", "signal", "-s", "USR1", alloc.id, env={"DROVER_ADDR": cluster.grpc_addresses[-1]}
        )
        assert signalled.returncode == 0, signalled.stderr
        _wait_usr1_trapped(cluster, alloc.id, "the relayed signal to reach the task")


@pytest.mark.timeout(180)
def test_dev_agent__alloc_and_node_meta_commands__human_json_and_errors(
    dev_agent_factory: DevAgentFactory, tmp_path: Path
) -> None:
    """The same commands against ``drover agent -dev``: one process that is the server and
    its own client, the tunnel going from the embedded client to the server beside it."""
    agent = dev_agent_factory(http_port=0)
    address, log_path = agent.address, agent.log_path
    env = {"DROVER_ADDR": address}
    # The agent is still starting: wait for it to listen, not only for a leader.
    agent.wait_node_ready()
    path = tmp_path / "dev-chatty.hcl"
    path.write_text(raw_exec_hcl("dev-chatty", CHATTY, restart=NO_RESTARTS, task=TASK))
    assert drover_cli("job", "run", "-detach", str(path), env=env).returncode == 0
    with DroverClient(address, retry_deadline=60) as client:
        alloc = wait_for(
            lambda: next(
                (a for a in client.list_allocs(job_id="dev-chatty").allocs if a.client_status == "running"),
                None,
            ),
            60,
            0.2,
            log_path.read_text,
        )
    wait_for(
        lambda: "out-3" in drover_cli("alloc", "logs", alloc.id, env=env).stdout,
        30,
        0.2,
        "the task's output",
    )
    signalled = drover_cli("alloc", "signal", "-json", "-s", "USR1", alloc.id[:8], env=env)
    assert signalled.returncode == 0, signalled.stderr
    assert json.loads(signalled.stdout) == {}
    wait_for(lambda: "got-usr1" in drover_cli("alloc", "logs", alloc.id, env=env).stdout, 30, 0.2, "got-usr1")

    applied = drover_cli("node", "meta", "apply", "-json", "rack=r7", env=env)
    assert applied.returncode == 0, applied.stderr
    assert json.loads(applied.stdout)["dynamic"] == {"rack": "r7"}
    human = drover_cli("node", "meta", "read", env=env)
    assert human.returncode == 0, human.stderr
    assert human.stdout.startswith("All Meta:") and "rack" in human.stdout and "r7" in human.stdout
    assert json.loads(drover_cli("node", "meta", "read", "-json", env=env).stdout)["meta"]["rack"] == "r7"

    assert "not found" in one_error_line(drover_cli("alloc", "restart", alloc.id, "nope", env=env))
    assert "node" in one_error_line(drover_cli("node", "meta", "read", "-node-id", "nope", env=env))
