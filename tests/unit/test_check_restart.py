"""Service checks for the whole life of an alloc: check_restart counting (pure, the time
passed in), the watcher that runs the checks and reports their statuses, check_restart read
from HCL and Nomad's API JSON and refused when invalid, and a registration's health."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import pytest

from drover.client.checks import (
    CHECK_CRITICAL,
    CHECK_PASSING,
    CHECK_WARNING,
    CheckOutcome,
    CheckRestartPolicy,
    CheckSpec,
    CheckStatus,
)
from drover.client.checkwatch import OUTPUT_REPORT_INTERVAL_S, CheckWatcher, FailureCount, count_failures
from drover.scheduler.structs import (
    Allocation,
    AllocCheckStatus,
    CheckRestart,
    Service,
    ServiceCheck,
)
from drover.scheduler.validate import ValidationError, validate_job
from drover.server.jobspec import JobspecError, parse_jobspec
from drover.server.services.registrations import is_passing, registrations_for, service_health
from drover.v1 import api_pb2, structs_pb2
from tests.fixtures.clock import ManualClock
from tests.unit.test_client_agent import agent_leaving_tasks, running_agent, status_is
from tests.unit.test_client_fake_server import alloc, fake_server, job, task, wait_until

S = 1_000_000_000
STARTED = 100 * S


def _count(policy: CheckRestartPolicy, results: list[tuple[str, int]], started: int = STARTED) -> list[bool]:
    """Whether each result (status, seconds after the start) asks for a restart."""
    count = FailureCount()
    asked = []
    for status, after_s in results:
        count, restart = count_failures(policy, count, status, started, started + after_s * S)
        asked.append(restart)
    return asked


# -- counting ------------------------------------------------------------------------


def test_count__limit_failures_in_a_row_after_grace__one_restart() -> None:
    policy = CheckRestartPolicy(limit=3, grace_ns=2 * S)
    asked = _count(policy, [(CHECK_CRITICAL, s) for s in (0, 1, 2, 3, 4, 5, 6)])
    # 0s and 1s are inside the grace; 2s, 3s, 4s are the three; then this run is done.
    assert asked == [False, False, False, False, True, False, False]


def test_count__a_pass_resets_the_count() -> None:
    policy = CheckRestartPolicy(limit=2, grace_ns=0)
    results = [(CHECK_CRITICAL, 1), (CHECK_PASSING, 2), (CHECK_CRITICAL, 3), (CHECK_CRITICAL, 4)]
    assert _count(policy, results) == [False, False, False, True]


def test_count__warnings__fail_unless_ignored() -> None:
    results = [(CHECK_WARNING, 1), (CHECK_WARNING, 2)]
    assert _count(CheckRestartPolicy(limit=2, grace_ns=0), results) == [False, True]
    ignoring = CheckRestartPolicy(limit=2, grace_ns=0, ignore_warnings=True)
    assert _count(ignoring, results) == [False, False]
    assert _count(ignoring, [(CHECK_CRITICAL, 1), (CHECK_WARNING, 2), (CHECK_CRITICAL, 3)]) == [
        False,
        False,
        False,
    ]


def test_count__limit_zero_or_task_not_running__never() -> None:
    assert (
        _count(CheckRestartPolicy(limit=0, grace_ns=0), [(CHECK_CRITICAL, s) for s in range(5)])
        == [False] * 5
    )
    count, restart = count_failures(
        CheckRestartPolicy(limit=1, grace_ns=0), FailureCount(), CHECK_CRITICAL, 0, STARTED
    )
    assert (count, restart) == (FailureCount(), False)


def test_count__a_new_start__new_count_and_new_grace() -> None:
    policy = CheckRestartPolicy(limit=2, grace_ns=5 * S)
    count = FailureCount()
    count, _ = count_failures(policy, count, CHECK_CRITICAL, STARTED, STARTED + 6 * S)
    assert count.failures == 1
    restarted = STARTED + 10 * S
    count, restart = count_failures(policy, count, CHECK_CRITICAL, restarted, restarted + 1 * S)
    assert not restart and count == FailureCount(run_started_ns=restarted)
    count, restart = count_failures(policy, count, CHECK_CRITICAL, restarted, restarted + 5 * S)
    assert not restart and count.failures == 1
    count, restart = count_failures(policy, count, CHECK_CRITICAL, restarted, restarted + 6 * S)
    assert restart and count.restart_asked


# -- the watcher ----------------------------------------------------------------------


class Harness:
    def __init__(
        self, spec: CheckSpec, outcomes: list[CheckOutcome], known: tuple[CheckStatus, ...] = ()
    ) -> None:
        self.clock = ManualClock(STARTED)
        self.outcomes = outcomes
        self.starts: dict[str, int] = {"server": STARTED}
        self.changes = 0
        self.restarts: list[tuple[str, str]] = []
        self.watcher = CheckWatcher(
            [spec],
            clock=self.clock,
            task_starts=lambda: dict(self.starts),
            on_change=self._changed,
            restart=lambda task, reason: self.restarts.append((task, reason)),
            log_fields={},
            run=lambda _spec: self.outcomes.pop(0),
            known=known,
        )

    def _changed(self) -> None:
        self.changes += 1

    def tick_at(self, after_s: int) -> None:
        self.clock.now = STARTED + after_s * S
        self.watcher.tick()

    def status(self) -> str:
        (status,) = self.watcher.statuses()
        return status.status


def _spec(restart: CheckRestartPolicy | None = None) -> CheckSpec:
    return CheckSpec(
        key="api/alive",
        type="tcp",
        interval_ns=S,
        timeout_ns=S,
        task="",
        service="api",
        check="alive",
        restart=restart,
        restart_task="server",
        runs_in=("server",),
    )


def test_watcher__reports_only_changes__and_restarts_at_the_limit() -> None:
    passed, failed = CheckOutcome(True, "ok"), CheckOutcome(False, "refused")
    h = Harness(_spec(CheckRestartPolicy(limit=2, grace_ns=0)), [passed, passed, failed, failed, failed])
    h.tick_at(0)
    assert (h.status(), h.changes) == (CHECK_PASSING, 1)
    h.tick_at(1)
    assert h.changes == 1  # the same status: nothing to report
    h.tick_at(2)
    assert (h.status(), h.changes, h.restarts) == (CHECK_CRITICAL, 2, [])
    h.tick_at(3)
    assert len(h.restarts) == 1 and h.restarts[0][0] == "server"
    assert "'alive'" in h.restarts[0][1] and "2 failures in a row" in h.restarts[0][1]
    h.tick_at(4)
    assert len(h.restarts) == 1  # this run of the task was told once
    (status,) = h.watcher.statuses()
    assert (status.service, status.check, status.task, status.output) == ("api", "alive", "", "refused")
    assert status.timestamp_ns == STARTED + 2 * S  # when it became critical


def test_watcher__not_run_before_its_task_runs__critical_once_it_stops() -> None:
    h = Harness(_spec(), [CheckOutcome(True, "ok")])
    h.starts = {}
    h.tick_at(0)
    assert h.watcher.statuses() == () and h.changes == 0
    h.starts = {"server": STARTED + S}
    h.tick_at(1)
    assert h.status() == CHECK_PASSING
    h.starts = {}
    h.tick_at(2)
    assert (h.status(), h.changes) == (CHECK_CRITICAL, 2)
    assert h.outcomes == []  # the check did not run while the task was down


def test_watcher__known_statuses_kept__the_first_run_reported_once_anyway() -> None:
    known = CheckStatus("", "api", "alive", CHECK_PASSING, "ok", STARTED - 60 * S)
    other = CheckStatus("", "api", "gone", CHECK_CRITICAL, "", STARTED - 60 * S)
    h = Harness(_spec(), [CheckOutcome(True, "ok"), CheckOutcome(True, "ok")], known=(known, other))
    assert h.watcher.statuses() == (known,)  # a check the job no longer has is dropped
    h.tick_at(0)
    assert (h.watcher.statuses(), h.changes) == ((known,), 1)  # same status, same timestamp
    h.tick_at(1)
    assert h.changes == 1


def test_watcher__output_changes__reported_at_most_once_per_interval__status_changes_at_once() -> None:
    """A check whose output changes every run (it prints the time) is reported by itself
    once per OUTPUT_REPORT_INTERVAL_S, with its latest output; its timestamp stays when it
    became passing. A status change goes out at once, throttle or not."""
    interval = int(OUTPUT_REPORT_INTERVAL_S)
    outcomes = [CheckOutcome(True, f"t={s}") for s in range(interval + 2)] + [CheckOutcome(False, "down")]
    h = Harness(_spec(), outcomes)
    h.tick_at(0)
    assert h.changes == 1
    for second in range(1, interval):
        h.tick_at(second)
        (status,) = h.watcher.statuses()
        assert status.output == f"t={second}"  # kept, for the next report, but not sent alone
    assert h.changes == 1
    h.tick_at(interval)
    (status,) = h.watcher.statuses()
    assert (h.changes, status.output, status.timestamp_ns) == (2, f"t={interval}", STARTED)
    h.tick_at(interval + 1)
    assert h.changes == 2  # the next output waits its own interval
    h.tick_at(interval + 2)
    assert (h.changes, h.status()) == (3, CHECK_CRITICAL)


def test_watcher__an_output_that_changed_once__reported_once_its_interval_is_over() -> None:
    """Held back by the throttle, a new output still goes out when the interval is over,
    even though the check's later runs change nothing; and then only once."""
    interval = int(OUTPUT_REPORT_INTERVAL_S)
    outcomes = [CheckOutcome(True, "v1")] + [CheckOutcome(True, "v2")] * (interval + 5)
    h = Harness(_spec(), outcomes)
    h.tick_at(0)
    h.tick_at(1)
    assert h.changes == 1
    h.tick_at(interval - 1)
    assert h.changes == 1
    h.tick_at(interval)
    assert h.changes == 2
    for second in range(interval + 1, interval + 4):
        h.tick_at(second)
    assert h.changes == 2


