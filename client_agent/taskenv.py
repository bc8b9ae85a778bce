"""The environment a task starts with: who it is, where it runs, and its job's meta.

Every variable is set twice, as ``DROVER_*`` and as Nomad's ``NOMAD_*`` name, so a task
written for Nomad (a script that reads ``NOMAD_ALLOC_INDEX`` or ``NOMAD_META_*``) runs
unchanged. Meta is laid job, then group, then task, the most specific winning, as Nomad
does; the task's own ``env`` block is laid over all of it by the driver's caller, so a job
can still override any of these names on purpose.

The directories (``*_ALLOC_DIR``, ``*_TASK_DIR``) are the driver's to add: only it knows
where it puts the task.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from drover.v1 import structs_pb2

__all__ = ["PREFIXES", "dir_env", "task_env"]

PREFIXES = ("DROVER_", "NOMAD_")

# Meta keys become variable names: anything outside [A-Za-z0-9_] is an underscore, as Nomad
# turns a key like "rack-id" into NOMAD_META_rack_id.
_NOT_IN_NAME = re.compile(r"[^A-Za-z0-9_]")


def _both(values: Mapping[str, str]) -> dict[str, str]:
    return {prefix + name: value for prefix in PREFIXES for name, value in values.items()}


def task_env(
    alloc: structs_pb2.Allocation,
    job: structs_pb2.Job,
    group: structs_pb2.TaskGroup,
    task: structs_pb2.Task,
) -> dict[str, str]:
    """The variables ``task`` of ``alloc`` starts with, its own ``env`` block included."""
    names = {
        "ALLOC_ID": alloc.id,
        "ALLOC_NAME": alloc.name,
        "ALLOC_INDEX": str(alloc.index),
        "TASK_NAME": task.name,
        "GROUP_NAME": group.name,
        "JOB_ID": job.id,
        "JOB_NAME": job.name or job.id,
        "NAMESPACE": job.namespace or alloc.namespace,
        "NODE_ID": alloc.node_id,
        "NODE_NAME": alloc.node_name,
    }
    meta: dict[str, str] = {}
    for layer in (job.meta, group.meta, task.meta):
        meta.update(layer)
    names.update({"META_" + _NOT_IN_NAME.sub("_", key): value for key, value in meta.items()})
    return {**_both(names), **task.env}


def dir_env(alloc_dir: str, task_dir: str) -> dict[str, str]:
    """The directory variables, for the driver that made the directories."""
    return _both({"ALLOC_DIR": alloc_dir, "TASK_DIR": task_dir})
