"""Per-caller limits (server/api/_limits.py) and the undecodable-request guard
(server/api/_decode.py), as plain values with the time passed in."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, cast

import pytest
import structlog

from drover.server.api import _base, _decode
from drover.server.api._limits import (
    CALLER_METADATA_KEY,
    FORWARDED_KEY,
    MAX_PARKED_PER_CALLER,
    MAX_PARKED_TOTAL,
    RATE_LIMITS,
    CallerLimits,
    Rate,
    TokenBucket,
    peer_host,
)
from drover.server.errors import ResourceExhaustedError
from drover.v1 import api_pb2


@pytest.mark.parametrize(
    ("peer", "host"),
    [
        ("ipv4:10.0.0.5:51234", "10.0.0.5"),
        ("ipv6:[::1]:40000", "::1"),
        ("ipv6:[fe80::1%eth0]:5", "fe80::1%eth0"),
        ("unix:/tmp/sock", "unix"),
        ("", ""),
    ],
)
def test_peer_host__port_dropped__reconnecting_is_the_same_caller(peer: str, host: str) -> None:
    assert peer_host(peer) == host


def test_token_bucket__burst_then_refill_at_rate() -> None:
    bucket = TokenBucket.full(Rate("x", per_second=2.0, burst=3), now=0.0)
    assert [bucket.take(0.0) for _ in range(4)] == [True, True, True, False]
    assert not bucket.take(0.4)  # 0.8 of a token
    assert bucket.take(0.5)
    assert not bucket.take(0.5)
    assert bucket.is_full(100.0)


def test_forwarded_key__the_one_base_sends() -> None:
    assert FORWARDED_KEY == _base.FORWARDED_KEY


@dataclass
class _Context:
    peer_text: str = "ipv4:10.0.0.9:1111"
    metadata: tuple[tuple[str, str], ...] = ()

    def peer(self) -> str:
        return self.peer_text

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return self.metadata


@dataclass
class _Member:
    grpc_address: str


@dataclass
class _Snap:
    members: list[_Member]

    def servers(self) -> list[_Member]:
        return self.members


@dataclass
class _Store:
    members: list[_Member] = field(default_factory=lambda: [_Member("10.0.0.2:4646")])

    def snapshot(self) -> _Snap:
        return _Snap(self.members)


@dataclass
class _Core:
    store: _Store = field(default_factory=_Store)


def _ctx(peer: str, **metadata: str) -> Any:
    return cast(Any, _Context(peer, tuple(metadata.items())))


FORWARDED = {FORWARDED_KEY: "s2", CALLER_METADATA_KEY: "192.0.2.7"}


def test_caller__forwarded_by_a_server__the_original_caller() -> None:
    limits = CallerLimits()
    assert limits.caller(cast(Any, _Core()), _ctx("ipv4:10.0.0.2:5000", **FORWARDED)) == "192.0.2.7"


def test_caller__forwarded_name_from_a_non_server__the_peer_itself() -> None:
    limits = CallerLimits()
    assert limits.caller(cast(Any, _Core()), _ctx("ipv4:10.0.0.66:5000", **FORWARDED)) == "10.0.0.66"


def test_caller__caller_name_without_forwarded_mark__ignored() -> None:
    limits = CallerLimits()
    ctx = _ctx("ipv4:10.0.0.2:5000", **{CALLER_METADATA_KEY: "192.0.2.7"})
    assert limits.caller(cast(Any, _Core()), ctx) == "10.0.0.2"


def test_rate__expensive_rpc__refused_past_the_burst_retry_later() -> None:
    now = [0.0]
    limits = CallerLimits(clock=lambda: now[0])
    rate = RATE_LIMITS["Jobs.Plan"]
    for _ in range(rate.burst):
        limits.take("Jobs.Plan", "a")
    with pytest.raises(ResourceExhaustedError, match=r"rate limited: Jobs\.Plan .*retry later$"):
        limits.take("Jobs.Plan", "a")
    limits.take("Jobs.Plan", "b")  # another caller has its own bucket
    now[0] += 1.0 / rate.per_second
    limits.take("Jobs.Plan", "a")


def test_rate__register_and_dispatch__share_one_bucket() -> None:
    limits = CallerLimits(clock=lambda: 0.0)
    burst = RATE_LIMITS["Jobs.Register"].burst
    for _ in range(burst):
        limits.take("Jobs.Register", "a")
    with pytest.raises(ResourceExhaustedError):
        limits.take("Jobs.Dispatch", "a")


def test_rate__cheap_rpc__never_limited() -> None:
    limits = CallerLimits(clock=lambda: 0.0)
    for _ in range(10_000):
        limits.take("Jobs.Get", "a")


def test_parked__per_caller_bound__then_released() -> None:
    limits = CallerLimits()
    held = [limits.parked("a") for _ in range(MAX_PARKED_PER_CALLER)]
    for cm in held:
        cm.__enter__()
    with pytest.raises(ResourceExhaustedError, match="a has 64 blocking queries waiting"), limits.parked("a"):
        pass
    with limits.parked("b"):
        assert limits.parked_total() == MAX_PARKED_PER_CALLER + 1
    for cm in held:
        cm.__exit__(None, None, None)
    assert limits.parked_total() == 0
    with limits.parked("a"):
        pass


def test_parked__server_total_bound() -> None:
    limits = CallerLimits()
    held = [limits.parked(f"c{i}") for i in range(MAX_PARKED_TOTAL)]
    for cm in held:
        cm.__enter__()
    with (
        pytest.raises(ResourceExhaustedError, match=f"this server has {MAX_PARKED_TOTAL}"),
        limits.parked("new"),
    ):
        pass
    for cm in held:
        cm.__exit__(None, None, None)


def test_admit__blocking_read__parks_only_while_it_runs() -> None:
    limits = CallerLimits()
    core = cast(Any, _Core())
    blocking = api_pb2.JobListRequest(options=api_pb2.QueryOptions(min_index=5))
    seen: list[int] = []
    limits.admit(
        core, "Jobs.List", blocking, _ctx("ipv4:1.2.3.4:1"), lambda: seen.append(limits.parked_total())
    )
    limits.admit(
        core,
        "Jobs.List",
        api_pb2.JobListRequest(),
        _ctx("ipv4:1.2.3.4:1"),
        lambda: seen.append(limits.parked_total()),
    )
    assert seen == [1, 0]
    assert limits.parked_total() == 0


def test_rate_limited_warning__one_line_per_interval_counting_the_rest(
    capsys: pytest.CaptureFixture[str],
) -> None:
    now = [0.0]
    warning = _decode.RateLimitedWarning("test.event", interval_s=10.0, clock=lambda: now[0])
    with structlog.testing.capture_logs() as logs:
        assert warning.warn(n=1)
        assert not any(warning.warn(n=i) for i in range(100))
        now[0] = 10.0
        assert warning.warn(n=2)
    assert [(entry["event"], entry["suppressed"]) for entry in logs] == [
        ("test.event", 0),
        ("test.event", 100),
    ]


def test_job_limits__from_server_config__default_and_raised() -> None:
    from drover.server.config import ServerConfig, load_server_config
    from drover.server.core import StartupError, job_limits

    assert job_limits(ServerConfig(node_name="s", data_dir="/d")).max_group_count == 10_000
    raised = load_server_config({"node_name": "s", "data_dir": "/d", "job_max_group_count": 20_000}, None)
    assert job_limits(raised).max_group_count == 20_000
    with pytest.raises(StartupError, match="job-max-group-count"):
        job_limits(ServerConfig(node_name="s", data_dir="/d", job_max_group_count=0))
