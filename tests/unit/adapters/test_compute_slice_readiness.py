"""A Compute Engine holding read from google-cloud-compute's own types: ACTIVE only when its slice's
interconnect is (appliedAcceleratorTopologies), a FAILED or INCOMPLETE one fails it with Google's
reason, a partial slice waits saying how many hosts came, a bulk MIG's progress check says why it
waits, a host missing from a stable MIG is lost, and a quota's zone or region is read as such."""

from __future__ import annotations

from datetime import datetime, timezone

from google.cloud import compute_v1

from tpujobs.adapters.compute_listing import Listing, group_zone, holding_status

ZONE = "us-central1-c"
NOW = datetime(2026, 11, 27, 4, 0, tzinfo=timezone.utc)
HOLDING = "train-1-c1"
STOCKOUT = "ZONE_RESOURCE_POOL_EXHAUSTED"


def said(holding: str = HOLDING) -> str:
    return f'tpujobs {{"holding":"{holding}","labels":{{"tpujobs-job":"train-1"}},"slice":0,"zone":"{ZONE}"}}'


def topology(state: str, message: str = "") -> compute_v1.InstanceGroupManagerStatusAcceleratorTopology:
    errors = [compute_v1.Errors(code="SOME_CODE", message=message)] if message else []
    return compute_v1.InstanceGroupManagerStatusAcceleratorTopology(
        accelerator_topology="2x2x2",
        state=state,
        state_details=compute_v1.InstanceGroupManagerStatusAcceleratorTopologyAcceleratorTopologyStateDetails(
            error=compute_v1.Error(errors=errors)
        ),
    )


def mig(
    target: int = 2,
    stable: bool = True,
    applied: str = "",
    message: str = "",
    bulk: bool = False,
    progress: tuple[str, str] | None = None,
    **actions: int,
) -> compute_v1.InstanceGroupManager:
    check = compute_v1.InstanceGroupManagerStatusBulkInstanceOperationLastProgressCheck(
        error=compute_v1.Error(errors=[compute_v1.Errors(code=progress[0], message=progress[1])] if progress else [])
    )
    status = compute_v1.InstanceGroupManagerStatus(
        is_stable=stable,
        applied_accelerator_topologies=[topology(applied, message)] if applied else [],
        bulk_instance_operation=compute_v1.InstanceGroupManagerStatusBulkInstanceOperation(
            in_progress=bulk, last_progress_check=check
        ),
    )
    return compute_v1.InstanceGroupManager(
        name=HOLDING,
        description=said(),
        target_size=target,
        current_actions=compute_v1.InstanceGroupManagerActionsSummary(**actions),
        status=status,
    )


def member(name: str, status: str = "RUNNING", action: str = "NONE", error: tuple[str, str] | None = None):
    errors = compute_v1.ManagedInstanceLastAttemptErrors(
        errors=[compute_v1.Errors(code=error[0], message=error[1])] if error else []
    )
    return compute_v1.ManagedInstance(
        name=name,
        instance_status=status,
        current_action=action,
        last_attempt=compute_v1.ManagedInstanceLastAttempt(errors=errors),
    )


def running(count: int) -> list[compute_v1.ManagedInstance]:
    return [member(f"{HOLDING}-{chr(97 + i) * 4}") for i in range(count)]


def precise(group: compute_v1.InstanceGroupManager, members: list[compute_v1.ManagedInstance]):
    status = holding_status(HOLDING, ZONE, Listing([group], [], [], []), {HOLDING: members}, NOW)
    assert status is not None
    return status


def test_a_slice_whose_interconnect_is_activating_is_provisioning_until_it_is_active() -> None:
    """Every VM RUNNING, the MIG stable, the topology ACTIVATING: PROVISIONING, saying so; ACTIVE once it is."""
    activating = precise(mig(applied="ACTIVATING", none=2), running(2))
    assert (activating.state, activating.unhealthy_hosts) == ("PROVISIONING", 0)
    assert "interconnect" in activating.detail and "ACTIVATING" in activating.detail
    assert precise(mig(applied="ACTIVE", none=2), running(2)).state == "ACTIVE"
    vms = [compute_v1.Instance(name=f"{HOLDING}-{x}", status="RUNNING") for x in ("aaaa", "bbbb")]
    (listed,) = group_zone(ZONE, Listing([mig(applied="ACTIVATING", none=2)], vms, [], []), NOW)
    assert listed.state == "PROVISIONING"


