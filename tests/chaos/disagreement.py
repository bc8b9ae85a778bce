"""Plan disagreements, injected from the test side: a node whose real resources shrink
behind the scheduler's back.

The scheduler plans on the replicated state, where the node still has the resources it
registered. The plan applier of a server started through the test-only agent module
(``python -m tests.chaos.fault_agent``) checks a "shrunk" node against almost nothing
(1 MHz, 1 MB, 1 MB of disk), as if the machine had lost capacity the state does not know
about. So the scheduler keeps placing there, the applier keeps refusing ("does not fit"),
and the rejection tracker must end the loop by marking the node ineligible
(docs/design.md#invariant-6). Everything else is the product's own code, unchanged: the
in-place rule (updates of allocs already on the node still pass), the fit check, the
tracker, the raft entry that marks the node. Product code reads no switch: the control
file's path reaches only this module, through the test agent's environment.

Control: ``DisagreementControl`` (the test's side) writes ``{"shrunk": [node IDs]}`` to a
JSON file (path in ``DROVER_CHAOS_DISAGREE_FILE``); every server's hook polls its
modification time every ``POLL_S``, so whichever server leads sees the same nodes shrunk.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Final

from tests.chaos.control_file import WatchedFile, write_control

ENV: Final = "DROVER_CHAOS_DISAGREE_FILE"

# What a shrunk node "really" has left: less than any alloc asks for.
SHRUNK_CPU_MHZ: Final = 1
SHRUNK_MEMORY_MB: Final = 1
SHRUNK_DISK_MB: Final = 1


class DisagreementControl:
    """The test's side: which nodes the servers' appliers see shrunk."""

    def __init__(self, path: Path, shrunk: Iterable[str] = ()) -> None:
        self.path = path
        self._write(sorted(shrunk))

    def shrink(self, node_id: str) -> None:
        self._write([node_id])

    def restore(self) -> None:
        self._write([])

    def _write(self, nodes: list[str]) -> None:
        write_control(self.path, {"shrunk": nodes})


def _shrunk_nodes(data: dict[str, Any]) -> frozenset[str]:
    return frozenset(str(n) for n in data.get("shrunk", []))


def watch_shrunk(path: str) -> WatchedFile[frozenset[str]]:
    """The server's side: the current set of shrunk node IDs, kept fresh."""
    return WatchedFile(path, _shrunk_nodes, frozenset(), "chaos-disagreement-poll")


def shrink_in_view(snap: Any, node_ids: Iterable[str]) -> Any:
    """``snap`` (a state Snapshot) with each of ``node_ids`` that exists shrunk to almost
    no capacity; the same object when none of them is in it."""
    from drover.scheduler.structs import NodeResources
    from drover.server.state_store import Snapshot

    tables = snap.tables
    nodes = tables.nodes
    for node_id in node_ids:
        node = nodes.get(node_id)
        if node is None:
            continue
        resources = replace(
            node.resources or NodeResources(),
            cpu_mhz=SHRUNK_CPU_MHZ,
            memory_mb=SHRUNK_MEMORY_MB,
            disk_mb=SHRUNK_DISK_MB,
            reserved=None,
        )
        nodes = nodes.set(node_id, replace(node, resources=resources))
    if nodes is tables.nodes:
        return snap
    return Snapshot(replace(tables, nodes=nodes))


def install(path: str) -> WatchedFile[frozenset[str]]:
    """Wrap this process's ``evaluate_plan`` so the applier checks the control file's nodes
    shrunk (the applier thread looks the function up in its module on every plan). Returns
    the watcher of the control file (``close`` stops its thread)."""
    from drover.server import plan_apply  # the agent process's own applier: test-only wrap

    shrunk = watch_shrunk(path)
    original = plan_apply.evaluate_plan

    def evaluate_plan(plan: Any, snap: Any, *args: Any, **kwargs: Any) -> Any:
        touched = shrunk.value & set(plan.node_allocation)
        view = shrink_in_view(snap, sorted(touched)) if touched else snap
        return original(plan, view, *args, **kwargs)

    plan_apply.evaluate_plan = evaluate_plan
    return shrunk


@dataclass
class Disagreement:
    """One disagreement the nemesis provoked, for the checker: when (run seconds and wall
    clock, to match the servers' log lines), and how it ended."""

    node_id: str
    t_start: float
    wall_start: float
    t_marked: float | None = None  # the servers showed the node ineligible
    t_restored: float | None = None  # the applier agreed again
    t_eligible: float | None = None  # the nemesis made it eligible again
    wall_end: float = 0.0
    problems: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        def rel(t: float | None) -> float | None:
            return None if t is None else round(t - self.t_start, 3)

        return {
            "node": self.node_id,
            "t_start": round(self.t_start, 3),
            "marked_ineligible_after_s": rel(self.t_marked),
            "restored_after_s": rel(self.t_restored),
            "eligible_again_after_s": rel(self.t_eligible),
            "problems": self.problems,
        }
