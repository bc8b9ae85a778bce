"""The chaos workload: real API traffic against the servers, every write recorded.

Threads, each with its own ``random.Random`` derived from the run's seed (the choices are
reproducible; their interleaving with the nemesis is not):

* **job workers**: each owns a few job IDs of every type (service, batch, system, sysbatch)
  and walks them through register, in-place update (meta), destructive update (task
  config), scale (service and batch), stop and purge;
* **templates**: a periodic and a parameterized parent, then forced launches and dispatches
  (their children are batch jobs the simulated clients complete: the children counts of
  docs/field-reports.md#field-report-2);
* **nodes**: registers the simulated nodes (tests/cluster/nodes.py) and a probe node,
  heartbeats them all, and drains and undrains one node at a time;
* **clients**: stand in for client agents: read the allocs and report, per node, pending ->
  running, batch work complete after a while, stopped allocs complete, and now and then a
  failure, never moving an alloc's status backwards;
* **probe**: a cheap write every ``probe_interval_s`` (setting the ineligible probe node
  ineligible again: an entry, no evaluation) with its own short retries, so a failover's
  end is seen within a tick of the first write the new leader can acknowledge, not after
  the SDK's backoff (which grows to 2 s).

Every write goes through ``History.invoke`` and ends ``ok`` with its raft index or
``info``. A client that saw UNAVAILABLE or DEADLINE_EXCEEDED is replaced by a fresh one:
grpc's reconnect backoff would otherwise keep a restarted server unusable for minutes.
"""

from __future__ import annotations

import json
import random
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Final, TypeVar

import grpc

from drover.sdk import DroverClient, DroverError
from drover.v1 import structs_pb2
from tests.chaos.history import DEFINITE_ERRORS, History, Op
from tests.cluster.nodes import simulated_node, simulated_secret

T = TypeVar("T")

JOB_TYPES: Final = ("service", "batch", "system", "sysbatch")
BATCHY: Final = frozenset({"batch", "sysbatch"})
PROBE_NODE: Final = "probe-node"
# A simulated node like the others, but never drained: the nemesis makes the plan applier
# disagree about it (tests/chaos/disagreement.py) and is the only one to touch its
# eligibility, so the rejection tracker's mark is the only thing that makes it ineligible.
SHRINK_NODE: Final = "node-shrinks"
PERIODIC_PARENT: Final = "tpl-periodic"
DISPATCH_PARENT: Final = "tpl-dispatch"
SEQ_KEY: Final = "chaos.seq"
# The kind of the reader's ops (``record_read``): reads, not writes.
READ_KIND: Final = "read"
# How far a client's report may move an alloc; lost/unknown are the servers' to set.
CLIENT_RANK: Final = {"pending": 0, "running": 1, "complete": 2, "failed": 2}
DRAIN: Final = structs_pb2.DrainStrategy(deadline_ns=5_000_000_000)


@dataclass(frozen=True, slots=True)
class WorkloadConfig:
    seed: int
    nodes: int = 4
    job_workers: int = 3
    jobs_per_worker: int = 4
    think_s: tuple[float, float] = (0.05, 0.25)
    template_think_s: tuple[float, float] = (0.4, 1.2)
    probe_interval_s: float = 0.05
    heartbeat_s: float = 1.0
    client_poll_s: float = 0.3
    batch_run_s: float = 2.0
    drain_gap_s: tuple[float, float] = (6.0, 14.0)
    drain_hold_s: tuple[float, float] = (3.0, 8.0)
    failure_rate: float = 0.01
    rpc_timeout_s: float = 3.0
    retry_deadline_s: float = 8.0
    # The reader: one job read this often, a fifth of them stale (checker.check_stale_reads).
    read_interval_s: tuple[float, float] = (0.03, 0.1)
    stale_read_share: float = 0.2


def job_id_for(worker: int, slot: int, job_type: str) -> str:
    return f"w{worker}-{job_type}-{slot}"


