"""drover.common.secrets: hashing and comparing bearer secrets (pure)."""

from __future__ import annotations

from drover.common.secrets import hash_secret, new_secret, secret_matches


def test_hash__stable_and_not_the_secret() -> None:
    secret = new_secret()
    assert hash_secret(secret) == hash_secret(secret)
    assert secret not in hash_secret(secret)
    assert hash_secret(secret).startswith("sha256:")


def test_matches__only_its_own_secret() -> None:
    a, b = new_secret(), new_secret()
    assert a != b
    assert secret_matches(a, hash_secret(a))
    assert not secret_matches(b, hash_secret(a))


def test_matches__empty_never() -> None:
    assert not secret_matches("", hash_secret(""))
    assert not secret_matches("x", "")
