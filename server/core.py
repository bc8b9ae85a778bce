"""One drover server: state store, FSM, raft member, API endpoints, and their lifecycle.

``ServerCore`` owns every thread it starts (raft's tick thread, the member announcer, the
gRPC server) and stops them in ``stop``. Leader-only services are started and stopped from
``_on_leadership`` (the scheduling pipeline hangs off it once it lands).
"""

from __future__ import annotations

import dataclasses
import ipaddress
import os
import secrets
import socket
import threading
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Final

import grpc
import structlog

from drover.common.duration import parse_duration
from drover.common.grpc_options import MESSAGE_SIZE_OPTIONS
from drover.common.prometheus import agent_registry
from drover.common.tls import TLSError, TLSMaterial, open_channel
from drover.scheduler.structs import ServerMember
from drover.scheduler.validate import Limits
from drover.server.api.health import HealthReporter
from drover.server.clock import Clock, IdSource, SystemClock, UuidIds
from drover.server.codec import to_proto
from drover.server.config import ServerConfig
from drover.server.datadir import DataDirBusyError, DataDirLock
from drover.server.endpoints import Endpoints
from drover.server.events import EventBuffer
from drover.server.fsm import FSM, encode_entry
from drover.server.gc.runner import GarbageCollector, gc_settings
from drover.server.heartbeat import HeartbeatConfig, HeartbeatTimers
from drover.server.leader import LeaderServices
from drover.server.membership import JoinRefusedError, MembershipLoop, autopilot_settings, initial_peers
from drover.server.raft import RaftNode, RaftTuning
from drover.server.restore_followup import RestoreWatch
from drover.server.state_store import StateStore
from drover.server.telemetry.metrics import ServerCollector
from drover.v1 import raft_pb2

if TYPE_CHECKING:
    from drover.server.api.grpc_server import ApiServer

log = structlog.get_logger("drover.server")

ANNOUNCE_INTERVAL: Final = 0.5
# How long a default read waits for a majority to confirm this leader (one election timeout
# at least: a leader that hears from no majority for that long has likely been replaced).
READ_CONFIRM_TIMEOUT_S: Final = 1.0


class StartupError(Exception):
    """The server refuses to start; the message says why and what to do."""


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        try:
            return all(
                ipaddress.ip_address(info[4][0]).is_loopback for info in socket.getaddrinfo(host, None)
            )
        except OSError:
            return False


def read_raft_key(cfg: ServerConfig) -> str:
    """The cluster key, which every server with peers must share with them.

    pysyncobj's transport unpickles what a peer sends once it is unsealed with this key, so
    the key is what keeps anyone who reaches the raft port from running code here, on
    loopback as much as anywhere. A server without peers listens to no one: it gets a
    random key of its own (as ``-dev`` does), so nothing anyone sends is unsealed.
    """
    if cfg.raft_key_file:
        try:
            with open(cfg.raft_key_file, encoding="utf-8") as f:
                key = f.read().strip()
        except OSError as exc:
            raise StartupError(f"can not read -raft-key-file {cfg.raft_key_file}: {exc.strerror}") from exc
        if len(key) < 16:
            raise StartupError(
                f"-raft-key-file {cfg.raft_key_file}: key too short (need at least 16 characters)"
            )
        if os.stat(cfg.raft_key_file).st_mode & 0o007:
            log.warning("server.raft_key_file_world_readable", path=cfg.raft_key_file, hint="chmod 600")
        return key
    if cfg.peers or cfg.join:
        raise StartupError(
            "refusing to start: this server has -peers or -join but no -raft-key-file, and pysyncobj's transport "
            "unpickles what peers send, so anyone who reaches the raft port could run code here. Make one "
            "key for all servers (head -c 32 /dev/urandom | base64 > raft.key; chmod 600 raft.key) and "
            "pass -raft-key-file raft.key to each."
        )
    return secrets.token_urlsafe(32)


def read_server_tls(cfg: ServerConfig) -> TLSMaterial | None:
    """The gRPC port's certificate, checked before anything binds; None for plaintext.

    The same certificate is this server's identity when it forwards a write to the leader,
    which may verify clients."""
    files = cfg.tls
    if files is None:
        return None
    try:
        return files.load()
    except TLSError as exc:
        raise StartupError(str(exc)) from exc


