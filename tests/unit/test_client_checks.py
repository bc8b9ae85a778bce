"""drover.client.checks: each check kind against the real thing on loopback (an HTTP
server, a TCP listener, a script), and the resolution of a job's checks for one alloc."""

from __future__ import annotations

import http.server
import socket
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from deploy.cluster import pick_free_ports
from drover.client.checks import CheckRestartPolicy, CheckSpec, check_specs, run_check
from drover.v1 import structs_pb2

S = 1_000_000_000


class _Server(http.server.ThreadingHTTPServer):
    """Joins its handler threads on close; ``released`` ends a ``/slow`` request."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.released = threading.Event()


class _Handler(http.server.BaseHTTPRequestHandler):
    """``/status/<code>`` answers with that code; ``/slow`` never answers: it hangs up once
    the test is over, so a check can only end it by its timeout."""

    server: _Server

    def do_GET(self) -> None:
        if self.path == "/slow":
            self.server.released.wait(_SLOW_CAP_S)
            return
        code = int(self.path.rsplit("/", 1)[1]) if self.path.startswith("/status/") else 200
        self.send_response(code)
        if 300 <= code < 400:
            self.send_header("Location", "/status/500")  # a followed redirect would fail the check
        self.end_headers()

    def do_HEAD(self) -> None:
        self.do_GET()

    def log_message(self, format: str, *args: object) -> None:
        pass


# Only a test that never ends its server could wait this long.
_SLOW_CAP_S = 30.0


@pytest.fixture
def http_port() -> Iterator[int]:
    server = _Server()
    # A short poll: shutdown() waits for serve_forever to look at its flag.
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.released.set()
        server.shutdown()
        server.server_close()  # joins the handler threads (not daemon threads)
        thread.join()


def free_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    (port,) = pick_free_ports(1)
    return port


def http_spec(port: int, path: str = "/", **changes: object) -> CheckSpec:
    fields: dict[str, object] = {"key": "web/http", "type": "http", "interval_ns": S, "timeout_ns": S}
    fields.update(port=port, path=path, **changes)
    return CheckSpec(**fields)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("path", "passed"),
    [
        ("/status/200", True),
        ("/status/204", True),
        ("/status/302", True),
        ("/status/404", False),
        ("/status/503", False),
    ],
    ids=["200", "204", "302-not-followed", "404", "503"],
)
def test_http_check__2xx_and_3xx_pass(http_port: int, path: str, passed: bool) -> None:
    outcome = run_check(http_spec(http_port, path))
    assert outcome.passed is passed, outcome.output
    assert f"127.0.0.1:{http_port}{path}" in outcome.output


def test_http_check__method_is_used(http_port: int) -> None:
    assert run_check(http_spec(http_port, "/status/200", method="HEAD")).passed
    # The handler has no POST: http.server answers 501.
    outcome = run_check(http_spec(http_port, "/status/200", method="POST"))
    assert not outcome.passed and "HTTP 501" in outcome.output


def test_http_check__nothing_listening__fails() -> None:
    outcome = run_check(http_spec(free_port()))
    assert not outcome.passed
    assert "refused" in outcome.output.lower()


def test_http_check__slower_than_its_timeout__fails(http_port: int) -> None:
    started = time.monotonic()
    outcome = run_check(http_spec(http_port, "/slow", timeout_ns=S // 5))
    assert not outcome.passed
    assert "timed out" in outcome.output
    assert time.monotonic() - started < 1.5


def test_http_check__path_http_client_refuses__fails_instead_of_raising(http_port: int) -> None:
    outcome = run_check(http_spec(http_port, "/a b\r\nX: y"))
    assert not outcome.passed


def test_http_check__no_port_value__fails_without_connecting() -> None:
    outcome = run_check(http_spec(0))
    assert not outcome.passed and "no value" in outcome.output


def tcp_spec(port: int) -> CheckSpec:
    return CheckSpec(key="web/tcp", type="tcp", interval_ns=S, timeout_ns=S, port=port)


def test_tcp_check__listener__passes() -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        outcome = run_check(tcp_spec(listener.getsockname()[1]))
    assert outcome.passed, outcome.output


def test_tcp_check__nothing_listening__fails() -> None:
    outcome = run_check(tcp_spec(free_port()))
    assert not outcome.passed
    assert "connect 127.0.0.1:" in outcome.output


def script_spec(
    code: str, *, env: dict[str, str] | None = None, cwd: str = "", timeout_ns: int = 5 * S
) -> CheckSpec:
    return CheckSpec(
        key="web/script",
        type="script",
        interval_ns=S,
        timeout_ns=timeout_ns,
        command=sys.executable,
        args=("-c", code),
        env=env or {},
        cwd=cwd,
    )


@pytest.mark.parametrize(
    ("code", "passed"), [(0, True), (1, False), (2, False)], ids=["exit-0", "exit-1-warning", "exit-2"]
)
def test_script_check__only_exit_0_passes(code: int, passed: bool) -> None:
    outcome = run_check(script_spec(f"import sys; print('said {code}'); sys.exit({code})"))
    assert outcome.passed is passed
    assert f"exit {code}: said {code}" == outcome.output


def test_script_check__runs_with_the_task_env_in_its_dir(tmp_path: Path) -> None:
    code = "import os, sys; sys.exit(0 if os.environ['NOMAD_TASK_NAME'] == 'server' and os.getcwd() == sys.argv[1] else 3)"
    spec = replace(
        script_spec(code, env={"NOMAD_TASK_NAME": "server"}, cwd=str(tmp_path)),
        args=("-c", code, str(tmp_path)),
    )
    outcome = run_check(spec)
    assert outcome.passed, outcome.output


def test_script_check__past_its_timeout__killed_and_fails() -> None:
    started = time.monotonic()
    outcome = run_check(script_spec("import time; time.sleep(30)", timeout_ns=S // 5))
    assert not outcome.passed and "no exit within" in outcome.output
    assert time.monotonic() - started < 5


def test_script_check__missing_command__fails() -> None:
    spec = CheckSpec(key="k", type="script", interval_ns=S, timeout_ns=S, command="/nonexistent/check")
    outcome = run_check(spec)
    assert not outcome.passed and "/nonexistent/check" in outcome.output


# ---------------------------------------------------------------------------------------
# From the job to what runs


def web_group(checks: list[structs_pb2.ServiceCheck], *tasks: structs_pb2.Task) -> structs_pb2.TaskGroup:
    """Group "g" whose one group service, "web" on the port labelled "http", has ``checks``:
    the check_specs tests differ in the checks and the tasks' own services, not in this."""
    service = structs_pb2.Service(name="web", port="http", checks=checks)
    return structs_pb2.TaskGroup(name="g", services=[service], tasks=tasks)


