"""The pure parts of the agents' metrics and HTTP port: labels, token headers, the routes'
answers, the ``ports { }`` config block, the RPC interceptor on a real in-process gRPC
server, and the endpoint itself on a loopback port."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from email.message import Message
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Counter
from prometheus_client.parser import text_string_to_metric_families

from drover.client.metrics import ClientCollector, client_health, client_routes
from drover.client.taskstate import AllocStatus
from drover.common.http_endpoint import HttpEndpoint, Request, Response, json_response, token_of
from drover.common.prometheus import agent_registry, metrics_response
from drover.server.config import ConfigError, load_dev_config, load_server_config
from drover.server.fsm import encode_entry
from drover.server.telemetry.metrics import RPC_REQUESTS, entry_type_label
from drover.server.telemetry.rpc import method_label
from drover.v1 import raft_pb2


def _headers(**values: str) -> Message:
    """Case-insensitive headers, as http.server hands them to a route."""
    message = Message()
    for name, value in values.items():
        message[name.replace("_", "-")] = value
    return message


# --- labels --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("entry_type", "label"),
    [
        (raft_pb2.ENTRY_TYPE_JOB_REGISTER, "job_register"),
        (raft_pb2.ENTRY_TYPE_APPLY_PLAN_RESULTS, "apply_plan_results"),
        (raft_pb2.ENTRY_TYPE_SERVER_MEMBER, "server_member"),
    ],
    ids=["job-register", "plan-results", "server-member"],
)
def test_entry_type_label__read_from_the_first_field(entry_type: int, label: str) -> None:
    data = encode_entry(entry_type, raft_pb2.JobRegisterEntry())
    assert entry_type_label(data) == label


@pytest.mark.parametrize(
    "data",
    [b"", b"\x12\x00", b"\x08", b"\x08\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff", b"\x08\x7f"],
    ids=["empty", "no-type-field", "truncated-varint", "overlong-varint", "unknown-number"],
)
def test_entry_type_label__anything_else_is_unknown(data: bytes) -> None:
    assert entry_type_label(data) == "unknown"


def test_entry_type_label__a_multi_byte_type_number() -> None:
    big = max(number for _name, number in raft_pb2.EntryType.items())
    assert big >= 128, "the table has a type number that needs two varint bytes"
    assert (
        entry_type_label(raft_pb2.LogEntry(type=big).SerializeToString())
        == raft_pb2.EntryType.Name(big).removeprefix("ENTRY_TYPE_").lower()
    )


@pytest.mark.parametrize(
    ("full", "label"),
    [("/drover.v1.Jobs/Register", "Jobs.Register"), ("/grpc.health.v1.Health/Check", "Health.Check")],
)
def test_method_label__service_without_package(full: str, label: str) -> None:
    assert method_label(full) == label


# --- token headers -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("headers", "token"),
    [
        ({"X_Nomad_Token": "s1"}, "s1"),
        ({"x_nomad_token": "s1"}, "s1"),
        ({"X_Drover_Token": "s2"}, "s2"),
        ({"Authorization": "Bearer s3"}, "s3"),
        ({"Authorization": "bearer  s3 "}, "s3"),
        ({"Authorization": "Basic dXNlcjpwYXNz"}, ""),
        ({}, ""),
    ],
    ids=["nomad", "nomad-lowercase", "drover", "bearer", "bearer-lowercase", "basic-is-not-a-token", "none"],
)
def test_token_of__headers_a_scraper_sends(headers: dict[str, str], token: str) -> None:
    assert token_of(_headers(**headers)) == token


# --- routes --------------------------------------------------------------------------------


def test_metrics_response__prometheus_text_and_refuses_other_formats() -> None:
    registry = CollectorRegistry()
    Counter("drover_test_things_total", "things", registry=registry).inc(3)
    for query in ({}, {"format": ["prometheus"]}):
        answer = metrics_response(registry, Request("/v1/metrics", query))
        assert answer.status == 200 and answer.content_type.startswith("text/plain")
        (family,) = [
            f for f in text_string_to_metric_families(answer.body.decode()) if f.name == "drover_test_things"
        ]
        assert family.type == "counter" and family.samples[0].value == 3
    refused = metrics_response(registry, Request("/v1/metrics", {"format": ["json"]}))
    assert refused.status == 400 and b"format=prometheus" in refused.body


def test_agent_registry__the_process_families_and_the_agents_own() -> None:
    # RPC_REQUESTS lives on prometheus-client's default registry; the agent's collector on its own.
    RPC_REQUESTS.labels("Test.Registry", "OK").inc()
    agent = _FakeClient(statuses={"a1": "running", "a2": "running", "a3": "failed"})
    registry = agent_registry(ClientCollector(agent))
    text = metrics_response(registry, Request("/metrics")).body.decode()
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
    }
    assert samples[("drover_rpc_requests_total", (("code", "OK"), ("method", "Test.Registry")))] >= 1
    assert samples[("drover_client_allocs", (("client_status", "running"),))] == 2
    assert samples[("drover_client_allocs", (("client_status", "failed"),))] == 1
    assert samples[("drover_client_allocs", (("client_status", "pending"),))] == 0
    assert samples[("drover_client_registered", ())] == 1
    # Two agents in one process each get a registry: no "duplicated timeseries" refusal.
    agent_registry(ClientCollector(agent))


@dataclass
class _FakeClient:
    """A client agent as the metrics see it (in-process stand-in, no runners)."""

    statuses: dict[str, str] = field(default_factory=dict)
    registered: bool = True

    def alloc_ids(self) -> list[str]:
        return sorted(self.statuses)

    def alloc_status(self, alloc_id: str) -> AllocStatus | None:
        status = self.statuses.get(alloc_id)
        return None if status is None else AllocStatus(alloc_id, status, "", {})


def test_client_routes__health_follows_registration_and_leader_is_left_to_servers() -> None:
    agent = _FakeClient()
    routes = client_routes(agent, agent_registry(ClientCollector(agent)))
    ok = routes["/v1/agent/health"](Request("/v1/agent/health"))
    assert (ok.status, json.loads(ok.body)) == (200, {"client": {"ok": True, "message": "ok"}})
    agent.registered = False
    down = routes["/v1/agent/health"](Request("/v1/agent/health"))
    assert (down.status, json.loads(down.body)) == (500, {"client": client_health(agent)})
    assert json.loads(down.body)["client"]["ok"] is False
    assert routes["/v1/status/leader"](Request("/v1/status/leader")).status == 404
    assert routes["/metrics"] is routes["/v1/metrics"]


# --- the endpoint --------------------------------------------------------------------------


@pytest.fixture
def endpoint() -> Iterator[HttpEndpoint]:
    def hello(request: Request) -> Response:
        return json_response(200, {"who": request.param("who"), "token": token_of(request.headers)})

    def broken(_request: Request) -> Response:
        raise RuntimeError("a bug")

    served = HttpEndpoint("127.0.0.1", 0, {"/hello": hello, "/broken": broken})
    served.start()
    try:
        yield served
    finally:
        served.stop()


def _call(endpoint: HttpEndpoint, path: str, method: str = "GET", **headers: str) -> tuple[int, bytes]:
    request = urllib.request.Request(f"http://{endpoint.address}{path}", method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def test_http_endpoint__routes_get_404s_the_rest_and_refuses_other_methods(endpoint: HttpEndpoint) -> None:
    assert endpoint.port != 0
    status, body = _call(endpoint, "/hello?who=ops", **{"X-Nomad-Token": "t1"})
    assert (status, json.loads(body)) == (200, {"who": "ops", "token": "t1"})
    assert _call(endpoint, "/nope")[0] == 404
    status, body = _call(endpoint, "/hello", method="POST")
    assert status == 405 and b"GET only" in body
    # A route that raises answers 500 and the port keeps serving.
    assert _call(endpoint, "/broken")[0] == 500
    assert _call(endpoint, "/hello")[0] == 200


def test_http_endpoint__a_taken_port_fails_at_construction(endpoint: HttpEndpoint) -> None:
    with pytest.raises(OSError):
        HttpEndpoint("127.0.0.1", endpoint.port, {})


# The RPC interceptor the API serves with (AioRpcMetrics) is counted on a real grpc.aio
# server in tests/unit/test_api_aio.py.

# --- the ports { } block -----------------------------------------------------------------


def _write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "agent.hcl"
    path.write_text(text)
    return str(path)


def test_ports_block__sets_each_port(tmp_path: Path) -> None:
    text = 'node_name = "s1"\ndata_dir = "/d"\nports {\n  grpc = 5646\n  raft = 5647\n  http = 0\n}\n'
    cfg = load_server_config({}, _write(tmp_path, text))
    assert (cfg.grpc_port, cfg.raft_port, cfg.http_port) == (5646, 5647, 0)


def test_ports_block__the_flag_wins_and_the_default_is_4649(tmp_path: Path) -> None:
    path = _write(tmp_path, "ports {\n  http = 5000\n}\n")
    assert load_dev_config({"http_port": 6000}, path).http_port == 6000
    assert load_dev_config({}, None).http_port == 4649


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("ports {\n  http = 70000\n}\n", "key 'http_port': port 70000 out of range 0-65535"),
        ("ports {\n  http = -1\n}\n", "key 'http_port': port -1 out of range 0-65535"),
        ('ports {\n  http = "4649"\n}\n', "key 'http_port': expected an integer"),
        ("ports {\n  raft = 4647\n}\n", "unknown key 'ports.raft'"),
        ("http_port = 1\nports {\n  http = 2\n}\n", "key ports.http is given twice"),
    ],
    ids=["over-range", "negative", "string", "not-a-dev-port", "twice"],
)
def test_ports_block__bad_value_refused_naming_the_key(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_dev_config({}, _write(tmp_path, text))
    assert message in str(caught.value)