def test_watcher__a_raising_check_is_critical() -> None:
    spec = _spec()

    def broken(_spec: CheckSpec) -> CheckOutcome:
        raise OSError("no such file")

    watcher = CheckWatcher(
        [spec],
        clock=ManualClock(STARTED),
        task_starts=lambda: {"server": STARTED},
        on_change=lambda: None,
        restart=lambda task, reason: None,
        log_fields={},
        run=broken,
    )
    watcher.tick()
    (status,) = watcher.statuses()
    assert status.status == CHECK_CRITICAL and "could not run" in status.output


# -- the job file -----------------------------------------------------------------------

_JOB = """
job "web" {
  group "api" {
    network {
      port "http" {}
    }
    service {
      name = "api"
      port = "http"
      SERVICE_RESTART
      check {
        name     = "alive"
        type     = "tcp"
        interval = "1s"
        timeout  = "1s"
        TASK
        CHECK_RESTART
      }
      check {
        name     = "ready"
        type     = "http"
        path     = "/ready"
        interval = "1s"
        timeout  = "1s"
        TASK
      }
    }
    task "server" {
      driver = "raw_exec"
      config {
        command = "/bin/sleep"
      }
    }
  }
}
"""


def _job_text(service_restart: str = "", check_restart: str = "", task: str = 'task = "server"') -> str:
    return (
        _JOB.replace("SERVICE_RESTART", service_restart)
        .replace("CHECK_RESTART", check_restart)
        .replace("TASK", task)
    )


