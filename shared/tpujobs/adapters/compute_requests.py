"""The Compute Engine resources of one holding of TPU slices, as google-cloud-compute messages.

A slice S (`naming.node_id(holding, i, slices)`) is a MIG S of `hosts` VMs. Instance templates
and workload policies are immutable and shared: one template serves every holding whose VMs have
the same shape (machine type, image, disks, network, account, scheduling, reservation), one
policy every multi-host slice of the same topology; each is named by a hash of what it holds
(`tpujobs-t-h{hash}`, `tpujobs-wp-h{hash}`), so a holding finds the one an earlier holding made.
What differs per holding (the boot metadata, the slice id and count, the labels) is the MIG's
all-instances configuration, which Compute Engine gives the VMs the MIG creates. Every builder
here is pure: the same holding always gives the same messages, so a retried request adopts what
an earlier one made. Facts and sources: ../shared/design/compute-engine.md (§1 resource model,
§2 capacity kinds).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from tpujobs.domain import naming
from tpujobs.domain.job import Job
from tpujobs.domain.limits import flex_run_seconds
from tpujobs.domain.platforms import ComputeShape, compute_shape
from tpujobs.domain.spec import JobSpec
from tpujobs.engine.errors import PermanentError
from tpujobs.engine.ports import HostBoot, UnitRequest

if TYPE_CHECKING:
    from google.cloud import compute_v1

# The VM account's IAM roles are what limit it; the scope only has to let them through.
CLOUD_PLATFORM_SCOPE = "https://www.googleapis.com/auth/cloud-platform"

# The accelerator images' families per generation (project ubuntu-os-accelerator-images) [SKY gcp.py].
DEFAULT_IMAGE_FAMILIES: dict[str, str] = {
    "v7x": "ubuntu-accel-2404-amd64-tpu-tpu7x",
    "v6e": "ubuntu-accel-2204-amd64-tpu-v5e-v5p-v6e",
    "v5p": "ubuntu-accel-2204-amd64-tpu-v5e-v5p-v6e",
}
# Boot disk types where the public TPU7x and v6e examples use Hyperdisk [UG, VCI]; others: the API's default.
BOOT_DISK_TYPES: dict[str, str] = {"v7x": "hyperdisk-balanced", "v6e": "hyperdisk-balanced"}

# scheduling.provisioningModel per capacity kind [ref Scheduling.ProvisioningModel].
PROVISIONING_MODELS: dict[str, str] = {
    "on-demand": "STANDARD",
    "spot": "SPOT",
    "reserved": "RESERVATION_BOUND",
    "flex-start": "FLEX_START",
}
# Bulk mode allows only reservation-bound and flex-start VMs [BULK]; the others create host by host.
BULK_CAPACITY = frozenset({"reserved", "flex-start"})
DISK_MODES = {"read-only": "READ_ONLY", "read-write": "READ_WRITE"}

# What every MIG, template and policy tpujobs makes says in its description: this marker, then
# its holding and labels as JSON. MIGs have no labels [fact sheet §7], so the marker is how a
# listing tells tpujobs' resources (and their job or pool) from anyone else's of a similar name.
MARKER = "tpujobs "
SLICE_ID_KEY = "tpujobs-slice-id"  # VM metadata of multislice hosts: which slice they are
NUM_SLICES_KEY = "tpujobs-num-slices"  # and how many slices the holding has
SLICE_LABEL = "tpujobs-slice"  # VM label: which slice of its holding a VM is
# Shared templates and policies: these prefixes, then "h" and a hash of what they hold (the "h"
# keeps their names out of the holdings' name pattern, SLICE_RE2, whatever the hash).
SHARED_TEMPLATE_PREFIX = "tpujobs-t-h"
SHARED_POLICY_PREFIX = "tpujobs-wp-h"
SHARED_RE2 = r"tpujobs-(t|wp)-h[0-9a-f]+"
_SHARED_VERSION = "1"  # in every hash: a change of what a shared resource holds names new ones


@dataclass(frozen=True)
class Holding:
    """What one holding asks Compute Engine for: the slices of a job attempt or of a warm-pool unit."""

    name: str
    zone: str
    spec: JobSpec
    capacity: str  # the capacity kind this request asks for (a fallback may differ from the spec's)
    labels: Mapping[str, str]  # `tpujobs-job`/`tpujobs-attempt`, or the unit's `tpujobs-pool`/`tpujobs-unit`

    @property
    def region(self) -> str:
        return region_of(self.zone)

    @property
    def shape(self) -> ComputeShape:
        return compute_shape(self.spec.accelerator_type, self.spec.topology)

    def slice_names(self) -> list[str]:
        """S of each slice, in order: the MIG, template and policy names."""
        return [naming.node_id(self.name, i, self.spec.slices) for i in range(self.spec.slices)]


@dataclass(frozen=True)
class Images:
    """Where the TPU VMs' boot images come from: the project and a family per generation."""

    project: str = "ubuntu-os-accelerator-images"
    families: Mapping[str, str] = field(default_factory=dict)  # generation -> family, over the defaults

    def family(self, generation: str) -> str:
        chosen = self.families.get(generation) or DEFAULT_IMAGE_FAMILIES.get(generation)
        if not chosen:
            raise PermanentError(
                f"no Compute Engine boot image family for {generation}: set TPUJOBS_COMPUTE_IMAGE_FAMILIES"
            )
        return chosen

    @classmethod
    def from_settings(cls, project: str, families: tuple[str, ...]) -> Images:
        """From Settings' `compute_image_project` and `generation=family` entries."""
        pairs = dict(entry.split("=", 1) for entry in families if "=" in entry)
        return cls(project or "ubuntu-os-accelerator-images", {k.strip(): v.strip() for k, v in pairs.items()})


