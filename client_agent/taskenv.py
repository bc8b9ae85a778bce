"""The environment a task starts with: who it is, where it runs, its ports and its meta.

Every variable is set twice, as ``DROVER_*`` and as Nomad's ``NOMAD_*`` name, so a task
written for Nomad (a script that reads ``NOMAD_ALLOC_INDEX``, ``NOMAD_PORT_http`` or
``NOMAD_META_*``) runs unchanged. The set is Nomad's runtime environment: alloc, job,
group and task identity, region and datacenter, the directories, the resource limits, and
for each allocated port ``*_PORT_``, ``*_IP_``, ``*_ADDR_``, ``*_HOST_PORT_``,
``*_HOST_IP_``, ``*_HOST_ADDR_``, ``*_ALLOC_PORT_``, ``*_ALLOC_IP_`` and ``*_ALLOC_ADDR_``
with the port's label. ``*_PORT_`` is the port the task is asked to bind: the port's
``to`` when it has one, as Nomad gives a group network port, else the host port.

Meta is laid job, then group, then task, the most specific winning, as Nomad does, and each
key is given both as written and upper-cased (``NOMAD_META_owner`` and
``NOMAD_META_OWNER``). The task's own ``env`` block is laid over all of it, so a job can
still override any of these names on purpose.

``runtime_values`` is the other half of what a task sees: the ``${node.*}``, ``${attr.*}``
and ``${meta.*}`` names its config and env may interpolate (client_agent/interpolate.py).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Final

from drover.client.interpolate import interpolate_env
from drover.v1 import structs_pb2

__all__ = ["PREFIXES", "dir_env", "node_values", "task_env"]

PREFIXES = ("DROVER_", "NOMAD_")

# drover has one region; Nomad's default name for it.
REGION: Final = "global"
# What the scheduler assumes of a task with no resources block (scheduler/structs.py).
_DEFAULT_CPU_MHZ: Final = 100
_DEFAULT_MEMORY_MB: Final = 300
_LOOPBACK: Final = "127.0.0.1"

# Meta keys become variable names: anything outside [A-Za-z0-9_] is an underscore, as Nomad
# turns a key like "rack-id" into NOMAD_META_rack_id.
_NOT_IN_NAME = re.compile(r"[^A-Za-z0-9_]")


def _both(values: Mapping[str, str]) -> dict[str, str]:
    return {prefix + name: value for prefix in PREFIXES for name, value in values.items()}


def _address(ip: str, port: int) -> str:
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"


def _port_names(alloc: structs_pb2.Allocation, node_ip: str) -> dict[str, str]:
    names: dict[str, str] = {}
    for port in alloc.resources.ports:
        label = _NOT_IN_NAME.sub("_", port.label)
        ip = port.host_ip or node_ip
        bind = port.to if port.to > 0 else port.value
        names.update(
            {
                f"PORT_{label}": str(bind),
                f"IP_{label}": ip,
                f"ADDR_{label}": _address(ip, bind),
                f"HOST_PORT_{label}": str(port.value),
                f"HOST_IP_{label}": ip,
                f"HOST_ADDR_{label}": _address(ip, port.value),
                f"ALLOC_PORT_{label}": str(bind),
                f"ALLOC_IP_{label}": ip,
                f"ALLOC_ADDR_{label}": _address(ip, bind),
            }
        )
    return names


def _node_ip(node: structs_pb2.Node | None) -> str:
    if node is None:
        return _LOOPBACK
    return node.attributes.get("unique.network.ip-address") or node.address.rsplit(":", 1)[0] or _LOOPBACK


def task_env(
    alloc: structs_pb2.Allocation,
    job: structs_pb2.Job,
    group: structs_pb2.TaskGroup,
    task: structs_pb2.Task,
    *,
    node: structs_pb2.Node | None = None,
    task_dir: Path | None = None,
) -> dict[str, str]:
    """The variables ``task`` of ``alloc`` starts with on ``node``, its own ``env`` block
    included, with its values interpolated (client_agent/interpolate.py)."""
    resources = task.resources if task.HasField("resources") else None
    names = {
        "ALLOC_ID": alloc.id,
        "SHORT_ALLOC_ID": alloc.id[:8],
        "ALLOC_NAME": alloc.name,
        "ALLOC_INDEX": str(alloc.index),
        "TASK_NAME": task.name,
        "GROUP_NAME": group.name,
        "JOB_ID": job.id,
        "JOB_NAME": job.name or job.id,
        "JOB_PARENT_ID": job.parent_id,
        "NAMESPACE": job.namespace or alloc.namespace,
        "REGION": REGION,
        "DC": node.datacenter if node is not None else "",
        "NODE_ID": alloc.node_id,
        "NODE_NAME": alloc.node_name,
        "CPU_LIMIT": str(resources.cpu_mhz if resources else _DEFAULT_CPU_MHZ),
        "MEMORY_LIMIT": str(resources.memory_mb if resources else _DEFAULT_MEMORY_MB),
        **_port_names(alloc, _node_ip(node)),
    }
    # Set only when the task asks, as Nomad does: a task's hard limit and its whole cores.
    if resources is not None and resources.memory_max_mb:
        names["MEMORY_MAX_LIMIT"] = str(resources.memory_max_mb)
    if resources is not None and resources.cores:
        names["CPU_CORES"] = str(resources.cores)
    meta: dict[str, str] = {}
    for layer in (job.meta, group.meta, task.meta):
        meta.update(layer)
    for key, value in meta.items():
        name = _NOT_IN_NAME.sub("_", key)
        names["META_" + name] = value
        names["META_" + name.upper()] = value
    dirs = dir_env(str(task_dir.parent), str(task_dir)) if task_dir is not None else {}
    return interpolate_env({**_both(names), **dirs}, task.env, node_values(node))


def dir_env(alloc_dir: str, task_dir: str) -> dict[str, str]:
    """The directory variables, for the driver that made the directories."""
    return _both(
        {"ALLOC_DIR": alloc_dir, "TASK_DIR": task_dir, "SECRETS_DIR": str(Path(task_dir) / "secrets")}
    )


def node_values(node: structs_pb2.Node | None) -> dict[str, str]:
    """The node's names a task may interpolate: ``node.*``, ``attr.*`` and ``meta.*``."""
    if node is None:
        return {}
    values = {
        "node.unique.id": node.id,
        "node.unique.name": node.name,
        "node.datacenter": node.datacenter,
        "node.class": node.node_class,
        "node.region": REGION,
    }
    values.update({f"attr.{k}": v for k, v in node.attributes.items()})
    values.update({f"meta.{k}": v for k, v in node.meta.items()})
    return values
