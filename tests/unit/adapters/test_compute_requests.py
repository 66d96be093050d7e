"""The Compute Engine resources of a holding, per capacity kind and shape (adapters.compute_requests)."""

from __future__ import annotations

import re
from datetime import datetime, timezone
from typing import Any

import pytest
from google.cloud import compute_v1

from tpujobs.adapters import compute_requests as requests
from tpujobs.domain import limits as time_limits
from tpujobs.domain.job import Job, new_job
from tpujobs.domain.spec import parse_spec
from tpujobs.engine.errors import PermanentError
from tpujobs.engine.ports import HostBoot, UnitRequest

PROJECT = "p"
ZONE = "us-central1-c"
BOOT = HostBoot("tpu-vm@p.iam.gserviceaccount.com", {"startup-script": "#!/bin/bash", "tpujobs-key": "k"})
IMAGES = requests.Images()


def a_job(**changes: Any) -> Job:
    spec = parse_spec(
        {
            "job_id": "train-1",
            "name": "train",
            "owner": "ada",
            "accelerator_type": "v7x-16",
            "platform": "compute",
            "command": "x",
            **changes,
        }
    )
    job, _ = new_job(spec, ZONE, datetime(2026, 1, 1, tzinfo=timezone.utc))
    return job


def holding(**changes: Any) -> requests.Holding:
    return requests.job_holding(a_job(**changes))


def template(h: requests.Holding) -> compute_v1.InstanceProperties:
    return requests.instance_template(h, BOOT, PROJECT, IMAGES).properties


def mig(h: requests.Holding, index: int = 0) -> compute_v1.InstanceGroupManager:
    policy = requests.workload_policy(h).name if h.shape.multi_host else ""
    shared = requests.instance_template(h, BOOT, PROJECT, IMAGES).name
    return requests.instance_group_manager(h, index, PROJECT, shared, BOOT, policy)


def test_a_job_holding_is_named_after_its_attempt_on_compute_engine() -> None:
    """A compute job's holding is `{job}-c{N}`; one slice's resources share that name."""
    h = holding()
    assert h.name == "train-1-c1" and h.slice_names() == ["train-1-c1"]
    assert h.region == "us-central1"


def test_a_multi_host_slice_is_a_workload_policy_a_template_and_a_mig_of_its_hosts() -> None:
    """v7x-16: HIGH_THROUGHPUT policy with 2x2x2, a MIG of 2 tpu7x-standard-4t VMs tied to it."""
    h = holding(capacity="spot")
    policy = requests.workload_policy(h)
    assert policy.name.startswith(requests.SHARED_POLICY_PREFIX)
    assert (policy.workload_policy.type_, policy.workload_policy.accelerator_topology) == ("HIGH_THROUGHPUT", "2x2x2")
    made = mig(h)
    shared = requests.instance_template(h, BOOT, PROJECT, IMAGES).name
    assert (made.name, made.base_instance_name, made.target_size) == ("train-1-c1", "train-1-c1", 2)
    assert made.instance_template == f"projects/p/regions/us-central1/instanceTemplates/{shared}"
    assert made.resource_policies.workload_policy == f"projects/p/regions/us-central1/resourcePolicies/{policy.name}"
    assert made.instance_lifecycle_policy.default_action_on_failure == "DO_NOTHING"
    assert made.target_size_policy.mode == "INDIVIDUAL"  # bulk mode refuses Spot
    assert template(h).machine_type == "tpu7x-standard-4t"


def test_a_single_host_slice_is_a_mig_of_one_without_a_policy() -> None:
    """v7x-8 (2x2x1) is one VM: a MIG of one, no workload policy."""
    h = holding(accelerator_type="v7x-8")
    made = mig(h)
    assert made.target_size == 1
    assert "resource_policies" not in made
    assert template(h).machine_type == "tpu7x-standard-4t"


@pytest.mark.parametrize(
    ("capacity", "model", "termination", "mode"),
    [
        ("on-demand", "STANDARD", "", "INDIVIDUAL"),
        ("spot", "SPOT", "DELETE", "INDIVIDUAL"),
        ("reserved", "RESERVATION_BOUND", "DELETE", "BULK"),
        ("flex-start", "FLEX_START", "DELETE", "BULK"),
    ],
)
def test_each_capacity_kind_has_its_provisioning_model(capacity: str, model: str, termination: str, mode: str) -> None:
    """Provisioning model, termination action and bulk mode per kind; TERMINATE on maintenance always."""
    extra = {"time_limit": "2h"} if capacity == "flex-start" else {"reservation": "r"} if capacity == "reserved" else {}
    h = holding(capacity=capacity, **extra)
    scheduling = template(h).scheduling
    assert scheduling.provisioning_model == model
    assert scheduling.instance_termination_action == termination
    assert scheduling.on_host_maintenance == "TERMINATE"
    assert mig(h).target_size_policy.mode == mode


