"""The cluster commands as an operator uses them, against real processes: ``alloc stop``
(the scheduler replaces the alloc, the count is kept), ``alloc status`` (addresses,
resources, recent task events), ``server members`` (a killed follower is "failed"),
``agent-info``, ``version``, and ``operator scheduler get-config|set-config`` with the
leader honouring ``pause_eval_broker`` and ``scheduler_algorithm``; and the error paths:
one ``Error:`` line, exit 1."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from deploy.cluster import LocalCluster, wait_for
from drover.common.version import drover_version
from drover.sdk import DroverClient, DroverError
from drover.v1 import structs_pb2
from tests.cluster.cli import drover_cli, one_error_line, run_cli, run_job_file
from tests.cluster.conftest import DevAgentFactory, ready_cluster
from tests.cluster.jobs import running_allocs

# Long enough to see a paused broker hand nothing out: an unpaused one places a job's
# allocs well within a second on an idle one-server cluster.
PAUSE_WINDOW_S = 3.0


def mock_job_hcl(job_id: str, count: int, *, cpu: int = 100, memory: int = 64) -> str:
    """A service job of ``count`` mock tasks that run for an hour, each with a dynamic port."""
    return f"""
job "{job_id}" {{
  datacenters = ["dc1"]
  group "web" {{
    count = {count}
    network {{
      port "http" {{}}
    }}
    task "server" {{
      driver = "mock"
      config {{
        run_for = "1h"
      }}
      resources {{
        cpu    = {cpu}
        memory = {memory}
      }}
    }}
  }}
}}
"""


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """One server and two client agents, shared by this module's one-server tests (each
    runs its own jobs and sets the scheduler config it needs)."""
    with ready_cluster(tmp_path_factory.mktemp("cluster-commands"), servers=1, clients=2) as c:
        yield c


def sdk(cluster: LocalCluster) -> DroverClient:
    return DroverClient(cluster.grpc_addresses, retry_deadline=30)


def set_config(cluster: LocalCluster, *flags: str) -> None:
    result = run_cli(cluster, "operator", "scheduler", "set-config", *flags)
    assert result.returncode == 0, result.stderr
    assert "Scheduler configuration updated" in result.stdout


def wait_running(client: DroverClient, job_id: str, count: int) -> list[structs_pb2.Allocation]:
    return wait_for(
        lambda: (allocs := running_allocs(client, job_id)) and len(allocs) == count and allocs,
        60,
        0.2,
        f"{count} running allocs of {job_id}",
    )


# ---------------------------------------------------------------------------------------
# alloc stop and alloc status


def test_alloc_stop__replaced__count_kept__status_shows_port_and_events(
    two_nodes: LocalCluster, tmp_path: Path
) -> None:
    run_job_file(two_nodes, tmp_path, "stopme", mock_job_hcl("stopme", 2))
    with sdk(two_nodes) as client:
        old = wait_running(client, "stopme", 2)[0]

        result = run_cli(two_nodes, "alloc", "stop", old.id[:8])

        assert result.returncode == 0, result.stderr
        assert f'Alloc "{old.id[:8]}" is stopping, evaluation' in result.stdout
        assert re.search(r'Evaluation "\w+" finished with status "complete"', result.stdout), result.stdout

        def replaced() -> structs_pb2.Allocation | None:
            allocs = client.list_allocs(job_id="stopme").allocs
            stopped = next(a for a in allocs if a.id == old.id)
            successors = [a for a in allocs if a.previous_allocation == old.id]
            done = (
                stopped.desired_status == "stop"
                and stopped.client_status == "complete"
                and len(successors) == 1
                and successors[0].client_status == "running"
                and len(running_allocs(client, "stopme")) == 2
            )
            return successors[0] if done else None

        new = wait_for(replaced, 60, 0.2, lambda: f"a replacement of {old.id}\n{two_nodes.logs_tail()}")
        triggers = [e.triggered_by for e in client.list_evals(job_id="stopme").evals]
        assert triggers.count("alloc-stop") == 1, triggers

    status = run_cli(two_nodes, "alloc", "status", new.id)
    assert status.returncode == 0, status.stderr
    out = status.stdout
    [port] = new.resources.ports
    assert re.search(rf"^http\s+\S+:{port.value}\s", out, re.M), out
    assert re.search(r"^CPU\s+Memory\s+Disk\n100 MHz\s+64 MiB\s", out, re.M), out
    events = out.split("Recent Events:", 1)[1]
    assert re.search(r"^\S+\s+Received\s+", events, re.M), out
    assert re.search(r"^\S+\s+Started\s+", events, re.M), out


def test_alloc_stop__system_job__replaced_on_its_node(two_nodes: LocalCluster, tmp_path: Path) -> None:
    hcl = mock_job_hcl("everywhere", 1).replace(
        'datacenters = ["dc1"]', 'type        = "system"\n  datacenters = ["dc1"]'
    )
    run_job_file(two_nodes, tmp_path, "everywhere", hcl)
    with sdk(two_nodes) as client:
        old = wait_running(client, "everywhere", 2)[0]

        result = run_cli(two_nodes, "alloc", "stop", old.id)
        assert result.returncode == 0, result.stderr

        def replaced() -> bool:
            allocs = client.list_allocs(job_id="everywhere").allocs
            stopped = next(a for a in allocs if a.id == old.id)
            running = running_allocs(client, "everywhere")
            return (
                stopped.desired_status == "stop"
                and len(running) == 2
                and sorted(a.node_id for a in running) == sorted(set(a.node_id for a in running))
                and any(a.node_id == old.node_id and a.id != old.id for a in running)
            )

        wait_for(
            replaced, 60, 0.2, lambda: f"system alloc {old.id} replaced on its node\n{two_nodes.logs_tail()}"
        )


def test_alloc_stop__unknown_or_already_stopped__one_error_line(
    two_nodes: LocalCluster, tmp_path: Path
) -> None:
    assert "not found" in one_error_line(run_cli(two_nodes, "alloc", "stop", "00000000"))

    run_job_file(two_nodes, tmp_path, "twice", mock_job_hcl("twice", 1))
    with sdk(two_nodes) as client:
        [alloc] = wait_running(client, "twice", 1)
    first = run_cli(two_nodes, "alloc", "stop", "-detach", alloc.id)
    assert first.returncode == 0, first.stderr

    with sdk(two_nodes) as client:
        wait_for(
            lambda: client.get_alloc(alloc.id).alloc.desired_status == "stop",
            30,
            0.2,
            "the first stop applied",
        )
    assert "already stopped" in one_error_line(run_cli(two_nodes, "alloc", "stop", alloc.id))


# ---------------------------------------------------------------------------------------
# operator scheduler get-config / set-config


def _config_json(cluster: LocalCluster) -> dict[str, object]:
    result = run_cli(cluster, "operator", "scheduler", "get-config", "-json")
    assert result.returncode == 0, result.stderr
    config: dict[str, object] = json.loads(result.stdout)["config"]
    return config


def test_scheduler_config__round_trip__stale_check_index_refused(two_nodes: LocalCluster) -> None:
    before = _config_json(two_nodes)
    start = before["modify_index"]
    assert isinstance(start, int)

    set_config(two_nodes, "-scheduler-algorithm", "spread", "-check-index", str(start))

    human = run_cli(two_nodes, "operator", "scheduler", "get-config")
    assert re.search(r"^Scheduler Algorithm\s+= spread$", human.stdout, re.M), human.stdout
    assert re.search(r"^Pause Eval Broker\s+= false$", human.stdout, re.M), human.stdout
    after = _config_json(two_nodes)
    assert after["scheduler_algorithm"] == "spread"
    moved = after["modify_index"]
    assert isinstance(moved, int) and moved > start

    # A second operator who read the config at ``start`` too: refused, nothing written.
    refused = run_cli(
        two_nodes,
        "operator",
        "scheduler",
        "set-config",
        "-pause-eval-broker",
        "true",
        "-check-index",
        str(start),
    )
    assert "check index" in one_error_line(refused)
    assert _config_json(two_nodes) == after

    set_config(two_nodes, "-scheduler-algorithm", "binpack")
    assert _config_json(two_nodes)["scheduler_algorithm"] == "binpack"


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (["-scheduler-algorithm", "random"], "-scheduler-algorithm"),
        (["-pause-eval-broker", "yes"], "-pause-eval-broker"),
        (["-scheduler-algorithm", "spread", "-check-index", "soon"], "-check-index"),
        ([], "nothing to change"),
    ],
    ids=["algorithm", "pause", "check-index", "no-flags"],
)
def test_scheduler_set_config__bad_flag__one_error_line_nothing_written(
    two_nodes: LocalCluster, flags: list[str], named: str
) -> None:
    before = _config_json(two_nodes)

    assert named in one_error_line(run_cli(two_nodes, "operator", "scheduler", "set-config", *flags))

    assert _config_json(two_nodes) == before


def test_scheduler_set_config__unknown_algorithm_over_the_api__invalid_argument(
    two_nodes: LocalCluster,
) -> None:
    with sdk(two_nodes) as client, pytest.raises(DroverError) as refused:
        client.scheduler_set_config(structs_pb2.SchedulerConfig(scheduler_algorithm="random"))
    assert refused.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert "config.scheduler_algorithm" in refused.value.message


def test_pause_eval_broker__job_not_placed_until_unpaused(two_nodes: LocalCluster, tmp_path: Path) -> None:
    set_config(two_nodes, "-pause-eval-broker", "true")
    try:
        assert _config_json(two_nodes)["pause_eval_broker"] is True
        run_job_file(two_nodes, tmp_path, "held", mock_job_hcl("held", 2))
        with sdk(two_nodes) as client:
            [ev] = wait_for(lambda: client.list_evals(job_id="held").evals, 30, 0.2, "the job's eval")
            window_ends = time.monotonic() + PAUSE_WINDOW_S
            while time.monotonic() < window_ends:
                assert client.get_eval(ev.id).eval.status == "pending"
                assert not client.list_allocs(job_id="held").allocs
                time.sleep(0.2)
    finally:
        set_config(two_nodes, "-pause-eval-broker", "false")

    with sdk(two_nodes) as client:
        wait_running(client, "held", 2)
        assert client.get_eval(ev.id).eval.status == "complete"


def test_scheduler_algorithm__spread_then_binpack__leader_places_accordingly(
    two_nodes: LocalCluster, tmp_path: Path
) -> None:
    """A big alloc on one node; spread puts the next job on the other (emptier) node,
    binpack on the fuller one. Different jobs, so job anti-affinity plays no part."""
    run_job_file(two_nodes, tmp_path, "filler", mock_job_hcl("filler", 1, cpu=800, memory=512))
    with sdk(two_nodes) as client:
        [filler] = wait_running(client, "filler", 1)
        try:
            set_config(two_nodes, "-scheduler-algorithm", "spread")
            run_job_file(two_nodes, tmp_path, "spread-probe", mock_job_hcl("spread-probe", 1))
            [spread] = wait_running(client, "spread-probe", 1)
            assert spread.node_id != filler.node_id

            set_config(two_nodes, "-scheduler-algorithm", "binpack")
            run_job_file(two_nodes, tmp_path, "binpack-probe", mock_job_hcl("binpack-probe", 1))
            [binpack] = wait_running(client, "binpack-probe", 1)
            assert binpack.node_id == filler.node_id
        finally:
            set_config(two_nodes, "-scheduler-algorithm", "binpack")


# ---------------------------------------------------------------------------------------
# server members, agent-info, version


def _member_statuses(cluster: LocalCluster, address: str) -> dict[str, tuple[str, bool]]:
    with DroverClient([address], retry_deadline=10) as client:
        return {m.name: (m.status, m.leader) for m in client.server_members().members}


def test_server_members__three_alive_one_leader__killed_follower_failed(cluster: LocalCluster) -> None:
    result = run_cli(cluster, "server", "members", "-json")
    assert result.returncode == 0, result.stderr
    members = json.loads(result.stdout)["members"]
    assert sorted(m["name"] for m in members) == sorted(cluster.server_names)
    assert [m["status"] for m in members] == ["alive"] * 3
    assert sum(m["leader"] for m in members) == 1
    assert all(m["version"] == drover_version() and m["raft_applied_index"] > 0 for m in members), members

    human = run_cli(cluster, "server", "members")
    assert human.returncode == 0, human.stderr
    lines = human.stdout.splitlines()
    assert lines[0].split() == [
        "Name",
        "Address",
        "Raft",
        "Address",
        "Status",
        "Leader",
        "Applied",
        "Index",
        "Version",
    ]
    assert sum(" alive " in line for line in lines[1:]) == 3

    leader = cluster.leader_index()
    follower = next(i for i in range(3) if i != leader)
    cluster.kill(follower)
    killed = cluster.server_names[follower]
    leader_address = cluster.grpc_addresses[leader]

    wait_for(
        lambda: _member_statuses(cluster, leader_address).get(killed, ("", False))[0] == "failed",
        30,
        0.5,
        f"{killed} listed as failed",
    )
    after = run_cli(cluster, "server", "members", "-address", leader_address)
    assert after.returncode == 0, after.stderr
    rows = {line.split()[0]: line.split() for line in after.stdout.splitlines()[1:]}
    assert rows[killed][3] == "failed"
    assert [rows[n][3] for n in cluster.server_names if n != killed] == ["alive", "alive"]
    assert rows[cluster.server_names[leader]][4] == "true"

    # Back on the same port: alive again at once, not after a reconnect backoff.
    cluster.restart(follower)
    wait_for(
        lambda: _member_statuses(cluster, leader_address).get(killed, ("", False))[0] == "alive",
        30,
        0.5,
        f"{killed} listed as alive again",
    )


def test_agent_info__json_and_human(cluster: LocalCluster) -> None:
    address = cluster.grpc_addresses[0]
    result = run_cli(cluster, "agent-info", "-json", "-address", address)
    assert result.returncode == 0, result.stderr
    info = json.loads(result.stdout)
    sections = {s["name"]: s["values"] for s in info["sections"]}
    assert info["name"] == cluster.server_names[0]
    assert info["version"] == sections["drover"]["version"] == drover_version()
    assert sections["raft"]["state"] in ("leader", "follower")
    assert sections["raft"]["num_peers"] == "2"
    assert int(sections["raft"]["applied_index"]) > 0
    assert int(sections["runtime"]["rss_bytes"]) > 0

    human = run_cli(cluster, "agent-info", "-address", address)
    assert human.returncode == 0, human.stderr
    assert re.search(r"^raft\n(  .*\n)*  state\s+= (leader|follower)$", human.stdout, re.M), human.stdout


@pytest.mark.timeout(120)
def test_agent_info__dev_agent__has_its_embedded_clients_section(dev_agent_factory: DevAgentFactory) -> None:
    agent = dev_agent_factory()

    def client_section() -> dict[str, str] | None:
        result = drover_cli("agent-info", "-json", "-address", agent.address, timeout=30)
        if result.returncode != 0:
            return None
        sections = {s["name"]: s["values"] for s in json.loads(result.stdout)["sections"]}
        client = sections.get("client")
        return client if client and client.get("registered") == "true" else None

    client = wait_for(client_section, 60, 0.5, lambda: agent.log()[-2000:])
    assert client["node_name"] == "dev-client" and client["node_id"]


@pytest.mark.parametrize("argv", [["version"], ["-version"]], ids=["command", "flag"])
def test_version__prints_the_package_version(argv: list[str]) -> None:
    result = drover_cli(*argv)
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"drover v{drover_version()}\n"


def test_server_members__unreachable_address__one_error_line() -> None:
    result = drover_cli("server", "members", "-address", "127.0.0.1:1")
    assert "127.0.0.1:1" in one_error_line(result)


# ---------------------------------------------------------------------------------------
# With ACLs on


def test_acls__alloc_stop_needs_alloc_lifecycle_on_the_allocs_namespace__members_operator_read(
    tmp_path: Path,
) -> None:
    with LocalCluster(tmp_path / "acl", servers=1, clients=1, acl=True) as cluster:
        cluster.wait_for_leader(60)
        admin_token = cluster.management_token
        assert admin_token
        addresses = cluster.grpc_addresses
        with DroverClient(addresses, retry_deadline=30, token=admin_token) as admin:
            wait_for(
                lambda: any(n.status == "ready" for n in admin.list_nodes().nodes),
                60,
                0.2,
                "the client's node",
            )
            admin.acl_upsert_policy("elsewhere", 'namespace "other" { capabilities = ["alloc-lifecycle"] }')
            admin.acl_upsert_policy("lifecycle", 'namespace "default" { capabilities = ["alloc-lifecycle"] }')
            admin.acl_upsert_policy("operator-read", 'operator { policy = "read" }')
            elsewhere = admin.acl_create_token(name="elsewhere", policies=["elsewhere"]).token.secret_id
            lifecycle = admin.acl_create_token(name="lifecycle", policies=["lifecycle"]).token.secret_id
            operator = admin.acl_create_token(name="operator", policies=["operator-read"]).token.secret_id
            run_job_file_as(cluster, tmp_path, admin_token, "guarded")
            [alloc] = wait_running(admin, "guarded", 1)

            with (
                DroverClient(addresses, retry_deadline=10, token=elsewhere) as other,
                pytest.raises(DroverError) as denied,
            ):
                other.stop_alloc(alloc.id)
            assert denied.value.code == grpc.StatusCode.PERMISSION_DENIED
            assert "namespace 'default'" in denied.value.message
            untouched = admin.get_alloc(alloc.id).alloc
            assert untouched.desired_status == "run" and not untouched.desired_transition.migrate

            with DroverClient(addresses, retry_deadline=10, token=lifecycle) as allowed:
                assert allowed.stop_alloc(alloc.id).eval_id
            assert admin.get_alloc(alloc.id).alloc.desired_transition.migrate

        with DroverClient(addresses, retry_deadline=10) as anonymous, pytest.raises(DroverError) as refused:
            anonymous.server_members()
        assert refused.value.code == grpc.StatusCode.PERMISSION_DENIED
        with DroverClient(addresses, retry_deadline=10, token=operator) as reader:
            [member] = reader.server_members().members
        assert (member.status, member.leader) == ("alive", True)


def run_job_file_as(cluster: LocalCluster, directory: Path, token: str, job_id: str) -> None:
    path = directory / f"{job_id}.hcl"
    path.write_text(mock_job_hcl(job_id, 1))
    result = drover_cli(
        "job",
        "run",
        "-detach",
        str(path),
        env={"DROVER_ADDR": ",".join(cluster.grpc_addresses), "DROVER_TOKEN": token},
    )
    assert result.returncode == 0, result.stderr
