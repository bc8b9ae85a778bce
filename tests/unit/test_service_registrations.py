"""Service registrations as state: derived by the FSM from the alloc in the same entry
(server/services/registrations.py, server/state_store.py), kept in snapshots."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import pytest

from drover.common.secrets import hash_secret
from drover.scheduler.structs import (
    ALLOC_CLIENT_COMPLETE,
    ALLOC_CLIENT_LOST,
    ALLOC_CLIENT_RUNNING,
    Job,
    NetworkResource,
    Port,
    Service,
    ServiceCheck,
)
from drover.server.api.services import ServicesServicer
from drover.server.endpoints import Endpoints
from drover.server.errors import NotFoundError, PermissionDeniedError, ValidationError
from drover.server.fsm import ET, encode_entry
from drover.server.services.registrations import registrations_for, service_address
from drover.server.snapshot import from_snapshot, state_digest, to_snapshot
from drover.v1 import api_pb2, raft_pb2, structs_pb2
from tests.fixtures import mock
from tests.fixtures.fsm_log import FsmLog


def _service_job() -> Job:
    base = mock.job(id="web")
    group = replace(
        base.groups[0],
        network=NetworkResource(dynamic_ports=(Port(label="http", to=8080),)),
        services=(Service(name="web-http", port="http", tags=("v1", "edge")),),
        tasks=(replace(base.groups[0].tasks[0], services=(Service(name="web-task", tags=("t",)),)),),
    )
    return replace(base, groups=(group,))


def _running_alloc(job: Job | None = None) -> tuple[FsmLog, str]:
    cluster = FsmLog()
    job = job or _service_job()
    node = mock.node(
        id="n1",
        attributes={"unique.network.ip-address": "10.0.0.7"},
        secret_id="",
        secret_hash=hash_secret("n1-secret"),
    )
    cluster.apply(mock.register_node_entry(node))
    cluster.apply(mock.register_job_entry(job))
    stored = cluster.snap.job("default", "web")
    assert stored is not None
    alloc = mock.alloc(stored, node, id="a1")
    cluster.apply(mock.plan_entry([alloc]))
    assert cluster.snap.alloc_services("a1") == (), "a pending alloc registers nothing"
    cluster.apply(mock.client_update_entry("a1", ALLOC_CLIENT_RUNNING))
    return cluster, "a1"


def test_registrations__alloc_running__registers_group_and_task_services_in_that_entry() -> None:
    cluster, alloc_id = _running_alloc()
    regs = cluster.snap.service_registrations("default", "web-http")
    assert [(r.alloc_id, r.address, r.port, r.tags, r.task) for r in regs] == [
        (alloc_id, "192.168.0.100", 20000, ("v1", "edge"), "")
    ]
    assert regs[0].create_index == regs[0].modify_index == cluster.index
    (task_reg,) = cluster.snap.service_registrations("default", "web-task")
    assert (task_reg.task, task_reg.port, task_reg.address) == ("web", 0, "10.0.0.7")
    assert list(cluster.snap.service_names()) == [("default", "web-http"), ("default", "web-task")]
    assert cluster.snap.table_index("services") == cluster.index


def test_registrations__running_again__keeps_indexes_and_does_not_touch_the_table() -> None:
    cluster, alloc_id = _running_alloc()
    at = cluster.index
    cluster.apply(mock.client_update_entry(alloc_id, ALLOC_CLIENT_RUNNING, client_description="still"))
    assert cluster.snap.table_index("services") == at
    assert cluster.snap.service_registrations("default", "web-http")[0].create_index == at


def test_registrations__alloc_stopped__removed_in_the_stop_entry() -> None:
    cluster, alloc_id = _running_alloc()
    cluster.apply(mock.plan_entry(allocs_stopped=[alloc_id]))
    assert cluster.snap.alloc_services(alloc_id) == ()
    assert list(cluster.snap.service_names()) == []
    assert cluster.snap.table_index("services") == cluster.index


def test_registrations__alloc_lost_or_complete__removed() -> None:
    for status in (ALLOC_CLIENT_LOST, ALLOC_CLIENT_COMPLETE):
        cluster, alloc_id = _running_alloc()
        cluster.apply(mock.client_update_entry(alloc_id, status))
        assert cluster.snap.service_registrations("default", "web-http") == [], status


def test_registrations__alloc_collected__removed() -> None:
    cluster, alloc_id = _running_alloc()
    cluster.apply(mock.eval_delete_entry(alloc_ids=[alloc_id]))
    assert cluster.snap.alloc(alloc_id) is None
    assert list(cluster.snap.service_names()) == []


def test_registrations__snapshot_round_trip__same_registrations_and_digest() -> None:
    cluster, _ = _running_alloc()
    tables = cluster.snap.tables
    restored = from_snapshot(to_snapshot(tables))
    assert restored.services == tables.services
    assert restored.services_by_name == tables.services_by_name
    assert state_digest(restored) == state_digest(tables)


def test_service_address__alloc_mode__uses_the_ports_to() -> None:
    job = _service_job()
    node = mock.node()
    alloc = mock.alloc(job, node)
    service = Service(name="s", port="http")
    assert service_address(alloc, node, service) == ("192.168.0.100", 20000)
    assert service_address(alloc, node, replace(service, address_mode="alloc")) == ("192.168.0.100", 8080)
    assert service_address(alloc, node, replace(service, port="")) == ("192.168.0.100", 0)


def test_registrations_for__consul_provider_or_no_job__none() -> None:
    job = _service_job()
    node = mock.node()
    alloc = mock.alloc(job, node, client_status=ALLOC_CLIENT_RUNNING)
    assert len(registrations_for(alloc, job, node, 5)) == 2
    assert registrations_for(alloc, None, node, 5) == ()
    group = replace(
        job.groups[0], services=(Service(name="c", provider="consul"),), tasks=(job.groups[0].tasks[0],)
    )
    consul_job = replace(job, groups=(replace(group, tasks=(replace(group.tasks[0], services=()),)),))
    assert registrations_for(alloc, consul_job, node, 5) == ()


# ---------------------------------------------------------------------------------------
# The Services API, below its rpc decorator (ACLs: tests/unit/test_acl_rights.py)


def _api(cluster: FsmLog) -> ServicesServicer:
    raft = SimpleNamespace(leader_address=lambda: "127.0.0.1:4647")
    clock, ids = SimpleNamespace(now_ns=lambda: mock.NOW), mock.Counter("id")
    endpoints = Endpoints(raft, cluster.store, clock, ids)
    core = SimpleNamespace(store=cluster.store, raft=raft, name="s1", endpoints=endpoints)
    return ServicesServicer(core)  # type: ignore[arg-type]


def _call(servicer: ServicesServicer, method: str, request: object) -> Any:
    return getattr(type(servicer), method).__wrapped__(servicer, request, None)


def test_services_api__list_info_and_client_info() -> None:
    cluster, alloc_id = _running_alloc()
    api = _api(cluster)
    listed = _call(api, "List", api_pb2.ServiceListRequest())
    assert [(s.service_name, s.registrations, list(s.tags)) for s in listed.services] == [
        ("web-http", 1, ["edge", "v1"]),
        ("web-task", 1, ["t"]),
    ]
    assert listed.meta.index == cluster.index
    assert _call(api, "List", api_pb2.ServiceListRequest(namespace="other")).services == []
    info = _call(api, "Info", api_pb2.ServiceInfoRequest(service_name="web-http"))
    assert [(r.alloc_id, r.port) for r in info.registrations] == [(alloc_id, 20000)]
    with pytest.raises(NotFoundError, match="service 'nope' not found"):
        _call(api, "Info", api_pb2.ServiceInfoRequest(service_name="nope"))

    client = _call(
        api,
        "ClientInfo",
        api_pb2.ServiceClientInfoRequest(
            node_id="n1", secret_id="n1-secret", alloc_id=alloc_id, service_names=["web-task", "nope"]
        ),
    )
    assert [r.service_name for r in client.registrations] == ["web-task"]


def test_services_api__client_info__only_for_an_alloc_of_that_node_with_its_secret() -> None:
    cluster, alloc_id = _running_alloc()
    other = mock.node(id="n2", secret_id="", secret_hash=hash_secret("n2-secret"))
    cluster.apply(mock.register_node_entry(other))
    api = _api(cluster)
    with pytest.raises(PermissionDeniedError, match="is not on this node"):
        _call(
            api,
            "ClientInfo",
            api_pb2.ServiceClientInfoRequest(node_id="n2", secret_id="n2-secret", alloc_id=alloc_id),
        )
    with pytest.raises(PermissionDeniedError, match="wrong node secret"):
        _call(
            api,
            "ClientInfo",
            api_pb2.ServiceClientInfoRequest(node_id="n1", secret_id="n2-secret", alloc_id=alloc_id),
        )


def test_registrations_for__name_and_tags__interpolated_as_the_task_sees_them() -> None:
    base = _service_job()
    group = replace(
        base.groups[0],
        meta={"tier": "front"},
        services=(
            Service(
                name="${NOMAD_JOB_NAME}-${NOMAD_GROUP_NAME}",
                tags=(
                    "${node.unique.name}",
                    "${NOMAD_META_tier}",
                    "alloc-${NOMAD_ALLOC_INDEX}",
                    "${no.such}",
                ),
            ),
        ),
        tasks=(replace(base.groups[0].tasks[0], services=(Service(name="${NOMAD_TASK_NAME}-svc"),)),),
    )
    job = replace(base, groups=(group,))
    node = mock.node(name="box-1")
    alloc = mock.alloc(job, node, 2, client_status=ALLOC_CLIENT_RUNNING)
    group_reg, task_reg = registrations_for(alloc, job, node, 5)
    assert group_reg.service_name == "web-web"
    assert group_reg.tags == ("box-1", "front", "alloc-2", "${no.such}")
    assert task_reg.service_name == "web-svc"


def _checked_job() -> Job:
    """web-http with two checks; web-task with none."""
    job = _service_job()
    group = job.groups[0]
    checks = (ServiceCheck(name="alive", type="tcp"), ServiceCheck(type="http", path="/ready"))
    return replace(job, groups=(replace(group, services=(replace(group.services[0], checks=checks),)),))


def _report_checks(cluster: FsmLog, alloc_id: str, statuses: dict[str, str]) -> None:
    """The client's report of its alloc running, with web-http's check statuses."""
    entry = raft_pb2.AllocClientUpdateEntry(updated_at_ns=mock.NOW, node_id="n1")
    msg = entry.allocs.add(id=alloc_id, client_status=ALLOC_CLIENT_RUNNING)
    for check, status in statuses.items():
        msg.check_statuses.add(service="web-http", check=check, status=status, output=f"{status}!")
    cluster.apply(encode_entry(ET.ENTRY_TYPE_ALLOC_CLIENT_UPDATE, entry))


def _health(cluster: FsmLog) -> dict[str, tuple[str, int]]:
    return {r.service_name: (r.health, r.modify_index) for r in cluster.snap.alloc_services("a1")}


def test_registrations__health_follows_the_reported_checks__client_info_hands_out_passing_only() -> None:
    cluster, alloc_id = _running_alloc(_checked_job())
    running_at = cluster.index
    # No result yet: pending. A service without checks passes.
    assert _health(cluster) == {"web-http": ("pending", running_at), "web-task": ("passing", running_at)}
    _report_checks(cluster, alloc_id, {"alive": "passing", "check[1]": "passing"})
    passing_at = cluster.index
    assert _health(cluster) == {"web-http": ("passing", passing_at), "web-task": ("passing", running_at)}
    _report_checks(cluster, alloc_id, {"alive": "passing", "check[1]": "passing"})
    assert _health(cluster)["web-http"] == ("passing", passing_at), "the same report moves nothing"
    _report_checks(cluster, alloc_id, {"alive": "critical", "check[1]": "passing"})
    (registration,) = [r for r in cluster.snap.alloc_services("a1") if r.service_name == "web-http"]
    assert registration.health == "critical"
    assert [(c.check, c.status, c.output) for c in registration.checks] == [
        ("alive", "critical", "critical!"),
        ("check[1]", "passing", "passing!"),
    ]

    api = _api(cluster)
    info = _call(api, "Info", api_pb2.ServiceInfoRequest(service_name="web-http"))
    assert [r.health for r in info.registrations] == ["critical"]
    request = api_pb2.ServiceClientInfoRequest(
        node_id="n1", secret_id="n1-secret", alloc_id=alloc_id, service_names=["web-http", "web-task"]
    )
    assert [r.service_name for r in _call(api, "ClientInfo", request).registrations] == ["web-task"]
    listed = _call(api, "List", api_pb2.ServiceListRequest()).services
    assert [(s.service_name, s.registrations, s.passing) for s in listed] == [
        ("web-http", 1, 0),
        ("web-task", 1, 1),
    ]
    _report_checks(cluster, alloc_id, {"alive": "passing", "check[1]": "passing"})
    listed = _call(api, "List", api_pb2.ServiceListRequest()).services
    assert [(s.service_name, s.passing) for s in listed] == [("web-http", 1), ("web-task", 1)]
    assert [r.service_name for r in _call(api, "ClientInfo", request).registrations] == [
        "web-http",
        "web-task",
    ]


def test_endpoint__check_statuses__bad_status_refused_naming_the_field() -> None:
    cluster, alloc_id = _running_alloc(_checked_job())
    raft = SimpleNamespace(leader_address=lambda: "127.0.0.1:4647")
    endpoints = Endpoints(raft, cluster.store, SimpleNamespace(now_ns=lambda: mock.NOW), mock.Counter("id"))
    report = structs_pb2.Allocation(id=alloc_id, client_status=ALLOC_CLIENT_RUNNING)
    report.check_statuses.add(service="web-http", check="alive", status="fine")
    with pytest.raises(
        ValidationError, match=r"allocs\[0\]\.check_statuses\[0\]\.status: 'fine' is not one of"
    ):
        endpoints.update_allocs([report], node_id="n1", secret_id="n1-secret")