def region_of(zone: str) -> str:
    """us-central1-c -> us-central1."""
    return zone.rsplit("-", 1)[0]


def job_holding(job: Job) -> Holding:
    """The current attempt's holding, in the capacity the attempt asks for."""
    labels = {**job.spec.labels, "tpujobs-job": job.job_id, "tpujobs-attempt": str(job.attempt)}
    return Holding(job.queued_resource, job.zone, job.spec, job.capacity, labels)


def unit_holding(unit: UnitRequest) -> Holding:
    """A warm-pool unit's holding: the pool's shape, labelled with the pool and unit only."""
    return Holding(unit.name, unit.zone, unit.spec, unit.spec.capacity, dict(unit.labels))


def max_run_seconds(spec: JobSpec) -> int:
    """A flex-start VM's maxRunDuration (`limits.flex_run_seconds`): the job's smaller time limit
    with the boot, the save on SIGTERM and a margin inside, so tpujobs' own limit comes first."""
    try:
        return flex_run_seconds(spec)
    except ValueError as error:
        raise PermanentError(str(error)) from None


def description(holding: Holding, slice_index: int) -> str:
    """The marker and what a listing needs to know of a resource: its holding, zone, slice, and
    tpujobs' own labels (never the user's: a description is shown to anyone who lists)."""
    ours = {k: v for k, v in sorted(holding.labels.items()) if k.startswith("tpujobs-")}
    said = {"holding": holding.name, "zone": holding.zone, "slice": slice_index, "labels": ours}
    return MARKER + json.dumps(said, sort_keys=True, separators=(",", ":"))


def _marked(text: str) -> dict[str, object] | None:
    """The JSON object after tpujobs' marker, or None for a description without one."""
    if not text.startswith(MARKER):
        return None
    try:
        said = json.loads(text[len(MARKER) :])
    except ValueError:
        return None
    return said if isinstance(said, dict) else None


def parse_description(text: str) -> dict[str, object] | None:
    """What `description` wrote, or None for a resource tpujobs did not make."""
    said = _marked(text)
    return said if said is not None and isinstance(said.get("holding"), str) else None


def shared_description(kind: str, key: str) -> str:
    """The marker of a shared template or policy: its kind and the hash its name ends with. It
    names no holding, so listings never take it for one (`parse_description` is None)."""
    return MARKER + json.dumps({"shared": kind, "key": key}, sort_keys=True, separators=(",", ":"))


def parse_shared(text: str) -> dict[str, str] | None:
    """What `shared_description` wrote, or None for anything else."""
    said = _marked(text)
    if said is None or not isinstance(said.get("shared"), str) or not isinstance(said.get("key"), str):
        return None
    return {"shared": str(said["shared"]), "key": str(said["key"])}


def _key(message: object) -> str:
    """The hash a shared resource is named by: of its content, as canonical JSON."""
    text = type(message).to_json(message, sort_keys=True, indent=0)  # type: ignore[attr-defined]
    return hashlib.sha256(f"{_SHARED_VERSION}\n{text}".encode()).hexdigest()[:20]


def workload_policy(holding: Holding) -> compute_v1.ResourcePolicy:
    """The workload policy every multi-host slice of this topology shares: HIGH_THROUGHPUT,
    naming the topology [WPCLI]."""
    from google.cloud import compute_v1

    policy = compute_v1.ResourcePolicyWorkloadPolicy(
        type_="HIGH_THROUGHPUT", accelerator_topology=holding.shape.topology
    )
    key = _key(policy)
    return compute_v1.ResourcePolicy(
        name=SHARED_POLICY_PREFIX + key,
        description=shared_description("workload policy", key),
        workload_policy=policy,
    )


