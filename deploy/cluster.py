"""A local multi-process drover cluster: real server (and client) agents on loopback.

Two ways in:

* from tests::

      with LocalCluster(tmp_path, servers=3) as cluster:   # __enter__ starts it
          cluster.wait_for_leader(30)
          cluster.kill(cluster.leader_index())
          cluster.wait_for_leader(30)
          cluster.restart(0)
          cluster.wait_converged(60)
                                                            # __exit__ stops everything

* from the command line (``make cluster`` / ``make cluster-stop``)::

      python deploy/cluster.py start [--servers 3] [--clients 0] [--dir .cluster]
      python deploy/cluster.py status [--dir .cluster]
      python deploy/cluster.py stop [--dir .cluster]
      python deploy/cluster.py kill-leader [--dir .cluster]

  ``start`` begins a fresh cluster (it clears the data dirs and logs a previous one left
  in ``<dir>``), leaves the agents running in the background, records them in
  ``<dir>/cluster.json`` and returns once a leader is elected; ``stop`` ends exactly the
  processes recorded there; ``kill-leader`` SIGKILLs whichever recorded server leads now
  (the README tour's failover step, with no leader name to look up first).

Every agent is a real ``python -m drover.cli agent ...`` process in its own session (so a
Ctrl-C in the launching terminal does not reach it, and a test can SIGKILL one alone), with
stdout and stderr appended to ``<dir>/<name>.log``. Server ``i`` (0-based) is named
``s{i+1}`` and keeps its gRPC port, raft port and data dir across restarts. Readiness is
polled over gRPC with ``Operator.StateDigest``, which every server answers for itself
(never forwarded): nothing here sleeps and hopes.

A cluster of several servers is keyed: ``start`` writes one fresh raft key to
``<dir>/raft.key`` (mode 0600) and passes it to every server with ``-raft-key-file``, as a
server with peers refuses to start without one. A single server needs none (it makes a
random key of its own).

Ports are picked at random below the kernel's ephemeral range and checked by binding them,
all held open together so they are distinct (``pick_free_ports``): no outgoing connection
takes its local port from there. A cluster never picks a port it has already handed to one
of its agents, bound yet or not. Another process can still bind one between the pick and
the agent's bind; the agent then exits on its own and the next wait fails fast with its log.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import ctypes
import json
import os
import random
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, TextIO, TypeVar

import grpc

from drover.common import certs
from drover.common.grpc_options import MESSAGE_SIZE_OPTIONS, fast_reconnect_options
from drover.common.secrets import TOKEN_ENV
from drover.common.tls import CA_ENV, CERT_ENV, KEY_ENV, TLSFiles, TLSMaterial, open_channel
from drover.sdk import DroverClient, DroverError
from drover.v1 import api_pb2, api_pb2_grpc

__all__ = [
    "ClusterError",
    "ClusterRecord",
    "ClusterTLS",
    "LocalCluster",
    "ProcessRecord",
    "ServerSpec",
    "client_argv",
    "main",
    "make_cluster_tls",
    "make_server_specs",
    "peer_addresses",
    "pick_free_ports",
    "process_cmdline",
    "query_state_digest",
    "recorded_leader",
    "server_argv",
    "stop_recorded",
    "wait_for",
    "write_raft_key",
]

REPO_ROOT = Path(__file__).resolve().parent.parent
LOOPBACK = "127.0.0.1"
AGENT_MODULE = "drover.cli"
STATE_FILE = "cluster.json"
RAFT_KEY_FILE = "raft.key"
# How long an agent gets to exit after SIGTERM before it is SIGKILLed.
STOP_TIMEOUT = 10.0
# How long a hung agent gets to write its stacks after SIGABRT before it is SIGKILLed.
STACK_DUMP_WAIT_S = 2.0
# Per-RPC deadline when polling: a paused or wedged server must not stall a wait.
RPC_TIMEOUT = 1.0
POLL_INTERVAL = 0.1

# Servers are killed and restarted on the same port all the time here.
_CHANNEL_OPTIONS = (*fast_reconnect_options(max_backoff_ms=500), *MESSAGE_SIZE_OPTIONS)

T = TypeVar("T")


class ClusterError(RuntimeError):
    """The cluster did not get where it was asked to; the message carries the logs' tail."""


def wait_for(
    predicate: Callable[[], T],
    timeout: float,
    interval: float = POLL_INTERVAL,
    message: str | Callable[[], str] = "condition",
) -> T:
    """Call ``predicate`` until it returns something truthy, and return that.

    Raises TimeoutError naming ``message`` (a callable is evaluated only then, so it can
    describe the last state seen) once ``timeout`` seconds have passed. Exceptions from the
    predicate propagate at once: that is how a wait fails fast.
    """
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if result:
            return result
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            text = message() if callable(message) else message
            raise TimeoutError(f"timed out after {timeout:g}s waiting for {text}")
        time.sleep(min(interval, remaining))


# Ports are picked below the kernel's ephemeral range (where binding port 0 and every
# outgoing connection's local end come from), so a port picked here cannot be taken by a
# loopback connection some other test opens before the agent binds it: the race that made a
# server exit with "Address already in use". Nomad's test helper (ci/freeport) picks from a
# block outside that range for the same reason.
PICK_PORT_FLOOR: Final = 10_000
_EPHEMERAL_RANGE_FILE: Final = Path("/proc/sys/net/ipv4/ip_local_port_range")
_DEFAULT_EPHEMERAL_LOW: Final = 32_768


