"""A task's templates, artifacts and payload on the node (client_agent/templates.py)."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from drover.client.errors import TaskStartError
from drover.client.templates import TaskFiles, change_action, parse_env_file
from drover.v1 import structs_pb2


class _Services:
    """The registrations a template sees; a test changes them between renders."""

    def __init__(self) -> None:
        self.by_name: dict[str, list[dict[str, Any]]] = {}

    def __call__(self, name: str) -> Sequence[Mapping[str, Any]]:
        return self.by_name.get(name, [])


def _files(tmp_path: Path, task: structs_pb2.Task, services: _Services, payload: bytes = b"") -> TaskFiles:
    return TaskFiles(
        task,
        payload=payload,
        task_dir=tmp_path / "task",
        env={"NOMAD_TASK_DIR": str(tmp_path / "task"), "GREETING": "hi"},
        node_names={},
        services=services,
    )


def _template(**fields: Any) -> structs_pb2.Template:
    return structs_pb2.Template(**fields)


def test_prepare__renders_templates_and_returns_env_template_variables(tmp_path: Path) -> None:
    services = _Services()
    services.by_name["db"] = [{"Address": "10.0.0.9", "Port": 5432}]
    task = structs_pb2.Task(
        name="t",
        templates=[
            _template(
                data='{{ range nomadService "db" }}{{ .Address }}:{{ .Port }}{{ end }} {{ env "GREETING" }}',
                destination="local/db.txt",
                perms="0600",
            ),
            _template(
                data='DB_PORT={{ range nomadService "db" }}{{ .Port }}{{ end }}\n# c\n',
                destination="db.env",
                env=True,
            ),
        ],
    )
    files = _files(tmp_path, task, services)
    assert files.service_names() == frozenset({"db"})
    assert files.prepare() == {"DB_PORT": "5432"}
    rendered = tmp_path / "task" / "local" / "db.txt"
    assert rendered.read_text() == "10.0.0.9:5432 hi"
    assert rendered.stat().st_mode & 0o777 == 0o600


def test_rerender__only_changed_templates__written_and_returned(tmp_path: Path) -> None:
    services = _Services()
    task = structs_pb2.Task(
        name="t",
        templates=[
            _template(
                data='{{ len (nomadService "db") }}',
                destination="a",
                change_mode="signal",
                change_signal="SIGHUP",
            ),
            _template(data="static", destination="b", change_mode="noop"),
        ],
    )
    files = _files(tmp_path, task, services)
    files.prepare()
    assert files.rerender() == []
    services.by_name["db"] = [{"Address": "x", "Port": 1}]
    changed = files.rerender()
    assert [t.destination for t in changed] == ["a"]
    assert (tmp_path / "task" / "a").read_text() == "1"
    assert change_action(changed) == (False, ("SIGHUP",))


@pytest.mark.parametrize(
    ("templates", "expected"),
    [
        (
            [_template(change_mode="restart"), _template(change_mode="signal", change_signal="SIGHUP")],
            (True, ()),
        ),
        ([_template(change_mode="")], (True, ())),
        ([_template(change_mode="noop", env=True)], (True, ())),
        ([_template(change_mode="noop")], (False, ())),
        (
            [_template(change_mode="signal", change_signal="SIGUSR1")] * 2
            + [_template(change_mode="signal", change_signal="SIGHUP")],
            (False, ("SIGUSR1", "SIGHUP")),
        ),
    ],
    ids=["restart-wins", "default-is-restart", "env-needs-restart", "noop", "signals-once-each"],
)
def test_change_action__nomad_rules(
    templates: list[structs_pb2.Template], expected: tuple[bool, tuple[str, ...]]
) -> None:
    assert change_action(templates) == expected


def test_prepare__artifact_and_payload__copied_once_into_the_task_dir(tmp_path: Path) -> None:
    tool = tmp_path / "tool.sh"
    tool.write_text("echo hi\n")
    bundle = tmp_path / "bundle"
    (bundle / "sub").mkdir(parents=True)
    (bundle / "sub" / "f").write_text("f")
    task = structs_pb2.Task(
        name="t",
        artifacts=[
            structs_pb2.Artifact(source=f"file://{tool}", destination="bin"),
            structs_pb2.Artifact(source=str(bundle)),
        ],
        dispatch_payload=structs_pb2.DispatchPayload(file="in/payload.bin"),
    )
    files = _files(tmp_path, task, _Services(), payload=b"\x00data")
    files.prepare()
    root = tmp_path / "task"
    assert (root / "bin" / "tool.sh").read_text() == "echo hi\n"
    assert (root / "local" / "sub" / "f").read_text() == "f"
    assert (root / "local" / "in" / "payload.bin").read_bytes() == b"\x00data"
    tool.write_text("changed\n")
    files.prepare()
    assert (root / "bin" / "tool.sh").read_text() == "echo hi\n", "artifacts are fetched once per alloc"


def test_prepare__destination_escaping_the_task_dir__fails_the_start(tmp_path: Path) -> None:
    (tmp_path / "task").mkdir()
    os.symlink(tmp_path, tmp_path / "task" / "out")
    task = structs_pb2.Task(name="t", templates=[_template(data="x", destination="out/escaped")])
    with pytest.raises(TaskStartError, match="resolves outside the task's directory"):
        _files(tmp_path, task, _Services()).prepare()
    assert not (tmp_path / "escaped").exists()


def test_prepare__missing_artifact_or_bad_template__a_start_failure_naming_it(tmp_path: Path) -> None:
    task = structs_pb2.Task(name="t", artifacts=[structs_pb2.Artifact(source=str(tmp_path / "nope"))])
    with pytest.raises(TaskStartError, match="artifact"):
        _files(tmp_path, task, _Services()).prepare()
    task = structs_pb2.Task(name="t", templates=[_template(source=str(tmp_path / "t.tpl"), destination="x")])
    (tmp_path / "t.tpl").write_text('{{ key "consul" }}')
    with pytest.raises(TaskStartError, match="'key' is not supported by drover"):
        _files(tmp_path, task, _Services()).prepare()


def test_parse_env_file__nomad_format() -> None:
    assert parse_env_file('A=1\n\n# note\nexport B = two\nC="quoted"\nD=a=b\n') == {
        "A": "1",
        "B": "two",
        "C": "quoted",
        "D": "a=b",
    }
    with pytest.raises(TaskStartError, match="is not KEY=VALUE"):
        parse_env_file("just text")
