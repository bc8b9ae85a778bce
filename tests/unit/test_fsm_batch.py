"""A batch entry applies as its requests would one by one: same state, same results.

The reference for "one by one" is each request applied alone at the index it reports,
which for a batched request is its batch entry's raft index (server/write_batch.py). The
logs are test_fsm_determinism's random "valid-ish" logs, cut into random batches.
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from drover.server.events import EventBuffer
from drover.server.fsm import FSM, BatchApplied, batchable, encode_batch, requests_of, results_of
from drover.server.raft.journal import RECORD_COMMAND, JournalRecord
from drover.server.raft_tools import decode_record
from drover.server.snapshot import state_digest
from drover.server.state_store import StateStore
from drover.v1 import raft_pb2
from tests.fixtures import mock
from tests.unit.test_fsm_determinism import PROPERTY_SETTINGS, Entry, invariant_2, logs

ET = raft_pb2.EntryType


@st.composite
def batched_logs(draw: st.DrawFn) -> list[list[Entry]]:
    """A random log cut into runs; each run of two or more becomes one batch entry (a
    restore or a batch never joins one, as the leader never puts them in)."""
    log = draw(logs())
    groups: list[list[Entry]] = []
    i = 0
    while i < len(log):
        size = draw(st.integers(min_value=1, max_value=8), label="batch size")
        group: list[Entry] = []
        for entry in log[i : i + size]:
            if not batchable(entry.data):
                if group:
                    groups.append(group)
                groups.append([entry])
                group = []
            else:
                group.append(entry)
        if group:
            groups.append(group)
        i += size
    return groups


@PROPERTY_SETTINGS
@given(groups=batched_logs())
def test_fsm_batch__random_log_cut_into_batches__same_state_and_results_as_one_by_one(
    groups: list[list[Entry]],
) -> None:
    store, reference = StateStore(), StateStore()
    fsm, one_by_one = FSM(store), FSM(reference)
    for index, group in enumerate(groups, start=1):
        data = group[0].data if len(group) == 1 else encode_batch([e.data for e in group])

        result = fsm.apply(data, index)

        own = [one_by_one.apply(entry.data, index) for entry in group]
        where = f"batch at {index}: {group}"
        assert list(results_of(result)) == own, where
        assert store.snapshot().tables == reference.snapshot().tables, where
        invariant_2(store.snapshot().tables, where)
    assert state_digest(store.snapshot().tables) == state_digest(reference.snapshot().tables)


# ---------------------------------------------------------------------------------------
# Situations


def test_fsm_batch__refused_request__gets_its_own_error_and_its_neighbours_apply() -> None:
    store = StateStore()
    fsm = FSM(store)
    web, api = mock.job(id="web"), mock.job(id="api")
    requests = [
        mock.register_job_entry(web),
        mock.deregister_entry("missing", purge=True),
        mock.register_job_entry(api),
    ]

    result = fsm.apply(encode_batch(requests), 7)

    first, refused, third = results_of(result)
    assert (first.index, first.error) == (7, "")
    assert refused.index == 7 and refused.error and refused.not_found
    assert (third.index, third.error) == (7, "")
    tables = store.snapshot().tables
    assert {key[1] for key in tables.jobs} == {"web", "api"}
    assert tables.index == 7 and tables.table_index["jobs"] == 7


def test_fsm_batch__requests_apply_in_entry_order_each_on_the_state_the_one_before_left() -> None:
    store = StateStore()
    fsm = FSM(store)
    web = mock.job(id="web")
    requests = [mock.register_job_entry(web), mock.register_job_entry(mock.job(id="web", priority=70))]

    fsm.apply(encode_batch(requests), 3)

    job = store.snapshot().tables.jobs[("default", "web")]
    assert (job.priority, job.version, job.create_index, job.job_modify_index) == (70, 1, 3, 3)


def test_fsm_batch__commits_once__a_blocking_query_at_its_index_sees_every_request() -> None:
    store = StateStore()
    fsm = FSM(store)
    fsm.apply(mock.register_node_entry(mock.node(id="n0")), 1)
    commits: list[int] = []
    original = store.commit

    def counting_commit(tables: object, changes: object = None) -> None:
        commits.append(1)
        original(tables, changes)  # type: ignore[arg-type]

    store.commit = counting_commit  # type: ignore[method-assign]
    requests = [mock.register_node_entry(mock.node(id=f"n{i}")) for i in range(1, 4)]

    fsm.apply(encode_batch(requests), 2)

    assert commits == [1]
    snap = store.wait_for(["nodes"], 1, timeout=0.0)
    assert sorted(n.id for n in snap.tables.nodes.values()) == ["n0", "n1", "n2", "n3"]


def test_fsm_batch__events__one_batch_at_its_index_in_request_order() -> None:
    events = EventBuffer()
    fsm = FSM(StateStore(), events=events)
    requests = [mock.register_job_entry(mock.job(id=name)) for name in ("a", "b", "c")]

    fsm.apply(encode_batch(requests), 5)
    fsm.apply(mock.register_job_entry(mock.job(id="d")), 6)

    batches, covered = events.read(1, timeout=0.0)
    assert [index for index, _ in batches] == [5, 6]
    assert [e.key for e in batches[0][1] if e.topic == "Job"] == ["a", "b", "c"]
    assert covered == 6
    resumed, _ = events.read(6, timeout=0.0)
    assert [e.key for _, batch in resumed for e in batch if e.topic == "Job"] == ["d"]


def test_fsm_batch__restore_or_batch_inside_a_batch__refused_and_the_rest_applied() -> None:
    store = StateStore()
    fsm = FSM(store)
    inner = encode_batch([mock.register_job_entry(mock.job(id="x"))])
    requests = [
        mock.snapshot_restore_entry(store.snapshot().tables),
        inner,
        mock.register_job_entry(mock.job(id="web")),
    ]

    results = results_of(fsm.apply(encode_batch(requests), 4))

    assert "inside a batch" in results[0].error and "inside a batch" in results[1].error
    assert results[2].error == ""
    assert [k[1] for k in store.snapshot().tables.jobs] == ["web"]


def test_fsm_batch__undecodable_batch__refused_state_untouched() -> None:
    store = StateStore()
    fsm = FSM(store)
    before = store.snapshot().tables

    result = fsm.apply(mock.raw_entry(ET.ENTRY_TYPE_BATCH, b"\x0a\xff\xff\x01"), 9)

    assert result.error and not isinstance(result.value, BatchApplied)
    assert store.snapshot().tables is before


def test_fsm_batch__tools_see_each_request_of_a_batch_and_of_a_lone_entry() -> None:
    lone = mock.register_job_entry(mock.job(id="web"))
    pair = [lone, mock.register_job_entry(mock.job(id="api"))]

    assert requests_of(lone) == [lone]
    assert requests_of(encode_batch(pair)) == pair
    assert batchable(lone)
    assert not batchable(encode_batch(pair))
    assert not batchable(mock.snapshot_restore_entry(StateStore().snapshot().tables))


def test_raft_logs__batch_entry__each_request_decoded_in_order() -> None:
    requests = [mock.register_job_entry(mock.job(id="web")), mock.deregister_entry("web", purge=False)]
    record = JournalRecord(index=12, term=3, kind=RECORD_COMMAND, data=encode_batch(requests))

    out = decode_record(record)

    assert (out["index"], out["term"], out["type"]) == (12, 3, "ENTRY_TYPE_BATCH")
    assert [r["type"] for r in out["requests"]] == ["ENTRY_TYPE_JOB_REGISTER", "ENTRY_TYPE_JOB_DEREGISTER"]
    assert out["requests"][0]["body"]["job"]["id"] == "web"