def all_instances_config(
    holding: Holding, slice_index: int, boot: HostBoot
) -> compute_v1.InstanceGroupManagerAllInstancesConfig:
    """What one slice's VMs carry beyond their shared template: the boot metadata (startup script),
    the slice id and count of a multislice holding, and the holding's labels with the slice's."""
    from google.cloud import compute_v1

    metadata = dict(boot.metadata)
    if holding.spec.slices > 1:
        metadata[SLICE_ID_KEY] = str(slice_index)
        metadata[NUM_SLICES_KEY] = str(holding.spec.slices)
    return compute_v1.InstanceGroupManagerAllInstancesConfig(
        properties=compute_v1.InstancePropertiesPatch(
            metadata=metadata, labels={**holding.labels, SLICE_LABEL: str(slice_index)}
        )
    )


def instance_template(holding: Holding, boot: HostBoot, project: str, images: Images) -> compute_v1.InstanceTemplate:
    """The regional template every holding with these VMs shares: machine type, scheduling per
    capacity kind, boot disk, network, tags, data disks, their own account (never the Compute
    default, which has project Editor); no metadata and no labels (`all_instances_config`)."""
    from google.cloud import compute_v1

    if not boot.service_account:
        raise PermanentError(
            "no service account for the TPU VMs: set TPUJOBS_TPU_SERVICE_ACCOUNT (infra/ does); "
            "tpujobs never lets them fall back to the Compute default account"
        )
    spec, shape = holding.spec, holding.shape
    boot_params = compute_v1.AttachedDiskInitializeParams(
        source_image=f"projects/{images.project}/global/images/family/{images.family(shape.family)}"
    )
    if shape.family in BOOT_DISK_TYPES:
        boot_params.disk_type = BOOT_DISK_TYPES[shape.family]
    disks = [compute_v1.AttachedDisk(boot=True, auto_delete=True, initialize_params=boot_params)]
    disks += [
        # A template names an existing disk by its name only (the template is not zonal).
        compute_v1.AttachedDisk(source=d.source_disk.rsplit("/", 1)[-1], mode=DISK_MODES[d.mode], auto_delete=False)
        for d in spec.data_disks
    ]
    properties = compute_v1.InstanceProperties(
        machine_type=shape.machine_type,
        scheduling=scheduling(holding),
        disks=disks,
        network_interfaces=[network_interface(spec, project, holding.region)],
        service_accounts=[compute_v1.ServiceAccount(email=boot.service_account, scopes=[CLOUD_PLATFORM_SCOPE])],
    )
    if spec.tags:
        properties.tags = compute_v1.Tags(items=list(spec.tags))
    affinity = reservation_affinity(holding, project)
    if affinity is not None:
        properties.reservation_affinity = affinity
    key = _key(properties)
    return compute_v1.InstanceTemplate(
        name=SHARED_TEMPLATE_PREFIX + key,
        description=shared_description("instance template", key),
        properties=properties,
    )


def scheduling(holding: Holding) -> compute_v1.Scheduling:
    """TERMINATE on host maintenance always (TPU VMs cannot live-migrate); the provisioning model
    of the capacity kind; spot, reserved and flex-start VMs are deleted when stopped for them
    (a TPU VM cannot be restarted: it is made again) [SPOT; UG; BULK]."""
    from google.cloud import compute_v1

    result = compute_v1.Scheduling(
        on_host_maintenance="TERMINATE",
        provisioning_model=PROVISIONING_MODELS[holding.capacity],
        automatic_restart=False,
    )
    if holding.capacity != "on-demand":
        result.instance_termination_action = "DELETE"
    if holding.capacity == "flex-start":
        result.max_run_duration = compute_v1.Duration(seconds=max_run_seconds(holding.spec))
    return result


def reservation_affinity(holding: Holding, project: str) -> compute_v1.ReservationAffinity | None:
    """Reserved: the spec's reservation, SPECIFIC_RESERVATION, as RESERVATION_BOUND VMs "must
    specifically target the reservation" [about-reservation-bound-vms; bulk-create-instances-in-mig:
    `--reservation-affinity=specific`], so one that names none is refused here, never sent as
    ANY_RESERVATION; flex-start: none ever [SKY mig_utils]; else the API's default (ANY_RESERVATION)."""
    from google.cloud import compute_v1

    if holding.capacity == "flex-start":
        return compute_v1.ReservationAffinity(consume_reservation_type="NO_RESERVATION")
    if holding.capacity != "reserved":
        return None
    if not holding.spec.reservation:
        raise PermanentError(
            "capacity 'reserved' on Compute Engine needs the spec's reservation: RESERVATION_BOUND VMs "
            "must name the reservation they consume (SPECIFIC_RESERVATION)"
        )
    return compute_v1.ReservationAffinity(
        consume_reservation_type="SPECIFIC_RESERVATION",
        key="compute.googleapis.com/reservation-name",
        values=[reservation_name(holding.spec.reservation, project)],
    )


