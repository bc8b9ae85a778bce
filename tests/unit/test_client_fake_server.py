"""An in-process fake of the servers' Nodes service, for the client agent's tests.

``FakeNodes`` is a real gRPC server on a loopback port 0 with just enough of the Nodes
service for a client: Register, UpdateStatus (the heartbeat, also as messages on the
Heartbeat stream the agent keeps open), GetClientAllocs (a real blocking query on a
per-node index), and UpdateAllocs. Tests drive it like the leader would:
``place`` an alloc, ``set_desired`` it to stop, ``remove`` it (garbage collection),
``mark_down`` the node (after which it refuses the node's updates with FAILED_PRECONDITION
until it registers again, as the real servers must), or make every RPC fail with
UNAVAILABLE for a while (``set_unavailable``). Everything it received is recorded. The
other Nodes RPCs answer UNIMPLEMENTED, from the generated servicer base class.

This module also holds the builders and the wait helpers the client tests share; its own
tests check the fake's blocking-query contract, which the agent relies on.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TypeVar

import grpc
import psutil
import pytest

from drover.v1 import api_pb2, api_pb2_grpc, structs_pb2

T = TypeVar("T")

DEFAULT_TTL_NS = 2_000_000_000


def wait_until(predicate: Callable[[], T], timeout: float = 10.0, message: str = "condition") -> T:
    """Poll ``predicate`` until it returns something truthy (and return that) or fail."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {message}")
        time.sleep(0.02)


