"""How an agent process ends after SIGTERM: a stop bounded in time, and no wait on threads
still inside a call once the state is closed (server/agent.py).

Each case runs in a child Python process, because what is tested is how the process exits
(``os._exit``, the interpreter's join of non-daemon threads at exit)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time

CHILD_TIMEOUT_S = 30.0


def _run(body: str) -> tuple[int, str, float]:
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(body)],
        capture_output=True,
        text=True,
        timeout=CHILD_TIMEOUT_S,
        check=False,
    )
    return done.returncode, done.stdout + done.stderr, time.monotonic() - started


def test_a_thread_still_in_a_call_does_not_hold_the_exit() -> None:
    code, output, _ = _run(
        """
        import threading, sys
        from drover.server.agent import _leave_lingering_threads
        held = threading.Event()
        threading.Thread(target=held.wait, name="grpc-write_7", daemon=False).start()
        _leave_lingering_threads(0, 0.2)
        print("not reached: the process should have exited")
        sys.exit(3)
        """
    )
    assert code == 0, output
    assert "agent.exit_leaving_threads" in output and "grpc-write_7" in output, output
    assert "not reached" not in output, output


def test_threads_that_finish_within_the_grace_are_waited_for() -> None:
    code, output, _ = _run(
        """
        import threading, time
        from drover.server.agent import _leave_lingering_threads
        finished = []
        t = threading.Thread(target=lambda: (time.sleep(0.1), finished.append(1)), daemon=False)
        t.start()
        _leave_lingering_threads(0, 10.0)
        print("returned", finished)
        """
    )
    assert code == 0, output
    assert "returned [1]" in output, output
    assert "agent.exit_leaving_threads" not in output, output


def test_a_stop_past_its_deadline_exits_1_with_every_threads_stack() -> None:
    code, output, _ = _run(
        """
        import threading
        from drover.server.agent import _stop_deadline
        def wedged_in_stop():
            threading.Event().wait(60)
        with _stop_deadline(0.3):
            wedged_in_stop()
        print("not reached: the stop should have been cut short")
        """
    )
    assert code == 1, output
    assert "agent.stop_overran" in output, output
    # faulthandler's dump names the frame the stop was stuck in.
    assert "wedged_in_stop" in output, output
    assert "not reached" not in output, output


def test_a_stop_within_its_deadline_is_left_alone() -> None:
    code, output, _ = _run(
        """
        import time
        from drover.server.agent import _stop_deadline
        with _stop_deadline(5.0):
            time.sleep(0.05)
        print("stopped cleanly")
        """
    )
    assert code == 0, output
    assert "stopped cleanly" in output and "agent.stop_overran" not in output, output
