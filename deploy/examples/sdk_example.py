"""Scripting drover from Python: run a job, wait until it runs, stop it, read what happened.

Against a dev agent (``drover agent -dev`` in another terminal)::

    python deploy/examples/sdk_example.py                      # the job in sdk-example.hcl
    DROVER_ADDR=10.0.0.1:4646,10.0.0.2:4646 python deploy/examples/sdk_example.py my-job.hcl

In order, it shows: reading a job file as ``drover job run`` does (``parse_job_file``,
every mistake reported before any call); registering it; waiting with a blocking query
until every copy runs (``Client.watch_job_summary``: one answer each time the summary
changes, no polling); the allocations; stopping the job; and the job's events from the
index its registration was written at (``Client.stream_events``). Every failure is one
:class:`drover.sdk.DroverError` (a gRPC status code and the server's message) or, for
the file, a :class:`drover.sdk.JobFileError`; either is printed as one ``Error:`` line
and the script exits 1.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from drover.sdk import Client, DroverError, JobFileError, parse_job_file
from drover.v1 import structs_pb2

DEFAULT_JOB_FILE = Path(__file__).with_name("sdk-example.hcl")
RUNNING_DEADLINE_S = 60.0
# Each blocking query waits at most this long on the server: how late the deadline is seen.
QUERY_WAIT_NS = 5 * 1_000_000_000


def wait_until_running(client: Client, job: structs_pb2.Job) -> int:
    """Block until every alloc the job asks for runs; the number running."""
    wanted = sum(group.count for group in job.groups)
    for answer in client.watch_job_summary(job.id, wait_ns=QUERY_WAIT_NS, timeout=RUNNING_DEADLINE_S):
        running = sum(group.running for group in answer.summary.summary.values())
        print(f"index {answer.meta.index}: {running} of {wanted} running")
        if running >= wanted:
            return running
    raise TimeoutError(f"{job.id}: not every alloc running after {RUNNING_DEADLINE_S:g}s")


def run(client: Client, job: structs_pb2.Job) -> None:
    registered = client.register_job(job)
    print(f"registered {job.id}: evaluation {registered.eval_id} at index {registered.meta.index}")
    wait_until_running(client, job)
    for alloc in client.list_allocs(job_id=job.id).allocs:
        print(f"alloc {alloc.id[:8]} on node {alloc.node_id[:8]}: {alloc.client_status}")

    stopped = client.deregister_job(job.id)
    print(f"stopped {job.id} at index {stopped.meta.index}")
    # Every event of the job from its registration on, up to and including the stop.
    for event in client.stream_events([f"Job:{job.id}"], index=registered.meta.index):
        print(f"event {event.index} {event.topic} {event.type} {event.key}")
        if event.type == "JobDeregistered":
            break


def main(argv: list[str]) -> int:
    path = argv[1] if len(argv) > 1 else str(DEFAULT_JOB_FILE)
    address = os.environ.get("DROVER_ADDR", "127.0.0.1:4646")
    try:
        job = parse_job_file(path)
        with Client(address, token=os.environ.get("DROVER_TOKEN")) as client:
            run(client, job)
    except (DroverError, JobFileError, OSError) as exc:  # OSError: the file, or TimeoutError
        print(f"Error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