def job_type_of(job_id: str) -> str:
    """The type a workload job ID encodes; template children are batch jobs."""
    if job_id.startswith("tpl-"):
        return "batch"
    parts = job_id.split("-")
    return parts[1] if len(parts) == 3 and parts[1] in JOB_TYPES else "service"


def build_job(
    job_id: str, job_type: str, *, count: int, variant: int, seq: int, cpu: int = 50
) -> structs_pb2.Job:
    """A one-group, one-task mock-driver job; ``variant`` is the destructive knob (task
    config), ``seq`` the in-place one (meta), so the stored job says which write it is."""
    return structs_pb2.Job(
        id=job_id,
        type=job_type,
        datacenters=["dc1"],
        meta={SEQ_KEY: str(seq)},
        groups=[
            structs_pb2.TaskGroup(
                name="g",
                count=1 if job_type in ("system", "sysbatch") else count,
                tasks=[
                    structs_pb2.Task(
                        name="t",
                        driver="mock",
                        config_json=json.dumps({"run_for": "1h", "variant": variant}),
                        resources=structs_pb2.Resources(cpu_mhz=cpu, memory_mb=32),
                    )
                ],
                # A failed service alloc is replaced after a second and a rollout moves on
                # every second, so the run settles soon after the workload stops (the
                # default delays reach minutes, leaving delayed evals pending at the end).
                reschedule=structs_pb2.ReschedulePolicy(
                    unlimited=True, delay_ns=1_000_000_000, delay_function="constant"
                )
                if job_type == "service"
                else None,
                update=structs_pb2.UpdateStrategy(max_parallel=2, stagger_ns=1_000_000_000)
                if job_type == "service"
                else None,
            )
        ],
    )


def periodic_parent() -> structs_pb2.Job:
    job = build_job(PERIODIC_PARENT, "batch", count=1, variant=0, seq=0)
    job.periodic.CopyFrom(structs_pb2.PeriodicConfig(enabled=True, spec="*/5 * * * *", time_zone="UTC"))
    return job


def dispatch_parent() -> structs_pb2.Job:
    job = build_job(DISPATCH_PARENT, "batch", count=1, variant=0, seq=0)
    job.parameterized.CopyFrom(structs_pb2.ParameterizedConfig(payload="optional", meta_optional=["n"]))
    return job


class AttemptCountingClient(DroverClient):
    """The SDK client, counting per thread the attempts its calls make (test-only, through
    the SDK's private ``_pick`` and, before any server has answered, ``_first_contact``:
    one of them is called once per attempt): an error that answered a call's
    only attempt says what happened to the write; after a retry it does not (history.py)."""

    def __init__(self, addresses: Sequence[str], *, timeout: float, retry_deadline: float) -> None:
        super().__init__(addresses, timeout=timeout, retry_deadline=retry_deadline)
        self._attempts = threading.local()

    @property
    def attempts(self) -> int:
        return int(getattr(self._attempts, "n", 0))

    def reset_attempts(self) -> None:
        self._attempts.n = 0

    def _pick(self) -> Any:
        self._attempts.n = self.attempts + 1
        return super()._pick()

    def _first_contact(self, started: float) -> Any:
        self._attempts.n = self.attempts + 1
        return super()._first_contact(started)


