"""Garbage collection, as Nomad's core scheduler does it (nomad/core_sched.go).

``select`` is the decision: a pure function of a snapshot, the leader's clock reading and
the thresholds, returning what may be collected (unit tested per object kind and
threshold). ``runner`` is the shell: the leader's thread that selects every interval (and
at once for ``drover system gc``) and proposes the result as ``ENTRY_TYPE_GC`` raft entries
of bounded size; the FSM deletes (server/fsm.py ``apply_gc``), so every server forgets the
same objects at the same index and no apply reads a clock.
"""