def _ephemeral_low() -> int:
    """The lowest port the kernel hands out on its own (Linux; 32768 elsewhere)."""
    try:
        return int(_EPHEMERAL_RANGE_FILE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return _DEFAULT_EPHEMERAL_LOW


def pick_free_ports(count: int, host: str = LOOPBACK, *, exclude: Collection[int] = ()) -> list[int]:
    """``count`` distinct ports that were free on ``host`` a moment ago, chosen at random
    between ``PICK_PORT_FLOOR`` and the ephemeral range, each checked by binding it (all held
    open together, so they are distinct). Falls back to port 0 when that block is too small
    or taken, as a machine whose ephemeral range starts low would make it.

    ``exclude`` are ports already handed to agents that may not have bound them yet (just
    spawned, or stopped for a restart): free now, but not for long, so never picked again.
    Without it a client picked after its cluster's servers once drew a server's HTTP port
    and bound it first, and that server exited with "Address already in use"."""
    socks: list[socket.socket] = []
    excluded = frozenset(exclude)
    candidates = [port for port in range(PICK_PORT_FLOOR, _ephemeral_low()) if port not in excluded]
    random.SystemRandom().shuffle(candidates)
    try:
        for port in candidates:
            if len(socks) == count:
                break
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                sock.bind((host, port))
            except OSError:
                sock.close()
                continue
            socks.append(sock)
        while len(socks) < count:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            socks.append(sock)
            sock.bind((host, 0))
        return [int(sock.getsockname()[1]) for sock in socks]
    finally:
        for sock in socks:
            sock.close()


@dataclass(frozen=True, slots=True)
class ServerSpec:
    name: str
    grpc_port: int
    raft_port: int
    host: str = LOOPBACK
    # Metrics and health (-http-port); 0: the agent picks a free one.
    http_port: int = 0

    @property
    def grpc_address(self) -> str:
        return f"{self.host}:{self.grpc_port}"

    @property
    def raft_address(self) -> str:
        return f"{self.host}:{self.raft_port}"

    @property
    def http_address(self) -> str:
        return f"{self.host}:{self.http_port}"


def make_server_specs(
    count: int, host: str = LOOPBACK, *, exclude: Collection[int] = ()
) -> tuple[ServerSpec, ...]:
    ports = pick_free_ports(3 * count, host, exclude=exclude)
    return tuple(
        ServerSpec(f"s{i + 1}", ports[3 * i], ports[3 * i + 1], host, http_port=ports[3 * i + 2])
        for i in range(count)
    )


def peer_addresses(specs: Sequence[ServerSpec], index: int) -> list[str]:
    """The raft addresses of every server but ``specs[index]``: its ``-peers``."""
    return [spec.raft_address for i, spec in enumerate(specs) if i != index]


def agent_args(role: str, name: str, data_dir: Path) -> list[str]:
    """``agent -<role> -node-name <name> -data-dir <dir>``: what every agent a test or this
    launcher starts is told first (``role``: ``server`` or ``client``)."""
    return ["agent", f"-{role}", "-node-name", name, "-data-dir", str(data_dir)]


def server_argv(
    spec: ServerSpec,
    data_dir: Path,
    peers: Sequence[str],
    extra_args: Sequence[str] = (),
    module: str = AGENT_MODULE,
    raft_key_file: Path | None = None,
) -> list[str]:
    argv = [
        sys.executable,
        "-m",
        module,
        *agent_args("server", spec.name, data_dir),
        "-bind",
        spec.host,
        "-grpc-port",
        str(spec.grpc_port),
        "-raft-port",
        str(spec.raft_port),
        "-http-port",
        str(spec.http_port),
    ]
    if peers:
        argv += ["-peers", ",".join(peers)]
    if raft_key_file is not None:
        argv += ["-raft-key-file", str(raft_key_file)]
    return [*argv, *extra_args]


def write_raft_key(path: Path) -> Path:
    """A fresh cluster key at ``path`` (32 random bytes, base64), readable by its owner only.

    Written beside ``path`` and renamed, created 0600: the key is never readable by others,
    not even for a moment, and a server never reads half of it.
    """
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, base64.b64encode(os.urandom(32)) + b"\n")
    finally:
        os.close(fd)
    os.replace(tmp, path)
    return path


def client_argv(
    name: str,
    data_dir: Path,
    servers: Sequence[str],
    extra_args: Sequence[str] = (),
    module: str = AGENT_MODULE,
    *,
    http_port: int = 0,
) -> list[str]:
    """``http_port`` 0: the agent picks a free one (several clients share one host)."""
    return [
        sys.executable,
        "-m",
        module,
        *agent_args("client", name, data_dir),
        "-servers",
        ",".join(servers),
        "-http-port",
        str(http_port),
        # The test and example jobs run raw_exec tasks; a client offers it only when asked.
        "-enable-raw-exec",
        *extra_args,
    ]


def query_state_digest(
    address: str, timeout: float = RPC_TIMEOUT, tls: TLSMaterial | None = None
) -> api_pb2.StateDigestResponse | None:
    """One server's own StateDigest answer, or None if it does not answer in time."""
    with open_channel(address, tls) as channel:
        try:
            return api_pb2_grpc.OperatorStub(channel).StateDigest(
                api_pb2.StateDigestRequest(), timeout=timeout
            )
        except grpc.RpcError:
            return None


# --- TLS -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ClusterTLS:
    """A cluster's own CA and one certificate per role, as ``drover tls`` would write them."""

    dir: Path

    @property
    def ca_file(self) -> Path:
        return self.dir / certs.CA_FILE

    def pair(self, role: certs.Role) -> tuple[Path, Path]:
        cert, key = certs.cert_file_names(role)
        return self.dir / cert, self.dir / key

    def agent_args(self, role: certs.Role, *, verify_clients: bool = False) -> list[str]:
        cert, key = self.pair(role)
        args = ["-tls-ca-file", str(self.ca_file), "-tls-cert-file", str(cert), "-tls-key-file", str(key)]
        return [*args, "-tls-verify-client"] if verify_clients else args

    @property
    def cli_files(self) -> TLSFiles:
        """What an SDK or CLI caller presents: ``DroverClient(..., tls=cluster.tls.cli_files)``."""
        cert, key = self.pair("cli")
        return TLSFiles(str(self.ca_file), str(cert), str(key))

    @property
    def cli_env(self) -> dict[str, str]:
        """The same for a ``drover`` subprocess: DROVER_CACERT and the client pair."""
        files = self.cli_files
        return {CA_ENV: files.ca_file, CERT_ENV: files.cert_file, KEY_ENV: files.key_file}

    def _all_files(self) -> list[Path]:
        return [self.ca_file, self.dir / certs.CA_KEY_FILE, *(f for r in certs.ROLES for f in self.pair(r))]


def make_cluster_tls(directory: Path) -> ClusterTLS:
    """The CA and server, client and CLI certificates in ``directory``: the ones already
    there when all are, else a fresh set (a half set could mix two CAs)."""
    tls = ClusterTLS(Path(directory))
    files = tls._all_files()
    if all(f.exists() for f in files):
        return tls
    tls.dir.mkdir(parents=True, exist_ok=True)
    os.chmod(tls.dir, 0o700)
    for f in files:
        f.unlink(missing_ok=True)
    ca = certs.create_ca()
    certs.write_pair(ca, str(tls.ca_file), str(tls.dir / certs.CA_KEY_FILE))
    for role in certs.ROLES:
        cert, key = tls.pair(role)
        certs.write_pair(certs.create_cert(ca, role), str(cert), str(key))
    return tls


