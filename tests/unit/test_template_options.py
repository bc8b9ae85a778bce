"""Template splay, wait { min, max } and delimiters, and artifact mode: read from the job
file, refused naming the field when wrong, and honoured by the client (the pure timing
rules, the task's files, and an alloc runner whose template follows a scripted service)."""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from deploy.cluster import wait_for
from drover.client.clock import SystemClock
from drover.client.drivers.mock import MockDriver
from drover.client.errors import TaskStartError
from drover.client.runner import AllocRunner
from drover.client.state import StateDB
from drover.client.taskstate import AllocStatus
from drover.client.templates import Quiet, TaskFiles, render_due_ns, splay_delay_ns, wait_bounds_ns
from drover.common.gotemplate import RenderContext, TemplateError, parse_template
from drover.scheduler.structs import Artifact
from drover.sdk import JobFileError, parse_job
from drover.server.jobspec import parse_jobspec
from drover.server.jobspec_api import nomad_api_to_jobspec
from drover.v1 import structs_pb2
from tests.unit.test_jobspec_keys import _hcl

S = 1_000_000_000


def _errors(text: str) -> list[str]:
    with pytest.raises(JobFileError) as caught:
        parse_job(text, filename="f.hcl")
    return [str(p) for p in (*caught.value.problems, *caught.value.errors)] or [str(caught.value)]


# -- the template language with other delimiters ------------------------------------------


def test_delimiters__actions_between_them_and_braces_left_as_text() -> None:
    text = '[[- env "X" -]] {{ .Literal }} [[ range nomadService "db" ]][[ .Port ]][[ end ]]'
    parsed = parse_template(text, "[[", "]]")
    services = {"db": [{"Port": 5432}]}
    out = parsed.render(RenderContext(env={"X": "x"}, services=lambda n: services.get(n, [])))
    assert out == "x{{ .Literal }} 5432"
    assert parsed.service_names == frozenset({"db"})
    # The default delimiters are Go's; an unclosed action names the ones in use.
    assert parse_template("{{ 1 }}").render(RenderContext()) == "1"
    with pytest.raises(TemplateError, match=r"unclosed action: \[\[ without \]\]"):
        parse_template("[[ 1 ", "[[", "]]")


# -- the job file ---------------------------------------------------------------------------


def test_job_file__splay_wait_delimiters_and_artifact_mode_are_read() -> None:
    body = """
template {
  data            = "[[ env \\"NOMAD_TASK_NAME\\" ]] {{ not_a_function }}"
  destination     = "local/a"
  splay           = "10s"
  left_delimiter  = "[["
  right_delimiter = "]]"
  wait {
    min = "2s"
    max = "30s"
  }
}
artifact {
  source      = "/opt/tool"
  destination = "local/bin/tool"
  mode        = "file"
}
"""
    job = parse_jobspec(_hcl(task_body=body))
    (template,) = job.groups[0].tasks[0].templates
    assert (template.splay_ns, template.wait_min_ns, template.wait_max_ns) == (10 * S, 2 * S, 30 * S)
    assert (template.left_delimiter, template.right_delimiter) == ("[[", "]]")
    assert job.groups[0].tasks[0].artifacts == (
        Artifact(source="/opt/tool", destination="local/bin/tool", mode="file"),
    )


def test_job_file__bad_values_refused_naming_the_field() -> None:
    errors = _errors(
        _hcl(
            task_body="""
template {
  data        = "x"
  destination = "a"
  splay       = "-1s"
  wait {
    min = "10s"
    max = "2s"
  }
}
template {
  data        = "x"
  destination = "b"
  wait { min = "-1s" }
}
artifact {
  source = "/opt/tool"
  mode   = "tarball"
}
"""
        )
    )
    text = "\n".join(errors)
    assert "templates[0].splay_ns: must be >= 0" in text, errors
    assert "templates[0].wait_max_ns: must be >= wait min" in text, errors
    assert "templates[1].wait_min_ns: must be >= 0" in text, errors
    assert 'artifacts[0].mode: must be one of "any", "file", "dir"' in text, errors


def test_job_file__wait_keys_and_data_read_with_its_delimiters() -> None:
    errors = _errors(
        _hcl(
            task_body="""
template {
  data        = "x"
  destination = "b"
  wait { often = true }
}
template {
  data            = "[[ key \\"a\\" ]] {{ key }}"
  destination     = "c"
  left_delimiter  = "[["
  right_delimiter = "]]"
}
"""
        )
    )
    text = "\n".join(errors)
    assert 'template[0] wait: unknown key "often"' in text, errors
    # Parsed with [[ ]]: the Consul function between them is refused, the braces are text.
    assert "'key' is not supported by drover" in text and text.count("'key'") == 1, errors


