"""Real client agents in a chaos run, each behind its own proxies, and what became of their tasks.

Why real agents: the workload's simulated clients only say what a client would report.
Invariant 5 (docs/design.md#invariant-5: allocs kept across a client reconnect keep their
IDs and processes) is about
what an agent does with its tasks when it loses the servers and finds them again, which
only a real agent running real processes can show.

Each agent (``c1``, ``c2``, ...) is a ``drover.cli agent -client`` process the LocalCluster
starts (``add_client``) with its own ``TcpProxy`` instances as ``-servers``, one in front of
each server's gRPC port (tests/cluster/proxy.py): cutting them partitions that client alone,
while the servers and the other client go on. The agents are in datacenter ``dc2``, so the
workload's mock jobs (dc1) never land on them and no alloc is reported by both a simulated
and a real client. Each agent runs one raw_exec ``sleep`` job pinned to it by a constraint,
whose group's disconnect block keeps a cut-off alloc ``unknown`` (never lost, never
replaced) for far longer than any cut lasts.

The servers run with short heartbeat settings (``SERVER_ARGS``) so a cut client is marked
disconnected within seconds, while the simulated nodes' heartbeats (every second) and the
real agents' (every TTL/2, each call bounded by a 5 s deadline, so a paused server cannot
delay one past TTL + grace) stay well inside the deadline.

What a task is (``observe``): the alloc and its task state as the servers hold them, the
driver handle the agent persisted in ``<data_dir>/client/allocs/<alloc_id>.json`` (pid and
the process's create_time: that file is what a restarted agent re-attaches by), and psutil's
view of that pid (alive, and the same create_time: a reused pid does not match).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Final, TypeVar

import psutil

from deploy.cluster import LocalCluster, kill_processes_working_under, wait_for
from drover.sdk import DroverClient, DroverError
from drover.v1 import structs_pb2
from tests.chaos.workload import Caller, WorkloadConfig
from tests.cluster.jobs import RAW_EXEC_TASK, raw_exec_sleep_job
from tests.cluster.proxy import TcpProxy, proxies_for

T = TypeVar("T")

DATACENTER: Final = "dc2"
TASK: Final = RAW_EXEC_TASK
JOB_PREFIX: Final = "rx-"
LOST_AFTER_S: Final = 600
# The servers' heartbeat settings when real clients take part. A client is told a TTL in
# [1s, 2s) and judged TTL + grace after its last heartbeat, so a cut is noticed within ~9s;
# a new leader gives every node 10s (instead of 5 minutes) before judging it, so a cut right
# after a failover is noticed too.
SERVER_ARGS: Final = (
    "-min-heartbeat-ttl",
    "1s",
    "-heartbeat-grace",
    "7s",
    "-failover-heartbeat-ttl",
    "10s",
)
# Generous next to the ~11s a cut takes to be noticed; far below LOST_AFTER_S.
DISCONNECT_TIMEOUT_S: Final = 45.0
RECONNECT_TIMEOUT_S: Final = 60.0
POLL_S: Final = 0.2
# psutil reads one process's start time identically; the slack absorbs JSON float round trips.
CREATE_TIME_SLACK_S: Final = 0.01


def raw_exec_job(job_id: str, node_name: str) -> structs_pb2.Job:
    """The one ``sleep`` job of agent ``node_name``: pinned to it, in the agents' own
    datacenter, and kept ``unknown`` (never lost, never replaced) through any cut."""
    return raw_exec_sleep_job(
        job_id,
        disconnect=f'lost_after = "{LOST_AFTER_S}s"\n      replace    = false',
        datacenter=DATACENTER,
        pinned_to=node_name,
        sleep_s=3600,
        cpu=50,
        memory_mb=16,
    )


@dataclass(frozen=True, slots=True)
class TaskSeen:
    """One alloc of a real client's raw_exec job, at one moment."""

    alloc_id: str
    job_id: str
    client: str
    desired_status: str
    client_status: str
    # The agent's persisted driver handle (0 when it has none).
    pid: int
    create_time: float
    # That pid is a live process started at create_time.
    alive: bool
    # The servers' task state.
    server_pid: int
    restarts: int
    started_at_ns: int

    @property
    def runs(self) -> bool:
        """Desired and reported running, on a live process the servers know by its pid."""
        return (
            self.desired_status == "run"
            and self.client_status == "running"
            and self.alive
            and self.pid > 0
            and self.server_pid == self.pid
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TaskSeen:
        return cls(**data)


@dataclass
class Window:
    """A stretch every running alloc of the real clients must come through unchanged: one
    client cut (from just before the cut to the settled reconnect), or the whole run
    (``client`` "*"). ``problems`` are what the nemesis saw go wrong meanwhile."""

    kind: str  # "cut" | "run"
    client: str
    t_before: float = 0.0
    before: list[TaskSeen] = field(default_factory=list)
    t_cut: float | None = None
    t_disconnected: float | None = None
    t_unknown: float | None = None
    t_heal: float | None = None
    t_reconnected: float | None = None
    t_after: float = 0.0
    after: list[TaskSeen] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            k: (round(v, 3) if isinstance(v, float) else v)
            for k, v in asdict(self).items()
            if k not in ("before", "after")
        }
        out["before"] = [t.to_dict() for t in self.before]
        out["after"] = [t.to_dict() for t in self.after]
        return out


