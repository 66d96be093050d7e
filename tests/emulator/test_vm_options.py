"""Every network and VM option of a spec reaches the TPU API: requested through CloudTpu.request,
read back through the real google-cloud-tpu client from the simulator; and the simulator refuses,
as Google does (400 INVALID_ARGUMENT with a BadRequest detail), the combinations the API refuses.
The deployment's VM defaults on the submit path are tests/unit/engine/test_engine_vm_defaults.py."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

import pytest
from google.api_core import exceptions
from google.cloud import tpu_v2

from tpujobs.adapters.tpu import CloudTpu
from tpujobs.domain.job import Job, new_job
from tpujobs.domain.spec import VmDefaults, parse_spec, with_deployment_defaults
from tpujobs.engine.ports import HostBoot

pytestmark = pytest.mark.emulator

PROJECT = "tpujobs-test"
ZONE = "us-central2-b"
PARENT = f"projects/{PROJECT}/locations/{ZONE}"
BOOT = HostBoot("tpu-vm@tpujobs-test.iam.gserviceaccount.com", {"startup-script": "#!/bin/bash\ntrue"})
NETWORK = "projects/net-host/global/networks/training"
SUBNET = "projects/net-host/regions/us-central2/subnetworks/tpu-us-central2"
DATASETS = f"projects/{PROJECT}/zones/{ZONE}/disks/datasets"
SCRATCH = f"projects/{PROJECT}/zones/{ZONE}/disks/scratch"


def a_job(**fields: Any) -> Job:
    spec = parse_spec({"name": "vm", "owner": "ada@example.com", "command": "python train.py", **fields})
    job, _ = new_job(spec, ZONE, datetime(2026, 1, 1, tzinfo=timezone.utc))
    return job


def read_back(tpu_client: tpu_v2.TpuClient, job: Job) -> tpu_v2.QueuedResource:
    return tpu_client.get_queued_resource(name=f"{PARENT}/queuedResources/{job.queued_resource}")


def test_a_job_with_every_vm_option_is_read_back_with_each_field_as_asked(tpu_client: tpu_v2.TpuClient) -> None:
    """network, subnetwork, internal IPs, tags, read-only and read-write disks, topology, runtime
    and reserved capacity without a reservation, each where the v2 API keeps it."""
    job = a_job(
        job_id="every-option",
        accelerator_type="v5litepod-8",  # one host: the one shape a read-write disk may attach to
        topology="2x4",
        runtime_version="v2-alpha-tpuv5-lite",
        zone=ZONE,
        capacity="reserved",
        network=NETWORK,
        subnetwork=SUBNET,
        internal_ips=True,
        tags=["tpu-training", "allow-internal"],
        data_disks=[{"source_disk": DATASETS}, {"source_disk": SCRATCH, "mode": "read-write"}],
    )
    status = CloudTpu(tpu_client, PROJECT).request(job, BOOT)
    assert status.name == job.queued_resource

    resource = read_back(tpu_client, job)
    assert resource.name == f"{PARENT}/queuedResources/{job.queued_resource}"
    assert "guaranteed" in resource and "spot" not in resource and resource.reservation_name == ""
    node_spec = resource.tpu.node_spec[0]
    assert (node_spec.parent, node_spec.node_id) == (PARENT, job.queued_resource)
    node = node_spec.node
    assert node.accelerator_type == ""  # asked for as accelerator_config alone
    assert node.accelerator_config.type_ == tpu_v2.AcceleratorConfig.Type.V5LITE_POD
    assert node.accelerator_config.topology == "2x4"
    assert node.runtime_version == "v2-alpha-tpuv5-lite"
    assert node.network_config.network == NETWORK
    assert node.network_config.subnetwork == SUBNET
    assert node.network_config.enable_external_ips is False
    assert list(node.tags) == ["tpu-training", "allow-internal"]
    assert [(d.source_disk, d.mode) for d in node.data_disks] == [
        (DATASETS, tpu_v2.AttachedDisk.DiskMode.READ_ONLY),
        (SCRATCH, tpu_v2.AttachedDisk.DiskMode.READ_WRITE),
    ]
    assert node.scheduling_config.reserved is True and node.scheduling_config.spot is False
    assert node.service_account.email == BOOT.service_account
    assert node.labels["tpujobs-job"] == "every-option"


def test_the_teams_defaults_reach_the_api_for_a_spec_that_gives_none(tpu_client: tpu_v2.TpuClient) -> None:
    """A two-slice job without VM options gets the deployment's network, internal IPs and tags
    on every slice, and its accelerator type as asked."""
    defaults = VmDefaults(network="training", subnetwork="tpu", internal_ips=True, tags=("tpu-training",))
    spec = with_deployment_defaults(
        parse_spec(
            {
                "job_id": "defaults",
                "name": "defaults",
                "owner": "ada@example.com",
                "command": "x",
                "accelerator_type": "v4-16",
                "slices": 2,
            }
        ),
        defaults,
        default_zone=ZONE,
    )
    job, _ = new_job(spec, ZONE, datetime(2026, 1, 1, tzinfo=timezone.utc))
    CloudTpu(tpu_client, PROJECT).request(job, BOOT)
    node_spec = read_back(tpu_client, job).tpu.node_spec[0]
    assert (node_spec.multislice_params.node_count, node_spec.multislice_params.node_id_prefix) == (
        2,
        job.queued_resource,
    )
    node = node_spec.node
    assert node.accelerator_type == "v4-16" and "accelerator_config" not in node
    assert (node.network_config.network, node.network_config.subnetwork) == ("training", "tpu")
    assert node.network_config.enable_external_ips is False and list(node.tags) == ["tpu-training"]


def test_a_network_without_internal_ips_keeps_external_ips(tpu_client: tpu_v2.TpuClient) -> None:
    """enable_external_ips comes back true: the request said so explicitly."""
    job = a_job(job_id="external", accelerator_type="v4-8", network="training")
    CloudTpu(tpu_client, PROJECT).request(job, BOOT)
    config = read_back(tpu_client, job).tpu.node_spec[0].node.network_config
    assert (config.network, config.enable_external_ips) == ("training", True)


# --- what the simulator refuses, through the real client ------------------------------------


def raw_node(**fields: Any) -> tpu_v2.Node:
    return tpu_v2.Node(runtime_version="tpu-ubuntu2204-base", **fields)


def create(tpu_client: tpu_v2.TpuClient, node: tpu_v2.Node, *, node_count: int = 0) -> None:
    spec = tpu_v2.QueuedResource.Tpu.NodeSpec(parent=PARENT, node=node)
    if node_count:
        spec.multislice_params = tpu_v2.QueuedResource.Tpu.NodeSpec.MultisliceParams(
            node_count=node_count, node_id_prefix="refused"
        )
    else:
        spec.node_id = "refused"
    resource = tpu_v2.QueuedResource(tpu=tpu_v2.QueuedResource.Tpu(node_spec=[spec]))
    tpu_client.create_queued_resource(parent=PARENT, queued_resource_id="refused", queued_resource=resource)


V4_CONFIG = tpu_v2.AcceleratorConfig(type_=tpu_v2.AcceleratorConfig.Type.V4, topology="2x2x4")

REFUSED: dict[str, tuple[dict[str, Any], int, str, str]] = {
    # id: (node fields, slices, the field violation's field ending, words of the message)
    "type and config": (
        {"accelerator_type": "v4-32", "accelerator_config": V4_CONFIG},
        0,
        "node.accelerator_config",
        "Only one of accelerator_type and accelerator_config",
    ),
    "topology of another family's shape": (
        {"accelerator_config": tpu_v2.AcceleratorConfig(type_=tpu_v2.AcceleratorConfig.Type.V4, topology="4x4")},
        0,
        "node.accelerator_config",
        "topology '4x4' has 2 dimensions; v4 slices have 3",
    ),
    "topology of a size not offered": (
        {"accelerator_config": tpu_v2.AcceleratorConfig(type_=tpu_v2.AcceleratorConfig.Type.V2, topology="4x8")},
        0,
        "node.accelerator_config",
        "v2 is not offered with size 64",
    ),
    "malformed network": (
        {"accelerator_type": "v4-8", "network_config": tpu_v2.NetworkConfig(network="projects/p/networks/n")},
        0,
        "network_config.network",
        "Invalid value for field 'network'",
    ),
    "malformed subnetwork": (
        {
            "accelerator_type": "v4-8",
            "network_config": tpu_v2.NetworkConfig(network="n", subnetwork="regions/us-central2/subnetworks/s"),
        },
        0,
        "network_config.subnetwork",
        "Invalid value for field 'subnetwork'",
    ),
    "subnetwork of another region": (
        {
            "accelerator_type": "v4-8",
            "network_config": tpu_v2.NetworkConfig(
                network="n", subnetwork="projects/net-host/regions/us-east5/subnetworks/s"
            ),
        },
        0,
        "network_config.subnetwork",
        f"is in region us-east5, but the node is in zone {ZONE} of region us-central2",
    ),
    "disk of another zone": (
        {
            "accelerator_type": "v4-8",
            "data_disks": [tpu_v2.AttachedDisk(source_disk="projects/p1234/zones/us-east5-a/disks/d", mode=2)],
        },
        0,
        "data_disks[0].source_disk",
        f"is in zone us-east5-a, but the node is in zone {ZONE}",
    ),
    "malformed disk": (
        {"accelerator_type": "v4-8", "data_disks": [tpu_v2.AttachedDisk(source_disk="disks/d", mode=2)]},
        0,
        "data_disks[0].source_disk",
        "Invalid source_disk 'disks/d'",
    ),
    "read-write disk on several hosts": (
        {"accelerator_type": "v4-16", "data_disks": [tpu_v2.AttachedDisk(source_disk=DATASETS, mode=1)]},
        0,
        "data_disks[0].mode",
        "attached READ_WRITE to 2 VMs",
    ),
    "read-write disk on several slices": (
        {"accelerator_type": "v4-8", "data_disks": [tpu_v2.AttachedDisk(source_disk=DATASETS, mode=1)]},
        2,
        "data_disks[0].mode",
        "attached READ_WRITE to 2 VMs",
    ),
    "malformed tag": (
        {"accelerator_type": "v4-8", "tags": ["Allow_SSH"]},
        0,
        "node.tags",
        "Invalid network tag 'Allow_SSH'",
    ),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_the_simulator_refuses_what_the_api_refuses_with_googles_error(tpu_client: tpu_v2.TpuClient, case: str) -> None:
    """400 INVALID_ARGUMENT, the client's BadRequest, with a google.rpc.BadRequest naming the field."""
    fields, slices, field_end, words = REFUSED[case]
    with pytest.raises(exceptions.BadRequest) as refused:
        create(tpu_client, raw_node(**fields), node_count=slices)
    body = refused.value.response.json()["error"]
    assert body["status"] == "INVALID_ARGUMENT" and words in body["message"]
    (violation,) = body["details"][0]["fieldViolations"]
    assert violation["field"].endswith(field_end), violation["field"]
    assert words in refused.value.message
    with pytest.raises(exceptions.NotFound):
        tpu_client.get_queued_resource(name=f"{PARENT}/queuedResources/refused")


def test_a_bad_disk_mode_is_refused(tpu_client: tpu_v2.TpuClient) -> None:
    """A mode number that is no DiskMode is refused naming the disk's mode."""
    node = raw_node(accelerator_type="v4-8", data_disks=[tpu_v2.AttachedDisk(source_disk=DATASETS, mode=7)])
    with pytest.raises(exceptions.BadRequest) as refused:
        create(tpu_client, node)
    assert "Invalid disk mode" in refused.value.message
