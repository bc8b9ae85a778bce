"""One AllocRunner driven directly (the mock driver, no agent, no servers): what an in-place
update changes in tasks that are already running."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import pytest

from drover.client.clock import SystemClock
from drover.client.drivers.mock import MockDriver
from drover.client.runner import AllocRunner
from drover.client.state import StateDB
from drover.client.taskstate import AllocStatus
from drover.v1 import structs_pb2
from tests.unit.test_client_fake_server import alloc, job, wait_until

S = 1_000_000_000


def _policy(attempts: int) -> structs_pb2.RestartPolicy:
    return structs_pb2.RestartPolicy(attempts=attempts, interval_ns=600 * S, delay_ns=S // 50, mode="fail")


@pytest.fixture
def store(tmp_path: Path) -> StateDB:
    return StateDB(tmp_path / "data")


@pytest.fixture
def statuses() -> list[AllocStatus]:
    return []


@pytest.fixture
def started(store: StateDB, statuses: list[AllocStatus]) -> Iterator[AllocRunner]:
    v0 = job("flaky", restart=_policy(1), version=0)
    runner = AllocRunner(
        alloc("r1", v0),
        v0,
        drivers={"mock": MockDriver()},
        store=store,
        clock=SystemClock(),
        rng=random.Random(7),
        on_update=statuses.append,
    )
    runner.start()
    try:
        yield runner
    finally:
        runner.destroy()
        assert runner.join(10.0)


def _restarts(runner: AllocRunner) -> int:
    return runner.task_records()["main"].state.restarts


def _fail_once(runner: AllocRunner, restarts_before: int) -> None:
    """One failed exit of the running task (as a check_restart makes one), judged by its
    restart policy; returns once the runner has judged it."""
    task = runner.task_runners()["main"]
    wait_until(lambda: task.running, 10, "main running")
    assert task.restart("failing", failure=True)
    wait_until(
        lambda: _restarts(runner) > restarts_before or runner.is_finished(),
        10,
        "the exit judged",
    )


def test_in_place_update__running_task_takes_the_new_restart_policy__keeps_its_count(
    started: AllocRunner,
) -> None:
    """v0 allows 1 attempt; one failure uses it. v1 (in place) allows 3: the second failure
    restarts where v0 would fail it, and the fourth fails it, so the attempt v0 counted
    still counts (a fresh window would allow a fifth)."""
    runner = started
    _fail_once(runner, 0)
    assert _restarts(runner) == 1 and not runner.is_finished()

    v1 = job("flaky", restart=_policy(3), version=1)
    runner.update(alloc("r1", v1), v1)
    _fail_once(runner, 1)
    _fail_once(runner, 2)
    assert _restarts(runner) == 3 and not runner.is_finished()

    _fail_once(runner, 3)
    wait_until(runner.is_finished, 10, "main failed for good")
    state = runner.task_records()["main"].state
    assert state.failed and state.restarts == 3
    assert runner.status().client_status == "failed"
