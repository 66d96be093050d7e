"""Who may submit what: privileged priority, reserved capacity and a service account need an
owner whom config/policies (and config/groups, config/service_accounts) allow, and verified
unless the policies trust the topic's claim (`domain.access.submission_refusal`)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tpujobs.domain.access import AccessPolicies, submission_refusal
from tpujobs.domain.spec import OWNER_PATTERN, JobSpec, parse_spec

OWNER = "ada@example.com"
ADMIN = "root@example.com"
ACCOUNT = "ada-train@research-project.iam.gserviceaccount.com"
OTHER_ACCOUNT = "bob-train@research-project.iam.gserviceaccount.com"

# Each privilege as the spec fields that ask for it, with where the policies allow it.
PRIVILEGES: dict[str, dict[str, Any]] = {
    "high": {"priority": "high"},
    "very-high": {"priority": "very-high"},
    "reserved": {"capacity": "reserved", "reservation": "research-v4"},
    "service-account": {"service_account": ACCOUNT},
}
WHERE = {
    "high": "high_priority",
    "very-high": "high_priority",
    "reserved": "reserved_capacity",
    "service-account": "config/service_accounts",
}
UNPRIVILEGED = [
    {"priority": priority, "capacity": capacity}
    for priority in ("very-low", "low", "medium")
    for capacity in ("on-demand", "spot")
]


def a_spec(owner: str = OWNER, **changes: Any) -> JobSpec:
    spec = {
        "job_id": "train-1",
        "name": "train",
        "owner": owner,
        "accelerator_type": "v4-16",
        "command": "python train.py",
    }
    spec.update(changes)
    return parse_spec(spec)


def allowing(*who: str, **extra: Any) -> AccessPolicies:
    """Policies that list `who` for every privilege (priority, reservations, ACCOUNT)."""
    return AccessPolicies(
        high_priority=who,
        reserved_capacity=who,
        service_accounts={member: (ACCOUNT,) for member in who},
        **extra,
    )


class Untouchable:
    """Policies or admins that fail the test when anything reads them."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"consulted .{name} for a spec that asks no privilege")

    def __contains__(self, item: object) -> bool:
        raise AssertionError(f"consulted admins for {item!r} for a spec that asks no privilege")

    def __iter__(self) -> Any:
        raise AssertionError("iterated over admins for a spec that asks no privilege")


def refusal(spec: JobSpec, policies: AccessPolicies, *, verified: bool, admins=()) -> str | None:
    return submission_refusal(spec, owner_verified=verified, admins=admins, policies=policies)


owners = st.from_regex(OWNER_PATTERN, fullmatch=True)
member_lists = st.lists(st.emails(), max_size=4).map(tuple)


@pytest.mark.parametrize("fields", UNPRIVILEGED, ids=lambda f: f"{f['priority']}-{f['capacity']}")
@given(owner=owners, verified=st.booleans(), trust=st.booleans(), listed=member_lists)
def test_a_spec_asking_no_privilege_is_allowed_for_anyone_on_any_path(
    fields: dict[str, str], owner: str, verified: bool, trust: bool, listed: tuple[str, ...]
) -> None:
    """No high priority, no reservation, no service account: None, verified or not, listed or not."""
    policies = AccessPolicies(high_priority=listed, reserved_capacity=listed, trust_topic_owners=trust)
    assert refusal(a_spec(owner, **fields), policies, verified=verified, admins=listed) is None


@pytest.mark.parametrize("fields", UNPRIVILEGED, ids=lambda f: f"{f['priority']}-{f['capacity']}")
def test_a_spec_asking_no_privilege_never_consults_policies_or_admins(
    fields: dict[str, str],
) -> None:
    """Medium (or lower) priority, on-demand or spot, no service account: nothing is read at all."""
    nothing: Any = Untouchable()
    spec = a_spec(**fields)
    assert submission_refusal(spec, owner_verified=False, admins=nothing, policies=nothing) is None
    assert submission_refusal(spec, owner_verified=True, admins=nothing, policies=nothing) is None