def _checks(text: str) -> tuple[ServiceCheck, ...]:
    job = parse_jobspec(text)
    validate_job(job)
    return job.groups[0].services[0].checks


def test_jobspec__check_restart__in_a_check_and_merged_over_the_services() -> None:
    alive, ready = _checks(
        _job_text(
            service_restart="check_restart {\n limit = 3\n ignore_warnings = true\n }",
            check_restart='check_restart {\n grace = "10s"\n }',
        )
    )
    assert alive.check_restart == CheckRestart(limit=3, grace_ns=10 * S, ignore_warnings=True)
    assert ready.check_restart == CheckRestart(limit=3, grace_ns=S, ignore_warnings=True)
    (alive, ready) = _checks(_job_text(check_restart="check_restart {\n limit = 2\n }"))
    assert alive.check_restart == CheckRestart(limit=2, grace_ns=S) and ready.check_restart is None


def test_jobspec__check_restart__from_nomad_api_json() -> None:
    api = {
        "Job": {
            "ID": "web",
            "TaskGroups": [
                {
                    "Name": "api",
                    "Networks": [{"DynamicPorts": [{"Label": "http"}]}],
                    "Services": [
                        {
                            "Name": "api",
                            "PortLabel": "http",
                            "Provider": "nomad",
                            "Checks": [
                                {
                                    "Name": "alive",
                                    "Type": "tcp",
                                    "TaskName": "server",
                                    "Interval": 1_000_000_000,
                                    "Timeout": 1_000_000_000,
                                    "CheckRestart": {
                                        "Limit": 4,
                                        "Grace": 3_000_000_000,
                                        "IgnoreWarnings": True,
                                    },
                                }
                            ],
                        }
                    ],
                    "Tasks": [{"Name": "server", "Driver": "raw_exec", "Config": {"command": "/bin/sleep"}}],
                }
            ],
        }
    }
    job = parse_jobspec(json.dumps(api))
    (check,) = job.groups[0].services[0].checks
    assert check.check_restart == CheckRestart(limit=4, grace_ns=3 * S, ignore_warnings=True)


