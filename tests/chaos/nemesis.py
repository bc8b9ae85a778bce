"""The nemesis: a fault schedule planned from a seed, run against a LocalCluster.

``plan_schedule(seed, servers, ...)`` is pure: the same seed gives the same list of
``Fault``s (kinds, targets, hold and gap durations). Targets are roles ("leader",
"follower #k"), resolved when the fault runs, since who leads then depends on elections;
the timeline records what they resolved to.

Faults (every other one is a leader SIGKILL, so a run of M minutes has a known share):

* ``kill-leader`` / ``kill-follower``: SIGKILL, down for ``hold_s``, restarted from its
  data dir;
* ``pause``: SIGSTOP for ``hold_s`` (longer than an election timeout, so a paused leader
  is deposed and comes back as a stale leader), then SIGCONT;
* ``restart``: SIGTERM and start again at once from the data dir (a clean shutdown path);
* ``partition``: the server's raft traffic to and from every other server is dropped for
  ``hold_s`` (tests/chaos/partition.py), then healed;
* ``kill-two`` (5 servers): the leader and a follower SIGKILLed together;
* ``cut-client`` (with real client agents, tests/chaos/clients.py): every connection of
  one client agent is cut at its proxies until the servers have marked its node
  disconnected and its alloc unknown, for ``hold_s`` more, then healed; the fault ends
  once the agent is back and its alloc runs again. The client's tasks are observed before
  the cut and after the reconnect (a ``Window`` for the check that kept allocs keep their
  IDs and processes, docs/design.md#invariant-5). The second fault of a
  schedule is always one, so even a short run has a reconnect to check;
* ``disagree`` (with disagreements enabled): the plan applier starts to see the workload's
  ``node-shrinks`` with almost no capacity while the state still shows what it registered
  (tests/chaos/disagreement.py), and the nemesis registers a new version of its own system
  job, so the scheduler places on that node and the applier refuses, again and again, until
  the rejection tracker marks the node ineligible (docs/design.md#invariant-6). Then the
  applier agrees again and the nemesis, as an operator would, makes the node eligible. The
  fourth fault of a schedule is always one, so even a short run exercises the bound.

Never more than ``(servers - 1) // 2`` servers are down, paused or cut off at once: each
fault heals before the next begins, and only ``kill-two`` takes two.

A client cut or a disagreement takes no server: it counts against nothing, and no server
fault runs during it.

After a leader SIGKILL the nemesis waits for the next acknowledged write before its next
fault, so every failover is measured on its own (kill to first acknowledged write).
"""

from __future__ import annotations

import random
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final

from deploy.cluster import ClusterError, LocalCluster, wait_for
from drover.sdk import DroverError
from tests.chaos.clients import DISCONNECT_TIMEOUT_S, LOST_AFTER_S, RECONNECT_TIMEOUT_S, RealClients, Window
from tests.chaos.disagreement import Disagreement, DisagreementControl
from tests.chaos.history import History
from tests.chaos.partition import PartitionControl
from tests.chaos.workload import SHRINK_NODE, Caller, WorkloadConfig, build_job, record_write

KILL_LEADER: Final = "kill-leader"
KILL_FOLLOWER: Final = "kill-follower"
PAUSE: Final = "pause"
RESTART: Final = "restart"
PARTITION: Final = "partition"
KILL_TWO: Final = "kill-two"
CUT_CLIENT: Final = "cut-client"
DISAGREE: Final = "disagree"
# The nemesis' own system job: a new version of it places on every node, the shrunk one too.
DISAGREE_JOB: Final = "nemesis-system-0"
# How long the tracker may take to end a disagreement (its threshold of rejections, each a
# plan round trip) before the fault gives up and reports it.
DISAGREE_TIMEOUT_S: Final = 60.0
DISAGREE_HOLD_S: Final = (0.5, 2.0)

RECOVERY_TIMEOUT_S: Final = 60.0
# How long a cut client stays cut once its node is marked disconnected.
CUT_HOLD_S: Final = (1.0, 3.0)
CUT_HOLD_QUICK_S: Final = (1.0, 2.0)
# A cut never outlasts lost_after: the alloc must stay unknown, never become lost.
assert DISCONNECT_TIMEOUT_S + max(CUT_HOLD_S) < LOST_AFTER_S


@dataclass(frozen=True, slots=True)
class Fault:
    kind: str
    target: str  # "leader", "follower" or "client"
    # Which follower (index into the sorted followers, modulo their number), or which client.
    pick: int
    hold_s: float
    gap_s: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "target": self.target,
            "pick": self.pick,
            "hold_s": round(self.hold_s, 3),
            "gap_s": round(self.gap_s, 3),
        }