@pytest.mark.parametrize("privilege", PRIVILEGES)
def test_each_privilege_is_refused_for_an_unverified_owner_with_a_way_forward(
    privilege: str,
) -> None:
    """Even a listed owner, on the topic with trust off, is told to use the jobs API or trust_topic_owners."""
    reason = refusal(a_spec(**PRIVILEGES[privilege]), allowing(OWNER), verified=False)
    assert reason is not None
    assert "verified owner" in reason
    assert "jobs API" in reason and "TPUJOBS_API_URL" in reason
    assert "trust_topic_owners" in reason and "config/policies" in reason


@pytest.mark.parametrize("privilege", PRIVILEGES)
def test_each_privilege_is_allowed_for_a_verified_owner_listed_by_email(privilege: str) -> None:
    """An owner whose e-mail is in the privilege's list, proved by the jobs API, may use it."""
    assert refusal(a_spec(**PRIVILEGES[privilege]), allowing(OWNER), verified=True) is None


@pytest.mark.parametrize("privilege", PRIVILEGES)
def test_each_privilege_is_allowed_through_a_group_of_config_groups(privilege: str) -> None:
    """A list naming `group:NAME` allows every verified member of NAME in config/groups."""
    policies = allowing("group:research", groups={"research": ("bob@example.com", OWNER)})
    assert refusal(a_spec(**PRIVILEGES[privilege]), policies, verified=True) is None


@pytest.mark.parametrize("privilege", PRIVILEGES)
def test_a_group_the_owner_is_not_in_allows_nothing(privilege: str) -> None:
    """`group:NAME` counts only for members of NAME; a group missing from config/groups has none."""
    for groups in ({"research": ("bob@example.com",)}, {}, {"ops": (OWNER,)}):
        policies = allowing("group:research", groups=groups)
        assert refusal(a_spec(**PRIVILEGES[privilege]), policies, verified=True) is not None


@pytest.mark.parametrize("privilege", PRIVILEGES)
def test_a_verified_owner_not_listed_is_refused_with_where_an_admin_allows_it(
    privilege: str,
) -> None:
    """The sentence names the owner, what was asked and the list or document that would allow it."""
    reason = refusal(a_spec(**PRIVILEGES[privilege]), allowing("bob@example.com"), verified=True)
    assert reason is not None
    assert reason.startswith(f"{OWNER} may not use ")
    assert f"an admin allows it in {WHERE[privilege]}" in reason


def test_each_privilege_is_checked_against_its_own_list() -> None:
    """Being listed for high priority allows no reservation, and the other way round."""
    priority_only = AccessPolicies(high_priority=(OWNER,))
    reserved_only = AccessPolicies(reserved_capacity=(OWNER,))
    both = {"priority": "very-high", "capacity": "reserved", "reservation": "research-v4"}
    assert refusal(a_spec(**both), priority_only, verified=True) == (
        f"{OWNER} may not use reserved capacity: an admin allows it in reserved_capacity"
    )
    assert refusal(a_spec(**both), reserved_only, verified=True) == (
        f"{OWNER} may not use priority 'very-high': an admin allows it in high_priority"
    )
    assert refusal(a_spec(**both), allowing(OWNER), verified=True) is None


@pytest.mark.parametrize("privilege", PRIVILEGES)
@pytest.mark.parametrize("trust", [False, True])
def test_a_verified_admin_is_always_allowed_even_when_listed_nowhere(privilege: str, trust: bool) -> None:
    """An admin (settings.admins) proved by the jobs API needs no entry in any policy list."""
    spec = a_spec(ADMIN, **PRIVILEGES[privilege])
    assert refusal(spec, AccessPolicies(trust_topic_owners=trust), verified=True, admins=(ADMIN,)) is None


@pytest.mark.parametrize("privilege", PRIVILEGES)
def test_an_admin_named_on_a_trusted_topic_is_allowed_though_listed_nowhere(privilege: str) -> None:
    """With trust_topic_owners, a topic message's admin owner counts as that admin."""
    spec = a_spec(ADMIN, **PRIVILEGES[privilege])
    policies = AccessPolicies(trust_topic_owners=True)
    assert refusal(spec, policies, verified=False, admins=(ADMIN,)) is None


@pytest.mark.parametrize("privilege", PRIVILEGES)
def test_an_unverified_claim_to_be_an_admin_grants_nothing_while_the_topic_is_untrusted(
    privilege: str,
) -> None:
    """An `owner` nobody checked is only a claim: naming an admin on an untrusted topic is refused."""
    spec = a_spec(ADMIN, **PRIVILEGES[privilege])
    reason = refusal(spec, AccessPolicies(), verified=False, admins=(ADMIN,))
    assert reason is not None and "verified owner" in reason