def reservation_name(reservation: str, project: str) -> str:
    """A reservation as Compute Engine's affinity names it: the bare name in this project, or
    `projects/P/reservations/N` for a shared one of another project (the TPU API's
    `projects/P/locations/Z/reservations/N` is read the same way)."""
    parts = reservation.split("/")
    if len(parts) >= 4 and parts[0] == "projects" and parts[-2] == "reservations":
        owner, name = parts[1], parts[-1]
        return name if owner == project else f"projects/{owner}/reservations/{name}"
    return parts[-1]


def network_interface(spec: JobSpec, project: str, region: str) -> compute_v1.NetworkInterface:
    """The VMs' one NIC (gVNIC): the spec's network and subnetwork (a short subnetwork gets the
    full path, which a template needs [UG]), and an external IP unless `internal_ips`."""
    from google.cloud import compute_v1

    network = spec.network or "default"
    nic = compute_v1.NetworkInterface(
        network=network if network.startswith("projects/") else f"projects/{project}/global/networks/{network}",
        nic_type="GVNIC",
    )
    if spec.subnetwork:
        nic.subnetwork = (
            spec.subnetwork
            if spec.subnetwork.startswith("projects/")
            else f"projects/{project}/regions/{region}/subnetworks/{spec.subnetwork}"
        )
    if not spec.internal_ips:
        nic.access_configs = [compute_v1.AccessConfig(name="External NAT", type_="ONE_TO_ONE_NAT")]
    return nic


def instance_group_manager(
    holding: Holding,
    slice_index: int,
    project: str,
    template: str,
    boot: HostBoot,
    policy: str = "",
) -> compute_v1.InstanceGroupManager:
    """One slice's zonal MIG: `hosts` VMs from the shared template `template`, with the slice's
    own metadata and labels (`all_instances_config`), never repaired one by one (a slice
    recovers whole [FR]), the shared workload policy `policy` on a multi-host slice, and bulk
    mode (all or nothing) where the capacity kind allows it [BULK]."""
    from google.cloud import compute_v1

    name, shape = holding.slice_names()[slice_index], holding.shape
    region_path = f"projects/{project}/regions/{holding.region}"
    manager = compute_v1.InstanceGroupManager(
        name=name,
        description=description(holding, slice_index),
        base_instance_name=name,
        instance_template=f"{region_path}/instanceTemplates/{template}",
        all_instances_config=all_instances_config(holding, slice_index, boot),
        target_size=shape.hosts,
        instance_lifecycle_policy=compute_v1.InstanceGroupManagerInstanceLifecyclePolicy(
            default_action_on_failure="DO_NOTHING"
        ),
        target_size_policy=compute_v1.InstanceGroupManagerTargetSizePolicy(
            mode="BULK" if holding.capacity in BULK_CAPACITY else "INDIVIDUAL"
        ),
    )
    if shape.multi_host:
        if not policy:
            raise PermanentError(f"a multi-host slice of {holding.name} needs its workload policy")
        manager.resource_policies = compute_v1.InstanceGroupManagerResourcePolicies(
            workload_policy=f"{region_path}/resourcePolicies/{policy}"
        )
    return manager


# Every name a tpujobs Compute Engine resource can have, as the list filter's RE2 (which must
# match the whole name): `{job}-c{N}` or `{pool}-c{i}-g{N}`, a slice's `-{i}`, and for a VM the
# MIG's own suffix. A listing still keeps only what carries the marker (`parse_description`).
HOLDING_RE2 = r"[a-z][-a-z0-9]*-c[0-9]+(-g[0-9]+)?"
SLICE_RE2 = HOLDING_RE2 + r"(-[0-9]+)?"
INSTANCE_RE2 = SLICE_RE2 + r"-[a-z0-9]+"


def name_filter(pattern: str) -> str:
    """A Compute Engine list filter keeping names that `pattern` (RE2) matches whole."""
    return f'name eq "{pattern}"'


def holding_filter(holding: str, instances: bool = False) -> str:
    """The filter of one holding's slices (MIGs, templates, policies), or of its VMs."""
    pattern = holding + r"(-[0-9]+)?" + (r"-[a-z0-9]+" if instances else "")
    return name_filter(pattern)