class Caller:
    """One thread's SDK client, replaced after a transport-level failure."""

    def __init__(
        self,
        addresses: Sequence[str],
        config: WorkloadConfig,
        rotate: int,
        *,
        timeout_s: float | None = None,
        retry_deadline_s: float | None = None,
    ) -> None:
        n = len(addresses)
        self._addresses = [addresses[(rotate + i) % n] for i in range(n)]
        self._timeout_s = config.rpc_timeout_s if timeout_s is None else timeout_s
        self._retry_deadline_s = config.retry_deadline_s if retry_deadline_s is None else retry_deadline_s
        self._client = self._open()
        # How many attempts the last failed call made (the SDK retries UNAVAILABLE).
        self.last_attempts = 0

    def _open(self) -> AttemptCountingClient:
        return AttemptCountingClient(
            self._addresses, timeout=self._timeout_s, retry_deadline=self._retry_deadline_s
        )

    def call(self, fn: Callable[[DroverClient], T]) -> T:
        client = self._client
        client.reset_attempts()
        try:
            return fn(client)
        except DroverError as exc:
            self.last_attempts = client.attempts
            if exc.code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                self._client.close()
                self._client = self._open()
            raise

    def close(self) -> None:
        self._client.close()


def record_write(
    history: History,
    caller: Caller,
    process: str,
    kind: str,
    key: str,
    fn: Callable[[DroverClient], Any],
    **args: Any,
) -> Op:
    """One write through ``caller``, recorded: ``ok`` with its index, ``fail`` when a
    definite error answered its only attempt, ``info`` otherwise (history.py)."""
    op = history.invoke(process, kind, key, **args)
    try:
        response = caller.call(fn)
    except DroverError as exc:
        definite = exc.code.name in DEFINITE_ERRORS and caller.last_attempts == 1
        history.fail(op, f"{exc.code.name}: {exc.message}", definite=definite)
        return op
    result: dict[str, Any] = {}
    for name in ("version", "job_modify_index", "eval_id", "dispatched_job_id", "child_job_id"):
        if name in response.DESCRIPTOR.fields_by_name:
            result[name] = getattr(response, name)
    history.complete(op, index=response.meta.index, **result)
    return op


def record_read(history: History, caller: Caller, job_id: str, *, stale: bool) -> Op:
    """One ``get_job``, recorded as kind ``read``: ``ok`` with ``modify_index`` and ``stop`` (or
    ``absent``: NOT_FOUND is an answer); ``info`` for any other error. Never an index: the
    index checks are about writes."""
    op = history.invoke("reads", READ_KIND, job_id, stale=stale)
    try:
        job = caller.call(lambda c: c.get_job(job_id, stale=stale)).job
    except DroverError as exc:
        if exc.code.name == "NOT_FOUND":
            history.complete(op, absent=True)
        else:
            history.fail(op, f"{exc.code.name}: {exc.message}")
        return op
    history.complete(op, modify_index=int(job.modify_index), stop=bool(job.stop))
    return op


@dataclass
class _Slot:
    job_id: str
    job_type: str
    state: str = "absent"  # absent | running | stopped (what this worker believes)
    count: int = 2
    variant: int = 0


