"""Native service discovery and the files a task gets, on one dev agent with real raw_exec
tasks, as an operator runs them: ``drover service list|info`` while an alloc runs and
after it stops; a template reading ``nomadService`` re-rendered, and its task restarted,
when the service gains and loses an instance (deploy/examples/service-*.nomad.hcl); an
artifact from a ``file://`` path and a dispatch payload in the task's directory; a group's
``max_run_duration`` failing an alloc that runs too long; remote artifacts and Consul
refused in one line."""

from __future__ import annotations

import json
from pathlib import Path

from deploy.cluster import wait_for
from drover.sdk import Client
from drover.v1 import structs_pb2
from tests.cluster.cli import drover_cli, one_error_line
from tests.cluster.conftest import DevAgent
from tests.cluster.test_task_runtime import EXAMPLES, only_alloc, task_stdout


def _cli(agent: DevAgent, *args: str) -> tuple[int, str, str]:
    result = drover_cli(*args, env={"DROVER_ADDR": agent.address})
    return result.returncode, result.stdout, result.stderr


def _registrations(agent: DevAgent, name: str) -> list[dict[str, object]] | None:
    """``drover service info NAME -json``; None when the service has no registration."""
    code, out, err = _cli(agent, "service", "info", name, "-json")
    if code != 0:
        assert "not found" in err, err
        return None
    found: list[dict[str, object]] = json.loads(out)
    return found


def _registered(client: Client, name: str) -> int:
    """How many registrations service ``name`` has (through the SDK: cheaper to poll than
    the CLI, which the assertions use)."""
    listed = {s.service_name: s.registrations for s in client.list_services().services}
    return listed.get(name, 0)


def _task_state(client: Client, alloc_id: str, task: str) -> structs_pb2.TaskState:
    return client.get_alloc(alloc_id).alloc.task_states[task]


def test_service_discovery__registered_while_running__template_follows_and_restarts(
    dev_agent: DevAgent,
) -> None:
    code, out, err = _cli(dev_agent, "job", "run", "-detach", str(EXAMPLES / "service-consumer.nomad.hcl"))
    assert code == 0, out + err
    with Client(dev_agent.address) as client:
        consumer = only_alloc(client, "service-consumer", "running")
        # Rendered before the first start, with no instance registered yet.
        wait_for(
            lambda: "start upstreams=0" in task_stdout(dev_agent.data_dir, consumer.id, "app"),
            30,
            message="the consumer's first start",
        )
        assert _registrations(dev_agent, "api-http") is None

        code, out, err = _cli(dev_agent, "job", "run", "-detach", str(EXAMPLES / "service-api.nomad.hcl"))
        assert code == 0, out + err
        api = only_alloc(client, "service-api", "running")
        (port,) = [p.value for p in api.resources.ports if p.label == "http"]
        wait_for(lambda: _registered(client, "api-http") == 1, 30, message="api-http registered")
        (registration,) = _registrations(dev_agent, "api-http") or []
        assert registration["alloc_id"] == api.id
        assert registration["job_id"] == "service-api"
        assert registration["port"] == port
        assert registration["tags"] == ["v1", "public"]
        address = registration["address"]
        code, out, err = _cli(dev_agent, "service", "list")
        assert code == 0, err
        assert any(
            line.split()[:5] == ["api-http", "default", "1", "1", "public,v1"] for line in out.splitlines()
        ), out

        # The consumer's template sees the new instance: re-rendered, and the task restarted
        # on the new file and environment.
        wait_for(
            lambda: "start upstreams=1" in task_stdout(dev_agent.data_dir, consumer.id, "app"),
            60,
            message="the consumer restarted with one upstream",
        )
        stdout = task_stdout(dev_agent.data_dir, consumer.id, "app")
        assert f"upstream {address}:{port} tags=v1,public" in stdout
        state = _task_state(client, consumer.id, "app")
        assert state.restarts == 1
        assert any(
            e.type == "Restart Signaled" and e.message == "Template with change_mode restart re-rendered"
            for e in state.events
        ), state.events
        assert any(
            e.type == "Restarting" and e.message.startswith("Template with change_mode restart re-rendered")
            for e in state.events
        ), state.events

        # Stopping the service's job removes the registration, and the consumer follows.
        code, out, err = _cli(dev_agent, "job", "stop", "-detach", "service-api")
        assert code == 0, out + err
        wait_for(lambda: _registered(client, "api-http") == 0, 30, message="api-http deregistered")
        assert _registrations(dev_agent, "api-http") is None
        code, out, err = _cli(dev_agent, "service", "list", "-json")
        assert code == 0 and all(s["service_name"] != "api-http" for s in json.loads(out)), out
        wait_for(
            lambda: task_stdout(dev_agent.data_dir, consumer.id, "app").count("start upstreams=0") == 2,
            60,
            message="the consumer restarted with no upstream",
        )
        rendered = next(dev_agent.data_dir.glob(f"**/allocs/{consumer.id}/app/local/upstreams.txt"))
        assert rendered.read_text() == ""
        assert _task_state(client, consumer.id, "app").restarts == 2


