"""The cancel rule: the job's owner or a configured admin, nobody else."""

from __future__ import annotations

from tpujobs.domain.access import may_cancel

ADMINS = ("root@example.com",)


def test_the_owner_may_cancel_their_job() -> None:
    """The owner named in the job may cancel it, with or without admins configured."""
    assert may_cancel("ada@example.com", "ada@example.com", ())
    assert may_cancel("ada@example.com", "ada@example.com", ADMINS)


def test_an_admin_may_cancel_anyone_s_job() -> None:
    """A caller listed in admins may cancel a job they do not own."""
    assert may_cancel("ada@example.com", "root@example.com", ADMINS)


def test_another_user_may_not_cancel() -> None:
    """Neither owner nor admin: refused."""
    assert not may_cancel("ada@example.com", "eve@example.com", ADMINS)


def test_the_comparison_is_exact() -> None:
    """No prefix, substring or case folding lets a near-identity through."""
    assert not may_cancel("ada@example.com", "ada@example.co", ADMINS)
    assert not may_cancel("ada@example.com", "ADA@example.com", ADMINS)
    assert not may_cancel("ada@example.com", "root@example.com.evil", ADMINS)


def test_an_empty_caller_is_nobody() -> None:
    """An empty identity is refused even for a job whose owner is empty or among empty admins."""
    assert not may_cancel("", "", ("",))
    assert not may_cancel("ada@example.com", "", ADMINS)