def plan_schedule(
    seed: int,
    servers: int,
    *,
    count: int = 400,
    quick: bool = False,
    partitions: bool = True,
    clients: int = 0,
    disagreements: bool = False,
) -> list[Fault]:
    """``count`` faults from ``seed``: even positions kill the leader, odd ones are drawn
    from the other kinds; with ``clients`` the second fault cuts a client, with
    ``disagreements`` the fourth provokes a plan disagreement. The runner stops when its
    time is up. Without clients and disagreements the draws are those of a schedule before
    either existed, so an old seed replays the same faults."""
    rng = random.Random(f"nemesis:{seed}:{servers}")
    gap = (0.5, 1.5) if quick else (0.5, 2.5)
    kill_hold = (0.5, 2.5) if quick else (1.0, 4.0)
    pause_hold = (3.0, 5.0) if quick else (3.0, 10.0)
    cut_hold = CUT_HOLD_QUICK_S if quick else CUT_HOLD_S
    others: list[tuple[str, int]] = [(KILL_FOLLOWER, 3), (PAUSE, 4), (RESTART, 2)]
    if partitions:
        others.append((PARTITION, 3))
    if servers >= 5:
        others.append((KILL_TWO, 2))
    if clients:
        others.append((CUT_CLIENT, 2))
    if disagreements:
        others.append((DISAGREE, 2))
    faults = []
    for n in range(count):
        if n % 2 == 0:
            kind = KILL_LEADER
        elif clients and n == 1:
            kind = CUT_CLIENT
        elif disagreements and n == 3:
            kind = DISAGREE
        else:
            kind = rng.choices([k for k, _ in others], [w for _, w in others])[0]
        target = "leader"
        if kind in (KILL_FOLLOWER, KILL_TWO):
            target = "follower"
        elif kind == CUT_CLIENT:
            target = "client"
        elif kind == DISAGREE:
            target = "node"
        elif kind in (PAUSE, RESTART, PARTITION):
            target = rng.choice(["leader", "follower"])
        if kind == CUT_CLIENT:
            hold, pick = rng.uniform(*cut_hold), rng.randrange(clients)
        elif kind == DISAGREE:
            hold, pick = rng.uniform(*DISAGREE_HOLD_S), 0
        else:
            hold = rng.uniform(*(pause_hold if kind in (PAUSE, PARTITION) else kill_hold))
            pick = rng.randrange(servers)
        faults.append(Fault(kind, target, pick, hold, rng.uniform(*gap)))
    return faults


@dataclass
class Failover:
    """One leader SIGKILL. Its duration runs to the first acknowledged write committed by a
    later leader: during the run that is judged by index (above the killed leader's commit
    index a moment before the kill, which a write it was still committing can pass), and
    afterwards, by ``measure``, exactly, by the raft term of the acknowledged index."""

    server: str
    t_kill: float
    commit_index: int
    term: int = 0
    t_elected: float | None = None
    new_leader: str = ""
    t_first_ack: float | None = None
    by_term: bool = False

    def measure(self, history: History, terms: dict[int, int]) -> None:
        """Recompute ``t_first_ack`` with the journals' terms (index -> term); indexes the
        journals no longer hold (compacted) fall back to the commit-index rule."""
        best: float | None = None
        for op in history.ops():
            if not op.ok or op.t_complete <= self.t_kill:
                continue
            term = terms.get(op.index)
            later = term > self.term if term is not None else op.index > self.commit_index
            if later and (best is None or op.t_complete < best):
                best = op.t_complete
        if best is not None:
            self.t_first_ack, self.by_term = best, True

    @property
    def duration_s(self) -> float | None:
        return None if self.t_first_ack is None else self.t_first_ack - self.t_kill

    def to_dict(self) -> dict[str, Any]:
        return {
            "server": self.server,
            "t_kill": round(self.t_kill, 3),
            "commit_index_at_kill": self.commit_index,
            "election_s": None if self.t_elected is None else round(self.t_elected - self.t_kill, 3),
            "new_leader": self.new_leader,
            "duration_s": None if self.duration_s is None else round(self.duration_s, 3),
            "term_at_kill": self.term,
            "measured_by_term": self.by_term,
        }


