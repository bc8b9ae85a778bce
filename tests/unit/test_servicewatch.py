"""The agent's one service watch (client_agent/servicewatch.py): the pure planning and
fan-out, then the thread against a scripted server that counts its parked calls."""

from __future__ import annotations

import threading
from collections.abc import Sequence

import structlog

from deploy.cluster import wait_for
from drover.client.errors import ServerUnreachable
from drover.client.servicewatch import (
    Read,
    ServiceWatch,
    Subscriber,
    changed_subscribers,
    plan_reads,
)
from drover.v1 import structs_pb2


def test_plan_reads__one_read_per_namespace_with_every_name_and_a_rotating_alloc() -> None:
    subs = [
        Subscriber("a2", "default", frozenset({"db"})),
        Subscriber("a1", "default", frozenset({"cache", "db"})),
        Subscriber("b1", "prod", frozenset({"db"})),
        Subscriber("c1", "idle", frozenset()),
    ]
    assert plan_reads(subs) == (
        Read("a1", "default", ("cache", "db")),
        Read("b1", "prod", ("db",)),
    )
    # After a failure the namespace is asked as its next alloc.
    assert plan_reads(subs, attempt=1)[0] == Read("a2", "default", ("cache", "db"))
    assert plan_reads([Subscriber("c1", "idle", frozenset())]) == ()


def test_changed_subscribers__only_the_allocs_reading_a_changed_name_of_their_namespace() -> None:
    before = {("default", "db"): [{"Port": 1}], ("default", "cache"): [], ("prod", "db"): [{"Port": 1}]}
    after = {("default", "db"): [{"Port": 2}], ("default", "cache"): [], ("prod", "db"): [{"Port": 1}]}
    subs = [
        Subscriber("reads-db", "default", frozenset({"db"})),
        Subscriber("reads-cache", "default", frozenset({"cache"})),
        Subscriber("prod-db", "prod", frozenset({"db"})),
        Subscriber("both", "default", frozenset({"cache", "db"})),
    ]
    assert changed_subscribers(before, after, subs) == ("both", "reads-db")
    # A name first seen now changed (from unknown); a name not read this round did not.
    assert changed_subscribers({}, {("prod", "db"): []}, subs) == ("prod-db",)
    assert changed_subscribers(before, {}, subs) == ()


class _FakeServer:
    """Registrations by namespace; the index is the whole table's, as the servers keep it.
    Counts the calls parked at once (a blocking call waiting for the index to pass)."""

    def __init__(self, namespaces: dict[str, str]) -> None:
        self.cond = threading.Condition()
        self.index = 5
        self.namespace_of = namespaces  # alloc ID -> namespace
        self.regs: list[tuple[str, structs_pb2.ServiceRegistration]] = []
        self.parked = 0
        self.most_parked = 0
        self.blocking_calls = 0
        self.fail_next = 0

    def set(self, *regs: tuple[str, structs_pb2.ServiceRegistration]) -> None:
        with self.cond:
            self.regs = list(regs)
            self.index += 1
            self.cond.notify_all()

    def fetch(
        self,
        alloc_id: str,
        names: Sequence[str],
        min_index: int,
        wait_s: float,
        cancel: threading.Event | None,
    ) -> tuple[Sequence[structs_pb2.ServiceRegistration], int]:
        namespace = self.namespace_of[alloc_id]
        with self.cond:
            if self.fail_next:
                self.fail_next -= 1
                raise ServerUnreachable("s1", "UNAVAILABLE", "down")
            if min_index:
                self.blocking_calls += 1
            waited = 0.0
            self.parked += 1
            self.most_parked = max(self.most_parked, self.parked)
            try:
                while (
                    self.index <= min_index
                    and waited < wait_s
                    and not (cancel is not None and cancel.is_set())
                ):
                    self.cond.wait(0.02)
                    waited += 0.02
            finally:
                self.parked -= 1
            return [r for ns, r in self.regs if ns == namespace and r.service_name in names], self.index


