"""The ``drover`` CLI run as an operator runs it, against a LocalCluster's servers."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from deploy.cluster import LocalCluster, agent_args

# The name a test's lone server goes by (``lone_server_args``).
LONE_SERVER: str = "s1"


def drover_cli(
    *args: str, env: Mapping[str, str] | None = None, cwd: Path | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """``drover <args>`` in its own process, with ``env`` as its only DROVER_* settings: the
    runner's own DROVER_ADDR, DROVER_TOKEN, ... never leak in, so each test says everything
    the command is given. stdin closed, so a command that would ask for confirmation fails
    instead of waiting for ever."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("DROVER_")}
    return subprocess.run(
        [sys.executable, "-m", "drover.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
        env={**clean, **(env or {})},
        cwd=cwd,
    )


def run_cli(cluster: LocalCluster, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """``drover <args>`` with DROVER_ADDR naming every server of ``cluster``."""
    return drover_cli(*args, env={"DROVER_ADDR": ",".join(cluster.grpc_addresses)}, timeout=timeout)


def run_job_file(cluster: LocalCluster, directory: Path, name: str, text: str) -> None:
    """``drover job run -detach`` of ``text``, written to ``<directory>/<name>.hcl`` as an
    operator's job file; the command must succeed."""
    path = directory / f"{name}.hcl"
    path.write_text(text)
    result = run_cli(cluster, "job", "run", "-detach", str(path))
    assert result.returncode == 0, result.stderr


def one_error_line(result: subprocess.CompletedProcess[str]) -> str:
    """The CLI's whole answer to a refused command: exit 1 and one ``Error: ...`` line on
    stderr (no traceback, no usage dump), which the test then reads."""
    assert result.returncode == 1, (result.returncode, result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.stderr
    return lines[0]


def lone_server_args(data_dir: Path, *extra: str) -> list[str]:
    """``agent -server`` arguments of a one-server cluster named ``s1`` on ``data_dir``:
    the start the agent-startup and TLS tests each vary by ``extra`` flags."""
    # -http-port 0: never the default 4649, which another agent on this host may hold.
    return [*agent_args("server", LONE_SERVER, data_dir), "-http-port", "0", *extra]
