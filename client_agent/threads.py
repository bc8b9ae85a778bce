"""Waiting on the client's worker threads with a budget."""

from __future__ import annotations

import threading

__all__ = ["join_thread"]


def join_thread(thread: threading.Thread | None, timeout_s: float) -> bool:
    """Whether ``thread`` ended within ``timeout_s`` (True for one never started). A
    negative budget, left over from a shared deadline, waits not at all rather than
    raising, so a caller can join several threads against one deadline."""
    if thread is None:
        return True
    thread.join(max(0.0, timeout_s))
    return not thread.is_alive()
