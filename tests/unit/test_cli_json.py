"""What ``-json`` prints (proto/drover/cli/_format.py, ``message_json``): every field, zero
values included, unset sub-messages as null, 64-bit integers as numbers, as the package
docstring's contract for scripts says."""

from __future__ import annotations

import json

from drover.cli._format import jsonable, message_json
from drover.v1 import api_pb2, raft_pb2, structs_pb2

SUBMIT_NS = 1_700_000_000_000_000_123  # past 2**53: a float would lose the last digits


def test_message_json__every_field_in_proto_order_with_zero_values() -> None:
    got = message_json(structs_pb2.Job(id="web"))

    assert list(got) == [f.name for f in structs_pb2.Job.DESCRIPTOR.fields]
    assert (got["priority"], got["name"], got["stop"], got["datacenters"], got["meta"]) == (
        0,
        "",
        False,
        [],
        {},
    )


def test_message_json__64_bit_integers_are_numbers_exactly() -> None:
    job = structs_pb2.Job(id="123", submit_time_ns=SUBMIT_NS, version=3, job_modify_index=9)

    text = json.dumps(message_json(job))

    back = json.loads(text)
    assert (back["submit_time_ns"], back["version"], back["job_modify_index"]) == (SUBMIT_NS, 3, 9)
    assert back["id"] == "123"  # a string that looks like a number stays a string


def test_message_json__unset_sub_message_is_null_and_nested_ones_are_complete() -> None:
    job = structs_pb2.Job(id="web")
    job.groups.add(name="g", count=0)

    got = message_json(job)

    assert got["periodic"] is None and got["update"] is None
    [group] = got["groups"]
    assert isinstance(group, dict)
    assert (group["name"], group["count"], group["tasks"], group["restart"]) == ("g", 0, [], None)


def test_message_json__map_values_of_64_bit_integers_are_numbers() -> None:
    snapshot = raft_pb2.StateSnapshot()
    snapshot.table_index["jobs"] = SUBMIT_NS

    assert message_json(snapshot)["table_index"] == {"jobs": SUBMIT_NS}


def test_message_json__only_the_chosen_oneof_member_is_printed() -> None:
    down = api_pb2.ClientTunnelDown(request_id=2**40, cancel=False)

    got = message_json(down)

    assert got["request_id"] == 2**40
    assert "cancel" in got  # chosen, though false
    assert not {"logs", "restart", "signal", "meta_read", "meta_apply"} & set(got)


def test_jsonable__messages_inside_lists_and_dicts() -> None:
    got = jsonable({"jobs": [structs_pb2.Job(id="a", version=1)], "count": 1})

    assert isinstance(got, dict)
    [job] = got["jobs"]
    assert (job["id"], job["version"], job["priority"]) == ("a", 1, 0)
    assert got["count"] == 1
