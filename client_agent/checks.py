"""The checks of an alloc's services (``service { provider = "nomad" check { ... } }``).

drover has no Consul: the client runs each check itself, on the node where the alloc runs,
once per interval (client_agent/checkwatch.py), and the results serve three ends: the
statuses it reports with the alloc (each registration's health), its ``check_restart``s, and
deployment health (``update { health_check = "checks" }``, client_agent/health.py).

- ``http``: a request to ``<protocol>://127.0.0.1:<port>/<path>``, where ``<port>`` is the
  value the scheduler gave the check's port label in this alloc; any 2xx or 3xx status
  passes (redirects are not followed: a 3xx is the answer), 429 is a warning (Consul's
  rule), anything else critical. An https check does not verify the certificate: the
  question is whether the task answers, on loopback.
- ``tcp``: a connection to ``127.0.0.1:<port>`` is accepted.
- ``script``: ``command args...`` exits 0, run with the task's environment and in its
  task directory; exit 1 is a warning, any other critical (Nomad's and Consul's rule).

Only "passing" passes: a warning counts as a failure for deployment health, and for a
``check_restart`` unless it says ``ignore_warnings``. Every check has its ``timeout``: a
check that does not answer in time fails. A check never raises; whatever goes wrong is a
failing ``CheckOutcome`` with a short reason.
"""

from __future__ import annotations

import contextlib
import http.client
import os
import signal
import socket
import ssl
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

from drover.v1 import structs_pb2

__all__ = [
    "CHECK_CRITICAL",
    "CHECK_HOST",
    "CHECK_PASSING",
    "CHECK_WARNING",
    "CheckOutcome",
    "CheckRestartPolicy",
    "CheckSpec",
    "CheckStatus",
    "check_specs",
    "run_check",
]

CHECK_HOST: Final = "127.0.0.1"
CHECK_PASSING: Final = "passing"
CHECK_WARNING: Final = "warning"
CHECK_CRITICAL: Final = "critical"
_OUTPUT_CHARS: Final = 500
_HTTP_TOO_MANY_REQUESTS: Final = 429
_SCRIPT_WARNING_EXIT: Final = 1


@dataclass(frozen=True, slots=True)
class CheckOutcome:
    """One run's result: ``passed``, or failed (``warning`` a failure that is a warning)."""

    passed: bool
    output: str = ""
    warning: bool = False

    @property
    def status(self) -> str:
        if self.passed:
            return CHECK_PASSING
        return CHECK_WARNING if self.warning else CHECK_CRITICAL


@dataclass(frozen=True, slots=True)
class CheckStatus:
    """A check's latest status as the client reports it with the alloc: named by the task of
    a task-level service ("" for a group's), the service's name as written, and the
    check's name (``check[i]`` for an unnamed one), as the servers match them
    (server/services/registrations.py, ``service_health``). ``timestamp_ns`` is when the
    status became what it is, so an unchanged status reports the same value."""

    task: str
    service: str
    check: str
    status: str
    output: str = ""
    timestamp_ns: int = 0


@dataclass(frozen=True, slots=True)
class CheckRestartPolicy:
    """A check's ``check_restart``: ``limit`` failing results in a row (0: never), counted
    once ``grace_ns`` has passed since the task started; ``ignore_warnings``: a warning passes."""

    limit: int
    grace_ns: int
    ignore_warnings: bool = False


@dataclass(frozen=True, slots=True)
class CheckSpec:
    """One check, resolved for one alloc: the address and port number, or the command with
    its environment. ``key`` names it in logs and verdicts (service, check, and the task of
    a task-level service)."""

    key: str
    type: str
    interval_ns: int
    timeout_ns: int
    port: int = 0
    path: str = "/"
    method: str = "GET"
    protocol: str = "http"
    command: str = ""
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: str = ""
    # The names the status is reported under (``CheckStatus``).
    task: str = ""
    service: str = ""
    check: str = ""
    # The task a check_restart restarts, and the tasks that must run for the check to mean
    # anything (the check's task, the service's, or every task of the group's service).
    restart: CheckRestartPolicy | None = None
    restart_task: str = ""
    runs_in: tuple[str, ...] = ()


