"""A real fake for scheduler tests: the real state store, driven directly, plus a recorder.

``Harness`` builds state through ``Txn`` (the same code the FSM uses), runs a scheduler
against an O(1) snapshot, and can commit a result's plan the way the plan applier would
when everything fits, so multi-pass scenarios (place, then update, then scale down) read
like a cluster's history::

    h = Harness()
    nodes = [h.add_node(mock.node()) for _ in range(3)]
    job = h.add_job(mock.system_job())
    result = h.run(system_scheduler, mock.eval_for(job))
    h.commit(result)
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from drover.scheduler.interfaces import SchedulerContext, SchedulerResult
from drover.scheduler.structs import Allocation, Evaluation, Job, Node
from drover.server import deployments
from drover.server.state_store import Snapshot, StateStore, Tables, Txn

NOW = 1_700_000_000_000_000_000


@dataclass
class Harness:
    store: StateStore = field(default_factory=StateStore)
    now_ns: int = NOW
    results: list[SchedulerResult] = field(default_factory=list)
    _ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    _index: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

    def next_index(self) -> int:
        return next(self._index)

    def _write(self, fn: Callable[[Txn], None]) -> None:
        tables: Tables = self.store.snapshot().tables
        txn = Txn(tables, self.next_index())
        fn(txn)
        self.store.commit(txn.commit())

    def add_node(self, node: Node) -> Node:
        self._write(lambda txn: txn.put_node(node))
        return node

    def add_job(self, job: Job) -> Job:
        def write(txn: Txn) -> None:
            txn.put_job(job)
            txn.put_job_version(job)
            txn.ensure_summary(job)

        self._write(write)
        stored = self.snapshot().job(job.namespace, job.id)
        assert stored is not None
        return stored

    def add_alloc(self, alloc: Allocation) -> Allocation:
        self._write(lambda txn: txn.put_alloc(alloc))
        return alloc

    def update_alloc(self, alloc_id: str, **changes: object) -> Allocation:
        current = self.snapshot().alloc(alloc_id)
        assert current is not None, alloc_id
        updated = replace(current, **changes)  # type: ignore[arg-type]
        self._write(lambda txn: txn.put_alloc(updated))
        return updated

    def set_health(self, alloc_id: str, health: str) -> Allocation:
        """A client's health verdict, counted in the alloc's deployment as the FSM does."""
        out: list[Allocation] = []

        def write(txn: Txn) -> None:
            alloc = txn.alloc(alloc_id)
            assert alloc is not None, alloc_id
            updated = deployments.set_alloc_health(txn, alloc, health, self.now_ns, txn.index)
            txn.put_alloc(updated)
            out.append(updated)

        self._write(write)
        return out[0]

    def snapshot(self) -> Snapshot:
        return self.store.snapshot()

    def context(self, seed: int = 7) -> SchedulerContext:
        return SchedulerContext(
            now_ns=self.now_ns, new_id=lambda: f"id-{next(self._ids)}", seed=seed, rng=random.Random(seed)
        )

    def run(
        self,
        scheduler: Callable[[Evaluation, Snapshot, SchedulerContext], SchedulerResult],
        ev: Evaluation,
        seed: int = 7,
    ) -> SchedulerResult:
        result = scheduler(ev, self.snapshot(), self.context(seed))
        self.results.append(result)
        return result

    def commit(self, result: SchedulerResult) -> None:
        """Apply the result's plan as if every node fit (what a healthy applier does)."""
        plan = result.plan
        if plan is None:
            return

        def write(txn: Txn) -> None:
            # Deployments as the FSM commits them (server/deployments/state.py).
            if plan.deployment is not None:
                deployments.upsert_from_plan(txn, plan.deployment, txn.index, self.now_ns)
            for update in plan.deployment_updates:
                deployments.set_status(txn, update, txn.index, self.now_ns)
            for stops in plan.node_update.values():
                for stop in stops:
                    existing = txn.alloc(stop.alloc_id)
                    if existing is None:
                        continue
                    txn.put_alloc(
                        replace(
                            existing,
                            desired_status=stop.desired_status,
                            desired_description=stop.desired_description,
                            client_status=stop.client_status or existing.client_status,
                        )
                    )
            for allocs in plan.node_allocation.values():
                for alloc in allocs:
                    existing = txn.alloc(alloc.id)
                    if existing is not None:
                        alloc = replace(
                            alloc, client_status=existing.client_status, task_states=existing.task_states
                        )
                    deployments.count_alloc(txn, existing, alloc, self.now_ns)
                    txn.put_alloc(alloc)

        self._write(write)
