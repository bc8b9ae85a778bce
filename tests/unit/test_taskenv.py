"""drover.client.taskenv: the variables a task starts with (pure, no process started)."""

from __future__ import annotations

from pathlib import Path

from drover.client.taskenv import dir_env, node_values, task_env
from drover.v1 import structs_pb2


def _parts() -> tuple[structs_pb2.Allocation, structs_pb2.Job, structs_pb2.TaskGroup, structs_pb2.Task]:
    task = structs_pb2.Task(
        name="server", meta={"tier": "task", "rack-id": "r7"}, env={"NOMAD_NODE_NAME": "x"}
    )
    group = structs_pb2.TaskGroup(name="web", meta={"tier": "group", "zone": "z1"}, tasks=[task])
    job = structs_pb2.Job(
        id="shop", namespace="default", meta={"tier": "job", "owner": "ops"}, groups=[group]
    )
    alloc = structs_pb2.Allocation(id="a-1", name="shop.web[2]", index=2, node_id="n-1", node_name="c1")
    return alloc, job, group, task


def test_task_env__names_the_alloc_and_node_under_both_prefixes() -> None:
    alloc, job, group, task = _parts()
    env = task_env(alloc, job, group, task)
    for prefix in ("DROVER_", "NOMAD_"):
        assert env[prefix + "ALLOC_ID"] == "a-1"
        assert env[prefix + "ALLOC_INDEX"] == "2"
        assert env[prefix + "ALLOC_NAME"] == "shop.web[2]"
        assert env[prefix + "NODE_ID"] == "n-1"
        assert env[prefix + "JOB_NAME"] == "shop"  # no name: the ID
        assert env[prefix + "GROUP_NAME"] == "web"
    assert env["DROVER_NODE_NAME"] == "c1"


def test_task_env__meta_most_specific_wins_and_keys_become_names() -> None:
    env = task_env(*_parts())
    assert env["NOMAD_META_tier"] == "task"
    assert env["NOMAD_META_zone"] == "z1"
    assert env["NOMAD_META_owner"] == "ops"
    assert env["DROVER_META_rack_id"] == "r7"


def test_task_env__the_tasks_own_env_block_wins() -> None:
    env = task_env(*_parts())
    assert env["NOMAD_NODE_NAME"] == "x"
    assert env["DROVER_NODE_NAME"] == "c1"


def test_dir_env__both_prefixes() -> None:
    assert dir_env("/a", "/a/t") == {
        "DROVER_ALLOC_DIR": "/a",
        "DROVER_TASK_DIR": "/a/t",
        "NOMAD_ALLOC_DIR": "/a",
        "NOMAD_TASK_DIR": "/a/t",
        "DROVER_SECRETS_DIR": "/a/t/secrets",
        "NOMAD_SECRETS_DIR": "/a/t/secrets",
    }


def _node() -> structs_pb2.Node:
    return structs_pb2.Node(
        id="n-1",
        name="c1",
        datacenter="dc2",
        node_class="gpu",
        address="10.0.0.9",
        attributes={"kernel.name": "linux", "unique.network.ip-address": "10.0.0.7"},
        meta={"rack": "r1"},
    )


def test_task_env__nomads_identity_limits_and_directories() -> None:
    alloc, job, group, task = _parts()
    alloc.id = "0123456789abcdef"
    job.parent_id = "shop/periodic-1"
    task.resources.CopyFrom(structs_pb2.Resources(cpu_mhz=250, memory_mb=64))
    env = task_env(alloc, job, group, task, node=_node(), task_dir=Path("/d/a1/server"))
    assert env["NOMAD_SHORT_ALLOC_ID"] == "01234567"
    assert env["NOMAD_JOB_PARENT_ID"] == "shop/periodic-1"
    assert env["NOMAD_NAMESPACE"] == "default"
    assert env["NOMAD_REGION"] == "global"
    assert env["NOMAD_DC"] == "dc2"
    assert env["NOMAD_CPU_LIMIT"] == "250"
    assert env["NOMAD_MEMORY_LIMIT"] == "64"
    assert env["NOMAD_ALLOC_DIR"] == "/d/a1"
    assert env["NOMAD_TASK_DIR"] == "/d/a1/server"
    assert env["NOMAD_SECRETS_DIR"] == "/d/a1/server/secrets"


def test_task_env__no_resources_block_gives_the_schedulers_defaults() -> None:
    env = task_env(*_parts())
    assert (env["NOMAD_CPU_LIMIT"], env["NOMAD_MEMORY_LIMIT"]) == ("100", "300")


def test_task_env__ports_by_label_to_wins_for_the_bind_port() -> None:
    alloc, job, group, task = _parts()
    alloc.resources.ports.add(label="http", value=23456)
    alloc.resources.ports.add(label="db", value=25000, to=5432, host_ip="10.0.0.5")
    env = task_env(alloc, job, group, task, node=_node())
    assert env["NOMAD_PORT_http"] == "23456"
    assert env["NOMAD_HOST_PORT_http"] == "23456"
    assert env["NOMAD_IP_http"] == "10.0.0.7"  # no host_ip: the node's fingerprinted address
    assert env["NOMAD_ADDR_http"] == "10.0.0.7:23456"
    assert env["NOMAD_ALLOC_PORT_http"] == "23456"
    assert env["NOMAD_PORT_db"] == "5432"
    assert env["NOMAD_HOST_PORT_db"] == "25000"
    assert env["NOMAD_HOST_ADDR_db"] == "10.0.0.5:25000"
    assert env["NOMAD_ADDR_db"] == "10.0.0.5:5432"
    assert env["DROVER_PORT_db"] == "5432"


def test_task_env__meta_as_written_and_upper_cased() -> None:
    env = task_env(*_parts())
    assert env["NOMAD_META_owner"] == env["NOMAD_META_OWNER"] == "ops"
    assert env["NOMAD_META_zone"] == env["NOMAD_META_ZONE"] == "z1"
    assert env["NOMAD_META_RACK_ID"] == "r7"


def test_task_env__env_block_values_are_interpolated() -> None:
    alloc, job, group, task = _parts()
    task.env["WHERE"] = "${node.unique.name}/${NOMAD_ALLOC_INDEX}/${meta.rack}/${attr.nope}"
    env = task_env(alloc, job, group, task, node=_node())
    assert env["WHERE"] == "c1/2/r1/${attr.nope}"


def test_node_values__the_names_a_task_may_interpolate() -> None:
    values = node_values(_node())
    assert values["node.unique.id"] == "n-1"
    assert values["node.unique.name"] == "c1"
    assert values["node.datacenter"] == "dc2"
    assert values["node.class"] == "gpu"
    assert values["attr.kernel.name"] == "linux"
    assert values["meta.rack"] == "r1"
    assert node_values(None) == {}
