"""server/gc_freeze.py: the survivors of a full collection are frozen, and thawed and
collected once an interval. Each test runs in a child process: freezing is process-wide,
and the test runner's own objects must not be frozen for the tests after it."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

_PRELUDE = """
import gc, time
from drover.server.gc_freeze import GcFreezer

def wait(cond, timeout=20):
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)
"""


def _run(body: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", _PRELUDE + textwrap.dedent(body)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    # The last line: the freezer's own log lines come before it.
    return done.stdout.strip().splitlines()[-1]


@pytest.mark.timeout(90)
def test_freezer__a_full_collection_freezes_its_survivors() -> None:
    out = _run(
        """
        freezer = GcFreezer(thaw_interval_s=3600)
        freezer.start()
        wait(lambda: freezer.freezes == 1)  # what the process started with
        at_start = gc.get_freeze_count()
        assert at_start > 0
        kept = [[i] for i in range(10_000)]
        gc.collect()
        wait(lambda: freezer.freezes == 2)
        frozen = gc.get_freeze_count()
        assert frozen >= at_start + 10_000, (at_start, frozen)
        # A younger collection asks for no freeze: the callback runs inside the collection,
        # so once it returns the request would already be there.
        gc.collect(1)
        assert not freezer._full_collection.is_set()
        assert freezer.freezes == 2
        freezer.stop()
        print(frozen)
        """
    )
    assert int(out) >= 10_000


@pytest.mark.timeout(90)
def test_freezer__a_cycle_that_dies_while_frozen_is_reclaimed_at_the_thaw() -> None:
    out = _run(
        """
        import weakref
        class Node:
            pass
        a, b = Node(), Node()
        a.other, b.other = b, a
        alive = weakref.ref(a)
        freezer = GcFreezer(thaw_interval_s=1.0)
        freezer.start()
        wait(lambda: freezer.freezes >= 1)
        assert gc.get_freeze_count() > 0
        del a, b
        gc.collect()  # frozen: the dead cycle is not walked
        assert alive() is not None
        wait(lambda: freezer.thaws >= 1)
        assert alive() is None
        wait(lambda: gc.get_freeze_count() > 0)  # frozen again after the thaw's collection
        freezer.stop()
        print("reclaimed")
        """
    )
    assert out == "reclaimed"


@pytest.mark.timeout(90)
def test_freezer__stopped__leaves_the_collector_as_it_was() -> None:
    out = _run(
        """
        before = list(gc.callbacks)
        freezer = GcFreezer(thaw_interval_s=3600)
        freezer.start()
        assert len(gc.callbacks) == len(before) + 1
        wait(lambda: freezer.freezes == 1)
        freezer.stop()
        assert not freezer._thread.is_alive()  # joined: nothing can freeze any more
        gc.collect()
        assert freezer.freezes == 1
        print(gc.callbacks == before)
        """
    )
    assert out == "True"
