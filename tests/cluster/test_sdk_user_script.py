"""The README's SDK example (deploy/examples/sdk_example.py) run as a user runs it: its own
process, started outside the checkout, against a dev agent; and type-checked as a user's
``mypy --strict`` would, against drover laid out as its wheel installs it (``py.typed``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

from deploy.cluster import pick_free_ports
from drover.sdk import Client
from tests.cluster.conftest import DevAgent

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "deploy" / "examples" / "sdk_example.py"
EXAMPLE_JOB_ID = "sdk-example"
SCRIPT_TIMEOUT_S = 150.0


def _user_env(address: str) -> dict[str, str]:
    """The runner's environment without its DROVER_* settings, pointed at ``address``."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("DROVER_")}
    return {**clean, "DROVER_ADDR": address}


def _run_example(cwd: Path, address: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(EXAMPLE), *args],
        capture_output=True,
        text=True,
        timeout=SCRIPT_TIMEOUT_S,
        stdin=subprocess.DEVNULL,
        env=_user_env(address),
        cwd=cwd,
    )


def test_sdk_example__run_as_a_user__runs_the_job_then_stops_it(dev_agent: DevAgent, tmp_path: Path) -> None:
    result = _run_example(tmp_path, dev_agent.address)

    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert "index" in lines[1] and lines[0].startswith(f"registered {EXAMPLE_JOB_ID}: evaluation "), lines
    assert any(line.endswith(": 2 of 2 running") for line in lines), lines
    assert sum(line.startswith("alloc ") and line.endswith(": running") for line in lines) == 2, lines
    events = [line.split()[3] for line in lines if line.startswith("event ")]
    assert events[0] == "JobRegistered" and events[-1] == "JobDeregistered", lines
    # What the script reports is what the cluster holds: the job is stopped, two allocs placed.
    with Client(dev_agent.address) as client:
        assert client.get_job(EXAMPLE_JOB_ID).job.stop
        assert len(client.list_allocs(job_id=EXAMPLE_JOB_ID).allocs) == 2


def test_sdk_example__bad_job_file__one_error_line_and_nothing_sent(
    dev_agent: DevAgent, tmp_path: Path
) -> None:
    bad = tmp_path / "bad.hcl"
    bad.write_text('job "bad" {\n  group "g" {\n    count = -1\n  }\n}\n')
    # The agent is the module's: its jobs before the refused file are what must stay.
    with Client(dev_agent.address) as client:
        jobs_before = [j.id for j in client.list_jobs().jobs]

    result = _run_example(tmp_path, dev_agent.address, str(bad))

    assert result.returncode == 1 and result.stdout == "", result
    [line] = result.stderr.splitlines()
    assert line.startswith("Error: ") and "job.groups[0].count" in line, line
    with Client(dev_agent.address) as client:
        assert [j.id for j in client.list_jobs().jobs] == jobs_before


def test_sdk_example__no_server__one_error_line_naming_the_address(tmp_path: Path) -> None:
    [port] = pick_free_ports(1)
    address = f"127.0.0.1:{port}"

    result = _run_example(tmp_path, address)

    assert result.returncode == 1 and result.stdout == "", result
    assert result.stderr.splitlines() == [f"Error: no drover server at {address}: connection refused"]


def _installed_layout(site: Path) -> None:
    """drover under ``site`` as its wheel installs it: each package of pyproject.toml's
    package-dir mapping at its import path (links to the checkout's folders, py.typed and
    the generated .pyi files included)."""
    package_dirs: dict[str, str] = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-dir"
    ]
    root = site / "drover"
    root.mkdir(parents=True)
    for entry in (REPO / package_dirs["drover"]).iterdir():
        if entry.name != "__pycache__":
            (root / entry.name).symlink_to(entry)
    for name, folder in package_dirs.items():
        if name != "drover":
            target = site.joinpath(*name.split("."))
            target.symlink_to(REPO / folder)


def test_sdk_example__mypy_strict_as_a_user_runs_it(tmp_path: Path) -> None:
    # The wheel carries the marker that tells mypy drover is typed (PEP 561).
    package_data = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    assert "py.typed" in package_data["*"] and (REPO / "proto" / "drover" / "py.typed").is_file()
    site, work = tmp_path / "site", tmp_path / "work"
    _installed_layout(site)
    work.mkdir()
    script = work / EXAMPLE.name
    shutil.copy(EXAMPLE, script)
    # mypy reads site as installed packages (PYTHONPATH is on the interpreter's path), so
    # without py.typed it would refuse to read drover's types at all.
    env = {**os.environ, "PYTHONPATH": str(site)}
    argv = [
        sys.executable,
        "-m",
        "mypy",
        "--strict",
        "--config-file",
        os.devnull,
        "--cache-dir",
        str(tmp_path / "cache"),
    ]

    checked = subprocess.run(
        [*argv, script.name], capture_output=True, text=True, timeout=600, env=env, cwd=work
    )

    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "Success: no issues found in 1 source file" in checked.stdout
    # The same check does see drover's types: a script that misuses the SDK fails it.
    script.write_text(script.read_text() + '\nWRONG: int = parse_job_file("x.hcl").id\n')
    misused = subprocess.run(
        [*argv, script.name], capture_output=True, text=True, timeout=600, env=env, cwd=work
    )
    assert misused.returncode == 1 and 'has type "str", variable has type "int"' in misused.stdout, (
        misused.stdout
    )