@dataclass
class Workload:
    addresses: list[str]
    history: History
    config: WorkloadConfig
    errors: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._stop_writes = threading.Event()
        self._stop_all = threading.Event()
        self._writers: list[threading.Thread] = []
        self._background: list[threading.Thread] = []
        self._seq = 0
        self._seq_lock = threading.Lock()
        self.node_ids = [f"node-{i}" for i in range(self.config.nodes)]
        self.job_ids: list[str] = []
        # Every write of the workload goes into its one history.
        self._write = partial(record_write, self.history)

    # -- lifecycle ---------------------------------------------------------------------
    def setup(self) -> None:
        """Register the nodes and the template parents before the threads start."""
        caller = Caller(self.addresses, self.config, 0)
        try:
            for node_id in self.node_ids:
                self._write(
                    caller,
                    "setup",
                    "node-register",
                    node_id,
                    partial(DroverClient.register_node, node=simulated_node(node_id)),
                )
            self._write(
                caller,
                "setup",
                "node-register",
                SHRINK_NODE,
                partial(DroverClient.register_node, node=simulated_node(SHRINK_NODE)),
            )
            probe = simulated_node(PROBE_NODE)
            probe.scheduling_eligibility = "ineligible"
            self._write(caller, "setup", "node-register", PROBE_NODE, lambda c: c.register_node(probe))
            for job in (periodic_parent(), dispatch_parent()):
                self._write(
                    caller,
                    "setup",
                    "register",
                    job.id,
                    partial(DroverClient.register_job, job=job),
                    seq=0,
                    type="batch",
                    count=1,
                    variant=0,
                    template=True,
                )
        finally:
            caller.close()

    def register_client_jobs(self, jobs: Sequence[structs_pb2.Job], attempts: int = 5) -> None:
        """Register the real clients' jobs (tests/chaos/clients.py) before the faults begin,
        each until acknowledged: a run whose real clients run nothing checks nothing. Their
        kind, ``register-raw``, is not one the job checks judge (they know the mock jobs'
        shape only)."""
        caller = Caller(self.addresses, self.config, 0)
        try:
            for job in jobs:
                for _ in range(attempts):
                    write = partial(DroverClient.register_job, job=job)
                    if self._write(caller, "setup", "register-raw", job.id, write).ok:
                        break
                else:
                    self.errors.append(f"could not register {job.id} in {attempts} attempts")
        finally:
            caller.close()

    def start(self) -> None:
        for w in range(self.config.job_workers):
            self._spawn(self._writers, f"jobs-{w}", self._job_worker, w)
        self._spawn(self._writers, "templates", self._templates)
        self._spawn(self._writers, "drains", self._drains)
        self._spawn(self._writers, "probe", self._probe)
        self._spawn(self._writers, "reads", self._reads)
        self._spawn(self._background, "heartbeats", self._heartbeats)
        self._spawn(self._background, "clients", self._clients)

    def stop_writes(self, timeout: float = 30.0) -> None:
        """Stop generating job and node operations (undraining what is drained); the
        heartbeats and simulated clients keep running so the cluster can settle."""
        self._stop_writes.set()
        for thread in self._writers:
            thread.join(timeout)
        self._writers = [t for t in self._writers if t.is_alive()]
        if self._writers:
            self.errors.append(f"writer threads still running: {[t.name for t in self._writers]}")

    def stop(self, timeout: float = 30.0) -> None:
        self._stop_writes.set()
        self._stop_all.set()
        for thread in [*self._writers, *self._background]:
            thread.join(timeout)

    def _spawn(
        self, into: list[threading.Thread], name: str, target: Callable[..., None], *args: Any
    ) -> None:
        def run() -> None:
            try:
                target(*args)
            except Exception as exc:  # a workload bug: reported, never swallowed
                self.errors.append(f"{name}: {type(exc).__name__}: {exc}")

        thread = threading.Thread(target=run, name=f"chaos-{name}", daemon=True)
        thread.start()
        into.append(thread)

    def _next_seq(self) -> int:
        with self._seq_lock:
            self._seq += 1
            return self._seq

    # -- job workers -------------------------------------------------------------------
    def _job_worker(self, w: int) -> None:
        rng = random.Random(f"{self.config.seed}:jobs:{w}")
        caller = Caller(self.addresses, self.config, w)
        process = f"jobs-{w}"
        slots = []
        for n in range(self.config.jobs_per_worker):
            job_type = JOB_TYPES[(w * self.config.jobs_per_worker + n) % len(JOB_TYPES)]
            slots.append(_Slot(job_id_for(w, n, job_type), job_type, count=rng.randint(1, 3)))
        self.job_ids.extend(s.job_id for s in slots)
        try:
            while not self._stop_writes.wait(rng.uniform(*self.config.think_s)):
                self._job_step(caller, process, rng, rng.choice(slots))
        finally:
            caller.close()

    def _job_step(self, caller: Caller, process: str, rng: random.Random, slot: _Slot) -> None:
        if slot.state == "absent":
            action = "register"
        elif slot.state == "stopped":
            action = rng.choices(["register", "purge"], [3, 2])[0]
        else:
            scalable = slot.job_type in ("service", "batch")
            action = rng.choices(
                ["update-inplace", "update-destructive", "scale", "stop", "purge"],
                [35, 20, 15 if scalable else 0, 15, 8],
            )[0]
        if action == "stop" or action == "purge":
            purge = action == "purge"
            op = self._write(
                caller, process, action, slot.job_id, lambda c: c.deregister_job(slot.job_id, purge=purge)
            )
            if op.ok or "NOT_FOUND" in op.error:
                slot.state = "absent" if purge or "NOT_FOUND" in op.error else "stopped"
            return
        if action == "update-destructive":
            slot.variant += 1
        elif action == "scale":
            slot.count = rng.choice([c for c in (1, 2, 3, 4) if c != slot.count])
        seq = self._next_seq()
        job = build_job(slot.job_id, slot.job_type, count=slot.count, variant=slot.variant, seq=seq)
        op = self._write(
            caller,
            process,
            action,
            slot.job_id,
            lambda c: c.register_job(job),
            seq=seq,
            type=slot.job_type,
            count=job.groups[0].count,
            variant=slot.variant,
        )
        if op.ok:
            slot.state = "running"

    # -- templates: forced periodic launches and dispatches ----------------------------
    def _templates(self) -> None:
        rng = random.Random(f"{self.config.seed}:templates")
        caller = Caller(self.addresses, self.config, 1)
        try:
            while not self._stop_writes.wait(rng.uniform(*self.config.template_think_s)):
                if rng.random() < 0.5:
                    self._write(
                        caller,
                        "templates",
                        "periodic-force",
                        PERIODIC_PARENT,
                        lambda c: c.periodic_force(PERIODIC_PARENT),
                    )
                else:
                    n = str(self._next_seq())
                    self._write(
                        caller,
                        "templates",
                        "dispatch",
                        DISPATCH_PARENT,
                        partial(DroverClient.dispatch_job, job_id=DISPATCH_PARENT, meta={"n": n}),
                        n=n,
                    )
        finally:
            caller.close()

    # -- nodes: drains, heartbeats, and the failover probe -----------------------------
    def _drains(self) -> None:
        rng = random.Random(f"{self.config.seed}:drains")
        caller = Caller(self.addresses, self.config, 2)
        drained: str | None = None
        try:
            while not self._stop_writes.wait(
                rng.uniform(*(self.config.drain_hold_s if drained else self.config.drain_gap_s))
            ):
                if drained is None:
                    node_id = rng.choice(self.node_ids)
                    self._write(
                        caller,
                        "drains",
                        "drain",
                        node_id,
                        partial(DroverClient.update_drain, node_id=node_id, drain_strategy=DRAIN),
                    )
                    drained = node_id  # undrained next, acknowledged or not
                else:
                    self._undrain(caller, drained)
                    drained = None
            if drained is not None:
                self._undrain_until_acked(caller, drained)
        finally:
            caller.close()

    def _undrain(self, caller: Caller, node_id: str) -> Op:
        return self._write(
            caller, "drains", "undrain", node_id, lambda c: c.update_drain(node_id, None, mark_eligible=True)
        )

    def _undrain_until_acked(self, caller: Caller, node_id: str, attempts: int = 10) -> None:
        for _ in range(attempts):
            if self._undrain(caller, node_id).ok:
                return
        self.errors.append(f"could not undrain {node_id} after {attempts} attempts")

    def _reads(self) -> None:
        """Read one workload job at a time, by default (leader-confirmed) or stale, and
        record what was seen: its ``modify_index``, or that it is absent. The checker holds
        every default read to every write acknowledged before it was invoked."""
        rng = random.Random(f"{self.config.seed}:reads")
        caller = Caller(self.addresses, self.config, 1)
        try:
            while not self._stop_writes.wait(rng.uniform(*self.config.read_interval_s)):
                if not self.job_ids:
                    continue
                job_id = rng.choice(self.job_ids)
                stale = rng.random() < self.config.stale_read_share
                record_read(self.history, caller, job_id, stale=stale)
        finally:
            caller.close()

    def _probe(self) -> None:
        # Its own short retries: the SDK's backoff grows to seconds during an election, which
        # would measure the client's patience rather than the cluster's unavailability.
        caller = Caller(self.addresses, self.config, 0, timeout_s=1.0, retry_deadline_s=0.25)
        try:
            while not self._stop_writes.wait(self.config.probe_interval_s):
                self._write(
                    caller,
                    "probe",
                    "probe",
                    PROBE_NODE,
                    lambda c: c.update_eligibility(PROBE_NODE, "ineligible"),
                )
        finally:
            caller.close()

    def _heartbeats(self) -> None:
        """Not recorded: a heartbeat of a ready node writes nothing."""
        caller = Caller(self.addresses, self.config, 1)
        try:
            while not self._stop_all.wait(self.config.heartbeat_s):
                for node_id in [*self.node_ids, SHRINK_NODE, PROBE_NODE]:
                    if self._stop_all.is_set():
                        return
                    try:
                        caller.call(
                            partial(
                                DroverClient.update_node_status,
                                node_id=node_id,
                                status="ready",
                                secret_id=simulated_secret(node_id),
                            )
                        )
                    except DroverError:
                        pass
        finally:
            caller.close()

    # -- simulated clients -------------------------------------------------------------
    def _clients(self) -> None:
        rng = random.Random(f"{self.config.seed}:clients")
        caller = Caller(self.addresses, self.config, 2)
        reported: dict[str, str] = {}
        running_since: dict[str, float] = {}
        ours = {*self.node_ids, SHRINK_NODE}
        try:
            while not self._stop_all.wait(self.config.client_poll_s):
                try:
                    allocs = caller.call(lambda c: c.list_allocs(stale=True)).allocs
                except DroverError:
                    continue
                now = self.history.now()
                by_node: dict[str, list[structs_pb2.Allocation]] = {}
                for alloc in allocs:
                    if alloc.node_id not in ours:
                        continue
                    status = self._next_client_status(alloc, reported, running_since, now, rng)
                    if status is None:
                        continue
                    by_node.setdefault(alloc.node_id, []).append(
                        structs_pb2.Allocation(id=alloc.id, client_status=status)
                    )
                for node_id, updates in sorted(by_node.items()):
                    statuses = {u.id: u.client_status for u in updates}
                    op = self._write(
                        caller,
                        "clients",
                        "alloc-update",
                        node_id,
                        partial(
                            DroverClient.update_allocs,
                            allocs=updates,
                            node_id=node_id,
                            secret_id=simulated_secret(node_id),
                        ),
                        statuses=statuses,
                    )
                    if op.ok:
                        for alloc_id, status in statuses.items():
                            reported[alloc_id] = status
                            if status == "running":
                                running_since[alloc_id] = now
        finally:
            caller.close()

    def _next_client_status(
        self,
        alloc: structs_pb2.Allocation,
        reported: dict[str, str],
        running_since: dict[str, float],
        now: float,
        rng: random.Random,
    ) -> str | None:
        """What a client would report next for ``alloc``, or None; never backwards."""
        current = reported.get(alloc.id, alloc.client_status or "pending")
        if CLIENT_RANK.get(alloc.client_status, 3) > CLIENT_RANK.get(current, 3):
            current = alloc.client_status
        if current not in ("pending", "running"):
            return None  # terminal, or lost/unknown: the servers' call
        if alloc.desired_status != "run":
            return "complete"  # the client stopped it
        if current == "pending":
            return "running"
        if job_type_of(alloc.job_id) in BATCHY:
            started = running_since.setdefault(alloc.id, now)
            return "complete" if now - started >= self.config.batch_run_s else None
        if not self._stop_writes.is_set() and rng.random() < self.config.failure_rate:
            return "failed"
        return None
