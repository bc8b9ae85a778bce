"""The event stream's core (server/events/): events derived from each applied entry, the
bounded buffer streams read from, the filters, and the wire form.

Entries go through the real FSM (the bytes a leader proposes, tests/fixtures/mock.py) with
an ``EventBuffer`` attached, as on a server; assertions read the buffer's batches.
"""

from __future__ import annotations

import asyncio
import threading
from dataclasses import replace
from pathlib import Path

import pytest

from drover.scheduler.structs import (
    ALLOC_CLIENT_RUNNING,
    DEPLOYMENT_STATUS_PAUSED,
    DEPLOYMENT_STATUS_RUNNING,
    NODE_INELIGIBLE,
    NODE_STATUS_DOWN,
    Deployment,
    DeploymentStatusUpdate,
    DrainStrategy,
    NodeEvent,
)
from drover.server.acl.acl import MANAGEMENT, compile_acl
from drover.server.acl.policy import parse_policy
from drover.server.api.events import WireCache, event_to_proto
from drover.server.codec import to_proto
from drover.server.config import load_server_config
from drover.server.errors import ValidationError
from drover.server.events import (
    DEFAULT_MAX_EVENTS,
    ENTRY_EVENT_TYPES,
    EVENTLESS_ENTRIES,
    Batch,
    Event,
    EventBuffer,
    EventsOutOfRangeError,
    derive_events,
    readable,
    subscription_from,
)
from drover.server.fsm import APPLIERS, FSM, encode_entry
from drover.server.state_store import StateStore, Tables, Txn
from drover.v1 import api_pb2, raft_pb2
from tests.fixtures import mock

ET = raft_pb2.EntryType


class Server:
    """One FSM with an event buffer, fed entries at increasing indexes."""

    def __init__(self, max_events: int = 1000) -> None:
        self.store = StateStore()
        self.events = EventBuffer(max_events)
        self.fsm = FSM(self.store, events=self.events)
        self.index = 0

    def apply(self, data: bytes) -> list[tuple[str, str, str]]:
        """Apply at the next index; the (topic, type, key) of the events that index made."""
        self.index += 1
        result = self.fsm.apply(data, self.index)
        assert not result.error, result.error
        return [(e.topic, e.type, e.key) for e in self.events_at(self.index)]

    def events_at(self, index: int) -> tuple[Event, ...]:
        floor, _ = self.events.bounds()
        if index <= floor:
            return ()
        batches, _ = self.events.read(index, 0.0)
        return next((events for i, events in batches if i == index), ())

    def seed(self, txn_fn: object) -> None:
        """Write through a Txn without the FSM (state the tests start from)."""
        self.index += 1
        txn = Txn(self.store.snapshot().tables, self.index)
        txn_fn(txn)  # type: ignore[operator]
        self.store.commit(txn.commit(), txn.changes)


@pytest.fixture
def server() -> Server:
    return Server()


def ev(topic: str, kind: str, key: str) -> tuple[str, str, str]:
    return (topic, kind, key)


# ---------------------------------------------------------------------------------------
# Every entry type is decided


def test_derive__every_entry_type_the_fsm_applies__makes_events_or_is_listed_eventless() -> None:
    applied = {*APPLIERS, ET.ENTRY_TYPE_SNAPSHOT_RESTORE}
    named = set(ENTRY_EVENT_TYPES)

    assert named.isdisjoint(EVENTLESS_ENTRIES)
    assert applied == named | EVENTLESS_ENTRIES, "classify a new entry type in server/events/derive.py"


# ---------------------------------------------------------------------------------------
# Events per entry type


def test_derive__job_registered__job_and_its_eval(server: Server) -> None:
    job = mock.job(id="web")
    evaluation = mock.eval_for(job)

    made = server.apply(mock.register_job_entry(job, evaluation))

    assert made == [ev("Job", "JobRegistered", "web"), ev("Evaluation", "JobRegistered", evaluation.id)]
    job_event = server.events_at(server.index)[0]
    assert job_event.namespace == "default"
    assert job_event.index == server.index
    assert job_event.payload == server.store.snapshot().job("default", "web")


def test_derive__eval_filter_keys__are_its_job_and_deployment(server: Server) -> None:
    job = mock.job(id="web")
    evaluation = replace(mock.eval_for(job), deployment_id="d1")

    server.apply(mock.register_job_entry(job, evaluation))

    eval_event = server.events_at(server.index)[1]
    assert eval_event.filter_keys == ("web", "d1")