def _reg(name: str, port: int) -> structs_pb2.ServiceRegistration:
    return structs_pb2.ServiceRegistration(service_name=name, address="10.0.0.1", port=port)


def test_service_watch__many_allocs_share_one_parked_query_and_each_hears_its_own_changes() -> None:
    allocs = {f"a{i:03d}": "default" for i in range(100)} | {"p1": "prod"}
    server = _FakeServer(allocs)
    server.set(("default", _reg("db", 1)), ("default", _reg("cache", 1)), ("prod", _reg("db", 7)))
    watch = ServiceWatch(server.fetch, log=structlog.get_logger())
    heard: dict[str, int] = {}
    lock = threading.Lock()

    def on_change(alloc_id: str) -> None:
        with lock:
            heard[alloc_id] = heard.get(alloc_id, 0) + 1

    handles = {}
    for alloc_id, namespace in allocs.items():
        handle = watch.subscribe(alloc_id, namespace)
        name = "cache" if alloc_id == "a000" else "db"
        (first,) = handle.lookup(name)
        assert first["Port"] == (7 if namespace == "prod" else 1)
        handle.watch(lambda a=alloc_id: on_change(a))
        handles[alloc_id] = handle
    watch.start()
    try:
        assert wait_for(lambda: server.parked == 1, 5.0)
        # Only default's db moves: the 99 allocs reading it hear it, a000 (cache) and p1 (prod) do not.
        server.set(("default", _reg("db", 2)), ("default", _reg("cache", 1)), ("prod", _reg("db", 7)))
        assert wait_for(lambda: len(heard) == 99, 5.0), heard
        assert "a000" not in heard and "p1" not in heard
        assert handles["a001"].lookup("db")[0]["Port"] == 2
        # prod's db moves: only p1 hears it, through the same round.
        server.set(("default", _reg("db", 2)), ("default", _reg("cache", 1)), ("prod", _reg("db", 8)))
        assert wait_for(lambda: heard.get("p1") == 1, 5.0), heard
        assert heard["a001"] == 1
        assert server.most_parked == 1
        # A stopped alloc hears nothing more; the rest still do.
        handles["a001"].stop()
        server.set(("default", _reg("db", 3)), ("default", _reg("cache", 1)), ("prod", _reg("db", 8)))
        assert wait_for(lambda: heard.get("a002") == 2, 5.0), heard
        assert heard["a001"] == 1
        assert server.most_parked == 1
    finally:
        assert watch.join(5.0)


def test_service_watch__a_name_looked_up_later_is_read_again_at_once_and_a_failure_is_retried() -> None:
    server = _FakeServer({"a1": "default", "a2": "default"})
    server.set(("default", _reg("db", 1)))
    watch = ServiceWatch(server.fetch, log=structlog.get_logger())
    heard: list[str] = []
    first = watch.subscribe("a1", "default")
    first.lookup("db")
    first.watch(lambda: heard.append("a1"))
    watch.start()
    try:
        assert wait_for(lambda: server.parked == 1, 5.0)
        # The server is down for a new name's lookup: it renders as none, and the watch
        # reads it again at once (it was read at no index), without waiting for a change.
        server.fail_next = 1
        second = watch.subscribe("a2", "default")
        second.watch(lambda: heard.append("a2"))
        with server.cond:
            server.regs.append(("default", _reg("cache", 9)))  # there, but at the same index
        assert second.lookup("cache") == []
        assert wait_for(lambda: "a2" in heard, 5.0), heard
        assert second.lookup("cache")[0]["Port"] == 9
        assert "a1" not in heard
        server.set(("default", _reg("db", 2)), ("default", _reg("cache", 9)))
        assert wait_for(lambda: "a1" in heard, 5.0), heard
        assert first.lookup("db")[0]["Port"] == 2
        assert heard.count("a2") == 1
    finally:
        assert watch.join(5.0)