_FILES_JOB = """
job "files" {
  type = "batch"
  parameterized {
    payload = "required"
  }
  group "g" {
    task "t" {
      driver = "raw_exec"
      config {
        command = "/bin/sh"
        args    = ["-c", "sh tools/greet.sh \\"$(cat local/input.txt)\\""]
      }
      artifact {
        source      = "file://TOOL"
        destination = "tools"
      }
      dispatch_payload {
        file = "input.txt"
      }
      resources {
        cpu    = 50
        memory = 32
      }
    }
  }
}
"""

_SLOW_JOB = """
job "too-slow" {
  type = "batch"
  reschedule {
    attempts  = 0
    unlimited = false
  }
  group "g" {
    max_run_duration = "2s"
    restart {
      attempts = 0
      mode     = "fail"
    }
    task "t" {
      driver = "raw_exec"
      config {
        command = "/bin/sh"
        args    = ["-c", "exec sleep 600"]
      }
      resources {
        cpu    = 50
        memory = 32
      }
    }
  }
}
"""


def test_task_files__artifact_payload_and_max_run_duration(dev_agent: DevAgent, tmp_path: Path) -> None:
    tool = tmp_path / "greet.sh"
    tool.write_text('echo "hello, $1"\n')
    job_file = tmp_path / "files.hcl"
    job_file.write_text(_FILES_JOB.replace("TOOL", str(tool)))
    code, out, err = _cli(dev_agent, "job", "run", "-detach", str(job_file))
    assert code == 0, out + err
    payload = tmp_path / "payload.txt"
    payload.write_text("drover")
    result = drover_cli(
        "job", "dispatch", "-detach", "files", str(payload), env={"DROVER_ADDR": dev_agent.address}
    )
    assert result.returncode == 0, result.stdout + result.stderr
    with Client(dev_agent.address) as client:
        child = next(j.id for j in client.list_jobs().jobs if j.id.startswith("files/dispatch-"))
        done = only_alloc(client, child, "complete")
    assert task_stdout(dev_agent.data_dir, done.id, "t").strip() == "hello, drover"

    slow_file = tmp_path / "slow.hcl"
    slow_file.write_text(_SLOW_JOB)
    code, out, err = _cli(dev_agent, "job", "run", "-detach", str(slow_file))
    assert code == 0, out + err
    with Client(dev_agent.address) as client:
        failed = only_alloc(client, "too-slow", "failed")
    assert failed.client_description == "max_run_duration of 2s exceeded"
    assert any(e.type == "Max Run Duration Exceeded" for e in failed.task_states["t"].events)


def test_job_files__remote_artifact_and_consul_provider__refused_in_one_line(
    dev_agent: DevAgent, tmp_path: Path
) -> None:
    remote = tmp_path / "remote.hcl"
    remote.write_text(
        _FILES_JOB.replace("file://TOOL", "https://example.com/greet.sh").replace('"files"', '"remote"', 1)
    )
    line = one_error_line(drover_cli("job", "run", str(remote), env={"DROVER_ADDR": dev_agent.address}))
    assert "artifacts[0].source" in line and '"https" sources are not supported by drover' in line, line
    consul = tmp_path / "consul.hcl"
    consul.write_text(
        (EXAMPLES / "service-api.nomad.hcl").read_text().replace('provider = "nomad"', 'provider = "consul"')
    )
    line = one_error_line(drover_cli("job", "run", str(consul), env={"DROVER_ADDR": dev_agent.address}))
    assert '"consul" is not supported by drover (no Consul here)' in line, line
