"""Servers joining and leaving a running cluster, and the loop that keeps a server honest.

Theory of operation.

*Joining.* A server started with ``-join ADDR[,ADDR]`` (gRPC addresses of servers already
in) and no saved peer set calls ``Operator.RaftJoin`` with its name and raft address
before its raft member exists (``initial_peers``). The call is a write: a follower
forwards it, and the leader appends pysyncobj's membership entry and answers once it is
committed, with every voter's raft address. Only then does the joiner start raft, with
those as its peers: had it started first, it would call elections the others ignore
(pysyncobj drops connections from addresses outside its configuration) and learn nothing.
The joiner retries until it is in (no server up yet, no leader, a change in progress, an
answer lost); a refusal that a retry can not change (bad token, bad address, a name taken)
stops the start with the server's one line. The raft port's own security is unchanged:
the joiner needs the cluster's ``-raft-key-file``, or nothing it sends is unsealed; the
join call itself carries ``DROVER_TOKEN`` (a management token when ACLs are on) and goes
over TLS when the server has TLS, with the server's own certificate as its identity.

*Leaving.* ``remove_peer`` removes a voter by raft address or name; ``transfer_leadership``
hands leadership to a caught-up follower. Both run on the leader (forwarded writes).

*The loop* (``MembershipLoop``, one thread per server, every ``LOOP_INTERVAL_S``): save the
peer set whenever the configuration changed (server/raft/peers_file.py), set the health
service from raft's view (server/api/health.py), and on the leader run autopilot's
dead-server cleanup (server/autopilot.py).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Final

import grpc
import structlog

from drover.common.duration import parse_duration
from drover.common.grpc_options import MESSAGE_SIZE_OPTIONS
from drover.common.secrets import TOKEN_ENV, TOKEN_METADATA_KEY
from drover.common.tls import TLSMaterial, open_channel
from drover.server.autopilot import AutopilotSettings, dead_server_to_remove
from drover.server.errors import (
    ConflictError,
    MembershipBusyError,
    NotFoundError,
    RaftError,
    ValidationError,
)
from drover.server.raft.peers_file import PeerSet, load_peer_set, save_peer_set
from drover.v1 import api_pb2, api_pb2_grpc

if TYPE_CHECKING:
    from drover.server.config import ServerConfig
    from drover.server.core import ServerCore

__all__ = [
    "JoinRefusedError",
    "MembershipLoop",
    "autopilot_settings",
    "check_raft_address",
    "initial_peers",
    "join",
    "remove_peer",
    "transfer_leadership",
]

log = structlog.get_logger("drover.membership")

LOOP_INTERVAL_S: Final = 0.5
# How long the leader waits for a membership change to commit before answering
# DEADLINE_EXCEEDED (the change may still apply: a joiner's retry then finds itself in).
CHANGE_TIMEOUT_S: Final = 10.0
TRANSFER_TIMEOUT_S: Final = 10.0
AUTOPILOT_CHANGE_TIMEOUT_S: Final = 2.0
JOIN_CALL_TIMEOUT_S: Final = CHANGE_TIMEOUT_S + 5.0
JOIN_BACKOFF_MAX_S: Final = 5.0
# Codes a later join attempt may not get: the joiner retries every other one.
_JOIN_FINAL_CODES: Final = frozenset(
    {
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.PERMISSION_DENIED,
        grpc.StatusCode.UNAUTHENTICATED,
        grpc.StatusCode.FAILED_PRECONDITION,
        grpc.StatusCode.UNIMPLEMENTED,
    }
)


class JoinRefusedError(Exception):
    """The cluster refused this server's join in a way no retry changes; says why."""


def check_raft_address(field: str, text: str) -> str:
    """``text`` as a raft address (``host:port``), or ValidationError naming ``field``."""
    host, sep, port = text.rpartition(":")
    if not text:
        raise ValidationError(f"{field}: required")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValidationError(f"{field}: {text!r} is not host:port")
    return text


def autopilot_settings(cfg: ServerConfig) -> AutopilotSettings:
    """The autopilot flags, checked; ValueError naming the flag."""
    try:
        threshold_ns = parse_duration(cfg.autopilot_dead_server_threshold)
    except ValueError as exc:
        raise ValueError(f"-autopilot-dead-server-threshold: {exc}") from exc
    if threshold_ns <= 0:
        raise ValueError(
            f"-autopilot-dead-server-threshold: must be > 0, got {cfg.autopilot_dead_server_threshold!r}"
        )
    return AutopilotSettings(
        cleanup_dead_servers=cfg.autopilot_cleanup_dead_servers, dead_server_threshold_s=threshold_ns / 1e9
    )


