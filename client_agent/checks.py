"""The checks of an alloc's services (``service { provider = "nomad" check { ... } }``).

drover has no Consul: the client runs each check itself, on the node where the alloc runs,
and only for deployment health (``update { health_check = "checks" }``, client_agent/health.py).

- ``http``: a request to ``<protocol>://127.0.0.1:<port>/<path>``, where ``<port>`` is the
  value the scheduler gave the check's port label in this alloc; any 2xx or 3xx status
  passes (redirects are not followed: a 3xx is the answer). An https check does not verify
  the certificate: the question is whether the task answers, on loopback.
- ``tcp``: a connection to ``127.0.0.1:<port>`` is accepted.
- ``script``: ``command args...`` exits 0, run with the task's environment and in its
  task directory (Nomad's "passing"; its "warning", exit 1, does not pass).

Every check has its ``timeout``: a check that does not answer in time fails. A check never
raises; whatever goes wrong is a failing ``CheckOutcome`` with a short reason.
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

__all__ = ["CHECK_HOST", "CheckOutcome", "CheckSpec", "check_specs", "run_check"]

CHECK_HOST: Final = "127.0.0.1"
_OUTPUT_CHARS: Final = 500


@dataclass(frozen=True, slots=True)
class CheckOutcome:
    passed: bool
    output: str = ""


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
    for index, (task_name, service) in enumerate(owned):
        service_name = service.name or f"service[{index}]"
        for i, check in enumerate(service.checks):
            name = check.name or f"check[{i}]"
            key = f"{task_name}/{service_name}/{name}" if task_name else f"{service_name}/{name}"
            run_in = check.task or task_name
            env, cwd = task_envs.get(run_in, ({}, ""))
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
    return CheckOutcome(200 <= status < 400, f"{spec.method} {url}: HTTP {status}")


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
    return CheckOutcome(proc.returncode == 0, f"exit {proc.returncode}: {output}".rstrip(": "))


def _reason(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__
