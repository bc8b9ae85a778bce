"""A typed client for drover's gRPC API (proto/drover/v1/api.proto): what the CLI uses, and
what a script uses (README, "Scripting drover from Python"; deploy/examples/sdk_example.py).

:class:`Client` has one method per RPC; each takes plain values or protobuf messages and
returns the response message (``drover.v1``). Errors come out as one type,
:class:`DroverError`, carrying the gRPC status code and the server's message
(``job.groups[0].count: must be >= 0``). Beside it: :func:`parse_job_file` and
:func:`parse_job` read a jobspec as ``drover job run`` does (:class:`JobFileError`);
:func:`blocking` and the ``watch_*`` methods turn a read into an iterator of each new
answer (Nomad's blocking queries); :meth:`Client.stream_events` follows the event stream.

Reaching a server: until one of its addresses has answered, a client waits at most
``connect_timeout`` (2 s) for one to: an address that refuses connections, whose name does
not resolve or that never completes a connection is most likely a wrong address, and
waiting the whole ``retry_deadline`` for it would only make a typo look like an outage. It
then fails with one ``UNAVAILABLE`` naming every address and what went wrong at each
(``no drover server at 127.0.0.1:1: connection refused``).

Retries: once a server has answered, ``UNAVAILABLE`` (no leader elected yet, a leader
change, a server restarting or down) is retried with exponential backoff and jitter until
``retry_deadline``, moving to the next address after each failure: that is an election or
a restart, which waiting fixes. Every other status is raised at once. ``DEADLINE_EXCEEDED``
is retried for reads only: a write that timed out may still have been applied, and
registering a job twice would create a second evaluation. ``RESOURCE_EXHAUSTED`` ending
"retry later" (a server's per-caller rate or parking limit, refused before any work) is
retried too, reads and writes alike. A failed TLS handshake (a server that does not speak
TLS, or whose certificate does not verify) is raised at once: waiting does not fix it.

TLS: ``Client(addresses, tls=TLSFiles(ca_file=..., cert_file=..., key_file=...))``
(``drover.common.tls``); the same ``host:port`` addresses, every channel over TLS.

ACLs: ``Client(addresses, token=SECRET)`` sends the token with every call; a call the
token does not allow fails with ``PERMISSION_DENIED`` (never retried).
"""

from __future__ import annotations

import os
import random
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Final, Protocol, TypedDict, TypeVar, Unpack

import grpc
from google.protobuf.message import Message

from drover.common.grpc_options import MESSAGE_SIZE_OPTIONS
from drover.common.secrets import TOKEN_METADATA_KEY
from drover.common.tls import TLSFiles, TLSMaterial, open_channel
from drover.v1 import api_pb2, api_pb2_grpc, raft_pb2, structs_pb2

__all__ = [
    "Client",
    "DroverClient",
    "DroverError",
    "JobFileError",
    "Query",
    "TLSFiles",
    "Watch",
    "blocking",
    "parse_job",
    "parse_job_file",
]

# A blocking query without wait_ns waits this long on the server (api.proto: QueryOptions).
DEFAULT_BLOCKING_WAIT_S: Final = 300.0
MAX_BLOCKING_WAIT_S: Final = 600.0
BACKOFF_BASE_S: Final = 0.05
BACKOFF_MAX_S: Final = 2.0
# An event stream silent this long (three missed heartbeats) is taken for a lost server.
STALL_TIMEOUT_S: Final = 35.0
# How long a client that has never reached any of its addresses waits for one to answer.
DEFAULT_CONNECT_TIMEOUT_S: Final = 2.0

_RETRY_WRITE: Final = frozenset({grpc.StatusCode.UNAVAILABLE})
_RETRY_READ: Final = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})

Req = TypeVar("Req")
Resp = TypeVar("Resp", bound=Message)


class QueryAnswer(Protocol):
    """What every read answers with: ``meta.index``, the index a blocking query waits past."""

    @property
    def meta(self) -> api_pb2.QueryMeta: ...


Answer = TypeVar("Answer", bound=QueryAnswer)


class Watch(TypedDict, total=False):
    """How a ``watch_*`` method follows its read: from ``index`` (0: the first answer comes
    at once), each query ``stale`` or not and waiting up to ``wait_ns`` on the server (0:
    its default, 5 minutes), which bounds how late ``timeout`` (seconds, None: never) ends
    the watch."""

    index: int
    stale: bool
    wait_ns: int
    timeout: float | None


class _ReadRequest(Protocol):
    """A request with ``QueryOptions`` (every read's)."""

    @property
    def options(self) -> api_pb2.QueryOptions: ...


ReadReq = TypeVar("ReadReq", bound=_ReadRequest)


class Query(TypedDict, total=False):
    """How a read is answered, the same keywords on every read (api.proto: QueryOptions).

    ``stale``: any server answers from its own state, which may lag the leader's, instead
    of the leader after confirming it still leads. ``min_index``: a blocking query, held
    until what it reads changes past this index (an answer's ``meta.index``) or its wait
    ends. ``wait_ns``: that wait (0: the server's default, DEFAULT_BLOCKING_WAIT_S; at most
    MAX_BLOCKING_WAIT_S)."""

    stale: bool
    min_index: int
    wait_ns: int


Streamed = TypeVar("Streamed", covariant=True)


class _ResponseStream(Protocol[Streamed]):
    """A server-streaming call as gRPC returns it: its messages, and a way to end it."""

    def __iter__(self) -> Iterator[Streamed]: ...

    def cancel(self) -> bool: ...


