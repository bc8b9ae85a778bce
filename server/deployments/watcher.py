"""The leader's deployment watcher: fails, reverts and promotes active deployments.

Theory of operation
-------------------
One thread on the leader (started and stopped with leadership, server/leader.py). Each pass
reads one snapshot, asks ``decide.decide`` about every active deployment and writes what it
says through ``DeploymentActions`` (a failure with its auto-revert job in one raft entry, or
a promotion). Then it sleeps until a table it reads moves (a client's health report, a
placement, a new version) or until the earliest progress deadline, whichever comes first.

It keeps no state worth keeping: everything it knows is in the replicated state, so a new
leader's watcher carries every deployment on from its first pass, and a write lost with
leadership is simply decided again there. The one thing remembered is a refusal: a
deployment whose write the FSM refused is not tried again until it changes, so a refusal
never turns into a write per state change.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Final

import structlog

from drover.server.clock import Clock
from drover.server.deployments.actions import DeploymentActions
from drover.server.deployments.decide import WatchDecision, decide
from drover.server.errors import ConflictError, NotFoundError, RaftError, ValidationError
from drover.server.state_store import Snapshot, StateStore

__all__ = ["WATCHED_TABLES", "DeploymentWatcher"]

log = structlog.get_logger("drover.deployments")

# What a decision reads: the deployments, their allocs' health, the job and its history.
WATCHED_TABLES: Final = ("deployments", "allocs", "jobs", "job_versions")
# The longest sleep in one go, so a revoke (``stop``) is noticed promptly.
WAIT_SLICE_S: Final = 0.5
# After a change, this long for more to arrive before the next pass: a burst of client
# health reports costs one scan of the deployments' allocs, not one per report (Nomad
# batches its watcher's writes over 250 ms for the same reason).
BATCH_S: Final = 0.1


class DeploymentWatcher:
    def __init__(
        self,
        store: StateStore,
        actions: DeploymentActions,
        clock: Clock,
        still_leader: Callable[[], bool],
        stop: threading.Event,
    ) -> None:
        self._store = store
        self._actions = actions
        self._clock = clock
        self._still_leader = still_leader
        self._stop = stop
        # deployment ID -> its modify index when the FSM refused our write for it.
        self._refused: dict[str, int] = {}

    def run(self) -> None:
        """The thread's body: passes until ``stop`` is set."""
        while not self._stop.is_set():
            snap = self._store.snapshot()
            try:
                due = self.watch_once(snap, self._clock.now_ns())
            except Exception:
                log.exception("deployment.watch_failed", index=snap.index)
                due = 0
            if self._sleep(snap.table_index(*WATCHED_TABLES), due):
                self._stop.wait(BATCH_S)

    def _sleep(self, seen: int, due_ns: int) -> bool:
        """Until a watched table moves past ``seen`` (True) or ``due_ns`` comes (False)."""
        while not self._stop.is_set():
            timeout = WAIT_SLICE_S
            if due_ns:
                timeout = min(timeout, max(0.0, (due_ns - self._clock.now_ns()) / 1e9))
            snap = self._store.wait_for(WATCHED_TABLES, seen, timeout)
            if snap.table_index(*WATCHED_TABLES) > seen or self._store.closed:
                return True
            if due_ns and self._clock.now_ns() >= due_ns:
                return False
        return False

    def watch_once(self, snap: Snapshot, now_ns: int) -> int:
        """Decide about every active deployment of ``snap`` at ``now_ns`` and write the
        decisions; returns the earliest time to look again (0: only on a change)."""
        due = 0
        active = [d for d in snap.deployments() if d.active()]
        self._refused = {
            d.id: i for d in active if (i := self._refused.get(d.id)) is not None and i == d.modify_index
        }
        for deployment in sorted(active, key=lambda d: (d.create_index, d.id)):
            if deployment.id in self._refused:
                continue
            job = snap.job(deployment.namespace, deployment.job_id)
            decision = decide(
                deployment,
                job,
                snap.job_versions(deployment.namespace, deployment.job_id),
                snap.allocs_by_job(deployment.namespace, deployment.job_id),
                now_ns,
            )
            if decision.fail or decision.promote:
                if not self._still_leader():
                    return 0
                self._act(deployment.id, deployment.job_id, deployment.modify_index, decision)
            elif decision.next_check_ns:
                due = min(due or decision.next_check_ns, decision.next_check_ns)
        return due

    def _act(self, deployment_id: str, job_id: str, modify_index: int, decision: WatchDecision) -> None:
        fields = {"deployment_id": deployment_id, "job_id": job_id}
        try:
            if decision.fail:
                outcome = self._actions.fail(deployment_id, decision.fail)
                log.warning(
                    "deployment.failed",
                    **fields,
                    reason=decision.fail,
                    reverted_to=outcome.reverted_version,
                    eval_id=outcome.eval_id,
                    index=outcome.index,
                )
            else:
                outcome = self._actions.promote(deployment_id)
                log.info("deployment.auto_promoted", **fields, eval_id=outcome.eval_id, index=outcome.index)
        except (ConflictError, NotFoundError, ValidationError) as exc:
            # The state moved under the decision (the scheduler ended the deployment, a
            # canary went away): decided again once the deployment changes.
            self._refused[deployment_id] = modify_index
            log.info("deployment.write_refused", **fields, reason=str(exc))
        except RaftError as exc:
            # Leadership moved (or the commit timed out): the next leader decides again.
            log.warning("deployment.write_not_committed", **fields, reason=str(exc))
