"""The event stream over real server processes: resumed across a leader kill with no gap
and no duplicate, the CLI's ``event stream`` against a dev agent, and ACL filtering.

The resume test pins the stream to the leader at first (the survivors' addresses go
through proxies that refuse connections until the stream is open there), so the SIGKILL
breaks the very stream under test; the SDK must then resume it on a survivor. What it
delivered is compared with a fresh read from index 1 of each survivor's own buffer, and of
the killed leader's once restarted: every server derives the same events from the same log.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from deploy.cluster import LocalCluster, wait_for
from drover.sdk import Client, DroverError
from drover.v1 import api_pb2, api_pb2_grpc
from tests.cluster.cli import drover_cli, one_error_line
from tests.cluster.conftest import DevAgentFactory
from tests.cluster.jobs import service_job
from tests.cluster.nodes import simulated_node
from tests.cluster.proxy import proxies_for

EventId = tuple[int, str, str, str, str]


def _event_id(event: api_pb2.Event) -> EventId:
    return (event.index, event.topic, event.type, event.key, event.namespace)


class Subscriber:
    """``Client.stream_events`` iterated on a thread of its own, into a list."""

    def __init__(self, client: Client, **kwargs: object) -> None:
        self.client = client
        self.events: list[api_pb2.Event] = []
        self.error: BaseException | None = None
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, kwargs=kwargs, daemon=True)
        self._thread.start()

    def _run(self, **kwargs: object) -> None:
        try:
            for event in self.client.stream_events(**kwargs):  # type: ignore[arg-type]
                with self._lock:
                    self.events.append(event)
        except BaseException as exc:  # reported by the test, not lost on the thread
            self.error = exc

    def seen(self) -> list[api_pb2.Event]:
        with self._lock:
            return list(self.events)

    def has(self, topic: str, kind: str, key: str) -> bool:
        if self.error is not None:
            raise AssertionError(f"the stream failed: {self.error!r}")
        return any((e.topic, e.type, e.key) == (topic, kind, key) for e in self.seen())

    def stop(self) -> None:
        self.client.close()
        self._thread.join(timeout=15)
        assert not self._thread.is_alive(), "the stream did not end when its client closed"


def _full_read(address: str, through: int) -> list[EventId]:
    """Every event of one server's buffer from its oldest index up to ``through``."""
    with grpc.insecure_channel(address) as channel:
        stub = api_pb2_grpc.EventsStub(channel)
        start = 1
        try:
            responses = list(_responses_through(stub, start, through))
        except grpc.RpcError as exc:
            assert exc.code() == grpc.StatusCode.OUT_OF_RANGE, exc
            start = int(str(exc.details()).split("stream from is ")[1].split()[0])
            responses = list(_responses_through(stub, start, through))
    return [_event_id(e) for r in responses for e in r.events if e.index <= through]


def _responses_through(
    stub: api_pb2_grpc.EventsStub, start: int, through: int
) -> Iterator[api_pb2.EventStreamResponse]:
    request = api_pb2.EventStreamRequest(index=start)
    for response in stub.Stream(request, timeout=60, wait_for_ready=True):
        yield response
        if response.index >= through:
            return


@pytest.mark.timeout(300)
def test_events__stream_resumed_across_a_leader_kill__no_gap_no_duplicate(cluster: LocalCluster) -> None:
    leader = cluster.leader_index()
    survivors = [i for i in range(3) if i != leader]
    addresses = cluster.grpc_addresses
    proxies = proxies_for([addresses[i] for i in survivors], "survivor")
    for proxy in proxies:
        proxy.cut()
    writer = Client(addresses, retry_deadline=60)
    subscriber = Subscriber(
        Client([addresses[leader], *(p.address for p in proxies)], retry_deadline=60), index=1
    )
    try:
        for n in range(5):
            writer.register_job(service_job(f"before-{n}"))
        wait_for(
            lambda: subscriber.has("Job", "JobRegistered", "before-4"), 60, 0.1, "the events on the leader"
        )
        for proxy in proxies:
            proxy.heal()

        cluster.kill(leader, signal.SIGKILL)
        assert cluster.leader_index(timeout=60) in survivors
        for n in range(5):
            writer.register_job(service_job(f"after-{n}"))
        writer.register_node(simulated_node("n-after"))
        wait_for(
            lambda: subscriber.has("Node", "NodeRegistration", "n-after"),
            90,
            0.2,
            lambda: "the stream to resume on a survivor\n" + cluster.logs_tail(),
        )
    finally:
        subscriber.stop()
        writer.close()
        for proxy in proxies:
            proxy.close()

    streamed = [_event_id(e) for e in subscriber.seen()]
    indexes = [i for i, *_ in streamed]
    assert indexes == sorted(indexes), "events out of index order"
    assert len(set(streamed)) == len(streamed), "an event delivered twice"
    keys = {key for _, _, _, key, _ in streamed}
    assert {f"before-{n}" for n in range(5)} <= keys and {f"after-{n}" for n in range(5)} <= keys
    through = indexes[-1]
    # The killed leader, restarted, derives the same events again as it replays its log.
    cluster.restart(leader)
    for i in (*survivors, leader):
        fresh = _full_read(addresses[i], through)
        assert fresh, f"server {i} holds no events"
        expected = [e for e in streamed if e[0] >= fresh[0][0]]
        assert expected == fresh, f"the resumed stream differs from server {i}'s own events"