@pytest.mark.parametrize("privilege", PRIVILEGES)
def test_trust_topic_owners_lets_an_unverified_listed_owner_through(privilege: str) -> None:
    """With trust_topic_owners, the topic's owner claim counts as if it were verified."""
    policies = allowing(OWNER, trust_topic_owners=True)
    assert refusal(a_spec(**PRIVILEGES[privilege]), policies, verified=False) is None


@pytest.mark.parametrize("privilege", PRIVILEGES)
def test_trust_topic_owners_still_refuses_an_unlisted_owner(privilege: str) -> None:
    """Trust makes the claim count, not allowed: an owner in no list is refused with where to ask."""
    policies = allowing("bob@example.com", trust_topic_owners=True)
    reason = refusal(a_spec(**PRIVILEGES[privilege]), policies, verified=False)
    assert reason is not None
    assert reason.startswith(f"{OWNER} may not use ")
    assert WHERE[privilege] in reason


def test_a_service_account_listed_for_someone_else_is_refused() -> None:
    """Bob's account is Bob's: Ada, verified and allowed another account, may not run as it."""
    policies = AccessPolicies(service_accounts={"bob@example.com": (OTHER_ACCOUNT,), OWNER: (ACCOUNT,)})
    reason = refusal(a_spec(service_account=OTHER_ACCOUNT), policies, verified=True)
    assert reason == (
        f"{OWNER} may not use service account {OTHER_ACCOUNT}: an admin allows it in config/service_accounts"
    )
    assert refusal(a_spec(service_account=ACCOUNT), policies, verified=True) is None


def test_a_service_account_listed_for_a_group_of_someone_else_is_refused() -> None:
    """An account allowed to `group:ops` is refused to an owner who is not in ops."""
    policies = AccessPolicies(
        groups={"ops": ("bob@example.com",), "research": (OWNER,)},
        service_accounts={"group:ops": (OTHER_ACCOUNT,)},
    )
    assert refusal(a_spec(service_account=OTHER_ACCOUNT), policies, verified=True) is not None


def test_being_listed_for_priority_and_reservations_allows_no_service_account() -> None:
    """config/policies' lists say nothing about accounts: only config/service_accounts does."""
    policies = AccessPolicies(high_priority=(OWNER,), reserved_capacity=(OWNER,))
    reason = refusal(a_spec(service_account=ACCOUNT), policies, verified=True)
    assert reason is not None and "config/service_accounts" in reason


@given(
    owner=owners,
    privilege=st.sampled_from(sorted(PRIVILEGES)),
    verified=st.booleans(),
    trust=st.booleans(),
    others=member_lists,
    groups=st.dictionaries(st.from_regex(r"[a-z]{1,8}", fullmatch=True), member_lists, max_size=3),
)
def test_any_owner_in_no_list_and_no_admin_is_refused_any_privilege(
    owner: str,
    privilege: str,
    verified: bool,
    trust: bool,
    others: tuple[str, ...],
    groups: dict[str, tuple[str, ...]],
) -> None:
    """Whatever the lists hold, an owner named in none of them (nor in their groups) gets a sentence."""
    groups = {name: tuple(m for m in members if m != owner) for name, members in groups.items()}
    listed = tuple(m for m in others if m != owner) + tuple(f"group:{name}" for name in groups)
    policies = AccessPolicies(
        high_priority=listed,
        reserved_capacity=listed,
        trust_topic_owners=trust,
        groups=groups,
        service_accounts={member: (ACCOUNT,) for member in listed},
    )
    admins = tuple(m for m in others if m != owner)
    reason = refusal(a_spec(owner, **PRIVILEGES[privilege]), policies, verified=verified, admins=admins)
    assert isinstance(reason, str) and reason


@given(owner=owners, privilege=st.sampled_from(sorted(PRIVILEGES)), others=member_lists)
def test_any_verified_owner_listed_among_others_is_allowed(owner: str, privilege: str, others: tuple[str, ...]) -> None:
    """Where the owner stands in a list, and who else is there, does not matter."""
    listed = (*others, owner, *reversed(others))
    assert refusal(a_spec(owner, **PRIVILEGES[privilege]), allowing(*listed), verified=True) is None
