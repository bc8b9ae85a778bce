"""Which service registrations an alloc has, as a pure function of the alloc, its job
version and its node.

Why the FSM derives them instead of the client registering them: a registration exists
exactly while its alloc runs, so it is written in the same raft entry that records the alloc
running and removed in the entry that makes it stop, be lost, or be collected. A client that
dies, or an entry lost between a client's two calls, can then never leave a registration
behind or miss one (Nomad's client-side registrations need a reaper for exactly that). The
client's only part is to report its alloc running, which it does anyway.

The result depends on nothing but its arguments (no clock, no randomness): every server
applying the same entry derives the same registrations.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Final

from drover.scheduler.structs import (
    ADDRESS_MODE_ALLOC,
    ALLOC_CLIENT_RUNNING,
    ALLOC_DESIRED_RUN,
    CHECK_CRITICAL,
    CHECK_PASSING,
    CHECK_PENDING,
    CHECK_WARNING,
    Allocation,
    AllocCheckStatus,
    Job,
    Node,
    Service,
    ServiceRegistration,
)

__all__ = ["is_passing", "registration_id", "registrations_for", "service_address", "service_health"]

_LOOPBACK: Final = "127.0.0.1"
_PROVIDER_NOMAD: Final = "nomad"
_REFERENCE: Final = re.compile(r"\$\{([^{}]+)\}")
# A registration's health is its worst check's status, in this order (worst first).
_HEALTH_ORDER: Final = (CHECK_CRITICAL, CHECK_WARNING, CHECK_PENDING, CHECK_PASSING)


def _names(
    alloc: Allocation,
    job: Job,
    node: Node | None,
    group_meta: Mapping[str, str],
    task: str,
    task_meta: Mapping[str, str],
) -> dict[str, str]:
    """What a service's name and tags may refer to, as the client's task environment
    names it (client_agent/taskenv.py): only what the alloc, its job and its node fix, so
    every server resolves the same text."""
    values = {
        "NOMAD_JOB_ID": job.id,
        "NOMAD_JOB_NAME": job.name or job.id,
        "NOMAD_JOB_PARENT_ID": job.parent_id,
        "NOMAD_GROUP_NAME": alloc.task_group,
        "NOMAD_TASK_NAME": task,
        "NOMAD_NAMESPACE": alloc.namespace,
        "NOMAD_ALLOC_ID": alloc.id,
        "NOMAD_SHORT_ALLOC_ID": alloc.id[:8],
        "NOMAD_ALLOC_NAME": alloc.name,
        "NOMAD_ALLOC_INDEX": str(alloc.index),
        "NOMAD_REGION": "global",
    }
    for key, value in {**job.meta, **group_meta, **task_meta}.items():
        values[f"NOMAD_META_{key}"] = values[f"NOMAD_META_{key.upper()}"] = value
    if node is not None:
        values.update(
            {
                "NOMAD_DC": node.datacenter,
                "NOMAD_NODE_ID": node.id,
                "NOMAD_NODE_NAME": node.name,
                "node.unique.id": node.id,
                "node.unique.name": node.name,
                "node.datacenter": node.datacenter,
                "node.class": node.node_class,
            }
        )
        values.update({f"attr.{k}": v for k, v in node.attributes.items()})
        values.update({f"meta.{k}": v for k, v in node.meta.items()})
    return values


def _interpolate(text: str, values: Mapping[str, str]) -> str:
    """``${name}`` replaced where known; the rest left as written (as the client does)."""
    if "${" not in text:
        return text
    return _REFERENCE.sub(lambda m: values.get(m.group(1).strip(), m.group(0)), text)


def registration_id(alloc_id: str, owner: str, service: Service) -> str:
    """Nomad's ID shape (``_nomad-task-<alloc>-<group or task>-<service>-<port>``): one per
    service block of one alloc, the same on every server."""
    return f"_nomad-task-{alloc_id}-{owner}-{service.name}-{service.port}"


def node_ip(node: Node | None) -> str:
    """The address a task on ``node`` is reached at, as the client's NOMAD_IP_ gives it."""
    if node is None:
        return _LOOPBACK
    return node.attributes.get("unique.network.ip-address") or node.address.rsplit(":", 1)[0] or _LOOPBACK


