"""The chaos suite: a workload, a nemesis, a history and a checker (Jepsen's shape).

* ``workload.py`` drives real server processes through the SDK (jobs of every type,
  updates, scaling, stops, purges, dispatches, forced periodic launches, node drains, and
  simulated clients reporting alloc statuses) and records every request in a ``History``
  (``history.py``) with its outcome and acknowledged raft index;
* ``clients.py`` adds real client agent processes, each behind its own fault-injecting
  proxies, running a raw_exec job whose tasks are observed down to the OS process;
* ``nemesis.py`` plans a reproducible fault schedule from a seed (leader and follower
  SIGKILLs, long SIGSTOP pauses, graceful restarts from the data dirs, raft partitions,
  client connection cuts, plan disagreements) and runs it against a
  ``deploy.cluster.LocalCluster``, recording a timeline; ``partition.py`` and
  ``disagreement.py`` are the hooks it controls inside the servers, installed by the
  test-only agent module ``fault_agent.py``;
* ``checker.py`` runs after the nemesis stops and the cluster settles, and decides each
  invariant of ``docs/design.md`` (its "Invariants" section) pass or fail;
* ``report.py`` writes ``bench-results/chaos-<UTC>.json`` (and a PNG timeline when
  matplotlib is installed);
* ``run.py`` ties them together: ``python -m tests.chaos.run --servers 3 --minutes 2 --seed 7``.
"""
