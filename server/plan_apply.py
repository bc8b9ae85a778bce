"""The plan queue and the plan applier: one thread commits every plan, node by node.

Theory of operation
-------------------
Workers plan on snapshots that may be stale; the applier is the single serialization
point. For each plan (highest priority first) it:

1. drops the plan if the eval's broker token is no longer outstanding (a redelivered eval's
   old worker must not commit);
2. evaluates every node of the plan against the newest state **plus the plan still
   committing in raft** (optimistic pipelining: plan N+1 is evaluated while N commits,
   against the state N will produce, computed with the FSM's own apply function);
3. per node: the node must exist, and be ready and eligible for placements (stops always
   fit); then ``drover.scheduler.fit.allocs_fit`` over the node's proposed allocs, the same check
   the schedulers make. A rejected node is left out (partial commit) and the worker gets a
   refresh index to re-plan from; an all-at-once plan commits nothing on any rejection;
4. counts rejections per node (``RejectionTracker``, on by default): a node rejected more
   than ``threshold`` times within ``window`` is marked ineligible **in the same raft
   entry**, with a node event, a WARN log and a metric, so a persistent disagreement ends
   instead of looping (docs/field-reports.md#field-report-1, docs/design.md#invariant-6).

At most one plan is in raft at a time: N+1 is evaluated while N commits, and proposed after.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import heapq
import itertools
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, replace
from typing import Final, TypeVar

import structlog
from prometheus_client import Counter, Histogram

from drover.scheduler.fit import allocs_fit, proposed_allocs
from drover.scheduler.structs import (
    ALLOC_CLIENT_UNKNOWN,
    NODE_STATUS_DISCONNECTED,
    NODE_STATUS_READY,
    Allocation,
    AllocStop,
    NodeEvent,
    Plan,
    PlanResult,
    RejectionTrackerConfig,
)
from drover.server.codec import to_proto
from drover.server.fsm import ApplyResult, apply_plan_results, encode_entry
from drover.server.state_store import Snapshot, StateStore, Tables, Txn
from drover.v1 import raft_pb2, structs_pb2

log = structlog.get_logger("drover.plan")

T = TypeVar("T")

PLAN_NODE_REJECTED = Counter("drover_plan_node_rejected_total", "Nodes rejected by the plan applier")
PLAN_NODE_INELIGIBLE = Counter(
    "drover_plan_node_marked_ineligible_total", "Nodes marked ineligible by the plan rejection tracker"
)
PLAN_APPLY_SECONDS = Histogram(
    "drover_plan_apply_seconds",
    "Time from dequeue to the plan's raft proposal (evaluation, waiting for the plan before it)",
    buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0),
)
PLAN_COMMIT_SECONDS = Histogram(
    "drover_plan_commit_seconds",
    "Time from dequeue until the plan's result is committed and applied on the leader",
    buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0),
)


class PlanRejectedError(Exception):
    """The plan can not be applied at all (stale token, leadership lost)."""


@dataclass(frozen=True, slots=True)
class PendingPlan:
    plan: Plan
    future: Future[PlanResult]


class PlanQueue:
    """Plans waiting for the applier, highest priority first, then FIFO."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._heap: list[tuple[int, int, PendingPlan]] = []
        self._seq = itertools.count()
        self._enabled = False

    def set_enabled(self, enabled: bool) -> None:
        with self._cond:
            self._enabled = enabled
            if not enabled:
                for _, _, pending in self._heap:
                    pending.future.set_exception(PlanRejectedError("plan queue disabled: leadership lost"))
                self._heap.clear()
            self._cond.notify_all()

    def enqueue(self, plan: Plan) -> Future[PlanResult]:
        future: Future[PlanResult] = Future()
        with self._cond:
            if not self._enabled:
                future.set_exception(PlanRejectedError("plan queue disabled: not the leader"))
                return future
            heapq.heappush(self._heap, (-plan.priority, next(self._seq), PendingPlan(plan, future)))
            self._cond.notify()
        return future

    def depth(self) -> int:
        """Plans waiting for the applier (the plan queue depth metric)."""
        with self._cond:
            return len(self._heap)

    def dequeue(self, timeout: float) -> PendingPlan | None:
        with self._cond:
            if not self._heap:
                self._cond.wait(timeout)
            if not self._heap or not self._enabled:
                return None
            return heapq.heappop(self._heap)[2]


