"""The recount oracle (``mock.summary_problems``) fails what is broken, one violation at a time.

The FSM, periodic, replay and chaos tests all rest on this oracle saying "no problem" only
when every job summary equals a recount (docs/design.md#invariant-2). Each test here starts
from a sound state the real FSM built (a service job with allocs in several client
statuses, a periodic parent with children in each status), breaks exactly one thing in it,
and requires the oracle to name that one thing.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from drover.scheduler.structs import (
    ALLOC_CLIENT_COMPLETE,
    ALLOC_CLIENT_RUNNING,
    EVAL_STATUS_COMPLETE,
    JOB_STATUS_DEAD,
    JOB_STATUS_RUNNING,
    JobChildrenSummary,
    JobSummary,
    TaskGroupSummary,
)
from drover.server.fsm import FSM
from drover.server.state_store import StateStore, Tables
from tests.fixtures import mock

SERVICE = ("default", "web")
PARENT = ("default", "nightly")


@pytest.fixture(scope="module")
def sound() -> Tables:
    """A state built by the FSM from the entries a leader would propose."""
    store = StateStore()
    fsm = FSM(store)
    node = mock.node(id="n1")
    web = mock.job(id="web")
    parent = mock.periodic_job(id="nightly")
    children = [mock.periodic_child(parent, mock.NOW + i * mock.MINUTE) for i in range(3)]
    allocs = [mock.alloc(web, node, i, id=f"a{i}") for i in range(4)]
    child_allocs = [mock.alloc(c, node, 0, id=f"c{i}") for i, c in enumerate(children[1:])]
    # One child of each status: its eval still pending (pending); its eval done and its
    # alloc running (running); its eval done and its alloc complete (dead).
    child_evals = [mock.eval_for(children[0])]
    child_evals += [mock.eval_for(c, status=EVAL_STATUS_COMPLETE) for c in children[1:]]
    entries = [
        mock.register_node_entry(node),
        mock.register_job_entry(web, mock.eval_for(web)),
        mock.register_job_entry(parent),
        *(mock.register_job_entry(c, e) for c, e in zip(children, child_evals, strict=True)),
        mock.plan_entry([*allocs, *child_allocs]),
        mock.client_update_entry("a1", ALLOC_CLIENT_RUNNING),
        mock.client_update_entry("a2", ALLOC_CLIENT_COMPLETE),
        mock.client_update_entry("a3", "failed"),
        mock.client_update_entry("c0", ALLOC_CLIENT_RUNNING),
        mock.client_update_entry("c1", ALLOC_CLIENT_COMPLETE),
    ]
    for index, data in enumerate(entries, start=1):
        result = fsm.apply(data, index)
        assert not result.error, f"entry {index}: {result.error}"
    return store.snapshot().tables


def _summary(tables: Tables, key: tuple[str, str]) -> JobSummary:
    summary = tables.job_summaries.get(key)
    assert summary is not None
    return summary


def _with_group(tables: Tables, key: tuple[str, str], group: str, **counters: int) -> Tables:
    summary = _summary(tables, key)
    row = replace(summary.summary.get(group, TaskGroupSummary()), **counters)
    changed = replace(summary, summary={**summary.summary, group: row})
    return replace(tables, job_summaries=tables.job_summaries.set(key, changed))


def _with_children(tables: Tables, key: tuple[str, str], **buckets: int) -> Tables:
    summary = _summary(tables, key)
    changed = replace(summary, children=replace(summary.children or JobChildrenSummary(), **buckets))
    return replace(tables, job_summaries=tables.job_summaries.set(key, changed))


def test_oracle__sound_state__no_problem_and_every_kind_of_counter_in_use(sound: Tables) -> None:
    assert mock.summary_problems(sound) == []
    web = _summary(sound, SERVICE).summary["web"]
    # The state is not trivially sound: each counter the cases below break holds a count.
    assert (web.starting, web.running, web.complete, web.failed) == (1, 1, 1, 1)
    children = _summary(sound, PARENT).children
    assert children is not None and (children.pending, children.running, children.dead) == (1, 1, 1)


@pytest.mark.parametrize(
    ("counters", "expected"),
    [
        ({"running": 2}, "('default', 'web') group 'web': running is 2 in the summary, 1 by recount"),
        ({"starting": 0}, "('default', 'web') group 'web': starting is 0 in the summary, 1 by recount"),
        ({"complete": 2}, "complete is 2 in the summary, 1 by recount"),
        ({"failed": 0}, "failed is 0 in the summary, 1 by recount"),
        ({"lost": 1}, "lost is 1 in the summary, 0 by recount"),
        ({"unknown": 1}, "unknown is 1 in the summary, 0 by recount"),
    ],
    ids=["running", "starting", "complete", "failed", "lost", "unknown"],
)
def test_oracle__one_counter_off_by_one__named(
    sound: Tables, counters: dict[str, int], expected: str
) -> None:
    problems = mock.summary_problems(_with_group(sound, SERVICE, "web", **counters))
    assert len(problems) == 1 and expected in problems[0], problems


def test_oracle__negative_queued__named_although_queued_is_not_recounted(sound: Tables) -> None:
    assert mock.summary_problems(_with_group(sound, SERVICE, "web", queued=3)) == []
    problems = mock.summary_problems(_with_group(sound, SERVICE, "web", queued=-1))
    assert problems == ["('default', 'web') group 'web': queued is negative (-1)"]


def test_oracle__negative_alloc_counter__named_as_negative_and_as_off(sound: Tables) -> None:
    problems = mock.summary_problems(_with_group(sound, SERVICE, "web", lost=-1))
    assert problems == [
        "('default', 'web') group 'web': lost is negative (-1)",
        "('default', 'web') group 'web': lost is -1 in the summary, 0 by recount",
    ]


def test_oracle__counts_in_a_group_the_job_has_no_allocs_in__named(sound: Tables) -> None:
    problems = mock.summary_problems(_with_group(sound, SERVICE, "ghost", running=1))
    assert problems == ["('default', 'web') group 'ghost': running is 1 in the summary, 0 by recount"]


def test_oracle__allocs_of_a_group_missing_from_the_summary__named(sound: Tables) -> None:
    summary = _summary(sound, SERVICE)
    dropped = replace(summary, summary={})
    problems = mock.summary_problems(replace(sound, job_summaries=sound.job_summaries.set(SERVICE, dropped)))
    assert sorted(problems) == sorted(
        f"('default', 'web') group 'web': {name} is 0 in the summary, 1 by recount"
        for name in ("complete", "failed", "running", "starting")
    )


def test_oracle__alloc_with_a_status_no_counter_takes__named(sound: Tables) -> None:
    alloc = sound.allocs["a1"]
    odd = replace(sound, allocs=sound.allocs.set("a1", replace(alloc, client_status="exploded")))
    problems = mock.summary_problems(odd)
    assert "('default', 'web') group 'web': 1 alloc(s) with client status 'exploded'" in problems
    assert "('default', 'web') group 'web': running is 1 in the summary, 0 by recount" in problems


def test_oracle__job_without_a_summary__named(sound: Tables) -> None:
    problems = mock.summary_problems(replace(sound, job_summaries=sound.job_summaries.delete(SERVICE)))
    assert problems == ["('default', 'web'): a job without a summary"]


def test_oracle__summary_without_a_job__named(sound: Tables) -> None:
    ghost = JobSummary(job_id="ghost", namespace="default")
    problems = mock.summary_problems(
        replace(sound, job_summaries=sound.job_summaries.set(("default", "ghost"), ghost))
    )
    assert problems == ["('default', 'ghost'): a summary without a job"]


@pytest.mark.parametrize(
    ("buckets", "expected"),
    [
        ({"pending": 2}, "('default', 'nightly') children: pending is 2 in the summary, 1 by recount"),
        ({"running": 0}, "('default', 'nightly') children: running is 0 in the summary, 1 by recount"),
        ({"dead": 4}, "('default', 'nightly') children: dead is 4 in the summary, 1 by recount"),
    ],
    ids=["pending", "running", "dead"],
)
def test_oracle__children_count_off__named(sound: Tables, buckets: dict[str, int], expected: str) -> None:
    assert mock.summary_problems(_with_children(sound, PARENT, **buckets)) == [expected]


def test_oracle__children_count_off_because_a_child_changed_status__named(sound: Tables) -> None:
    key = next(
        k for k, j in sound.jobs.items() if j.parent_id == "nightly" and j.status == JOB_STATUS_RUNNING
    )
    child = sound.jobs[key]
    moved = replace(sound, jobs=sound.jobs.set(key, replace(child, status=JOB_STATUS_DEAD)))
    assert sorted(mock.summary_problems(moved)) == [
        "('default', 'nightly') children: dead is 1 in the summary, 2 by recount",
        "('default', 'nightly') children: running is 1 in the summary, 0 by recount",
    ]


def test_oracle__children_not_compared__mismatch_ignored_but_negative_still_named(sound: Tables) -> None:
    assert mock.summary_problems(_with_children(sound, PARENT, dead=4), children=False) == []
    problems = mock.summary_problems(_with_children(sound, PARENT, dead=-1), children=False)
    assert problems == ["('default', 'nightly') children: dead is negative (-1)"]