def test_nomad_api_json__wait_and_mode_carried() -> None:
    api = {
        "ID": "web",
        "TaskGroups": [
            {
                "Name": "api",
                "Tasks": [
                    {
                        "Name": "t",
                        "Driver": "raw_exec",
                        "Config": {"command": "/bin/true"},
                        "Templates": [
                            {
                                "EmbeddedTmpl": "x",
                                "DestPath": "local/x",
                                "Splay": 7 * S,  # (Nomad's default, 5s, on every template, is not carried)
                                "Wait": {"Min": 1 * S, "Max": 4 * S},
                            }
                        ],
                        "Artifacts": [{"GetterSource": "/opt/d", "GetterMode": "dir"}],
                    }
                ],
            }
        ],
    }
    body, problems = nomad_api_to_jobspec({"Job": api})
    assert problems == []
    job = parse_jobspec(json.dumps({"job": body["job"]}))
    (template,) = job.groups[0].tasks[0].templates
    assert (template.splay_ns, template.wait_min_ns, template.wait_max_ns) == (7 * S, 1 * S, 4 * S)
    assert job.groups[0].tasks[0].artifacts[0].mode == "dir"


# -- the timing rules (pure) ------------------------------------------------------------------


def test_wait__quiet_for_min_but_at_most_max_after_the_first_change() -> None:
    tpl = structs_pb2.Template(wait_min_ns=2 * S, wait_max_ns=5 * S)
    assert render_due_ns(tpl, Quiet()) is None
    first = Quiet().changed(10 * S)
    assert render_due_ns(tpl, first) == 12 * S
    # Each change pushes it back by min...
    assert render_due_ns(tpl, first.changed(11 * S)) == 13 * S
    # ...but never past first + max.
    assert render_due_ns(tpl, first.changed(11 * S).changed(14 * S)) == 15 * S
    # No wait: at once. A min alone: max is four times it (consul-template's rule).
    assert render_due_ns(structs_pb2.Template(), first) == 10 * S
    assert wait_bounds_ns(structs_pb2.Template(wait_min_ns=3 * S)) == (3 * S, 12 * S)


def test_splay__a_random_part_of_the_largest_splay_of_the_templates_that_act() -> None:
    restart = structs_pb2.Template(splay_ns=10 * S)
    signal = structs_pb2.Template(splay_ns=4 * S, change_mode="signal", change_signal="SIGHUP")
    noop = structs_pb2.Template(splay_ns=100 * S, change_mode="noop")
    assert splay_delay_ns([restart, signal, noop], 0.5) == 5 * S
    assert splay_delay_ns([signal], 0.25) == S
    assert splay_delay_ns([noop], 0.9) == 0
    assert splay_delay_ns([structs_pb2.Template()], 0.9) == 0
    assert splay_delay_ns([restart], 0.0) == 0
    assert 0 <= splay_delay_ns([restart], random.Random(7).random()) < 10 * S


# -- the task's files -------------------------------------------------------------------------


class _Services:
    def __init__(self) -> None:
        self.by_name: dict[str, list[dict[str, Any]]] = {}

    def __call__(self, name: str) -> Sequence[Mapping[str, Any]]:
        return self.by_name.get(name, [])


def _files(tmp_path: Path, task: structs_pb2.Task, services: Callable[[str], Any] | None = None) -> TaskFiles:
    return TaskFiles(
        task,
        payload=b"",
        task_dir=tmp_path / "task",
        env={"GREETING": "hi"},
        node_names={},
        services=services or _Services(),
    )


def test_task_files__delimiters_and_a_wait_held_until_due(tmp_path: Path) -> None:
    services = _Services()
    services.by_name["db"] = [{"Port": 1}]
    waiting = structs_pb2.Template(
        data='<< range nomadService "db" >><< .Port >><< end >> {{ as text }}',
        destination="local/w.txt",
        left_delimiter="<<",
        right_delimiter=">>",
        wait_min_ns=2 * S,
        wait_max_ns=3 * S,
    )
    at_once = structs_pb2.Template(
        data='{{ range nomadService "db" }}{{ .Port }}{{ end }}', destination="local/n.txt"
    )
    files = _files(tmp_path, structs_pb2.Task(name="t", templates=[waiting, at_once]), services)
    files.prepare()
    assert (tmp_path / "task/local/w.txt").read_text() == "1 {{ as text }}"

    services.by_name["db"] = [{"Port": 2}]
    files.note_change(100 * S)
    changed, next_due = files.rerender_due(100 * S)
    assert [t.destination for t in changed] == ["local/n.txt"]
    assert next_due == 102 * S
    assert (tmp_path / "task/local/w.txt").read_text() == "1 {{ as text }}"
    # Another change within min: due later, but not past first + max.
    services.by_name["db"] = [{"Port": 3}]
    files.note_change(101 * S)
    changed, next_due = files.rerender_due(101 * S)
    assert [t.destination for t in changed] == ["local/n.txt"] and next_due == 103 * S
    assert files.rerender_due(102 * S) == ([], 103 * S)
    changed, next_due = files.rerender_due(103 * S)
    assert [t.destination for t in changed] == ["local/w.txt"] and next_due is None
    assert (tmp_path / "task/local/w.txt").read_text() == "3 {{ as text }}"