class RejectionTracker:
    """Counts plan rejections per node within a sliding window."""

    def __init__(self, config: RejectionTrackerConfig) -> None:
        self.config = config
        self._history: dict[str, deque[int]] = {}

    def record(self, node_id: str, now_ns: int) -> bool:
        """Record one rejection; True when the node crossed the threshold (then forgotten)."""
        if not self.config.enabled:
            return False
        history = self._history.setdefault(node_id, deque())
        history.append(now_ns)
        while history and history[0] <= now_ns - self.config.window_ns:
            history.popleft()
        if len(history) > self.config.threshold:
            del self._history[node_id]
            return True
        return False


@dataclass(frozen=True, slots=True)
class Evaluated:
    """A plan checked against the state: what commits, and the raft entries that commit it.

    ``head`` is the entry minus its allocs (eval, time, deployment, nodes marked
    ineligible; None: nothing to commit); the allocs stay the records of ``result`` until
    ``entries`` turns them into messages, one raft entry at a time. A message of an alloc
    takes ~2.7 KiB of protobuf arena outside the Python heap (four times its encoding):
    built all at once and then split, a 20,000-alloc plan held two such copies, ~115 MiB
    that the C allocator kept as the leader's RSS long after they were freed.
    """

    result: PlanResult
    head: raft_pb2.ApplyPlanResultsEntry | None

    @property
    def entry(self) -> raft_pb2.ApplyPlanResultsEntry | None:
        """The whole plan as one entry, for a reader that wants every alloc of it at once
        (a test, a tool); the applier commits ``entries`` instead."""
        if self.head is None:
            return None
        entry = raft_pb2.ApplyPlanResultsEntry()
        entry.CopyFrom(self.head)
        _add_records(entry, _accepted(self.result.node_update), _accepted(self.result.node_allocation))
        return entry

    def entries(self) -> Iterator[raft_pb2.ApplyPlanResultsEntry]:
        """The plan's raft entries (``plan_entries``), built one entry at a time from the
        result's records, so at most one entry's messages exist at once (as long as the
        caller drops each in turn)."""
        if self.head is None:
            return
        yield from plan_entries(
            self.head,
            _accepted(self.result.node_update),
            _accepted(self.result.node_allocation),
            _add_records,
        )


def _accepted(by_node: Mapping[str, tuple[T, ...]]) -> list[T]:
    """The records of a result's per-node map, in the entry's order (nodes sorted, as
    ``evaluate_plan`` accepts them)."""
    return [record for records in by_node.values() for record in records]


def _add_records(
    entry: raft_pb2.ApplyPlanResultsEntry, stops: Sequence[AllocStop], allocs: Sequence[Allocation]
) -> None:
    for stop in stops:
        to_proto(stop, entry.allocs_stopped.add())
    for alloc in allocs:
        to_proto(alloc, entry.allocs_upserted.add())


def evaluate_plan(
    plan: Plan,
    snap: Snapshot,
    tracker: RejectionTracker,
    now_ns: int,
) -> Evaluated:
    """Check every node of ``plan`` against ``snap``; build the entry for what fits."""
    accepted_alloc: dict[str, tuple[Allocation, ...]] = {}
    accepted_stop: dict[str, tuple[AllocStop, ...]] = {}
    rejected: list[str] = []
    reasons: dict[str, str] = {}
    for node_id in sorted(set(plan.node_allocation) | set(plan.node_update)):
        placed = plan.node_allocation.get(node_id, ())
        stops = plan.node_update.get(node_id, ())
        reason = _node_rejection(snap, node_id, placed, stops)
        if reason:
            rejected.append(node_id)
            reasons[node_id] = reason
            continue
        if placed:
            accepted_alloc[node_id] = placed
        if stops:
            accepted_stop[node_id] = stops
    if rejected and plan.all_at_once:
        accepted_alloc, accepted_stop = {}, {}
    newly_ineligible: list[str] = []
    for node_id in rejected:
        PLAN_NODE_REJECTED.inc()
        log.info(
            "plan.node_rejected",
            eval_id=plan.eval_id,
            job_id=plan.job_id,
            node_id=node_id,
            reason=reasons[node_id],
        )
        if tracker.record(node_id, now_ns):
            newly_ineligible.append(node_id)
    result = PlanResult(
        node_allocation=accepted_alloc,
        node_update=accepted_stop,
        rejected_nodes=tuple(rejected),
    )
    has_deployment = plan.deployment is not None or bool(plan.deployment_updates)
    if not accepted_alloc and not accepted_stop and not newly_ineligible and not has_deployment:
        return Evaluated(result, None)
    entry = raft_pb2.ApplyPlanResultsEntry(eval_id=plan.eval_id, updated_at_ns=now_ns)
    # The deployment commits whatever nodes were rejected: the allocs that did fit name it,
    # and the ones that did not are retried under it.
    if plan.deployment is not None:
        to_proto(plan.deployment, entry.deployment)
    for update in plan.deployment_updates:
        to_proto(update, entry.deployment_updates.add())
    # The allocs stay records in ``result`` until ``Evaluated.entries`` (see its docstring).
    for node_id in newly_ineligible:
        PLAN_NODE_INELIGIBLE.inc()
        config = tracker.config
        log.warning(
            "plan.node_marked_ineligible",
            node_id=node_id,
            eval_id=plan.eval_id,
            job_id=plan.job_id,
            threshold=config.threshold,
            window_s=config.window_ns / 1e9,
        )
        event = NodeEvent(
            message=(
                f"Node marked ineligible: plans rejected more than {config.threshold} times "
                f"within {config.window_ns // 1_000_000_000}s"
            ),
            subsystem="Scheduler",
            details={"last_reason": reasons[node_id]},
            timestamp_ns=now_ns,
        )
        ineligible = entry.nodes_ineligible.add(node_id=node_id)
        to_proto(event, ineligible.event)
    return Evaluated(result, entry)