def test_reserved_capacity_names_the_specs_reservation() -> None:
    """RESERVATION_BOUND consumes the named reservation: SPECIFIC_RESERVATION with its name."""
    affinity = template(holding(capacity="reserved", reservation="tpu-res")).reservation_affinity
    assert affinity.consume_reservation_type == "SPECIFIC_RESERVATION"
    assert (affinity.key, list(affinity.values)) == ("compute.googleapis.com/reservation-name", ["tpu-res"])


def test_a_shared_reservation_of_another_project_keeps_its_project() -> None:
    """A reservation path of another project stays `projects/P/reservations/N`; ours becomes the name."""
    assert requests.reservation_name("projects/other/reservations/r1", PROJECT) == "projects/other/reservations/r1"
    assert requests.reservation_name("projects/p/locations/us-central1-c/reservations/r1", PROJECT) == "r1"


ALLOWANCE = (
    time_limits.RUN_BOOT_ALLOWANCE_SECONDS + time_limits.RUN_SIGTERM_GRACE_SECONDS + time_limits.RUN_MARGIN_SECONDS
)


@pytest.mark.parametrize(
    ("limits", "seconds"),
    [
        ({"time_limit": "3h"}, 3 * 3600 + ALLOWANCE),
        ({"time_limit": "3h", "attempt_time_limit": "1h"}, 3600 + ALLOWANCE),
        ({"attempt_time_limit": "30m"}, 1800 + ALLOWANCE),
        ({"time_limit": "200h"}, 7 * 24 * 3600),
    ],
)
def test_flex_start_runs_at_most_the_jobs_smaller_time_limit(limits: dict[str, str], seconds: int) -> None:
    """maxRunDuration: the smaller of time_limit and attempt_time_limit with the boot, the save on
    SIGTERM and a margin inside (tpujobs' own limit comes first), capped at 7 days; no reservation."""
    properties = template(holding(capacity="flex-start", **limits))
    assert properties.scheduling.max_run_duration.seconds == seconds
    assert properties.reservation_affinity.consume_reservation_type == "NO_RESERVATION"


def test_multislice_is_one_mig_per_slice_each_told_its_slice() -> None:
    """slices: 2 makes `-0` and `-1`, each MIG's all-instances configuration carrying its slice
    id and the slice count; both MIGs name the one shared template and policy."""
    h = holding(slices=2)
    assert h.slice_names() == ["train-1-c1-0", "train-1-c1-1"]
    first, second = mig(h, 0), mig(h, 1)
    said = second.all_instances_config.properties
    assert said.metadata[requests.SLICE_ID_KEY] == "1"
    assert said.metadata[requests.NUM_SLICES_KEY] == "2"
    assert said.labels["tpujobs-slice"] == "1"
    assert second.base_instance_name == "train-1-c1-1"
    assert first.instance_template == second.instance_template
    assert first.resource_policies.workload_policy == second.resource_policies.workload_policy


def test_the_template_carries_the_account_and_image_and_the_mig_the_boot_and_the_labels() -> None:
    """The shared template: the VM account with cloud-platform scope and the generation's image
    family, no metadata and no labels; the MIG's all-instances configuration: the boot metadata
    and the labels."""
    h = holding(labels={"team": "ml"})
    properties = template(h)
    assert not properties.metadata.items and not properties.labels
    said = mig(h).all_instances_config.properties
    assert dict(said.metadata) == {"startup-script": "#!/bin/bash", "tpujobs-key": "k"}
    (account,) = properties.service_accounts
    assert (account.email, list(account.scopes)) == (BOOT.service_account, [requests.CLOUD_PLATFORM_SCOPE])
    ours = {"tpujobs-job": "train-1", "tpujobs-attempt": "1", "tpujobs-slice": "0"}
    assert dict(said.labels) == {"team": "ml", **ours}
    boot = properties.disks[0]
    assert boot.boot and boot.initialize_params.source_image == (
        "projects/ubuntu-os-accelerator-images/global/images/family/ubuntu-accel-2404-amd64-tpu-tpu7x"
    )


def test_v6e_boots_its_own_image_family_unless_the_settings_name_another() -> None:
    """v6e defaults to the v5e/v5p/v6e family; Settings' `generation=family` overrides it."""
    h = holding(accelerator_type="v6e-16")
    assert template(h).disks[0].initialize_params.source_image.endswith("ubuntu-accel-2204-amd64-tpu-v5e-v5p-v6e")
    mine = requests.Images.from_settings("my-images", ("v6e=custom-v6e",))
    properties = requests.instance_template(h, BOOT, PROJECT, mine).properties
    assert properties.disks[0].initialize_params.source_image == "projects/my-images/global/images/family/custom-v6e"