def test_task_files__artifact_modes(tmp_path: Path) -> None:
    source_dir = tmp_path / "src"
    (source_dir / "sub").mkdir(parents=True)
    (source_dir / "sub/a.txt").write_text("a")
    tool = tmp_path / "tool.sh"
    tool.write_text("#!/bin/sh\n")
    task = structs_pb2.Task(
        name="t",
        artifacts=[
            structs_pb2.Artifact(source=str(tool), destination="bin/run.sh", mode="file"),
            structs_pb2.Artifact(source=str(tool), mode="file"),
            structs_pb2.Artifact(source=f"file://{source_dir}", destination="local/data", mode="dir"),
            structs_pb2.Artifact(source=str(tool), destination="local/any", mode="any"),
        ],
    )
    _files(tmp_path, task).prepare()
    root = tmp_path / "task"
    assert (root / "bin/run.sh").read_text() == "#!/bin/sh\n" and (root / "bin/run.sh").is_file()
    assert (root / "local/tool.sh").is_file()
    assert (root / "local/data/sub/a.txt").read_text() == "a"
    assert (root / "local/any/tool.sh").is_file()

    for artifact, message in (
        (
            structs_pb2.Artifact(source=str(source_dir), mode="file"),
            'mode "file" but the source is a directory',
        ),
        (structs_pb2.Artifact(source=str(tool), mode="dir"), 'mode "dir" but the source is not a directory'),
        (structs_pb2.Artifact(source=str(tmp_path / "missing"), mode="dir"), "No such file or directory"),
    ):
        bad = structs_pb2.Task(name="t", artifacts=[artifact])
        with pytest.raises(TaskStartError, match=message):
            _files(tmp_path / "bad", bad).prepare()


# -- an alloc runner: wait coalesces, splay holds the restart ---------------------------------


class _Subscription:
    """Stands for the agent's service watch: the test changes what a lookup answers and
    says when it changed."""

    def __init__(self) -> None:
        self.port = 1
        self.on_change: Callable[[], None] | None = None

    def lookup(self, name: str) -> Sequence[Mapping[str, Any]]:
        return [{"Port": self.port}] if name == "db" else []

    def watch(self, on_change: Callable[[], None]) -> None:
        self.on_change = on_change

    def stop(self) -> None:
        self.on_change = None

    def join(self, timeout_s: float) -> bool:
        return True

    def change(self, port: int) -> None:
        self.port = port
        assert self.on_change is not None
        self.on_change()


class _Draw(random.Random):
    """Every draw is the same number: the splay's part is known."""

    def __init__(self, value: float) -> None:
        super().__init__(0)
        self.value = value

    def random(self) -> float:
        return self.value


def _runner(tmp_path: Path, template: structs_pb2.Template, sub: _Subscription, draw: float) -> AllocRunner:
    task = structs_pb2.Task(
        name="main",
        driver="mock",
        config_json=json.dumps({"run_for": "1h"}),
        templates=[template],
        resources=structs_pb2.Resources(cpu_mhz=100, memory_mb=64),
    )
    job = structs_pb2.Job(
        id="web", type="service", groups=[structs_pb2.TaskGroup(name="g", count=1, tasks=[task])]
    )
    alloc = structs_pb2.Allocation(id="a1", namespace="default", job_id="web", task_group="g")
    statuses: list[AllocStatus] = []
    return AllocRunner(
        alloc,
        job,
        drivers={"mock": MockDriver(SystemClock())},
        store=StateDB(tmp_path / "data"),
        clock=SystemClock(),
        rng=_Draw(draw),
        on_update=statuses.append,
        services=lambda: sub,  # type: ignore[arg-type,return-value]
    )


def _restarts(runner: AllocRunner) -> int:
    return runner.task_records()["main"].state.restarts


def test_runner__wait_coalesces_changes_and_splay_delays_the_restart(tmp_path: Path) -> None:
    template = structs_pb2.Template(
        data='{{ range nomadService "db" }}{{ .Port }}{{ end }}',
        destination="local/db.txt",
        wait_min_ns=S // 2,
        wait_max_ns=5 * S,
        splay_ns=2 * S,
    )
    sub = _Subscription()
    runner = _runner(tmp_path, template, sub, draw=0.5)  # a splay of 1s
    runner.start()
    try:
        assert wait_for(lambda: runner.task_records()["main"].state.started_at_ns > 0, 10.0)
        rendered = next((tmp_path / "data").rglob("db.txt"))
        assert rendered.read_text() == "1"
        changed_at = time.monotonic()
        for port in (2, 3, 4):  # three changes, closer together than min
            sub.change(port)
        # Without a wait each change renders at once, inside change(): not so here.
        assert rendered.read_text() == "1"
        assert wait_for(lambda: rendered.read_text() == "4", 5.0, interval=0.01)
        rendered_at = time.monotonic()
        assert rendered_at - changed_at >= 0.45
        # One restart, held by the splay (half of 2s) after the render.
        assert wait_for(lambda: _restarts(runner) >= 1, 5.0, interval=0.01)
        assert time.monotonic() - rendered_at >= 0.7  # 1s, less how late the render was seen
        assert wait_for(lambda: runner.task_records()["main"].state.state == "running", 5.0)
        with pytest.raises(TimeoutError):
            wait_for(lambda: _restarts(runner) > 1, 1.5)
    finally:
        runner.destroy()
        runner.join(10.0)