def _node_rejection(
    snap: Snapshot,
    node_id: str,
    placed: tuple[Allocation, ...],
    stops: tuple[AllocStop, ...],
) -> str:
    if not placed:
        return ""  # stops always fit
    node = snap.node(node_id)
    if node is None:
        return "node does not exist"
    if node.status == NODE_STATUS_DISCONNECTED:
        # Only marking its allocs unknown is allowed on a node that stopped heartbeating.
        if all(a.client_status == ALLOC_CLIENT_UNKNOWN for a in placed):
            return ""
        return "node is disconnected and the plan places allocs on it"
    if node.status != NODE_STATUS_READY:
        return f"node is {node.status}"
    existing = snap.allocs_by_node(node_id)
    live_ids = {a.id for a in existing if not a.terminal()}
    if all(a.id in live_ids for a in placed):
        # In-place updates only: they take nothing new, even on an ineligible node (Nomad's
        # AllocSubset rule); refusing them would loop against the scheduler.
        return ""
    if node.scheduling_eligibility != "eligible" or node.drain_strategy is not None:
        return "node is not eligible for placements"
    fit = allocs_fit(node, proposed_allocs(existing, (s.alloc_id for s in stops), placed))
    return "" if fit.fits else f"does not fit: {fit.reason}"


# A plan committing in raft: the future of its raft index, and the tables it will produce.
_Inflight = tuple[Future[int], Tables]


