"""ACL service: bootstrap, policies and tokens (server/acl/).

What each RPC needs is in server/acl/rights.py and is checked by the ``rpc`` decorator
before the method runs; the methods here only add what the table can not say (a client
token sees only its own policies). Every ACL RPC answers FAILED_PRECONDITION on a server
without ``-acl-enabled``, as Nomad answers "ACL support disabled".
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import grpc

from drover.server.acl.endpoints import ACLEndpoints
from drover.server.acl.records import ACLTokenRecord
from drover.server.acl.resolve import Identity, caller
from drover.server.api._base import get_by_id, query, rpc, write_meta
from drover.server.codec import to_proto
from drover.server.errors import ConflictError, NotFoundError, PermissionDeniedError, ValidationError
from drover.server.state_store import Snapshot
from drover.v1 import api_pb2, api_pb2_grpc

if TYPE_CHECKING:
    from drover.server.core import ServerCore

S = "ACL"


def token_message(record: ACLTokenRecord, secret: str = "") -> api_pb2.ACLToken:
    """The API's view of a stored token: never its hash; its secret only when just minted."""
    return api_pb2.ACLToken(
        accessor_id=record.accessor_id,
        secret_id=secret,
        name=record.name,
        type=record.type,
        policies=list(record.policies),
        create_time_ns=record.create_time_ns,
        create_index=record.create_index,
        modify_index=record.modify_index,
    )


def _visible_policies(identity: Identity | None) -> frozenset[str] | None:
    """The policy names a caller may read; None: all of them (management)."""
    if identity is None or identity.acl.management or identity.token is None:
        return None
    return frozenset(identity.token.policies)


class ACLServicer(api_pb2_grpc.ACLServicer):
    def __init__(self, core: ServerCore) -> None:
        self.core = core
        self.endpoints = ACLEndpoints(core.raft, core.store, core.clock, core.ids)

    def _require_enabled(self) -> None:
        if not self.core.cfg.acl_enabled:
            raise ConflictError("ACLs are disabled on this server (start the servers with -acl-enabled)")

    @rpc(S, "write")
    def Bootstrap(
        self, request: api_pb2.ACLBootstrapRequest, context: grpc.ServicerContext
    ) -> api_pb2.ACLBootstrapResponse:
        self._require_enabled()
        minted = self.endpoints.bootstrap(request.bootstrap_secret)
        record = self.core.store.snapshot().acl_token(minted.record.accessor_id) or minted.record
        return api_pb2.ACLBootstrapResponse(
            meta=write_meta(minted.result.index), token=token_message(record, minted.secret)
        )

    @rpc(S, "write")
    def UpsertPolicy(
        self, request: api_pb2.ACLPolicyUpsertRequest, context: grpc.ServicerContext
    ) -> api_pb2.ACLPolicyUpsertResponse:
        self._require_enabled()
        result = self.endpoints.upsert_policy(request.name, request.description, request.rules)
        return api_pb2.ACLPolicyUpsertResponse(meta=write_meta(result.index))

    @rpc(S, "write")
    def DeletePolicy(
        self, request: api_pb2.ACLPolicyDeleteRequest, context: grpc.ServicerContext
    ) -> api_pb2.ACLPolicyDeleteResponse:
        self._require_enabled()
        result = self.endpoints.delete_policy(request.name)
        return api_pb2.ACLPolicyDeleteResponse(meta=write_meta(result.index))

    @rpc(S, "read")
    def ListPolicies(
        self, request: api_pb2.ACLPolicyListRequest, context: grpc.ServicerContext
    ) -> api_pb2.ACLPolicyListResponse:
        self._require_enabled()
        visible = _visible_policies(caller())
        snap, meta = query(self.core, request.options, ("acl_policies",))
        response = api_pb2.ACLPolicyListResponse(meta=meta)
        for policy in sorted(snap.acl_policies(), key=lambda p: p.name):
            if visible is not None and policy.name not in visible:
                continue
            if policy.name.startswith(request.prefix):
                to_proto(policy, response.policies.add())
        return response

    @rpc(S, "read")
    def GetPolicy(
        self, request: api_pb2.ACLPolicyGetRequest, context: grpc.ServicerContext
    ) -> api_pb2.ACLPolicyGetResponse:
        self._require_enabled()
        visible = _visible_policies(caller())
        if visible is not None and request.name not in visible:
            raise PermissionDeniedError(
                "Permission denied: a client token may read only the policies it holds"
            )
        if not request.name:
            raise ValidationError("name: required")
        policy, meta = get_by_id(
            self.core, request.options, "acl_policies", "policy", request.name, Snapshot.acl_policy
        )
        response = api_pb2.ACLPolicyGetResponse(meta=meta)
        to_proto(policy, response.policy)
        return response

    @rpc(S, "write")
    def CreateToken(
        self, request: api_pb2.ACLTokenCreateRequest, context: grpc.ServicerContext
    ) -> api_pb2.ACLTokenCreateResponse:
        self._require_enabled()
        minted = self.endpoints.create_token(request.name, request.type, tuple(request.policies))
        record = self.core.store.snapshot().acl_token(minted.record.accessor_id) or minted.record
        return api_pb2.ACLTokenCreateResponse(
            meta=write_meta(minted.result.index), token=token_message(record, minted.secret)
        )

    @rpc(S, "write")
    def DeleteToken(
        self, request: api_pb2.ACLTokenDeleteRequest, context: grpc.ServicerContext
    ) -> api_pb2.ACLTokenDeleteResponse:
        self._require_enabled()
        result = self.endpoints.delete_token(request.accessor_id)
        return api_pb2.ACLTokenDeleteResponse(meta=write_meta(result.index))

    @rpc(S, "read")
    def ListTokens(
        self, request: api_pb2.ACLTokenListRequest, context: grpc.ServicerContext
    ) -> api_pb2.ACLTokenListResponse:
        self._require_enabled()
        snap, meta = query(self.core, request.options, ("acl_tokens",))
        response = api_pb2.ACLTokenListResponse(meta=meta)
        for token in sorted(snap.acl_tokens(), key=lambda t: (t.create_index, t.accessor_id)):
            if token.accessor_id.startswith(request.prefix):
                response.tokens.append(token_message(token))
        return response

    @rpc(S, "read")
    def GetToken(
        self, request: api_pb2.ACLTokenGetRequest, context: grpc.ServicerContext
    ) -> api_pb2.ACLTokenGetResponse:
        self._require_enabled()
        if not request.accessor_id:
            raise ValidationError("accessor_id: required")
        token, meta = get_by_id(
            self.core, request.options, "acl_tokens", "token", request.accessor_id, Snapshot.acl_token
        )
        return api_pb2.ACLTokenGetResponse(meta=meta, token=token_message(token))

    @rpc(S, "read")
    def TokenSelf(
        self, request: api_pb2.ACLTokenSelfRequest, context: grpc.ServicerContext
    ) -> api_pb2.ACLTokenSelfResponse:
        self._require_enabled()
        identity = caller()
        if identity is None or identity.token is None:
            raise NotFoundError("no ACL token in this call")
        snap, meta = query(self.core, request.options, ("acl_tokens",))
        token = snap.acl_token(identity.token.accessor_id)
        if token is None:
            raise PermissionDeniedError("Permission denied: ACL token not found")
        return api_pb2.ACLTokenSelfResponse(meta=meta, token=token_message(token))
