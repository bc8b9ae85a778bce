"""The CLI's one error boundary: every expected failure becomes one ``Error:`` line, exit 1.

Scripts parse drover's stderr, so no command prints a traceback for a failure it expects:
commands raise :class:`CLIError` (or let SDK and config errors through) and
:func:`run_handler` turns each into a single line. Nor for one it does not expect: hostile
input (a job file of bad UTF-8, nesting deeper than the stack, a 10,000-digit integer) must
not reach the user as a traceback either, so anything else is one line too, naming the
exception's type so a bug report still says what broke.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Callable

from drover.sdk import DroverError
from drover.server.config import ConfigError

__all__ = ["CLIError", "Handler", "fail", "run_handler"]

Handler = Callable[[argparse.Namespace], int]


class CLIError(Exception):
    """An expected failure: printed as ``Error: <message>``, exit status 1."""


def run_handler(handler: Handler, args: argparse.Namespace) -> int:
    """Run one command; failures it expects become one line on stderr and exit status 1."""
    try:
        return handler(args)
    except (CLIError, DroverError, ConfigError) as exc:
        return fail(str(exc))
    except BrokenPipeError:
        # stdout was closed early (``drover ... | head``): stop quietly, like other CLI tools.
        # Point stdout at /dev/null so the interpreter's final flush does not fail again.
        with contextlib.suppress(OSError, ValueError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except OSError as exc:
        where = f"{exc.filename}: " if exc.filename else ""
        return fail(f"{where}{exc.strerror or exc}")
    except KeyboardInterrupt:
        return 130
    except UnicodeDecodeError as exc:
        return fail(f"not valid UTF-8 text: byte 0x{exc.object[exc.start]:02x} at offset {exc.start}")
    except RecursionError:
        return fail("input nested too deeply to read")
    except Exception as exc:  # the last resort: see the module docstring
        return fail(f"unexpected {type(exc).__name__}: {_cut(str(exc))}")


_MAX_MESSAGE_CHARS = 512


def _cut(text: str) -> str:
    return text if len(text) <= _MAX_MESSAGE_CHARS else text[:_MAX_MESSAGE_CHARS] + "..."


def fail(message: str) -> int:
    """Print ``message`` as one ``Error:`` line (newlines folded) and return exit status 1."""
    print(f"Error: {' '.join(message.split()) or 'unknown error'}", file=sys.stderr)
    return 1
