"""The pure parts of the cluster commands' CLI: set-config's flag checks (one line each,
before anything is sent), which task events ``alloc status`` shows, and ``-version``."""

from __future__ import annotations

import argparse

import pytest

from drover.cli import main
from drover.cli._errors import CLIError
from drover.cli._scheduler_config import _changes
from drover.cli.alloc import RECENT_EVENTS, recent_events
from drover.common.version import drover_version
from drover.v1 import structs_pb2


def _set_config_args(**given: str | None) -> argparse.Namespace:
    values: dict[str, str | None] = {
        "scheduler_algorithm": None,
        "pause_eval_broker": None,
        "check_index": None,
    }
    values.update(given)
    return argparse.Namespace(**values)


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ({"scheduler_algorithm": "spread"}, ("spread", None, None)),
        ({"pause_eval_broker": "TRUE", "check_index": "7"}, (None, True, 7)),
        ({"pause_eval_broker": "false", "check_index": "0"}, (None, False, 0)),
    ],
    ids=["algorithm", "pause-with-index", "unpause-index-zero"],
)
def test_set_config_flags__valid__read(given: dict[str, str], expected: tuple[object, ...]) -> None:
    assert _changes(_set_config_args(**given)) == expected


@pytest.mark.parametrize(
    ("given", "named"),
    [
        ({"scheduler_algorithm": "Spread"}, "-scheduler-algorithm: 'Spread' is not one of binpack, spread"),
        ({"pause_eval_broker": "1"}, "-pause-eval-broker: '1' is not true or false"),
        ({"scheduler_algorithm": "spread", "check_index": "-1"}, "-check-index: -1 is negative"),
        ({"scheduler_algorithm": "spread", "check_index": "x"}, "-check-index: 'x' is not a number"),
        ({}, "nothing to change"),
    ],
    ids=["algorithm-case", "pause-number", "index-negative", "index-word", "nothing"],
)
def test_set_config_flags__invalid__one_message_naming_the_flag(given: dict[str, str], named: str) -> None:
    with pytest.raises(CLIError, match=named):
        _changes(_set_config_args(**given))


def _state(*times: int) -> structs_pb2.TaskState:
    return structs_pb2.TaskState(events=[structs_pb2.TaskEvent(type=f"e{t}", time_ns=t) for t in times])


def test_recent_events__newest_last__only_the_last_ten() -> None:
    state = _state(*range(30, 0, -2))  # 15 events, kept newest first

    shown = recent_events(state, argparse.Namespace(verbose=False))

    assert len(shown) == RECENT_EVENTS
    assert [e.time_ns for e in shown] == list(range(12, 31, 2))


def test_recent_events__verbose__every_event() -> None:
    assert len(recent_events(_state(*range(15)), argparse.Namespace(verbose=True))) == 15


def test_version_flag__prints_the_package_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["-version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out == f"drover v{drover_version()}\n"