def test_check_specs__ports_resolved_from_the_alloc_and_envs_by_task() -> None:
    alive = structs_pb2.ServiceCheck(name="alive", type="http", path="/health", interval_ns=S, timeout_ns=S)
    script = structs_pb2.ServiceCheck(
        type="script", command="check", task="server", interval_ns=S, timeout_ns=S
    )
    admin = structs_pb2.ServiceCheck(type="tcp", port="admin", interval_ns=2 * S, timeout_ns=S)
    group = web_group(
        [alive, script], structs_pb2.Task(name="server", services=[structs_pb2.Service(checks=[admin])])
    )
    j = structs_pb2.Job(id="web", groups=[group])
    a = structs_pb2.Allocation(
        id="a1",
        task_group="g",
        resources=structs_pb2.AllocatedResources(
            ports=[
                structs_pb2.AllocatedPort(label="http", value=21000),
                structs_pb2.AllocatedPort(label="admin", value=21001),
            ]
        ),
    )
    envs = {"server": ({"NOMAD_TASK_NAME": "server"}, "/alloc/server")}

    specs = check_specs(a, j, envs)

    assert [(s.key, s.type, s.port) for s in specs] == [
        ("web/alive", "http", 21000),
        ("web/check[1]", "script", 21000),
        ("server/service[1]/check[0]", "tcp", 21001),
    ]
    assert specs[0].path == "/health"
    assert (specs[1].env, specs[1].cwd, specs[1].command) == (
        {"NOMAD_TASK_NAME": "server"},
        "/alloc/server",
        "check",
    )
    assert specs[2].interval_ns == 2 * S


@pytest.mark.parametrize(
    ("path", "status"),
    [("/status/200", "passing"), ("/status/429", "warning"), ("/status/503", "critical")],
)
def test_http_check__429_is_a_warning(http_port: int, path: str, status: str) -> None:
    outcome = run_check(http_spec(http_port, path))
    assert outcome.status == status, outcome.output


@pytest.mark.parametrize(("code", "status"), [(0, "passing"), (1, "warning"), (2, "critical")])
def test_script_check__exit_1_is_a_warning(code: int, status: str) -> None:
    outcome = run_check(script_spec(f"import sys; sys.exit({code})"))
    assert outcome.status == status and outcome.passed is (code == 0)


def test_check_specs__names_reported_and_the_task_a_check_restart_restarts() -> None:
    check = structs_pb2.ServiceCheck(name="alive", type="tcp", task="server", interval_ns=S, timeout_ns=S)
    check.check_restart.limit = 3
    check.check_restart.grace_ns = 5 * S
    group = web_group(
        [check, structs_pb2.ServiceCheck(type="tcp", interval_ns=S, timeout_ns=S)],
        structs_pb2.Task(
            name="server",
            services=[structs_pb2.Service(name="own", checks=[structs_pb2.ServiceCheck(type="tcp")])],
        ),
        structs_pb2.Task(name="sidecar"),
    )
    a = structs_pb2.Allocation(id="a1", task_group="g")
    alive, unnamed, own = check_specs(a, structs_pb2.Job(id="web", groups=[group]), {})
    assert (alive.task, alive.service, alive.check, alive.restart_task, alive.runs_in) == (
        "",
        "web",
        "alive",
        "server",
        ("server",),
    )
    assert alive.restart == CheckRestartPolicy(limit=3, grace_ns=5 * S)
    # A group service's check without a task runs while any task of the group runs.
    assert (unnamed.check, unnamed.restart, unnamed.runs_in) == ("check[1]", None, ("server", "sidecar"))
    assert (own.task, own.service, own.check, own.restart_task, own.runs_in) == (
        "server",
        "own",
        "check[0]",
        "server",
        ("server",),
    )