class PlanApplier:
    """The single thread that commits plans (see the module docstring)."""

    def __init__(
        self,
        queue: PlanQueue,
        store: StateStore,
        propose_async: Callable[[bytes, Callable[[ApplyResult | None, str], None]], None],
        is_outstanding: Callable[[str, str], bool],
        now_ns: Callable[[], int],
        still_leader: Callable[[], bool],
    ) -> None:
        self._queue = queue
        self._store = store
        self._propose_async = propose_async
        self._is_outstanding = is_outstanding
        self._now_ns = now_ns
        self._still_leader = still_leader
        self._tracker = RejectionTracker(
            store.snapshot().scheduler_config().rejection_tracker or RejectionTrackerConfig()
        )
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="plan-applier", daemon=True)
        # The plan committing in raft: (future of its index, the tables it will produce).
        # Two threads touch it: the applier thread sets it (_commit), reads it (_view,
        # _wait_inflight) and clears it; raft's tick thread clears it from the commit
        # callback. Every access holds _inflight_lock, and a clear names the plan it clears
        # (_clear_inflight), so raft's late clear of plan N can never drop plan N+1.
        self._inflight_lock = threading.Lock()
        self._inflight: _Inflight | None = None
        # Set by raft's commit callback after a plan of several entries; the applier thread
        # trims the C heap (release_free_heap), so the few ms it takes never hold up raft's
        # tick thread, which applies every server's entries.
        self._heap_trim_due = threading.Event()

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _current_inflight(self) -> _Inflight | None:
        with self._inflight_lock:
            return self._inflight

    def _set_inflight(self, inflight: _Inflight) -> None:
        with self._inflight_lock:
            self._inflight = inflight

    def _clear_inflight(self, inflight: _Inflight) -> None:
        """Forget ``inflight``, unless a newer plan has taken its place."""
        with self._inflight_lock:
            if self._inflight is inflight:
                self._inflight = None

    def _view(self) -> Snapshot:
        """Newest state, plus the in-flight plan's effects if raft has not applied it yet."""
        snap = self._store.snapshot()
        inflight = self._current_inflight()
        if inflight is not None:
            done, expected = inflight
            if not done.done() or (done.exception() is None and snap.index < done.result()):
                return Snapshot(expected)
            # Applied (or failed): drop the expected state, a whole second copy of the allocs.
            self._clear_inflight(inflight)
        return snap

    def _run(self) -> None:
        while not self._stop.is_set():
            if self._heap_trim_due.is_set():
                self._heap_trim_due.clear()
                release_free_heap()
            pending = self._queue.dequeue(timeout=0.2)
            if pending is None:
                continue
            try:
                self._apply(pending)
            except Exception as exc:  # never let one plan kill the applier
                log.exception("plan.apply_failed", eval_id=pending.plan.eval_id)
                if not pending.future.done():
                    pending.future.set_exception(exc)

    def _apply(self, pending: PendingPlan) -> None:
        plan = pending.plan
        started = time.monotonic()
        pending.future.add_done_callback(lambda _f: PLAN_COMMIT_SECONDS.observe(time.monotonic() - started))
        if not self._is_outstanding(plan.eval_id, plan.eval_token):
            pending.future.set_exception(
                PlanRejectedError(f"eval {plan.eval_id} token is no longer outstanding")
            )
            return
        config = self._store.snapshot().scheduler_config().rejection_tracker
        if config is not None and config != self._tracker.config:
            self._tracker.config = config
        now = self._now_ns()
        with PLAN_APPLY_SECONDS.time():
            view = self._view()
            on_inflight = view is not None and view.tables is not self._store.snapshot().tables
            evaluated = evaluate_plan(plan, view, self._tracker, now)
            # Pipelining: N+1 was evaluated while N committed; propose only once N is done.
            if not self._wait_inflight() and on_inflight:
                # N did not commit: what N+1 was checked against never existed. Check again.
                view = self._store.snapshot()
                evaluated = evaluate_plan(plan, view, self._tracker, now)
            if evaluated.head is None:
                pending.future.set_result(replace(evaluated.result, refresh_index=view.index))
                return
            if not self._still_leader():
                pending.future.set_exception(PlanRejectedError("leadership lost"))
                return
            self._commit(pending, evaluated, view)

    def _wait_inflight(self) -> bool:
        """Wait for the plan in raft; False if it failed to commit."""
        inflight = self._current_inflight()
        if inflight is None:
            return True
        done, _ = inflight
        self._clear_inflight(inflight)
        try:
            done.result(timeout=30)
        except Exception:
            return False
        return True

    def _commit(self, pending: PendingPlan, evaluated: Evaluated, view: Snapshot) -> None:
        committed: Future[int] = Future()
        encoded, expected = _encode_and_expect(evaluated, view)
        result = evaluated.result
        remaining = [len(encoded)]
        failed: list[str] = []

        def on_commit(applied: ApplyResult | None, error: str) -> None:
            if applied is None or error or applied.error:
                failed.append(error or (applied.error if applied else "not committed"))
            remaining[0] -= 1
            if remaining[0]:
                return
            if failed:
                exc = PlanRejectedError(failed[0])
                committed.set_exception(exc)
                pending.future.set_exception(exc)
                return
            assert applied is not None
            committed.set_result(applied.index)
            # Once raft has applied the plan, the store holds what ``expected`` predicted
            # (unless a later plan is already in flight): drop this second copy of the
            # allocs now rather than when the next plan arrives, which may be never.
            self._clear_inflight(inflight)
            refresh = applied.index if result.rejected_nodes else 0
            pending.future.set_result(replace(result, alloc_index=applied.index, refresh_index=refresh))
            if len(encoded) > 1:
                self._heap_trim_due.set()

        inflight: _Inflight = (committed, expected)
        self._set_inflight(inflight)
        # Raft keeps the order: stops land before placements, so no node is overcommitted
        # between chunks, and the plan was checked as a whole.
        for data in encoded:
            self._propose_async(data, on_commit)


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim``, looked up once; None on another C library."""
    try:
        trim: Callable[[int], int] = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None
    return trim


def release_free_heap() -> None:
    """Give the C allocator's free pages back to the system (glibc's ``malloc_trim``).

    Committing a plan of several entries makes and frees tens of MiB of protobuf arenas and
    entry bytes (decoded on every apply) in the C heap; the blocks that stay live above them
    keep glibc from shrinking its heap, so the leader's RSS stays at the plan's peak (20,000
    allocs: ~25 MiB, 1.2 KiB per alloc, tests/bench/alloc_memory.py). A trim takes a few ms
    and runs only after a plan of more than one entry, on the applier thread, within one
    dequeue wait (0.2 s) of the commit. Elsewhere than glibc: nothing."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