def job_limits(cfg: ServerConfig) -> Limits:
    if cfg.job_max_group_count < 1:
        raise StartupError("-job-max-group-count: must be >= 1")
    return Limits(max_group_count=cfg.job_max_group_count)


def heartbeat_config(cfg: ServerConfig) -> HeartbeatConfig:
    def ns(text: str, key: str) -> int:
        try:
            return parse_duration(text)
        except ValueError as exc:
            raise StartupError(f"-{key.replace('_', '-')}: {exc}") from exc

    if cfg.max_heartbeats_per_second <= 0:
        raise StartupError("-max-heartbeats-per-second: must be > 0")
    return HeartbeatConfig(
        min_ttl_ns=ns(cfg.min_heartbeat_ttl, "min_heartbeat_ttl"),
        max_per_second=float(cfg.max_heartbeats_per_second),
        grace_ns=ns(cfg.heartbeat_grace, "heartbeat_grace"),
        failover_ttl_ns=ns(cfg.failover_heartbeat_ttl, "failover_heartbeat_ttl"),
    )


class ServerCore:
    def __init__(
        self,
        cfg: ServerConfig,
        *,
        clock: Clock | None = None,
        ids: IdSource | None = None,
        tuning: RaftTuning | None = None,
    ) -> None:
        self.cfg = cfg
        self.name = cfg.node_name
        self.clock = clock or SystemClock()
        self.ids = ids or UuidIds()
        password = read_raft_key(cfg)
        self.tls = read_server_tls(cfg)
        self._lock = DataDirLock(cfg.data_dir)
        try:
            self._lock.acquire()
        except DataDirBusyError as exc:
            raise StartupError(str(exc)) from exc
        self.store = StateStore()
        if cfg.event_buffer_size < 1:
            raise StartupError("event_buffer_size: must be >= 1")
        # The configured threshold (checked >= 1 at load) is the one in force, whatever
        # tuning a caller passed.
        tuning = dataclasses.replace(
            tuning or RaftTuning(), compaction_min_entries=cfg.raft_snapshot_threshold
        )
        # Before the raft node: it replays the log into the FSM, and so into the buffer.
        self.events = EventBuffer(cfg.event_buffer_size)
        self.fsm = FSM(self.store, events=self.events)
        self.restore_watch = RestoreWatch(lambda: self.fsm.restored_index, self.clock.now_ns)
        self.raft_address = f"{cfg.bind}:{cfg.raft_port}"
        self.grpc_address = f"{cfg.bind}:{cfg.grpc_port}"
        os.makedirs(cfg.data_dir, exist_ok=True)
        self._stop = threading.Event()
        # NOT_SERVING until the membership loop has seen a leader and a quorum.
        self.health = HealthReporter()
        raft_dir = os.path.join(cfg.data_dir, "raft")
        try:
            autopilot = autopilot_settings(cfg)
            # The saved peer set, or joining a running cluster (-join), or -peers.
            peers = initial_peers(cfg, self.raft_address, raft_dir, self.tls, self._stop)
        except (ValueError, JoinRefusedError) as exc:
            self._lock.release()
            raise StartupError(str(exc)) from exc
        self.raft = RaftNode(
            self.raft_address,
            peers,
            self.fsm,
            os.path.join(cfg.data_dir, "raft"),
            password=password,
            tuning=tuning,
            on_state_changed=self._on_leadership,
        )
        self.heartbeats = HeartbeatTimers(heartbeat_config(cfg))
        self.endpoints = Endpoints(
            self.raft, self.store, self.clock, self.ids, self.heartbeats, limits=job_limits(cfg)
        )
        # Garbage collection (server/gc/): the leader's thread runs it every interval, and
        # Operator.GarbageCollect (forwarded to the leader) runs it at once.
        self.gc = GarbageCollector(self.store, self.raft, self.clock, gc_settings(cfg))
        self.leader = LeaderServices(self, cfg.num_workers)
        # What Operator.Metrics and the HTTP port serve: this process's families and this
        # server's gauges (server/telemetry/); a dev agent adds its client's collector.
        self.metrics = agent_registry(ServerCollector(self))
        # Sections other parts of this agent add to Operator.AgentInfo, read at each call
        # (the -dev agent's embedded client adds "client").
        self.agent_info_sections: dict[str, Callable[[], Mapping[str, str]]] = {}
        self._membership = MembershipLoop(self, raft_dir, autopilot, self._stop)
        self._threads: list[threading.Thread] = []
        self._grpc: ApiServer | None = None
        self._channels: dict[str, grpc.Channel] = {}
        self._channels_lock = threading.Lock()

    # -- lifecycle ---------------------------------------------------------------------
    def start(self) -> None:
        from drover.server.api.grpc_server import create_server

        self._grpc, port = create_server(f"{self.cfg.bind}:{self.cfg.grpc_port}", self)
        self.grpc_address = f"{self.cfg.bind}:{port}"
        self._grpc.start()
        self.leader.start()
        if self.raft.is_leader():
            self.leader.on_leadership_change(True)
        announcer = threading.Thread(target=self._announce_loop, name="member-announcer", daemon=True)
        announcer.start()
        self._threads.append(announcer)
        self._threads.append(self._membership.start())
        log.info(
            "server.started",
            server=self.name,
            grpc=self.grpc_address,
            raft=self.raft_address,
            peers=self.raft.members(),
            tls=_tls_mode(self.tls, self.cfg),
        )
        if self.tls is None and not is_loopback(self.cfg.bind):
            log.warning("server.plaintext_grpc", bind=self.cfg.bind, hint="see -tls-ca-file")

    def stop(self, grace: float = 2.0) -> None:
        self._stop.set()
        self.store.close()
        self.events.close()
        self.leader.shutdown()
        if self._grpc is not None:
            self._grpc.stop(grace).wait(grace + 1)
        self.raft.close()
        for thread in self._threads:
            thread.join(timeout=5)
        with self._channels_lock:
            for channel in self._channels.values():
                channel.close()
            self._channels.clear()
        self._lock.release()
        log.info("server.stopped", server=self.name)

    # -- cluster membership ------------------------------------------------------------
    def _announce_loop(self) -> None:
        """Keep this server's (raft address -> gRPC address) row current in the state.

        Followers forward writes to the leader's gRPC address, found through this table.
        pysyncobj forwards the entry to the leader itself, so any server can announce.
        """
        while not self._stop.wait(ANNOUNCE_INTERVAL):
            member = self.store.snapshot().tables.servers.get(self.name)
            if (
                member is not None
                and member.raft_address == self.raft_address
                and member.grpc_address == self.grpc_address
            ):
                continue
            if self.raft.leader_address() is None:
                continue
            entry = raft_pb2.ServerMemberEntry()
            to_proto(
                ServerMember(name=self.name, raft_address=self.raft_address, grpc_address=self.grpc_address),
                entry.member,
            )
            self.raft.apply_entry(encode_entry(raft_pb2.ENTRY_TYPE_SERVER_MEMBER, entry), callback=_ignore)

    def leader_grpc_address(self) -> str | None:
        raft_leader = self.raft.leader_address()
        if raft_leader is None:
            return None
        for member in self.store.snapshot().servers():
            if member.raft_address == raft_leader:
                return member.grpc_address
        return None

    def confirm_leadership(self) -> None:
        """Before a default (non-stale) read is answered here: a majority confirms, after the
        read arrived, that this server still leads (server/raft/read_confirm.py), so a leader
        deposed without knowing it answers UNAVAILABLE instead of a stale state."""
        self.raft.confirm_leadership(READ_CONFIRM_TIMEOUT_S)

    async def confirm_leadership_async(self) -> None:
        """``confirm_leadership`` on the API's event loop, for reads under the aio bridge."""
        await self.raft.confirm_leadership_async(READ_CONFIRM_TIMEOUT_S)

    def channel_to(self, address: str) -> grpc.Channel:
        with self._channels_lock:
            channel = self._channels.get(address)
            if channel is None:
                channel = open_channel(address, self.tls, MESSAGE_SIZE_OPTIONS)
                self._channels[address] = channel
            return channel

    def _on_leadership(self, is_leader: bool) -> None:
        # Called on raft's tick thread: log and hand off, never block here.
        raft = getattr(self, "raft", None)
        log.info(
            "server.leadership_acquired" if is_leader else "server.leadership_lost",
            server=self.name,
            term=raft.term() if raft is not None else 0,
        )
        leader = getattr(self, "leader", None)
        if leader is not None:
            leader.on_leadership_change(is_leader)


def _tls_mode(tls: TLSMaterial | None, cfg: ServerConfig) -> str:
    if tls is None:
        return "off"
    return "mtls" if cfg.tls_verify_https_client else "tls"


def _ignore(_result: object, _error: int) -> None:
    return None