# -- the joiner's side ---------------------------------------------------------------------


def initial_peers(
    cfg: ServerConfig,
    raft_address: str,
    raft_dir: str,
    tls: TLSMaterial | None,
    stop: threading.Event,
) -> list[str]:
    """The raft peers this server starts with: the saved set if there is one (it wins over
    ``-peers``, which it has outlived), else what joining through ``cfg.join`` answers,
    else ``-peers``. A set learned by joining is saved before raft starts."""
    saved = load_peer_set(raft_dir)
    if saved is not None:
        return [m for m in saved.members if m != raft_address]
    if not cfg.join:
        return list(cfg.peers)
    members = join_cluster(cfg.join, cfg.node_name, raft_address, tls, os.environ.get(TOKEN_ENV, ""), stop)
    os.makedirs(raft_dir, mode=0o700, exist_ok=True)
    save_peer_set(raft_dir, PeerSet(members=tuple(sorted(members)), configured_size=len(members)))
    return [m for m in members if m != raft_address]


def join_cluster(
    addresses: Sequence[str],
    name: str,
    raft_address: str,
    tls: TLSMaterial | None,
    token: str,
    stop: threading.Event,
    *,
    sleep: Callable[[float], bool] | None = None,
) -> list[str]:
    """Ask the servers at ``addresses`` (in turn) to add ``raft_address`` until one says it
    is in; every voter's raft address. JoinRefusedError on a final refusal."""
    wait = sleep or stop.wait
    metadata = ((TOKEN_METADATA_KEY, token),) if token else ()
    request = api_pb2.RaftJoinRequest(name=name, raft_address=raft_address)
    backoff = 0.5
    attempt = 0
    while True:
        address = addresses[attempt % len(addresses)]
        attempt += 1
        try:
            with open_channel(address, tls, MESSAGE_SIZE_OPTIONS) as channel:
                answer = api_pb2_grpc.OperatorStub(channel).RaftJoin(
                    request, timeout=JOIN_CALL_TIMEOUT_S, metadata=metadata
                )
        except grpc.RpcError as exc:
            code = exc.code()
            if code in _JOIN_FINAL_CODES:
                raise JoinRefusedError(f"-join {address}: {exc.details()}") from exc
            log.info("membership.join_retry", address=address, code=code.name, error=exc.details())
        else:
            members = list(answer.raft_addresses)
            if raft_address in members:
                log.info("membership.joined", via=address, members=members)
                return members
            log.warning("membership.join_not_in_answer", address=address, members=members)
        if wait(backoff):
            raise JoinRefusedError("stopped before joining")
        backoff = min(backoff * 2, JOIN_BACKOFF_MAX_S)


# -- the leader's side (forwarded writes) --------------------------------------------------


def _retry_busy(action: Callable[[], None], timeout: float) -> None:
    """Run ``action``, again while pysyncobj says the previous change is not committed."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            action()
            return
        except MembershipBusyError:
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.1)


def join(core: ServerCore, name: str, raft_address: str) -> tuple[int, list[str]]:
    """Add ``raft_address`` as a voter (nothing to do if it is one); the commit index and
    every voter's raft address after the change."""
    if not name:
        raise ValidationError("name: required")
    check_raft_address("raft_address", raft_address)
    raft = core.raft
    members = raft.members()
    if raft_address not in members:
        for member in core.store.snapshot().servers():
            if member.name == name and member.raft_address in members:
                raise ConflictError(
                    f"name: {name!r} is already the server at {member.raft_address}; remove it first "
                    f"(drover operator raft remove-peer -peer-id {name})"
                )
        log.info("membership.adding", name=name, raft_address=raft_address)
        _retry_busy(lambda: raft.add_member(raft_address, CHANGE_TIMEOUT_S), CHANGE_TIMEOUT_S)
    return raft.commit_index(), raft.members()