class DroverError(Exception):
    """A failed call: the gRPC status ``code`` and the server's ``message``."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message

    def __str__(self) -> str:
        return self.message

    def __repr__(self) -> str:
        return f"DroverError({self.code.name}, {self.message!r})"


@dataclass(frozen=True, slots=True)
class _Stubs:
    address: str
    channel: grpc.Channel
    jobs: api_pb2_grpc.JobsStub
    nodes: api_pb2_grpc.NodesStub
    evals: api_pb2_grpc.EvalsStub
    allocs: api_pb2_grpc.AllocsStub
    operator: api_pb2_grpc.OperatorStub
    acl: api_pb2_grpc.ACLStub
    deployments: api_pb2_grpc.DeploymentsStub
    events: api_pb2_grpc.EventsStub
    services: api_pb2_grpc.ServicesStub

    @classmethod
    def open(cls, address: str, tls: TLSMaterial | None) -> _Stubs:
        channel = open_channel(address, tls, MESSAGE_SIZE_OPTIONS)
        return cls(
            address=address,
            channel=channel,
            jobs=api_pb2_grpc.JobsStub(channel),
            nodes=api_pb2_grpc.NodesStub(channel),
            evals=api_pb2_grpc.EvalsStub(channel),
            allocs=api_pb2_grpc.AllocsStub(channel),
            operator=api_pb2_grpc.OperatorStub(channel),
            acl=api_pb2_grpc.ACLStub(channel),
            deployments=api_pb2_grpc.DeploymentsStub(channel),
            events=api_pb2_grpc.EventsStub(channel),
            services=api_pb2_grpc.ServicesStub(channel),
        )


class _Reach:
    """Whether any of a client's addresses has answered yet and, until one has, how each
    address's connection is doing: gRPC reports every change of a channel's state to a
    subscription, so a client can wait for the first address to connect without sending
    a call that would hang on one that never does.

    An address is worth calling while none has answered when its channel is ``READY``, or
    when it has just failed to connect (``TRANSIENT_FAILURE``): a call then fails at once,
    nothing sent, with the transport's reason, which is what the error reports.
    """

    def __init__(self, stubs: Sequence[_Stubs], closed_hint: str) -> None:
        self._stubs = stubs
        self._closed_hint = closed_hint
        self.changed = threading.Condition()
        self.answered = False
        self._watching = False
        self._states: dict[str, grpc.ChannelConnectivity] = {}
        # Addresses called since their channel last entered TRANSIENT_FAILURE, and the
        # transport's last word on each.
        self._probed: set[str] = set()
        self._reasons: dict[str, str] = {}
        self._callbacks: list[tuple[grpc.Channel, Callable[[grpc.ChannelConnectivity], None]]] = []

    def watch(self) -> None:
        """Subscribe to every address's state (once), which also starts connecting."""
        with self.changed:
            if self._watching or self.answered:
                return
            self._watching = True
        for stubs in self._stubs:
            callback = self._on_change(stubs.address)
            self._callbacks.append((stubs.channel, callback))
            stubs.channel.subscribe(callback, try_to_connect=True)

    def stop_watching(self) -> None:
        """Drop the subscriptions (each holds a gRPC polling thread): after a first answer
        the retry loop needs no connection states."""
        with self.changed:
            callbacks, self._callbacks = self._callbacks, []
        for channel, callback in callbacks:
            channel.unsubscribe(callback)

    def _on_change(self, address: str) -> Callable[[grpc.ChannelConnectivity], None]:
        def record(state: grpc.ChannelConnectivity) -> None:
            with self.changed:
                self._states[address] = state
                if state is grpc.ChannelConnectivity.TRANSIENT_FAILURE:
                    self._probed.discard(address)
                self.changed.notify_all()

        return record

    def callable_now(self, first: int) -> _Stubs | None:
        """An address to call now (see the class docstring), starting at index ``first``;
        None while every address is still connecting. Call with ``changed`` held."""
        order = [*self._stubs[first:], *self._stubs[:first]]
        for stubs in order:
            if self._states.get(stubs.address) is grpc.ChannelConnectivity.READY:
                return stubs
        for stubs in order:
            failed = self._states.get(stubs.address) is grpc.ChannelConnectivity.TRANSIENT_FAILURE
            if failed and stubs.address not in self._probed:
                self._probed.add(stubs.address)
                return stubs
        return None

    def is_transport_failure(self, stubs: _Stubs, err: DroverError) -> bool:
        """Whether ``err`` came from failing to connect to ``stubs`` (recorded as its reason)
        rather than from a server: a server's own UNAVAILABLE ("no cluster leader yet", or
        a follower passing on its failure to reach the leader) arrives over a connection
        that was READY."""
        with self.changed:
            connected = self._states.get(stubs.address) is grpc.ChannelConnectivity.READY
            if err.code != grpc.StatusCode.UNAVAILABLE or connected or not _looks_like_transport(err):
                return False
            self._reasons[stubs.address] = _transport_reason(err.message, self._closed_hint)
            return True

    def every_address_failed(self) -> bool:
        """Whether a call to each address has failed to connect (each has a reason)."""
        with self.changed:
            return all(stubs.address in self._reasons for stubs in self._stubs)

    def nobody_answered(self, waited_s: float) -> DroverError:
        """The one error for a client none of whose addresses answered: each address with
        what went wrong there, addresses with the same reason together."""
        by_reason: dict[str, list[str]] = {}
        with self.changed:
            for stubs in self._stubs:
                reason = self._reasons.get(stubs.address, f"no answer in {waited_s:g}s")
                by_reason.setdefault(reason, []).append(stubs.address)
        parts = [f"{', '.join(addresses)}: {reason}" for reason, addresses in by_reason.items()]
        return DroverError(grpc.StatusCode.UNAVAILABLE, f"no drover server at {'; '.join(parts)}")


def parse_addresses(addresses: str | Sequence[str]) -> tuple[str, ...]:
    """``"a:1,b:2"`` or ``["a:1", "b:2"]`` -> ``("a:1", "b:2")``; empty parts dropped."""
    parts = addresses.split(",") if isinstance(addresses, str) else list(addresses)
    out = tuple(part.strip() for part in parts if part.strip())
    if not out:
        raise ValueError("no server address given")
    return out


