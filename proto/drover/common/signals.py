"""Signal names as operators type them (``alloc signal -s``), shared by server and client.

The server checks the name before it asks the node, so a typo is refused at once with the
field named; the client checks it again, because a node trusts no one's parsing but its own.
"""

from __future__ import annotations

import signal
from typing import Final

__all__ = ["DEFAULT_SIGNAL", "SignalNameError", "parse_signal"]

# Nomad's `alloc signal` without -s sends SIGKILL.
DEFAULT_SIGNAL: Final = signal.SIGKILL


class SignalNameError(ValueError):
    """The text names no signal of this platform; the message names the field ``signal``."""


def parse_signal(name: str) -> signal.Signals:
    """``"SIGHUP"``, ``"HUP"`` or ``"hup"`` -> SIGHUP; ``""`` -> SIGKILL (Nomad's default).

    Numbers are refused: their meaning differs between platforms, and a name says in the
    operator's shell history what was sent.
    """
    text = name.strip().upper()
    if not text:
        return DEFAULT_SIGNAL
    if not text.startswith("SIG"):
        text = "SIG" + text
    # SIG_DFL / SIG_IGN are handler constants, not signals.
    if text.startswith("SIG_"):
        raise SignalNameError(f"signal: unknown signal {name!r} (e.g. SIGHUP, SIGUSR1, TERM)")
    try:
        return signal.Signals[text]
    except KeyError:
        raise SignalNameError(f"signal: unknown signal {name!r} (e.g. SIGHUP, SIGUSR1, TERM)") from None
