"""The API loop's view of the store's commits (server/api/_notify.py), on a real FSM and
store: a change of a table wakes only the waiters on it whose condition now holds; the
others stay parked as they were (the same future, never resumed), so one alloc change
costs a parked node watch a predicate call, not a coroutine run."""

from __future__ import annotations

import asyncio
import time

from drover.common.secrets import hash_secret
from drover.server.api._notify import IndexNotifier
from tests.fixtures import mock
from tests.fixtures.fsm_log import FsmLog


async def _until(check: object, what: str, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


def test_a_change_wakes_only_the_waiters_whose_condition_holds() -> None:
    log = FsmLog()
    nodes = [mock.node(id=n, secret_id="", secret_hash=hash_secret(n)) for n in ("n1", "n2")]
    for node in nodes:
        log.apply(mock.register_node_entry(node))
    log.apply(mock.register_job_entry(mock.job(id="web")))
    job = log.snap.job("default", "web")
    assert job is not None

    def has_alloc(node_id: str) -> object:
        return lambda s: any(True for _ in s.allocs_by_node(node_id))

    async def scenario() -> None:
        notifier = IndexNotifier(log.store, asyncio.get_running_loop())
        try:
            far = time.monotonic() + 30
            n1 = asyncio.create_task(notifier.wait_until(("allocs",), has_alloc("n1"), far))  # type: ignore[arg-type]
            n2 = asyncio.create_task(notifier.wait_until(("allocs",), has_alloc("n2"), far))  # type: ignore[arg-type]
            await _until(lambda: len(notifier._waiters.get("allocs", {})) == 2, "both waiters parked")
            parked_n1 = next(iter(notifier._waiters["allocs"]))  # the first parked: n1's

            log.apply(mock.plan_entry([mock.alloc(job, nodes[1], id="b1")]))  # n2's news only
            await _until(lambda: n2.done(), "n2's waiter woken")
            assert not n1.done()
            # n1's waiter was left parked as it was: the same future, never resumed.
            assert list(notifier._waiters["allocs"]) == [parked_n1] and not parked_n1.done()

            log.apply(mock.plan_entry([mock.alloc(job, nodes[0], id="a1")]))
            await asyncio.wait_for(n1, 5.0)
            assert [a.id for a in n1.result().allocs_by_node("n1")] == ["a1"]
        finally:
            notifier.stop()

    asyncio.run(scenario())
