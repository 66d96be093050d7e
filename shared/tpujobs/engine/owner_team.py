"""Whose share a job's (or a warm pool's) chips count in: its owner's team (`domain.teams`)."""

from __future__ import annotations

from tpujobs.engine.ports import AccessPolicyReader, Teams


def owner_team(teams: Teams | None, access: AccessPolicyReader | None, owner: str, *, owner_verified: bool) -> str:
    """The owner's team in config/teams, for a verified owner; for a topic's claimed owner only
    where config/policies trusts topic owners: a claim must not draw on another team's share.
    "" for none."""
    if teams is None:
        return ""
    book = teams.teams()
    if not book.teams:
        return ""
    if not owner_verified and not (access is not None and access.policies().trust_topic_owners):
        return ""
    return book.team_of(owner)
