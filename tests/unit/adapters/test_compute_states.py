"""The one table from Compute Engine's instance statuses and MIG actions to the port's states."""

from __future__ import annotations

import pytest
from google.cloud import compute_v1

from tpujobs.adapters import compute_states as states
from tpujobs.adapters.compute_states import Host, holding_state, host
from tpujobs.domain.holdings import HOLDING_LOST, HOLDING_PENDING, HoldingState

PORT_STATES = {states.RELEASING, states.FAILED, states.WAITING, states.PROVISIONING, states.ACTIVE}
# The actions ManagedInstance.CurrentAction's docstring says may come outside the enum.
DOCUMENTED_EXTRA_ACTIONS = {"STOPPING", "SUSPENDING"}


def test_the_table_covers_every_instance_status_and_nothing_else() -> None:
    """Every compute_v1.Instance.Status member has a row, and every row is a member."""
    assert set(states.INSTANCE_STATUSES) == {m.name for m in compute_v1.Instance.Status}


def test_the_table_covers_every_documented_current_action() -> None:
    """Every ManagedInstance.CurrentAction member and the documented extras have a row."""
    documented = {m.name for m in compute_v1.ManagedInstance.CurrentAction} | DOCUMENTED_EXTRA_ACTIONS
    assert set(states.CURRENT_ACTIONS) == documented


def test_every_row_names_a_port_state_and_says_why() -> None:
    """Rows map to the port's states only, never LOSING or LOST (TPU VMs cannot suspend: lost hosts say it)."""
    meanings = [*states.INSTANCE_STATUSES.values(), *(m for m in states.CURRENT_ACTIONS.values() if m)]
    for meaning in meanings:
        assert meaning.state in PORT_STATES and meaning.why
        assert meaning.state not in (HoldingState.LOSING, HoldingState.LOST)
    assert PORT_STATES - {states.FAILED, states.RELEASING} <= HOLDING_PENDING
    assert states.FAILED in HOLDING_LOST


@pytest.mark.parametrize("status", sorted(m.name for m in compute_v1.Instance.Status))
def test_only_live_statuses_keep_a_host(status: str) -> None:
    """A host is lost in every status but the ones on the way to RUNNING, and RUNNING."""
    verdict = host(Host("vm-a1b2", status, "NONE"))
    alive = {"UNDEFINED_STATUS", "PENDING", "PROVISIONING", "STAGING", "RUNNING"}
    assert verdict.lost is (status not in alive)


def test_a_preempted_host_is_lost_whether_terminated_or_deleted() -> None:
    """TERMINATED counts as lost; so does a host with no VM and no action (deleted, never recreated)."""
    assert host(Host("vm-a", "TERMINATED", "NONE")).lost
    gone = host(Host("vm-b", "", "NONE"))
    assert gone.lost and "no VM" in gone.detail


def test_a_host_being_created_without_a_vm_waits_for_capacity() -> None:
    """CREATING with no VM yet: WAITING_FOR_RESOURCES, not lost."""
    verdict = host(Host("vm-a", "", "CREATING"))
    assert (verdict.state, verdict.lost) == (states.WAITING, False)


@pytest.mark.parametrize(
    ("code", "words"),
    [
        ("ZONE_RESOURCE_POOL_EXHAUSTED", "no capacity"),
        ("ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS", "no capacity"),
        ("QUOTA_EXCEEDED", "quota"),
    ],
)
def test_stockouts_and_quota_wait_with_googles_words(code: str, words: str) -> None:
    """A stockout or a full quota on the last attempt is WAITING_FOR_RESOURCES, saying which."""
    verdict = host(Host("vm-a", "", "CREATING", ((code, "no TPUs in us-central1-c"),)))
    assert verdict.state == states.WAITING and not verdict.lost
    assert words in verdict.detail and code in verdict.detail and "us-central1-c" in verdict.detail


def test_a_holding_is_active_only_when_every_host_runs_and_every_mig_is_stable() -> None:
    """All RUNNING and stable: ACTIVE; not stable, or one host still staging: PROVISIONING."""
    running = [host(Host(f"vm-{i}", "RUNNING", "NONE")) for i in range(2)]
    assert holding_state(running, all_stable=True).state == states.ACTIVE
    assert holding_state(running, all_stable=False).state == states.PROVISIONING
    staging = [*running[:1], host(Host("vm-2", "STAGING", "CREATING"))]
    assert holding_state(staging, all_stable=True).state == states.PROVISIONING


def test_the_least_advanced_host_decides_and_lost_hosts_are_counted() -> None:
    """One waiting host holds the holding at WAITING; lost ones are counted; DELETING beats all."""
    waiting = host(Host("vm-0", "", "CREATING", (("ZONE_RESOURCE_POOL_EXHAUSTED", "none left"),)))
    lost = host(Host("vm-1", "TERMINATED", "NONE"))
    judged = holding_state([waiting, lost, host(Host("vm-2", "RUNNING", "NONE"))], all_stable=True)
    assert (judged.state, judged.lost_hosts) == (states.WAITING, 1)
    assert "none left" in judged.detail
    assert holding_state([lost, host(Host("vm-3", "RUNNING", "DELETING"))], True).state == states.RELEASING


def test_a_mig_without_hosts_yet_or_in_bulk_creation_waits() -> None:
    """No managed instance yet, or a bulk creation in progress: WAITING_FOR_RESOURCES."""
    assert holding_state([], all_stable=False).state == states.WAITING
    running = [host(Host("vm-0", "RUNNING", "NONE"))]
    assert holding_state(running, all_stable=True, waiting_in_bulk=True).state == states.WAITING


def test_a_quota_exceeded_in_a_region_names_the_region_a_zones_does_not() -> None:
    """Compute Engine's "Quota 'X' exceeded. Limit: 8.0 in region us-east5.": the holding waits
    with `quota_region` us-east5; a zone's quota, a stockout or a global quota name none."""
    regional = host(
        Host("vm-0", "", "CREATING", (("QUOTA_EXCEEDED", "Quota 'TPU_V5P' exceeded. Limit: 8.0 in region us-east5."),))
    )
    assert (regional.state, regional.quota_region) == (states.WAITING, "us-east5")
    judged = holding_state([host(Host("vm-1", "RUNNING", "NONE")), regional], all_stable=False)
    assert (judged.state, judged.quota_region) == (states.WAITING, "us-east5")
    others = [
        ("QUOTA_EXCEEDED", "Quota 'TPU_V5P' exceeded. Limit: 8.0 in zone us-east5-a."),
        ("QUOTA_EXCEEDED", "Quota 'GPUS_ALL_REGIONS' exceeded. Limit: 0.0 globally."),
        ("ZONE_RESOURCE_POOL_EXHAUSTED", "no TPUs in region us-east5 today"),
    ]
    for error in others:
        waiting = host(Host("vm-0", "", "CREATING", (error,)))
        assert waiting.state == states.WAITING and waiting.quota_region == "", error
        assert holding_state([waiting], all_stable=False).quota_region == ""
