"""``drover alloc logs|restart|signal``: what the alloc's client answers, through its tunnel.

The servers relay each to the client agent that runs the alloc (``Nodes.Connect``); the
alloc may be named by a unique ID prefix, as everywhere. Flags follow Nomad's:

    alloc logs [-stderr] [-f] [-tail] [-n LINES | -c BYTES] ALLOC [TASK]
    alloc restart ALLOC [TASK]            (no TASK: every running task)
    alloc signal [-s SIGNAL] ALLOC [TASK] (no -s: SIGKILL, as Nomad)
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Final

from drover.cli._args import Subcommands, add_command, conn_flags, display_id, flag
from drover.cli._connect import ALLOCS, connect, find
from drover.cli._errors import CLIError
from drover.cli._format import print_json

if TYPE_CHECKING:
    from drover.sdk import DroverClient
    from drover.v1 import api_pb2

__all__ = ["register_control"]

# Nomad's `-tail` without `-n` or `-c` shows the last 10 lines.
DEFAULT_TAIL_LINES: Final = 10


def register_control(allocs: Subcommands) -> None:
    p = add_command(
        allocs, "logs", _cmd_alloc_logs, "print a task's stdout (or stderr), as its client reads it"
    )
    p.add_argument("alloc")
    p.add_argument("task", nargs="?", default="", help="the task (needed when the alloc has several)")
    conn_flags(p)
    flag(p, "stderr", action="store_true", help="the task's stderr instead of its stdout")
    p.add_argument(
        "-f",
        "--f",
        "-follow",
        "--follow",
        dest="follow",
        action="store_true",
        help="keep printing new output",
    )
    flag(
        p,
        "tail",
        action="store_true",
        help=f"start near the end (the last {DEFAULT_TAIL_LINES} lines by default)",
    )
    p.add_argument(
        "-n", "--n", dest="lines", type=int, metavar="LINES", help="with -tail: the last LINES lines"
    )
    p.add_argument(
        "-c", "--c", dest="bytes", type=int, metavar="BYTES", help="with -tail: the last BYTES bytes"
    )
    p.add_argument("-task", "--task", dest="task_flag", default="", metavar="TASK", help="the task (as TASK)")
    p = add_command(allocs, "restart", _cmd_alloc_restart, "restart an allocation's tasks in place")
    p.add_argument("alloc")
    p.add_argument("task", nargs="?", default="", help="only this task (default: every running task)")
    conn_flags(p)
    flag(p, "json", action="store_true", help="print the response as JSON")
    flag(p, "verbose", action="store_true", help="print full IDs")
    p.add_argument("-task", "--task", dest="task_flag", default="", metavar="TASK", help="the task (as TASK)")
    p = add_command(allocs, "signal", _cmd_alloc_signal, "send a signal to an allocation's tasks")
    p.add_argument("alloc")
    p.add_argument("task", nargs="?", default="", help="only this task (default: every running task)")
    conn_flags(p)
    p.add_argument(
        "-s", "--s", dest="signal", default="", metavar="SIGNAL", help="e.g. SIGHUP or HUP (default SIGKILL)"
    )
    flag(p, "json", action="store_true", help="print the response as JSON")
    flag(p, "verbose", action="store_true", help="print full IDs")
    p.add_argument("-task", "--task", dest="task_flag", default="", metavar="TASK", help="the task (as TASK)")


def _task(args: argparse.Namespace) -> str:
    if args.task and args.task_flag and args.task != args.task_flag:
        raise CLIError(f"task named twice: {args.task!r} and -task {args.task_flag!r}")
    return str(args.task or args.task_flag)


def tail_request(tail: bool, lines: int | None, nbytes: int | None) -> tuple[int, int]:
    """(tail_lines, tail_bytes) for ``-tail``, ``-n`` and ``-c``: ``-n``/``-c`` imply
    ``-tail``, and ``-tail`` alone is the last 10 lines."""
    if lines is not None and nbytes is not None:
        raise CLIError("-n and -c can not be combined")
    # 0 would mean "from the start" to the server: refuse it rather than print everything.
    if lines is not None and lines < 1:
        raise CLIError(f"-n must be >= 1, got {lines}")
    if nbytes is not None and nbytes < 1:
        raise CLIError(f"-c must be >= 1, got {nbytes}")
    if nbytes is not None:
        return 0, nbytes
    if lines is not None:
        return lines, 0
    return (DEFAULT_TAIL_LINES, 0) if tail else (0, 0)


def _cmd_alloc_logs(args: argparse.Namespace) -> int:
    task = _task(args)
    tail_lines, tail_bytes = tail_request(args.tail, args.lines, args.bytes)
    out = sys.stdout.buffer
    with connect(args) as client:
        alloc = find(client, ALLOCS, args.alloc, stale=False)
        for chunk in client.alloc_logs(
            alloc.id,
            task,
            stderr=args.stderr,
            follow=args.follow,
            tail_lines=tail_lines,
            tail_bytes=tail_bytes,
        ):
            out.write(chunk)
            out.flush()
    return 0


def _cmd_alloc_restart(args: argparse.Namespace) -> int:
    return _control_tasks(
        args, lambda client, alloc_id, task: client.restart_alloc(alloc_id, task), "Restarting"
    )


def _cmd_alloc_signal(args: argparse.Namespace) -> int:
    return _control_tasks(
        args,
        lambda client, alloc_id, task: client.signal_alloc(alloc_id, task, signal=args.signal),
        f"Sent {args.signal or 'SIGKILL'} to",
    )


def _control_tasks(
    args: argparse.Namespace,
    send: Callable[[DroverClient, str, str], api_pb2.AllocControlResponse],
    done: str,
) -> int:
    """``restart`` and ``signal`` alike: the alloc found by its ID prefix, one request to its
    client for the named task (none: every running task), and the answer printed as JSON or
    as one line saying what was ``done`` to which tasks of which alloc."""
    task = _task(args)
    with connect(args) as client:
        alloc = find(client, ALLOCS, args.alloc, stale=False)
        response = send(client, alloc.id, task)
        if args.json:
            print_json(response)
            return 0
        what = f'task "{task}"' if task else "every running task"
        print(f'{done} {what} of allocation "{display_id(alloc.id, args)}"')
    return 0
