"""The single requests that used to take a leader down, against a real server process.

Each bomb gets a clear error (or, for a valid but costly request, an answer), the state
does not change on a refusal, and while the bomb goes off a read with a short gRPC
deadline still answers: a count of 2**31-1, a 1 MB node name, the regexp ``^(a+)+$``
against a long attribute, ~300 parked blocking queries, a burst of plans, a request over
the size limit, and a stream of undecodable requests.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any, Final

import grpc
import pytest

from deploy.cluster import LocalCluster, wait_for
from drover.common.grpc_options import MAX_REQUEST_BYTES
from drover.sdk import DroverClient, DroverError
from drover.server.api._limits import MAX_PARKED_PER_CALLER, RATE_LIMITS
from drover.v1 import api_pb2, api_pb2_grpc
from tests.cluster.conftest import wait_settled
from tests.cluster.jobs import service_job
from tests.cluster.nodes import simulated_node

# What "the leader stays responsive" means here: every read made during a bomb answers
# within this gRPC deadline (an attempt that does not is a failure, never retried).
READ_DEADLINE_S: Final = 5.0


class Rig:
    def __init__(self, cluster: LocalCluster) -> None:
        self.cluster = cluster
        self.address = cluster.grpc_addresses[0]
        self.api = DroverClient(cluster.grpc_addresses, retry_deadline=30)
        self.channel = grpc.insecure_channel(self.address)
        self.jobs = api_pb2_grpc.JobsStub(self.channel)
        self.nodes = api_pb2_grpc.NodesStub(self.channel)
        self.operator = api_pb2_grpc.OperatorStub(self.channel)

    def close(self) -> None:
        self.channel.close()
        self.api.close()

    def digest(self) -> tuple[str, int]:
        answer = self.operator.StateDigest(api_pb2.StateDigestRequest(), timeout=READ_DEADLINE_S)
        return answer.digest, answer.applied_index

    def read_answers(self) -> None:
        """One plain read, with the short deadline: raises if the leader does not answer."""
        self.jobs.List(api_pb2.JobListRequest(), timeout=READ_DEADLINE_S)
        self.nodes.List(api_pb2.NodeListRequest(), timeout=READ_DEADLINE_S)

    def refused(self, call: Any, code: grpc.StatusCode, *words: str) -> str:
        """``call()`` fails with ``code``, its message names ``words``, nothing changed."""
        before = self.digest()
        with pytest.raises(grpc.RpcError) as err:
            call()
        got: grpc.StatusCode = err.value.code()  # type: ignore[attr-defined]
        details: str = err.value.details() or ""  # type: ignore[attr-defined]
        assert got == code, f"{got}: {details}"
        for word in words:
            assert word in details, details
        assert len(details) < 1000, details[:200]
        assert self.digest() == before
        self.read_answers()
        return details


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    with LocalCluster(tmp_path_factory.mktemp("hostile"), servers=1) as cluster:
        wait_settled(cluster)
        r = Rig(cluster)
        try:
            yield r
            assert "Traceback" not in cluster.log(0), cluster.log(0)[-3000:]
        finally:
            r.close()


def test_bomb__count_2_31_minus_1__invalid_argument_naming_the_count(rig: Rig) -> None:
    job = service_job("huge", count=2**31 - 1)
    rig.refused(
        lambda: rig.jobs.Register(api_pb2.JobRegisterRequest(job=job), timeout=30),
        grpc.StatusCode.INVALID_ARGUMENT,
        "job.groups[0].count",
        "at most 10000",
    )
    rig.refused(
        lambda: rig.jobs.Plan(api_pb2.JobPlanRequest(job=job), timeout=30),
        grpc.StatusCode.INVALID_ARGUMENT,
        "job.groups[0].count",
    )


def test_bomb__1mb_node_name__invalid_argument_naming_the_name(rig: Rig) -> None:
    node = simulated_node("big-name")
    node.name = "x" * 1_000_000
    rig.refused(
        lambda: rig.nodes.Register(api_pb2.NodeRegisterRequest(node=node), timeout=30),
        grpc.StatusCode.INVALID_ARGUMENT,
        "node.name",
        "at most 128 characters",
    )


def test_bomb__redos_regexp__scheduled_in_linear_time_leader_answers(rig: Rig) -> None:
    node = simulated_node("redos")
    node.attributes["bomb"] = "a" * 4000 + "!"
    rig.api.register_node(node)
    job = service_job("redos", count=1)
    job.constraints.add(attribute="${attr.bomb}", operator="regexp", value="^(a+)+$")

    # The plan runs the scheduler inside the call: with a backtracking engine it would
    # never answer. It answers, and the alloc stays queued (the constraint matches no node).
    plan = rig.jobs.Plan(api_pb2.JobPlanRequest(job=job), timeout=30)
    assert plan.queued["web"] == 1, plan
    eval_id = rig.api.register_job(job).eval_id
    rig.read_answers()

    def evaluated() -> bool:
        rig.read_answers()
        return rig.api.get_eval(eval_id).eval.status not in ("", "pending")

    wait_for(evaluated, 60, 0.2, "the eval of the ReDoS job to be processed")
    assert not [a for a in rig.api.list_allocs(job_id="redos").allocs if a.desired_status == "run"]


def test_bomb__300_parked_blocking_queries__resource_exhausted_past_the_bound(rig: Rig) -> None:
    index = rig.api.list_jobs().meta.index
    blocking = api_pb2.JobListRequest(
        options=api_pb2.QueryOptions(min_index=index + 1_000_000, wait_ns=60 * 10**9)
    )
    calls = [rig.jobs.List.future(blocking, timeout=90) for _ in range(300)]
    try:
        refused = wait_for(
            lambda: (
                [c for c in calls if c.done()]
                if sum(c.done() for c in calls) >= 300 - MAX_PARKED_PER_CALLER
                else None
            ),
            60,
            0.1,
            "the queries past the per-caller bound to be refused",
        )
        assert refused is not None
        for call in refused:
            assert call.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, call.details()
            assert "too many blocking queries" in call.details()
        assert sum(not c.done() for c in calls) == MAX_PARKED_PER_CALLER
        for _ in range(5):
            rig.read_answers()  # the pool keeps threads for plain calls
        rig.api.list_jobs()  # the SDK, too
    finally:
        for call in calls:
            call.cancel()

    # Cancelled queries give their places back within a moment, not at the end of their wait.
    short = api_pb2.JobListRequest(options=api_pb2.QueryOptions(min_index=index + 1_000_000, wait_ns=10**8))

    def all_places_free() -> bool:
        parked = [rig.jobs.List.future(short, timeout=READ_DEADLINE_S) for _ in range(MAX_PARKED_PER_CALLER)]
        return all(c.exception() is None for c in parked)

    wait_for(all_places_free, 30, 0.5, "the cancelled queries' parking places to be given back")


def test_bomb__plan_burst__rate_limited_retry_later_leader_answers(rig: Rig) -> None:
    job = service_job("planned", count=1)
    rate = RATE_LIMITS["Jobs.Plan"]
    codes: list[grpc.StatusCode] = []
    lock = threading.Lock()

    def burst() -> None:
        for _ in range(rate.burst // 2 + 20):
            try:
                rig.jobs.Plan(api_pb2.JobPlanRequest(job=job), timeout=30)
                code = grpc.StatusCode.OK
            except grpc.RpcError as exc:
                code = exc.code()  # type: ignore[attr-defined]
                assert "retry later" in (exc.details() or "")  # type: ignore[attr-defined]
            with lock:
                codes.append(code)

    threads = [threading.Thread(target=burst) for _ in range(4)]
    for thread in threads:
        thread.start()
    rig.read_answers()
    for thread in threads:
        thread.join(120)
    assert set(codes) <= {grpc.StatusCode.OK, grpc.StatusCode.RESOURCE_EXHAUSTED}
    assert codes.count(grpc.StatusCode.OK) >= rate.burst
    assert grpc.StatusCode.RESOURCE_EXHAUSTED in codes
    rig.read_answers()


def test_bomb__request_over_the_size_limit__resource_exhausted(rig: Rig) -> None:
    job = service_job("oversized", count=1)
    job.groups[0].tasks[0].config_json = '{"a": "' + "x" * MAX_REQUEST_BYTES + '"}'
    rig.refused(
        lambda: rig.jobs.Register(api_pb2.JobRegisterRequest(job=job), timeout=30),
        grpc.StatusCode.RESOURCE_EXHAUSTED,
    )


def test_bomb__undecodable_requests__invalid_argument_one_warn_no_traceback(rig: Rig) -> None:
    raw = rig.channel.unary_unary(
        "/drover.v1.Jobs/Register", request_serializer=lambda b: b, response_deserializer=lambda b: b
    )
    for i in range(200):
        garbage = bytes([0x0A, 0x05, 0xFF, 0xFE, 0xFD, 0xFC, i % 256])  # field 1: not a Job
        with pytest.raises(grpc.RpcError) as err:
            raw(garbage, timeout=READ_DEADLINE_S)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT  # type: ignore[attr-defined]
    rig.read_answers()
    log = rig.cluster.log(0)
    assert 1 <= log.count("api.undecodable_request") <= 3
    assert "Traceback" not in log and "Exception deserializing" not in log


def test_bomb__job_register_sdk__retries_past_a_rate_limit(rig: Rig) -> None:
    # The SDK treats "retry later" as a pause, not a failure: a plan after the burst
    # above succeeds through it.
    with DroverClient(rig.address, retry_deadline=60) as api:
        assert api.plan_job(service_job("after-burst", count=1)) is not None


def test_bomb__error_messages__never_quote_the_whole_input(rig: Rig) -> None:
    job = service_job("quote", count=1)
    job.type = "t" * 100_000
    details = rig.refused(
        lambda: rig.jobs.Register(api_pb2.JobRegisterRequest(job=job), timeout=30),
        grpc.StatusCode.INVALID_ARGUMENT,
        "job.type",
    )
    assert "t" * 200 not in details


def test_no_secret_oracle__unknown_node_watch__permission_denied(rig: Rig) -> None:
    with pytest.raises(DroverError) as err:
        next(iter(rig.api.watch_client_allocs("nobody", "guess")))
    assert err.value.code == grpc.StatusCode.PERMISSION_DENIED
