"""The HTTP port of real agents (``-http-port``): scraped as Prometheus scrapes it, parsed
with prometheus-client's own parser, and read the way an operator's load balancer reads
the leader and health paths.

Values must move when work happens: a job registered through the SDK shows up as a
``Jobs.Register`` RPC, a finished eval, a higher applied raft index on the server and
running allocs on the client agent's own port.
"""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from deploy.cluster import LocalCluster, pick_free_ports, wait_for
from drover.sdk import DroverClient
from tests.cluster.cli import drover_cli, one_error_line
from tests.cluster.conftest import DevAgentFactory, ready_cluster, wait_settled
from tests.cluster.jobs import running_allocs, service_job

WAIT_S = 60.0


@dataclass(frozen=True, slots=True)
class Answer:
    status: int
    body: bytes
    content_type: str

    def json(self) -> object:
        return json.loads(self.body)


def get(
    address: str,
    path: str,
    *,
    headers: Mapping[str, str] | None = None,
    context: ssl.SSLContext | None = None,
) -> Answer:
    scheme = "https" if context is not None else "http"
    request = urllib.request.Request(f"{scheme}://{address}{path}", headers=dict(headers or {}))
    try:
        with urllib.request.urlopen(request, timeout=10, context=context) as response:
            return Answer(response.status, response.read(), response.headers.get("Content-Type", ""))
    except urllib.error.HTTPError as exc:
        return Answer(exc.code, exc.read(), exc.headers.get("Content-Type", ""))


def scrape(address: str, **kwargs: object) -> list[Sample]:
    """Every sample of ``/v1/metrics?format=prometheus``, through prometheus-client's parser."""
    answer = get(address, "/v1/metrics?format=prometheus", **kwargs)  # type: ignore[arg-type]
    assert answer.status == 200, answer
    assert answer.content_type.startswith("text/plain"), answer.content_type
    return [s for family in text_string_to_metric_families(answer.body.decode()) for s in family.samples]


def value(samples: list[Sample], name: str, **labels: str) -> float:
    """The sum of ``name``'s samples whose labels include ``labels`` (0 when none)."""
    return sum(s.value for s in samples if s.name == name and labels.items() <= s.labels.items())


def names(samples: list[Sample]) -> set[str]:
    return {s.name for s in samples}


@pytest.fixture
def one_of_each(tmp_path: Path) -> Iterator[LocalCluster]:
    with ready_cluster(tmp_path / "cluster", servers=1, clients=1) as cluster:
        yield cluster


@pytest.mark.timeout(180)
def test_metrics_http__values_move_when_a_job_runs(one_of_each: LocalCluster) -> None:
    cluster = one_of_each
    server, client_agent = cluster.http_address(0), cluster.client_http_address(0)
    before = scrape(server)
    for family in (
        "drover_raft_term",
        "drover_raft_commit_index",
        "drover_raft_applied_index",
        "drover_raft_leader",
        "drover_broker_evals",
        "drover_plan_queue_depth",
        "drover_heartbeat_active_timers",
        "drover_heartbeat_invalidations_total",
        "drover_plan_node_rejected_total",
        "drover_rpc_requests_total",
    ):
        assert family in names(before), family
    assert value(before, "drover_raft_leader") == 1
    # /metrics is the same exposition (Prometheus' default path).
    assert "drover_raft_term" in get(server, "/metrics").body.decode()

    with DroverClient(cluster.grpc_addresses, retry_deadline=30) as sdk:
        sdk.register_job(service_job("web", count=2))
        wait_for(lambda: len(running_allocs(sdk, "web")) == 2 or None, WAIT_S, 0.2, "2 running allocs")
        # Operator.Metrics over gRPC serves the same registry, this server's gauges included.
        over_grpc = [s for f in text_string_to_metric_families(sdk.metrics().text) for s in f.samples]
    assert value(over_grpc, "drover_raft_leader") == 1
    assert value(over_grpc, "drover_rpc_requests_total", method="Jobs.Register", code="OK") >= 1

    def moved() -> list[Sample] | None:
        now = scrape(server)
        ok = (
            value(now, "drover_rpc_requests_total", method="Jobs.Register", code="OK")
            > value(before, "drover_rpc_requests_total", method="Jobs.Register", code="OK")
            and value(now, "drover_worker_evals_processed_total", scheduler="service", outcome="complete")
            > value(before, "drover_worker_evals_processed_total", scheduler="service", outcome="complete")
            and value(now, "drover_raft_applied_index") > value(before, "drover_raft_applied_index")
            and value(now, "drover_fsm_apply_seconds_count", type="job_register") >= 1
            and value(now, "drover_plan_apply_seconds_count") >= 1
        )
        return now if ok else None

    after = wait_for(moved, WAIT_S, 0.5, lambda: "server metrics to move\n" + cluster.logs_tail())
    assert after is not None
    assert value(after, "drover_rpc_request_seconds_count", method="Jobs.Register", code="OK") >= 1
    # A real server process collects its youngest generation many times just by serving.
    assert value(after, "drover_gc_pause_seconds_count", generation="0") > 0
    # A server agent froze what it started with out of later collections (server/gc_freeze.py).
    assert value(after, "drover_gc_frozen_objects") > 0
    # The API loop's lag probe runs in a real server (server/telemetry/loop_lag.py).
    assert value(after, "drover_api_loop_lag_seconds_count") > 0

    # The real client beats on its Nodes.Heartbeat stream (client_agent/rpc.py), and the
    # server counts and times each beat as the UpdateStatus call it is served as.
    def beats_counted() -> float:
        return value(
            scrape(server), "drover_rpc_request_seconds_count", method="Nodes.UpdateStatus", code="OK"
        )

    wait_for(beats_counted, WAIT_S, 0.5, "a heartbeat counted as a Nodes.UpdateStatus call")

    def client_running() -> list[Sample] | None:
        now = scrape(client_agent)
        return now if value(now, "drover_client_allocs", client_status="running") == 2 else None

    on_client = wait_for(client_running, WAIT_S, 0.5, "the client agent's metrics to show 2 running allocs")
    assert on_client is not None
    assert value(on_client, "drover_client_driver_start_seconds_count", driver="mock") >= 2
    assert value(on_client, "drover_client_registered") == 1

    # Prometheus conventions: every drover family is named drover_*, counters end in _total,
    # and no label carries an ID (only bounded names).
    for sample in [*after, *on_client]:
        if not sample.name.startswith("drover_"):
            continue
        assert not {"id", "alloc_id", "node_id", "job_id", "eval_id"} & set(sample.labels), sample

    leader = get(server, "/v1/status/leader")
    assert (leader.status, leader.json()) == (200, cluster.grpc_addresses[0])
    health = get(server, "/v1/agent/health")
    assert (health.status, health.json()) == (200, {"server": {"ok": True, "message": "ok"}})
    client_health = get(client_agent, "/v1/agent/health")
    assert (client_health.status, client_health.json()) == (200, {"client": {"ok": True, "message": "ok"}})
    assert get(server, "/v1/nope").status == 404
    assert get(server, "/v1/metrics?format=json").status == 400


