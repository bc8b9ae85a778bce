"""An alloc's stop, in Nomad's order, as real raw_exec processes see it: each task writes to
one file when it gets SIGTERM and again as it exits (a while later), so the file shows who
was told first and whether the next wave waited for the one before it."""

from __future__ import annotations

import json
import random
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from deploy.cluster import wait_for
from drover.client.clock import SystemClock
from drover.client.drivers.raw_exec import RawExecDriver
from drover.client.runner import AllocRunner
from drover.client.state import StateDB
from drover.client.taskstate import AllocStatus
from drover.v1 import structs_pb2

S = 1_000_000_000

_TASK_SCRIPT = textwrap.dedent(
    """
    import signal, sys, time
    name, log = sys.argv[1], sys.argv[2]

    def write(what):
        with open(log, "a") as out:
            out.write(f"{name}:{what}\\n")

    def on_term(signum, frame):
        write("term")
        time.sleep(0.4)  # a slow shutdown: the next wave must wait for it
        write("exit")
        sys.exit(0)

    signal.signal(signal.SIGTERM, on_term)
    write("run")
    if len(sys.argv) > 3:
        sys.exit(0)  # a poststop task: runs once and is done
    while True:
        time.sleep(0.05)
    """
)


def _task(
    name: str, script: Path, log: Path, *, hook: str = "", sidecar: bool = False, leader: bool = False
) -> structs_pb2.Task:
    args = [str(script), name, str(log)] + (["once"] if hook == "poststop" else [])
    task = structs_pb2.Task(
        name=name,
        driver="raw_exec",
        config_json=json.dumps({"command": sys.executable, "args": args}),
        kill_timeout_ns=10 * S,
        leader=leader,
        resources=structs_pb2.Resources(cpu_mhz=100, memory_mb=64),
    )
    if hook:
        task.lifecycle.CopyFrom(structs_pb2.TaskLifecycle(hook=hook, sidecar=sidecar))
    return task


@pytest.fixture
def runner(tmp_path: Path) -> Iterator[tuple[AllocRunner, Path]]:
    script = tmp_path / "task.py"
    script.write_text(_TASK_SCRIPT)
    log = tmp_path / "order.log"
    tasks = [
        _task("proxy", script, log, hook="prestart", sidecar=True),
        _task("main", script, log, leader=True),
        _task("worker", script, log),
        _task("logs", script, log, hook="poststart", sidecar=True),
        _task("cleanup", script, log, hook="poststop"),
    ]
    job = structs_pb2.Job(
        id="web",
        type="batch",
        groups=[
            structs_pb2.TaskGroup(
                name="g",
                count=1,
                tasks=tasks,
                restart=structs_pb2.RestartPolicy(attempts=0, mode="fail"),
            )
        ],
    )
    alloc = structs_pb2.Allocation(
        id="a1", namespace="default", job_id="web", task_group="g", desired_status="run"
    )
    statuses: list[AllocStatus] = []
    runner = AllocRunner(
        alloc,
        job,
        drivers={"raw_exec": RawExecDriver()},
        store=StateDB(tmp_path / "data"),
        clock=SystemClock(),
        rng=random.Random(1),
        on_update=statuses.append,
    )
    runner.start()
    try:
        yield runner, log
    finally:
        runner.destroy()
        runner.join(20.0)


def _lines(log: Path) -> list[str]:
    return log.read_text().splitlines() if log.exists() else []


def test_stop__leader_then_main_tasks_then_sidecars_then_poststop(runner: tuple[AllocRunner, Path]) -> None:
    alloc_runner, log = runner
    running = {"proxy:run", "main:run", "worker:run", "logs:run"}
    assert wait_for(lambda: running <= set(_lines(log)), 20.0)
    started = len(_lines(log))

    alloc_runner.stop("alloc desired status is stop")
    assert wait_for(lambda: "cleanup:run" in _lines(log), 30.0)
    assert wait_for(alloc_runner.is_finished, 10.0)

    order = _lines(log)[started:]
    # Each wave is told only once the one before it has exited: the leader, the main task,
    # the two sidecars (together, in either order), then the poststop task runs.
    assert order[:4] == ["main:term", "main:exit", "worker:term", "worker:exit"], order
    assert sorted(order[4:8]) == ["logs:exit", "logs:term", "proxy:exit", "proxy:term"], order
    assert order.index("logs:term") < order.index("logs:exit"), order
    assert order.index("proxy:term") < order.index("proxy:exit"), order
    assert order[8:] == ["cleanup:run"], order
    assert alloc_runner.status().client_status == "complete"


def test_destroy__same_waves_as_a_stop(runner: tuple[AllocRunner, Path]) -> None:
    """The servers forgot the alloc without stopping it first (garbage collected): its
    tasks stop in the same waves, not all at once, and its record is gone at once."""
    alloc_runner, log = runner
    running = {"proxy:run", "main:run", "worker:run", "logs:run"}
    assert wait_for(lambda: running <= set(_lines(log)), 20.0)
    started = len(_lines(log))
    store = StateDB(log.parent / "data")
    assert [r.alloc.id for r in store.load_allocs()] == ["a1"]

    alloc_runner.destroy()
    assert store.load_allocs() == []
    assert wait_for(lambda: "cleanup:run" in _lines(log), 30.0)
    assert wait_for(alloc_runner.is_finished, 10.0)

    order = _lines(log)[started:]
    assert order[:4] == ["main:term", "main:exit", "worker:term", "worker:exit"], order
    assert sorted(order[4:8]) == ["logs:exit", "logs:term", "proxy:exit", "proxy:term"], order
    assert order[8:] == ["cleanup:run"], order
    assert store.load_allocs() == []  # the tasks' ends wrote no record back
