"""Running agents as processes: signals, data directories, and clean shutdown."""

from __future__ import annotations

import faulthandler
import os
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Final

import structlog

from drover.client.metrics import ClientCollector, MonitoredClient
from drover.common.http_endpoint import HttpEndpoint
from drover.common.logs import configure_logging
from drover.server.config import DevConfig, ServerConfig
from drover.server.core import ServerCore, StartupError
from drover.server.datadir import PRIVATE_UMASK
from drover.server.gc_freeze import GcFreezer
from drover.server.telemetry.http import open_server_endpoint

log = structlog.get_logger("drover.agent")

# How long a stop may take once SIGTERM arrives: the API's grace for calls in flight (2 s,
# ServerCore.stop), a leader's services finishing their step, raft's last tick. Past it
# the agent writes every thread's stack to stderr and exits 1, so a stop that hangs says
# where, and ends, instead of waiting for a SIGKILL (deploy/cluster.py sends one at 10 s).
STOP_DEADLINE_S: Final = 8.0
# After a clean stop, how long threads still inside a call (a write waiting for a commit
# that will not come, a call forwarded to a leader that is gone) get to return. The state
# is closed by then; the interpreter would otherwise join them for as long as they wait.
LINGER_S: Final = 1.0


def _wait_for_signal() -> None:
    """Block until SIGINT or SIGTERM; both mean "shut down cleanly"."""
    stop = threading.Event()

    def handler(signum: int, _frame: FrameType | None) -> None:
        log.info("agent.signal", signal=signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)
    while not stop.wait(1.0):
        pass


def run_server(cfg: ServerConfig) -> int:
    configure_logging(json=cfg.log_json, level=cfg.log_level)
    # Everything this process writes (pysyncobj's journal included) is the owner's alone.
    os.umask(PRIVATE_UMASK)
    try:
        core = ServerCore(cfg)
        core.start()
    except (StartupError, OSError) as exc:
        log.error("agent.start_failed", error=str(exc))
        print(f"Error: {exc}", flush=True)
        return 1
    http = _start_http(core)
    if http is None:
        core.stop()
        return 1
    # The server's state outlives every collection: keep it out of their walks.
    freezer = GcFreezer()
    freezer.start()
    try:
        _wait_for_signal()
    finally:
        with _stop_deadline(STOP_DEADLINE_S):
            freezer.stop()
            http.stop()
            core.stop()
    _leave_lingering_threads(0, LINGER_S)
    return 0


@contextmanager
def _stop_deadline(seconds: float) -> Iterator[None]:
    """Bound a stop: past ``seconds``, every thread's stack goes to stderr and the process
    exits 1 without finishing it."""
    finished = threading.Event()

    def watch() -> None:
        if finished.wait(seconds):
            return
        log.error("agent.stop_overran", deadline_s=seconds)
        sys.stdout.flush()
        faulthandler.dump_traceback(all_threads=True)
        sys.stderr.flush()
        os._exit(1)

    watchdog = threading.Thread(target=watch, name="stop-deadline", daemon=True)
    watchdog.start()
    try:
        yield
    finally:
        finished.set()
        watchdog.join()


def _leave_lingering_threads(code: int, grace: float) -> None:
    """Give non-daemon threads still running ``grace`` seconds, then exit ``code`` without
    them, naming them; returns at once when there are none."""
    deadline = time.monotonic() + grace
    for thread in _lingering():
        thread.join(max(0.0, deadline - time.monotonic()))
    left = _lingering()
    if not left:
        return
    log.warning("agent.exit_leaving_threads", threads=sorted(t.name for t in left))
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _lingering() -> list[threading.Thread]:
    me = threading.current_thread()
    return [t for t in threading.enumerate() if t is not me and not t.daemon and t.is_alive()]


def _start_http(core: ServerCore, client: MonitoredClient | None = None) -> HttpEndpoint | None:
    """The server's HTTP port, serving; None (said on stdout) when it can not bind."""
    try:
        http = open_server_endpoint(core, client=client)
    except OSError as exc:
        message = f"can not bind HTTP to {core.cfg.bind}:{core.cfg.http_port}: {exc.strerror or exc} (see -http-port)"
        log.error("agent.start_failed", error=message)
        print(f"Error: {message}", flush=True)
        return None
    http.start()
    return http


def _free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def run_dev(cfg: DevConfig) -> int:
    """One process: a single-server cluster on loopback plus an in-process client agent;
    data in a temp dir unless given."""
    configure_logging(json=cfg.log_json, level=cfg.log_level)
    os.umask(PRIVATE_UMASK)  # as run_server: the dev cluster's files are the user's alone
    data_dir = cfg.data_dir or tempfile.mkdtemp(prefix="drover-dev-")
    # No peers and no -raft-key-file: the server makes a random raft key of its own, so
    # its raft port unseals nothing anyone sends (drover.server.core.read_raft_key).
    server_cfg = ServerConfig(
        node_name="dev",
        data_dir=data_dir,
        bind="127.0.0.1",
        grpc_port=cfg.grpc_port,
        raft_port=_free_port("127.0.0.1"),
        http_port=cfg.http_port,
        log_json=cfg.log_json,
        log_level=cfg.log_level,
    )
    try:
        core = ServerCore(server_cfg)
        core.start()
    except (StartupError, OSError) as exc:
        print(f"Error: {exc}", flush=True)
        return 1
    # The embedded client: this machine is the dev cluster's one node (mock and raw_exec).
    from drover.client.agent import start_embedded_client

    client = start_embedded_client([core.grpc_address], os.path.join(data_dir, "client"), "dev-client")
    core.agent_info_sections["client"] = lambda: {
        "node_id": client.node_id,
        "node_name": "dev-client",
        "registered": str(client.registered).lower(),
        "known_allocs": str(len(client.alloc_ids())),
    }
    core.metrics.register(ClientCollector(client))
    http = _start_http(core, client)
    if http is None:
        client.stop()
        core.stop()
        if not cfg.data_dir:
            shutil.rmtree(data_dir, ignore_errors=True)
        return 1
    log.info("agent.dev_ready", grpc=core.grpc_address, http=http.address, data_dir=data_dir)
    try:
        _wait_for_signal()
    finally:
        http.stop()
        # Unbounded: the client waits out each task's kill_timeout, which the job chose.
        client.stop()
        with _stop_deadline(STOP_DEADLINE_S):
            core.stop()
        if not cfg.data_dir:
            shutil.rmtree(data_dir, ignore_errors=True)
    _leave_lingering_threads(0, LINGER_S)
    return 0
