"""The VM options of a spec as the TPU v2 request carries them (adapters.tpu.queued_resource_for)."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from google.cloud import tpu_v2

from tpujobs.adapters.tpu import queued_resource_for
from tpujobs.domain.job import Job, new_job
from tpujobs.domain.spec import parse_spec
from tpujobs.engine.ports import HostBoot

BOOT = HostBoot("tpu-vm@p.iam.gserviceaccount.com", {"startup-script": "#!/bin/bash"})
NETWORK = "projects/net-host/global/networks/training"
SUBNET = "projects/net-host/regions/us-central2/subnetworks/tpu"
DISK = "projects/my-proj/zones/us-central2-b/disks/datasets"


def a_job(**changes: Any) -> Job:
    spec = parse_spec(
        {"job_id": "vm-1", "name": "vm", "owner": "ada", "accelerator_type": "v4-8", "command": "x", **changes}
    )
    job, _ = new_job(spec, "us-central2-b", datetime(2026, 1, 1, tzinfo=timezone.utc))
    return job


def node_of(job: Job) -> tpu_v2.Node:
    return queued_resource_for(job, "p", BOOT).tpu.node_spec[0].node


def test_every_network_option_is_in_the_nodes_network_config() -> None:
    """network, subnetwork and internal_ips become NetworkConfig, external IPs off."""
    node = node_of(a_job(network=NETWORK, subnetwork=SUBNET, internal_ips=True))
    config = node.network_config
    assert (config.network, config.subnetwork, config.enable_external_ips) == (NETWORK, SUBNET, False)


def test_a_network_without_internal_ips_keeps_external_ips_on() -> None:
    """enable_external_ips is a plain bool: sent true, or the VMs would lose their external IPs."""
    assert node_of(a_job(network="training")).network_config.enable_external_ips is True


def test_without_network_options_no_network_config_is_sent() -> None:
    """The API's own default network and external IPs, as before."""
    assert "network_config" not in node_of(a_job())


def test_tags_and_data_disks_are_on_the_node_with_their_modes() -> None:
    """Network tags as given; each disk as an AttachedDisk with its mode."""
    node = node_of(
        a_job(
            zone="us-central2-b",
            tags=["tpu-training", "allow-ssh"],
            data_disks=[{"source_disk": DISK}, {"source_disk": DISK + "-rw", "mode": "read-write"}],
        )
    )
    assert list(node.tags) == ["tpu-training", "allow-ssh"]
    assert [(d.source_disk, d.mode) for d in node.data_disks] == [
        (DISK, tpu_v2.AttachedDisk.DiskMode.READ_ONLY),
        (DISK + "-rw", tpu_v2.AttachedDisk.DiskMode.READ_WRITE),
    ]


def test_a_topology_sends_accelerator_config_instead_of_accelerator_type() -> None:
    """The API takes one or the other: the family's type and the topology, and no accelerator_type."""
    node = node_of(a_job(accelerator_type="v5litepod-16", topology="4x4"))
    assert node.accelerator_type == ""
    assert (node.accelerator_config.type_, node.accelerator_config.topology) == (
        tpu_v2.AcceleratorConfig.Type.V5LITE_POD,
        "4x4",
    )
    plain = node_of(a_job(accelerator_type="v4-32"))
    assert plain.accelerator_type == "v4-32" and "accelerator_config" not in plain


def test_reserved_without_a_name_uses_any_reservation() -> None:
    """SchedulingConfig.reserved on the guaranteed tier, and no reservation_name."""
    resource = queued_resource_for(a_job(capacity="reserved"), "p", BOOT)
    assert resource.tpu.node_spec[0].node.scheduling_config.reserved is True
    assert tpu_v2.QueuedResource.pb(resource).HasField("guaranteed")
    assert resource.reservation_name == ""


def test_reserved_with_a_name_asks_for_that_reservation() -> None:
    """A short reservation name becomes its full path in the job's zone."""
    resource = queued_resource_for(a_job(capacity="reserved", reservation="r1"), "p", BOOT)
    assert resource.reservation_name == "projects/p/locations/us-central2-b/reservations/r1"
    assert resource.tpu.node_spec[0].node.scheduling_config.reserved is True
    assert tpu_v2.QueuedResource.pb(resource).HasField("guaranteed")
