"""The C1M bench's pure parts (tests/bench/c1m.py): which sizes fit, the order jobs are
registered in, what counts as placed, and the placement rate from samples."""

from __future__ import annotations

import pytest

from drover.v1 import api_pb2, structs_pb2
from tests.bench.c1m import C1MConfig, jobs_in_order, placed_in, placement_figures


def test_config__the_issues_size_fits_and_too_many_allocs_do_not() -> None:
    C1MConfig().check()
    assert C1MConfig().expected_allocs() == 200 * 500 + 20 * 5_000
    with pytest.raises(ValueError, match="system jobs fit"):
        C1MConfig(system_jobs=25).check()
    with pytest.raises(ValueError, match="exceed"):
        C1MConfig(nodes=100, service_jobs=10, count=500).check()


def test_jobs_in_order__system_jobs_spread_among_the_service_jobs() -> None:
    jobs = jobs_in_order(C1MConfig(service_jobs=6, count=3, system_jobs=2))
    kinds = [j.type for j in jobs]
    assert kinds.count("service") == 6 and kinds.count("system") == 2
    assert kinds[0] == "service" and kinds[-1] == "service"
    assert [j.groups[0].count for j in jobs if j.type == "service"] == [3] * 6


def test_placed_in__counts_every_bucket_but_queued_of_the_bench_jobs_only() -> None:
    response = api_pb2.JobListResponse(
        summaries=[
            structs_pb2.JobSummary(
                job_id="c1m-service-0000",
                summary={"web": structs_pb2.TaskGroupSummary(queued=2, starting=3, running=4, lost=1)},
            ),
            structs_pb2.JobSummary(job_id="other", summary={"web": structs_pb2.TaskGroupSummary(running=50)}),
        ]
    )
    assert placed_in(response) == (8, 4, 2)


def test_placement_figures__done_at_the_first_sample_with_all_placed_and_none_queued() -> None:
    samples = [
        (10.0, 0, 0, 100),
        (11.0, 50, 0, 50),
        (12.0, 100, 10, 5),
        (14.0, 100, 20, 0),
        (15.0, 100, 90, 0),
    ]
    figures = placement_figures(samples, started=10.0, expected=100)
    assert figures["complete"] and figures["seconds"] == 4.0
    assert figures["placements_per_s"] == 25.0
    assert figures["first_alloc_s"] == 1.0


def test_placement_figures__an_unfinished_run_reports_how_far_it_got() -> None:
    figures = placement_figures([(0.0, 0, 0, 100), (5.0, 40, 0, 60)], started=0.0, expected=100)
    assert not figures["complete"]
    assert (figures["placed"], figures["queued"], figures["placements_per_s"]) == (40, 60, 8.0)
