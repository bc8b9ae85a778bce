"""The API holds a fleet's watches without a thread each (server/api/_aio.py).

One real server process; a thousand registered nodes each open their alloc watch
(``Nodes.WatchClientAllocs``) and their tunnel (``Nodes.Connect``), as every client agent
does, and keep them open. While every one of them is open, a unary read must still answer
within a 1 s deadline, a node's meta read must go down its tunnel and back, and the server
must still run on a bounded number of threads. On the thread-per-call server this replaced, the pool ran out first:
the watches past it never got their first message, and the read queued behind them.

Event streams (``Events.Stream``) are coroutines too: sixty open ones add no thread each,
and one write wakes every one of them with its event.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Final

import grpc
import pytest

from deploy.cluster import LocalCluster, wait_for
from drover.v1 import api_pb2, api_pb2_grpc
from tests.cluster.conftest import wait_settled
from tests.cluster.jobs import service_job
from tests.cluster.nodes import simulated_node, simulated_secret

WATCHES: Final = 1_000
CHANNELS: Final = 8
READ_DEADLINE_S: Final = 1.0
# The server's threads with every watch open: raft, leader services, the API's read pool
# (32) and the write threads its registrations needed (at most 50 at once here), grpc's
# own; a thread per watch would be a thousand more, and two per tunnel two thousand.
MAX_SERVER_THREADS: Final = 200


@asynccontextmanager
async def _connections(address: str) -> AsyncIterator[list[grpc.aio.Channel]]:
    """``CHANNELS`` channels to ``address``, each its own connection (one HTTP/2 connection
    would carry every stream otherwise), closed on the way out."""
    options = [("grpc.use_local_subchannel_pool", 1)]
    channels = [grpc.aio.insecure_channel(address, options=options) for _ in range(CHANNELS)]
    try:
        yield channels
    finally:
        for channel in channels:
            await channel.close()


async def _cancel(tasks: list[asyncio.Task[None]]) -> None:
    """Ends the held streams before their channels close: each task is cancelled and
    awaited, whatever it raised on the way out dropped."""
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


class _Fleet:
    """``WATCHES`` nodes on one asyncio loop in a thread of this test: register each, then
    hold its watch open; counts the watches that got their first message and those that
    ended (none should, while the test runs)."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.registered = 0
        self.opened = 0
        self.meta_answered = 0
        self.ended: list[str] = []
        self._loop = asyncio.new_event_loop()
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(
            target=self._loop.run_until_complete, args=(self._main(),), daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        if self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(timeout=30)

    async def _main(self) -> None:
        self._stop = asyncio.Event()
        async with _connections(self.address) as channels:
            stubs = [api_pb2_grpc.NodesStub(c) for c in channels]
            gate = asyncio.Semaphore(50)

            async def register(i: int) -> None:
                async with gate:
                    node = simulated_node(f"watch-{i:04d}")
                    await stubs[i % CHANNELS].Register(api_pb2.NodeRegisterRequest(node=node), timeout=60)
                    self.registered += 1

            await asyncio.gather(*(register(i) for i in range(WATCHES)))
            tasks = [
                asyncio.create_task(self._watch(stubs[i % CHANNELS], f"watch-{i:04d}"))
                for i in range(WATCHES)
            ] + [
                asyncio.create_task(self._tunnel(stubs[i % CHANNELS], f"watch-{i:04d}"))
                for i in range(WATCHES)
            ]
            await self._stop.wait()
            await _cancel(tasks)

    async def _watch(self, stub: api_pb2_grpc.NodesStub, node_id: str) -> None:
        request = api_pb2.ClientAllocsRequest(node_id=node_id, secret_id=simulated_secret(node_id))
        first = True
        try:
            async for _response in stub.WatchClientAllocs(request, timeout=600):
                if first:
                    self.opened += 1
                    first = False
            self.ended.append(f"{node_id}: ended")
        except grpc.aio.AioRpcError as exc:
            self.ended.append(f"{node_id}: {exc.code().name} {exc.details()}")

    async def _tunnel(self, stub: api_pb2_grpc.NodesStub, node_id: str) -> None:
        """The node's tunnel, held open; a meta read asked down it is answered as a client
        agent would (the node's meta is its id)."""
        answers: asyncio.Queue[api_pb2.ClientTunnelUp] = asyncio.Queue()

        async def up() -> AsyncIterator[api_pb2.ClientTunnelUp]:
            yield api_pb2.ClientTunnelUp(node_id=node_id, secret_id=simulated_secret(node_id))
            while True:
                yield await answers.get()

        try:
            async for down in stub.Connect(up(), timeout=600):
                if down.WhichOneof("op") == "meta_read":
                    meta = api_pb2.NodeMetaResponse(meta={"node": node_id})
                    answers.put_nowait(
                        api_pb2.ClientTunnelUp(request_id=down.request_id, done=True, meta=meta)
                    )
                    self.meta_answered += 1
            self.ended.append(f"{node_id}: tunnel ended")
        except grpc.aio.AioRpcError as exc:
            if exc.code() != grpc.StatusCode.CANCELLED:
                self.ended.append(f"{node_id}: tunnel {exc.code().name} {exc.details()}")


def _threads(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Threads:"):
            return int(line.split()[1])
    raise AssertionError(f"no thread count for {pid}")


@pytest.fixture
def one_server(tmp_path: Path) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path / "cluster", servers=1) as cluster:
        wait_settled(cluster)
        yield cluster


def test_api__a_thousand_watches_open__a_read_answers_within_a_second(one_server: LocalCluster) -> None:
    address = one_server.grpc_addresses[0]
    fleet = _Fleet(address)
    fleet.start()
    try:
        wait_for(
            lambda: fleet.registered == WATCHES,
            120,
            message=lambda: f"{WATCHES} nodes registered ({fleet.registered})",
        )
        wait_for(
            lambda: fleet.ended or fleet.opened == WATCHES,
            120,
            message=lambda: f"{WATCHES} watches open ({fleet.opened} got their first message)",
        )
        assert fleet.ended == []
        wait_for(
            lambda: one_server.log(0).count("tunnel.connected") >= WATCHES,
            120,
            message=lambda: f"{WATCHES} tunnels attached ({one_server.log(0).count('tunnel.connected')})",
        )
        with grpc.insecure_channel(address) as channel:
            jobs = api_pb2_grpc.JobsStub(channel)
            nodes = api_pb2_grpc.NodesStub(channel)
            for _ in range(3):
                jobs.List(api_pb2.JobListRequest(), timeout=READ_DEADLINE_S)
                listed = nodes.List(api_pb2.NodeListRequest(prefix="watch-"), timeout=READ_DEADLINE_S)
                assert len(listed.nodes) == WATCHES
            for i in (0, WATCHES // 2, WATCHES - 1):
                node_id = f"watch-{i:04d}"
                read = nodes.MetaRead(api_pb2.NodeMetaReadRequest(node_id=node_id), timeout=30)
                assert dict(read.meta) == {"node": node_id}
        pid = one_server.pid(0)
        assert pid is not None
        assert _threads(pid) < MAX_SERVER_THREADS
        assert fleet.ended == [], fleet.ended[:5]
    finally:
        fleet.stop()


# Below the per-caller parking limit (64): every stream here comes from this one host.
EVENT_STREAMS: Final = 60


async def _hold_event_streams(
    address: str, opened: list[int], events: list[int], stop: asyncio.Event
) -> None:
    """``EVENT_STREAMS`` open ``Events.Stream`` calls over separate connections; each counts
    its first (opening) message in ``opened`` and its first Job event in ``events``."""
    async with _connections(address) as channels:

        async def one(i: int) -> None:
            stub = api_pb2_grpc.EventsStub(channels[i % CHANNELS])
            request = api_pb2.EventStreamRequest(topics=[api_pb2.EventTopicFilter(topic="Job")])
            seen_job = False
            async for response in stub.Stream(request, timeout=600):
                if not response.events and not seen_job and i not in opened:
                    opened.append(i)
                if response.events and not seen_job:
                    seen_job = True
                    events.append(i)

        tasks = [asyncio.create_task(one(i)) for i in range(EVENT_STREAMS)]
        try:
            await stop.wait()
        finally:
            await _cancel(tasks)


def test_api__event_streams_open__hold_no_thread_each__a_write_wakes_every_one(
    one_server: LocalCluster,
) -> None:
    address = one_server.grpc_addresses[0]
    pid = one_server.pid(0)
    assert pid is not None
    before = _threads(pid)
    opened: list[int] = []
    events: list[int] = []
    loop = asyncio.new_event_loop()
    stop = asyncio.Event()
    holder = threading.Thread(
        target=loop.run_until_complete,
        args=(_hold_event_streams(address, opened, events, stop),),
        daemon=True,
    )
    holder.start()
    try:
        wait_for(
            lambda: len(opened) == EVENT_STREAMS, 60, message=lambda: f"event streams open ({len(opened)})"
        )
        # A thread per stream would be EVENT_STREAMS more; a few come and go on their own.
        assert _threads(pid) - before < EVENT_STREAMS // 2, (before, _threads(pid))
        with grpc.insecure_channel(address) as channel:
            job = api_pb2.JobRegisterRequest(job=service_job("evented", count=0))
            api_pb2_grpc.JobsStub(channel).Register(job, timeout=30)
        wait_for(
            lambda: len(events) == EVENT_STREAMS,
            30,
            message=lambda: f"streams woken by the write ({len(events)})",
        )
    finally:
        loop.call_soon_threadsafe(stop.set)
        holder.join(timeout=30)