# --- cluster.json -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ProcessRecord:
    """One launched agent, as ``stop`` needs to find it again (and nothing else)."""

    name: str
    pid: int
    # The exact argv it was started with: ``stop`` signals the pid only while
    # /proc/<pid>/cmdline still contains "drover.cli" and equals it (data dir included).
    argv: tuple[str, ...]
    data_dir: str
    log: str
    grpc_address: str = ""
    raft_address: str = ""
    grpc_port: int = 0
    raft_port: int = 0
    # Its HTTP port (metrics, health): what `curl` and Prometheus scrape.
    http_address: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "pid": self.pid,
            "argv": list(self.argv),
            "data_dir": self.data_dir,
            "log": self.log,
            "grpc_address": self.grpc_address,
            "raft_address": self.raft_address,
            "grpc_port": self.grpc_port,
            "raft_port": self.raft_port,
            "http_address": self.http_address,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ProcessRecord:
        return cls(
            name=str(data["name"]),
            pid=int(data["pid"]),
            argv=tuple(str(a) for a in data["argv"]),
            data_dir=str(data["data_dir"]),
            log=str(data["log"]),
            grpc_address=str(data.get("grpc_address", "")),
            raft_address=str(data.get("raft_address", "")),
            grpc_port=int(data.get("grpc_port", 0)),
            raft_port=int(data.get("raft_port", 0)),
            http_address=str(data.get("http_address", "")),
        )


@dataclass(frozen=True, slots=True)
class ClusterRecord:
    base_dir: str
    servers: tuple[ProcessRecord, ...]
    clients: tuple[ProcessRecord, ...] = ()
    # Set when the cluster serves TLS: its ClusterTLS directory.
    tls_dir: str = ""

    VERSION = 1

    @property
    def tls(self) -> ClusterTLS | None:
        return ClusterTLS(Path(self.tls_dir)) if self.tls_dir else None

    @property
    def grpc_addresses(self) -> list[str]:
        return [s.grpc_address for s in self.servers]

    def to_json(self) -> str:
        return json.dumps(
            {
                "version": self.VERSION,
                "base_dir": self.base_dir,
                "servers": [s.to_dict() for s in self.servers],
                "clients": [c.to_dict() for c in self.clients],
                "tls_dir": self.tls_dir,
            },
            indent=2,
        )

    @classmethod
    def from_json(cls, text: str) -> ClusterRecord:
        data = json.loads(text)
        if data.get("version") != cls.VERSION:
            raise ValueError(f"unsupported cluster.json version {data.get('version')!r}")
        return cls(
            base_dir=str(data["base_dir"]),
            servers=tuple(ProcessRecord.from_dict(s) for s in data["servers"]),
            clients=tuple(ProcessRecord.from_dict(c) for c in data.get("clients", [])),
            tls_dir=str(data.get("tls_dir", "")),
        )

    def save(self, path: Path) -> None:
        """Write atomically: a reader never sees half a file."""
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(self.to_json() + "\n")
        os.replace(tmp, path)

    @classmethod
    def load(cls, path: Path) -> ClusterRecord:
        return cls.from_json(path.read_text())


def process_cmdline(pid: int) -> list[str] | None:
    """The argv of live process ``pid``, or None if there is none (zombies count as none)."""
    if Path("/proc/self").exists():
        proc = Path("/proc") / str(pid)
        try:
            raw = (proc / "cmdline").read_bytes()
            stat = (proc / "stat").read_text()
        except OSError:
            return None
        # The state letter follows the parenthesised command name, which may contain spaces.
        fields = stat.rpartition(")")[2].split()
        if not raw or not fields or fields[0] in ("Z", "X"):
            return None
        return [arg.decode(errors="replace") for arg in raw.rstrip(b"\0").split(b"\0")]
    import psutil  # no /proc (macOS): same question, asked portably

    try:
        process = psutil.Process(pid)
        if process.status() == psutil.STATUS_ZOMBIE:
            return None
        return process.cmdline()
    except psutil.Error:
        return None


def _is_recorded_agent(record: ProcessRecord) -> bool:
    """True while ``record.pid`` still runs the agent recorded: a drover agent
    (``-m drover.cli``) started with exactly the recorded argv, its own data dir included."""
    cmdline = process_cmdline(record.pid)
    return cmdline is not None and AGENT_MODULE in cmdline and cmdline == list(record.argv)