def _encode_and_expect(evaluated: Evaluated, view: Snapshot) -> tuple[list[bytes], Tables]:
    """The raft entries of ``evaluated``, encoded, and the state they will produce (from
    the FSM's own apply function); each entry's messages are gone before the next is built."""
    txn = Txn(view.tables, view.index + 1)
    encoded: list[bytes] = []
    for entry in evaluated.entries():
        apply_plan_results(txn, entry, view.index + 1)
        encoded.append(encode_entry(raft_pb2.ENTRY_TYPE_APPLY_PLAN_RESULTS, entry))
    return encoded, txn.commit()


# A 20,000-alloc plan applied as one entry holds raft's tick thread for seconds on every
# server (longer than an election timeout on a 2-core machine): commit big plans as
# several entries of at most this many allocs.
MAX_ALLOCS_PER_ENTRY: Final = 2000


Stop = TypeVar("Stop")
Placement = TypeVar("Placement")


def entry_chunks(
    stops: Sequence[Stop], allocs: Sequence[Placement]
) -> list[tuple[Sequence[Stop], Sequence[Placement]]]:
    """The one chunking rule of a plan: stops first, then placements, at most
    MAX_ALLOCS_PER_ENTRY to a chunk. Stops go first so that raft, which keeps the order,
    frees a node's room before any chunk places on it: no node is overcommitted between
    chunks of a plan that was checked as a whole."""
    total = len(stops) + len(allocs)
    if total <= MAX_ALLOCS_PER_ENTRY:
        return [(stops, allocs)]
    chunks: list[tuple[Sequence[Stop], Sequence[Placement]]] = []
    for start in range(0, total, MAX_ALLOCS_PER_ENTRY):
        end = start + MAX_ALLOCS_PER_ENTRY
        placed_from, placed_to = max(0, start - len(stops)), max(0, end - len(stops))
        chunks.append((stops[start:end], allocs[placed_from:placed_to]))
    return chunks


def plan_entries(
    head: raft_pb2.ApplyPlanResultsEntry,
    stops: Sequence[Stop],
    allocs: Sequence[Placement],
    add: Callable[[raft_pb2.ApplyPlanResultsEntry, Sequence[Stop], Sequence[Placement]], None],
) -> Iterator[raft_pb2.ApplyPlanResultsEntry]:
    """The raft entries of a plan whose allocs are ``stops`` and ``allocs`` and whose other
    fields are ``head``'s, chunked by ``entry_chunks``; ``add`` puts a chunk's records into
    an entry. Each entry is ``head`` less what travels in one entry only: the deployment
    with the first (the allocs after it name it), evals and ineligible nodes with the last
    (the eval completes once all is in); every other field goes with each entry."""
    chunks = entry_chunks(stops, allocs)
    for n, (chunk_stops, chunk_allocs) in enumerate(chunks):
        entry = raft_pb2.ApplyPlanResultsEntry()
        entry.CopyFrom(head)
        if n > 0:
            entry.ClearField("deployment")
            entry.ClearField("deployment_updates")
        if n < len(chunks) - 1:
            entry.ClearField("evals")
            entry.ClearField("nodes_ineligible")
        add(entry, chunk_stops, chunk_allocs)
        yield entry


def split_entry(entry: raft_pb2.ApplyPlanResultsEntry) -> list[raft_pb2.ApplyPlanResultsEntry]:
    """A whole-plan entry as the applier would commit it (``plan_entries``), for a reader
    holding one entry of a plan: a test, a tool."""
    head = raft_pb2.ApplyPlanResultsEntry()
    head.CopyFrom(entry)
    head.ClearField("allocs_stopped")
    head.ClearField("allocs_upserted")

    def add(
        chunk: raft_pb2.ApplyPlanResultsEntry,
        stops: Sequence[raft_pb2.AllocStop],
        allocs: Sequence[structs_pb2.Allocation],
    ) -> None:
        chunk.allocs_stopped.extend(stops)
        chunk.allocs_upserted.extend(allocs)

    return list(plan_entries(head, list(entry.allocs_stopped), list(entry.allocs_upserted), add))