@dataclass
class Nemesis:
    cluster: LocalCluster
    history: History
    schedule: list[Fault]
    partitions: PartitionControl | None = None
    clients: RealClients | None = None
    disagreement: DisagreementControl | None = None
    timeline: list[dict[str, Any]] = field(default_factory=list)
    failovers: list[Failover] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)
    # One per client cut: the tasks before it and after the reconnect.
    reconnects: list[Window] = field(default_factory=list)
    # One per plan disagreement provoked.
    disagreements: list[Disagreement] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._down: set[int] = set()
        self._paused: set[int] = set()
        self._cut: set[int] = set()
        self._cut_clients: set[str] = set()
        self._shrunk: str | None = None
        self._job_versions = 0
        self._leader = ""

    @property
    def names(self) -> list[str]:
        return self.cluster.server_names

    def note(self, event: str, server: int | None = None, **detail: Any) -> None:
        entry: dict[str, Any] = {"t": round(self.history.now(), 3), "event": event}
        if server is not None:
            entry["server"] = self.names[server]
        entry.update(detail)
        self.timeline.append(entry)

    def stop(self) -> None:
        self._stop.set()

    # -- the run -----------------------------------------------------------------------
    def run(self, duration_s: float) -> None:
        """Run faults from the schedule until ``duration_s`` has passed, then heal all."""
        deadline = self.history.now() + duration_s
        try:
            for fault in self.schedule:
                if self._stop.wait(fault.gap_s) or self.history.now() >= deadline:
                    break
                self._run_one(fault)
                self.counts[fault.kind] = self.counts.get(fault.kind, 0) + 1
                if self.history.now() >= deadline:
                    break
        finally:
            self.heal_all()

    def _max_down(self) -> int:
        return (len(self.names) - 1) // 2

    def _run_one(self, fault: Fault) -> None:
        # Roles are resolved now, once exactly one server leads.
        leader = self.cluster.leader_index(timeout=RECOVERY_TIMEOUT_S)
        if self.names[leader] != self._leader:
            self._leader = self.names[leader]
            self.note("leader", leader)
        followers = [i for i in range(len(self.names)) if i != leader]
        follower = followers[fault.pick % len(followers)]
        target = leader if fault.target == "leader" else follower
        healed = not (self._down or self._paused or self._cut or self._cut_clients or self._shrunk)
        assert healed, "a fault started before the last one healed"
        if fault.kind == KILL_LEADER:
            self._kill_leader(leader, fault.hold_s)
        elif fault.kind == KILL_FOLLOWER:
            self._kill(target, fault.hold_s)
        elif fault.kind == KILL_TWO:
            assert self._max_down() >= 2
            self._kill_leader(leader, fault.hold_s, also=target)
        elif fault.kind == PAUSE:
            self._pause(target, fault.target, fault.hold_s)
        elif fault.kind == RESTART:
            self._restart(target, fault.target)
        elif fault.kind == PARTITION:
            self._partition(target, fault.target, fault.hold_s)
        elif fault.kind == CUT_CLIENT:
            self._cut_client(fault.pick, fault.hold_s)
        elif fault.kind == DISAGREE:
            self._disagree(fault.hold_s)
        else:  # pragma: no cover - plan_schedule makes only the kinds above
            raise ValueError(f"unknown fault {fault.kind!r}")

    # -- faults ------------------------------------------------------------------------
    def _sigkill(self, i: int, **detail: Any) -> None:
        assert len(self._down | self._paused | self._cut | {i}) <= self._max_down()
        self.cluster.kill(i, signal.SIGKILL)
        self._down.add(i)
        self.note("sigkill", i, **detail)

    def _start_again(self, i: int) -> None:
        self.cluster.restart(i)
        self._down.discard(i)
        self.note("restart", i)
        wait_for(
            lambda: self.cluster.query_digest(i) is not None,
            RECOVERY_TIMEOUT_S,
            message=f"{self.names[i]} to answer after its restart",
        )
        self.note("answering", i)

    def _kill_leader(self, leader: int, hold_s: float, also: int | None = None) -> None:
        answer = self.cluster.query_digest(leader)
        commit_index = answer.commit_index if answer is not None else 0
        term = answer.term if answer is not None else 0
        failover = Failover(self.names[leader], self.history.now(), commit_index, term)
        self._sigkill(leader, role="leader", commit_index=commit_index)
        if also is not None:
            self._sigkill(also, role="follower")
        self.failovers.append(failover)
        failover.new_leader = self.cluster.wait_for_leader(RECOVERY_TIMEOUT_S)
        failover.t_elected = self.history.now()
        self._leader = failover.new_leader
        self.note("leader-elected", self.names.index(failover.new_leader))
        self._hold(failover.t_kill + hold_s)
        for i in sorted(self._down):
            self._start_again(i)
        # One failover at a time: the next fault waits for this one's first acknowledged write.
        ack = wait_for(
            lambda: self.history.first_ack_after(failover.t_kill, commit_index),
            RECOVERY_TIMEOUT_S,
            message=f"an acknowledged write after killing {failover.server}",
        )
        assert ack is not None
        failover.t_first_ack = ack.t_complete
        self.note(
            "first-ack", None, after=failover.server, duration_s=round(ack.t_complete - failover.t_kill, 3)
        )

    def _kill(self, i: int, hold_s: float) -> None:
        t0 = self.history.now()
        self._sigkill(i, role="follower")
        self._hold(t0 + hold_s)
        self._start_again(i)

    def _pause(self, i: int, role: str, hold_s: float) -> None:
        assert len(self._down | self._paused | self._cut | {i}) <= self._max_down()
        t0 = self.history.now()
        self.cluster.pause(i)
        self._paused.add(i)
        self.note("sigstop", i, role=role)
        self._hold(t0 + hold_s)
        self.cluster.resume(i)
        self._paused.discard(i)
        self.note("sigcont", i)

    def _restart(self, i: int, role: str) -> None:
        self.note("sigterm", i, role=role)
        self._down.add(i)
        status = self.cluster.stop(i)
        self.note("stopped", i, status=status)
        self._start_again(i)

    def _partition(self, i: int, role: str, hold_s: float) -> None:
        if self.partitions is None:
            raise ClusterError("partition fault planned without a partition control")
        assert len(self._down | self._paused | self._cut | {i}) <= self._max_down()
        t0 = self.history.now()
        self.partitions.isolate(self.names[i])
        self._cut.add(i)
        self.note("partition", i, role=role)
        self._hold(t0 + hold_s)
        self.partitions.heal()
        self._cut.discard(i)
        self.note("heal", i)

    def _cut_client(self, pick: int, hold_s: float) -> None:
        """Cut one client agent off; every wait is bounded, and what did not happen in time
        goes into the window's problems (the checker fails on them) instead of raising, so
        the run goes on and heals."""
        clients = self.clients
        if clients is None:
            raise ClusterError("client cut planned without real clients")
        name = clients.names[pick % len(clients.names)]
        window = Window("cut", name)
        self.reconnects.append(window)
        window.before, problem = clients.wait_settled(RECONNECT_TIMEOUT_S, [name])
        if problem:
            window.problems.append(f"before the cut: {problem}")
        window.t_before = self.history.now()
        running = {t.alloc_id for t in window.before if t.runs}
        clients.cut(name)
        self._cut_clients.add(name)
        window.t_cut = self.history.now()
        self.note("cut-client", client=name)
        window.t_disconnected = self._wait_client(
            window,
            lambda: clients.node_statuses().get(name) == "disconnected",
            f"the servers to mark {name} disconnected",
        )
        if window.t_disconnected is not None:
            self.note("client-disconnected", client=name)

        def all_unknown() -> bool:
            seen = clients.observe([name])
            return seen is not None and all(
                t.client_status == "unknown" for t in seen if t.alloc_id in running
            )

        if window.t_disconnected is not None:
            window.t_unknown = self._wait_client(
                window, all_unknown, f"{name}'s running allocs to be unknown"
            )
        self._hold((window.t_unknown or self.history.now()) + hold_s)
        clients.heal(name)
        self._cut_clients.discard(name)
        window.t_heal = self.history.now()
        self.note("heal-client", client=name)
        window.after, problem = clients.wait_settled(RECONNECT_TIMEOUT_S, [name])
        window.t_after = self.history.now()
        if problem:
            window.problems.append(f"after the heal: {problem}")
        else:
            window.t_reconnected = window.t_after
            self.note("client-reconnected", client=name)

    def _wait_client(self, window: Window, predicate: Callable[[], bool], what: str) -> float | None:
        try:
            wait_for(predicate, DISCONNECT_TIMEOUT_S, 0.2, what)
        except TimeoutError as exc:
            window.problems.append(str(exc))
            return None
        return self.history.now()

    def _disagree(self, hold_s: float) -> None:
        """Make the applier disagree about ``SHRINK_NODE`` until the servers mark it
        ineligible; every wait is bounded, and what did not happen in time goes into the
        record's problems (the checker fails on them) instead of raising."""
        control = self.disagreement
        if control is None:
            raise ClusterError("disagreement planned without a disagreement control")
        record = Disagreement(SHRINK_NODE, self.history.now(), time.time())
        self.disagreements.append(record)
        caller = Caller(self.cluster.grpc_addresses, WorkloadConfig(seed=0), 0)
        try:
            # Start from an eligible node: a mark left from the last disagreement (a plan
            # from before its end refused late, or a new leader that had not applied the
            # operator's write yet) would end this one before any plan is refused.
            problem = self._make_eligible(caller, SHRINK_NODE)
            if problem:
                record.problems.append(problem)
                return
            control.shrink(SHRINK_NODE)
            self._shrunk = SHRINK_NODE
            self.note("disagree", node=SHRINK_NODE)
            self._place_everywhere(caller)
            try:
                wait_for(
                    lambda: self._eligibility(caller, SHRINK_NODE) == "ineligible",
                    DISAGREE_TIMEOUT_S,
                    0.2,
                    f"the servers to mark {SHRINK_NODE} ineligible",
                )
                record.t_marked = self.history.now()
                self.note("node-marked-ineligible", node=SHRINK_NODE)
            except TimeoutError as exc:
                record.problems.append(str(exc))
            # Plans made on snapshots from before the mark still arrive for a moment.
            self._hold(self.history.now() + hold_s)
            self._agree(caller, record)
        finally:
            caller.close()
            record.wall_end = time.time()

    def _place_everywhere(self, caller: Caller, attempts: int = 5) -> None:
        """A new version of the nemesis' system job, until one is acknowledged: one new alloc
        on every eligible node. Recorded like the workload's writes, so the checker judges
        it too."""
        for _ in range(attempts):
            self._job_versions += 1
            version = self._job_versions
            kind = "register" if version == 1 else "update-destructive"
            job = build_job(DISAGREE_JOB, "system", count=1, variant=version, seq=version)
            op = record_write(
                self.history,
                caller,
                "nemesis",
                kind,
                DISAGREE_JOB,
                lambda c, job=job: c.register_job(job),
                seq=version,
                type="system",
                count=1,
                variant=version,
            )
            if op.ok:
                return

    def _eligibility(self, caller: Caller, node_id: str) -> str:
        try:
            return caller.call(lambda c: c.get_node(node_id).node.scheduling_eligibility)
        except DroverError:
            return ""

    def _agree(self, caller: Caller, record: Disagreement) -> None:
        """The applier sees the node as registered again; then an operator's eligibility
        write, until one is acknowledged."""
        if self.disagreement is not None:
            self.disagreement.restore()
        self._shrunk = None
        record.t_restored = self.history.now()
        self.note("agree", node=record.node_id)
        problem = self._make_eligible(caller, record.node_id)
        if problem:
            record.problems.append(problem)
        else:
            record.t_eligible = self.history.now()

    def _make_eligible(self, caller: Caller, node_id: str) -> str:
        """An operator's eligibility write for ``node_id`` until one is acknowledged and the
        node reads eligible; "" when it does, else what did not happen in time."""

        def eligible() -> bool:
            if self._eligibility(caller, node_id) == "eligible":
                return True
            record_write(
                self.history,
                caller,
                "nemesis",
                "node-eligible",
                node_id,
                lambda c: c.update_eligibility(node_id, "eligible"),
            )
            return self._eligibility(caller, node_id) == "eligible"

        try:
            wait_for(eligible, RECOVERY_TIMEOUT_S, 0.5, f"{node_id} to be made eligible again")
        except TimeoutError as exc:
            return str(exc)
        self.note("node-eligible", node=node_id)
        return ""

    def _hold(self, until: float) -> None:
        remaining = until - self.history.now()
        if remaining > 0:
            self._stop.wait(remaining)

    def heal_all(self) -> None:
        """Resume, reconnect and restart everything the nemesis left broken."""
        for i in sorted(self._paused):
            self.cluster.resume(i)
            self.note("sigcont", i)
        self._paused.clear()
        if self._cut and self.partitions is not None:
            self.partitions.heal()
            for i in sorted(self._cut):
                self.note("heal", i)
        self._cut.clear()
        if self.clients is not None:
            for name in sorted(self._cut_clients):
                self.clients.heal(name)
                self.note("heal-client", client=name)
        self._cut_clients.clear()
        if self._shrunk is not None and self.disagreements:
            caller = Caller(self.cluster.grpc_addresses, WorkloadConfig(seed=0), 0)
            try:
                self._agree(caller, self.disagreements[-1])
            finally:
                caller.close()
        for i in range(len(self.names)):
            if not self.cluster.is_alive(i):
                self._start_again(i)
        self._down.clear()
