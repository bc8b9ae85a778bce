"""The operator writes of ``drover alloc stop`` and ``drover operator scheduler set-config``.

Each checks its input completely, decides IDs and times here on the leader, and proposes
one entry (docs/design.md, "FSM determinism"). What must hold against a racing writer is
decided by the FSM, not here: the scheduler config's check-and-set compares indexes in
``apply_scheduler_config``, because two leaders-side checks of the same index both pass.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Final

from drover.scheduler.structs import (
    SCHEDULER_ALGORITHM_BINPACK,
    SCHEDULER_ALGORITHM_SPREAD,
    TRIGGER_ALLOC_STOP,
    Allocation,
    DesiredTransition,
    SchedulerConfig,
    job_eval,
)
from drover.server.clock import Clock, IdSource
from drover.server.codec import to_proto
from drover.server.endpoints import Proposer, propose_write
from drover.server.errors import ConflictError, NotFoundError, ValidationError
from drover.server.state_store import StateStore
from drover.v1 import raft_pb2

__all__ = [
    "SCHEDULER_ALGORITHMS",
    "AllocStopped",
    "check_scheduler_config",
    "set_scheduler_config",
    "stop_alloc",
]

ET = raft_pb2.EntryType

SCHEDULER_ALGORITHMS: Final = (SCHEDULER_ALGORITHM_BINPACK, SCHEDULER_ALGORITHM_SPREAD)


@dataclass(frozen=True, slots=True)
class AllocStopped:
    index: int
    eval_id: str


def stop_alloc(
    raft: Proposer, store: StateStore, clock: Clock, ids: IdSource, alloc: Allocation
) -> AllocStopped:
    """Mark ``alloc`` to migrate and evaluate its job, in one entry (Nomad's Alloc.Stop):
    the scheduler stops it and places its replacement, keeping the group's count."""
    if alloc.terminal():
        raise ConflictError(
            f"alloc {alloc.id!r} is already stopped ({alloc.desired_status}/{alloc.client_status})"
        )
    job = store.snapshot().job(alloc.namespace, alloc.job_id)
    if job is None:
        raise NotFoundError(f"job {alloc.job_id!r} of alloc {alloc.id!r} not found")
    ev = job_eval(ids.new(), job, TRIGGER_ALLOC_STOP, clock.now_ns())
    entry = raft_pb2.AllocDesiredTransitionEntry()
    to_proto(DesiredTransition(migrate=True), entry.allocs[alloc.id])
    to_proto(ev, entry.evals.add())
    result = propose_write(raft, ET.ENTRY_TYPE_ALLOC_DESIRED_TRANSITION, entry)
    return AllocStopped(index=result.index, eval_id=ev.id)


def check_scheduler_config(config: SchedulerConfig) -> SchedulerConfig:
    """``config`` as it will be stored, or ValidationError naming the field at fault
    (an empty algorithm means the default, binpack, as in Nomad)."""
    algorithm = config.scheduler_algorithm or SCHEDULER_ALGORITHM_BINPACK
    if algorithm not in SCHEDULER_ALGORITHMS:
        raise ValidationError(
            f"config.scheduler_algorithm: {config.scheduler_algorithm!r} is not one of {', '.join(SCHEDULER_ALGORITHMS)}"
        )
    tracker = config.rejection_tracker
    if tracker is not None and (tracker.threshold < 0 or tracker.window_ns < 0):
        raise ValidationError("config.rejection_tracker: threshold and window must not be negative")
    # The indexes are the FSM's to set, never the caller's.
    return replace(config, scheduler_algorithm=algorithm, create_index=0, modify_index=0)


def set_scheduler_config(raft: Proposer, config: SchedulerConfig, *, cas_index: int | None) -> int:
    """Replace the scheduler config; with ``cas_index``, only if the stored one's
    modify_index still equals it (ConflictError otherwise, decided by the FSM)."""
    entry = raft_pb2.SchedulerConfigEntry(use_cas=cas_index is not None, cas_index=cas_index or 0)
    to_proto(check_scheduler_config(config), entry.config)
    return propose_write(raft, ET.ENTRY_TYPE_SCHEDULER_CONFIG, entry).index
