"""The write batcher (server/write_batch.py) against a fake raft log that applies through
the real FSM when the test says an entry committed."""

from __future__ import annotations

import threading
from concurrent.futures import CancelledError, Future
from dataclasses import dataclass, field

import pytest
from prometheus_client import REGISTRY

from drover.server.errors import NoLeaderError, RaftError
from drover.server.fsm import FSM, ApplyResult, requests_of
from drover.server.state_store import StateStore
from drover.server.write_batch import Done, WriteBatcher
from tests.fixtures import mock


@dataclass
class FakeLog:
    """Stands in for raft: keeps each appended entry until ``commit`` or ``fail`` (a fake)."""

    store: StateStore = field(default_factory=StateStore)
    appended: list[tuple[bytes, Done]] = field(default_factory=list)
    next_index: int = 1

    def __post_init__(self) -> None:
        self.fsm = FSM(self.store)
        self.lock = threading.Lock()

    def append(self, data: bytes, done: Done) -> None:
        with self.lock:
            self.appended.append((data, done))

    def take(self) -> tuple[bytes, Done]:
        with self.lock:
            return self.appended.pop(0)

    def commit(self) -> int:
        """Apply the oldest appended entry and tell its batcher; its raft index."""
        data, done = self.take()
        index = self.next_index
        self.next_index += 1
        done(self.fsm.apply(data, index), None)
        return index

    def fail(self, error: BaseException) -> None:
        _data, done = self.take()
        done(None, error)

    def requests(self, i: int) -> list[bytes]:
        return requests_of(self.appended[i][0])


def register(job_id: str, **fields: object) -> bytes:
    return mock.register_job_entry(mock.job(id=job_id, **fields))


def result(future: Future[ApplyResult]) -> ApplyResult:
    return future.result(timeout=5)


def test_batcher__lone_write__proposed_at_once_as_itself() -> None:
    log = FakeLog()
    batcher = WriteBatcher(log.append, max_bytes=1 << 20)
    data = register("web")

    future = batcher.submit(data)

    assert [d for d, _ in log.appended] == [data]
    assert not future.done()
    index = log.commit()
    assert (result(future).index, result(future).error) == (index, "")


def test_batcher__writes_arriving_while_one_is_in_flight__one_entry_in_submit_order() -> None:
    log = FakeLog()
    batcher = WriteBatcher(log.append, max_bytes=1 << 20)
    first = batcher.submit(register("web"))
    waiting = [batcher.submit(register("web", priority=p)) for p in (10, 20, 30)]

    assert len(log.appended) == 1 and batcher.pending() == 3
    first_index = log.commit()

    assert len(log.appended) == 1, "the three waiting writes go as one entry"
    assert log.requests(0) == [register("web", priority=p) for p in (10, 20, 30)]
    batch_index = log.commit()
    assert result(first).index == first_index
    assert [result(f).index for f in waiting] == [batch_index] * 3
    # Applied in submit order: the last one submitted is what the state holds.
    job = log.store.snapshot().tables.jobs[("default", "web")]
    assert (job.priority, job.version) == (30, 3)
    assert [result(f).value["version"] for f in waiting] == [1, 2, 3]


def test_batcher__one_refused_request__its_own_error_and_its_neighbours_succeed() -> None:
    log = FakeLog()
    batcher = WriteBatcher(log.append, max_bytes=1 << 20)
    batcher.submit(register("seed"))
    ok_before = batcher.submit(register("web"))
    refused = batcher.submit(mock.deregister_entry("missing", purge=True))
    ok_after = batcher.submit(register("api"))
    log.commit()

    log.commit()

    assert result(ok_before).error == "" and result(ok_after).error == ""
    assert result(refused).error and result(refused).not_found
    assert {key[1] for key in log.store.snapshot().tables.jobs} == {"seed", "web", "api"}


def test_batcher__raft_fails_the_entry__every_caller_in_it_fails__the_next_entry_still_goes() -> None:
    log = FakeLog()
    batcher = WriteBatcher(log.append, max_bytes=1 << 20)
    batcher.submit(register("seed"))
    doomed = [batcher.submit(register(f"j{i}")) for i in range(3)]
    log.commit()
    later = batcher.submit(register("later"))

    log.fail(NoLeaderError("leadership changed before commit"))

    for future in doomed:
        with pytest.raises(NoLeaderError):
            result(future)
    assert len(log.appended) == 1, "the slot is free again: the waiting write was proposed"
    log.commit()
    assert result(later).error == ""


def test_batcher__cancelled_before_taken__never_written() -> None:
    log = FakeLog()
    batcher = WriteBatcher(log.append, max_bytes=1 << 20)
    batcher.submit(register("seed"))
    given_up = batcher.submit(register("gone"))
    kept = batcher.submit(register("kept"))

    assert given_up.cancel()
    log.commit()
    log.commit()

    with pytest.raises(CancelledError):
        given_up.result(timeout=0)
    assert result(kept).error == ""
    assert ("default", "gone") not in log.store.snapshot().tables.jobs


