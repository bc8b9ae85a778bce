"""server/raft/seal.py: the GCM session seal as pure functions (no connection; the frame
guard's tests in tests/unit/test_raft_frames.py run it on a real one)."""

from __future__ import annotations

import os

import pytest

from drover.server.raft import seal

KEY = seal.cluster_key("the-cluster-key-for-these-tests")


def test_session__opens_what_the_same_session_sealed_in_order() -> None:
    session_key = seal.with_offer(os.urandom(32))
    sender, receiver = seal.Session(KEY, session_key), seal.Session(KEY, session_key)

    frames = [sender.seal(f"frame {i}".encode()) for i in range(3)]

    assert [receiver.open(f) for f in frames] == [b"frame 0", b"frame 1", b"frame 2"]
    assert all(seal.is_sealed(f) for f in frames)


def test_session__a_frame_opened_before__or_an_older_one__is_refused() -> None:
    session_key = os.urandom(43)
    sender, receiver = seal.Session(KEY, session_key), seal.Session(KEY, session_key)
    first, second = sender.seal(b"one"), sender.seal(b"two")
    receiver.open(second)

    for frame in (second, first):
        with pytest.raises(seal.SealError, match="replayed or reordered"):
            receiver.open(frame)


@pytest.mark.parametrize("change", ["other-session", "other-cluster", "tampered", "truncated"])
def test_session__a_frame_not_sealed_for_this_session_is_refused(change: str) -> None:
    session_key = os.urandom(43)
    frame = seal.Session(KEY, session_key).seal(b"payload")
    receiver = seal.Session(KEY, session_key)
    if change == "other-session":
        receiver = seal.Session(KEY, os.urandom(43))
    elif change == "other-cluster":
        receiver = seal.Session(seal.cluster_key("another key"), session_key)
    elif change == "tampered":
        frame = frame[:-1] + bytes([frame[-1] ^ 1])
    else:
        frame = frame[:5]

    with pytest.raises(seal.SealError, match="not sealed with this cluster's raft key"):
        receiver.open(frame)


def test_offer__only_a_key_of_the_offered_shape_counts() -> None:
    key = os.urandom(seal.SESSION_KEY_BYTES)

    assert seal.offered(seal.with_offer(key))
    assert not seal.offered(key)
    assert not seal.offered(key + seal.OFFER + b"x")
    assert not seal.offered(None)


def test_cluster_key__depends_on_the_raft_key_and_not_on_its_type() -> None:
    assert seal.cluster_key("k1") == seal.cluster_key(b"k1")
    assert seal.cluster_key("k1") != seal.cluster_key("k2")
    assert len(seal.cluster_key("k1")) == 32