def alive(pid: int) -> bool:
    """Running or sleeping; a zombie waiting to be reaped counts as gone."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


# --- builders --------------------------------------------------------------------------


def task(
    name: str = "main", driver: str = "mock", config: str = "{}", kill_timeout_ns: int = 0
) -> structs_pb2.Task:
    return structs_pb2.Task(
        name=name,
        driver=driver,
        config_json=config,
        kill_timeout_ns=kill_timeout_ns,
        resources=structs_pb2.Resources(cpu_mhz=100, memory_mb=64),
    )


def job(
    job_id: str = "web",
    *,
    tasks: list[structs_pb2.Task] | None = None,
    job_type: str = "service",
    restart: structs_pb2.RestartPolicy | None = None,
    stop_on_client_after_ns: int = 0,
    version: int = 0,
) -> structs_pb2.Job:
    group = structs_pb2.TaskGroup(name="g", count=1, tasks=tasks or [task(config='{"run_for": "1h"}')])
    if restart is not None:
        group.restart.CopyFrom(restart)
    if stop_on_client_after_ns:
        group.disconnect.stop_on_client_after_ns = stop_on_client_after_ns
    return structs_pb2.Job(
        id=job_id, name=job_id, namespace="default", type=job_type, groups=[group], version=version
    )


def alloc(alloc_id: str, j: structs_pb2.Job, node_id: str = "") -> structs_pb2.Allocation:
    return structs_pb2.Allocation(
        id=alloc_id,
        namespace="default",
        name=f"{j.id}.g[0]",
        node_id=node_id,
        job_id=j.id,
        job_version=j.version,
        task_group="g",
        desired_status="run",
        client_status="pending",
    )


# --- the fake --------------------------------------------------------------------------


@dataclass(frozen=True)
class Heartbeat:
    node_id: str
    at: float


class FakeNodes(api_pb2_grpc.NodesServicer):
    """In-process fake Nodes service (see the module docstring)."""

    def __init__(self, ttl_ns: int = DEFAULT_TTL_NS) -> None:
        self.cond = threading.Condition()
        self.ttl_ns = ttl_ns
        self.unavailable = False
        # How long UpdateStatus holds each answer: a leader slow to take calls.
        self.heartbeat_delay_s = 0.0
        self.nodes: dict[str, structs_pb2.Node] = {}
        self.status: dict[str, str] = {}
        self.registrations: list[structs_pb2.Node] = []
        self.heartbeats: list[Heartbeat] = []
        self.heartbeat_streams = 0  # Nodes.Heartbeat streams opened
        self.beats_per_stream = 0  # > 0: a Heartbeat stream ends after answering that many
        self.allocs: dict[str, structs_pb2.Allocation] = {}
        self.jobs: dict[str, structs_pb2.Job] = {}
        self.update_requests: list[api_pb2.AllocUpdateRequest] = []
        self.update_times: list[float] = []
        # Every RPC the fake answered or refused, in order: (method, outcome).
        self.calls: list[tuple[str, str]] = []
        # Like a raft index: never 0 or 1 once anything happened.
        self.index = 100
        self.node_index: dict[str, int] = {}

    # -- what a test does to it ----------------------------------------------------------

    def _bump(self, node_id: str) -> int:
        self.index += 1
        self.node_index[node_id] = self.index
        self.cond.notify_all()
        return self.index

    def place(self, a: structs_pb2.Allocation, j: structs_pb2.Job) -> None:
        self.place_many([a], j)

    def place_many(self, allocs: list[structs_pb2.Allocation], j: structs_pb2.Job) -> None:
        """Place allocs in one change (one plan), so a client sees them together."""
        with self.cond:
            for a in allocs:
                a = structs_pb2.Allocation().FromString(a.SerializeToString())
                if not a.node_id:
                    a.node_id = next(iter(self.nodes))
                self.node_index[a.node_id] = self.index + 1
                a.create_index = a.modify_index = a.alloc_modify_index = self.index + 1
                self.allocs[a.id] = a
            self.jobs[f"{j.id}@{j.version}"] = j
            self.index += 1
            self.cond.notify_all()

    def set_desired(self, alloc_id: str, desired: str) -> None:
        with self.cond:
            a = self.allocs[alloc_id]
            a.desired_status = desired
            a.modify_index = a.alloc_modify_index = self._bump(a.node_id)

    def set_server_client_status(self, alloc_id: str, client_status: str) -> None:
        """A server-side status change (the leader marking an alloc unknown or lost)."""
        with self.cond:
            a = self.allocs[alloc_id]
            a.client_status = client_status
            a.modify_index = a.alloc_modify_index = self._bump(a.node_id)

    def remove(self, alloc_id: str) -> None:
        with self.cond:
            a = self.allocs.pop(alloc_id)
            self._bump(a.node_id)

    def mark_down(self, node_id: str) -> None:
        with self.cond:
            self.status[node_id] = "down"

    def set_unavailable(self, value: bool) -> None:
        with self.cond:
            self.unavailable = value
            self.cond.notify_all()

    # -- what a test reads -----------------------------------------------------------------

    def client_status(self, alloc_id: str) -> str:
        with self.cond:
            a = self.allocs.get(alloc_id)
            return a.client_status if a else ""

    def task_state(self, alloc_id: str, task_name: str = "main") -> structs_pb2.TaskState | None:
        with self.cond:
            a = self.allocs.get(alloc_id)
            if a is None or task_name not in a.task_states:
                return None
            return structs_pb2.TaskState().FromString(a.task_states[task_name].SerializeToString())

    def heartbeat_times(self) -> list[float]:
        with self.cond:
            return [h.at for h in self.heartbeats]

    def updates_for(self, alloc_id: str) -> list[structs_pb2.Allocation]:
        with self.cond:
            return [a for r in self.update_requests for a in r.allocs if a.id == alloc_id]

    def methods(self) -> list[str]:
        with self.cond:
            return [m for m, _ in self.calls]

    # -- the RPCs ----------------------------------------------------------------------------

    def _gate(self, method: str, context: grpc.ServicerContext) -> None:
        if self.unavailable:
            self.calls.append((method, "UNAVAILABLE"))
            context.abort(grpc.StatusCode.UNAVAILABLE, "fake server: unavailable")

    @contextmanager
    def _serving(self, method: str, context: grpc.ServicerContext) -> Iterator[None]:
        """One RPC under the lock, refused first while the fake plays unavailable."""
        with self.cond:
            self._gate(method, context)
            yield

    def Register(
        self, request: api_pb2.NodeRegisterRequest, context: grpc.ServicerContext
    ) -> api_pb2.NodeRegisterResponse:
        with self._serving("Register", context):
            node = request.node
            existing = self.nodes.get(node.id)
            if existing is not None and existing.secret_id != node.secret_id:
                self.calls.append(("Register", "FAILED_PRECONDITION"))
                context.abort(grpc.StatusCode.FAILED_PRECONDITION, "registered with a different secret")
            self.nodes[node.id] = node
            self.status[node.id] = "ready"
            self.registrations.append(node)
            self.calls.append(("Register", "OK"))
            self.cond.notify_all()
            return api_pb2.NodeRegisterResponse(heartbeat_ttl_ns=self.ttl_ns)

    def UpdateStatus(
        self, request: api_pb2.NodeUpdateStatusRequest, context: grpc.ServicerContext
    ) -> api_pb2.NodeUpdateStatusResponse:
        with self._serving("UpdateStatus", context):
            node = self.nodes.get(request.node_id)
            if node is None:
                self.calls.append(("UpdateStatus", "NOT_FOUND"))
                context.abort(grpc.StatusCode.NOT_FOUND, f"node {request.node_id!r} not found")
            if request.secret_id != node.secret_id:
                self.calls.append(("UpdateStatus", "PERMISSION_DENIED"))
                context.abort(grpc.StatusCode.PERMISSION_DENIED, "wrong secret")
            if self.status.get(request.node_id) == "down":
                self.calls.append(("UpdateStatus", "FAILED_PRECONDITION"))
                context.abort(grpc.StatusCode.FAILED_PRECONDITION, "node is down: register again")
            self.heartbeats.append(Heartbeat(request.node_id, time.monotonic()))
            self.calls.append(("UpdateStatus", "OK"))
            delay_s = self.heartbeat_delay_s
        if delay_s:
            time.sleep(delay_s)  # outside the fake's lock: only this call waits
        return api_pb2.NodeUpdateStatusResponse(heartbeat_ttl_ns=self.ttl_ns)

    def Heartbeat(
        self, request_iterator: Iterator[api_pb2.NodeUpdateStatusRequest], context: grpc.ServicerContext
    ) -> Iterator[api_pb2.NodeUpdateStatusResponse]:
        """UpdateStatus, a message at a time, as the servers serve ``Nodes.Heartbeat``: the
        first refusal ends the stream with its status."""
        with self.cond:
            self.heartbeat_streams += 1
        for answered, request in enumerate(request_iterator, start=1):
            yield self.UpdateStatus(request, context)
            if answered == self.beats_per_stream:
                return  # as a server that restarts ends its streams

    def _response(self, node_id: str) -> api_pb2.ClientAllocsResponse:
        resp = api_pb2.ClientAllocsResponse(meta=api_pb2.QueryMeta(index=self.node_index.get(node_id, 0)))
        for a in sorted(self.allocs.values(), key=lambda x: x.id):
            if a.node_id != node_id:
                continue
            resp.allocs.add().CopyFrom(a)
            key = f"{a.job_id}@{a.job_version}"
            if key in self.jobs and key not in resp.jobs:
                resp.jobs[key].CopyFrom(self.jobs[key])
        return resp

    def GetClientAllocs(
        self, request: api_pb2.ClientAllocsRequest, context: grpc.ServicerContext
    ) -> api_pb2.ClientAllocsResponse:
        wait_s = request.options.wait_ns / 1e9 if request.options.wait_ns > 0 else 300.0
        deadline = time.monotonic() + wait_s
        with self._serving("GetClientAllocs", context):
            while (
                self.node_index.get(request.node_id, 0) <= request.options.min_index
                and request.options.min_index > 0
                and not self.unavailable
                and context.is_active()
            ):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self.cond.wait(min(remaining, 0.2))
            self._gate("GetClientAllocs", context)
            self.calls.append(("GetClientAllocs", "OK"))
            return self._response(request.node_id)

    def UpdateAllocs(
        self, request: api_pb2.AllocUpdateRequest, context: grpc.ServicerContext
    ) -> api_pb2.AllocUpdateResponse:
        with self._serving("UpdateAllocs", context):
            node = self.nodes.get(request.node_id)
            if node is None or node.secret_id != request.secret_id:
                self.calls.append(("UpdateAllocs", "PERMISSION_DENIED"))
                context.abort(grpc.StatusCode.PERMISSION_DENIED, "unknown node or wrong secret")
            if self.status.get(request.node_id) in ("down", "disconnected"):
                self.calls.append(("UpdateAllocs", "FAILED_PRECONDITION"))
                context.abort(grpc.StatusCode.FAILED_PRECONDITION, "node is down: register again")
            for update in request.allocs:
                if update.id not in self.allocs:
                    self.calls.append(("UpdateAllocs", "NOT_FOUND"))
                    context.abort(grpc.StatusCode.NOT_FOUND, f"alloc {update.id!r} not found")
            self.update_requests.append(api_pb2.AllocUpdateRequest().FromString(request.SerializeToString()))
            self.update_times.append(time.monotonic())
            for update in request.allocs:
                a = self.allocs[update.id]
                a.client_status = update.client_status
                a.client_description = update.client_description
                a.task_states.clear()
                for name, ts in update.task_states.items():
                    a.task_states[name].CopyFrom(ts)
                a.modify_index = self._bump(a.node_id)  # not alloc_modify_index: a client change
            self.calls.append(("UpdateAllocs", "OK"))
            return api_pb2.AllocUpdateResponse()


class FakeServer:
    """A ``FakeNodes`` served on 127.0.0.1:<free port>."""

    def __init__(self, ttl_ns: int = DEFAULT_TTL_NS) -> None:
        self.nodes = FakeNodes(ttl_ns)
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=32))
        api_pb2_grpc.add_NodesServicer_to_server(self.nodes, self._server)
        self.port = self._server.add_insecure_port("127.0.0.1:0")
        self.address = f"127.0.0.1:{self.port}"
        self._server.start()

    def stop(self) -> None:
        self.nodes.set_unavailable(True)  # wakes blocked queries
        self._server.stop(grace=0).wait(5)


@contextmanager
def fake_server(ttl_ns: int = DEFAULT_TTL_NS) -> Iterator[FakeServer]:
    server = FakeServer(ttl_ns)
    try:
        yield server
    finally:
        server.stop()


# --- the fake's own contract --------------------------------------------------------------


@contextmanager
def _n1_registered() -> Iterator[tuple[FakeServer, api_pb2_grpc.NodesStub, structs_pb2.Node]]:
    """A fake server with node n1 (secret "s") registered through a client stub."""
    with fake_server() as server, grpc.insecure_channel(server.address) as channel:
        stub = api_pb2_grpc.NodesStub(channel)
        node = structs_pb2.Node(id="n1", name="n1", datacenter="dc1", secret_id="s")
        stub.Register(api_pb2.NodeRegisterRequest(node=node))
        yield server, stub, node


def test_fake_server__blocking_query__returns_when_node_index_passes_min_index() -> None:
    with _n1_registered() as (server, stub, _node):
        first = stub.GetClientAllocs(api_pb2.ClientAllocsRequest(node_id="n1"))
        assert first.meta.index == 0 and not first.allocs
        j = job()
        result: list[api_pb2.ClientAllocsResponse] = []

        def blocked() -> None:
            req = api_pb2.ClientAllocsRequest(
                node_id="n1", options=api_pb2.QueryOptions(min_index=1, wait_ns=10_000_000_000)
            )
            result.append(stub.GetClientAllocs(req, timeout=15))

        t = threading.Thread(target=blocked)
        t.start()
        server.nodes.place(alloc("a1", j, "n1"), j)
        t.join(10)
        assert result and [a.id for a in result[0].allocs] == ["a1"]
        assert "web@0" in result[0].jobs


def test_fake_server__down_node__updates_refused_until_registered() -> None:
    with _n1_registered() as (server, stub, node):
        j = job()
        server.nodes.place(alloc("a1", j, "n1"), j)
        server.nodes.mark_down("n1")
        update = api_pb2.AllocUpdateRequest(
            node_id="n1", secret_id="s", allocs=[structs_pb2.Allocation(id="a1", client_status="running")]
        )
        with pytest.raises(grpc.RpcError) as refused:
            stub.UpdateAllocs(update)
        assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        stub.Register(api_pb2.NodeRegisterRequest(node=node))
        stub.UpdateAllocs(update)
        assert server.nodes.client_status("a1") == "running"