# --- ACLs and TLS ---------------------------------------------------------------------------

AGENT_READ = 'agent { policy = "read" }'
NAMESPACE_READ = 'namespace "default" { policy = "read" }'


@pytest.fixture
def secured(tmp_path: Path) -> Iterator[LocalCluster]:
    """One server with ACLs and mTLS (it verifies callers' certificates), bootstrapped, and
    its gRPC address announced: ``/v1/status/leader`` answers from the servers table, and a
    leader read before its own announcement committed answered "" (CI of ced5af4)."""
    with LocalCluster(tmp_path / "cluster", servers=1, acl=True, tls=True) as cluster:
        wait_settled(cluster, WAIT_S)
        yield cluster


def _cli_context(cluster: LocalCluster, *, with_cert: bool = True) -> ssl.SSLContext:
    assert cluster.tls is not None
    context = ssl.create_default_context(cafile=str(cluster.tls.ca_file))
    if with_cert:
        files = cluster.tls.cli_files
        context.load_cert_chain(files.cert_file, files.key_file)
    return context


@pytest.mark.timeout(180)
def test_metrics_http__acl_and_mtls__metrics_need_agent_read_and_health_stays_open(
    secured: LocalCluster,
) -> None:
    cluster = secured
    assert cluster.tls is not None and cluster.management_token
    address = cluster.http_address(0)
    https = _cli_context(cluster)
    with DroverClient(
        cluster.grpc_addresses, retry_deadline=30, tls=cluster.tls.cli_files, token=cluster.management_token
    ) as admin:
        admin.acl_upsert_policy("agent-read", AGENT_READ)
        admin.acl_upsert_policy("ns-read", NAMESPACE_READ)
        agent_reader = admin.acl_create_token(name="prometheus", policies=["agent-read"]).token.secret_id
        ns_reader = admin.acl_create_token(name="jobs", policies=["ns-read"]).token.secret_id

    for path in ("/v1/metrics?format=prometheus", "/metrics"):
        assert get(address, path, context=https).status == 403, path
        assert get(address, path, context=https, headers={"X-Nomad-Token": ns_reader}).status == 403, path
        unknown = get(address, path, context=https, headers={"X-Nomad-Token": "not-a-token"})
        assert unknown.status == 403 and "ACL token not found" in unknown.body.decode(), unknown
    allowed = scrape(address, context=https, headers={"X-Nomad-Token": agent_reader})
    assert value(allowed, "drover_raft_leader") == 1
    bearer = get(
        address, "/metrics", context=https, headers={"Authorization": f"Bearer {cluster.management_token}"}
    )
    assert bearer.status == 200 and "drover_raft_term" in bearer.body.decode()

    # Load balancers hold no token: the leader and health paths answer without one.
    health = get(address, "/v1/agent/health", context=https)
    assert (health.status, health.json()) == (200, {"server": {"ok": True, "message": "ok"}})
    leader = get(address, "/v1/status/leader", context=https)
    assert (leader.status, leader.json()) == (200, cluster.grpc_addresses[0])

    # TLS like the gRPC port: plaintext gets no answer, nor does a caller without a certificate.
    with pytest.raises((urllib.error.URLError, ConnectionError)):
        get(address, "/v1/agent/health")
    with pytest.raises((urllib.error.URLError, ssl.SSLError, ConnectionError)):
        get(address, "/v1/agent/health", context=_cli_context(cluster, with_cert=False))