# ---------------------------------------------------------------------------------------
# The CLI against a dev agent


@pytest.mark.timeout(180)
def test_events__cli_event_stream__prints_job_events_as_json_lines(
    dev_agent_factory: DevAgentFactory,
) -> None:
    agent = dev_agent_factory(http_port=0)
    address, log_path = agent.address, agent.log_path
    env = {"DROVER_ADDR": address}
    # Listening first: the client's first contact gives up after connect_timeout (2 s).
    agent.wait_leading()
    with Client(address, retry_deadline=60) as client:
        wait_for(lambda: client.raft_peers().peers[0].leader, 60, 0.2, lambda: log_path.read_text())
        for n in range(3):
            client.register_job(service_job(f"web-{n}"))
    clean = {k: v for k, v in os.environ.items() if not k.startswith("DROVER_")}
    stream = subprocess.Popen(
        [sys.executable, "-m", "drover.cli", "event", "stream", "-index", "1", "-topic", "Job"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**clean, **env},
        start_new_session=True,
    )
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in stream.stdout or ()], daemon=True).start()
    try:
        got: list[dict[str, object]] = []
        deadline = time.monotonic() + 60
        while len({e["key"] for e in got}) < 3:
            assert time.monotonic() < deadline, f"only {got} within 60 s"
            try:
                got.append(json.loads(lines.get(timeout=1)))
            except queue.Empty:
                assert stream.poll() is None, (
                    stream.returncode,
                    stream.stderr.read() if stream.stderr else "",
                )
    finally:
        stream.terminate()
        stream.wait(timeout=30)
    agent.stop()

    first = got[0]
    assert set(first) == {"index", "topic", "type", "key", "namespace", "payload"}
    assert first["topic"] == "Job" and first["type"] == "JobRegistered" and first["namespace"] == "default"
    assert isinstance(first["index"], int)
    payload = first["payload"]
    assert isinstance(payload, dict) and payload["id"] == first["key"]
    assert {e["key"] for e in got} == {"web-0", "web-1", "web-2"}
    assert all(e["topic"] == "Job" for e in got)


def test_events__cli_unknown_topic__one_error_line() -> None:
    result = drover_cli("event", "stream", "-topic", "Jobs", env={"DROVER_ADDR": "127.0.0.1:1"})

    assert "unknown topic 'Jobs'" in one_error_line(result)


# ---------------------------------------------------------------------------------------
# ACLs: each event kept only if the token may read it


@pytest.mark.timeout(180)
def test_events__acl_token__sees_only_what_it_may_read(tmp_path: Path) -> None:
    with LocalCluster(tmp_path / "c", servers=1, acl=True) as cluster:
        cluster.wait_for_leader(60)
        address = cluster.grpc_addresses[0]
        with Client(address, retry_deadline=30, token=cluster.management_token) as admin:
            admin.acl_upsert_policy("default-read", 'namespace "default" { policy = "read" }')
            secret = admin.acl_create_token(name="reader", policies=["default-read"]).token.secret_id
            admin.register_job(service_job("visible"))
            hidden = service_job("hidden")
            hidden.namespace = "prod"
            admin.register_job(hidden)
            admin.register_node(simulated_node("n-hidden"))
            last = admin.register_job(service_job("last")).meta.index

        with Client(address, retry_deadline=30) as anonymous:
            with pytest.raises(DroverError) as caught:
                next(iter(anonymous.stream_events(index=1)))
            assert caught.value.code == grpc.StatusCode.PERMISSION_DENIED

        seen: list[api_pb2.Event] = []
        with Client(address, retry_deadline=30, token=secret) as reader:
            for event in reader.stream_events(index=1, namespace="*"):
                seen.append(event)
                if event.index >= last and event.topic == "Job":
                    break

    keys = {e.key for e in seen if e.topic == "Job"}
    assert keys == {"visible", "last"}
    assert all(e.namespace == "default" for e in seen)
    assert not [e for e in seen if e.topic == "Node"]
