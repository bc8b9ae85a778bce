"""The client agent's pure core: task/alloc status, restart policy, alloc diff, update queue,
heartbeat cadence, stop_on_client_after, durations, fingerprint, and local state files."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from drover.client.allocdiff import AllocDiff, LocalAlloc, ServerAlloc, diff_allocs
from drover.client.drivers._duration import parse_duration_ns
from drover.client.errors import DriverConfigError, StateError
from drover.client.fingerprint import HostFacts, build_node, fingerprint
from drover.client.restarts import RestartPolicy, RestartWindow, decide_restart
from drover.client.state import AllocRecord, StateDB, TaskRecord
from drover.client.sync import (
    Backoff,
    PendingUpdates,
    allocs_to_stop_after_disconnect,
    heartbeat_interval_s,
    heartbeat_timeout_s,
)
from drover.client.taskstate import AllocStatus, alloc_status
from drover.common.taskstate import TaskEvent, TaskState
from drover.v1 import structs_pb2

S = 1_000_000_000

PENDING = TaskState()
RUNNING = TaskState(state="running", started_at_ns=1)
DONE = TaskState(state="dead", failed=False)
FAILED = TaskState(state="dead", failed=True)


# --- alloc status from task states --------------------------------------------------------


@pytest.mark.parametrize(
    ("states", "expected"),
    [
        ({}, "pending"),
        ({"a": PENDING}, "pending"),
        ({"a": RUNNING, "b": PENDING}, "running"),
        ({"a": RUNNING, "b": DONE}, "running"),
        ({"a": DONE, "b": DONE}, "complete"),
        ({"a": RUNNING, "b": FAILED}, "failed"),
        ({"a": DONE, "b": FAILED}, "failed"),
        ({"a": DONE, "b": PENDING}, "pending"),
    ],
    ids=[
        "no-tasks",
        "all-pending",
        "one-running",
        "running-and-done",
        "all-done",
        "any-failed-wins-over-running",
        "done-and-failed",
        "done-and-restarting",
    ],
)
def test_alloc_status__derived_from_all_task_states(states: dict[str, TaskState], expected: str) -> None:
    assert alloc_status("a1", states).client_status == expected


def test_task_state__events_are_capped_and_round_trip() -> None:
    state = TaskState()
    for i in range(15):
        state = state.with_event(TaskEvent("Restarting", str(i), i))
    assert len(state.events) == 10 and state.events[0].message == "5"
    assert TaskState.from_dict(json.loads(json.dumps(state.to_dict()))) == state


# --- restart policy -------------------------------------------------------------------------

POLICY = RestartPolicy(attempts=2, interval_ns=60 * S, delay_ns=1 * S, mode="fail")


def test_restart__within_attempts__restarts_after_delay_plus_jitter() -> None:
    decision, window = decide_restart(
        POLICY, RestartWindow(), job_type="service", exit_code=1, now_ns=100 * S, jitter=0.5
    )
    assert decision.restart and decision.delay_ns == S + S // 8
    assert window == RestartWindow(start_ns=100 * S, count=1)


def test_restart__attempts_exceeded__mode_fail__dead_and_failed() -> None:
    window = RestartWindow(start_ns=100 * S, count=2)
    decision, _ = decide_restart(POLICY, window, job_type="service", exit_code=1, now_ns=110 * S, jitter=0)
    assert not decision.restart and decision.failed
    assert "mode is fail" in decision.reason


def test_restart__attempts_exceeded__mode_delay__waits_out_the_interval() -> None:
    policy = RestartPolicy(attempts=1, interval_ns=60 * S, delay_ns=S, mode="delay")
    window = RestartWindow(start_ns=100 * S, count=1)
    decision, after = decide_restart(
        policy, window, job_type="service", exit_code=1, now_ns=110 * S, jitter=0
    )
    assert decision.restart and decision.delay_ns == 50 * S and not decision.failed
    assert after == RestartWindow(start_ns=160 * S, count=0)


def test_restart__old_window__starts_over() -> None:
    window = RestartWindow(start_ns=100 * S, count=2)
    decision, after = decide_restart(
        POLICY, window, job_type="service", exit_code=1, now_ns=200 * S, jitter=0
    )
    assert decision.restart and after == RestartWindow(start_ns=200 * S, count=1)


@pytest.mark.parametrize(
    ("job_type", "exit_code", "restart", "failed"),
    [
        ("batch", 0, False, False),
        ("sysbatch", 0, False, False),
        ("service", 0, True, False),
        ("batch", 3, True, False),
        ("service", None, True, False),
    ],
    ids=[
        "batch-success-completes",
        "sysbatch-success-completes",
        "service-exit-0-restarts",
        "batch-failure-restarts",
        "unknown-exit-restarts",
    ],
)
def test_restart__by_job_type_and_exit(
    job_type: str, exit_code: int | None, restart: bool, failed: bool
) -> None:
    decision, _ = decide_restart(
        POLICY, RestartWindow(), job_type=job_type, exit_code=exit_code, now_ns=S, jitter=0
    )
    assert (decision.restart, decision.failed) == (restart, failed)


def test_restart__zero_attempts__first_failure_is_final() -> None:
    policy = RestartPolicy(attempts=0, interval_ns=60 * S, delay_ns=S, mode="fail")
    decision, _ = decide_restart(policy, RestartWindow(), job_type="batch", exit_code=2, now_ns=S, jitter=0)
    assert not decision.restart and decision.failed


# --- alloc diff -----------------------------------------------------------------------------


def _server(alloc_id: str, desired: str = "run", client: str = "pending", index: int = 10) -> ServerAlloc:
    return ServerAlloc(alloc_id, desired, client, index)


def test_diff__new_run_alloc__start() -> None:
    assert diff_allocs([_server("a")], {}) == AllocDiff(start=("a",))


@pytest.mark.parametrize("client", ["complete", "failed", "lost"])
def test_diff__new_terminal_alloc__ignored(client: str) -> None:
    assert diff_allocs([_server("a", client=client)], {}) == AllocDiff(ignore=("a",))


def test_diff__new_stopped_alloc__ignored() -> None:
    assert diff_allocs([_server("a", desired="stop")], {}) == AllocDiff(ignore=("a",))


@pytest.mark.parametrize("desired", ["stop", "evict"])
def test_diff__known_alloc_desired_stop__stop_once(desired: str) -> None:
    local = {"a": LocalAlloc("a", 10, stopping=False)}
    assert diff_allocs([_server("a", desired=desired, index=11)], local) == AllocDiff(stop=("a",))
    stopping = {"a": LocalAlloc("a", 11, stopping=True)}
    assert diff_allocs([_server("a", desired=desired, index=11)], stopping) == AllocDiff(ignore=("a",))


def test_diff__server_marked_unknown__reconnect_and_update() -> None:
    local = {"a": LocalAlloc("a", 10, stopping=False)}
    diff = diff_allocs([_server("a", client="unknown", index=12)], local)
    assert diff == AllocDiff(reconnect=("a",), update=("a",))


def test_diff__own_status_echo__ignored() -> None:
    # The client's own UpdateAllocs bumps modify_index only; alloc_modify_index stays.
    local = {"a": LocalAlloc("a", 10, stopping=False)}
    assert diff_allocs([_server("a", client="running", index=10)], local) == AllocDiff(ignore=("a",))


def test_diff__alloc_gone_from_server__remove() -> None:
    local = {"a": LocalAlloc("a", 10, stopping=False), "b": LocalAlloc("b", 10, stopping=True)}
    assert diff_allocs([_server("a", index=10)], local) == AllocDiff(remove=("b",), ignore=("a",))


# --- the update queue, cadence, stop_on_client_after ------------------------------------------


def _status(alloc_id: str, client_status: str) -> AllocStatus:
    return AllocStatus(alloc_id, client_status, "", {})


def test_pending_updates__newest_per_alloc_wins() -> None:
    q = PendingUpdates()
    q.put(_status("a", "pending"))
    q.put(_status("a", "running"))
    q.put(_status("b", "running"))
    batch = q.take()
    assert sorted((s.alloc_id, s.client_status) for s in batch) == [("a", "running"), ("b", "running")]
    assert len(q) == 0


def test_pending_updates__restored_batch_never_overwrites_newer() -> None:
    q = PendingUpdates()
    q.put(_status("a", "running"))
    batch = q.take()
    q.put(_status("a", "complete"))  # arrived while the batch was in flight
    q.restore(batch)
    assert q.snapshot()["a"].client_status == "complete"


def test_heartbeat_interval__half_the_ttl() -> None:
    assert heartbeat_interval_s(10 * S, 10 * S) == 5.0
    assert heartbeat_interval_s(0, 4 * S) == 2.0
    assert heartbeat_interval_s(1, 4 * S) == 0.05


def test_heartbeat_timeout__waits_while_the_ttl_leaves_a_retry() -> None:
    # 12.5 s of TTL left with a 5 s RPC timeout: wait 7.5 s, keeping 5 s for a retry.
    assert heartbeat_timeout_s(12.5, 5.0) == 7.5
    # Never less than the RPC timeout: too little TTL left, or none (never heard yet).
    assert heartbeat_timeout_s(6.0, 5.0) == 5.0
    assert heartbeat_timeout_s(-3.0, 5.0) == 5.0


def test_stop_after_disconnect__only_groups_with_the_setting_past_their_window() -> None:
    allocs = {"short": 5 * S, "long": 60 * S, "none": 0}
    assert allocs_to_stop_after_disconnect(100 * S, 100 * S, allocs) == []
    assert allocs_to_stop_after_disconnect(106 * S, 100 * S, allocs) == ["short"]
    assert allocs_to_stop_after_disconnect(161 * S, 100 * S, allocs) == ["long", "short"]


def test_backoff__grows_within_cap_and_resets() -> None:
    b = Backoff(0.1, 1.0, random.Random(7))
    delays = [b.next() for _ in range(8)]
    assert all(0.1 <= d <= 1.0 for d in delays)
    assert max(delays[4:]) > 0.2
    b.reset()
    assert b.next() == pytest.approx(0.1)


# --- durations ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "ns"),
    [
        ("30s", 30 * S),
        ("250ms", S // 4),
        ("1h30m", 5400 * S),
        ("1.5s", 3 * S // 2),
        (2, 2 * S),
        (0.5, S // 2),
        (1.001, 1_001_000_000),  # exact: the float product would give 1,000,999,999
        ("0", 0),
    ],
)
def test_duration__parses(value: object, ns: int) -> None:
    assert parse_duration_ns(value, "run_for") == ns


@pytest.mark.parametrize("value", ["30", "3x", "-1s", True, [], -2])
def test_duration__rejects(value: object) -> None:
    with pytest.raises(DriverConfigError, match="run_for"):
        parse_duration_ns(value, "run_for")


# --- fingerprint ----------------------------------------------------------------------------------

FACTS = HostFacts(
    hostname="host-a",
    kernel_name="linux",
    kernel_version="6.1.0",
    machine="x86_64",
    os_name="debian",
    os_version="12",
    cores=4,
    mhz_per_core=0,
    memory_bytes=8 * 1024**3,
    disk_free_bytes=50 * 1024**3,
    disk_total_bytes=100 * 1024**3,
    address="10.0.0.5",
)


class _Settings:
    node_name = "c1"
    datacenter = "dc2"
    node_class = "edge"
    node_pool = "gpu"
    meta = {"rack": "r1"}


def test_fingerprint__unknown_clock_speed__1000_mhz_per_core() -> None:
    fp = fingerprint(FACTS, "c1", ["raw_exec", "mock"])
    assert (fp.cpu_mhz, fp.memory_mb, fp.disk_mb) == (4000, 8192, 50 * 1024)
    assert fp.attributes["cpu.arch"] == "amd64"
    assert fp.attributes["unique.name"] == "c1"
    assert fp.attributes["driver.mock"] == fp.attributes["driver.raw_exec"] == "1"


def test_fingerprint__known_clock_speed__cores_times_mhz() -> None:
    from dataclasses import replace

    assert fingerprint(replace(FACTS, mhz_per_core=2500.7), "c1", []).cpu_mhz == 10000


def test_build_node__ready_eligible_with_dynamic_port_range() -> None:
    node = build_node("id-1", "secret-1", _Settings(), fingerprint(FACTS, "c1", ["mock"]))
    assert node.node_pool == "gpu"
    assert (node.id, node.secret_id, node.name, node.datacenter, node.node_class) == (
        "id-1",
        "secret-1",
        "c1",
        "dc2",
        "edge",
    )
    assert (node.status, node.scheduling_eligibility) == ("ready", "eligible")
    assert (node.resources.min_dynamic_port, node.resources.max_dynamic_port) == (20000, 32000)
    assert node.meta["rack"] == "r1"
    assert node.address == "10.0.0.5"


# --- local state ------------------------------------------------------------------------------------


def test_state__identity_made_once_and_kept(tmp_path: Path) -> None:
    ids = iter(["node-1", "secret-1", "node-2", "secret-2"])
    first = StateDB(tmp_path).load_or_create_identity(lambda: next(ids))
    again = StateDB(tmp_path).load_or_create_identity(lambda: next(ids))
    assert first == again and first.node_id == "node-1" and first.secret_id == "secret-1"


def test_state__unreadable_identity__refuses_to_become_another_node(tmp_path: Path) -> None:
    db = StateDB(tmp_path)
    (tmp_path / "client" / "node.json").write_text("{not json")
    with pytest.raises(StateError, match=r"node\.json"):
        db.load_or_create_identity(lambda: "x")


def test_state__alloc_record_round_trips_and_deletes(tmp_path: Path) -> None:
    db = StateDB(tmp_path)
    alloc = structs_pb2.Allocation(id="a1", job_id="web", task_group="g", alloc_modify_index=7)
    job = structs_pb2.Job(id="web", type="service", groups=[structs_pb2.TaskGroup(name="g")])
    record = AllocRecord(
        alloc=alloc,
        job=job,
        tasks={
            "main": TaskRecord(
                state=RUNNING.with_event(TaskEvent("Started", "", 5)),
                handle={"driver": "raw_exec", "pid": 123, "create_time": 1700000000.25},
                window=RestartWindow(start_ns=3, count=1),
            )
        },
        stop_requested=True,
        stop_reason="why",
    )
    db.put_alloc(record)
    assert not list((tmp_path / "client" / "allocs").glob(".*.tmp"))
    (loaded,) = StateDB(tmp_path).load_allocs()
    assert loaded == record
    db.delete_alloc("a1")
    assert StateDB(tmp_path).load_allocs() == []


def test_state__corrupt_alloc_record__set_aside(tmp_path: Path) -> None:
    db = StateDB(tmp_path)
    (tmp_path / "client" / "allocs" / "bad.json").write_text("{")
    assert db.load_allocs() == []
    assert (tmp_path / "client" / "allocs" / "bad.corrupt").exists()


# --- package boundaries -----------------------------------------------------------------------------

PACKAGE = Path(__file__).resolve().parents[2] / "client_agent"
# docs/design.md: client_agent (drover.client) imports itself, drover.v1 (generated protobuf) and
# third-party libraries only.
# ``drover.common`` is what every drover process shares (it imports none of them).
ALLOWED_TOP_LEVEL = {"drover", "google", "grpc", "prometheus_client", "psutil", "structlog"}


def _modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py"))


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_boundary__client_agent_never_imports_server_or_scheduler(path: Path) -> None:
    import ast
    import sys

    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        for name in names:
            top = name.split(".")[0]
            assert top in ALLOWED_TOP_LEVEL or top in sys.stdlib_module_names, f"{path.name} imports {name}"
            if top == "drover":
                assert name.startswith(("drover.v1", "drover.client", "drover.common")), (
                    f"{path.name} imports {name}"
                )


def test_boundary__grpc_only_in_the_rpc_module() -> None:
    users = sorted(
        p.name for p in _modules() if "import grpc" in p.read_text() or "_pb2_grpc" in p.read_text()
    )
    assert users == ["rpc.py"]


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_public_names__every_name_in_all_exists(path: Path) -> None:
    import importlib

    rel = path.relative_to(PACKAGE).with_suffix("")
    module = importlib.import_module(".".join(("drover", "client", *rel.parts)).removesuffix(".__init__"))
    for name in getattr(module, "__all__", ()):
        assert hasattr(module, name), f"{module.__name__}.__all__ names missing {name!r}"