def _read_handle(data_dir: Path, alloc_id: str) -> tuple[int, float]:
    """(pid, create_time) of the task in the agent's alloc record; (0, 0.0) if none."""
    try:
        record = json.loads((data_dir / "client" / "allocs" / f"{alloc_id}.json").read_text())
        handle = record["tasks"][TASK]["handle"] or {}
        return int(handle.get("pid", 0)), float(handle.get("create_time", 0.0))
    except (OSError, ValueError, KeyError, TypeError):
        return 0, 0.0


def process_alive(pid: int, create_time: float) -> bool:
    """``pid`` is a live (not zombie) process started at ``create_time``."""
    if pid <= 0:
        return False
    try:
        proc = psutil.Process(pid)
        return (
            abs(proc.create_time() - create_time) <= CREATE_TIME_SLACK_S
            and proc.status() != psutil.STATUS_ZOMBIE
        )
    except psutil.Error:
        return False


class RealClients:
    """``count`` client agents of ``cluster``, their proxies and their raw_exec jobs."""

    def __init__(self, cluster: LocalCluster, count: int, config: WorkloadConfig) -> None:
        self.cluster = cluster
        self.names = [f"c{j + 1}" for j in range(count)]
        self.job_ids = {name: f"{JOB_PREFIX}{name}" for name in self.names}
        self.proxies: dict[str, list[TcpProxy]] = {}
        self.node_ids: dict[str, str] = {}
        self._index: dict[str, int] = {}
        self._caller = Caller(cluster.grpc_addresses, config, 0, timeout_s=5.0, retry_deadline_s=10.0)

    # -- lifecycle ---------------------------------------------------------------------
    def start(self) -> None:
        for name in self.names:
            proxies = proxies_for(self.cluster.grpc_addresses, name=f"{name}-proxy")
            self.proxies[name] = proxies
            self._index[name] = self.cluster.add_client(
                name, [p.address for p in proxies], ["-datacenter", DATACENTER]
            )

    def close(self) -> None:
        """Stop the agents (they leave their tasks running), kill the tasks, close the
        proxies, whatever fails on the way."""
        errors: list[BaseException] = []
        for step in (self._stop_agents, self._kill_tasks, self._close_proxies, self._caller.close):
            try:
                step()
            except BaseException as exc:
                errors.append(exc)
        if errors:
            raise errors[0]

    def _stop_agents(self) -> None:
        for j in self._index.values():
            self.cluster.stop_client(j)

    def _kill_tasks(self) -> None:
        """Every process working inside an agent's data dir: the raw_exec tasks."""
        kill_processes_working_under(self.data_dir(name).resolve() for name in self._index)

    def _close_proxies(self) -> None:
        for proxies in self.proxies.values():
            for proxy in proxies:
                proxy.close()

    # -- faults ------------------------------------------------------------------------
    def cut(self, name: str) -> None:
        for proxy in self.proxies[name]:
            proxy.cut()

    def heal(self, name: str) -> None:
        for proxy in self.proxies[name]:
            proxy.heal()

    # -- asking --------------------------------------------------------------------------
    def data_dir(self, name: str) -> Path:
        return self.cluster.client_data_dir(self._index[name])

    def log(self, name: str) -> str:
        return self.cluster.client_log(self._index[name])

    def jobs(self) -> list[structs_pb2.Job]:
        return [raw_exec_job(self.job_ids[name], name) for name in self.names]

    def _ask(self, fn: Callable[[DroverClient], T]) -> T | None:
        try:
            return self._caller.call(fn)
        except DroverError:
            return None

    def node_statuses(self) -> dict[str, str]:
        """Each agent's node status as the leader has it (names missing while unknown)."""
        answer = self._ask(lambda c: c.list_nodes())
        if answer is None:
            return {}
        out = {}
        for node in answer.nodes:
            if node.name in self._index:
                out[node.name] = node.status
                self.node_ids[node.name] = node.id
        return out

    def observe(self, names: Sequence[str] | None = None) -> list[TaskSeen] | None:
        """Every alloc of the named clients' jobs, as the servers, the agent's record and
        the OS have it; None if the servers did not answer."""
        seen = []
        for name in names or self.names:
            job_id = self.job_ids[name]
            answer = self._ask(partial(DroverClient.list_allocs, job_id=job_id))
            if answer is None:
                return None
            for alloc in answer.allocs:
                pid, create_time = _read_handle(self.data_dir(name), alloc.id)
                state = alloc.task_states[TASK] if TASK in alloc.task_states else structs_pb2.TaskState()
                seen.append(
                    TaskSeen(
                        alloc_id=alloc.id,
                        job_id=alloc.job_id,
                        client=name,
                        desired_status=alloc.desired_status,
                        client_status=alloc.client_status,
                        pid=pid,
                        create_time=create_time,
                        alive=process_alive(pid, create_time),
                        server_pid=int(state.pid),
                        restarts=int(state.restarts),
                        started_at_ns=int(state.started_at_ns),
                    )
                )
        return seen

    def settled(self, names: Sequence[str] | None = None) -> list[TaskSeen] | None:
        """The named clients' allocs once each client is ready and every alloc it should
        run runs (``TaskSeen.runs``), at least one per client; None until then."""
        names = list(names or self.names)
        statuses = self.node_statuses()
        if any(statuses.get(name) != "ready" for name in names):
            return None
        seen = self.observe(names)
        if seen is None:
            return None
        for name in names:
            wanted = [t for t in seen if t.client == name and t.desired_status == "run"]
            if not wanted or not all(t.runs for t in wanted):
                return None
        return seen

    def wait_settled(self, timeout: float, names: Sequence[str] | None = None) -> tuple[list[TaskSeen], str]:
        """``settled`` within ``timeout``: (what was seen, "") or (the last observation,
        what was still wrong)."""
        try:
            seen = wait_for(lambda: self.settled(names), timeout, POLL_S)
            assert seen is not None
            return seen, ""
        except TimeoutError:
            statuses = self.node_statuses()
            last = self.observe(names) or []
            described = ", ".join(
                f"{t.client}/{t.alloc_id[:8]} {t.desired_status}/{t.client_status} pid {t.pid} "
                f"(servers: {t.server_pid}, alive: {t.alive})"
                for t in last
            )
            return last, (
                f"not settled within {timeout:g}s: nodes {statuses or 'unanswered'}; "
                f"allocs: {described or 'none'}"
            )
