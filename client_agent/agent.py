"""The client agent: the imperative shell around the runners, the RPCs and local state.

Theory of operation. Four threads, each with its own retry policy, share three flags:

- heartbeat: ``Register`` while ``_need_register`` is set (at start, and after any
  contact was lost or refused), else ``UpdateStatus(ready, secret)``, every TTL/2, each
  waiting for its answer while the TTL leaves time for one more try
  (``sync.heartbeat_timeout_s``). A failure clears ``_registered`` and sets
  ``_need_register``: a server that marked the node down refuses its updates until it
  registers again, so after a disconnect the first successful call is always a Register. Right after each Register every alloc's current
  status is queued again, so the servers learn everything that happened meanwhile.
- watch: a blocking ``GetClientAllocs(min_index=last index)`` loop while registered;
  each answer goes through ``allocdiff.diff_allocs`` and the runners are started,
  stopped, updated, marked reconnected or destroyed accordingly.
- sync: every ~200 ms, while registered, one ``UpdateAllocs`` with the newest status of
  each alloc that changed (``sync.PendingUpdates``). Undelivered batches go back in the
  queue; while no server answers, the queue simply holds the latest state per alloc.
- watchdog: ``stop_on_client_after``: an alloc whose group sets it is stopped by the
  agent itself once no heartbeat has succeeded for that long.
- tunnel: while registered, one ``Nodes.Connect`` stream open to the current server,
  answering what only this node can (alloc logs, restart, signal, node meta:
  client_agent/tunnel.py). A meta change is stored, then registered (``apply_meta``).
- services-watch: one blocking ``Services.ClientInfo`` query for the services every
  alloc's templates read, its changes fanned out to those allocs
  (client_agent/servicewatch.py): one parked query per node, not one per alloc.

Losing the servers never stops a task: runners only change on the servers' word, their
own restart policy, or ``stop_on_client_after``.

Every RPC goes to ``ServerPool.current()``; UNAVAILABLE / DEADLINE_EXCEEDED rotates to the
next server, and each loop backs off with jitter before trying again.

Shutdown: ``stop()`` kills every task (dev mode, tests); ``stop(leave_tasks_running=True)``
leaves them running with their handles in ``data_dir`` and the next agent on the same
``data_dir`` re-attaches to them (same alloc IDs, same PIDs). ``run_client`` stops that way.
"""

from __future__ import annotations

import random
import signal
import threading
import uuid
from collections.abc import Callable, Mapping, Sequence
from types import FrameType

import structlog

from drover.client.allocdiff import LocalAlloc, ServerAlloc, diff_allocs
from drover.client.clock import Clock, SystemClock
from drover.client.config import AgentTuning, ClientSettings, EmbeddedSettings, ProcessSettings
from drover.client.drivers import Driver, default_drivers
from drover.client.errors import (
    ClientAgentError,
    NotFound,
    Refused,
    RequestRejected,
    ServerUnreachable,
    StateError,
)
from drover.client.fingerprint import HostFacts, build_node, fingerprint, probe_host
from drover.client.metrics import open_client_endpoint
from drover.client.rpc import NodesRpc, ServerPool
from drover.client.runner import AllocRunner, job_key
from drover.client.servicewatch import AllocServices, ServiceWatch
from drover.client.state import AllocRecord, NodeIdentity, StateDB
from drover.client.sync import (
    Backoff,
    PendingUpdates,
    allocs_to_stop_after_disconnect,
    heartbeat_interval_s,
    heartbeat_timeout_s,
)
from drover.client.taskstate import AllocStatus
from drover.client.tunnel import ClientTunnel, TunnelService, apply_meta_change, merge_meta
from drover.common.logs import configure_logging
from drover.common.tls import TLSError, TLSMaterial
from drover.v1 import api_pb2, structs_pb2

__all__ = ["AgentTuning", "ClientAgent", "ClientSettings", "run_client", "start_embedded_client"]

