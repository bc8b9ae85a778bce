"""The Go-template subset job templates are written in (scheduler/gotemplate.py)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from drover.common.gotemplate import MAX_OUTPUT, RenderContext, TemplateError, parse_template

_WEB = [
    {"Address": "10.0.0.1", "Port": 8080, "Tags": ["a", "b"], "Name": "web"},
    {"Address": "10.0.0.2", "Port": 8081, "Tags": [], "Name": "web"},
]


def _services(name: str) -> Sequence[Mapping[str, Any]]:
    return _WEB if name == "web" else []


def render(text: str, **env: str) -> str:
    return parse_template(text).render(RenderContext(env=env, services=_services))


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            '{{ range nomadService "web" }}{{ .Address }}:{{ .Port }} {{ end }}',
            "10.0.0.1:8080 10.0.0.2:8081 ",
        ),
        ('{{ range $i, $s := nomadService "web" }}{{ $i }}={{ $s.Port }};{{ end }}', "0=8080;1=8081;"),
        ('{{ range $s := nomadService "web" }}{{ join "," $s.Tags }}|{{ end }}', "a,b||"),
        ('{{ range nomadService "none" }}x{{ else }}none{{ end }}', "none"),
        ('{{ with nomadService "web" }}{{ len . }}{{ end }}', "2"),
        ('{{ env "NOMAD_ALLOC_ID" | toUpper }}', "ABC"),
        ('{{ if eq (env "NOMAD_ALLOC_ID") "abc" }}yes{{ else if true }}no{{ end }}', "yes"),
        ('{{ if not (env "MISSING") }}unset{{ end }}', "unset"),
        ('a\n  {{- "b" -}}  \nc', "abc"),
        ('{{/* a comment */}}{{ printf "%s-%d" "x" 3 }}', "x-3"),
        ("{{ `raw {{` }}", "raw {{"),
        ('{{ "x,y" | split "," | join "+" }}', "x+y"),
    ],
    ids=[
        "range-fields",
        "range-index-value",
        "range-value-join",
        "range-else",
        "with-len",
        "env-pipe",
        "if-else-if",
        "not",
        "trim-markers",
        "comment-printf",
        "raw-string",
        "pipeline-last-argument",
    ],
)
def test_render__subset__as_go_renders_it(text: str, expected: str) -> None:
    assert render(text, NOMAD_ALLOC_ID="abc") == expected


def test_parse__service_names__are_the_literals_nomadService_names() -> None:
    template = parse_template('{{ range nomadService "a" }}{{ end }}{{ len (nomadService "b") }}')
    assert template.service_names == frozenset({"a", "b"})


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{{ key "x" }}', "function 'key' is not supported by drover (no Consul here"),
        ('{{ secret "x" }}', "function 'secret' is not supported by drover (no Vault here)"),
        ('{{ nomadVar "x" }}', "no Nomad variables here"),
        ("{{ nosuch }}", "function 'nosuch' is not defined"),
        ("{{ if true }}x", "missing {{end}}"),
        ("{{ end }}", "{{end}} without if, range or with"),
        ("{{ .x", "unclosed action"),
        ('{{ nomadService 3 "k" "web" }}', 'nomadService takes one service name: nomadService "name"'),
        ('{{ template "x" }}', "no named templates here"),
    ],
    ids=[
        "consul",
        "vault",
        "nomad-vars",
        "unknown",
        "unclosed-if",
        "stray-end",
        "unclosed-action",
        "sharded",
        "named",
    ],
)
def test_parse__unsupported__refused_in_one_line(text: str, message: str) -> None:
    with pytest.raises(TemplateError) as caught:
        parse_template(text)
    assert message in str(caught.value)
    assert "\n" not in str(caught.value)


def test_render__missing_field_or_variable__is_an_error() -> None:
    with pytest.raises(TemplateError, match="can not evaluate field Nope"):
        render('{{ range nomadService "web" }}{{ .Nope }}{{ end }}')
    with pytest.raises(TemplateError, match=r"undefined variable \$x"):
        render("{{ $x }}")


def test_render__output_bound__stops_a_runaway_template() -> None:
    text = "{{ range 100000 }}" + "x" * 100 + "{{ end }}"
    with pytest.raises(TemplateError, match=f"larger than {MAX_OUTPUT}"):
        render(text)
