"""The jobspec's file keys (template, artifact, dispatch_payload), group max_run_duration
and service address_mode: read, validated, and what drover can not do refused by name."""

from __future__ import annotations

import pytest

from drover.scheduler.structs import Artifact, DispatchPayload, Template
from drover.sdk import JobFileError, parse_job
from drover.server.jobspec import parse_jobspec
from tests.unit.test_jobspec_keys import _hcl


def _errors(text: str) -> list[str]:
    """Every problem ``drover job validate`` would list: the parser's, then validation's."""
    with pytest.raises(JobFileError) as caught:
        parse_job(text, filename="f.hcl")
    return [str(p) for p in (*caught.value.problems, *caught.value.errors)] or [str(caught.value)]


_TEMPLATE = """
template {
  data          = "port={{ range nomadService \\"db\\" }}{{ .Port }}{{ end }}"
  destination   = "local/app.conf"
  change_mode   = "signal"
  change_signal = "SIGHUP"
  perms         = "0640"
}
template {
  source      = "/etc/app/env.tpl"
  destination = "secrets/app.env"
  env         = true
}
artifact {
  source      = "file:///opt/tools/tool.tgz"
  destination = "local/tools"
}
dispatch_payload {
  file = "input.json"
}
"""


def test_task_files__read_as_written() -> None:
    job = parse_jobspec(_hcl(group_body='max_run_duration = "90s"', task_body=_TEMPLATE))
    group = job.groups[0]
    task = group.tasks[0]
    assert group.max_run_duration_ns == 90 * 10**9
    assert task.templates == (
        Template(
            data='port={{ range nomadService "db" }}{{ .Port }}{{ end }}',
            destination="local/app.conf",
            change_mode="signal",
            change_signal="SIGHUP",
            perms="0640",
        ),
        Template(source="/etc/app/env.tpl", destination="secrets/app.env", env=True),
    )
    assert task.artifacts == (Artifact(source="file:///opt/tools/tool.tgz", destination="local/tools"),)
    assert task.dispatch_payload == DispatchPayload(file="input.json")


@pytest.mark.parametrize(
    ("task_body", "message"),
    [
        ('artifact { source = "https://example.com/x.tgz" }', '"https" sources are not supported by drover'),
        (
            'artifact { source = "s3::https://b/x" }',
            'artifacts[0].source: "s3::https" sources are not supported',
        ),
        ('artifact { source = "git::/x" }', 'go-getter forcing ("git"::) is not supported by drover'),
        ('artifact { source = "relative/x" }', "must be an absolute path on the node"),
        (
            'artifact {\n source = "/x"\n options { checksum = "md5:1" }\n }',
            '"options" is not supported by drover',
        ),
        (
            'artifact {\n source = "/x"\n destination = "../up"\n }',
            "must be a path inside the task's directory",
        ),
        ('template { destination = "x" }', "templates[0].data: set data or source (one of them)"),
        ('template { data = "x" }', "templates[0].destination: must not be empty"),
        (
            'template {\n data = "x"\n destination = "/etc/x"\n }',
            "must be a path inside the task's directory",
        ),
        ('template {\n data = "x"\n destination = "x"\n change_mode = "script"\n }', "change_mode"),
        ('template {\n data = "x"\n destination = "x"\n change_mode = "signal"\n }', "change_signal"),
        (
            'template {\n data = "{{ key \\"a\\" }}"\n destination = "x"\n }',
            "'key' is not supported by drover",
        ),
        (
            'template {\n data = "x"\n destination = "x"\n uid = 1000\n }',
            '"uid" is not supported by drover',
        ),
        ('template {\n data = "x"\n destination = "x"\n perms = "rw"\n }', "must be an octal file mode"),
        ('dispatch_payload { file = "../x" }', "must be a path inside the task's directory"),
    ],
    ids=[
        "remote-artifact",
        "getter-scheme",
        "getter-forcing",
        "relative-artifact",
        "artifact-options",
        "artifact-escapes",
        "template-no-data",
        "template-no-destination",
        "template-absolute",
        "change-mode",
        "signal-without-signal",
        "consul-function",
        "uid",
        "perms",
        "payload-escapes",
    ],
)
def test_task_files__what_drover_can_not_do__refused_naming_the_key(task_body: str, message: str) -> None:
    errors = _errors(_hcl(task_body=task_body))
    assert any(message in e for e in errors), errors
    assert all("\n" not in e for e in errors), errors


def test_service_address_mode__read_and_driver_refused() -> None:
    service = (
        'network {\n port "http" {}\n }\n service {\n name = "s"\n port = "http"\n address_mode = "alloc"\n }'
    )
    job = parse_jobspec(_hcl(group_body=service))
    assert job.groups[0].services[0].address_mode == "alloc"
    errors = _errors(_hcl(group_body=service.replace('"alloc"', '"driver"')))
    assert any('"driver" is not supported by drover (no driver networks here)' in e for e in errors), errors


def test_max_run_duration__negative__refused() -> None:
    errors = _errors(_hcl(group_body='max_run_duration = "-1s"'))
    assert any("max_run_duration" in e for e in errors), errors