@pytest.mark.parametrize(
    ("check_restart", "expected"),
    [
        (
            "check_restart {\n limt = 3\n }",
            'check[0] check_restart: unknown key "limt" (did you mean "limit"?)',
        ),
        (
            'check_restart {\n limit = "often"\n }',
            'check[0] check_restart limit: expected a number, got "often"',
        ),
        ('check_restart {\n grace = "soon"\n }', "check[0] check_restart grace: expected a duration"),
    ],
)
def test_jobspec__check_restart__bad_values_refused_naming_the_key(check_restart: str, expected: str) -> None:
    with pytest.raises(JobspecError) as caught:
        parse_jobspec(_job_text(check_restart=check_restart))
    assert expected in str(caught.value)


@pytest.mark.parametrize(
    ("check_restart", "task", "field", "message"),
    [
        ("check_restart {\n limit = -1\n }", 'task = "server"', "check_restart.limit", "must be >= 0"),
        (
            'check_restart {\n limit = 1\n grace = "-5s"\n }',
            'task = "server"',
            "check_restart.grace_ns",
            ">= 0",
        ),
        ("check_restart {\n limit = 1\n }", "", "checks[0].task", "must name the task to restart"),
        ("check_restart {\n limit = 1\n }", 'task = "nope"', "checks[0].task", '"nope" is not a task'),
    ],
)
def test_validate__check_restart__invalid_refused_naming_the_field(
    check_restart: str, task: str, field: str, message: str
) -> None:
    job = parse_jobspec(_job_text(check_restart=check_restart, task=task))
    with pytest.raises(ValidationError) as caught:
        validate_job(job)
    assert any(field in e.path and message in e.message for e in caught.value.errors), caught.value.errors


# -- a registration's health --------------------------------------------------------------


def _alloc(statuses: Mapping[str, str]) -> Allocation:
    return Allocation(
        id="a1",
        check_statuses=tuple(AllocCheckStatus(service="api", check=c, status=s) for c, s in statuses.items()),
    )


_SERVICE = Service(name="api", checks=(ServiceCheck(name="alive"), ServiceCheck(name="ready")))


def test_health__worst_check__pending_without_a_result__passing_without_checks() -> None:
    assert service_health(_alloc({}), "", Service(name="api"))[0] == "passing"
    assert service_health(_alloc({"alive": "passing"}), "", _SERVICE)[0] == "pending"
    assert service_health(_alloc({"alive": "passing", "ready": "passing"}), "", _SERVICE)[0] == "passing"
    assert service_health(_alloc({"alive": "warning", "ready": "passing"}), "", _SERVICE)[0] == "warning"
    assert service_health(_alloc({"alive": "warning", "ready": "critical"}), "", _SERVICE)[0] == "critical"
    # Another task's service of the same name is not this one.
    assert service_health(_alloc({"alive": "passing", "ready": "passing"}), "other", _SERVICE)[0] == "pending"


def test_registrations__carry_health__and_only_passing_ones_are_handed_out() -> None:
    job = parse_jobspec(_job_text(check_restart="check_restart {\n limit = 2\n }"))
    base = Allocation(id="a1", job_id="web", task_group="api", client_status="running")
    failing = Allocation(
        **{
            **{f: getattr(base, f) for f in ("id", "job_id", "task_group", "client_status")},
            "check_statuses": (
                AllocCheckStatus(service="api", check="alive", status="critical", output="refused"),
                AllocCheckStatus(service="api", check="ready", status="passing"),
            ),
        }
    )
    (pending,) = registrations_for(base, job, None, 7)
    (critical,) = registrations_for(failing, job, None, 8)
    assert (pending.health, is_passing(pending)) == ("pending", False)
    assert (critical.health, is_passing(critical)) == ("critical", False)
    assert [c.output for c in critical.checks] == ["refused", ""]
    passing = registrations_for(
        Allocation(
            id="a1",
            job_id="web",
            task_group="api",
            client_status="running",
            check_statuses=tuple(
                AllocCheckStatus(service="api", check=c, status="passing") for c in ("alive", "ready")
            ),
        ),
        job,
        None,
        9,
    )
    assert [r.health for r in passing] == ["passing"] and is_passing(passing[0])