def test_derive__job_stopped_then_purged__job_deregistered_twice_with_the_last_job(server: Server) -> None:
    job = mock.job(id="web")
    server.apply(mock.register_job_entry(job))

    stopped = server.apply(mock.deregister_entry("web"))
    before_purge = server.store.snapshot().job("default", "web")
    purged = server.apply(mock.deregister_entry("web", purge=True))

    assert stopped == [ev("Job", "JobDeregistered", "web")]
    assert purged == [ev("Job", "JobDeregistered", "web")]
    assert server.events_at(server.index)[0].payload == before_purge


def test_derive__node_lifecycle__registration_status_drain_eligibility_deregistration(server: Server) -> None:
    node = mock.node(id="n1")

    registered = server.apply(mock.register_node_entry(node))
    down = server.apply(mock.node_status_entry("n1", NODE_STATUS_DOWN, event=NodeEvent(message="down")))
    drained = server.apply(mock.drain_entry("n1", DrainStrategy(deadline_ns=60)))
    ineligible = server.apply(mock.eligibility_entry("n1", NODE_INELIGIBLE))
    gone = server.apply(mock.deregister_node_entry("n1"))

    assert registered == [ev("Node", "NodeRegistration", "n1")]
    assert down == [ev("Node", "NodeEvent", "n1")]
    assert drained == [ev("Node", "NodeDrain", "n1")]
    assert ineligible == [ev("Node", "NodeEligibility", "n1")]
    assert gone == [ev("Node", "NodeDeregistration", "n1")]
    assert server.events_at(server.index)[0].namespace == ""


def test_derive__plan_result__allocs_and_the_job_status_it_moved(server: Server) -> None:
    job = mock.job(id="web")
    server.apply(mock.register_job_entry(job))
    node = mock.node(id="n1")
    server.apply(mock.register_node_entry(node))
    first, second = mock.alloc(job, node, 0, id="a1"), mock.alloc(job, node, 1, id="a2")

    made = server.apply(mock.plan_entry([first, second]))

    assert made == [
        ev("Job", "PlanResult", "web"),
        ev("Allocation", "PlanResult", "a1"),
        ev("Allocation", "PlanResult", "a2"),
    ]
    alloc_event = server.events_at(server.index)[1]
    assert alloc_event.filter_keys == ("web",)
    assert alloc_event.namespace == "default"


def test_derive__client_update__the_alloc_and_not_the_reporting_nodes_bookkeeping(server: Server) -> None:
    job = mock.job(id="web")
    server.apply(mock.register_job_entry(job))
    node = mock.node(id="n1")
    server.apply(mock.register_node_entry(node))
    server.apply(mock.plan_entry([mock.alloc(job, node, 0, id="a1")]))
    entry = raft_pb2.AllocClientUpdateEntry(node_id="n1", updated_at_ns=mock.NOW)
    entry.allocs.add(id="a1", client_status=ALLOC_CLIENT_RUNNING)

    made = server.apply(encode_entry(ET.ENTRY_TYPE_ALLOC_CLIENT_UPDATE, entry))

    node_after = server.store.snapshot().node("n1")
    assert node_after is not None and node_after.last_alloc_update_index == server.index
    assert ev("Allocation", "AllocationUpdated", "a1") in made
    assert all(topic != "Node" for topic, _, _ in made)


def test_derive__eval_update__evaluation_updated(server: Server) -> None:
    job = mock.job(id="web")
    evaluation = mock.eval_for(job)
    server.apply(mock.register_job_entry(job, evaluation))

    made = server.apply(mock.eval_update_entry(replace(evaluation, status="complete")))

    assert ev("Evaluation", "EvaluationUpdated", evaluation.id) in made


def test_derive__deployment_paused__deployment_status_update(server: Server) -> None:
    job = mock.job(id="web")
    server.apply(mock.register_job_entry(job))
    deployment = Deployment(id="d1", job_id="web", status=DEPLOYMENT_STATUS_RUNNING)
    server.seed(lambda txn: txn.put_deployment(deployment))
    entry = raft_pb2.DeploymentStatusUpdateEntry(updated_at_ns=mock.NOW)
    to_proto(DeploymentStatusUpdate("d1", DEPLOYMENT_STATUS_PAUSED, "paused"), entry.update)

    made = server.apply(encode_entry(ET.ENTRY_TYPE_DEPLOYMENT_STATUS_UPDATE, entry))

    assert made == [ev("Deployment", "DeploymentStatusUpdate", "d1")]
    assert server.events_at(server.index)[0].filter_keys == ("web",)


