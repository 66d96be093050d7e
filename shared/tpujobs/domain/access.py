"""Who may do what to a job: one rule each, shared by the HTTP API and the topics.

Pure on purpose: the caller's identity is established at the edge (a verified ID token,
the local stack's header, a control message's `owner`), and only then compared here.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

from tpujobs.domain.spec import JobSpec


def may_cancel(owner: str, caller: str, admins: Collection[str]) -> bool:
    """Whether `caller` may cancel a job of `owner`: its owner, or a configured admin.

    Exact comparison, as the job stores `owner` as given; an empty caller is nobody, even
    for a job whose owner is empty.
    """
    if not caller:
        return False
    return caller == owner or caller in admins


@dataclass(frozen=True)
class AccessPolicies:
    """What admins allowed, as `config/policies`, `config/groups` and `config/service_accounts`
    say (each a Firestore document an admin edits in the console).

    Members are e-mail addresses or `group:NAME`, a group of `config/groups` (tpujobs' own
    groups: checking Google Groups would need the Cloud Identity API and a domain admin).
    """

    high_priority: tuple[str, ...] = ()  # may submit priority `high` and `very-high`
    reserved_capacity: tuple[str, ...] = ()  # may submit capacity `reserved`
    pools: tuple[str, ...] = ()  # may create warm pools (`tpujobs pool create`), and manage their own
    # The topic path's `owner` is a claim nobody checked; only with this does it count for the
    # two lists above and for service accounts. Off unless an admin turns it on.
    trust_topic_owners: bool = False
    groups: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    # owner or `group:NAME` -> the service accounts its jobs may run as
    service_accounts: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    def members(self, who: str) -> frozenset[str]:
        """`who` and every `group:NAME` it belongs to: what a list entry may name."""
        return frozenset({who, *(f"group:{name}" for name, people in self.groups.items() if who in people)})


API_INSTEAD = (
    "use the jobs API (the tpujobs CLI with TPUJOBS_API_URL set), or ask an admin to set trust_topic_owners "
    "in config/policies"
)


def topic_control_refusal(
    action: str, what: str, *, owner: str, owner_verified: bool, claimed: str, admins: Collection[str],
    policies: AccessPolicies,
) -> str | None:  # fmt: skip
    """Why a tpujobs-control message, whose `owner` (`claimed`) nobody checked, may not `action`
    `what` (a job or a pool of `owner`), or None.

    Anyone who may publish there can claim any owner, so by default a claim acts only on what a
    claim owns: never on what a verified principal (the jobs API's caller) owns, and a claimed
    admin is a claim too. Only `trust_topic_owners` makes the claim count as the API's caller does.
    """
    if not may_cancel(owner, claimed, admins):
        return f"{claimed} may not {action} {what}: only its owner or an admin may"
    if policies.trust_topic_owners:
        return None
    if owner_verified:
        return (
            f"{what} is owned by a verified principal ({owner}): tpujobs-control carries only a claimed owner, "
            f"so it may not {action} it; {API_INSTEAD}"
        )
    if claimed != owner:
        return (
            f"{what} belongs to {owner}: on tpujobs-control {claimed} is only a claimed admin, "
            f"so it may not {action} it; {API_INSTEAD}"
        )
    return None


PRIVILEGED_PRIORITIES = frozenset({"high", "very-high"})


def submission_refusal(
    spec: JobSpec, *, owner_verified: bool, admins: Collection[str], policies: AccessPolicies
) -> str | None:
    """Why this owner may not submit this spec, or None.

    Priorities `high` and `very-high` (they evict others), `reserved` capacity and a
    `service_account` need an owner who is an admin or whom the policies allow, and that
    owner must be verified (the jobs API) unless the policies trust the topic's claim: an
    admin named by a topic message is only a claim as well.
    """
    owner = spec.owner
    wants = []
    if spec.priority in PRIVILEGED_PRIORITIES:
        wants.append((f"priority {spec.priority!r}", policies.high_priority, "high_priority"))
    if spec.capacity == "reserved":
        wants.append(("reserved capacity", policies.reserved_capacity, "reserved_capacity"))
    if spec.service_account:
        allowed = tuple(
            member for member, accounts in policies.service_accounts.items() if spec.service_account in accounts
        )
        wants.append((f"service account {spec.service_account}", allowed, "config/service_accounts"))
    if not wants:
        return None
    what, _, _ = wants[0]
    if not owner_verified and not policies.trust_topic_owners:  # a claimed admin is a claim too
        return (
            f"{what} needs a verified owner: submit through the jobs API (tpujobs submit with "
            "TPUJOBS_API_URL), or ask an admin to set trust_topic_owners in config/policies"
        )
    if owner in admins:
        return None
    mine = policies.members(owner)
    for what, allowed, where in wants:
        if not mine & set(allowed):
            return f"{owner} may not use {what}: an admin allows it in {where}"
    return None