def _pid_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _send(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _main_thread_state(pid: int) -> str | None:
    """The state letter of ``pid``'s main thread (R, S, T, ...), or None if unknown or gone."""
    try:
        stat = (Path("/proc") / str(pid) / "task" / str(pid) / "stat").read_text()
    except OSError:
        return None
    fields = stat.rpartition(")")[2].split()
    return fields[0] if fields else None


def _libc_tgkill() -> Callable[[int, int, int], int] | None:
    try:
        tgkill: Callable[[int, int, int], int] = ctypes.CDLL(None, use_errno=True).tgkill
    except (AttributeError, OSError):  # not Linux, or glibc < 2.30
        return None
    return tgkill


_TGKILL = _libc_tgkill()


# Long enough for a SIGKILLed task to be reaped even on a loaded machine.
TASK_REAP_TIMEOUT = 10.0


def kill_processes_working_under(roots: Iterable[Path]) -> None:
    """SIGKILL every process whose working directory is one of ``roots`` or below one, and
    wait for them: the raw_exec tasks of client agents on those data dirs.

    A client agent that stops (or is killed) leaves its tasks running by design, so that a
    restarted agent re-attaches to them (client_agent/drivers/raw_exec.py); raw_exec runs
    each task in ``<data_dir>/allocs/<alloc_id>/<task>/``. ``roots`` should be resolved
    paths: a process's cwd is reported resolved.
    """
    import psutil

    roots = list(roots)
    victims = []
    for proc in psutil.process_iter(["pid"]):
        with contextlib.suppress(psutil.Error, OSError):
            cwd = Path(proc.cwd())
            if any(cwd == root or root in cwd.parents for root in roots):
                victims.append(proc)
    for proc in victims:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    psutil.wait_procs(victims, timeout=TASK_REAP_TIMEOUT)


def _terminate(pid: int) -> None:
    """SIGTERM ``pid`` aimed at its main thread, then SIGCONT in case it was paused.

    A process-wide signal goes to any thread that has none pending. Python runs handlers
    only in the main thread, so if the kernel picks a grpc thread (likely just after a
    SIGSTOP/SIGCONT, when the main thread still has one pending) while the main thread
    sleeps in an untimed wait, the agent never notices. tgkill(pid, pid) queues the signal
    on the main thread itself, which wakes it; a stopped process gets it once continued.
    """
    if _TGKILL is not None and _TGKILL(pid, pid, signal.SIGTERM) == 0:
        _send(pid, signal.SIGCONT)
        return
    _send(pid, signal.SIGCONT)
    _send(pid, signal.SIGTERM)


def stop_recorded(state_path: Path, timeout: float = STOP_TIMEOUT) -> dict[str, str]:
    """Stop the agents listed in ``state_path`` and remove it.

    Returns each agent's outcome: "stopped" (exited after SIGTERM), "killed" (SIGKILLed after
    ``timeout``), "gone" (no such process), or "foreign" (the pid now runs something else:
    left alone). A pid is signalled only while its cmdline still equals the recorded argv,
    checked again right before the SIGKILL, so a reused pid is never hit.
    """
    record = ClusterRecord.load(state_path)
    members = [*record.clients, *record.servers]
    outcome: dict[str, str] = {}
    signalled: list[ProcessRecord] = []
    for member in members:
        if _is_recorded_agent(member):
            _terminate(member.pid)
            signalled.append(member)
        else:
            outcome[member.name] = "foreign" if _pid_exists(member.pid) else "gone"

    def all_exited() -> bool:
        return not any(_is_recorded_agent(m) for m in signalled)

    try:
        wait_for(all_exited, timeout, message="agents to exit after SIGTERM")
    except TimeoutError:
        pass
    for member in signalled:
        if _is_recorded_agent(member):
            _send(member.pid, signal.SIGKILL)
            outcome[member.name] = "killed"
        else:
            outcome[member.name] = "stopped"
    try:
        wait_for(all_exited, 5.0, message="agents to exit after SIGKILL")
    except TimeoutError:
        pass
    state_path.unlink(missing_ok=True)
    return outcome


# --- the launcher -------------------------------------------------------------------------


@dataclass(slots=True)
class _Member:
    name: str
    argv: list[str]
    data_dir: Path
    log_path: Path
    spec: ServerSpec | None = None
    # The agent's -http-port (metrics, health).
    http_port: int = 0
    # Set over the cluster's environment for this member alone (a joiner's token).
    env: Mapping[str, str] = field(default_factory=dict)
    proc: subprocess.Popen[bytes] | None = None
    # Set when we signal it: a member that exits without having been signalled crashed,
    # and waits fail at once with its log instead of running out their timeout.
    signalled: bool = False

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


@dataclass(slots=True)
class _Channels:
    """One cached channel per server index, dropped when that server restarts."""

    by_index: dict[int, grpc.Channel] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    tls: TLSMaterial | None = None

    def get(self, index: int, address: str) -> grpc.Channel:
        with self.lock:
            channel = self.by_index.get(index)
            if channel is None:
                channel = open_channel(address, self.tls, _CHANNEL_OPTIONS)
                self.by_index[index] = channel
            return channel

    def drop(self, index: int) -> None:
        with self.lock:
            channel = self.by_index.pop(index, None)
        if channel is not None:
            channel.close()

    def close_all(self) -> None:
        with self.lock:
            channels = list(self.by_index.values())
            self.by_index.clear()
        for channel in channels:
            channel.close()


class LocalCluster:
    """``servers`` server agents (and ``clients`` client agents) as real local processes.

    ``extra_args`` are appended to every server's command line, ``client_extra_args`` to
    every client's; ``env`` is merged over this process's environment. ``tls`` (True, or a
    directory) makes every port TLS with a CA and certificates of the cluster's own
    (:func:`make_cluster_tls`, in ``<base_dir>/tls`` for True); the servers verify callers
    unless ``verify_clients`` is False; ``cluster.tls.cli_files`` is what a test's SDK client
    presents. ``acl`` starts the servers with ``-acl-enabled``; ``start`` then also waits
    for a leader and bootstraps, and ``cluster.management_token`` is the management secret
    (the launcher's own digest polls send it). Methods taking ``i``
    address servers by 0-based index; the ``*_client`` ones address clients. Usable from
    several threads (a live checker polling while the test kills servers), but start, kill,
    restart and stop belong to one thread.
    """

    def __init__(
        self,
        base_dir: Path,
        servers: int = 3,
        clients: int = 0,
        extra_args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        *,
        client_extra_args: Sequence[str] = (),
        agent_module: str = AGENT_MODULE,
        tls: bool | Path = False,
        verify_clients: bool = True,
        acl: bool = False,
    ) -> None:
        if servers < 1 or clients < 0:
            raise ValueError(f"need servers >= 1 and clients >= 0, got {servers} and {clients}")
        self.base_dir = Path(base_dir).resolve()
        self._n_servers = servers
        self._n_clients = clients
        self._extra_args = tuple(extra_args)
        self._client_extra_args = tuple(client_extra_args)
        self._agent_module = agent_module
        # Unbuffered, so a crash's last words are in the log when we read its tail; with
        # faulthandler on, an agent that ignores SIGTERM is sent SIGABRT before SIGKILL and
        # writes every thread's stack there first (``_stop_members``).
        self._env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONFAULTHANDLER": "1", **(env or {})}
        self._servers: list[_Member] = []
        self._clients: list[_Member] = []
        self._channels = _Channels()
        self._started = False
        self._raft_key_file: Path | None = None
        tls_dir = self.base_dir / "tls" if tls is True else Path(tls) if tls else None
        self.tls: ClusterTLS | None = ClusterTLS(tls_dir.resolve()) if tls_dir is not None else None
        self._verify_clients = verify_clients
        self._acl = acl
        # Chosen here and handed to ACL.Bootstrap, so a bootstrap retried after a lost answer
        # can still tell that its own secret is the cluster's management token.
        self.management_token: str | None = str(uuid.uuid4()) if acl else None

    # --- lifecycle --------------------------------------------------------------------

    def start(self) -> None:
        """Launch every agent; does not wait for them (see wait_for_leader)."""
        if self._started:
            raise ClusterError("cluster already started")
        self._started = True
        self.base_dir.mkdir(parents=True, exist_ok=True)
        # Servers with peers refuse to start unkeyed; a test that brings its own key says so.
        if self._n_servers > 1 and "-raft-key-file" not in self._extra_args:
            self._raft_key_file = write_raft_key(self.base_dir / RAFT_KEY_FILE)
        if self.tls is not None:
            self.tls = make_cluster_tls(self.tls.dir)
            self._channels.tls = self.tls.cli_files.load()
            self._extra_args = (
                *self.tls.agent_args("server", verify_clients=self._verify_clients),
                *self._extra_args,
            )
            self._client_extra_args = (*self.tls.agent_args("client"), *self._client_extra_args)
        if self._acl and "-acl-enabled" not in self._extra_args:
            self._extra_args = (*self._extra_args, "-acl-enabled")
        specs = make_server_specs(self._n_servers)
        grpc_addresses = [spec.grpc_address for spec in specs]
        for i, spec in enumerate(specs):
            data_dir = self.base_dir / spec.name
            argv = server_argv(
                spec,
                data_dir,
                peer_addresses(specs, i),
                self._extra_args,
                self._agent_module,
                raft_key_file=self._raft_key_file,
            )
            self._servers.append(
                _Member(spec.name, argv, data_dir, self.base_dir / f"{spec.name}.log", spec, spec.http_port)
            )
        client_http_ports = pick_free_ports(self._n_clients, exclude=self._assigned_ports())
        for j in range(self._n_clients):
            name = f"c{j + 1}"
            data_dir = self.base_dir / name
            http_port = client_http_ports[j]
            argv = client_argv(
                name,
                data_dir,
                grpc_addresses,
                self._client_extra_args,
                self._agent_module,
                http_port=http_port,
            )
            self._clients.append(
                _Member(name, argv, data_dir, self.base_dir / f"{name}.log", http_port=http_port)
            )
        try:
            for member in self._members():
                self._spawn(member)
            if self._acl:
                self._bootstrap_acl()
        except BaseException:
            self.stop_all()
            raise

    def _bootstrap_acl(self, timeout: float = 60.0) -> None:
        """ACL.Bootstrap with ``management_token`` as the secret, once a leader answers."""
        tls = self.tls.cli_files if self.tls is not None else None
        # The servers were only just spawned: wait for them to listen, not just 2 s.
        with DroverClient(
            self.grpc_addresses, retry_deadline=timeout, connect_timeout=timeout, tls=tls
        ) as client:
            try:
                client.acl_bootstrap(bootstrap_secret=self.management_token or "")
            except DroverError as exc:
                if exc.code != grpc.StatusCode.FAILED_PRECONDITION:
                    raise ClusterError(f"ACL bootstrap failed: {exc}\n{self.logs_tail()}") from exc
                # Done already: by our own earlier attempt if our secret works, else not ours.
                with DroverClient(
                    self.grpc_addresses, retry_deadline=timeout, tls=tls, token=self.management_token
                ) as check:
                    check.acl_token_self()

    def __enter__(self) -> LocalCluster:
        if not self._started:
            self.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop_all()

    def kill(self, i: int, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` to server ``i`` (SIGSTOP/SIGCONT pause and resume it).

        After SIGKILL this returns once the process is reaped, so ``is_alive`` is False.
        """
        self._kill(self._server(i), sig)

    def pause(self, i: int) -> None:
        """SIGSTOP server ``i``; returns once it is stopped. ``stop`` still ends it cleanly."""
        self.kill(i, signal.SIGSTOP)

    def resume(self, i: int) -> None:
        self.kill(i, signal.SIGCONT)

    def stop(self, i: int, timeout: float = STOP_TIMEOUT) -> int | None:
        """SIGTERM server ``i``, SIGKILL it after ``timeout``; its exit status."""
        return self._stop_one(self._server(i), timeout)

    def restart(self, i: int) -> None:
        """Start server ``i`` again: same name, ports and data dir. It must be down."""
        member = self._down(self._server(i))
        self._channels.drop(i)
        self._spawn(member)

    def stop_all(self, timeout: float = STOP_TIMEOUT) -> None:
        """Stop every agent (all at once, one shared deadline), then the clients' raw_exec
        tasks, which a stopped agent leaves running for its successor: nothing the cluster
        started outlives it. Safe to call again."""
        try:
            self._stop_members(self._members(), timeout)
        finally:
            try:
                kill_processes_working_under(member.data_dir for member in self._clients)
            finally:
                self._channels.close_all()

    def is_alive(self, i: int) -> bool:
        """True while the process exists, paused or not."""
        return self._server(i).alive()

    def kill_client(self, j: int, sig: int = signal.SIGKILL) -> None:
        self._kill(self._client(j), sig)

    def stop_client(self, j: int, timeout: float = STOP_TIMEOUT) -> int | None:
        """SIGTERM client ``j``, SIGKILL it after ``timeout``; its exit status."""
        return self._stop_one(self._client(j), timeout)

    def restart_client(self, j: int) -> None:
        """Start client ``j`` again: same name, servers and data dir. It must be down."""
        self._spawn(self._down(self._client(j)))

    def client_alive(self, j: int) -> bool:
        return self._client(j).alive()

    def add_client(self, name: str, servers: Sequence[str], extra_args: Sequence[str] = ()) -> int:
        """Start one more client agent on a started cluster, talking to ``servers`` rather
        than to the servers' own addresses (fault-injecting proxies go in between), and
        return its index for the ``*_client`` methods. It runs ``drover.cli`` whatever the
        servers run, and is stopped with the rest by ``stop_all``."""
        if not self._started:
            raise ClusterError("cluster not started")
        if name in self.server_names or name in self.client_names:
            raise ClusterError(f"an agent named {name!r} already exists")
        data_dir = self.base_dir / name
        (http_port,) = pick_free_ports(1, exclude=self._assigned_ports())
        argv = client_argv(
            name, data_dir, servers, [*self._client_extra_args, *extra_args], http_port=http_port
        )
        member = _Member(name, argv, data_dir, self.base_dir / f"{name}.log", http_port=http_port)
        self._clients.append(member)
        self._spawn(member)
        return len(self._clients) - 1

    def add_server(self, name: str, extra_args: Sequence[str] = ()) -> int:
        """Start one more server on a started cluster, joining it through the servers'
        gRPC addresses (``-join``) with the cluster's key, TLS and ACL flags, and return its
        index for the server methods. Stopped with the rest by ``stop_all``."""
        if not self._started:
            raise ClusterError("cluster not started")
        if name in self.server_names or name in self.client_names:
            raise ClusterError(f"an agent named {name!r} already exists")
        grpc_port, raft_port, http_port = pick_free_ports(3, exclude=self._assigned_ports())
        spec = ServerSpec(name, grpc_port, raft_port, LOOPBACK, http_port=http_port)
        data_dir = self.base_dir / name
        join = ["-join", ",".join(self.grpc_addresses), *self._extra_args, *extra_args]
        argv = server_argv(spec, data_dir, (), join, self._agent_module, raft_key_file=self._raft_key_file)
        # Joining an ACL cluster takes a management token (Operator.RaftJoin), in the
        # environment as an operator would give it, never on the command line.
        env = {TOKEN_ENV: self.management_token} if self.management_token else {}
        member = _Member(name, argv, data_dir, self.base_dir / f"{name}.log", spec, http_port, env)
        self._servers.append(member)
        self._spawn(member)
        return len(self._servers) - 1

    def client_data_dir(self, j: int) -> Path:
        return self._client(j).data_dir

    # --- what there is ----------------------------------------------------------------

    @property
    def server_names(self) -> list[str]:
        return [m.name for m in self._servers]

    @property
    def client_names(self) -> list[str]:
        return [m.name for m in self._clients]

    @property
    def grpc_addresses(self) -> list[str]:
        return [self._spec(i).grpc_address for i in range(len(self._servers))]

    @property
    def raft_addresses(self) -> list[str]:
        return [self._spec(i).raft_address for i in range(len(self._servers))]

    def http_address(self, i: int) -> str:
        """Server ``i``'s HTTP port (metrics, leader, health), ``host:port``."""
        return self._spec(i).http_address

    def client_http_address(self, j: int) -> str:
        """Client ``j``'s HTTP port (metrics, health), ``host:port``."""
        return f"{LOOPBACK}:{self._client(j).http_port}"

    @property
    def raft_key_file(self) -> Path | None:
        """The key file every server was given, or None (one server, or the caller's own key)."""
        return self._raft_key_file

    def pid(self, i: int) -> int | None:
        """The pid of server ``i``'s latest process, even if it has exited since."""
        proc = self._server(i).proc
        return proc.pid if proc is not None else None

    def log(self, i: int) -> str:
        return _read_log(self._server(i).log_path)

    def client_log(self, j: int) -> str:
        return _read_log(self._client(j).log_path)

    def logs_tail(self, lines: int = 25) -> str:
        """The last ``lines`` of every agent's log, for failure messages."""
        parts = []
        for member in self._members():
            tail = _read_log(member.log_path).splitlines()[-lines:]
            state = "running" if member.alive() else f"exited {_returncode(member)}"
            parts.append(f"--- {member.log_path} ({state}) ---\n" + "\n".join(tail))
        return "\n".join(parts)

    def record(self) -> ClusterRecord:
        def rec(member: _Member) -> ProcessRecord:
            spec = member.spec
            return ProcessRecord(
                name=member.name,
                pid=member.proc.pid if member.proc else 0,
                argv=tuple(member.argv),
                data_dir=str(member.data_dir),
                log=str(member.log_path),
                grpc_address=spec.grpc_address if spec else "",
                raft_address=spec.raft_address if spec else "",
                grpc_port=spec.grpc_port if spec else 0,
                raft_port=spec.raft_port if spec else 0,
                http_address=f"{spec.host if spec else LOOPBACK}:{member.http_port}"
                if member.http_port
                else "",
            )

        return ClusterRecord(
            base_dir=str(self.base_dir),
            servers=tuple(rec(m) for m in self._servers),
            clients=tuple(rec(m) for m in self._clients),
            tls_dir=str(self.tls.dir) if self.tls is not None else "",
        )

    # --- asking the servers -----------------------------------------------------------

    def query_digest(self, i: int, timeout: float = RPC_TIMEOUT) -> api_pb2.StateDigestResponse | None:
        """Server ``i``'s own StateDigest answer, or None if it is down or does not answer."""
        if not self.is_alive(i):
            return None
        channel = self._channels.get(i, self._spec(i).grpc_address)
        metadata = (("x-drover-token", self.management_token),) if self.management_token else None
        try:
            return api_pb2_grpc.OperatorStub(channel).StateDigest(
                api_pb2.StateDigestRequest(), timeout=timeout, metadata=metadata
            )
        except grpc.RpcError:
            return None

    def digests(self) -> dict[str, tuple[str, int]]:
        """(digest, applied_index) of every live server that answers."""
        return {
            self._servers[i].name: (answer.digest, answer.applied_index)
            for i, answer in self._poll_live().items()
            if answer is not None
        }

    def wait_for_leader(self, timeout: float = 30.0) -> str:
        """Name of the leader, once every live server answers and exactly one leads."""
        last: dict[int, api_pb2.StateDigestResponse | None] = {}

        def check() -> str | None:
            self._raise_if_crashed()
            answers = self._poll_live()
            last.clear()
            last.update(answers)
            if not answers or any(a is None for a in answers.values()):
                return None
            leaders = [i for i, a in answers.items() if a is not None and a.leader]
            return self._servers[leaders[0]].name if len(leaders) == 1 else None

        return self._wait(check, timeout, "exactly one leader", last)

    def leader_index(self, timeout: float = 30.0) -> int:
        return self.server_names.index(self.wait_for_leader(timeout))

    def wait_converged(self, timeout: float = 30.0) -> tuple[str, int]:
        """Wait until every live server reports the same digest and applied index; those."""
        last: dict[int, api_pb2.StateDigestResponse | None] = {}

        def check() -> tuple[str, int] | None:
            self._raise_if_crashed()
            answers = self._poll_live()
            last.clear()
            last.update(answers)
            seen = {(a.digest, a.applied_index) if a is not None else None for a in answers.values()}
            if len(seen) != 1 or None in seen:
                return None
            (only,) = seen
            return only

        return self._wait(check, timeout, "all live servers to report one digest and applied index", last)

    # --- internals --------------------------------------------------------------------

    def _members(self) -> list[_Member]:
        return [*self._servers, *self._clients]

    def _server(self, i: int) -> _Member:
        if not self._started:
            raise ClusterError("cluster not started")
        return self._servers[i]

    def _client(self, j: int) -> _Member:
        if not self._started:
            raise ClusterError("cluster not started")
        return self._clients[j]

    def _assigned_ports(self) -> set[int]:
        """Every port this cluster has handed to an agent, bound yet or not."""
        ports = {member.http_port for member in self._members()}
        for member in self._servers:
            if member.spec is not None:
                ports |= {member.spec.grpc_port, member.spec.raft_port, member.spec.http_port}
        return ports - {0}

    def _spec(self, i: int) -> ServerSpec:
        spec = self._server(i).spec
        assert spec is not None
        return spec

    def _spawn(self, member: _Member) -> None:
        member.data_dir.mkdir(parents=True, exist_ok=True)
        with open(member.log_path, "ab") as log:
            _note_to(log, f"starting {shlex.join(member.argv)}")
            member.proc = subprocess.Popen(
                member.argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=REPO_ROOT,
                env={**self._env, **member.env},
                start_new_session=True,
            )
        member.signalled = False

    def _kill(self, member: _Member, sig: int) -> None:
        if not member.alive():
            return
        assert member.proc is not None
        _note(member, f"sending {signal.Signals(sig).name}")
        member.signalled = True
        proc = member.proc
        proc.send_signal(sig)
        if sig == signal.SIGKILL:
            proc.wait(timeout=STOP_TIMEOUT)
        elif sig == signal.SIGSTOP and _main_thread_state(proc.pid) is not None:
            # SIGSTOP takes effect asynchronously; a test that pauses the leader expects it
            # paused when this returns.
            wait_for(
                lambda: proc.poll() is not None or _main_thread_state(proc.pid) in ("T", "t", None),
                timeout=STOP_TIMEOUT,
                interval=0.005,
                message=f"{member.name} to stop",
            )

    def _stop_one(self, member: _Member, timeout: float) -> int | None:
        self._stop_members([member], timeout)
        return member.proc.returncode if member.proc else None

    @staticmethod
    def _down(member: _Member) -> _Member:
        """``member``, once sure it is not running: a second process on its data dir and
        ports would fight the first, so a restart of a live agent is refused."""
        if member.alive():
            raise ClusterError(f"{member.name} is still running; kill or stop it first")
        return member

    def _stop_members(self, members: Sequence[_Member], timeout: float) -> None:
        """SIGTERM them all, wait with one shared deadline, SIGKILL whoever is left.

        Whatever happens on the way (even a KeyboardInterrupt), none is left running.
        """
        live = [m for m in members if m.alive()]
        try:
            for member in live:
                assert member.proc is not None
                _note(member, "stopping (SIGTERM)")
                member.signalled = True
                # Our own child: until we reap it its pid cannot be reused.
                if member.proc.poll() is None:
                    _terminate(member.proc.pid)
            deadline = time.monotonic() + timeout
            for member in live:
                assert member.proc is not None
                try:
                    member.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    _note(
                        member,
                        f"still running {timeout:g}s after SIGTERM: SIGABRT (stacks follow), then SIGKILL",
                    )
                    _dump_stacks(member.proc)
        finally:
            for member in live:
                assert member.proc is not None
                if member.proc.poll() is None:
                    member.signalled = True
                    member.proc.kill()
                    member.proc.wait()

    def _poll_live(self) -> dict[int, api_pb2.StateDigestResponse | None]:
        return {i: self.query_digest(i) for i in range(len(self._servers)) if self.is_alive(i)}

    def _raise_if_crashed(self) -> None:
        for member in self._members():
            if member.proc is not None and not member.signalled and member.proc.poll() is not None:
                tail = "\n".join(_read_log(member.log_path).splitlines()[-40:])
                raise ClusterError(
                    f"{member.name} exited on its own with status {member.proc.returncode}; "
                    f"{member.log_path} ends:\n{tail}"
                )

    def _wait(
        self,
        check: Callable[[], T | None],
        timeout: float,
        what: str,
        last: Mapping[int, api_pb2.StateDigestResponse | None],
    ) -> T:
        try:
            result = wait_for(check, timeout, message=what)
        except TimeoutError as exc:
            raise ClusterError(f"{exc}\nlast answers:\n{self._describe(last)}\n{self.logs_tail()}") from exc
        assert result is not None
        return result

    def _describe(self, answers: Mapping[int, api_pb2.StateDigestResponse | None]) -> str:
        lines = []
        for i, member in enumerate(self._servers):
            answer = answers.get(i)
            if i not in answers:
                lines.append(f"  {member.name}: down")
            elif answer is None:
                lines.append(f"  {member.name}: no answer")
            else:
                lines.append(f"  {member.name}: {_describe_answer(answer)}")
        return "\n".join(lines)


def _describe_answer(answer: api_pb2.StateDigestResponse) -> str:
    role = "leader" if answer.leader else "follower"
    return (
        f"{role} term={answer.term} applied={answer.applied_index} "
        f"commit={answer.commit_index} digest={answer.digest[:16]}"
    )


def _read_log(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except FileNotFoundError:
        return ""


def _returncode(member: _Member) -> str:
    return str(member.proc.returncode) if member.proc is not None else "never started"


def _dump_stacks(proc: subprocess.Popen[bytes]) -> None:
    """SIGABRT ``proc`` and give it a moment: faulthandler (PYTHONFAULTHANDLER) writes every
    thread's stack to its log, which says what a stop that hangs is waiting on."""
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(signal.SIGABRT)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=STACK_DUMP_WAIT_S)


def _note_to(log: Any, text: str) -> None:
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S")
    log.write(f"--- {stamp} launcher: {text}\n".encode())
    log.flush()


def _note(member: _Member, text: str) -> None:
    """Mark launcher actions in the agent's log, so a chaos run's log reads as a story."""
    try:
        with open(member.log_path, "ab") as log:
            _note_to(log, text)
    except OSError:
        pass


# --- command line -------------------------------------------------------------------------


def _records(record: ClusterRecord) -> Iterator[ProcessRecord]:
    yield from record.servers
    yield from record.clients


def _cmd_start(args: argparse.Namespace) -> int:
    base = Path(args.dir).resolve()
    state_path = base / STATE_FILE
    if state_path.exists():
        running = [p.name for p in _records(ClusterRecord.load(state_path)) if _is_recorded_agent(p)]
        if running:
            print(
                f"a cluster is already running from {state_path} ({', '.join(running)}); stop it first",
                file=sys.stderr,
            )
            return 1
        state_path.unlink()
    # Each start is a fresh cluster: new ports would not match an old raft journal.
    for name in [f"s{i + 1}" for i in range(args.servers)] + [f"c{j + 1}" for j in range(args.clients)]:
        shutil.rmtree(base / name, ignore_errors=True)
        (base / f"{name}.log").unlink(missing_ok=True)
    cluster = LocalCluster(base, servers=args.servers, clients=args.clients, tls=args.tls)
    try:
        cluster.start()
        # Recorded before waiting, so an interrupted start can still be stopped.
        cluster.record().save(state_path)
        leader = cluster.wait_for_leader(args.timeout)
    except BaseException as exc:
        cluster.stop_all()
        state_path.unlink(missing_ok=True)
        if isinstance(exc, ClusterError):
            print(f"cluster did not come up: {exc}", file=sys.stderr)
            return 1
        raise
    record = cluster.record()
    for server in record.servers:
        mark = "  (leader)" if server.name == leader else ""
        print(
            f"{server.name}  grpc {server.grpc_address}  raft {server.raft_address}  "
            f"http {server.http_address}  pid {server.pid}  log {server.log}{mark}"
        )
    for client in record.clients:
        print(f"{client.name}  http {client.http_address}  pid {client.pid}  log {client.log}")
    _print_exports(record)
    print(f"stop it with: make cluster-stop  (or: python deploy/cluster.py stop --dir {args.dir})")
    return 0


def _recorded_cluster(args: argparse.Namespace, out: TextIO) -> Path | None:
    """The record ``start`` wrote in ``args.dir``, or None (said on ``out``) when there is
    none: each command decides whether nothing to act on is a failure."""
    state_path = Path(args.dir).resolve() / STATE_FILE
    if not state_path.exists():
        print(f"no cluster recorded in {state_path}", file=out)
        return None
    return state_path


def _cmd_stop(args: argparse.Namespace) -> int:
    state_path = _recorded_cluster(args, sys.stdout)
    if state_path is None:
        return 0  # nothing running: stopping it has succeeded
    for name, outcome in stop_recorded(state_path, args.timeout).items():
        detail = {
            "foreign": "pid now belongs to another program; left alone",
            "gone": "was not running",
        }.get(outcome, outcome)
        print(f"{name}: {detail}")
    return 0


def _cmd_status(args: argparse.Namespace) -> int:
    state_path = _recorded_cluster(args, sys.stdout)
    if state_path is None:
        return 1
    record = ClusterRecord.load(state_path)
    healthy = True
    for server in record.servers:
        if not _is_recorded_agent(server):
            healthy = False
            print(f"{server.name}  {server.grpc_address}  down")
            continue
        answer = _digest_asker(record)(server.grpc_address)
        healthy = healthy and answer is not None
        state = _describe_answer(answer) if answer is not None else "running, not answering"
        print(f"{server.name}  {server.grpc_address}  pid {server.pid}  {state}")
    for client in record.clients:
        state = f"pid {client.pid}" if _is_recorded_agent(client) else "down"
        print(f"{client.name}  {state}")
    _print_exports(record)
    return 0 if healthy else 1


def _print_exports(record: ClusterRecord) -> None:
    """What a shell needs to reach the cluster (``eval "$(... | grep ^export)"``)."""
    print(f"export DROVER_ADDR={','.join(record.grpc_addresses)}")
    if record.tls is not None:
        for name, value in record.tls.cli_env.items():
            print(f"export {name}={shlex.quote(value)}")


def _digest_asker(record: ClusterRecord) -> Callable[[str], api_pb2.StateDigestResponse | None]:
    tls = record.tls.cli_files.load() if record.tls is not None else None
    return lambda address: query_state_digest(address, tls=tls)


def recorded_leader(
    record: ClusterRecord,
    ask: Callable[[str], api_pb2.StateDigestResponse | None] = query_state_digest,
) -> ProcessRecord | None:
    """The one live recorded server that says it leads, or None if none or several do.

    Several can claim it for a moment (pysyncobj may briefly report two leaders); killing
    one of them then would not be the failover the caller asked for.
    """
    leaders = []
    for server in record.servers:
        if not _is_recorded_agent(server):
            continue
        answer = ask(server.grpc_address)
        if answer is not None and answer.leader:
            leaders.append(server)
    return leaders[0] if len(leaders) == 1 else None


def _cmd_kill_leader(args: argparse.Namespace) -> int:
    state_path = _recorded_cluster(args, sys.stderr)
    if state_path is None:
        return 1
    record = ClusterRecord.load(state_path)
    try:
        ask = _digest_asker(record)
        found = wait_for(lambda: recorded_leader(record, ask), args.timeout, message="exactly one leader")
    except TimeoutError as exc:
        print(str(exc), file=sys.stderr)
        return 1
    assert found is not None  # wait_for returns only a truthy answer
    leader = found
    # Checked again right before the signal, as ``stop`` does: a reused pid is never hit.
    if not _is_recorded_agent(leader):
        print(
            f"{leader.name} (pid {leader.pid}) is no longer the recorded agent; left alone", file=sys.stderr
        )
        return 1
    _send(leader.pid, signal.SIGKILL)
    try:
        wait_for(lambda: not _is_recorded_agent(leader), STOP_TIMEOUT, message=f"{leader.name} to exit")
    except TimeoutError as exc:
        print(str(exc), file=sys.stderr)
        return 1
    print(f"killed {leader.name} (pid {leader.pid}), the leader")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="cluster.py", description="A local multi-process drover cluster.")
    sub = parser.add_subparsers(dest="command", required=True)
    start = sub.add_parser("start", help="start servers (and clients) in the background")
    start.add_argument("--servers", type=int, default=3)
    start.add_argument("--clients", type=int, default=0)
    start.add_argument("--dir", default=".cluster", help="data dirs, logs and cluster.json")
    start.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for a leader")
    start.add_argument(
        "--tls", action="store_true", help="mTLS on every gRPC port, with a CA and certificates in <dir>/tls"
    )
    stop = sub.add_parser("stop", help="stop the agents recorded in <dir>/cluster.json")
    stop.add_argument("--dir", default=".cluster")
    stop.add_argument("--timeout", type=float, default=STOP_TIMEOUT, help="seconds before SIGKILL")
    status = sub.add_parser("status", help="show the recorded agents and what the servers say")
    status.add_argument("--dir", default=".cluster")
    kill_leader = sub.add_parser("kill-leader", help="SIGKILL the recorded server that leads now")
    kill_leader.add_argument("--dir", default=".cluster")
    kill_leader.add_argument("--timeout", type=float, default=10.0, help="seconds to wait for one leader")
    args = parser.parse_args(argv)
    handlers: dict[str, Callable[[argparse.Namespace], int]] = {
        "start": _cmd_start,
        "stop": _cmd_stop,
        "status": _cmd_status,
        "kill-leader": _cmd_kill_leader,
    }
    return handlers[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
