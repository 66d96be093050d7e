"""A zone's Compute Engine listing grouped into holdings (adapters.compute_listing.group_zone)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from google.cloud import compute_v1

from tpujobs.adapters.compute_listing import PARTIAL_GRACE, Listing, group_zone, holding_status

ZONE = "us-central1-c"
NOW = datetime(2026, 11, 27, 4, 0, tzinfo=timezone.utc)


def said(holding: str, zone: str = ZONE, job: str = "train-1") -> str:
    return (
        f'tpujobs {{"holding":"{holding}","labels":{{"tpujobs-attempt":"1","tpujobs-job":"{job}"}},'
        f'"slice":0,"zone":"{zone}"}}'
    )


def mig(name: str, target: int = 2, none: int = 0, creating: int = 0, deleting: int = 0, stable: bool = False):
    return compute_v1.InstanceGroupManager(
        name=name,
        description=said(name),
        target_size=target,
        current_actions=compute_v1.InstanceGroupManagerActionsSummary(none=none, creating=creating, deleting=deleting),
        status=compute_v1.InstanceGroupManagerStatus(is_stable=stable),
    )


def vm(name: str, status: str) -> compute_v1.Instance:
    return compute_v1.Instance(name=name, status=status)


def listing(migs=(), instances=(), templates=(), policies=()) -> Listing:
    return Listing(list(migs), list(instances), list(templates), list(policies))


def test_a_running_stable_slice_is_active_and_labelled_with_its_job() -> None:
    """Two RUNNING VMs of a stable MIG: ACTIVE, job label from the description."""
    (status,) = group_zone(
        ZONE,
        listing(
            [mig("train-1-c1", none=2, stable=True)],
            [vm("train-1-c1-aaaa", "RUNNING"), vm("train-1-c1-bbbb", "RUNNING")],
        ),
        NOW,
    )
    assert (status.name, status.state, status.unhealthy_hosts, status.job_label) == (
        "train-1-c1",
        "ACTIVE",
        0,
        "train-1",
    )


def test_hosts_without_vms_wait_while_created_and_are_lost_once_deleted() -> None:
    """No VM yet while creating: waiting; a NONE host without its VM: lost."""
    (creating,) = group_zone(ZONE, listing([mig("train-1-c1", creating=2)]), NOW)
    assert (creating.state, creating.unhealthy_hosts) == ("WAITING", 0)
    (preempted,) = group_zone(
        ZONE, listing([mig("train-1-c1", none=2, stable=True)], [vm("train-1-c1-aaaa", "RUNNING")]), NOW
    )
    assert preempted.unhealthy_hosts == 1


def test_a_terminated_vm_is_a_lost_host_and_a_deleting_mig_is_deleting() -> None:
    """TERMINATED counts as lost; hosts being deleted make the holding DELETING."""
    vms = [vm("train-1-c1-aaaa", "RUNNING"), vm("train-1-c1-bbbb", "TERMINATED")]
    (status,) = group_zone(ZONE, listing([mig("train-1-c1", none=2, stable=True)], vms), NOW)
    assert status.unhealthy_hosts == 1 and status.state not in ("LOSING", "LOST")
    (going,) = group_zone(ZONE, listing([mig("train-1-c1", deleting=2)], vms), NOW)
    assert going.state == "RELEASING"


def test_slices_of_one_holding_are_one_status_and_strangers_are_left_out() -> None:
    """Two slice MIGs of a holding make one status; a MIG without the marker is not listed."""
    slices = [mig("train-1-c1-0", none=2, stable=True), mig("train-1-c1-1", none=2, stable=True)]
    for each in slices:
        each.description = said("train-1-c1")
    stranger = compute_v1.InstanceGroupManager(name="web-c1", description="made by hand", target_size=3)
    vms = [vm(f"train-1-c1-{s}-{x}", "RUNNING") for s in (0, 1) for x in ("aaaa", "bbbb")]
    (status,) = group_zone(ZONE, listing([*slices, stranger], vms), NOW)
    assert (status.name, status.state) == ("train-1-c1", "ACTIVE")


def test_templates_and_policies_left_without_a_mig_are_reported_until_released() -> None:
    """Leftovers are CREATING while young (a create under way), FAILED after (the sweep releases
    them, as it skips DELETING); another zone's leftovers are not this zone's."""
    old = (NOW - PARTIAL_GRACE - timedelta(minutes=1)).isoformat()
    young = (NOW - timedelta(seconds=30)).isoformat()
    templates = [
        compute_v1.InstanceTemplate(name="old-c1", description=said("old-c1", job="old"), creation_timestamp=old),
        compute_v1.InstanceTemplate(name="new-c1", description=said("new-c1", job="new"), creation_timestamp=young),
        compute_v1.InstanceTemplate(
            name="far-c1", description=said("far-c1", zone="us-central1-a"), creation_timestamp=old
        ),
    ]
    policies = [compute_v1.ResourcePolicy(name="old-c1", description=said("old-c1", job="old"))]
    found = {s.name: s for s in group_zone(ZONE, listing(templates=templates, policies=policies), NOW)}
    assert set(found) == {"old-c1", "new-c1"}
    assert (found["old-c1"].state, found["old-c1"].job_label) == ("FAILED", "old")
    assert found["new-c1"].state == "WAITING"


def waiting_host(name: str, code: str, message: str) -> compute_v1.ManagedInstance:
    """A managed instance the MIG keeps trying to create, its last attempt refused."""
    errors = compute_v1.ManagedInstanceLastAttemptErrors(errors=[compute_v1.Errors(code=code, message=message)])
    return compute_v1.ManagedInstance(
        name=name, current_action="CREATING", last_attempt=compute_v1.ManagedInstanceLastAttempt(errors=errors)
    )


def test_a_holding_whose_hosts_exceed_a_regions_quota_says_which_region() -> None:
    """The precise read (managed instances with their last errors): Compute Engine's
    "... Limit: 8.0 in region us-central1." becomes `quota_region`; a zone's quota names none."""
    group = listing([mig("train-1-c1", creating=2)])
    regional = waiting_host(
        "train-1-c1-aaaa", "QUOTA_EXCEEDED", "Quota 'TPU_V5P' exceeded. Limit: 8.0 in region us-central1."
    )
    status = holding_status("train-1-c1", ZONE, group, {"train-1-c1": [regional]}, NOW)
    assert status is not None
    assert (status.state, status.quota_region) == ("WAITING", "us-central1")
    assert "Limit: 8.0 in region us-central1" in status.detail
    zonal = waiting_host("train-1-c1-aaaa", "QUOTA_EXCEEDED", f"Quota 'TPU_V5P' exceeded. Limit: 8.0 in zone {ZONE}.")
    status = holding_status("train-1-c1", ZONE, group, {"train-1-c1": [zonal]}, NOW)
    assert status is not None and (status.state, status.quota_region) == ("WAITING", "")