@pytest.mark.parametrize(
    "entry",
    [
        mock.eval_delete_entry(["nope"]),
        mock.server_member_entry("s1"),
        mock.periodic_launch_entry("none"),
    ],
    ids=["eval-delete", "server-member", "periodic-launch"],
)
def test_derive__eventless_entries__make_no_events_but_move_the_newest_index(
    server: Server, entry: bytes
) -> None:
    server.index += 1
    server.fsm.apply(entry, server.index)

    assert server.events_at(server.index) == ()
    assert server.events.bounds()[1] == server.index


def test_derive__refused_entry__makes_no_events(server: Server) -> None:
    server.index += 1
    result = server.fsm.apply(mock.deregister_entry("missing"), server.index)

    assert result.error
    assert server.events_at(server.index) == ()


def test_derive__two_servers_applying_one_log__derive_the_same_events() -> None:
    job, node = mock.job(id="web"), mock.node(id="n1")
    log = [
        mock.register_job_entry(job, mock.eval_for(job)),
        mock.register_node_entry(node),
        mock.plan_entry([mock.alloc(job, node, i, id=f"a{i}") for i in range(5)]),
        mock.deregister_entry("web"),
    ]
    a, b = Server(), Server()
    for data in log:
        a.apply(data)
        b.apply(data)

    assert [a.events_at(i) for i in range(1, 5)] == [b.events_at(i) for i in range(1, 5)]


# ---------------------------------------------------------------------------------------
# The buffer: bounds, resets, waits


def _batch(index: int, n: int = 1) -> list[Event]:
    job = mock.job(id=f"j{index}")
    return [Event(index, "Job", "JobRegistered", f"j{index}-{i}", "default", job) for i in range(n)]


def test_buffer__over_its_size__drops_whole_oldest_batches_and_names_the_oldest_index() -> None:
    buffer = EventBuffer(max_events=4)
    for index in range(1, 6):
        buffer.publish(index, _batch(index, 2))

    floor, newest = buffer.bounds()
    batches, covered = buffer.read(floor + 1, 0.0)
    assert (floor, newest) == (3, 5)
    assert [i for i, _ in batches] == [4, 5]
    assert covered == 5
    with pytest.raises(EventsOutOfRangeError, match="oldest index it can stream from is 4") as caught:
        buffer.read(3, 0.0)
    assert caught.value.oldest == 4


def test_buffer__one_batch_over_the_size__is_kept_whole() -> None:
    buffer = EventBuffer(max_events=2)
    buffer.publish(1, _batch(1))
    buffer.publish(2, _batch(2, 5))

    batches, _ = buffer.read(2, 0.0)

    assert [(i, len(events)) for i, events in batches] == [(2, 5)]
    assert buffer.bounds()[0] == 1


def test_buffer__read__never_splits_an_index_and_resumes_exactly_after_covered() -> None:
    buffer = EventBuffer(max_events=100)
    for index in range(1, 11):
        buffer.publish(index, _batch(index, 3))
    seen: list[tuple[int, str]] = []
    next_index = 1

    while next_index <= 10:
        batches, covered = buffer.read(next_index, 0.0, max_events=4)
        assert batches, "events were held from next_index on"
        seen.extend((e.index, e.key) for _, events in batches for e in events)
        next_index = covered + 1

    assert len(seen) == 30
    assert len(set(seen)) == 30
    assert [i for i, _ in seen] == sorted(i for i, _ in seen)


def test_buffer__read_async__a_publish_from_another_thread_wakes_every_waiter() -> None:
    buffer = EventBuffer()

    async def scenario() -> list[tuple[list[int], int]]:
        # A 60 s wait each: only the publish's wake can end them within the 10 s deadline.
        waits = [asyncio.ensure_future(buffer.read_async(1, 60.0)) for _ in range(20)]
        await asyncio.sleep(0)
        threading.Thread(target=buffer.publish, args=(1, _batch(1, 2))).start()
        answers = await asyncio.wait_for(asyncio.gather(*waits), 10.0)
        return [([index for index, _ in batches], covered) for batches, covered in answers]

    assert asyncio.run(scenario()) == [([1], 1)] * 20
    assert len(buffer._async_waiters) == 0