def resolve_peer(core: ServerCore, raft_address: str, name: str, *, what: str) -> str | None:
    """The raft address a request names (by address or server name), checked against the
    configuration; None when it names none (and may: transfer to any)."""
    if raft_address and name:
        raise ValidationError(f"peer_address: give {what} by address or by name (peer_id), not both")
    members = core.raft.members()
    if name:
        rows = [m for m in core.store.snapshot().servers() if m.name == name]
        if not rows:
            raise NotFoundError(f"peer_id: no server named {name!r}")
        raft_address = rows[0].raft_address
        if raft_address not in members:
            raise NotFoundError(f"peer_id: server {name!r} ({raft_address}) is not a raft peer")
        return raft_address
    if not raft_address:
        return None
    check_raft_address("peer_address", raft_address)
    if raft_address not in members:
        raise NotFoundError(f"peer_address: {raft_address} is not a raft peer ({', '.join(members)})")
    return raft_address


def remove_peer(core: ServerCore, raft_address: str, name: str) -> tuple[int, str]:
    """Remove a voter (never the leader: it would have to step down mid-change)."""
    address = resolve_peer(core, raft_address, name, what="the peer")
    if address is None:
        raise ValidationError("peer_address: required (or peer_id)")
    if address == core.raft.self_address():
        raise ConflictError(
            f"peer_address: {address} is the leader; move leadership first "
            "(drover operator raft transfer-leadership), then remove it"
        )
    log.info("membership.removing", raft_address=address)
    _retry_busy(lambda: core.raft.remove_member(address, CHANGE_TIMEOUT_S), CHANGE_TIMEOUT_S)
    return core.raft.commit_index(), address


def transfer_leadership(core: ServerCore, raft_address: str, name: str) -> tuple[str, str]:
    """Hand leadership on; the new leader's raft address and server name. A cluster of one
    voter is refused at once: there is no server to hand to, and waiting TRANSFER_TIMEOUT_S
    for one to appear would only delay the same answer."""
    if len(core.raft.members()) <= 1:
        raise ConflictError("peer_address: this server is the cluster's only voter; no other server can lead")
    target = resolve_peer(core, raft_address, name, what="the new leader")
    if target is not None and target == core.raft.self_address():
        raise ConflictError(f"peer_address: {target} leads already")
    leader = core.raft.transfer_leadership_to(target, TRANSFER_TIMEOUT_S)
    names = {m.raft_address: m.name for m in core.store.snapshot().servers()}
    return leader, names.get(leader, "")


# -- the loop ------------------------------------------------------------------------------


class MembershipLoop:
    """Saves the peer set, refreshes health, and runs autopilot on the leader."""

    def __init__(
        self, core: ServerCore, raft_dir: str, settings: AutopilotSettings, stop: threading.Event
    ) -> None:
        self._core = core
        self._stop = stop
        self._raft_dir = raft_dir
        self._settings = settings
        saved = load_peer_set(raft_dir)
        self._saved = saved
        self._configured_size = saved.configured_size if saved is not None else 0
        self._thread = threading.Thread(target=self._run, name="membership", daemon=True)

    def start(self) -> threading.Thread:
        self._thread.start()
        return self._thread

    def _run(self) -> None:
        stop = self._stop
        while True:
            try:
                self.step()
            except Exception:  # a bug here must not stop health from being reported
                log.exception("membership.loop_failed")
            if stop.wait(LOOP_INTERVAL_S):
                return

    def step(self) -> None:
        raft = self._core.raft
        members = tuple(raft.members())
        self._save_if_changed(members)
        self._core.health.refresh(raft)
        if raft.is_leader():
            self._autopilot(members)

    def _save_if_changed(self, members: tuple[str, ...]) -> None:
        size = max(self._configured_size, len(members))
        if self._saved is not None and self._saved.members == members and self._saved.configured_size == size:
            return
        peer_set = PeerSet(members=members, configured_size=size)
        save_peer_set(self._raft_dir, peer_set)
        self._saved, self._configured_size = peer_set, size
        log.info("membership.peers_saved", members=list(members), configured_size=size)

    def _autopilot(self, members: tuple[str, ...]) -> None:
        raft = self._core.raft
        ages = {a: s for a, s in raft.last_contact().items() if a in members}
        victim = dead_server_to_remove(
            self._settings,
            leader=raft.self_address(),
            members=members,
            silent_for_s=ages,
            configured_size=self._configured_size,
        )
        if victim is None:
            return
        log.warning("autopilot.removing_dead_server", raft_address=victim, silent_s=round(ages[victim], 1))
        try:
            # Short: health is refreshed on this thread too.
            raft.remove_member(victim, AUTOPILOT_CHANGE_TIMEOUT_S)
        except RaftError as exc:
            log.info("autopilot.remove_deferred", raft_address=victim, reason=str(exc))
