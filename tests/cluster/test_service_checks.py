"""Service checks on one dev agent with real raw_exec tasks, the whole loop: the client
runs a script check, reports its status with the alloc, the servers carry it in the
registration (``drover service info``), a consumer's ``nomadService`` template drops the
failing instance, and ``check_restart`` restarts the task after ``limit`` failures; once
the check passes again the instance is back."""

from __future__ import annotations

import json
from pathlib import Path

from deploy.cluster import wait_for
from drover.sdk import Client
from tests.cluster.cli import drover_cli
from tests.cluster.conftest import DevAgent
from tests.cluster.test_task_runtime import only_alloc

# The check is critical (exit 2; exit 1 would be a warning) while the alloc directory
# holds a file named "sick".
_FLAKY_JOB = """
job "flaky" {
  group "api" {
    network {
      port "http" {}
    }
    restart {
      attempts = 5
      interval = "10m"
      delay    = "1s"
      mode     = "fail"
    }
    task "server" {
      driver = "raw_exec"
      config {
        command = "/bin/sh"
        args    = ["-c", "echo started; exec sleep 600"]
      }
      service {
        name     = "flaky-http"
        provider = "nomad"
        port     = "http"
        check {
          name     = "not-sick"
          type     = "script"
          command  = "/bin/sh"
          args     = ["-c", "if test -e \\"$NOMAD_ALLOC_DIR/sick\\"; then exit 2; fi"]
          interval = "1s"
          timeout  = "1s"
          check_restart {
            limit = 2
            grace = "1s"
          }
        }
      }
      resources {
        cpu    = 50
        memory = 32
      }
    }
  }
}
"""

_CONSUMER_JOB = """
job "flaky-consumer" {
  group "web" {
    task "app" {
      driver = "raw_exec"
      config {
        command = "/bin/sh"
        args    = ["-c", "exec sleep 600"]
      }
      template {
        data        = "{{ range nomadService \\"flaky-http\\" }}up {{ .AllocID }}\\n{{ end }}"
        destination = "local/upstreams.txt"
        change_mode = "noop"
      }
      resources {
        cpu    = 50
        memory = 32
      }
    }
  }
}
"""


def _run(agent: DevAgent, tmp_path: Path, name: str, text: str) -> None:
    path = tmp_path / f"{name}.hcl"
    path.write_text(text)
    result = drover_cli("job", "run", "-detach", str(path), env={"DROVER_ADDR": agent.address})
    assert result.returncode == 0, result.stdout + result.stderr


def _health(agent: DevAgent) -> list[str]:
    """Each registration's health, as ``drover service info -json`` shows it."""
    result = drover_cli("service", "info", "flaky-http", "-json", env={"DROVER_ADDR": agent.address})
    if result.returncode != 0:
        assert "not found" in result.stderr, result.stderr
        return []
    return [r.get("health", "") for r in json.loads(result.stdout)]


def _upstreams(agent: DevAgent, alloc_id: str) -> str:
    paths = list(agent.data_dir.glob(f"**/allocs/{alloc_id}/app/local/upstreams.txt"))
    return paths[0].read_text() if paths else "<not rendered>"


def test_service_checks__failing_instance_dropped__check_restart_restarts__back_when_passing(
    dev_agent: DevAgent, tmp_path: Path
) -> None:
    _run(dev_agent, tmp_path, "flaky", _FLAKY_JOB)
    with Client(dev_agent.address) as client:
        api = only_alloc(client, "flaky", "running")
        wait_for(lambda: _health(dev_agent) == ["passing"], 30, message="flaky-http passing")
        _run(dev_agent, tmp_path, "consumer", _CONSUMER_JOB)
        consumer = only_alloc(client, "flaky-consumer", "running")
        wait_for(
            lambda: _upstreams(dev_agent, consumer.id) == f"up {api.id}\n",
            30,
            message="the consumer renders the passing instance",
        )

        (alloc_dir,) = [p for p in dev_agent.data_dir.glob(f"**/allocs/{api.id}") if p.is_dir()]
        sick = alloc_dir / "sick"
        sick.write_text("")
        wait_for(lambda: _health(dev_agent) == ["critical"], 30, message="flaky-http critical")
        result = drover_cli(
            "service", "info", "flaky-http", "-passing", "-json", env={"DROVER_ADDR": dev_agent.address}
        )
        assert result.returncode == 0 and json.loads(result.stdout) == [], result.stdout + result.stderr
        wait_for(
            lambda: _upstreams(dev_agent, consumer.id) == "",
            30,
            message="the consumer drops the failing instance",
        )

        def restarted() -> bool:
            return client.get_alloc(api.id).alloc.task_states["server"].restarts >= 1

        wait_for(restarted, 30, message="check_restart restarts the task")
        sick.unlink()
        state = client.get_alloc(api.id).alloc.task_states["server"]
        assert state.restarts == 1, state
        assert any(
            e.type == "Restart Signaled" and "'not-sick'" in e.message and "2 failures in a row" in e.message
            for e in state.events
        ), state.events

        wait_for(lambda: _health(dev_agent) == ["passing"], 30, message="flaky-http passing again")
        wait_for(
            lambda: _upstreams(dev_agent, consumer.id) == f"up {api.id}\n",
            30,
            message="the consumer renders the instance again",
        )
        result = drover_cli("service", "info", "flaky-http", env={"DROVER_ADDR": dev_agent.address})
        assert result.returncode == 0, result.stderr
        assert "Health" in result.stdout and "passing" in result.stdout, result.stdout
        # Restarted through its restart policy, once: still the same alloc, running.
        assert client.get_alloc(api.id).alloc.client_status == "running"
        assert client.get_alloc(api.id).alloc.task_states["server"].restarts == 1