def test_buffer__read_async__timeout_and_close__return_no_batch_at_the_newest() -> None:
    buffer = EventBuffer()
    buffer.publish(3, _batch(3))

    async def scenario() -> tuple[tuple[list[Batch], int], tuple[list[Batch], int]]:
        timed_out = await buffer.read_async(4, 0.05)
        closing = asyncio.ensure_future(buffer.read_async(4, 60.0))
        await asyncio.sleep(0)
        threading.Thread(target=buffer.close).start()
        return timed_out, await asyncio.wait_for(closing, 10.0)

    assert asyncio.run(scenario()) == (([], 3), ([], 3))


def test_buffer__index_zero__starts_after_the_newest() -> None:
    buffer = EventBuffer()
    buffer.publish(7, _batch(7))

    assert buffer.start_index(0) == 8
    assert buffer.start_index(7) == 7


def test_buffer__reader_behind_a_reset__out_of_range_from_the_new_base() -> None:
    buffer = EventBuffer()
    buffer.publish(1, _batch(1))
    buffer.reset(50)

    with pytest.raises(EventsOutOfRangeError) as caught:
        buffer.read(2, 0.0)

    assert caught.value.oldest == 51
    assert buffer.start_index(0) == 51


def test_buffer__snapshot_restore_entry__resets_the_buffer(server: Server) -> None:
    server.apply(mock.register_job_entry(mock.job(id="web")))
    tables = server.store.snapshot().tables

    server.index += 1
    server.fsm.apply(mock.snapshot_restore_entry(tables), server.index)

    assert server.events.bounds()[0] == server.index
    with pytest.raises(EventsOutOfRangeError):
        server.events.read(1, 0.0)


def test_buffer__raft_snapshot_installed__resets_to_its_index(server: Server) -> None:
    server.apply(mock.register_job_entry(mock.job(id="web")))

    server.fsm.restore_tables(replace(Tables(), index=40))

    assert server.events.bounds() == (40, 40)


def test_buffer__waiting_reader__wakes_on_the_next_publish() -> None:
    buffer = EventBuffer()
    got: list[int] = []

    def reader() -> None:
        batches, _ = buffer.read(1, 10.0)
        got.extend(i for i, _ in batches)

    thread = threading.Thread(target=reader)
    thread.start()
    buffer.publish(1, _batch(1))
    thread.join(timeout=10)

    assert got == [1]


def test_buffer__timeout__no_batches_and_covers_the_newest_index() -> None:
    buffer = EventBuffer()
    buffer.publish(3, [])

    batches, covered = buffer.read(1, 0.0)

    assert batches == []
    assert covered == 3


def test_buffer__derivation_bug__resets_instead_of_a_silent_gap() -> None:
    buffer = EventBuffer()
    buffer.publish(1, _batch(1))

    # "jobs" written, but the tables are not Tables: derive_events raises inside.
    buffer.entry_applied(ET.ENTRY_TYPE_JOB_REGISTER, 2, None, None, {"jobs": {"x": None}})  # type: ignore[arg-type]

    assert buffer.bounds()[0] == 2


def test_buffer__size_below_one__refused() -> None:
    with pytest.raises(ValueError, match="event_buffer_size"):
        EventBuffer(0)


# ---------------------------------------------------------------------------------------
# Filters and ACLs


def _event(topic: str, key: str, namespace: str = "default", filter_keys: tuple[str, ...] = ()) -> Event:
    payload = mock.node(id=key) if topic == "Node" else mock.job(id=key)
    return Event(1, topic, "T", key, "" if topic == "Node" else namespace, payload, filter_keys)


@pytest.mark.parametrize(
    ("topics", "namespace", "event", "wanted"),
    [
        ([], "", _event("Job", "web"), True),
        ([], "", _event("Job", "web", "prod"), False),
        ([], "*", _event("Job", "web", "prod"), True),
        ([], "prod", _event("Node", "n1"), True),
        ([("Job", "")], "", _event("Allocation", "a1"), False),
        ([("Job", "web")], "", _event("Job", "web"), True),
        ([("Job", "web")], "", _event("Job", "api"), False),
        ([("Allocation", "web")], "", _event("Allocation", "a1", filter_keys=("web",)), True),
        ([("*", "web")], "", _event("Evaluation", "e1", filter_keys=("web",)), True),
        ([("Job", "web"), ("Job", "*")], "", _event("Job", "api"), True),
    ],
    ids=[
        "everything-default-ns",
        "other-namespace",
        "every-namespace",
        "nodes-have-no-namespace",
        "other-topic",
        "key",
        "other-key",
        "filter-key",
        "any-topic-by-key",
        "star-key-wins",
    ],
)
def test_filter__subscription__matches(
    topics: list[tuple[str, str]], namespace: str, event: Event, wanted: bool
) -> None:
    assert subscription_from(topics, namespace).matches(event) is wanted


