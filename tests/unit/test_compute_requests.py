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


def template(h: requests.Holding, index: int = 0) -> compute_v1.InstanceProperties:
    return requests.instance_template(h, index, BOOT, PROJECT, IMAGES).properties


def metadata(properties: compute_v1.InstanceProperties) -> dict[str, str]:
    return {item.key: item.value for item in properties.metadata.items}


def test_a_job_holding_is_named_after_its_attempt_on_compute_engine() -> None:
    """A compute job's holding is `{job}-c{N}`; one slice's resources share that name."""
    h = holding()
    assert h.name == "train-1-c1" and h.slice_names() == ["train-1-c1"]
    assert h.region == "us-central1"


def test_a_multi_host_slice_is_a_workload_policy_a_template_and_a_mig_of_its_hosts() -> None:
    """v7x-16: HIGH_THROUGHPUT policy with 2x2x2, a MIG of 2 tpu7x-standard-4t VMs tied to it."""
    h = holding(capacity="spot")
    policy = requests.workload_policy(h, 0)
    assert policy.name == "train-1-c1"
    assert (policy.workload_policy.type_, policy.workload_policy.accelerator_topology) == ("HIGH_THROUGHPUT", "2x2x2")
    mig = requests.instance_group_manager(h, 0, PROJECT)
    assert (mig.name, mig.base_instance_name, mig.target_size) == ("train-1-c1", "train-1-c1", 2)
    assert mig.instance_template == "projects/p/regions/us-central1/instanceTemplates/train-1-c1"
    assert mig.resource_policies.workload_policy == "projects/p/regions/us-central1/resourcePolicies/train-1-c1"
    assert mig.instance_lifecycle_policy.default_action_on_failure == "DO_NOTHING"
    assert mig.target_size_policy.mode == "INDIVIDUAL"  # bulk mode refuses Spot
    assert template(h).machine_type == "tpu7x-standard-4t"


def test_a_single_host_slice_is_a_mig_of_one_without_a_policy() -> None:
    """v7x-8 (2x2x1) is one VM: a MIG of one, no workload policy."""
    h = holding(accelerator_type="v7x-8")
    mig = requests.instance_group_manager(h, 0, PROJECT)
    assert mig.target_size == 1
    assert "resource_policies" not in mig
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
    assert requests.instance_group_manager(h, 0, PROJECT).target_size_policy.mode == mode


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
    """slices: 2 makes `-0` and `-1`, each template carrying its slice id and the slice count."""
    h = holding(slices=2)
    assert h.slice_names() == ["train-1-c1-0", "train-1-c1-1"]
    second = template(h, 1)
    assert metadata(second)[requests.SLICE_ID_KEY] == "1"
    assert metadata(second)[requests.NUM_SLICES_KEY] == "2"
    assert second.labels["tpujobs-slice"] == "1"
    assert requests.instance_group_manager(h, 1, PROJECT).base_instance_name == "train-1-c1-1"


def test_the_template_carries_the_boot_the_account_and_the_labels() -> None:
    """Boot metadata, the VM account with cloud-platform scope, labels, the generation's image family."""
    properties = template(holding(labels={"team": "ml"}))
    assert metadata(properties) == {"startup-script": "#!/bin/bash", "tpujobs-key": "k"}
    (account,) = properties.service_accounts
    assert (account.email, list(account.scopes)) == (BOOT.service_account, [requests.CLOUD_PLATFORM_SCOPE])
    ours = {"tpujobs-job": "train-1", "tpujobs-attempt": "1", "tpujobs-slice": "0"}
    assert dict(properties.labels) == {"team": "ml", **ours}
    boot = properties.disks[0]
    assert boot.boot and boot.initialize_params.source_image == (
        "projects/ubuntu-os-accelerator-images/global/images/family/ubuntu-accel-2404-amd64-tpu-tpu7x"
    )


def test_v6e_boots_its_own_image_family_unless_the_settings_name_another() -> None:
    """v6e defaults to the v5e/v5p/v6e family; Settings' `generation=family` overrides it."""
    h = holding(accelerator_type="v6e-16")
    assert template(h).disks[0].initialize_params.source_image.endswith("ubuntu-accel-2204-amd64-tpu-v5e-v5p-v6e")
    mine = requests.Images.from_settings("my-images", ("v6e=custom-v6e",))
    properties = requests.instance_template(h, 0, BOOT, PROJECT, mine).properties
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
        requests.instance_template(holding(), 0, HostBoot("", {}), PROJECT, IMAGES)


def test_a_units_holding_carries_the_pools_labels_and_its_descriptions_say_whose() -> None:
    """A unit's labels mark its resources; the description (MIGs have no labels) round-trips them."""
    spec = a_job().spec
    unit = UnitRequest("demo-c0-g1", ZONE, spec, {"tpujobs-pool": "demo", "tpujobs-unit": "demo-c0-g1"})
    h = requests.unit_holding(unit)
    said = requests.parse_description(requests.instance_group_manager(h, 0, PROJECT).description)
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
