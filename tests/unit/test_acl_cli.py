"""``drover acl ...`` and ``-token``/``DROVER_TOKEN`` against an IN-PROCESS FAKE gRPC server.

The fake records each request with the ``x-drover-token`` it came with; the real ACL
servicer is tested in tests/cluster/test_acl.py.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf.message import Message

from drover.cli import main
from drover.v1 import api_pb2, api_pb2_grpc, raft_pb2

SECRET = "5ec2e700-0000-4000-8000-000000000001"
ACCESSOR = "acce5500-0000-4000-8000-000000000001"


@dataclass
class FakeACL:
    calls: list[tuple[str, Message, str]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    deny: bool = False

    def enter(self, method: str, request: Message, context: grpc.ServicerContext) -> None:
        token = dict(context.invocation_metadata() or ()).get("x-drover-token", "")
        with self.lock:
            self.calls.append((method, request, str(token)))
        if self.deny:
            context.abort(
                grpc.StatusCode.PERMISSION_DENIED,
                "Permission denied: ACL.ListTokens needs a management token",
            )

    def tokens_sent(self) -> list[str]:
        return [token for _, _, token in self.calls]


def _token(secret: str = "") -> api_pb2.ACLToken:
    return api_pb2.ACLToken(
        accessor_id=ACCESSOR, secret_id=secret, name="t", type="client", policies=["readonly"], create_index=7
    )


class _ACL(api_pb2_grpc.ACLServicer):
    def __init__(self, fake: FakeACL) -> None:
        self.fake = fake

    def Bootstrap(self, request: Any, context: grpc.ServicerContext) -> api_pb2.ACLBootstrapResponse:
        self.fake.enter("Bootstrap", request, context)
        return api_pb2.ACLBootstrapResponse(token=_token(request.bootstrap_secret or SECRET))

    def UpsertPolicy(self, request: Any, context: grpc.ServicerContext) -> api_pb2.ACLPolicyUpsertResponse:
        self.fake.enter("UpsertPolicy", request, context)
        return api_pb2.ACLPolicyUpsertResponse()

    def CreateToken(self, request: Any, context: grpc.ServicerContext) -> api_pb2.ACLTokenCreateResponse:
        self.fake.enter("CreateToken", request, context)
        return api_pb2.ACLTokenCreateResponse(token=_token(SECRET))

    def ListTokens(self, request: Any, context: grpc.ServicerContext) -> api_pb2.ACLTokenListResponse:
        self.fake.enter("ListTokens", request, context)
        return api_pb2.ACLTokenListResponse(tokens=[_token()])

    def GetPolicy(self, request: Any, context: grpc.ServicerContext) -> api_pb2.ACLPolicyGetResponse:
        self.fake.enter("GetPolicy", request, context)
        policy = raft_pb2.ACLPolicy(name=request.name, description="d", rules='node { policy = "read" }\n')
        return api_pb2.ACLPolicyGetResponse(policy=policy)


class _Operator(api_pb2_grpc.OperatorServicer):
    def __init__(self, fake: FakeACL) -> None:
        self.fake = fake

    def StateDigest(self, request: Any, context: grpc.ServicerContext) -> api_pb2.StateDigestResponse:
        self.fake.enter("StateDigest", request, context)
        return api_pb2.StateDigestResponse(digest="d", server="s1")


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[FakeACL, str]]:
    state = FakeACL()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    api_pb2_grpc.add_ACLServicer_to_server(_ACL(state), server)
    api_pb2_grpc.add_OperatorServicer_to_server(_Operator(state), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    monkeypatch.delenv("DROVER_TOKEN", raising=False)
    monkeypatch.setenv("DROVER_ADDR", f"127.0.0.1:{port}")
    try:
        yield state, f"127.0.0.1:{port}"
    finally:
        server.stop(0)


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main([*argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_token_flag__sent_as_metadata(fake: tuple[FakeACL, str], capsys: pytest.CaptureFixture[str]) -> None:
    state, _ = fake

    code, _, _ = run(capsys, "acl", "token", "list", "-token", SECRET)

    assert code == 0
    assert state.tokens_sent() == [SECRET]


def test_token_env__sent_as_metadata_and_the_flag_wins(
    fake: tuple[FakeACL, str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    state, _ = fake
    monkeypatch.setenv("DROVER_TOKEN", "from-env")

    assert run(capsys, "acl", "token", "list")[0] == 0
    assert run(capsys, "acl", "token", "list", "-token", "from-flag")[0] == 0

    assert state.tokens_sent() == ["from-env", "from-flag"]


def test_token__also_on_per_server_loops(
    fake: tuple[FakeACL, str], capsys: pytest.CaptureFixture[str]
) -> None:
    state, address = fake

    code, _, _ = run(capsys, "operator", "state", "-address", f"{address},{address}", "-token", SECRET)

    assert code == 0
    assert state.tokens_sent() == [SECRET, SECRET]


def test_no_token__none_sent(fake: tuple[FakeACL, str], capsys: pytest.CaptureFixture[str]) -> None:
    state, _ = fake
    assert run(capsys, "acl", "token", "list")[0] == 0
    assert state.tokens_sent() == [""]


def test_bootstrap__json__prints_accessor_and_secret(
    fake: tuple[FakeACL, str], capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run(capsys, "acl", "bootstrap", "-json")

    assert code == 0
    token = json.loads(out)
    assert (token["accessor_id"], token["secret_id"]) == (ACCESSOR, SECRET)


def test_bootstrap__secret_file__sent(
    fake: tuple[FakeACL, str], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    state, _ = fake
    path = tmp_path / "secret"
    path.write_text("0b9e7f3c-5d1a-4c2b-9f8e-7a6b5c4d3e2f\n")

    code, out, _ = run(capsys, "acl", "bootstrap", str(path))

    assert code == 0
    assert state.calls[0][1].bootstrap_secret == "0b9e7f3c-5d1a-4c2b-9f8e-7a6b5c4d3e2f"
    assert "Secret ID    = 0b9e7f3c-5d1a-4c2b-9f8e-7a6b5c4d3e2f" in out


def test_policy_apply__sends_name_description_and_the_file(
    fake: tuple[FakeACL, str], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    state, _ = fake
    rules = 'namespace "default" { policy = "read" }\n'
    (tmp_path / "p.hcl").write_text(rules)

    code, out, _ = run(
        capsys, "acl", "policy", "apply", "-description", "readers", "readonly", str(tmp_path / "p.hcl")
    )

    assert code == 0
    assert out.strip() == 'Successfully wrote "readonly" ACL policy!'
    request = state.calls[0][1]
    assert (request.name, request.description, request.rules) == ("readonly", "readers", rules)


def test_policy_info__shows_the_rules(fake: tuple[FakeACL, str], capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "acl", "policy", "info", "readonly")

    assert code == 0
    assert out.endswith('Rules\n\nnode { policy = "read" }\n')


def test_token_create__json__secret_and_every_policy_sent(
    fake: tuple[FakeACL, str], capsys: pytest.CaptureFixture[str]
) -> None:
    state, _ = fake

    code, out, _ = run(
        capsys, "acl", "token", "create", "-name", "ci", "-policy", "a", "-policy", "b", "-json"
    )

    assert code == 0
    assert json.loads(out)["secret_id"] == SECRET
    request = state.calls[0][1]
    assert (request.name, request.type, list(request.policies)) == ("ci", "client", ["a", "b"])


def test_permission_denied__one_line_exit_1(
    fake: tuple[FakeACL, str], capsys: pytest.CaptureFixture[str]
) -> None:
    state, _ = fake
    state.deny = True

    code, out, err = run(capsys, "acl", "token", "list")

    assert code == 1
    assert out == ""
    assert err == "Error: Permission denied: ACL.ListTokens needs a management token\n"
