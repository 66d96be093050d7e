"""`domain.access.topic_control_refusal`: what a tpujobs-control claim may act on, for every
kind of owner and claimant, with claims trusted or not; and a pool document that predates
`owner_verified`, which counts as the jobs API's (out of a claim's reach)."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from tpujobs.adapters.firestore_warm_pools import pool_from_document, pool_to_document
from tpujobs.domain import pools
from tpujobs.domain.access import AccessPolicies, topic_control_refusal

ADA, EVE, ADMIN = "ada@example.com", "eve@example.com", "root@example.com"


def refusal(claimed: str, *, owner_verified: bool, trust: bool) -> str | None:
    return topic_control_refusal(
        "cancel", "job train-1", owner=ADA, owner_verified=owner_verified, claimed=claimed, admins=(ADMIN,),
        policies=AccessPolicies(trust_topic_owners=trust),
    )  # fmt: skip


@pytest.mark.parametrize(
    ("claimed", "owner_verified", "trust", "allowed"),
    [
        (ADA, False, False, True),  # a claim acts on what the same claim owns
        (ADA, True, False, False),  # never on what a verified principal owns
        (ADMIN, False, False, False),  # a claimed admin is a claim
        (ADMIN, True, False, False),
        (EVE, False, False, False),  # a stranger never
        (EVE, True, True, False),
        (ADA, True, True, True),  # trusted: the owner or an admin, as through the API
        (ADMIN, True, True, True),
        (ADMIN, False, True, True),
    ],
)
def test_a_claim_acts_only_on_what_a_claim_owns_unless_claims_are_trusted(claimed, owner_verified, trust, allowed):
    """Each combination of claimant, owner and setting, and whether the topic may act."""
    assert (refusal(claimed, owner_verified=owner_verified, trust=trust) is None) is allowed


def test_the_refusal_names_the_owner_and_both_ways_out():
    """A verified owner's job: the sentence says why and what to do (the jobs API, or the setting)."""
    reason = refusal(ADA, owner_verified=True, trust=False)
    assert reason is not None and "verified principal (ada@example.com)" in reason and "may not cancel it" in reason
    assert "TPUJOBS_API_URL" in reason and "trust_topic_owners in config/policies" in reason


def test_a_pool_keeps_whether_its_owner_was_verified_and_older_documents_count_as_verified():
    """Written and read back as made; a document without the field is the API's, out of a claim's reach."""
    request, _ = pools.parse_pool_request({"name": "demo", "owner": ADA, "accelerator_type": "v4-8"}, "us-central2-b")
    claimed = pools.new_pool(request, datetime(2026, 1, 1, tzinfo=timezone.utc), owner_verified=False)
    document = pool_to_document(claimed)
    assert pool_from_document(document).owner_verified is False
    del document["owner_verified"]
    assert pool_from_document(document).owner_verified is True
