"""drover.client.taskenv: the variables a task starts with (pure, no process started)."""

from __future__ import annotations

from drover.client.taskenv import dir_env, task_env
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
    }