def test_a_failed_interconnect_fails_the_holding_with_googles_reason() -> None:
    """FAILED, with stateDetails: the holding FAILED (the engine's loss path), the reason quoted."""
    status = precise(mig(applied="FAILED", message="ICI link down between hosts 0 and 1", none=2), running(2))
    assert status.state == "FAILED"
    assert "FAILED" in status.detail and "ICI link down between hosts 0 and 1" in status.detail


def test_an_incomplete_interconnect_waits_while_vms_are_made_and_fails_once_they_all_run() -> None:
    """INCOMPLETE while a host is still created: waiting, as the hosts say; with every VM running: FAILED."""
    creating = [*running(1), member(f"{HOLDING}-bbbb", "", "CREATING")]
    waiting = precise(mig(applied="INCOMPLETE", stable=False, none=1, creating=1), creating)
    assert waiting.state == "WAITING"
    stuck = precise(mig(applied="INCOMPLETE", none=2), running(2))
    assert stuck.state == "FAILED" and "INCOMPLETE" in stuck.detail


def test_a_partial_slice_waits_and_says_how_many_hosts_came() -> None:
    """Individual mode gave 3 of 4 VMs: WAITING_FOR_RESOURCES (never ACTIVE), no host lost, the count said."""
    stockout = (STOCKOUT, f"The zone 'projects/p/zones/{ZONE}' does not have enough resources available.")
    members = [*running(3), member(f"{HOLDING}-dddd", "", "CREATING", stockout)]
    status = precise(mig(target=4, stable=False, applied="INCOMPLETE", none=3, creating=1), members)
    assert (status.state, status.unhealthy_hosts) == ("WAITING", 0)
    assert status.detail.startswith("3 of 4 hosts came") and STOCKOUT in status.detail


def test_a_bulk_mig_says_why_it_waits_from_its_last_progress_check() -> None:
    """No lastAttempt on the hosts; the MIG's QUOTA_EXCEEDED "in region" is the detail and the quota region."""
    quota = ("QUOTA_EXCEEDED", "Quota 'TPU_V5P' exceeded. Limit: 8.0 in region us-central1.")
    members = [member(f"{HOLDING}-aaaa", "", "CREATING"), member(f"{HOLDING}-bbbb", "", "CREATING")]
    status = precise(mig(stable=False, bulk=True, progress=quota, creating=2), members)
    assert (status.state, status.quota_region) == ("WAITING", "us-central1")
    assert "quota exhausted" in status.detail and "Limit: 8.0 in region us-central1" in status.detail
    stockout = precise(mig(stable=False, bulk=True, progress=(STOCKOUT, "no room"), creating=2), members)
    assert STOCKOUT in stockout.detail and stockout.quota_region == ""


def test_a_host_missing_from_a_stable_migs_list_is_lost_whatever_the_listing_shows() -> None:
    """Target 4, three RUNNING hosts listed, stable: one host lost, in both the precise and the zone read."""
    status = precise(mig(target=4, applied="", none=3), running(3))
    assert status.unhealthy_hosts == 1 and "3 of its 4 hosts" in status.detail
    vms = [compute_v1.Instance(name=f"{HOLDING}-{x * 4}", status="RUNNING") for x in "abc"]
    (listed,) = group_zone(ZONE, Listing([mig(target=4, none=3)], vms, [], []), NOW)
    assert listed.unhealthy_hosts == 1
    young = precise(mig(target=4, stable=False), [])
    assert (young.state, young.unhealthy_hosts) == ("WAITING", 0)


def test_a_quota_named_by_zone_or_region_is_read_as_such() -> None:
    """ "in zone Z": the zone's quota, no region skipped (detail quoted); "in region R" or both: R."""

    def quota_region(message: str) -> str:
        waiting = [member(f"{HOLDING}-aaaa", "", "CREATING", ("QUOTA_EXCEEDED", message))]
        status = precise(mig(stable=False, creating=1, target=1), waiting)
        assert status.state == "WAITING" and message in status.detail
        return status.quota_region

    assert quota_region(f"Quota 'TPU_V5P' exceeded. Limit: 8.0 in zone {ZONE}.") == ""
    assert quota_region("Quota 'TPU_V5P' exceeded. Limit: 8.0 in region us-central1.") == "us-central1"
    assert quota_region(f"Quota 'TPU_V5P' exceeded. Limit: 0,0 in zone {ZONE},region us-central1.") == "us-central1"