def check_specs(
    alloc: structs_pb2.Allocation,
    job: structs_pb2.Job,
    task_envs: Mapping[str, tuple[Mapping[str, str], str]],
) -> list[CheckSpec]:
    """Every check of the alloc's group services and task services, resolved.

    ``task_envs`` maps a task name to the environment and directory its driver gives it
    (what a script check runs with). A port label the alloc has no value for resolves to
    port 0, which fails: the job was validated, so that only happens when the scheduler
    and the job disagree, and a failing check is the honest answer.
    """
    group = next((g for g in job.groups if g.name == alloc.task_group), None)
    if group is None:
        return []
    ports = {p.label: p.value for p in alloc.resources.ports}
    specs: list[CheckSpec] = []
    owned: list[tuple[str, structs_pb2.Service]] = [("", s) for s in group.services]
    owned += [(task.name, s) for task in group.tasks for s in task.services]
    every_task = tuple(task.name for task in group.tasks)
    for index, (task_name, service) in enumerate(owned):
        service_name = service.name or f"service[{index}]"
        for i, check in enumerate(service.checks):
            name = check.name or f"check[{i}]"
            key = f"{task_name}/{service_name}/{name}" if task_name else f"{service_name}/{name}"
            run_in = check.task or task_name
            env, cwd = task_envs.get(run_in, ({}, ""))
            restart = None
            if check.HasField("check_restart") and check.check_restart.limit > 0:
                r = check.check_restart
                restart = CheckRestartPolicy(r.limit, max(0, r.grace_ns), r.ignore_warnings)
            specs.append(
                CheckSpec(
                    key=key,
                    type=check.type,
                    interval_ns=check.interval_ns,
                    timeout_ns=check.timeout_ns,
                    port=ports.get(check.port or service.port, 0),
                    path=check.path or "/",
                    method=check.method or "GET",
                    protocol=check.protocol or "http",
                    command=check.command,
                    args=tuple(check.args),
                    env=env,
                    cwd=cwd,
                    task=task_name,
                    service=service.name,
                    check=name,
                    restart=restart,
                    restart_task=run_in,
                    runs_in=(run_in,) if run_in else every_task,
                )
            )
    return specs


def run_check(spec: CheckSpec) -> CheckOutcome:
    """Run ``spec`` once, within its timeout."""
    timeout_s = max(spec.timeout_ns, 1) / 1e9
    if spec.type == "http":
        return _http(spec, timeout_s)
    if spec.type == "tcp":
        return _tcp(spec, timeout_s)
    if spec.type == "script":
        return _script(spec, timeout_s)
    return CheckOutcome(False, f"unknown check type {spec.type!r}")


def _http(spec: CheckSpec, timeout_s: float) -> CheckOutcome:
    if spec.port <= 0:
        return CheckOutcome(False, "the alloc has no value for the check's port label")
    conn: http.client.HTTPConnection
    if spec.protocol == "https":
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        conn = http.client.HTTPSConnection(CHECK_HOST, spec.port, timeout=timeout_s, context=context)
    else:
        conn = http.client.HTTPConnection(CHECK_HOST, spec.port, timeout=timeout_s)
    url = f"{spec.protocol}://{CHECK_HOST}:{spec.port}{spec.path}"
    try:
        conn.request(spec.method, spec.path)
        response = conn.getresponse()
        status = response.status
        response.read(_OUTPUT_CHARS)
    except (OSError, http.client.HTTPException, ValueError) as exc:  # ValueError: http.client's InvalidURL
        return CheckOutcome(False, f"{spec.method} {url}: {_reason(exc)}")
    finally:
        conn.close()
    return CheckOutcome(
        200 <= status < 400, f"{spec.method} {url}: HTTP {status}", warning=status == _HTTP_TOO_MANY_REQUESTS
    )


def _tcp(spec: CheckSpec, timeout_s: float) -> CheckOutcome:
    if spec.port <= 0:
        return CheckOutcome(False, "the alloc has no value for the check's port label")
    address = f"{CHECK_HOST}:{spec.port}"
    try:
        with socket.create_connection((CHECK_HOST, spec.port), timeout=timeout_s):
            pass
    except OSError as exc:
        return CheckOutcome(False, f"connect {address}: {_reason(exc)}")
    return CheckOutcome(True, f"connect {address}: accepted")


def _script(spec: CheckSpec, timeout_s: float) -> CheckOutcome:
    argv: Sequence[str] = [spec.command, *spec.args]
    env = {**os.environ, **spec.env}
    cwd = spec.cwd if spec.cwd and os.path.isdir(spec.cwd) else None
    try:
        proc = subprocess.Popen(
            argv,
            env=env,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            # Its own process group, so a timeout ends whatever the script started too.
            start_new_session=True,
        )
    except OSError as exc:
        return CheckOutcome(False, f"{spec.command}: {_reason(exc)}")
    try:
        out, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return CheckOutcome(False, f"{spec.command}: no exit within {timeout_s:g}s")
    output = out.decode("utf-8", "replace").strip()[:_OUTPUT_CHARS]
    return CheckOutcome(
        proc.returncode == 0,
        f"exit {proc.returncode}: {output}".rstrip(": "),
        warning=proc.returncode == _SCRIPT_WARNING_EXIT,
    )


def _reason(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__
