"""An alloc's service watch (client_agent/services.py), against a fake Fetch: a scripted
server whose registrations a test changes, answering blocking calls by index."""

from __future__ import annotations

import threading
from collections.abc import Sequence

import structlog

from deploy.cluster import wait_for
from drover.client.errors import ServerUnreachable
from drover.client.services import ServiceCache
from drover.v1 import structs_pb2


class _FakeServer:
    """Registrations by name at an index; a blocking fetch waits for the index to pass."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.index = 1
        self.regs: list[structs_pb2.ServiceRegistration] = []
        self.calls: list[tuple[tuple[str, ...], int]] = []
        self.fail_next = 0

    def set(self, *regs: structs_pb2.ServiceRegistration) -> None:
        with self.cond:
            self.regs = list(regs)
            self.index += 1
            self.cond.notify_all()

    def fetch(
        self, names: Sequence[str], min_index: int, wait_s: float, cancel: threading.Event | None
    ) -> tuple[Sequence[structs_pb2.ServiceRegistration], int]:
        with self.cond:
            self.calls.append((tuple(names), min_index))
            if self.fail_next:
                self.fail_next -= 1
                raise ServerUnreachable("s1", "UNAVAILABLE", "down")
            # Cancellable as the real call is: it looks at its flag every few milliseconds.
            waited = 0.0
            while (
                self.index <= min_index and waited < wait_s and not (cancel is not None and cancel.is_set())
            ):
                self.cond.wait(0.02)
                waited += 0.02
            return [r for r in self.regs if r.service_name in names], self.index


def _reg(name: str, port: int) -> structs_pb2.ServiceRegistration:
    return structs_pb2.ServiceRegistration(service_name=name, address="10.0.0.1", port=port, tags=["t"])


def test_service_cache__first_lookup_fetches_then_the_watch_reports_each_change() -> None:
    server = _FakeServer()
    server.set(_reg("db", 5432))
    cache = ServiceCache(server.fetch, log=structlog.get_logger())
    (first,) = cache.lookup("db")
    assert (first["Address"], first["Port"], first["Tags"], first["Name"]) == ("10.0.0.1", 5432, ["t"], "db")
    assert cache.lookup("db") == [first], "a known name is not fetched again"
    assert len(server.calls) == 1

    changes: list[int] = []
    cache.watch(lambda: changes.append(len(cache.lookup("db"))))
    wait_for(lambda: len(server.calls) >= 2, 5, message="the watch's blocking call")
    assert server.calls[1] == (("db",), server.index), "the watch blocks from the index it has"
    server.set(_reg("db", 5432), _reg("db", 5433))
    wait_for(lambda: changes == [2], 5, message="one change reported")
    server.set(_reg("db", 5432), _reg("db", 5433), _reg("other", 1))  # nothing db-related changed
    wait_for(lambda: len(server.calls) >= 4, 5, message="the watch to go round again")
    assert changes == [2]
    server.set()
    wait_for(lambda: changes == [2, 0], 5, message="the removal reported")
    cache.stop()
    assert cache.join(2.0), "a stopped watch ends without waiting out its blocking call"


def test_service_cache__server_down__lookup_renders_none_and_the_watch_retries() -> None:
    server = _FakeServer()
    server.fail_next = 2
    cache = ServiceCache(server.fetch, log=structlog.get_logger())
    assert cache.lookup("db") == []
    changes: list[int] = []
    cache.watch(lambda: changes.append(len(cache.lookup("db"))))
    server.set(_reg("db", 1))
    wait_for(lambda: changes == [1], 10, message="the change seen once the server answers")
    assert cache.join(2.0)
