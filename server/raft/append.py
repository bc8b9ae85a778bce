"""How a follower takes an append_entries message: Raft's rule, which pysyncobj 0.3.17 skips.

Raft (Figure 2, AppendEntries receiver, steps 3-5): *if an existing entry conflicts with a
new one (same index, different term), delete it and all that follow; append any new entries
not already in the log; set commitIndex = min(leaderCommit, index of last new entry).*
pysyncobj instead deletes everything after ``prevLogIdx`` whenever its log is longer, and
sets its commit index from its own last entry. Two failures follow, both seen in the chaos
suite:

* A stale or repeated message (a server paused with SIGSTOP drains its socket; a leader
  re-sends after a reset) makes a follower truncate entries it has already applied and
  append them again: pysyncobj then logs "state machine may have diverged", and an entry it
  had acknowledged is briefly missing, which Raft's commit rule does not allow.
* A deposed leader with a long uncommitted tail answers each conflicting message with its own
  last index, so replies to the leader's later in-flight batches push the leader's nextIndex
  back up: it walks back one entry at a time and can stay behind for minutes.

:func:`plan_append` decides, from the follower's log and the message alone, what the
follower does instead; ``drover.server.raft.patches`` carries it out around pysyncobj's handler.
Pure, so it is tested exhaustively against a model log (tests/unit/test_raft_append.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

# A pysyncobj log entry: (command bytes, index, term).
Entry = tuple[Any, int, int]


@dataclass(frozen=True, slots=True)
class AppendPlan:
    """What the follower does with one append_entries message.

    ``delete_from``: drop the follower's own entries from this index on, before pysyncobj
    sees the message (they conflict with the leader's and are provably uncommitted).
    ``prev_index``/``prev_term``/``entries``: the message pysyncobj handles, with the new
    entries the follower already holds removed from its front. ``keep_tail``: every new entry
    is already held and the follower's log goes further; pysyncobj must not delete that tail
    (a later message decides about it). ``commit_limit``: the commit index the message may
    raise the follower's to (the index of its last new entry). ``hint``: after pysyncobj's
    own reply, tell the leader to retry from this index (the start of the conflicting term).
    """

    prev_index: int
    prev_term: int
    entries: Sequence[Entry]
    commit_limit: int
    keep_tail: bool = False
    delete_from: int | None = None
    hint: int | None = None


def plan_append(
    *,
    prev_index: int,
    prev_term: int,
    entries: Sequence[Entry],
    first_index: int,
    last_index: int,
    term_at: Callable[[int], int],
    applied_floor: int,
) -> AppendPlan:
    """Decide how to apply an append_entries message to a follower's log.

    ``first_index``..``last_index`` is the span the follower holds (``term_at`` reads a term
    in it); ``applied_floor`` is the highest index the follower has committed or applied:
    nothing at or below it is ever deleted here.
    """
    last_new = entries[-1][1] if entries else prev_index
    unchanged = AppendPlan(prev_index, prev_term, entries, commit_limit=last_new)
    if prev_index < first_index or prev_index > last_index:
        return unchanged  # pysyncobj answers "reset to my end", which is right here
    own_prev_term = term_at(prev_index)
    if own_prev_term != prev_term:
        if prev_index <= applied_floor:
            return unchanged  # a real divergence: let pysyncobj report it, never hide it
        # Our entry at prev_index conflicts with the leader's, so it and everything after it
        # can never be committed. Drop them now, so later replies cannot point the leader
        # back past them, and send the leader to the start of the conflicting term.
        hint = prev_index
        while hint - 1 > applied_floor and hint - 1 >= first_index and term_at(hint - 1) == own_prev_term:
            hint -= 1
        return AppendPlan(
            prev_index,
            prev_term,
            entries,
            commit_limit=last_new,
            delete_from=prev_index,
            hint=hint if hint < prev_index else None,
        )
    held = 0
    for _command, index, term in entries:
        if index > last_index or term_at(index) != term:
            break
        held += 1
    if held:
        prev_index, prev_term = entries[held - 1][1], entries[held - 1][2]
        entries = entries[held:]
    keep_tail = not entries and prev_index < last_index
    return AppendPlan(prev_index, prev_term, entries, commit_limit=last_new, keep_tail=keep_tail)
