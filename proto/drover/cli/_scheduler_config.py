"""``drover operator scheduler get-config|set-config``: the replicated scheduler config.

set-config is a read-modify-write, as Nomad's operator_scheduler_set_config.go: it reads
the current config, changes only the fields whose flags were given, and writes the whole
config back; with ``-check-index`` the write applies only if the stored config's modify
index still equals it (the servers decide that, so two operators cannot both win).
"""

from __future__ import annotations

import argparse
from typing import Final

from drover.cli._args import Subcommands, add_command, add_group, conn_flags, flag
from drover.cli._connect import connect
from drover.cli._errors import CLIError
from drover.cli._format import fmt_duration, print_json, print_kv
from drover.v1 import structs_pb2

__all__ = ["register"]

ALGORITHMS: Final = ("binpack", "spread")
_BOOLS: Final = {"true": True, "false": False}

_SET_EPILOG = """\
Only the settings given change. -check-index N: apply only if the config's modify index is
still N (see get-config); otherwise nothing is written and the command exits 1.
"""


def register(operator: Subcommands) -> None:
    scheduler = add_group(operator, "scheduler", "the scheduler configuration")
    p = add_command(scheduler, "get-config", _cmd_get_config, "show the scheduler configuration")
    conn_flags(p)
    flag(p, "stale", action="store_true", help="let any server answer from its own state")
    flag(p, "json", action="store_true", help="print JSON (proto field names)")
    p = add_command(
        scheduler, "set-config", _cmd_set_config, "change the scheduler configuration", _SET_EPILOG
    )
    conn_flags(p)
    flag(p, "scheduler-algorithm", metavar="|".join(ALGORITHMS), help="how nodes are ranked for placements")
    flag(p, "pause-eval-broker", metavar="true|false", help="hold every evaluation back from the schedulers")
    flag(p, "check-index", metavar="N", help="apply only if the config's modify index is still N")
    flag(p, "json", action="store_true", help="print the response as JSON")


def _print_config(config: structs_pb2.SchedulerConfig) -> None:
    tracker = config.rejection_tracker if config.HasField("rejection_tracker") else None
    print_kv(
        [
            ("Scheduler Algorithm", config.scheduler_algorithm or "binpack"),
            ("Pause Eval Broker", str(config.pause_eval_broker).lower()),
            (
                "Rejection Tracker",
                "default (enabled, threshold 5 in 5m)"
                if tracker is None
                else f"{'enabled' if tracker.enabled else 'disabled'}, threshold {tracker.threshold}"
                f" in {fmt_duration(tracker.window_ns)}",
            ),
            ("Create Index", str(config.create_index)),
            ("Modify Index", str(config.modify_index)),
        ]
    )


def _cmd_get_config(args: argparse.Namespace) -> int:
    with connect(args) as client:
        resp = client.scheduler_get_config(stale=args.stale)
    if args.json:
        print_json(resp)
        return 0
    _print_config(resp.config)
    return 0


def _changes(args: argparse.Namespace) -> tuple[str | None, bool | None, int | None]:
    """The flags' values, checked before anything is sent (one line each when wrong)."""
    algorithm: str | None = args.scheduler_algorithm
    if algorithm is not None and algorithm not in ALGORITHMS:
        raise CLIError(f"-scheduler-algorithm: {algorithm!r} is not one of {', '.join(ALGORITHMS)}")
    pause: bool | None = None
    if args.pause_eval_broker is not None:
        if args.pause_eval_broker.lower() not in _BOOLS:
            raise CLIError(f"-pause-eval-broker: {args.pause_eval_broker!r} is not true or false")
        pause = _BOOLS[args.pause_eval_broker.lower()]
    check_index: int | None = None
    if args.check_index is not None:
        try:
            check_index = int(args.check_index)
        except ValueError:
            raise CLIError(f"-check-index: {args.check_index!r} is not a number") from None
        if check_index < 0:
            raise CLIError(f"-check-index: {check_index} is negative")
    if algorithm is None and pause is None:
        raise CLIError("nothing to change: give -scheduler-algorithm or -pause-eval-broker")
    return algorithm, pause, check_index


def _cmd_set_config(args: argparse.Namespace) -> int:
    algorithm, pause, check_index = _changes(args)
    with connect(args) as client:
        config = client.scheduler_get_config().config
        if algorithm is not None:
            config.scheduler_algorithm = algorithm
        if pause is not None:
            config.pause_eval_broker = pause
        resp = client.scheduler_set_config(config, cas_index=check_index)
    if args.json:
        print_json(resp)
        return 0
    print(f"Scheduler configuration updated (index {resp.meta.index})")
    return 0