# --- the config key, on a dev agent -------------------------------------------------------


@pytest.mark.timeout(120)
def test_metrics_http__dev_agent__ports_block_sets_the_http_port(
    dev_agent_factory: DevAgentFactory, tmp_path: Path
) -> None:
    grpc_port, http_port = pick_free_ports(2)
    config = tmp_path / "dev.hcl"
    config.write_text(f"ports {{\n  grpc = {grpc_port}\n  http = {http_port}\n}}\n")
    agent = dev_agent_factory(
        "-config", str(config), grpc_port=grpc_port, http_port=http_port, port_flags=False
    )
    address = f"127.0.0.1:{http_port}"

    def healthy() -> Answer | None:
        agent.alive()
        try:
            answer = get(address, "/v1/agent/health")
        except (urllib.error.URLError, ConnectionError):
            return None
        return answer if answer.status == 200 else None

    health = wait_for(healthy, WAIT_S, 0.2, "the dev agent's HTTP port to report healthy")
    assert health is not None
    # One agent, both parts: the server and its embedded client.
    assert health.json() == {
        "server": {"ok": True, "message": "ok"},
        "client": {"ok": True, "message": "ok"},
    }
    # The leader's gRPC address comes from the servers table, which the new leader's
    # own announcement fills an entry or so after it is elected: wait for it.
    leader = wait_for(
        lambda: get(address, "/v1/status/leader").json() or None, WAIT_S, 0.2, "the leader's address"
    )
    assert leader == f"127.0.0.1:{grpc_port}"
    samples = scrape(address)
    assert value(samples, "drover_raft_leader") == 1
    assert "drover_client_allocs" in names(samples)
    assert agent.stop() == 0, agent.log()


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("ports {\n  http = 70000\n}\n", "key 'http_port': port 70000 out of range 0-65535"),
        ('ports {\n  http = "web"\n}\n', "key 'http_port': expected an integer"),
        ("ports {\n  htp = 4649\n}\n", "unknown key 'ports.htp' (did you mean 'http'?)"),
    ],
    ids=["out-of-range", "not-a-number", "misspelt"],
)
def test_metrics_http__bad_ports_block__refused_in_one_line(tmp_path: Path, body: str, message: str) -> None:
    config = tmp_path / "dev.hcl"
    config.write_text(body)
    line = one_error_line(drover_cli("agent", "-dev", "-config", str(config), timeout=60))
    assert message in line, line


@pytest.mark.timeout(120)
def test_metrics_http__port_taken__agent_refuses_to_start_naming_it(tmp_path: Path) -> None:
    import socket

    grpc_port, raft_port = pick_free_ports(2)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        taken = holder.getsockname()[1]
        result = drover_cli(
            "agent", "-server", "-node-name", "s1", "-data-dir", str(tmp_path / "s1"),
            "-grpc-port", str(grpc_port), "-raft-port", str(raft_port), "-http-port", str(taken),
            timeout=60,
        )  # fmt: skip
    assert result.returncode == 1, result.stdout + result.stderr
    errors = [line for line in result.stdout.splitlines() if line.startswith("Error: ")]
    assert errors == [
        f"Error: can not bind HTTP to 127.0.0.1:{taken}: Address already in use (see -http-port)"
    ], result.stdout + result.stderr
    assert "Traceback" not in result.stdout + result.stderr


@pytest.mark.timeout(180)
def test_metrics_http__three_servers__the_leader_reports_appends_and_last_contact_per_follower(
    cluster: LocalCluster,
) -> None:
    leader = cluster.leader_index()
    followers = [name for i, name in enumerate(cluster.server_names) if i != leader]

    def contacts() -> list[Sample] | None:
        samples = scrape(cluster.http_address(leader))
        peers = {s.labels["peer"] for s in samples if s.name == "drover_raft_last_contact_seconds"}
        appended = value(samples, "drover_raft_append_seconds_count") >= 1
        return samples if peers == set(followers) and appended else None

    samples = wait_for(contacts, WAIT_S, 0.5, f"last contact with {followers} on the leader")
    assert samples is not None and value(samples, "drover_raft_leader") == 1
    # Heartbeats every few hundred ms: a live follower was heard from within seconds.
    for name in followers:
        assert value(samples, "drover_raft_last_contact_seconds", peer=name) < 5, name
    for i in range(3):
        if i == leader:
            continue
        on_follower = scrape(cluster.http_address(i))
        assert value(on_follower, "drover_raft_leader") == 0
        assert "drover_raft_last_contact_seconds" not in names(on_follower)
        assert value(on_follower, "drover_raft_term") == value(samples, "drover_raft_term")
        assert get(cluster.http_address(i), "/v1/status/leader").json() == cluster.grpc_addresses[leader]
