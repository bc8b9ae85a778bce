"""drover.client.interpolate: runtime ``${...}`` names resolved on the node (pure)."""

from __future__ import annotations

from drover.client.interpolate import interpolate, interpolate_config, interpolate_env

ENV = {"NOMAD_ALLOC_INDEX": "3", "NOMAD_TASK_DIR": "/d/t", "HOME_DIR": "/home/x"}
NODE = {"node.unique.name": "c1", "node.class": "", "attr.kernel.name": "linux", "meta.rack": "r2"}


def test_interpolate__env_then_node_names() -> None:
    text = "${node.unique.name}-${NOMAD_ALLOC_INDEX} on ${attr.kernel.name} in ${meta.rack}"
    assert interpolate(text, ENV, NODE) == "c1-3 on linux in r2"


def test_interpolate__unknown_names_are_left_as_written() -> None:
    text = "${node.unique.nope} ${attr.missing} ${meta.x} ${NOMAD_NOPE} ${upper(x)}"
    assert interpolate(text, ENV, NODE) == text


def test_interpolate__an_empty_value_is_still_a_value() -> None:
    assert interpolate("[${node.class}]", ENV, NODE) == "[]"


def test_interpolate__env_prefix_reads_the_task_environment() -> None:
    assert interpolate("${env.HOME_DIR}/${env.MISSING}", ENV, NODE) == "/home/x/${env.MISSING}"


def test_interpolate__text_without_references_is_unchanged() -> None:
    assert interpolate("$HOME ${ } $ {x} {y}", ENV, NODE) == "$HOME ${ } $ {x} {y}"


def test_interpolate__a_value_is_not_interpolated_again() -> None:
    assert interpolate("${X}", {"X": "${NOMAD_ALLOC_INDEX}", **ENV}, NODE) == "${NOMAD_ALLOC_INDEX}"


def test_interpolate_config__nested_strings_keys_and_other_values_kept() -> None:
    config = {
        "command": "${NOMAD_TASK_DIR}/run",
        "args": ["--name", "${node.unique.name}", 7, True, None],
        "opts": {"${meta.rack}": {"deep": ["${meta.rack}"]}},
    }
    assert interpolate_config(config, ENV, NODE) == {
        "command": "/d/t/run",
        "args": ["--name", "c1", 7, True, None],
        "opts": {"${meta.rack}": {"deep": ["r2"]}},
    }


def test_interpolate_env__block_values_see_the_base_not_each_other() -> None:
    env = interpolate_env(ENV, {"A": "${NOMAD_ALLOC_INDEX}", "B": "${A}", "NOMAD_ALLOC_INDEX": "9"}, NODE)
    assert env["A"] == "3"
    assert env["B"] == "${A}"
    assert env["NOMAD_ALLOC_INDEX"] == "9"
