"""Reaching a server: an address where no drover server answers fails in about
``connect_timeout`` with one error naming it; a server that answers but has no leader yet
is retried until ``retry_deadline`` (proto/drover/sdk.py's module docstring).

No test here times anything: each waits for the command or call with a deadline well
above the connect timeout, and reads what the error says.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import grpc
import pytest

from deploy.cluster import pick_free_ports
from drover.sdk import Client, DroverError
from drover.v1 import api_pb2, api_pb2_grpc
from tests.fixtures.fake_grpc import serving

# Far above the 2 s the CLI waits for a first answer: a command that took this long retried
# an address nothing listens on, and the subprocess timeout fails the test.
CLI_DEADLINE_S = 15.0


def _refused_address() -> str:
    """A loopback port that was free a moment ago: connecting to it is refused."""
    [port] = pick_free_ports(1)
    return f"127.0.0.1:{port}"


@contextmanager
def _silent_listener() -> Iterator[str]:
    """A port that accepts TCP connections and never says a word: a connection that never
    completes, like a firewall that drops packets."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(0)
        yield f"127.0.0.1:{sock.getsockname()[1]}"


def test_cli__refused_address__fails_with_one_line_naming_it() -> None:
    address = _refused_address()
    result = subprocess.run(
        [sys.executable, "-m", "drover.cli", "job", "status", "-address", address],
        capture_output=True,
        text=True,
        timeout=CLI_DEADLINE_S,
        stdin=subprocess.DEVNULL,
    )
    assert result.returncode == 1, result
    assert result.stdout == ""
    assert result.stderr.splitlines() == [f"Error: no drover server at {address}: connection refused"]


def test_sdk__every_address_refused__names_them_all() -> None:
    first, second = _refused_address(), _refused_address()
    with Client([first, second], connect_timeout=0.3) as client, pytest.raises(DroverError) as err:
        client.list_jobs()
    assert err.value.code == grpc.StatusCode.UNAVAILABLE
    assert err.value.message == f"no drover server at {first}, {second}: connection refused"


def test_sdk__a_connection_that_never_completes__gives_up_naming_the_wait() -> None:
    # The refused port is picked while the listener holds its own, so the two never coincide
    # (picked first, the free port could be the one the listener then bound).
    with _silent_listener() as silent:
        refused = _refused_address()
        with Client([silent, refused], connect_timeout=0.3) as client, pytest.raises(DroverError) as err:
            client.list_jobs()
    assert (
        err.value.message == f"no drover server at {silent}: no answer in 0.3s; {refused}: connection refused"
    )


def test_sdk__unresolvable_name__says_so() -> None:
    with (
        Client("no-such-host.invalid:4646", connect_timeout=0.3) as client,
        pytest.raises(DroverError) as err,
    ):
        client.list_jobs()
    assert err.value.message.startswith("no drover server at no-such-host.invalid:4646: cannot resolve")


class _LeaderlessOperator(api_pb2_grpc.OperatorServicer):
    """A reachable server that says "no cluster leader yet" to its first ``refusals`` calls,
    as a server does during an election, then answers."""

    def __init__(self, refusals: int) -> None:
        self.refusals = refusals
        self.calls = 0
        self._lock = threading.Lock()

    def StateDigest(self, request: Any, context: grpc.ServicerContext) -> api_pb2.StateDigestResponse:
        with self._lock:
            self.calls += 1
            refuse = self.calls <= self.refusals
        if refuse:
            context.abort(grpc.StatusCode.UNAVAILABLE, "no cluster leader yet")
        return api_pb2.StateDigestResponse(digest="abc", applied_index=7)


def test_sdk__a_reachable_server_without_a_leader__is_retried_past_the_connect_timeout() -> None:
    # Eight refusals back off 0.05 s, 0.1 s, ... (half fixed, half jittered): at least
    # 0.025 + 0.05 + 0.1 + 0.2 + 0.4 + 0.8 + 1 + 1 s, far beyond the 0.1 s connect timeout.
    servicer = _LeaderlessOperator(refusals=8)
    with (
        serving((api_pb2_grpc.add_OperatorServicer_to_server, servicer), max_workers=2) as address,
        Client(address, connect_timeout=0.1, retry_deadline=60) as client,
    ):
        assert client.state_digest().digest == "abc"
    assert servicer.calls == 9


def test_sdk__a_first_address_refused__the_next_one_answers() -> None:
    servicer = _LeaderlessOperator(refusals=0)
    with (
        serving((api_pb2_grpc.add_OperatorServicer_to_server, servicer), max_workers=2) as address,
        Client([_refused_address(), address]) as client,
    ):
        assert client.state_digest().applied_index == 7
    assert servicer.calls == 1


def test_sdk__retry_deadline_0__still_one_try_at_each_address() -> None:
    # "No retries" must not mean "no attempt": the first connection takes a moment.
    servicer = _LeaderlessOperator(refusals=0)
    refused = _refused_address()
    with serving((api_pb2_grpc.add_OperatorServicer_to_server, servicer), max_workers=2) as address:
        with Client(address, retry_deadline=0) as client:
            assert client.state_digest().digest == "abc"
        with Client(refused, retry_deadline=0) as client, pytest.raises(DroverError) as err:
            client.state_digest()
    assert err.value.message == f"no drover server at {refused}: connection refused"
