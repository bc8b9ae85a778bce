"""An alloc's view of the services its templates read, kept current by a blocking query.

``ServiceCache.lookup(name)`` is what a template's ``nomadService "name"`` calls: the first
ask for a name fetches it at once (a task's first render must see the services already
registered, as Nomad's first render waits for its data), and adds it to the names watched.
``watch(on_change)`` starts one thread per alloc that asks the servers
(Services.ClientInfo, stale: any server answers from its state) for every watched name with
the last index seen, so the call returns only once the registrations table moved; when what
the names resolve to differs, ``on_change`` runs (the alloc runner re-renders). The thread
ends with ``stop()``; a server that does not answer is retried after a pause.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

from drover.client.errors import RpcFailed
from drover.client.threads import join_thread
from drover.v1 import structs_pb2

__all__ = ["Fetch", "ServiceCache", "registration_view"]

# (service names, min_index, wait seconds, cancel flag) -> (registrations, index)
Fetch = Callable[
    [Sequence[str], int, float, threading.Event | None], tuple[Sequence[structs_pb2.ServiceRegistration], int]
]

WATCH_WAIT_S: Final = 30.0
RETRY_S: Final = 1.0


def registration_view(reg: structs_pb2.ServiceRegistration) -> dict[str, Any]:
    """A registration as a template sees it: Nomad's field names (``.Address``, ``.Port``,
    ``.Tags``; ``.Name`` and ``.ServiceName`` both)."""
    return {
        "ID": reg.id,
        "Name": reg.service_name,
        "ServiceName": reg.service_name,
        "Namespace": reg.namespace,
        "NodeID": reg.node_id,
        "Datacenter": reg.datacenter,
        "JobID": reg.job_id,
        "AllocID": reg.alloc_id,
        "Tags": list(reg.tags),
        "Address": reg.address,
        "Port": reg.port,
    }


class ServiceCache:
    def __init__(self, fetch: Fetch, *, log: Any) -> None:
        self._fetch = fetch
        self._log = log
        self._lock = threading.Lock()
        self._by_name: dict[str, list[dict[str, Any]]] = {}
        self._index = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def lookup(self, name: str) -> Sequence[Mapping[str, Any]]:
        with self._lock:
            known = self._by_name.get(name)
        if known is not None:
            return known
        try:
            registrations, index = self._fetch([name], 0, 0.0, None)
        except RpcFailed as exc:
            # Rendered as no registrations now; the watch fills it in and re-renders.
            self._log.warning("services.lookup_failed", service=name, error=str(exc))
            registrations, index = (), 0
        views = [registration_view(r) for r in registrations]
        with self._lock:
            self._by_name.setdefault(name, views)
            self._index = max(self._index, index) if self._index else index
            return self._by_name[name]

    def watch(self, on_change: Callable[[], None]) -> None:
        if self._thread is not None:
            return
        self._thread = threading.Thread(
            target=self._loop, args=(on_change,), name="services-watch", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def join(self, timeout_s: float) -> bool:
        self._stop.set()
        return self._thread is None or join_thread(self._thread, timeout_s)

    def _loop(self, on_change: Callable[[], None]) -> None:
        while not self._stop.is_set():
            with self._lock:
                names = sorted(self._by_name)
                index = self._index
            if not names:
                self._stop.wait(RETRY_S)
                continue
            try:
                registrations, new_index = self._fetch(names, max(index, 1), WATCH_WAIT_S, self._stop)
            except RpcFailed as exc:
                self._log.info("services.watch_retry", error=str(exc))
                self._stop.wait(RETRY_S)
                continue
            if self._stop.is_set():
                return
            grouped: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
            for reg in registrations:
                grouped.setdefault(reg.service_name, []).append(registration_view(reg))
            with self._lock:
                changed = any(self._by_name.get(n) != grouped[n] for n in names)
                self._by_name.update(grouped)
                self._index = max(self._index, new_index)
            if changed:
                try:
                    on_change()
                except Exception as exc:  # a failed re-render must not end the watch
                    self._log.error("services.rerender_failed", error=str(exc))
