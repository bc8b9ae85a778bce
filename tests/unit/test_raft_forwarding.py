"""Which commands a leader accepts when a peer forwards them through pysyncobj (pure)."""

from __future__ import annotations

import pysyncobj.pickle as sync_pickle
from pysyncobj.syncobj import _COMMAND_TYPE

from drover.server.fsm import encode_entry
from drover.server.raft.patches import forwardable
from drover.v1 import raft_pb2


def _forwarded(entry_type: int, payload: object) -> bytes:
    """A command as pysyncobj queues it: a type byte, then its pickle of (func id, (data,))."""
    data = encode_entry(entry_type, payload)  # type: ignore[arg-type]
    return bytes([_COMMAND_TYPE.REGULAR]) + sync_pickle.dumps((0, (data,)))


def test_forwarded__member_announcement__accepted() -> None:
    member = raft_pb2.ServerMemberEntry()
    member.member.name = "s2"
    assert forwardable(_forwarded(raft_pb2.ENTRY_TYPE_SERVER_MEMBER, member))


def test_forwarded__plan_from_a_deposed_leader__refused() -> None:
    plan = raft_pb2.ApplyPlanResultsEntry(eval_id="e1")
    plan.allocs_upserted.add(id="a1")
    assert not forwardable(_forwarded(raft_pb2.ENTRY_TYPE_APPLY_PLAN_RESULTS, plan))


def test_forwarded__garbage__refused_and_pysyncobj_own_commands_left_alone() -> None:
    assert not forwardable(bytes([_COMMAND_TYPE.REGULAR]) + b"not a pickle")
    assert forwardable(bytes([_COMMAND_TYPE.NO_OP]))