def test_a_short_subnetwork_gets_its_full_path_and_internal_ips_drop_the_external_one() -> None:
    """A template needs the full subnetwork path; internal_ips sends no access config."""
    (nic,) = template(holding(network="training", subnetwork="tpu", internal_ips=True)).network_interfaces
    assert nic.network == "projects/p/global/networks/training"
    assert nic.subnetwork == "projects/p/regions/us-central1/subnetworks/tpu"
    assert list(nic.access_configs) == []
    (default,) = template(holding()).network_interfaces
    assert default.network == "projects/p/global/networks/default" and len(default.access_configs) == 1


def test_tags_and_data_disks_are_attached_as_asked() -> None:
    """Network tags, and each data disk by name in its mode, never deleted with the VM."""
    disk = {"source_disk": f"projects/my-proj/zones/{ZONE}/disks/datasets", "mode": "read-only"}
    properties = template(holding(tags=["tpu"], data_disks=[disk]))
    assert list(properties.tags.items) == ["tpu"]
    attached = properties.disks[1]
    assert (attached.source, attached.mode, attached.auto_delete) == ("datasets", "READ_ONLY", False)


def test_an_empty_service_account_is_refused() -> None:
    """TPU VMs never fall back to the Compute default account."""
    with pytest.raises(PermanentError, match="service account"):
        requests.instance_template(holding(), HostBoot("", {}), PROJECT, IMAGES)


def test_a_units_holding_carries_the_pools_labels_and_its_descriptions_say_whose() -> None:
    """A unit's labels mark its resources; the description (MIGs have no labels) round-trips them."""
    spec = a_job().spec
    unit = UnitRequest("demo-c0-g1", ZONE, spec, {"tpujobs-pool": "demo", "tpujobs-unit": "demo-c0-g1"})
    h = requests.unit_holding(unit)
    said = requests.parse_description(mig(h).description)
    assert said == {
        "holding": "demo-c0-g1",
        "zone": ZONE,
        "slice": 0,
        "labels": {"tpujobs-pool": "demo", "tpujobs-unit": "demo-c0-g1"},
    }
    assert requests.parse_description("made by hand") is None


@pytest.mark.parametrize(
    ("name", "matched"),
    [
        ("train-1-c1", True),
        ("train-1-c1-3", True),
        ("demo-c0-g1", True),
        ("demo-c0-g1-1", True),
        ("train-1-a1", False),  # a TPU API queued resource
        ("web-server", False),
    ],
)
def test_the_list_filter_keeps_tpujobs_compute_names_only(name: str, matched: bool) -> None:
    """The RE2 of the zone listing matches every slice name tpujobs makes on Compute Engine, whole."""
    assert bool(re.fullmatch(requests.SLICE_RE2, name)) is matched
    assert bool(re.fullmatch(requests.INSTANCE_RE2, name + "-x7k2")) is matched


def test_holdings_of_the_same_vms_share_one_template_and_policy_named_by_their_content() -> None:
    """Two jobs (other ids, labels, boot metadata) of one shape get the same template and policy
    names; another shape, capacity or image gets another template; the names are never a holding's."""
    first, second = holding(), requests.job_holding(a_job(job_id="eval-7", labels={"team": "x"}))
    other_boot = HostBoot(BOOT.service_account, {"startup-script": "#!/bin/sh"})
    one = requests.instance_template(first, BOOT, PROJECT, IMAGES)
    assert requests.instance_template(second, other_boot, PROJECT, IMAGES).name == one.name
    assert requests.workload_policy(first).name == requests.workload_policy(second).name
    assert requests.instance_template(holding(capacity="spot"), BOOT, PROJECT, IMAGES).name != one.name
    assert requests.instance_template(holding(accelerator_type="v7x-8"), BOOT, PROJECT, IMAGES).name == one.name
    assert requests.workload_policy(holding(accelerator_type="v7x-32")).name != requests.workload_policy(first).name
    mine = requests.Images.from_settings("my-images", ("v7x=custom",))
    assert requests.instance_template(first, BOOT, PROJECT, mine).name != one.name
    assert len(one.name) <= 63 and re.fullmatch(requests.SHARED_RE2, one.name)
    assert not re.fullmatch(requests.SLICE_RE2, one.name)
    assert requests.parse_description(one.description) is None  # no holding's
    assert requests.parse_shared(one.description) == {"shared": "instance template", "key": one.name[-20:]}
