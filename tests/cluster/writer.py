"""A writer for membership tests: acknowledged job registrations, one after another, on a
thread of its own, while a test changes the servers under it."""

from __future__ import annotations

import threading
from typing import Any

from deploy.cluster import wait_for
from drover.sdk import DroverClient, DroverError
from tests.cluster.jobs import service_job


class Writer:
    """Registers jobs one after another on its own thread; every write must be acknowledged
    (the SDK rides through elections within its retry deadline)."""

    def __init__(self, addresses: list[str], **client_args: Any) -> None:
        self.addresses = addresses
        # What the SDK client needs besides the addresses: tls=, token= on a secured cluster.
        self.client_args = client_args
        self.acked: list[str] = []
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="membership-writer", daemon=True)

    def __enter__(self) -> Writer:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=60)

    def _run(self) -> None:
        with DroverClient(self.addresses, retry_deadline=30, **self.client_args) as client:
            n = 0
            while not self._stop.is_set():
                job_id = f"member-write-{n:04d}"
                try:
                    client.register_job(service_job(job_id, count=0))
                except DroverError as exc:
                    self.errors.append(f"{job_id}: {exc}")
                    return
                self.acked.append(job_id)
                n += 1

    def wait_more(self, count: int, timeout: float = 60) -> None:
        """Until ``count`` more writes than now are acknowledged."""
        target = len(self.acked) + count
        wait_for(
            lambda: len(self.acked) >= target or bool(self.errors),
            timeout,
            0.05,
            lambda: f"{count} more acknowledged writes",
        )
        assert not self.errors, self.errors
