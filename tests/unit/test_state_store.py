"""The state store: snapshot isolation, secondary indexes, table indexes and blocking queries.

Writes go through ``Txn`` exactly as the FSM makes them; reads through ``Snapshot``. The
blocking-query tests run a waiter thread and wait on events with deadlines, never sleep.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest

from drover.scheduler.structs import (
    ALLOC_CLIENT_RUNNING,
    JOB_TYPE_BATCH,
    JOB_TYPE_SERVICE,
    JOB_TYPE_SYSTEM,
    Allocation,
    Job,
    ServerMember,
)
from drover.server.state_store import TABLES, Snapshot, StateStore, Tables, Txn
from tests.fixtures import mock

DEADLINE_S = 10.0


def write(store: StateStore, index: int, fn: Callable[[Txn], object]) -> Tables:
    """One committed transaction at ``index``, as the FSM makes it."""
    txn = Txn(store.snapshot().tables, index)
    fn(txn)
    tables = txn.commit()
    store.commit(tables)
    return tables


def put_job(job: Job) -> Callable[[Txn], None]:
    def fn(txn: Txn) -> None:
        txn.put_job(job)
        txn.ensure_summary(job)

    return fn


def steps(*fns: Callable[[Txn], object]) -> Callable[[Txn], None]:
    """Several writes in one transaction."""

    def fn(txn: Txn) -> None:
        for step in fns:
            step(txn)

    return fn


def put_allocs(*allocs: Allocation) -> Callable[[Txn], None]:
    return steps(*(lambda txn, a=a: txn.put_alloc(a) for a in allocs))


def alloc_ids(allocs: list[Allocation]) -> set[str]:
    return {a.id for a in allocs}


@pytest.fixture
def store() -> StateStore:
    return StateStore()


# ---------------------------------------------------------------------------------------
# Snapshot isolation


def test_snapshot__taken_before_a_write__does_not_see_it(store: StateStore) -> None:
    job, node = mock.job(), mock.node()
    alloc = mock.alloc(job, node)
    before = store.snapshot()

    write(store, 1, put_job(job))
    write(store, 2, steps(lambda txn: txn.put_node(node), lambda txn: txn.put_alloc(alloc)))

    assert before.index == 0
    assert before.job(job.namespace, job.id) is None
    assert before.node(node.id) is None
    assert before.alloc(alloc.id) is None
    assert before.allocs_by_job(job.namespace, job.id) == []
    assert before.allocs_by_node(node.id) == []
    assert before.job_summary(job.namespace, job.id) is None
    assert before.table_index() == 0
    after = store.snapshot()
    assert after.index == 2
    assert after.alloc(alloc.id) == alloc
    assert alloc_ids(after.allocs_by_job(job.namespace, job.id)) == {alloc.id}


def test_snapshot__taken_before_an_update_or_delete__keeps_the_old_values(store: StateStore) -> None:
    job, node = mock.job(), mock.node()
    alloc = mock.alloc(job, node)
    write(store, 1, put_job(job))
    write(store, 2, lambda txn: txn.put_alloc(alloc))
    before = store.snapshot()

    write(store, 3, lambda txn: txn.put_alloc(replace(alloc, client_status=ALLOC_CLIENT_RUNNING)))
    write(store, 4, lambda txn: txn.delete_job((job.namespace, job.id)))

    assert before.alloc(alloc.id) == alloc
    assert before.job(job.namespace, job.id) is not None
    summary = before.job_summary(job.namespace, job.id)
    assert summary is not None and summary.summary["web"].starting == 1
    assert store.snapshot().job(job.namespace, job.id) is None


def test_txn__dropped_without_commit__leaves_the_store_as_it_was(store: StateStore) -> None:
    write(store, 1, lambda txn: txn.put_node(mock.node()))
    before = store.snapshot().tables

    txn = Txn(before, 2)
    txn.put_node(mock.node())
    txn.put_job(mock.job())
    del txn

    assert store.snapshot().tables is before


def test_txn__reads_its_own_writes_before_commit(store: StateStore) -> None:
    job = mock.job()
    alloc = mock.alloc(job, mock.node())
    txn = Txn(store.snapshot().tables, 1)

    txn.put_job(job)
    txn.put_alloc(alloc)

    assert txn.job((job.namespace, job.id)) == job
    assert txn.alloc(alloc.id) == alloc
    assert txn.allocs_of_job((job.namespace, job.id)) == [alloc]
    assert store.snapshot().job(job.namespace, job.id) is None


# ---------------------------------------------------------------------------------------
# Secondary indexes


def test_indexes__allocs_by_job_node_and_eval__follow_inserts(store: StateStore) -> None:
    web, api = mock.job(), mock.job()
    n1, n2 = mock.node(), mock.node()
    a1 = mock.alloc(web, n1, 0, eval_id="eval-a")
    a2 = mock.alloc(web, n2, 1, eval_id="eval-a")
    a3 = mock.alloc(api, n1, 0, eval_id="eval-b")

    write(store, 1, put_allocs(a1, a2, a3))

    snap = store.snapshot()
    assert alloc_ids(snap.allocs_by_job(web.namespace, web.id)) == {a1.id, a2.id}
    assert alloc_ids(snap.allocs_by_job(api.namespace, api.id)) == {a3.id}
    assert alloc_ids(snap.allocs_by_node(n1.id)) == {a1.id, a3.id}
    assert alloc_ids(snap.allocs_by_node(n2.id)) == {a2.id}
    assert alloc_ids(snap.allocs_by_eval("eval-a")) == {a1.id, a2.id}
    assert alloc_ids(snap.allocs_by_eval("eval-b")) == {a3.id}


def test_indexes__alloc_moved_to_another_node__follows(store: StateStore) -> None:
    job = mock.job()
    n1, n2 = mock.node(), mock.node()
    alloc = mock.alloc(job, n1)
    write(store, 1, lambda txn: txn.put_alloc(alloc))

    write(store, 2, lambda txn: txn.put_alloc(replace(alloc, node_id=n2.id)))

    snap = store.snapshot()
    assert snap.allocs_by_node(n1.id) == []
    assert alloc_ids(snap.allocs_by_node(n2.id)) == {alloc.id}
    assert n1.id not in snap.tables.allocs_by_node  # no empty buckets left behind
    assert alloc_ids(snap.allocs_by_job(job.namespace, job.id)) == {alloc.id}


def test_indexes__alloc_given_another_eval__follows(store: StateStore) -> None:
    alloc = mock.alloc(mock.job(), mock.node(), eval_id="eval-1")
    write(store, 1, lambda txn: txn.put_alloc(alloc))

    write(store, 2, lambda txn: txn.put_alloc(replace(alloc, eval_id="eval-2")))

    snap = store.snapshot()
    assert snap.allocs_by_eval("eval-1") == []
    assert alloc_ids(snap.allocs_by_eval("eval-2")) == {alloc.id}


def test_indexes__alloc_deleted__gone_from_every_index(store: StateStore) -> None:
    job, node = mock.job(), mock.node()
    keep, gone = mock.alloc(job, node, 0), mock.alloc(job, node, 1, eval_id="eval-gone")
    write(store, 1, put_allocs(keep, gone))

    write(store, 2, lambda txn: txn.delete_alloc(gone.id))

    snap = store.snapshot()
    assert snap.alloc(gone.id) is None
    assert alloc_ids(snap.allocs_by_job(job.namespace, job.id)) == {keep.id}
    assert alloc_ids(snap.allocs_by_node(node.id)) == {keep.id}
    assert snap.allocs_by_eval("eval-gone") == []
    assert "eval-gone" not in snap.tables.allocs_by_eval


def test_indexes__evals_by_job__follow_inserts_and_deletes(store: StateStore) -> None:
    web, api = mock.job(), mock.job()
    e1, e2, e3 = mock.eval_for(web), mock.eval_for(web), mock.eval_for(api)
    write(store, 1, steps(*(lambda txn, e=e: txn.put_eval(e) for e in (e1, e2, e3))))

    write(store, 2, lambda txn: txn.delete_eval(e1.id))

    snap = store.snapshot()
    assert {e.id for e in snap.evals_by_job(web.namespace, web.id)} == {e2.id}
    assert {e.id for e in snap.evals_by_job(api.namespace, api.id)} == {e3.id}
    write(store, 3, lambda txn: txn.delete_eval(e2.id))
    assert (web.namespace, web.id) not in store.snapshot().tables.evals_by_job


def test_indexes__jobs_by_type__follow_inserts_type_changes_and_deletes(store: StateStore) -> None:
    service, batch = mock.job(), mock.batch_job()
    write(store, 1, put_job(service))
    write(store, 2, put_job(batch))

    def types(snap: Snapshot) -> dict[str, set[str]]:
        return {
            t: {j.id for j in snap.jobs_by_type(t)}
            for t in (JOB_TYPE_SERVICE, JOB_TYPE_BATCH, JOB_TYPE_SYSTEM)
        }

    assert types(store.snapshot()) == {
        JOB_TYPE_SERVICE: {service.id},
        JOB_TYPE_BATCH: {batch.id},
        JOB_TYPE_SYSTEM: set(),
    }

    write(store, 3, put_job(replace(service, type=JOB_TYPE_SYSTEM)))
    assert types(store.snapshot()) == {
        JOB_TYPE_SERVICE: set(),
        JOB_TYPE_BATCH: {batch.id},
        JOB_TYPE_SYSTEM: {service.id},
    }

    write(store, 4, lambda txn: txn.delete_job((batch.namespace, batch.id)))
    assert types(store.snapshot()) == {
        JOB_TYPE_SERVICE: set(),
        JOB_TYPE_BATCH: set(),
        JOB_TYPE_SYSTEM: {service.id},
    }


def test_indexes__alloc_upserted_with_another_job__moves_between_jobs(store: StateStore) -> None:
    web, api, node = mock.job(), mock.job(), mock.node()
    alloc = mock.alloc(web, node)
    write(store, 1, lambda txn: txn.put_alloc(alloc))

    write(store, 2, lambda txn: txn.put_alloc(replace(alloc, job_id=api.id)))

    snap = store.snapshot()
    assert snap.allocs_by_job(web.namespace, web.id) == []
    assert alloc_ids(snap.allocs_by_job(api.namespace, api.id)) == {alloc.id}


def test_indexes__eval_updated_with_another_job__moves_between_jobs(store: StateStore) -> None:
    web, api = mock.job(), mock.job()
    ev = mock.eval_for(web)
    write(store, 1, lambda txn: txn.put_eval(ev))

    write(store, 2, lambda txn: txn.put_eval(replace(ev, job_id=api.id)))

    snap = store.snapshot()
    assert snap.evals_by_job(web.namespace, web.id) == []
    assert [e.id for e in snap.evals_by_job(api.namespace, api.id)] == [ev.id]


# ---------------------------------------------------------------------------------------
# Table indexes


def test_table_index__bumps_only_touched_tables(store: StateStore) -> None:
    job, node = mock.job(), mock.node()
    write(store, 3, lambda txn: txn.put_node(node))

    snap = store.snapshot()
    assert snap.table_index("nodes") == 3
    assert {t: snap.table_index(t) for t in TABLES if t != "nodes"} == dict.fromkeys(
        (t for t in TABLES if t != "nodes"), 0
    )

    write(store, 5, put_job(job))
    write(store, 8, lambda txn: txn.put_alloc(mock.alloc(job, node)))

    snap = store.snapshot()
    assert snap.index == 8
    assert snap.table_index("nodes") == 3
    assert snap.table_index("jobs") == 8  # its first live alloc made the job "running"
    assert snap.job(job.namespace, job.id).status == "running"  # type: ignore[union-attr]
    assert snap.table_index("job_versions") == 0
    assert snap.table_index("allocs") == 8
    assert snap.table_index("job_summaries") == 8  # the alloc moved a summary counter
    assert snap.table_index("nodes", "job_versions") == 3
    assert snap.table_index() == 8


def test_table_index__reads_in_a_txn__touch_nothing(store: StateStore) -> None:
    write(store, 1, lambda txn: txn.put_node(mock.node()))

    def read_only(txn: Txn) -> None:
        txn.node("node-x")
        txn.job(("default", "x"))
        txn.alloc("x")
        txn.eval("x")
        txn.summary(("default", "x"))
        txn.allocs_of_job(("default", "x"))

    tables = write(store, 2, read_only)

    assert dict(tables.table_index.items()) == {"nodes": 1}
    assert tables.index == 2


def test_table_index__delete_of_missing_objects__touches_nothing(store: StateStore) -> None:
    tables = write(
        store,
        1,
        steps(
            lambda txn: txn.delete_alloc("x"),
            lambda txn: txn.delete_eval("x"),
            lambda txn: txn.delete_job(("default", "x")),
            lambda txn: txn.delete_node("x"),
        ),
    )

    assert dict(tables.table_index.items()) == {}


# ---------------------------------------------------------------------------------------
# Blocking queries


class Waiter:
    """Runs one blocking call on its own thread; ``done`` is set when it returns."""

    def __init__(self, call: Callable[[], Any]) -> None:
        self.result: Any = None
        self.done = threading.Event()

        def run() -> None:
            self.result = call()
            self.done.set()

        self.thread = threading.Thread(target=run, daemon=True, name="waiter")
        self.thread.start()

    def finish(self) -> Any:
        assert self.done.wait(DEADLINE_S), f"the blocking call did not return within {DEADLINE_S}s"
        self.thread.join(DEADLINE_S)
        return self.result


def wait_until(predicate: Callable[[], bool], what: str) -> None:
    """Wait for ``predicate`` with a deadline (it depends on another thread)."""
    tick = threading.Event()
    for _ in range(int(DEADLINE_S * 1000)):
        if predicate():
            return
        tick.wait(0.001)
    raise AssertionError(f"timed out waiting for {what}")


def blocked_waiters(store: StateStore) -> int:
    # White box: the number of threads parked in the store's condition variable.
    return len(store._changed._waiters)  # type: ignore[attr-defined]


def test_wait_for__index_already_past__returns_immediately(store: StateStore) -> None:
    write(store, 4, lambda txn: txn.put_node(mock.node()))

    # A generous timeout: a wrong implementation would block the whole minute.
    waiter = Waiter(lambda: store.wait_for(("nodes",), 3, timeout=60.0))

    snap: Snapshot = waiter.finish()
    assert snap.index == 4


def test_wait_for__another_thread_commits__wakes_with_the_new_snapshot(store: StateStore) -> None:
    write(store, 1, lambda txn: txn.put_node(mock.node()))
    waiter = Waiter(lambda: store.wait_for(("allocs",), 1, timeout=60.0))
    wait_until(lambda: blocked_waiters(store) == 1, "the waiter to block")
    alloc = mock.alloc(mock.job(), mock.node())

    committer = threading.Thread(target=write, args=(store, 2, lambda txn: txn.put_alloc(alloc)))
    committer.start()
    committer.join(DEADLINE_S)

    snap: Snapshot = waiter.finish()
    assert snap.index == 2
    assert snap.alloc(alloc.id) == alloc


def test_wait_for__commit_to_another_table__keeps_waiting(store: StateStore) -> None:
    waiter = Waiter(lambda: store.wait_for(("allocs",), 0, timeout=60.0))
    wait_until(lambda: blocked_waiters(store) == 1, "the waiter to block")

    write(store, 1, lambda txn: txn.put_node(mock.node()))

    # notify_all took it off the condition; it must check and park again, not return.
    wait_until(lambda: blocked_waiters(store) == 1 or waiter.done.is_set(), "the waiter to re-check")
    assert not waiter.done.is_set()
    write(store, 2, lambda txn: txn.put_alloc(mock.alloc(mock.job(), mock.node())))
    assert waiter.finish().index == 2


def test_wait_for__no_tables_named__waits_on_any_table(store: StateStore) -> None:
    waiter = Waiter(lambda: store.wait_for((), 0, timeout=60.0))
    wait_until(lambda: blocked_waiters(store) == 1, "the waiter to block")

    write(store, 1, lambda txn: txn.put_server(ServerMember(name="s1", raft_address="s1:4647")))

    assert waiter.finish().index == 1


def test_wait_for__nothing_changes__times_out_with_the_current_snapshot(store: StateStore) -> None:
    write(store, 7, lambda txn: txn.put_node(mock.node()))

    snap = store.wait_for(("allocs",), 0, timeout=0.02)

    assert snap.index == 7
    assert snap.table_index("allocs") == 0


def test_wait_for__zero_timeout__returns_the_current_snapshot(store: StateStore) -> None:
    assert store.wait_for(("jobs",), 10, timeout=0.0).index == 0


def test_wait_for_index__reached__true_and_wakes_on_commit(store: StateStore) -> None:
    write(store, 1, lambda txn: txn.put_node(mock.node()))
    assert store.wait_for_index(1, timeout=60.0)
    waiter = Waiter(lambda: store.wait_for_index(2, timeout=60.0))
    wait_until(lambda: blocked_waiters(store) == 1, "the waiter to block")

    write(store, 2, lambda txn: txn.put_node(mock.node()))

    assert waiter.finish() is True


def test_wait_for_index__not_reached__false_after_timeout(store: StateStore) -> None:
    assert store.wait_for_index(1, timeout=0.02) is False
