"""The jobspec's scheduling keys (node_pool, migrate, reschedule, spread targets, memory_max,
cores, network mode, scaling, the old disconnect names, Nomad's API JSON) and the keys drover
refuses by name."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from drover.scheduler.structs import DisconnectStrategy, MigrateStrategy, SpreadTarget
from drover.scheduler.validate import ValidationError, canonicalize_job, validate_job
from drover.server.jobspec import _NOT_SUPPORTED, JobspecError, parse_jobspec


def _hcl(job_body: str = "", group_body: str = "", task_body: str = "") -> str:
    return f"""
job "web" {{
  {job_body}
  group "api" {{
    {group_body}
    task "t" {{
      driver = "raw_exec"
      config {{ command = "/bin/true" }}
      {task_body}
    }}
  }}
}}
"""


def _errors(text: str) -> list[str]:
    with pytest.raises(JobspecError) as caught:
        parse_jobspec(text, filename="f.hcl")
    return list(caught.value.errors)


def test_node_pool__read_and_kept() -> None:
    assert parse_jobspec(_hcl('node_pool = "edge"')).node_pool == "edge"
    assert parse_jobspec(_hcl()).node_pool == ""


def test_job_reschedule__inherited_by_a_group_without_its_own_and_merged_under_one_with() -> None:
    job = parse_jobspec(_hcl('reschedule {\n attempts = 7\n interval = "1h"\n }'))
    assert job.reschedule is not None and job.groups[0].reschedule is not None
    assert (job.groups[0].reschedule.attempts, job.groups[0].reschedule.interval_ns) == (7, 3600 * 10**9)
    job = parse_jobspec(
        _hcl('reschedule {\n attempts = 7\n interval = "1h"\n }', "reschedule { attempts = 2 }")
    )
    policy = job.groups[0].reschedule
    assert policy is not None and (policy.attempts, policy.interval_ns) == (2, 3600 * 10**9)


def test_migrate__job_and_group_levels() -> None:
    job = parse_jobspec(_hcl('migrate {\n max_parallel = 3\n min_healthy_time = "5s"\n }'))
    assert job.groups[0].migrate == MigrateStrategy(max_parallel=3, min_healthy_time_ns=5 * 10**9)
    job = parse_jobspec(_hcl("migrate { max_parallel = 3 }", 'migrate { health_check = "task_states" }'))
    assert job.groups[0].migrate == MigrateStrategy(max_parallel=3, health_check="task_states")
    bad = replace(job, groups=(replace(job.groups[0], migrate=MigrateStrategy(max_parallel=0)),))
    with pytest.raises(ValidationError, match=r"migrate.max_parallel: must be >= 1"):
        validate_job(canonicalize_job(bad))


def test_spread_targets__parsed_and_validated() -> None:
    spread = 'spread {\n attribute = "${node.datacenter}"\n target "dc1" { percent = 60 }\n target "dc2" { percent = 40 }\n }'
    job = parse_jobspec(_hcl(spread))
    assert job.spreads[0].targets == (SpreadTarget("dc1", 60), SpreadTarget("dc2", 40))
    over = parse_jobspec(_hcl(spread.replace("40", "50")))
    with pytest.raises(
        ValidationError, match=r"spreads\[0\].targets: percents must sum to at most 100, got 110"
    ):
        validate_job(over)


def test_memory_max__stored_and_at_least_memory() -> None:
    job = parse_jobspec(_hcl(task_body="resources {\n memory = 100\n memory_max = 300\n }"))
    resources = job.groups[0].tasks[0].resources
    assert resources is not None and resources.memory_max_mb == 300
    low = parse_jobspec(_hcl(task_body="resources {\n memory = 100\n memory_max = 50\n }"))
    with pytest.raises(ValidationError, match=r"memory_max_mb: must be >= memory_mb \(100\), got 50"):
        validate_job(low)


def test_cores__replace_cpu_and_both_are_refused() -> None:
    job = parse_jobspec(_hcl(task_body="resources { cores = 2 }"))
    resources = job.groups[0].tasks[0].resources
    assert resources is not None and (resources.cores, resources.cpu_mhz) == (2, 0)
    validate_job(job)
    errors = _errors(_hcl(task_body="resources {\n cpu = 500\n cores = 2\n }"))
    assert any("resources: set cpu or cores, not both" in e for e in errors)


def test_network_mode__host_accepted_bridge_and_hostname_refused_by_name() -> None:
    assert parse_jobspec(_hcl(group_body='network { mode = "host" }')).groups[0].network.mode == "host"  # type: ignore[union-attr]
    (error,) = _errors(_hcl(group_body='network { mode = "bridge" }'))
    assert 'network mode: "bridge" is not supported by drover' in error
    (error,) = _errors(_hcl(group_body='network { mode = "cni/mynet" }'))
    assert '"cni/mynet" is not supported by drover' in error
    (error,) = _errors(_hcl(group_body='network { hostname = "x" }'))
    assert 'network: "hostname" is not supported by drover (it needs mode = "bridge"' in error


def test_scaling__stored_min_defaults_to_count_and_count_kept_inside() -> None:
    job = parse_jobspec(_hcl(group_body='count = 2\n scaling {\n max = 5\n policy { cooldown = "1m" }\n }'))
    scaling = job.groups[0].scaling
    assert scaling is not None and (scaling.min, scaling.max, scaling.enabled) == (2, 5, True)
    assert json.loads(scaling.policy_json) == {"cooldown": "1m"}
    validate_job(job)
    too_many = replace(job, groups=(replace(job.groups[0], count=6),))
    with pytest.raises(
        ValidationError, match=r"groups\[0\].count: must be <= the scaling policy's max 5, got 6"
    ):
        validate_job(too_many)


def test_old_disconnect_names__aliases_and_refused_beside_the_block() -> None:
    job = parse_jobspec(
        _hcl(group_body='max_client_disconnect = "1h"\n stop_after_client_disconnect = "90s"')
    )
    assert job.groups[0].disconnect == DisconnectStrategy(
        lost_after_ns=3600 * 10**9, stop_on_client_after_ns=90 * 10**9
    )
    (error,) = _errors(_hcl(group_body='max_client_disconnect = "1h"\n disconnect { lost_after = "1h" }'))
    assert '"max_client_disconnect" is the old name of a disconnect key: set one, not both' in error


@pytest.mark.parametrize(
    ("where", "key", "snippet"),
    [
        ("job", "vault", 'vault { policies = ["x"] }'),
        ("job", "multiregion", "multiregion { }"),
        ("group", "volume", 'volume "v" { type = "csi" }'),
        ("group", "consul", "consul { }"),
        ("task", "vault", "vault { }"),
        ("task", "identity", "identity { env = true }"),
        ("task", "csi_plugin", 'csi_plugin { id = "x" }'),
        ("task", "volume_mount", 'volume_mount { volume = "v" }'),
    ],
)
def test_not_supported__one_line_naming_the_key_and_why(where: str, key: str, snippet: str) -> None:
    text = _hcl(**{f"{where}_body": snippet})
    (error,) = _errors(text)
    assert f'"{key}" is not supported by drover ({_NOT_SUPPORTED[where][key]})' in error
    assert "unknown key" not in error and "\n" not in error


def test_not_supported__consul_service_connect_device_and_drivers() -> None:
    errors = _errors(
        _hcl(
            group_body='service {\n provider = "consul"\n connect { }\n }',
            task_body='resources { device "nvidia/gpu" { } }',
        )
    )
    assert any('got "consul": "consul" is not supported by drover (no Consul here)' in e for e in errors)
    assert any('service: unknown key "connect"' in e for e in errors)
    assert any('"device" is not supported by drover (no device plugins here)' in e for e in errors)
    docker = _hcl().replace('driver = "raw_exec"', 'driver = "docker"')
    (error,) = _errors(docker)
    assert 'driver: "docker" is not supported by drover' in error
    (error,) = _errors(_hcl().replace('command = "/bin/true"', 'command = "/bin/true"\n image = "redis"'))
    assert 'config: "image" is not supported by drover' in error


def test_a_typo_is_still_unknown_with_a_suggestion() -> None:
    (error,) = _errors(_hcl('node_pol = "x"'))
    assert 'unknown key "node_pol" (did you mean "node_pool"?)' in error


def _api_job(**group: object) -> dict[str, object]:
    return {
        "Job": {
            "ID": "web",
            "Name": "web",
            "Region": "global",
            "Type": "service",
            "Datacenters": ["dc1"],
            "NodePool": "default",
            "Status": "running",
            "CreateIndex": 10,
            "Vault": None,
            "TaskGroups": [
                {
                    "Name": "api",
                    "Count": 2,
                    "Networks": [
                        {"Mode": "host", "DynamicPorts": [{"Label": "http", "HostNetwork": "default"}]}
                    ],
                    "Tasks": [
                        {
                            "Name": "t",
                            "Driver": "raw_exec",
                            "Config": {"command": "/bin/sleep", "args": ["60"]},
                            "Resources": {"CPU": 100, "MemoryMB": 64, "MemoryMaxMB": 128, "Cores": 0},
                            "KillTimeout": 5_000_000_000,
                            "LogConfig": {"MaxFiles": 10, "MaxFileSizeMB": 10},
                        }
                    ],
                    **group,
                }
            ],
        }
    }


def test_nomad_api_json__converted_with_durations_in_nanoseconds() -> None:
    job = parse_jobspec(
        json.dumps(_api_job(Scaling={"Min": 1, "Max": 4, "Enabled": True, "Type": "horizontal"}))
    )
    group = job.groups[0]
    assert (job.id, job.node_pool, group.count) == ("web", "default", 2)
    assert group.scaling is not None and (group.scaling.min, group.scaling.max) == (1, 4)
    task = group.tasks[0]
    assert task.kill_timeout_ns == 5 * 10**9
    assert task.resources is not None and task.resources.memory_max_mb == 128
    assert group.network is not None and [p.label for p in group.network.dynamic_ports] == ["http"]
    validate_job(job)


def test_nomad_api_json__unknown_and_unsupported_fields_refused_by_name() -> None:
    errors = _errors(json.dumps(_api_job(Frobnicate=3, Volumes={"v": {"Type": "csi"}})))
    assert any('job "web" group "api": unknown key "Frobnicate" (Nomad API JSON)' in e for e in errors)
    assert any('"volume" is not supported by drover (no host or CSI volumes here)' in e for e in errors)