log = structlog.get_logger("drover.client")


class ClientAgent:
    def __init__(
        self,
        cfg: ClientSettings,
        *,
        clock: Clock | None = None,
        rng: random.Random | None = None,
        drivers: Mapping[str, Driver] | None = None,
        tuning: AgentTuning | None = None,
        new_id: Callable[[], str] | None = None,
        host_facts: HostFacts | None = None,
        tls: TLSMaterial | None = None,
    ) -> None:
        if not cfg.servers:
            raise ValueError("the client agent needs at least one server address")
        self._cfg = cfg
        self._clock: Clock = clock or SystemClock()
        self._rng = rng or random.Random()
        self._drivers: Mapping[str, Driver] = (
            drivers if drivers is not None else default_drivers(self._clock, raw_exec=cfg.enable_raw_exec)
        )
        self._tuning = tuning or AgentTuning()
        self._new_id = new_id or (lambda: str(uuid.uuid4()))
        self._host_facts = host_facts
        self._pool = ServerPool(list(cfg.servers), tls=tls)
        self._rpc = NodesRpc(self._pool, timeout_s=self._tuning.rpc_timeout_s)
        self._pending = PendingUpdates()
        self._runners_lock = threading.Lock()
        self._runners: dict[str, AllocRunner] = {}
        # Destroyed runners whose tasks may still be dying: joined on stop().
        self._retired: list[AllocRunner] = []
        # Alloc ID -> the older server copy (alloc_modify_index) already answered by a
        # re-registration (``_note_rewinds``); the watch thread alone reads and writes it.
        self._rewinds_handled: dict[str, int] = {}
        self._stopping = threading.Event()
        self._registered = threading.Event()
        self._need_register = threading.Event()
        self._wake_heartbeat = threading.Event()
        self._state_lock = threading.Lock()
        self._ttl_ns = self._tuning.default_ttl_ns
        self._last_heartbeat_ok_ns = 0
        self._heartbeats_ok = 0
        self._registrations = 0
        self._disconnected_since_ns = 0
        self._threads: list[threading.Thread] = []
        self._started = False
        self._stopped = False
        self._store: StateDB | None = None
        self._identity: NodeIdentity | None = None
        self._node: structs_pb2.Node | None = None
        # Dynamic meta (``node meta apply``) and which version of the node the servers have:
        # ``_node_generation`` moves with each change, ``_registered_generation`` once a
        # Register carrying it succeeded.
        self._dynamic_meta: dict[str, str] = {}
        self._node_generation = 0
        self._registered_generation = -1
        self._registered_cond = threading.Condition(self._state_lock)
        self._tunnel: ClientTunnel | None = None
        self._log = log.bind(node_name=cfg.node_name)
        # The one blocking query for services that every alloc's templates share.
        self._service_watch = ServiceWatch(self._fetch_services, log=log.bind(node_name=cfg.node_name))

    # -- public surface ----------------------------------------------------------------

    @property
    def node_id(self) -> str:
        return self._require_identity().node_id

    @property
    def secret_id(self) -> str:
        return self._require_identity().secret_id

    @property
    def node(self) -> structs_pb2.Node:
        """The registration this agent sends (fingerprint included)."""
        if self._node is None:
            raise ClientAgentError("the agent has not been started")
        return self._node

    @property
    def registered(self) -> bool:
        """True while the servers hear this node (registered, last heartbeat succeeded)."""
        return self._registered.is_set()

    @property
    def heartbeat_ttl_ns(self) -> int:
        with self._state_lock:
            return self._ttl_ns

    @property
    def registrations(self) -> int:
        """How many times this agent registered (1 + one per reconnect)."""
        with self._state_lock:
            return self._registrations

    def wait_registered(self, timeout_s: float) -> bool:
        return self._registered.wait(timeout_s)

    def alloc_ids(self) -> list[str]:
        with self._runners_lock:
            return sorted(self._runners)

    def runner(self, alloc_id: str) -> AllocRunner | None:
        with self._runners_lock:
            return self._runners.get(alloc_id)

    def alloc_status(self, alloc_id: str) -> AllocStatus | None:
        runner = self.runner(alloc_id)
        return runner.status() if runner else None

    def pending_updates(self) -> dict[str, AllocStatus]:
        """What is queued for the servers and not yet delivered, by alloc ID."""
        return self._pending.snapshot()

    # -- lifecycle ---------------------------------------------------------------------

    def start(self) -> None:
        """Restore runners from local state, then register and work in the background.

        Never waits for a server: tasks left by a previous agent are re-attached first.
        Raises StateError if ``data_dir`` cannot be used.
        """
        if self._started:
            raise ClientAgentError("the agent was already started")
        self._started = True
        self._store = StateDB(self._cfg.data_dir)
        self._identity = self._store.load_or_create_identity(self._new_id)
        self._log = log.bind(node_id=self._identity.node_id, node_name=self._cfg.node_name)
        facts = self._host_facts or probe_host(self._cfg.data_dir, list(self._cfg.servers))
        fp = fingerprint(facts, self._cfg.node_name, self._drivers)
        node = build_node(self._identity.node_id, self._identity.secret_id, self._cfg, fp)
        self._dynamic_meta = self._store.load_dynamic_meta()
        node.meta.clear()
        node.meta.update(merge_meta(self._cfg.meta, self._dynamic_meta))
        self._node = node
        self._tunnel = ClientTunnel(
            self._pool,
            self._identity.node_id,
            self._identity.secret_id,
            TunnelService(self._identity.node_id, self.runner, self.read_meta, self.apply_meta),
            registered=self._registered,
            stopping=self._stopping,
            backoff=Backoff(self._tuning.backoff_base_s, self._tuning.backoff_cap_s, self._rng),
            log_fields={"node_id": self._identity.node_id},
        )
        with self._state_lock:
            # The window of stop_on_client_after starts with the agent: a restarted agent
            # gives its restored allocs a full window to reach the servers.
            self._last_heartbeat_ok_ns = self._clock.monotonic_ns()
        self._restore()
        self._service_watch.start()
        self._need_register.set()
        for name, target in (
            ("heartbeat", self._heartbeat_loop),
            ("watch", self._watch_loop),
            ("sync", self._sync_loop),
            ("watchdog", self._watchdog_loop),
            ("tunnel", self._tunnel.run),
        ):
            thread = threading.Thread(target=self._guard(name, target), name=f"client-{name}", daemon=True)
            self._threads.append(thread)
            thread.start()
        self._log.info(
            "client.started",
            servers=list(self._cfg.servers),
            drivers=sorted(self._drivers),
            cpu_mhz=fp.cpu_mhz,
            memory_mb=fp.memory_mb,
            restored=len(self._runners),
        )

    def stop(self, *, leave_tasks_running: bool = False, timeout_s: float | None = None) -> None:
        """Shut down. Kills every task unless ``leave_tasks_running`` (agent restart/upgrade).

        Waits at most ``timeout_s`` (default: the longest kill_timeout + stop_grace_s) for
        tasks to die, then makes one last attempt to deliver queued updates.
        """
        if not self._started or self._stopped:
            return
        self._stopped = True
        self._stopping.set()
        self._wake_heartbeat.set()
        self._service_watch.stop()
        with self._runners_lock:
            runners = list(self._runners.values())
            retired = list(self._retired)
        if leave_tasks_running:
            for r in runners:
                r.detach()
        else:
            for r in runners:
                r.stop("client agent shutting down")
        budget = timeout_s if timeout_s is not None else self._stop_budget_s(runners + retired)
        deadline = self._clock.monotonic_ns() + int(budget * 1e9)
        for r in runners + retired:
            remaining = max(0.0, (deadline - self._clock.monotonic_ns()) / 1e9)
            if not r.join(remaining):
                self._log.warning("client.stop_task_timeout", alloc_id=r.alloc_id)
        for thread in self._threads:
            if thread.name in ("client-sync", "client-watchdog"):
                thread.join(self._tuning.rpc_timeout_s + 1.0)
        self._flush_final()
        if self._tunnel is not None:
            self._tunnel.stop()
        self._rpc.close()
        self._pool.close()
        if not self._service_watch.join(self._tuning.rpc_timeout_s + 1.0):
            self._log.warning("client.thread_did_not_stop", thread="services-watch")
        for thread in self._threads:
            thread.join(self._tuning.rpc_timeout_s + 1.0)
            if thread.is_alive():
                self._log.warning("client.thread_did_not_stop", thread=thread.name)
        self._log.info("client.stopped", tasks_left_running=leave_tasks_running)

    def _stop_budget_s(self, runners: Sequence[AllocRunner]) -> float:
        longest = max((r.longest_kill_timeout_ns() for r in runners), default=0)
        return longest / 1e9 + self._tuning.stop_grace_s

    def _flush_final(self) -> None:
        if not self._registered.is_set():
            return
        batch = self._pending.take()
        if not batch:
            return
        try:
            self._rpc.update_allocs(self.node_id, self.secret_id, batch)
        except ClientAgentError as exc:
            self._log.warning("client.final_sync_failed", error=str(exc), allocs=len(batch))

    def _guard(self, name: str, target: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            try:
                target()
            except Exception:
                # A loop that dies would silently stop heartbeats or reports: say so loudly.
                self._log.exception("client.loop_crashed", loop=name)

        return run

    # -- node meta ---------------------------------------------------------------------

    def read_meta(self) -> api_pb2.NodeMetaResponse:
        """The node's meta: static (config), dynamic (``node meta apply``) and merged."""
        with self._state_lock:
            dynamic = dict(self._dynamic_meta)
        static = dict(self._cfg.meta)
        return api_pb2.NodeMetaResponse(meta=merge_meta(static, dynamic), static=static, dynamic=dynamic)

    def apply_meta(
        self, set_: Mapping[str, str], unset: Sequence[str], *, timeout_s: float = 10.0
    ) -> api_pb2.NodeMetaResponse:
        """Store a dynamic meta change, then register the node with it; returns once a
        Register carrying it succeeded (or ``timeout_s`` passed: it is then sent with the
        next one, as the change is already on disk)."""
        assert self._store is not None and self._node is not None
        with self._state_lock:
            dynamic = apply_meta_change(self._dynamic_meta, set_, unset)
            self._store.put_dynamic_meta(dynamic)
            self._dynamic_meta = dynamic
            node = structs_pb2.Node()
            node.CopyFrom(self._node)
            node.meta.clear()
            node.meta.update(merge_meta(self._cfg.meta, dynamic))
            self._node = node
            self._node_generation += 1
            generation = self._node_generation
        self._log.info("client.meta_applied", set=sorted(set_), unset=sorted(unset))
        self._need_register.set()
        self._wake_heartbeat.set()
        deadline = self._clock.monotonic_ns() + int(timeout_s * 1e9)
        with self._registered_cond:
            while self._registered_generation < generation and not self._stopping.is_set():
                left = (deadline - self._clock.monotonic_ns()) / 1e9
                if left <= 0:
                    break
                self._registered_cond.wait(min(left, 0.5))
        return self.read_meta()

    def _require_identity(self) -> NodeIdentity:
        if self._identity is None:
            raise ClientAgentError("the agent has not been started")
        return self._identity

    # -- runners -----------------------------------------------------------------------

    def _on_alloc_update(self, status: AllocStatus) -> None:
        self._pending.put(status)

    def _new_runner(
        self, alloc: structs_pb2.Allocation, job: structs_pb2.Job | None, record: AllocRecord | None = None
    ) -> AllocRunner:
        """A runner wired to this agent; with ``record`` (a previous agent's), the same wiring,
        so a restored alloc reports and resolves services exactly as a new one does."""
        assert self._store is not None
        return AllocRunner(
            alloc,
            job,
            drivers=self._drivers,
            store=self._store,
            clock=self._clock,
            rng=self._rng,
            on_update=self._on_alloc_update,
            record=record,
            node=self._node,
            services=self._subscriber(alloc),
        )

    def _subscriber(self, alloc: structs_pb2.Allocation) -> Callable[[], AllocServices]:
        """How ``alloc``'s runner joins the agent's one service watch (when it has templates)."""
        return lambda: self._service_watch.subscribe(alloc.id, alloc.namespace)

    def _fetch_services(
        self,
        alloc_id: str,
        names: Sequence[str],
        min_index: int,
        wait_s: float,
        cancel: threading.Event | None,
    ) -> tuple[Sequence[structs_pb2.ServiceRegistration], int]:
        """A read for the service watch: as ``alloc_id`` (its namespace), with this node's
        secret, from any server."""
        resp = self._rpc.service_registrations(
            self.node_id,
            self.secret_id,
            alloc_id,
            names,
            min_index=min_index,
            wait_s=wait_s,
            cancel=cancel,
        )
        return resp.registrations, resp.meta.index

    def _restore(self) -> None:
        assert self._store is not None
        for record in self._store.load_allocs():
            runner = self._new_runner(record.alloc, record.job, record)
            with self._runners_lock:
                self._runners[runner.alloc_id] = runner
            self._log.info("client.alloc_restored", alloc_id=runner.alloc_id, stopping=record.stop_requested)
            runner.start()

    def _apply_allocs(self, resp: api_pb2.ClientAllocsResponse) -> None:
        by_id = {a.id: a for a in resp.allocs}
        with self._runners_lock:
            local = {
                alloc_id: LocalAlloc(alloc_id, r.alloc.alloc_modify_index, r.stop_requested)
                for alloc_id, r in self._runners.items()
            }
        diff = diff_allocs(
            (ServerAlloc(a.id, a.desired_status, a.client_status, a.alloc_modify_index) for a in resp.allocs),
            local,
        )
        self._note_rewinds(diff.rewound, by_id)
        if diff.empty:
            return
        self._log.info("client.allocs_changed", index=resp.meta.index, **diff.log_fields())

        def job_of(alloc: structs_pb2.Allocation) -> structs_pb2.Job | None:
            key = job_key(alloc)
            return resp.jobs.get(key)

        for alloc_id in diff.start:
            alloc = by_id[alloc_id]
            runner = self._new_runner(alloc, job_of(alloc))
            with self._runners_lock:
                if self._stopping.is_set():
                    return
                self._runners[alloc_id] = runner
            self._log.info("client.alloc_start", alloc_id=alloc_id, job_id=alloc.job_id)
            runner.start()
        for alloc_id in diff.update:
            maybe = self.runner(alloc_id)
            if maybe is not None:
                maybe.update(by_id[alloc_id], job_of(by_id[alloc_id]))
        for alloc_id in diff.reconnect:
            maybe = self.runner(alloc_id)
            if maybe is not None:
                maybe.reconnect()
        for alloc_id in diff.stop:
            maybe = self.runner(alloc_id)
            if maybe is not None:
                alloc = by_id[alloc_id]
                maybe.update(alloc, job_of(alloc))
                maybe.stop(f"alloc desired status is {alloc.desired_status}")
        for alloc_id in diff.remove:
            with self._runners_lock:
                gone = self._runners.pop(alloc_id, None)
                if gone is not None:
                    self._retired.append(gone)
            self._pending.discard(alloc_id)
            if gone is not None:
                self._log.info("client.alloc_removed", alloc_id=alloc_id)
                gone.destroy()

    def _note_rewinds(self, rewound: Sequence[str], by_id: Mapping[str, structs_pb2.Allocation]) -> None:
        """The servers' state went backwards (a snapshot restore): register again, which
        resends every alloc's status, so the clients' real states win. Once per server copy:
        the runner keeps its newer copy, so the same answer must not trigger it twice."""
        fresh = [
            alloc_id
            for alloc_id in rewound
            if self._rewinds_handled.get(alloc_id) != by_id[alloc_id].alloc_modify_index
        ]
        if not fresh:
            return
        for alloc_id in fresh:
            self._rewinds_handled[alloc_id] = by_id[alloc_id].alloc_modify_index
        self._state_rewound(f"{len(fresh)} alloc(s) older on the servers than here")

    def _state_rewound(self, why: str) -> None:
        self._log.warning("client.state_rewound", why=why)
        self._need_register.set()
        self._wake_heartbeat.set()

    # -- loops -------------------------------------------------------------------------

    def _heartbeat_loop(self) -> None:
        t = self._tuning
        backoff = Backoff(t.backoff_base_s, t.backoff_cap_s, self._rng)
        node_id, secret = self.node_id, self.secret_id
        while not self._stopping.is_set():
            if not self._need_register.is_set() and self._heartbeat_overdue():
                # The servers may have marked the node down meanwhile (this process was
                # paused, or heartbeats were slow): register, which also resends everything.
                self._log.warning("client.heartbeat_overdue", ttl_s=self.heartbeat_ttl_ns / 1e9)
                self._need_register.set()
            registering = self._need_register.is_set()
            try:
                if registering:
                    with self._state_lock:
                        node, generation = self._node, self._node_generation
                    assert node is not None
                    ttl_ns = self._rpc.register(node)
                else:
                    timeout_s = heartbeat_timeout_s(self._ttl_left_s(), t.rpc_timeout_s)
                    ttl_ns = self._rpc.heartbeat(node_id, secret, timeout_s=timeout_s)
            except ServerUnreachable as exc:
                self._lost_contact(str(exc))
                delay = min(backoff.next(), heartbeat_interval_s(self.heartbeat_ttl_ns, t.default_ttl_ns))
            except (NotFound, Refused) as exc:
                self._log.warning("client.must_register", error=str(exc))
                self._lost_contact(str(exc))
                delay = backoff.next()
            except RequestRejected as exc:
                # INVALID_ARGUMENT, a secret conflict...: retrying fast will not help.
                self._log.error("client.heartbeat_rejected", error=str(exc), registering=registering)
                delay = backoff.next()
            else:
                backoff.reset()
                if registering:
                    with self._registered_cond:
                        self._registered_generation = max(self._registered_generation, generation)
                        self._registered_cond.notify_all()
                self._heartbeat_ok(ttl_ns, registered_now=registering)
                delay = heartbeat_interval_s(ttl_ns, t.default_ttl_ns)
                with self._state_lock:
                    stale = registering and generation < self._node_generation
                if stale:
                    # The meta changed while that Register was on its way: send the new one.
                    self._need_register.set()
                    delay = 0.0
            if self._wake_heartbeat.wait(delay):
                self._wake_heartbeat.clear()

    def _ttl_left_locked_ns(self) -> int:
        """How long until the TTL the servers granted with the last good heartbeat runs out
        (negative once it has); the caller holds ``_state_lock``."""
        return self._last_heartbeat_ok_ns + self._ttl_ns - self._clock.monotonic_ns()

    def _ttl_left_s(self) -> float:
        with self._state_lock:
            return self._ttl_left_locked_ns() / 1e9

    def _heartbeat_overdue(self) -> bool:
        with self._state_lock:
            return self._registrations > 0 and self._ttl_left_locked_ns() < 0

    def _heartbeat_ok(self, ttl_ns: int, *, registered_now: bool) -> None:
        with self._state_lock:
            self._ttl_ns = ttl_ns if ttl_ns > 0 else self._tuning.default_ttl_ns
            self._last_heartbeat_ok_ns = self._clock.monotonic_ns()
            self._heartbeats_ok += 1
            offline_ns = 0
            if self._disconnected_since_ns:
                offline_ns = self._clock.monotonic_ns() - self._disconnected_since_ns
                self._disconnected_since_ns = 0
            if registered_now:
                self._registrations += 1
        if registered_now:
            self._need_register.clear()
            self._log.info(
                "client.registered",
                ttl_s=ttl_ns / 1e9,
                server=self._pool.current(),
                offline_s=offline_ns / 1e9,
            )
            # Register first, then resend everything: a server that marked the node down
            # refused every update until now, and may have marked allocs unknown or lost.
            self._resend_all()
            self._registered.set()

    def _lost_contact(self, error: str) -> None:
        with self._state_lock:
            first = self._disconnected_since_ns == 0
            if first:
                self._disconnected_since_ns = self._clock.monotonic_ns()
        self._registered.clear()
        self._need_register.set()
        if first:
            self._log.warning("client.servers_unreachable", error=error, next_server=self._pool.current())

    def _resend_all(self) -> None:
        with self._runners_lock:
            runners = list(self._runners.values())
        for r in runners:
            self._pending.put(r.status())

    def _watch_loop(self) -> None:
        t = self._tuning
        backoff = Backoff(t.backoff_base_s, t.backoff_cap_s, self._rng)
        node_id, secret = self.node_id, self.secret_id
        min_index = 0
        while not self._stopping.is_set():
            if not self._registered.wait(0.5):
                continue
            try:
                resp = self._rpc.get_allocs(node_id, secret, min_index=min_index, wait_s=t.watch_wait_s)
            except ClientAgentError as exc:
                if not self._stopping.is_set():
                    self._log.debug("client.watch_failed", error=str(exc))
                    self._stopping.wait(backoff.next())
                continue
            backoff.reset()
            if self._stopping.is_set():
                return
            self._apply_allocs(resp)
            new_index = max(int(resp.meta.index), 1)
            if new_index < min_index:
                self._state_rewound(f"state index went back from {min_index} to {new_index}")
            if new_index == min_index:
                # Nothing moved (the wait ran out): do not spin on a server that answers early.
                self._stopping.wait(t.sync_interval_s)
            min_index = new_index

    def _sync_loop(self) -> None:
        t = self._tuning
        backoff = Backoff(t.backoff_base_s, t.backoff_cap_s, self._rng)
        while not self._stopping.wait(t.sync_interval_s):
            if not self._registered.is_set() or not len(self._pending):
                continue
            batch = self._pending.take()
            if not batch:
                continue
            try:
                self._rpc.update_allocs(self.node_id, self.secret_id, batch)
            except ServerUnreachable as exc:
                self._pending.restore(batch)
                self._log.debug("client.sync_failed", error=str(exc), allocs=len(batch))
                self._stopping.wait(backoff.next())
                continue
            except Refused as exc:
                # The servers consider the node down: register again, then everything is resent.
                self._pending.restore(batch)
                self._log.warning("client.sync_refused", error=str(exc))
                self._registered.clear()
                self._need_register.set()
                self._wake_heartbeat.set()
                continue
            except NotFound:
                self._send_one_by_one(batch)
                continue
            except RequestRejected as exc:
                ids = [s.alloc_id for s in batch]
                if exc.code == "INVALID_ARGUMENT":
                    # The same request would fail the same way; the next change is sent anew.
                    self._log.error("client.sync_invalid", error=str(exc), allocs=ids)
                else:
                    self._pending.restore(batch)
                    self._log.warning("client.sync_rejected", error=str(exc), allocs=ids)
                    self._stopping.wait(backoff.next())
                continue
            backoff.reset()
            self._log.debug("client.synced", allocs=len(batch))

    def _send_one_by_one(self, batch: list[AllocStatus]) -> None:
        """A batch named an alloc the servers do not know: deliver the others, drop that one."""
        for i, status in enumerate(batch):
            try:
                self._rpc.update_allocs(self.node_id, self.secret_id, [status])
            except NotFound as exc:
                self._log.warning("client.sync_unknown_alloc", alloc_id=status.alloc_id, error=str(exc))
            except ClientAgentError:
                self._pending.restore(batch[i:])
                return

    def _watchdog_loop(self) -> None:
        while not self._stopping.wait(self._tuning.watchdog_interval_s):
            with self._runners_lock:
                candidates = {
                    alloc_id: r.stop_on_client_after_ns
                    for alloc_id, r in self._runners.items()
                    if not r.stop_requested
                }
            if not any(candidates.values()):
                continue
            with self._state_lock:
                last_ok = self._last_heartbeat_ok_ns
            now = self._clock.monotonic_ns()
            for alloc_id in allocs_to_stop_after_disconnect(now, last_ok, candidates):
                maybe = self.runner(alloc_id)
                if maybe is None:
                    continue
                silent_s = (now - last_ok) / 1e9
                self._log.warning("client.stop_on_client_after", alloc_id=alloc_id, silent_s=silent_s)
                maybe.stop(
                    f"stopped by the client: no heartbeat for {silent_s:.1f}s "
                    f"(stop_on_client_after {candidates[alloc_id] / 1e9:g}s)"
                )


def start_embedded_client(servers: list[str], data_dir: str, node_name: str) -> ClientAgent:
    """A started client agent inside the calling process (``drover agent -dev``).

    Logging is left as the caller configured it. Stop it with ``stop()`` (which kills its
    tasks, as a dev agent should). raw_exec is on: ``-dev`` is one developer's own machine,
    as with Nomad's ``-dev``.
    """
    settings = EmbeddedSettings(
        node_name=node_name, data_dir=data_dir, servers=tuple(servers), enable_raw_exec=True
    )
    agent = ClientAgent(settings)
    agent.start()
    return agent


def run_client(cfg: ProcessSettings) -> int:
    """The ``drover agent -client`` process: run until SIGINT/SIGTERM; the exit status.

    With ``cfg.tls`` it talks to the servers over TLS (read and checked here, before
    anything starts).

    On a signal the agent stops and leaves its tasks running, as Nomad's client does: a
    restarted agent on the same data_dir re-attaches to them.
    """
    configure_logging(json=cfg.log_json, level=cfg.log_level)
    if not cfg.servers:
        print("Error: the client agent needs -servers (at least one server address)", flush=True)
        return 1
    try:
        tls = cfg.tls
        tls_material = tls.load() if tls is not None else None
    except TLSError as exc:
        log.error("client.start_failed", error=str(exc))
        print(f"Error: {exc}", flush=True)
        return 1
    stop = threading.Event()

    def handler(signum: int, _frame: FrameType | None) -> None:
        log.info("client.signal", signal=signal.Signals(signum).name)
        stop.set()

    try:
        signal.signal(signal.SIGINT, handler)
        signal.signal(signal.SIGTERM, handler)
    except ValueError:
        pass  # not the main thread: the caller owns signals
    agent = ClientAgent(cfg, tls=tls_material)
    try:
        http = open_client_endpoint(agent, cfg)
    except OSError as exc:
        message = f"can not bind HTTP to {cfg.bind}:{cfg.http_port}: {exc.strerror or exc} (see -http-port)"
        log.error("client.start_failed", error=message)
        print(f"Error: {message}", flush=True)
        return 1
    try:
        agent.start()
    except (StateError, OSError) as exc:
        http.stop()
        log.error("client.start_failed", error=str(exc))
        print(f"Error: {exc}", flush=True)
        return 1
    http.start()
    try:
        while not stop.wait(1.0):
            pass
    finally:
        http.stop()
        agent.stop(leave_tasks_running=True)
    return 0