def test_the_earliest_termination_timestamp_is_when_the_holding_runs_out() -> None:
    """VMs with a maxRunDuration carry Compute Engine's terminationTimestamp, on instances.get and on
    listManagedInstances: the holding's `run_ends` is the earliest; none: ""."""
    late, early = "2026-11-27T06:00:30.000-08:00", "2026-11-27T06:00:00.000-08:00"
    vms = [
        compute_v1.Instance(
            name=f"train-1-c1-{suffix}",
            status="RUNNING",
            resource_status=compute_v1.ResourceStatus(
                scheduling=compute_v1.ResourceStatusScheduling(termination_timestamp=when)
            ),
        )
        for suffix, when in (("aaaa", late), ("bbbb", early))
    ]
    (zone_wide,) = group_zone(ZONE, listing([mig("train-1-c1", none=2, stable=True)], vms), NOW)
    assert zone_wide.run_ends == early
    managed = [
        compute_v1.ManagedInstance(
            name=vm.name,
            instance_status="RUNNING",
            current_action="NONE",
            scheduling=compute_v1.ManagedInstanceScheduling(termination_timestamp=when),
        )
        for vm, when in zip(vms, (late, early), strict=True)
    ]
    one = holding_status(
        "train-1-c1", ZONE, listing([mig("train-1-c1", none=2, stable=True)], vms), {"train-1-c1": managed}, NOW
    )
    assert one is not None and one.run_ends == early
    (plain,) = group_zone(
        ZONE, listing([mig("train-1-c1", none=1, stable=True)], [vm("train-1-c1-aaaa", "RUNNING")]), NOW
    )
    assert plain.run_ends == ""