class JobFileError(ValueError):
    """A job that cannot be read or parsed, or (with ``validate``) that breaks a rule. The
    message is one line and names the place (``web.hcl:3,5: ...``); ``errors`` lists every
    rule broken (``job.groups[0].count: must be >= 0``), none for a parse error;
    ``problems`` lists each problem the parser found, alone and with its line (``web.hcl:12:
    job "web": unknown key "x"``), so a tool can show them one per line; none when the
    file or its variables could not be read at all, or for a rule broken."""

    def __init__(self, message: str, errors: Sequence[str] = (), *, problems: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.errors = tuple(errors)
        self.problems = tuple(problems)


def parse_job(
    text: str,
    *,
    filename: str = "",
    validate: bool = True,
    variables: Mapping[str, str] | None = None,
    var_files: Sequence[str | os.PathLike[str]] = (),
    environ: Mapping[str, str] | None = None,
    base_dir: str = "",
) -> structs_pb2.Job:
    """The job an HCL or JSON jobspec describes, as :meth:`Client.register_job` takes it:
    the reading ``drover job run`` does, so a script and the CLI send the same job.

    ``validate``: check it against the rules the servers apply, so every mistake is found
    at once, before any call (all of them in one :class:`JobFileError`). ``filename``
    starts each message. The parser is drover's own (``drover.server.jobspec``), imported
    on the first call, so importing the SDK does not load it.

    ``variables``, ``var_files`` and ``environ`` fill the file's ``variable`` blocks as
    ``-var NAME=VALUE``, ``-var-file`` and ``NOMAD_VAR_NAME`` do (nothing is read from
    ``os.environ`` unless passed); ``base_dir`` is where ``file()`` reads from.
    """
    try:
        from drover.server.jobspec import (  # type: ignore[import-not-found, unused-ignore]
            JobspecError,
            parse_jobspec,
        )
    except ModuleNotFoundError as exc:
        if exc.name != "drover.server.jobspec":
            raise
        raise JobFileError("cannot read job files: drover.server.jobspec is not available") from exc
    from drover.scheduler.validate import ValidationError, canonicalize_job, validate_job
    from drover.server.codec import to_proto
    from drover.server.jobspec_eval import (  # type: ignore[import-not-found, unused-ignore]
        EvalError,
        VariableInputs,
    )

    try:
        inputs = VariableInputs.from_args(
            [f"{name}={value}" for name, value in (variables or {}).items()],
            [os.fspath(path) for path in var_files],
            environ,
            base_dir,
        )
    except EvalError as exc:
        raise JobFileError(str(exc)) from exc
    except (OSError, UnicodeError) as exc:
        raise JobFileError(f"{getattr(exc, 'filename', '')}: cannot read the variables file: {exc}") from exc
    try:
        job = parse_jobspec(text, filename=filename, variables=inputs)
    except JobspecError as exc:
        listed = getattr(exc, "all_errors", getattr(exc, "errors", (str(exc),)))
        raise JobFileError(str(exc), problems=listed) from exc
    if validate:
        try:
            validate_job(canonicalize_job(job))
        except ValidationError as exc:
            errors = [str(error) for error in exc.errors]
            raise JobFileError("; ".join(errors), errors) from exc
    # The servers canonicalize too: the job goes as written.
    return to_proto(job, structs_pb2.Job())


def parse_job_file(
    path: str | os.PathLike[str],
    *,
    validate: bool = True,
    variables: Mapping[str, str] | None = None,
    var_files: Sequence[str | os.PathLike[str]] = (),
    environ: Mapping[str, str] | None = None,
) -> structs_pb2.Job:
    """:func:`parse_job` of a file (named in every message; ``file()`` reads beside it); a
    file that cannot be opened raises the ``OSError``, one that is not UTF-8 a
    :class:`JobFileError`."""
    name = os.fspath(path)
    with open(name, "rb") as fh:
        raw = fh.read()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise JobFileError(
            f"{name}: not valid UTF-8 text (byte 0x{raw[exc.start]:02x} at offset {exc.start})"
        ) from exc
    return parse_job(
        text,
        filename=name,
        validate=validate,
        variables=variables,
        var_files=var_files,
        environ=environ,
        base_dir=os.path.dirname(os.path.abspath(name)),
    )


def blocking(
    query: Callable[[int], Answer], *, index: int = 0, timeout: float | None = None
) -> Iterator[Answer]:
    """Each new answer of a blocking query, for as long as the caller iterates.

    ``query(min_index)`` is one read (``lambda i: client.job_summary("web", min_index=i)``):
    the server holds it until what it reads changes past ``min_index``, or its wait ends.
    Each answer whose ``meta.index`` differs from the last is yielded and the next query
    waits past it; an answer at the same index (the wait ended, nothing changed) is not.
    ``index`` 0 yields the current answer first; an index from an earlier answer resumes.
    An index that went backwards (a snapshot restored, a server that knows less) is yielded
    and waited past, as Nomad advises, rather than waiting for an index that may not come.
    ``timeout``: the iteration ends once this many seconds have passed, checked each time
    a query returns (so at most one query's wait later).
    """
    shown: int | None = index or None
    min_index = index
    end = None if timeout is None else time.monotonic() + timeout
    while end is None or time.monotonic() < end:
        answer = query(min_index)
        seen = answer.meta.index
        if seen != shown:
            yield answer
            shown = seen
        # 0 would ask for an answer at once, again and again: wait past 1 at least.
        min_index = max(seen, 1)


class Client:
    """Calls drover servers at ``addresses`` ("host:port", a list or a comma-separated string).

    ``timeout`` bounds one attempt (a blocking query gets its wait on top); ``retry_deadline``
    bounds the whole call including retries; ``connect_timeout`` bounds the wait for a first
    answer from any address (see the module docstring: raise it for a program that starts
    before its servers do). ``tls``: TLS to every address (see the module
    docstring). ``token``: the ACL token secret sent with every call (metadata
    ``x-drover-token``), for servers with ACLs on. Safe to share between threads.
    """

    def __init__(
        self,
        addresses: str | Sequence[str],
        *,
        timeout: float = 10.0,
        retry_deadline: float = 30.0,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT_S,
        tls: TLSFiles | None = None,
        token: str | None = None,
    ) -> None:
        self.addresses = parse_addresses(addresses)
        self.timeout = timeout
        self.retry_deadline = retry_deadline
        self.connect_timeout = connect_timeout
        self._metadata: tuple[tuple[str, str], ...] = ((TOKEN_METADATA_KEY, token),) if token else ()
        # Read once, here: a missing or mismatched file is a TLSError (a ValueError) now.
        tls_material = tls.load() if tls is not None else None
        self._stubs = [_Stubs.open(addr, tls_material) for addr in self.addresses]
        self._closed_hint = _CLOSED_HINT_TLS if tls is not None else _CLOSED_HINT_PLAINTEXT
        self._reach = _Reach(self._stubs, self._closed_hint)
        self._lock = threading.Lock()
        self._current = 0
        self._rng = random.Random()
        self._closed = False

    # -- lifecycle ----------------------------------------------------------------------

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._reach.stop_watching()
        with self._reach.changed:
            self._reach.changed.notify_all()  # a call waiting for a first answer gives up
        for stubs in self._stubs:
            stubs.channel.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    # -- Jobs ---------------------------------------------------------------------------

    def register_job(
        self, job: structs_pb2.Job, *, enforce_index: bool = False, job_modify_index: int = 0
    ) -> api_pb2.JobRegisterResponse:
        req = api_pb2.JobRegisterRequest(
            job=job, enforce_index=enforce_index, job_modify_index=job_modify_index
        )
        return self._call(lambda s: s.jobs.Register, req, write=True)

    def deregister_job(
        self, job_id: str, *, namespace: str = "", purge: bool = False
    ) -> api_pb2.JobDeregisterResponse:
        req = api_pb2.JobDeregisterRequest(job_id=job_id, namespace=namespace, purge=purge)
        return self._call(lambda s: s.jobs.Deregister, req, write=True)

    def get_job(self, job_id: str, *, namespace: str = "", **query: Unpack[Query]) -> api_pb2.JobGetResponse:
        req = api_pb2.JobGetRequest(job_id=job_id, namespace=namespace)
        return self._read(lambda s: s.jobs.Get, req, query)

    def list_jobs(
        self,
        *,
        prefix: str = "",
        namespace: str = "",
        **query: Unpack[Query],
    ) -> api_pb2.JobListResponse:
        req = api_pb2.JobListRequest(namespace=namespace, prefix=prefix)
        return self._read(lambda s: s.jobs.List, req, query)

    def job_versions(
        self, job_id: str, *, namespace: str = "", **query: Unpack[Query]
    ) -> api_pb2.JobVersionsResponse:
        req = api_pb2.JobVersionsRequest(job_id=job_id, namespace=namespace)
        return self._read(lambda s: s.jobs.Versions, req, query)

    def job_summary(
        self, job_id: str, *, namespace: str = "", **query: Unpack[Query]
    ) -> api_pb2.JobSummaryResponse:
        req = api_pb2.JobSummaryRequest(job_id=job_id, namespace=namespace)
        return self._read(lambda s: s.jobs.Summary, req, query)

    # Watches: each is :func:`blocking` over one read (``Watch`` says how).

    def watch_job(
        self, job_id: str, *, namespace: str = "", **watch: Unpack[Watch]
    ) -> Iterator[api_pb2.JobGetResponse]:
        """The job, then again each time it changes."""
        return _watch(lambda query: self.get_job(job_id, namespace=namespace, **query), watch)

    def watch_job_summary(
        self, job_id: str, *, namespace: str = "", **watch: Unpack[Watch]
    ) -> Iterator[api_pb2.JobSummaryResponse]:
        """The job's summary (allocs per group and client status), then again each time it
        changes: how a script waits for ``running`` to reach a count."""
        return _watch(lambda query: self.job_summary(job_id, namespace=namespace, **query), watch)

    def watch_allocs(
        self, *, job_id: str = "", node_id: str = "", namespace: str = "", **watch: Unpack[Watch]
    ) -> Iterator[api_pb2.AllocListResponse]:
        """The allocations (of one job or node), then again each time any changes."""
        return _watch(
            lambda query: self.list_allocs(job_id=job_id, node_id=node_id, namespace=namespace, **query),
            watch,
        )

    def dispatch_job(
        self,
        job_id: str,
        *,
        namespace: str = "",
        meta: dict[str, str] | None = None,
        payload: bytes = b"",
        idempotency_token: str = "",
    ) -> api_pb2.JobDispatchResponse:
        """Run a parameterized job: a new child job with ``meta`` and ``payload``.

        Without ``idempotency_token`` one is made for this call, so that retrying it after
        a lost answer (a leader change before the reply) cannot dispatch a second child;
        pass your own to make separate calls idempotent too."""
        req = api_pb2.JobDispatchRequest(
            job_id=job_id,
            namespace=namespace,
            meta=meta or {},
            payload=payload,
            idempotency_token=idempotency_token or f"sdk-{uuid.uuid4()}",
        )
        return self._call(lambda s: s.jobs.Dispatch, req, write=True)

    def periodic_force(self, job_id: str, *, namespace: str = "") -> api_pb2.JobPeriodicForceResponse:
        """Launch a periodic job's child now, outside its schedule."""
        req = api_pb2.JobPeriodicForceRequest(job_id=job_id, namespace=namespace)
        return self._call(lambda s: s.jobs.PeriodicForce, req, write=True)

    def plan_job(self, job: structs_pb2.Job) -> api_pb2.JobPlanResponse:
        """Dry run of ``register_job(job)``: the scheduler's per-group bucket counts against a
        private copy of the state. Writes nothing, so it is retried like a read (also on
        ``DEADLINE_EXCEEDED``). Always answered by the leader (the request has no ``stale``)."""
        req = api_pb2.JobPlanRequest(job=job)
        return self._call(lambda s: s.jobs.Plan, req)

    def revert_job(
        self, job_id: str, job_version: int, *, namespace: str = "", prior_version: int | None = None
    ) -> api_pb2.JobRevertResponse:
        """Register version ``job_version``'s spec again as a new version (stability cleared).

        ``prior_version``: refuse unless the job's current version is this one, so two
        operators reverting at once cannot undo each other's change unseen."""
        req = api_pb2.JobRevertRequest(
            job_id=job_id,
            namespace=namespace,
            job_version=job_version,
            enforce_prior_version=prior_version is not None,
            prior_version=prior_version or 0,
        )
        return self._call(lambda s: s.jobs.Revert, req, write=True)

    def scale_job(
        self, job_id: str, group: str, count: int, *, namespace: str = "", message: str = ""
    ) -> api_pb2.JobScaleResponse:
        """Set one group's count, as a new job version. Refused (FAILED_PRECONDITION) while
        the job's latest deployment is active, as Nomad refuses it."""
        req = api_pb2.JobScaleRequest(
            job_id=job_id, namespace=namespace, group=group, count=count, message=message
        )
        return self._call(lambda s: s.jobs.Scale, req, write=True)

    def validate_job(self, job: structs_pb2.Job) -> api_pb2.JobValidateResponse:
        """Every validation error of ``job`` at once (an empty list: valid). Writes nothing,
        so it is retried like a read."""
        req = api_pb2.JobValidateRequest(job=job)
        return self._call(lambda s: s.jobs.Validate, req)

    # -- Deployments --------------------------------------------------------------------

    def list_deployments(
        self,
        *,
        job_id: str = "",
        namespace: str = "",
        **query: Unpack[Query],
    ) -> api_pb2.DeploymentListResponse:
        """Every deployment, or only ``job_id``'s (newest first)."""
        req = api_pb2.DeploymentListRequest(job_id=job_id, namespace=namespace)
        return self._read(lambda s: s.deployments.List, req, query)

    def list_services(self, *, namespace: str = "", **query: Unpack[Query]) -> api_pb2.ServiceListResponse:
        """Every service registered by a running alloc of ``namespace`` ("*": all the token
        may read), with its tags merged; with ``min_index``, a blocking query."""
        req = api_pb2.ServiceListRequest(namespace=namespace)
        return self._read(lambda s: s.services.List, req, query)

    def get_service(
        self, name: str, *, namespace: str = "", **query: Unpack[Query]
    ) -> api_pb2.ServiceInfoResponse:
        """The registrations of service ``name`` (NOT_FOUND when it has none, unless
        ``min_index`` is set: a blocking query may wait for the first one)."""
        req = api_pb2.ServiceInfoRequest(namespace=namespace, service_name=name)
        return self._read(lambda s: s.services.Info, req, query)

    def get_deployment(self, deployment_id: str, **query: Unpack[Query]) -> api_pb2.DeploymentGetResponse:
        """One deployment; with ``min_index``, a blocking query that returns once the
        deployments table moves past it (how ``job run`` follows a deployment)."""
        req = api_pb2.DeploymentGetRequest(deployment_id=deployment_id)
        return self._read(lambda s: s.deployments.Get, req, query)

    def deployment_allocs(self, deployment_id: str, **query: Unpack[Query]) -> api_pb2.AllocListResponse:
        """The allocations placed for a deployment."""
        req = api_pb2.DeploymentGetRequest(deployment_id=deployment_id)
        return self._read(lambda s: s.deployments.Allocations, req, query)

    def promote_deployment(
        self, deployment_id: str, *, groups: Sequence[str] = ()
    ) -> api_pb2.DeploymentWriteResponse:
        """Promote the canaries of ``groups`` (none given: every group), so rolling goes on."""
        req = api_pb2.DeploymentPromoteRequest(deployment_id=deployment_id, groups=list(groups))
        return self._call(lambda s: s.deployments.Promote, req, write=True)

    def pause_deployment(self, deployment_id: str, *, pause: bool = True) -> api_pb2.DeploymentWriteResponse:
        """Pause a running deployment (no new placements); ``pause=False`` resumes it."""
        req = api_pb2.DeploymentPauseRequest(deployment_id=deployment_id, pause=pause)
        return self._call(lambda s: s.deployments.Pause, req, write=True)

    def fail_deployment(self, deployment_id: str) -> api_pb2.DeploymentWriteResponse:
        """Mark an active deployment failed; with ``auto_revert`` in any group the job rolls
        back to its latest stable version (``reverted``/``reverted_job_version`` say so)."""
        req = api_pb2.DeploymentFailRequest(deployment_id=deployment_id)
        return self._call(lambda s: s.deployments.Fail, req, write=True)

    def set_alloc_health(
        self, deployment_id: str, *, healthy: Sequence[str] = (), unhealthy: Sequence[str] = ()
    ) -> api_pb2.DeploymentWriteResponse:
        """Set allocations' deployment health by hand (``health_check = "manual"``, or to
        override the client). One unhealthy alloc fails the deployment."""
        req = api_pb2.DeploymentAllocHealthRequest(
            deployment_id=deployment_id, healthy_alloc_ids=list(healthy), unhealthy_alloc_ids=list(unhealthy)
        )
        return self._call(lambda s: s.deployments.SetAllocHealth, req, write=True)

    # -- Nodes --------------------------------------------------------------------------

    def register_node(self, node: structs_pb2.Node) -> api_pb2.NodeRegisterResponse:
        req = api_pb2.NodeRegisterRequest(node=node)
        return self._call(lambda s: s.nodes.Register, req, write=True)

    def update_node_status(
        self, node_id: str, status: str, *, secret_id: str = ""
    ) -> api_pb2.NodeUpdateStatusResponse:
        """A node's own status (its heartbeat): ``secret_id`` is the node's secret."""
        req = api_pb2.NodeUpdateStatusRequest(node_id=node_id, status=status, secret_id=secret_id)
        return self._call(lambda s: s.nodes.UpdateStatus, req, write=True)

    def list_nodes(self, *, prefix: str = "", **query: Unpack[Query]) -> api_pb2.NodeListResponse:
        req = api_pb2.NodeListRequest(prefix=prefix)
        return self._read(lambda s: s.nodes.List, req, query)

    def get_node(self, node_id: str, **query: Unpack[Query]) -> api_pb2.NodeGetResponse:
        req = api_pb2.NodeGetRequest(node_id=node_id)
        return self._read(lambda s: s.nodes.Get, req, query)

    def update_drain(
        self,
        node_id: str,
        drain_strategy: structs_pb2.DrainStrategy | None,
        *,
        mark_eligible: bool = False,
    ) -> api_pb2.NodeUpdateDrainResponse:
        """Start draining with ``drain_strategy``; ``None`` turns drain off."""
        req = api_pb2.NodeUpdateDrainRequest(
            node_id=node_id, drain_strategy=drain_strategy, mark_eligible=mark_eligible
        )
        return self._call(lambda s: s.nodes.UpdateDrain, req, write=True)

    def update_eligibility(self, node_id: str, eligibility: str) -> api_pb2.NodeUpdateEligibilityResponse:
        req = api_pb2.NodeUpdateEligibilityRequest(node_id=node_id, eligibility=eligibility)
        return self._call(lambda s: s.nodes.UpdateEligibility, req, write=True)

    def get_client_allocs(
        self, node_id: str, secret_id: str, **query: Unpack[Query]
    ) -> api_pb2.ClientAllocsResponse:
        """Blocking query: returns once the node's allocs move past ``min_index`` (or the wait ends)."""
        req = api_pb2.ClientAllocsRequest(node_id=node_id, secret_id=secret_id)
        return self._read(lambda s: s.nodes.GetClientAllocs, req, query)

    def watch_client_allocs(
        self, node_id: str, secret_id: str, *, stale: bool = False, min_index: int = 0
    ) -> Iterator[api_pb2.ClientAllocsResponse]:
        """A message each time the node's allocs change. Not retried: on an error (raised as
        :class:`DroverError`) the caller re-opens the watch from the last index it saw."""
        opts = _options(stale=stale, min_index=min_index)
        req = api_pb2.ClientAllocsRequest(node_id=node_id, secret_id=secret_id, options=opts)
        stream = self._pick().nodes.WatchClientAllocs(req, metadata=self._metadata)
        try:
            yield from stream
        except grpc.RpcError as exc:
            raise _translate(exc) from exc
        finally:
            stream.cancel()

    def update_allocs(
        self, allocs: Sequence[structs_pb2.Allocation], *, node_id: str = "", secret_id: str = ""
    ) -> api_pb2.AllocUpdateResponse:
        """A node's report on its own allocs, authenticated by the node's secret."""
        req = api_pb2.AllocUpdateRequest(allocs=allocs, node_id=node_id, secret_id=secret_id)
        return self._call(lambda s: s.nodes.UpdateAllocs, req, write=True)

    # -- Answered by the alloc's (or node's) client, through its tunnel ------------------

    def alloc_logs(
        self,
        alloc_id: str,
        task: str = "",
        *,
        stderr: bool = False,
        follow: bool = False,
        tail_lines: int = 0,
        tail_bytes: int = 0,
    ) -> Iterator[bytes]:
        """A task's stdout (or stderr) as its client reads it, chunk by chunk; with
        ``follow``, new output as the task writes it, until the task's alloc stops or the
        caller stops iterating. ``tail_lines``/``tail_bytes`` start that far from the end.
        A node that is not connected yet (UNAVAILABLE) is retried until the first chunk."""
        req = api_pb2.AllocLogsRequest(
            alloc_id=alloc_id,
            task=task,
            stderr=stderr,
            follow=follow,
            tail_lines=tail_lines,
            tail_bytes=tail_bytes,
        )
        for response in self._retrying_stream(
            lambda stubs: stubs.allocs.Logs(req, metadata=self._metadata),
            # Only before the first chunk: a log read again would repeat what was given.
            retry=lambda err, received: not received and err.code in _RETRY_READ,
            gave_up=lambda err, lost: err,
        ):
            yield response.data

    def restart_alloc(self, alloc_id: str, task: str = "") -> api_pb2.AllocControlResponse:
        """Restart one task (or every running task) in place; the restart policy's attempts
        are not used up."""
        req = api_pb2.AllocRestartRequest(alloc_id=alloc_id, task=task)
        return self._call(lambda s: s.allocs.Restart, req, write=True)

    def signal_alloc(
        self, alloc_id: str, task: str = "", *, signal: str = ""
    ) -> api_pb2.AllocControlResponse:
        """Send ``signal`` ("SIGHUP" or "HUP"; empty: SIGKILL) to one task or every running one."""
        req = api_pb2.AllocSignalRequest(alloc_id=alloc_id, task=task, signal=signal)
        return self._call(lambda s: s.allocs.Signal, req, write=True)

    def node_meta_read(self, node_id: str) -> api_pb2.NodeMetaResponse:
        """The node's static, dynamic and merged meta, as its client holds them."""
        return self._call(lambda s: s.nodes.MetaRead, api_pb2.NodeMetaReadRequest(node_id=node_id))

    def node_meta_apply(
        self, node_id: str, meta: dict[str, str] | None = None, *, unset: Sequence[str] = ()
    ) -> api_pb2.NodeMetaResponse:
        """Set and unset dynamic meta on the node; answered once the node registered with it."""
        req = api_pb2.NodeMetaApplyRequest(node_id=node_id, meta=meta or {}, unset=list(unset))
        return self._call(lambda s: s.nodes.MetaApply, req, write=True)

    # -- Evals --------------------------------------------------------------------------

    def list_evals(
        self,
        *,
        job_id: str = "",
        namespace: str = "",
        status: str = "",
        **query: Unpack[Query],
    ) -> api_pb2.EvalListResponse:
        """Evals in the order they were made: a job's (in ``namespace``), or every one; with
        ``status``, only those in it."""
        req = api_pb2.EvalListRequest(job_id=job_id, namespace=namespace, status=status)
        return self._read(lambda s: s.evals.List, req, query)

    def get_eval(self, eval_id: str, **query: Unpack[Query]) -> api_pb2.EvalGetResponse:
        """One eval (NOT_FOUND when no eval has that ID)."""
        req = api_pb2.EvalGetRequest(eval_id=eval_id)
        return self._read(lambda s: s.evals.Get, req, query)

    # -- Allocs -------------------------------------------------------------------------

    def list_allocs(
        self,
        *,
        job_id: str = "",
        node_id: str = "",
        namespace: str = "",
        **query: Unpack[Query],
    ) -> api_pb2.AllocListResponse:
        """Allocs by name: a job's (in ``namespace``) or a node's (not both: INVALID_ARGUMENT),
        or every one."""
        req = api_pb2.AllocListRequest(job_id=job_id, node_id=node_id, namespace=namespace)
        return self._read(lambda s: s.allocs.List, req, query)

    def get_alloc(self, alloc_id: str, **query: Unpack[Query]) -> api_pb2.AllocGetResponse:
        """One alloc (NOT_FOUND when no alloc has that ID)."""
        req = api_pb2.AllocGetRequest(alloc_id=alloc_id)
        return self._read(lambda s: s.allocs.Get, req, query)

    def stop_alloc(self, alloc_id: str) -> api_pb2.AllocStopResponse:
        """Stop one alloc and let the scheduler replace it; the response names the eval
        that does (follow it with ``get_eval``)."""
        req = api_pb2.AllocStopRequest(alloc_id=alloc_id)
        return self._call(lambda s: s.allocs.Stop, req, write=True)

    # -- Operator -----------------------------------------------------------------------

    def raft_peers(self, *, stale: bool = False) -> api_pb2.RaftPeersResponse:
        return self._read(lambda s: s.operator.RaftPeers, api_pb2.RaftPeersRequest(), {"stale": stale})

    def snapshot_save(self, *, stale: bool = False) -> api_pb2.SnapshotSaveResponse:
        return self._read(lambda s: s.operator.SnapshotSave, api_pb2.SnapshotSaveRequest(), {"stale": stale})

    def snapshot_restore(self, snapshot: raft_pb2.StateSnapshot) -> api_pb2.SnapshotRestoreResponse:
        req = api_pb2.SnapshotRestoreRequest(snapshot=snapshot)
        return self._call(lambda s: s.operator.SnapshotRestore, req, write=True)

    def reconcile_summaries(self) -> api_pb2.ReconcileSummariesResponse:
        """Recompute every job summary on the servers; the response lists what was corrected."""
        req = api_pb2.ReconcileSummariesRequest()
        return self._call(lambda s: s.operator.ReconcileSummaries, req, write=True)

    def garbage_collect(self) -> api_pb2.SystemGCResponse:
        """Collect everything eligible now (every GC threshold 0, as Nomad's system gc); the
        response counts what was deleted, by kind."""
        return self._call(lambda s: s.operator.GarbageCollect, api_pb2.SystemGCRequest(), write=True)

    def metrics(self) -> api_pb2.MetricsResponse:
        """Prometheus text metrics of whichever server answers (never forwarded)."""
        return self._call(lambda s: s.operator.Metrics, api_pb2.MetricsRequest())

    def state_digest(self) -> api_pb2.StateDigestResponse:
        """The digest of whichever server answers (never forwarded): to compare servers, use
        one single-address client per server."""
        return self._call(lambda s: s.operator.StateDigest, api_pb2.StateDigestRequest())

    def invariants(self) -> api_pb2.InvariantsResponse:
        """Invariant violations in the state of whichever server answers (never forwarded):
        to check every server, use one single-address client per server."""
        return self._call(lambda s: s.operator.Invariants, api_pb2.InvariantsRequest())

    def raft_remove_peer(self, *, raft_address: str = "", name: str = "") -> api_pb2.RaftRemovePeerResponse:
        """Remove a server from the raft configuration, by raft address or by name."""
        req = api_pb2.RaftRemovePeerRequest(raft_address=raft_address, name=name)
        return self._call(lambda s: s.operator.RaftRemovePeer, req, write=True)

    def raft_transfer_leadership(
        self, *, raft_address: str = "", name: str = ""
    ) -> api_pb2.RaftTransferLeadershipResponse:
        """Hand leadership to the server named (or the most caught-up one); answers once
        another server leads."""
        req = api_pb2.RaftTransferLeadershipRequest(raft_address=raft_address, name=name)
        return self._call(lambda s: s.operator.RaftTransferLeadership, req, write=True)

    def server_members(self) -> api_pb2.ServerMembersResponse:
        """Every server as the answering one sees it (alive if it answered a probe)."""
        return self._call(lambda s: s.operator.ServerMembers, api_pb2.ServerMembersRequest())

    def agent_info(self) -> api_pb2.AgentInfoResponse:
        """The answering agent's own facts (never forwarded)."""
        return self._call(lambda s: s.operator.AgentInfo, api_pb2.AgentInfoRequest())

    def scheduler_get_config(self, *, stale: bool = False) -> api_pb2.SchedulerConfigResponse:
        req = api_pb2.SchedulerGetConfigRequest()
        return self._read(lambda s: s.operator.SchedulerGetConfig, req, {"stale": stale})

    def scheduler_set_config(
        self, config: structs_pb2.SchedulerConfig, *, cas_index: int | None = None
    ) -> api_pb2.SchedulerSetConfigResponse:
        """Replace the scheduler config; with ``cas_index``, only if the stored config's
        modify_index still equals it (FAILED_PRECONDITION otherwise)."""
        req = api_pb2.SchedulerSetConfigRequest(
            config=config, use_cas=cas_index is not None, cas_index=cas_index or 0
        )
        return self._call(lambda s: s.operator.SchedulerSetConfig, req, write=True)

    # -- Events -------------------------------------------------------------------------

    def stream_events(
        self,
        topics: Sequence[str] = (),
        *,
        index: int = 0,
        namespace: str = "",
        stall_timeout: float = STALL_TIMEOUT_S,
    ) -> Iterator[api_pb2.Event]:
        """The cluster's events (``Events.Stream``), one at a time in index order, for as
        long as the caller iterates.

        ``topics``: ``"Job"``, ``"Allocation:web"`` (a topic, then ``:KEY`` for one object's
        ID or its job's), ``"*"``; none: every topic. ``index``: events from this raft index
        on; 0: from now. ``namespace``: "" is "default", "*" every one the token may read.

        Resuming: when its server goes away (killed, restarting, the stream ended) the
        iterator reconnects, to the next address in turn, asking for the events after the
        last index it has covered. A server sends every event of one index in one message,
        and says in each message which index it has covered, so the resumed stream neither
        repeats nor skips an event (one at or below that index is dropped all the same).
        Reconnecting is retried with backoff for ``retry_deadline``; ``OUT_OF_RANGE`` (the
        index is older than that server's buffer) is tried at every other address before
        it is raised. Other errors are raised at once. A server sends a heartbeat every 10 s
        of silence, so a stream silent for ``stall_timeout`` is taken for a server that is
        gone without a word (paused, cut off) and resumed elsewhere too.
        """
        filters = [_topic_filter(topic) for topic in topics]
        # The index every event up to which has been seen; -1 until a server says (index 0).
        covered = index - 1 if index > 0 else -1
        out_of_range = 0

        def open_stream(stubs: _Stubs) -> _ResponseStream[api_pb2.EventStreamResponse]:
            start = covered + 1 if covered >= 0 else 0
            request = api_pb2.EventStreamRequest(topics=filters, index=start, namespace=namespace)
            return stubs.events.Stream(request, metadata=self._metadata)

        def retry(err: DroverError, received: bool) -> bool:
            nonlocal out_of_range
            if err.code == grpc.StatusCode.OUT_OF_RANGE:
                out_of_range += 1
                return out_of_range < len(self._stubs)
            return err.code == grpc.StatusCode.UNAVAILABLE or _is_backoff(err)

        def gave_up(err: DroverError, lost_s: float) -> DroverError:
            return DroverError(
                err.code,
                f"event stream lost after index {covered}: no server resumed it in "
                f"{lost_s:g}s ({', '.join(self.addresses)}): {err.message}",
            )

        for response in self._retrying_stream(
            open_stream, retry=retry, gave_up=gave_up, stall_timeout=stall_timeout, resume_on_end=True
        ):
            out_of_range = 0
            for event in response.events:
                if event.index > covered:
                    yield event
            covered = max(covered, response.index)

    # -- ACL ----------------------------------------------------------------------------

    def acl_bootstrap(self, *, bootstrap_secret: str = "") -> api_pb2.ACLBootstrapResponse:
        """The first management token (its ``secret_id`` is in the answer, and only there).
        Works once per cluster; after that it fails with FAILED_PRECONDITION."""
        req = api_pb2.ACLBootstrapRequest(bootstrap_secret=bootstrap_secret)
        return self._call(lambda s: s.acl.Bootstrap, req, write=True)

    def acl_upsert_policy(
        self, name: str, rules: str, *, description: str = ""
    ) -> api_pb2.ACLPolicyUpsertResponse:
        req = api_pb2.ACLPolicyUpsertRequest(name=name, description=description, rules=rules)
        return self._call(lambda s: s.acl.UpsertPolicy, req, write=True)

    def acl_delete_policy(self, name: str) -> api_pb2.ACLPolicyDeleteResponse:
        req = api_pb2.ACLPolicyDeleteRequest(name=name)
        return self._call(lambda s: s.acl.DeletePolicy, req, write=True)

    def acl_list_policies(self, *, prefix: str = "", stale: bool = False) -> api_pb2.ACLPolicyListResponse:
        """The policies, by name, whose names start with ``prefix``; a client token sees
        only the ones it holds."""
        req = api_pb2.ACLPolicyListRequest(prefix=prefix)
        return self._read(lambda s: s.acl.ListPolicies, req, {"stale": stale})

    def acl_get_policy(self, name: str, *, stale: bool = False) -> api_pb2.ACLPolicyGetResponse:
        """One policy with its rules (NOT_FOUND when none has that name)."""
        req = api_pb2.ACLPolicyGetRequest(name=name)
        return self._read(lambda s: s.acl.GetPolicy, req, {"stale": stale})

    def acl_create_token(
        self, *, name: str = "", token_type: str = "client", policies: Sequence[str] = ()
    ) -> api_pb2.ACLTokenCreateResponse:
        """A new token; its ``secret_id`` is in the answer, and only there."""
        req = api_pb2.ACLTokenCreateRequest(name=name, type=token_type, policies=list(policies))
        return self._call(lambda s: s.acl.CreateToken, req, write=True)

    def acl_delete_token(self, accessor_id: str) -> api_pb2.ACLTokenDeleteResponse:
        req = api_pb2.ACLTokenDeleteRequest(accessor_id=accessor_id)
        return self._call(lambda s: s.acl.DeleteToken, req, write=True)

    def acl_list_tokens(self, *, prefix: str = "", stale: bool = False) -> api_pb2.ACLTokenListResponse:
        """The tokens, oldest first, whose accessor IDs start with ``prefix``."""
        req = api_pb2.ACLTokenListRequest(prefix=prefix)
        return self._read(lambda s: s.acl.ListTokens, req, {"stale": stale})

    def acl_get_token(self, accessor_id: str, *, stale: bool = False) -> api_pb2.ACLTokenGetResponse:
        """One token by its accessor ID (NOT_FOUND when there is none)."""
        req = api_pb2.ACLTokenGetRequest(accessor_id=accessor_id)
        return self._read(lambda s: s.acl.GetToken, req, {"stale": stale})

    def acl_token_self(self, *, stale: bool = False) -> api_pb2.ACLTokenSelfResponse:
        """The token this client sends."""
        return self._read(lambda s: s.acl.TokenSelf, api_pb2.ACLTokenSelfRequest(), {"stale": stale})

    # -- the retry loop -----------------------------------------------------------------

    def _pick(self) -> _Stubs:
        with self._lock:
            if self._closed:
                raise DroverError(grpc.StatusCode.CANCELLED, "client is closed")
            return self._stubs[self._current]

    def _first_contact(self, started: float) -> _Stubs:
        """While no address has answered: the address to call next, waiting for one to
        connect or to fail. Gives up with the error naming them all ``connect_timeout``
        after ``started`` (the call's start), or sooner once ``retry_deadline`` has passed
        and every address has failed once: a deadline shorter than a connection takes
        (``retry_deadline=0``, "one attempt") still tries each address."""
        reach = self._reach
        reach.watch()
        hard = started + self.connect_timeout
        soft = started + min(self.connect_timeout, self.retry_deadline)
        with reach.changed:
            while True:
                if self._closed:
                    raise DroverError(grpc.StatusCode.CANCELLED, "client is closed")
                pick = reach.callable_now(self._current)
                if pick is not None:
                    break
                now = time.monotonic()
                if now >= hard or (now >= soft and reach.every_address_failed()):
                    raise reach.nobody_answered(self.connect_timeout)
                reach.changed.wait((soft if now < soft else hard) - now)
        with self._lock:
            self._current = self._stubs.index(pick)
        return pick

    def _answered(self) -> None:
        if not self._reach.answered:
            self._reach.answered = True
            self._reach.stop_watching()

    def _hint(self, err: DroverError) -> str:
        return self._closed_hint if "socket closed" in err.message.lower() else ""

    def _rotate(self, failed: _Stubs) -> None:
        with self._lock:
            # Another thread may have moved on already; only advance past the failed one.
            if self._stubs[self._current] is failed:
                self._current = (self._current + 1) % len(self._stubs)

    def _unreached(self, stubs: _Stubs, err: DroverError) -> bool:
        """Before any address has answered: True when ``stubs``' address could not be
        reached at all (try the next one at once, no backoff); a TLS failure is raised, as
        no retry can mend it."""
        if self._reach.answered:
            return False
        if _is_tls_failure(err):
            raise err
        return self._reach.is_transport_failure(stubs, err)

    def _retrying_stream(
        self,
        open_stream: Callable[[_Stubs], _ResponseStream[Streamed]],
        *,
        retry: Callable[[DroverError, bool], bool],
        gave_up: Callable[[DroverError, float], DroverError],
        stall_timeout: float | None = None,
        resume_on_end: bool = False,
    ) -> Iterator[Streamed]:
        """The messages of a server-streaming call, opened again on the next address when
        it breaks and ``retry(error, received)`` allows (``received``: this attempt gave
        at least one message; ``open_stream`` is called anew each time, so a resumable
        stream asks for what it has not had yet). What ``_call`` does for a unary call:
        first contact waits for an address that connects, a TLS failure is raised at once,
        retries back off, and a stream failing for ``retry_deadline`` without a message
        raises ``gave_up(error, retry_deadline)``. ``stall_timeout``: a stream silent that
        long is cancelled and counts as UNAVAILABLE. ``resume_on_end``: a stream the server
        ends is opened again (one that never ends on its own, like events)."""
        started = time.monotonic()
        attempt = 0
        failing_since: float | None = None
        while True:
            stubs = self._pick() if self._reach.answered else self._first_contact(started)
            stream = open_stream(stubs)
            watchdog = _Watchdog(stream.cancel, stall_timeout) if stall_timeout is not None else None
            received = False
            try:
                for response in stream:
                    if watchdog is not None:
                        watchdog.fed()
                    self._answered()
                    received, attempt, failing_since = True, 0, None
                    yield response
                if not resume_on_end:
                    return
                err = DroverError(grpc.StatusCode.UNAVAILABLE, f"{stubs.address} ended the stream")
            except grpc.RpcError as exc:
                err = _translate(exc)
                if watchdog is not None and watchdog.fired:
                    err = DroverError(
                        grpc.StatusCode.UNAVAILABLE, f"{stubs.address} sent nothing for {stall_timeout:g}s"
                    )
                elif self._unreached(stubs, err):
                    continue
                self._answered()
                if _is_tls_failure(err) or not retry(err, received):
                    raise err from exc
            finally:
                if watchdog is not None:
                    watchdog.stop()
                stream.cancel()
            self._rotate(stubs)
            now = time.monotonic()
            failing_since = now if failing_since is None else failing_since
            delay = _backoff(attempt, self._rng)
            attempt += 1
            if now + delay > failing_since + self.retry_deadline:
                raise gave_up(err, self.retry_deadline)
            time.sleep(delay)

    def _read(
        self,
        method: Callable[[_Stubs], grpc.UnaryUnaryMultiCallable[ReadReq, Resp]],
        request: ReadReq,
        query: Query,
    ) -> Resp:
        """A read with ``query`` set as its request's options (a blocking one gets the
        time it may wait added to each attempt's timeout)."""
        request.options.CopyFrom(_options(**query))
        return self._call(method, request, options=request.options)

    def _call(
        self,
        method: Callable[[_Stubs], grpc.UnaryUnaryMultiCallable[Req, Resp]],
        request: Req,
        *,
        write: bool = False,
        options: api_pb2.QueryOptions | None = None,
    ) -> Resp:
        retryable = _RETRY_WRITE if write else _RETRY_READ
        attempt_timeout = self.timeout + _blocking_wait_s(options)
        started = time.monotonic()
        deadline = started + self.retry_deadline
        attempt = 0
        while True:
            stubs = self._pick() if self._reach.answered else self._first_contact(started)
            try:
                response = method(stubs)(request, timeout=attempt_timeout, metadata=self._metadata)
            except grpc.RpcError as exc:
                err = _translate(exc)
                if self._unreached(stubs, err):
                    continue
                self._answered()
                if (err.code not in retryable and not _is_backoff(err)) or _is_tls_failure(err):
                    raise err from exc
                self._rotate(stubs)
                delay = _backoff(attempt, self._rng)
                attempt += 1
                if time.monotonic() + delay > deadline:
                    raise DroverError(
                        err.code,
                        f"no server answered after {attempt} attempt(s) in {self.retry_deadline:g}s "
                        f"({', '.join(self.addresses)}): {err.message}{self._hint(err)}",
                    ) from exc
                time.sleep(delay)
            else:
                self._answered()
                return response


# The client's first name: everything written before it was called Client still works.
DroverClient = Client


class _Watchdog:
    """Calls ``cancel`` once a stream has been silent for ``stall_s`` (``fed`` on each message):
    a server that stops answering without closing its connection would otherwise hold
    the stream for ever. One thread per stream, stopped with it."""

    def __init__(self, cancel: Callable[[], object], stall_s: float) -> None:
        self._cancel = cancel
        self._stall_s = stall_s
        self._last = time.monotonic()
        self._stopped = threading.Event()
        self.fired = False
        threading.Thread(target=self._watch, name="drover-event-watchdog", daemon=True).start()

    def fed(self) -> None:
        self._last = time.monotonic()

    def stop(self) -> None:
        self._stopped.set()

    def _watch(self) -> None:
        tick = min(1.0, self._stall_s / 4)
        while not self._stopped.wait(tick):
            if time.monotonic() - self._last > self._stall_s:
                self.fired = True
                self._cancel()
                return


def _topic_filter(topic: str) -> api_pb2.EventTopicFilter:
    """``"Job"`` or ``"Job:web"`` (the key after the first colon) as the request's filter."""
    name, _, key = topic.partition(":")
    return api_pb2.EventTopicFilter(topic=name, key=key)


def _watch(read: Callable[[Query], Answer], watch: Watch) -> Iterator[Answer]:
    """``read`` as a blocking query from ``watch["index"]``, each time past what it saw."""
    stale, wait_ns = watch.get("stale", False), watch.get("wait_ns", 0)
    return blocking(
        lambda i: read(Query(stale=stale, min_index=i, wait_ns=wait_ns)),
        index=watch.get("index", 0),
        timeout=watch.get("timeout"),
    )


def _options(**query: Unpack[Query]) -> api_pb2.QueryOptions:
    return api_pb2.QueryOptions(**query)


def _blocking_wait_s(options: api_pb2.QueryOptions | None) -> float:
    """How long the server may hold this query open, so the attempt timeout covers it."""
    if options is None or options.min_index == 0:
        return 0.0
    if options.wait_ns <= 0:
        return DEFAULT_BLOCKING_WAIT_S
    return min(options.wait_ns / 1e9, MAX_BLOCKING_WAIT_S)


def _backoff(attempt: int, rng: random.Random) -> float:
    """Exponential backoff with "equal jitter": half fixed, half random, so retries from many
    clients after a leader loss spread out but never collapse to zero."""
    ceiling = min(BACKOFF_MAX_S, BACKOFF_BASE_S * 2.0 ** min(attempt, 32))
    return ceiling / 2 + rng.uniform(0, ceiling / 2)


# gRPC's words for a handshake that failed on this side (wrong protocol, a certificate that
# does not verify or does not name the server). A server refusing this side's certificate
# only closes the connection ("Socket closed"), which a restarting server does too: retried.
_TLS_FAILURE_MARKERS: Final = ("handshake failed", "verification check failed")
# What a closed socket most likely means, with TLS and without.
_CLOSED_HINT_PLAINTEXT: Final = " (is it serving TLS? a server with TLS closes plaintext connections)"
_CLOSED_HINT_TLS: Final = " (does it verify clients? it closes connections without a certificate from its CA)"


# gRPC's words for failing to connect at all (refused, unresolvable, closed before HTTP/2
# started, a failed handshake); a server's own UNAVAILABLE says something else.
_TRANSPORT_MARKERS: Final = (
    "failed to connect",
    "connection refused",
    "errors resolving",
    "dns resolution failed",
    "socket closed",
    "connection reset",
    "no route to host",
    "network is unreachable",
    *_TLS_FAILURE_MARKERS,
)


def _looks_like_transport(err: DroverError) -> bool:
    text = err.message.lower()
    return any(marker in text for marker in _TRANSPORT_MARKERS)


def _transport_reason(message: str, closed_hint: str) -> str:
    """The transport's last word ("...: Failed to connect to remote host: Connection
    refused" -> "connection refused"), with what a closed socket most likely means."""
    last = message.rsplit(": ", 1)[-1].strip(" []") or message
    reason = last[:1].lower() + last[1:]
    if "resolving" in message.lower() or "dns resolution" in message.lower():
        reason = f"cannot resolve the host name ({reason})"
    if "socket closed" in message.lower():
        reason += closed_hint
    return reason


def _is_backoff(err: DroverError) -> bool:
    """A server's per-caller rate or parking limit: refused before any work, so any call
    (a write too) may be sent again once the caller has waited."""
    return err.code == grpc.StatusCode.RESOURCE_EXHAUSTED and err.message.endswith("retry later")


def _is_tls_failure(err: DroverError) -> bool:
    text = err.message.lower()
    return err.code == grpc.StatusCode.UNAVAILABLE and any(m in text for m in _TLS_FAILURE_MARKERS)


def _translate(exc: grpc.RpcError) -> DroverError:
    code = exc.code() if callable(getattr(exc, "code", None)) else grpc.StatusCode.UNKNOWN
    details = exc.details() if callable(getattr(exc, "details", None)) else None
    message = " ".join((details or code.name.lower().replace("_", " ")).split())
    return DroverError(code, message)