def test_batcher__taken_into_an_entry__can_no_longer_be_cancelled() -> None:
    log = FakeLog()
    batcher = WriteBatcher(log.append, max_bytes=1 << 20)

    proposed = batcher.submit(register("web"))

    assert not proposed.cancel()
    log.commit()
    assert result(proposed).error == ""


def test_batcher__reset__fails_the_waiting_writes_and_frees_the_slot() -> None:
    log = FakeLog()
    batcher = WriteBatcher(log.append, max_bytes=1 << 20)
    in_flight = batcher.submit(register("seed"))
    waiting = batcher.submit(register("web"))

    batcher.reset(NoLeaderError("leadership changed"))

    with pytest.raises(NoLeaderError):
        result(waiting)
    after = batcher.submit(register("api"))
    assert len(log.appended) == 2, "a write after the reset does not wait for the old entry"
    log.commit()
    log.commit()
    assert result(in_flight).error == "" and result(after).error == ""
    assert batcher.pending() == 0


def test_batcher__entry_bytes_bounded__waiting_writes_split_into_entries_under_the_bound() -> None:
    log = FakeLog()
    one = len(register("j0"))
    batcher = WriteBatcher(log.append, max_bytes=3 * one + 40)
    batcher.submit(register("seed"))
    futures = [batcher.submit(register(f"j{i}")) for i in range(5)]

    log.commit()

    assert len(log.requests(0)) == 3
    assert len(log.appended[0][0]) <= 3 * one + 40
    log.commit()
    assert len(log.requests(0)) == 2
    log.commit()
    assert all(result(f).error == "" for f in futures)


def test_batcher__request_count_bounded() -> None:
    log = FakeLog()
    batcher = WriteBatcher(log.append, max_bytes=1 << 20, max_requests=2)
    batcher.submit(register("seed"))
    for i in range(3):
        batcher.submit(register(f"j{i}"))

    log.commit()

    assert len(log.requests(0)) == 2


def test_batcher__snapshot_restore__proposed_as_an_entry_of_its_own() -> None:
    log = FakeLog()
    batcher = WriteBatcher(log.append, max_bytes=1 << 20)
    batcher.submit(register("seed"))
    before = batcher.submit(register("web"))
    restore = batcher.submit(mock.snapshot_restore_entry(StateStore().snapshot().tables))
    after = batcher.submit(register("api"))

    log.commit()
    assert len(log.requests(0)) == 1
    log.commit()
    assert log.requests(0) == [mock.snapshot_restore_entry(StateStore().snapshot().tables)]
    log.commit()
    log.commit()

    assert result(before).error == "" and result(restore).error == "" and result(after).error == ""
    assert [key[1] for key in log.store.snapshot().tables.jobs] == ["api"]


def test_batcher__append_raises__callers_fail_and_the_slot_is_freed() -> None:
    calls: list[bytes] = []

    def broken(data: bytes, done: Done) -> None:
        calls.append(data)
        raise OSError("journal gone")

    batcher = WriteBatcher(broken, max_bytes=1 << 20)

    with pytest.raises(RaftError, match="journal gone"):
        result(batcher.submit(register("web")))
    with pytest.raises(RaftError):
        result(batcher.submit(register("api")))
    assert len(calls) == 2


def test_batcher__many_threads_submitting_while_raft_commits_on_its_own_thread__every_write_answered() -> (
    None
):
    log = FakeLog()
    batcher = WriteBatcher(log.append, max_bytes=1 << 20)
    stop = threading.Event()

    def raft_thread() -> None:
        while not stop.is_set() or log.appended:
            if log.appended:
                log.commit()
            else:
                stop.wait(0.0005)

    committer = threading.Thread(target=raft_thread)
    committer.start()
    futures: list[Future[ApplyResult]] = []
    futures_lock = threading.Lock()

    def writer(n: int) -> None:
        for i in range(25):
            future = batcher.submit(register(f"w{n}-{i}"))
            with futures_lock:
                futures.append(future)
            future.result(timeout=10)

    writers = [threading.Thread(target=writer, args=(n,)) for n in range(8)]
    for t in writers:
        t.start()
    for t in writers:
        t.join(timeout=30)
    stop.set()
    committer.join(timeout=30)

    assert len(futures) == 200 and all(result(f).error == "" for f in futures)
    assert len(log.store.snapshot().tables.jobs) == 200
    assert log.next_index - 1 < 200, "concurrent writes shared entries"


def _batch_metric() -> tuple[float, float]:
    """(writes, entries) the batch-size histogram has counted so far."""
    writes = REGISTRY.get_sample_value("drover_raft_batch_requests_sum") or 0.0
    entries = REGISTRY.get_sample_value("drover_raft_batch_requests_count") or 0.0
    return writes, entries


def test_batcher__batch_size_metric__counts_the_writes_each_entry_carried() -> None:
    log = FakeLog()
    batcher = WriteBatcher(log.append, max_bytes=1 << 20)
    writes_before, entries_before = _batch_metric()
    batcher.submit(register("seed"))
    for i in range(3):
        batcher.submit(register(f"j{i}"))

    log.commit()
    log.commit()

    writes, entries = _batch_metric()
    assert (writes - writes_before, entries - entries_before) == (4, 2)
