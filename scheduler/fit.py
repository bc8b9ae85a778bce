"""Does a set of allocs fit on a node? One answer for the scheduler and the plan applier.

Both sides call ``allocs_fit`` so that, on the same state, they cannot disagree: a
disagreement is what turned Nomad's "plan for node rejected" into a loop
(docs/field-reports.md#field-report-1). What
counts: CPU, memory and disk against the node's capacity minus its reservation, the node's
``max_allocs``, and ports: node-reserved ports and every alloc's static and dynamic ports are
exclusive on the node.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from drover.scheduler.structs import Allocation, Node, NodeResources, Resources

__all__ = ["FitResult", "allocs_fit", "cpu_per_core_mhz", "node_capacity", "proposed_allocs"]


@dataclass(frozen=True, slots=True)
class FitResult:
    fits: bool
    # Which dimension failed: "cpu", "memory", "disk", "max allocs", "port 8080", "node".
    reason: str = ""


def cpu_per_core_mhz(node: Node) -> int:
    """The CPU one of the node's cores gives (its total over ``cpu.numcores``, Nomad's
    SharesPerCore): what a task's ``resources { cores = N }`` reserves N times. 0 when
    the node does not say how many cores it has (the feasibility check keeps such a task
    off it anyway)."""
    numcores = node.attributes.get("cpu.numcores", "")
    if not numcores.isdigit() or int(numcores) == 0:
        return 0
    return (node.resources or NodeResources()).cpu_mhz // int(numcores)


def node_capacity(node: Node) -> tuple[int, int, int]:
    res = node.resources or NodeResources()
    reserved = res.reserved or Resources(cpu_mhz=0, memory_mb=0, disk_mb=0)
    return (
        res.cpu_mhz - reserved.cpu_mhz,
        res.memory_mb - reserved.memory_mb,
        res.disk_mb - reserved.disk_mb,
    )


def allocs_fit(node: Node, allocs: Iterable[Allocation]) -> FitResult:
    """Whether the live allocs in ``allocs`` (the node's whole proposed set) fit on ``node``."""
    cpu_cap, mem_cap, disk_cap = node_capacity(node)
    res = node.resources or NodeResources()
    reserved_ports = set(res.reserved_ports)
    cpu = mem = disk = count = 0
    seen_ports: set[int] = set()
    for alloc in allocs:
        if alloc.terminal():
            continue
        count += 1
        r = alloc.resources
        if r is None:
            continue
        cpu += r.cpu_mhz
        mem += r.memory_mb
        disk += r.disk_mb
        for port in r.ports:
            if port.value in reserved_ports or port.value in seen_ports:
                return FitResult(False, f"port {port.value}")
            seen_ports.add(port.value)
    if cpu > cpu_cap:
        return FitResult(False, "cpu")
    if mem > mem_cap:
        return FitResult(False, "memory")
    if disk > disk_cap:
        return FitResult(False, "disk")
    if res.max_allocs and count > res.max_allocs:
        return FitResult(False, "max allocs")
    return FitResult(True)


def proposed_allocs(
    existing: Iterable[Allocation], stopped_ids: Iterable[str], placed: Iterable[Allocation]
) -> list[Allocation]:
    """The node's allocs after a plan: existing minus stopped, with placed ones replacing by ID."""
    placed_list = list(placed)
    drop = set(stopped_ids) | {a.id for a in placed_list}
    return [a for a in existing if a.id not in drop] + placed_list
