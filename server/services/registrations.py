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

from collections.abc import Iterable
from typing import Final

from drover.scheduler.structs import (
    ADDRESS_MODE_ALLOC,
    ALLOC_CLIENT_RUNNING,
    ALLOC_DESIRED_RUN,
    Allocation,
    Job,
    Node,
    Service,
    ServiceRegistration,
)

__all__ = ["registration_id", "registrations_for", "service_address"]

_LOOPBACK: Final = "127.0.0.1"
_PROVIDER_NOMAD: Final = "nomad"


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


def _service_blocks(job: Job, group_name: str) -> Iterable[tuple[str, Service]]:
    for group in job.groups:
        if group.name != group_name:
            continue
        for service in group.services:
            yield "", service
        for task in group.tasks:
            for service in task.services:
                yield task.name, service


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
    for task, service in _service_blocks(job, alloc.task_group):
        if service.provider != _PROVIDER_NOMAD or not service.name:
            continue
        address, port = service_address(alloc, node, service)
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
            )
        )
    return tuple(found)