def test_filter__unknown_topic__invalid_argument_naming_the_field() -> None:
    with pytest.raises(ValidationError, match=r"topics\[1\]\.topic: unknown topic 'Jobs'"):
        subscription_from([("Job", ""), ("Jobs", "")], "")


def test_filter__acl__read_job_per_namespace_and_node_read_for_nodes() -> None:
    acl = compile_acl([parse_policy('namespace "default" { policy = "read" }')])

    assert readable(acl, _event("Job", "web"))
    assert not readable(acl, _event("Job", "web", "prod"))
    assert not readable(acl, _event("Node", "n1"))
    assert readable(compile_acl([parse_policy('node { policy = "read" }')]), _event("Node", "n1"))
    assert readable(MANAGEMENT, _event("Job", "web", "prod"))


# ---------------------------------------------------------------------------------------
# The wire form


def test_wire__node_event__carries_no_secret() -> None:
    node = replace(mock.node(id="n1"), secret_hash="abc")

    msg = event_to_proto(Event(3, "Node", "NodeRegistration", "n1", "", node), api_pb2.Event())

    assert msg.node.id == "n1"
    assert msg.node.secret_id == "" and msg.node.secret_hash == ""
    assert (msg.index, msg.topic, msg.type, msg.key) == (3, "Node", "NodeRegistration", "n1")


def test_wire__each_payload__in_its_own_field() -> None:
    job = mock.job(id="web")
    alloc = mock.alloc(job, mock.node(id="n1"), id="a1")

    job_msg = event_to_proto(Event(1, "Job", "JobRegistered", "web", "default", job), api_pb2.Event())
    alloc_msg = event_to_proto(Event(1, "Allocation", "PlanResult", "a1", "default", alloc), api_pb2.Event())

    assert job_msg.WhichOneof("payload") == "job" and job_msg.job.id == "web"
    assert alloc_msg.WhichOneof("payload") == "alloc" and alloc_msg.alloc.id == "a1"


def test_derive__garbage_collection__reaped_jobs_and_nodes_only_in_nomads_words() -> None:
    if "ENTRY_TYPE_GC" not in ET.DESCRIPTOR.values_by_name:
        pytest.skip("no garbage-collection entry type in raft.proto yet")
    job, node = mock.job(id="old"), mock.node(id="n-old")
    alloc, evaluation = mock.alloc(job, node, id="a-old"), mock.eval_for(job)
    seed = Txn(Tables(), 1)
    seed.put_job(job)
    seed.put_node(node)
    seed.put_alloc(alloc)
    seed.put_eval(evaluation)
    before = seed.commit()
    gc = Txn(before, 2)
    gc.delete_alloc("a-old")
    gc.delete_eval(evaluation.id)
    gc.delete_job(("default", "old"))
    gc.delete_node("n-old")
    after = gc.commit()

    made = derive_events(ET.Value("ENTRY_TYPE_GC"), 2, before, after, gc.written)

    assert [(e.topic, e.type, e.key) for e in made] == [
        ("Job", "JobBatchDeregistered", "old"),
        ("Node", "NodeDeregistration", "n-old"),
    ]


def test_config__event_buffer_size__a_server_config_file_key(tmp_path: Path) -> None:
    path = tmp_path / "server.hcl"
    path.write_text('node_name = "s1"\ndata_dir = "/var/lib/drover"\nevent_buffer_size = 8192\n')

    cfg = load_server_config({}, str(path))

    assert cfg.event_buffer_size == 8192
    assert EventBuffer(cfg.event_buffer_size).max_events == 8192
    assert (
        load_server_config({"node_name": "s1", "data_dir": "/d"}, None).event_buffer_size
        == DEFAULT_MAX_EVENTS
    )


def test_wire_cache__one_conversion_per_event__bounded_and_never_confused() -> None:
    cache = WireCache(size=2)
    events = [Event(i, "Job", "JobRegistered", f"j{i}", "default", mock.job(id=f"j{i}")) for i in range(3)]

    first = cache.wire(events[0])

    assert cache.wire(events[0]) is first
    assert [cache.wire(e).key for e in events] == ["j0", "j1", "j2"]
    assert cache.wire(events[0]) is not first, "the oldest entry was dropped at the bound"
    assert cache.wire(events[0]).key == "j0"