# -- through the client agent (fake servers, the mock driver) ---------------------------------


def test_agent__check_restart__restarts_through_the_restart_policy_until_it_fails(tmp_path: Path) -> None:
    """Each check_restart is a failure to the restart policy: with one attempt, the first
    restarts the task, the second fails it; the checks' statuses go out with the alloc."""

    main = task(config='{"run_for": "1h"}')
    check = main.services.add(name="api", provider="nomad").checks.add(
        name="alive",
        type="script",
        command="/bin/sh",
        args=["-c", "exit 2"],
        interval_ns=S // 10,
        timeout_ns=S,
    )
    check.check_restart.limit = 2
    check.check_restart.grace_ns = 0
    policy = structs_pb2.RestartPolicy(attempts=1, interval_ns=600 * S, delay_ns=S // 20, mode="fail")
    j = job("sick", tasks=[main], restart=policy)
    with fake_server() as server, running_agent(tmp_path, server) as agent:
        agent.wait_registered(10)
        server.nodes.place(alloc("c1", j, agent.node_id), j)
        wait_until(lambda: status_is(server.nodes, "c1", "failed"), 20, "c1 failed after its check restarts")
        state = server.nodes.task_state("c1")
        assert state is not None and state.restarts == 1 and state.failed
        signaled = [e.message for e in state.events if e.type == "Restart Signaled"]
        assert len(signaled) == 2 and all("'alive'" in m for m in signaled), state.events
        assert [e.type for e in state.events][-1] == "Not Restarting"
        reported = [
            c
            for request in server.nodes.update_requests
            for update in request.allocs
            for c in update.check_statuses
        ]
        assert reported and {(c.service, c.check, c.status) for c in reported} >= {
            ("api", "alive", "critical")
        }


def test_agent__in_place_update_adding_a_check__the_check_runs(tmp_path: Path) -> None:
    def version(n: int, check: bool) -> structs_pb2.Job:
        main = task(config='{"run_for": "1h"}')
        if check:
            main.services.add(name="api", provider="nomad").checks.add(
                name="added",
                type="script",
                command="/bin/sh",
                args=["-c", "exit 2"],
                interval_ns=S // 10,
                timeout_ns=S,
            )
        return job("grows", tasks=[main], version=n)

    def reported() -> set[tuple[str, str]]:
        return {
            (c.check, c.status)
            for request in server.nodes.update_requests
            for update in request.allocs
            for c in update.check_statuses
        }

    with fake_server() as server, running_agent(tmp_path, server) as agent:
        agent.wait_registered(10)
        v0 = version(0, check=False)
        server.nodes.place(alloc("g1", v0, agent.node_id), v0)
        wait_until(lambda: status_is(server.nodes, "g1", "running"), 10, "g1 running")
        assert reported() == set()
        v1 = version(1, check=True)
        server.nodes.place(alloc("g1", v1, agent.node_id), v1)
        wait_until(lambda: ("added", "critical") in reported(), 10, "the added check reported")


def test_agent__restarted_agent__first_report_keeps_the_checks_statuses(tmp_path: Path) -> None:
    main = task(config='{"run_for": "1h"}')
    main.services.add(name="api", provider="nomad").checks.add(
        name="alive",
        type="script",
        command="/bin/sh",
        args=["-c", "exit 0"],
        interval_ns=S // 10,
        timeout_ns=S,
    )
    j = job("steady", tasks=[main])

    def statuses(requests: list[api_pb2.AllocUpdateRequest]) -> list[list[tuple[str, str, int]]]:
        return [
            [(c.check, c.status, c.timestamp_ns) for c in update.check_statuses]
            for request in requests
            for update in request.allocs
            if update.id == "s1"
        ]

    with fake_server() as server:
        with agent_leaving_tasks(tmp_path, server) as first:
            server.nodes.place(alloc("s1", j, first.node_id), j)
            wait_until(lambda: any(statuses(server.nodes.update_requests)), 10, "the check reported")
        before = len(server.nodes.update_requests)
        (last,) = [s for s in statuses(server.nodes.update_requests) if s][-1:]
        assert [(c, st) for c, st, _ in last] == [("alive", "passing")]
        with running_agent(tmp_path, server):
            wait_until(
                lambda: statuses(server.nodes.update_requests[before:]), 10, "the new agent's first report"
            )
            assert statuses(server.nodes.update_requests[before:])[0] == last