def service_address(alloc: Allocation, node: Node | None, service: Service) -> tuple[str, int]:
    """(address, port) of ``service``: ``port`` is a port label of the alloc's network or a
    number; none (or a label the alloc lacks) gives port 0, the node's address alone."""
    ip = node_ip(node)
    if not service.port:
        return ip, 0
    if service.port.isdigit():
        return ip, int(service.port)
    for port in alloc.resources.ports if alloc.resources else ():
        if port.label == service.port:
            value = port.to if service.address_mode == ADDRESS_MODE_ALLOC and port.to > 0 else port.value
            return port.host_ip or ip, value
    return ip, 0


def service_health(
    alloc: Allocation, task: str, service: Service
) -> tuple[str, tuple[AllocCheckStatus, ...]]:
    """The health of ``service`` (as written, owned by ``task`` or the group) in ``alloc``,
    and the statuses of its checks, from what the alloc's client last reported.

    A check is named as the client names it (client_agent/checks.py, ``check_specs``): its
    ``name``, else ``check[i]``. A check with no result yet is "pending" (its instance is not
    yet known to answer, as Consul starts a check critical); a service with no checks is
    "passing". A registration's health is its worst check's.
    """
    if not service.checks:
        return CHECK_PASSING, ()
    reported = {s.check: s for s in alloc.check_statuses if s.task == task and s.service == service.name}
    statuses = tuple(
        reported.get(check.name or f"check[{i}]")
        or AllocCheckStatus(
            task=task, service=service.name, check=check.name or f"check[{i}]", status=CHECK_PENDING
        )
        for i, check in enumerate(service.checks)
    )
    worst = min(
        (_HEALTH_ORDER.index(s.status) if s.status in _HEALTH_ORDER else 0 for s in statuses),
        default=len(_HEALTH_ORDER) - 1,
    )
    return _HEALTH_ORDER[worst], statuses


def is_passing(registration: ServiceRegistration) -> bool:
    """Whether the instance should be handed out (nomadService, ``service info`` by default):
    every check passes. "" is a registration written before health was recorded."""
    return registration.health in (CHECK_PASSING, "")


def _service_blocks(
    job: Job, group_name: str
) -> Iterable[tuple[str, Service, Mapping[str, str], Mapping[str, str]]]:
    """(task name or "", service, group meta, task meta) of each service of the group."""
    for group in job.groups:
        if group.name != group_name:
            continue
        for service in group.services:
            yield "", service, group.meta, {}
        for task in group.tasks:
            for service in task.services:
                yield task.name, service, group.meta, task.meta


def registrations_for(
    alloc: Allocation, job: Job | None, node: Node | None, index: int
) -> tuple[ServiceRegistration, ...]:
    """The registrations ``alloc`` has at raft ``index`` (create and modify index ``index``;
    the caller keeps an unchanged registration's own): none unless the client runs it and
    the servers still want it run."""
    if (
        job is None
        or alloc.client_status != ALLOC_CLIENT_RUNNING
        or alloc.desired_status != ALLOC_DESIRED_RUN
    ):
        return ()
    found: list[ServiceRegistration] = []
    for task, written, group_meta, task_meta in _service_blocks(job, alloc.task_group):
        if written.provider != _PROVIDER_NOMAD or not written.name:
            continue
        values = _names(alloc, job, node, group_meta, task, task_meta)
        service = replace(
            written,
            name=_interpolate(written.name, values),
            tags=tuple(_interpolate(tag, values) for tag in written.tags),
        )
        address, port = service_address(alloc, node, service)
        health, checks = service_health(alloc, task, written)
        found.append(
            ServiceRegistration(
                id=registration_id(alloc.id, task or alloc.task_group, service),
                service_name=service.name,
                namespace=alloc.namespace,
                node_id=alloc.node_id,
                datacenter=node.datacenter if node is not None else "",
                job_id=alloc.job_id,
                alloc_id=alloc.id,
                task=task,
                tags=service.tags,
                address=address,
                port=port,
                create_index=index,
                modify_index=index,
                health=health,
                checks=checks,
            )
        )
    return tuple(found)
