"""The spec's VM options (network, subnetwork, internal_ips, tags, boot_disk_size_gb, data_disks,
topology), each rule's rejection sentence, and the deployment's defaults filled in at submit."""

from __future__ import annotations

from typing import Any

import pytest

from tpujobs.domain.accelerators import (
    FAMILIES,
    BadTopology,
    accelerator_type_of,
    check_topology,
    parse_accelerator_type,
)
from tpujobs.domain.spec import (
    MAX_DATA_DISKS,
    MAX_TAGS,
    JobSpec,
    SpecError,
    VmDefaults,
    parse_spec,
    with_deployment_defaults,
)
from tpujobs.engine.settings import Settings

BASE: dict[str, Any] = {
    "job_id": "vm-1",
    "name": "vm",
    "owner": "ada@example.com",
    "accelerator_type": "v4-8",
    "command": "python train.py",
}
NETWORK = "projects/net-host/global/networks/training"
SUBNET = "projects/net-host/regions/us-central2/subnetworks/tpu"
DISK = "projects/my-proj/zones/us-central2-b/disks/datasets"


def spec(**changes: Any) -> JobSpec:
    return parse_spec({**BASE, **changes})


def rejection(**changes: Any) -> str:
    with pytest.raises(SpecError) as info:
        parse_spec({**BASE, **changes})
    return str(info.value)


def test_a_spec_with_every_vm_option_keeps_each_as_given() -> None:
    """Every option is accepted and kept; the stored document holds them all."""
    given = spec(
        zone="us-central2-b",
        network=NETWORK,
        subnetwork=SUBNET,
        internal_ips=True,
        tags=["tpu-training", "allow-ssh"],
        data_disks=[{"source_disk": DISK}, {"source_disk": DISK + "-rw", "mode": "read-write"}],
        topology="2x2x1",
    )
    document = given.to_document()
    assert document["network"] == NETWORK and document["subnetwork"] == SUBNET
    assert document["internal_ips"] is True and document["tags"] == ["tpu-training", "allow-ssh"]
    assert document["data_disks"] == [
        {"source_disk": DISK, "mode": "read-only"},
        {"source_disk": DISK + "-rw", "mode": "read-write"},
    ]
    assert document["topology"] == "2x2x1" and document["boot_disk_size_gb"] is None
    assert parse_spec(document) == given


def test_without_vm_options_the_apis_defaults_apply() -> None:
    """Nothing given: no network, external IPs, no tags, no disks, no topology."""
    plain = spec()
    assert (plain.network, plain.subnetwork, plain.internal_ips, plain.tags, plain.data_disks, plain.topology) == (
        None,
        None,
        False,
        [],
        [],
        None,
    )


@pytest.mark.parametrize("network", ["training", "default", NETWORK, "projects/example.com:proj-1/global/networks/n"])
def test_a_network_name_or_path_is_accepted(network: str) -> None:
    """A network is a name or projects/PROJECT/global/networks/NAME (a shared VPC host's too)."""
    assert spec(network=network).network == network


@pytest.mark.parametrize(
    "network",
    ["Training", "net_1", "-net", "net-", "projects/p/global/networks/n", "global/networks/n", "projects/proj-1/n", ""],
)
def test_a_malformed_network_is_rejected_naming_network(network: str) -> None:
    """Anything else is refused with a sentence that names the field and both forms."""
    message = rejection(network=network)
    assert message.startswith("network ") and "projects/PROJECT/global/networks/NAME" in message


@pytest.mark.parametrize(
    "subnetwork",
    ["Tpu", "projects/proj-1/zones/us-central2-b/subnetworks/s", "projects/proj-1/regions/x/subnetworks/s"],
)
def test_a_malformed_subnetwork_is_rejected_naming_subnetwork(subnetwork: str) -> None:
    """A subnetwork is a name or projects/PROJECT/regions/REGION/subnetworks/NAME."""
    message = rejection(network="n", subnetwork=subnetwork)
    assert message.startswith("subnetwork ") and "regions/REGION/subnetworks/NAME" in message


def test_a_subnetwork_without_its_network_is_rejected() -> None:
    """The API would use the network 'default', which refuses another network's subnetwork."""
    message = rejection(subnetwork="tpu")
    assert "subnetwork needs network" in message


def test_a_subnetwork_name_is_not_checked_against_zones() -> None:
    """A bare name says no region: the API finds it in the zone's region."""
    assert spec(network="n", subnetwork="tpu", zones=["us-central2-b", "us-east5-a"]).subnetwork == "tpu"


@pytest.mark.parametrize(
    ("where", "bad_zone"),
    [({"zone": "us-east5-a"}, "us-east5-a"), ({"zones": ["us-central2-b", "us-east5-a"]}, "us-east5-a")],
)
def test_a_subnetwork_of_another_region_than_a_zone_of_the_job_is_rejected(
    where: dict[str, Any], bad_zone: str
) -> None:
    """Every zone the job may use must be in the subnetwork's region."""
    message = rejection(network="n", subnetwork=SUBNET, **where)
    assert f"region us-central2, but the job may run in zone {bad_zone} of region us-east5" in message


def test_internal_ips_must_be_a_boolean() -> None:
    """Strict types: "yes" is not true."""
    assert "internal_ips" in rejection(internal_ips="yes")


@pytest.mark.parametrize("tag", ["Web", "1st", "a_b", "ends-", "x" * 64, ""])
def test_a_malformed_tag_is_rejected_naming_tags(tag: str) -> None:
    """Network tags are RFC 1035 labels."""
    assert rejection(tags=[tag]).startswith("tags entry ")


def test_a_tag_given_twice_is_rejected() -> None:
    """Tags are unique."""
    assert rejection(tags=["web", "db", "web"]) == "tags lists 'web' twice"


def test_at_most_64_tags() -> None:
    """A VM takes at most 64 network tags."""
    tags = [f"t{i}" for i in range(MAX_TAGS)]
    assert spec(tags=tags).tags == tags
    assert f"at most {MAX_TAGS}" in rejection(tags=[*tags, "one-more"])


@pytest.mark.parametrize("size", [10, 100, 0])
def test_any_boot_disk_size_is_rejected_saying_the_api_has_none(size: int) -> None:
    """The TPU v2 API offers no boot disk size: the sentence says so and points to data_disks."""
    message = rejection(boot_disk_size_gb=size)
    assert message.startswith("boot_disk_size_gb ")
    assert "TPU v2 API offers no boot disk size" in message and "data_disks" in message


def test_data_disks_are_read_only_unless_asked() -> None:
    """read-only is the default mode: every job shape can use it."""
    disks = spec(zone="us-central2-b", data_disks=[{"source_disk": DISK}]).data_disks
    assert [(d.source_disk, d.mode, d.zone) for d in disks] == [(DISK, "read-only", "us-central2-b")]


@pytest.mark.parametrize(
    "disk",
    [
        {"source_disk": "datasets"},
        {"source_disk": "projects/my-proj/regions/us-central2/disks/d"},
        {"source_disk": "zones/us-central2-b/disks/d"},
    ],
)
def test_a_malformed_disk_path_is_rejected(disk: dict[str, str]) -> None:
    """A data disk is named by its full zonal path."""
    assert "is not a disk path projects/PROJECT/zones/ZONE/disks/NAME" in rejection(data_disks=[disk])


def test_a_bad_disk_mode_or_an_unknown_disk_field_is_rejected() -> None:
    """mode is read-only or read-write; a disk has no other fields."""
    assert "data_disks.0.mode" in rejection(data_disks=[{"source_disk": DISK, "mode": "rw"}])
    assert "data_disks.0.size" in rejection(data_disks=[{"source_disk": DISK, "size": 10}])


def test_a_disk_given_twice_is_rejected() -> None:
    """A disk attaches once."""
    assert "lists " + DISK + " twice" in rejection(data_disks=[{"source_disk": DISK}, {"source_disk": DISK}])


def test_at_most_16_data_disks() -> None:
    """A bound of ours on the request."""
    disks = [{"source_disk": f"{DISK}-{i}"} for i in range(MAX_DATA_DISKS + 1)]
    assert f"at most {MAX_DATA_DISKS}" in rejection(data_disks=disks)


def test_a_disk_of_another_zone_than_the_jobs_is_rejected() -> None:
    """A persistent disk attaches only to VMs of its own zone."""
    message = rejection(zone="us-central2-a", data_disks=[{"source_disk": DISK}])
    assert "is in zone us-central2-b, but the job runs in us-central2-a" in message


def test_data_disks_on_a_job_of_several_zones_are_rejected() -> None:
    """A job that may move between zones cannot take a zonal disk along."""
    message = rejection(zones=["us-central2-b", "us-central2-a"], data_disks=[{"source_disk": DISK}])
    assert message.startswith("data_disks are zonal, but the job may run in 2 zones")


def test_data_disks_of_two_zones_are_rejected_even_without_a_zone() -> None:
    """The disks of one job share its one zone."""
    other = "projects/my-proj/zones/us-east5-a/disks/d"
    assert "us-central2-b, us-east5-a" in rejection(data_disks=[{"source_disk": DISK}, {"source_disk": other}])


@pytest.mark.parametrize(("accelerator_type", "slices"), [("v4-16", 1), ("v4-8", 2), ("v5litepod-16", 1)])
def test_a_read_write_disk_on_more_than_one_vm_is_rejected(accelerator_type: str, slices: int) -> None:
    """A persistent disk attaches read-write to one VM only."""
    message = rejection(
        accelerator_type=accelerator_type, slices=slices, data_disks=[{"source_disk": DISK, "mode": "read-write"}]
    )
    assert message.startswith("data_disks: a read-write disk attaches to one VM only")


def test_a_read_write_disk_on_one_host_and_read_only_on_many_are_accepted() -> None:
    """Single-host single-slice may write; any shape may read."""
    one = spec(accelerator_type="v5litepod-8", data_disks=[{"source_disk": DISK, "mode": "read-write"}])
    assert one.data_disks[0].mode == "read-write"
    many = spec(accelerator_type="v4-32", slices=2, data_disks=[{"source_disk": DISK}])
    assert many.data_disks[0].mode == "read-only"


# --- reserved capacity ------------------------------------------------------------------


def test_reserved_capacity_may_name_a_reservation_or_none() -> None:
    """No reservation: any matching one of the project (gcloud's --reserved)."""
    assert spec(capacity="reserved").reservation is None
    assert spec(capacity="reserved", reservation="r1").reservation == "r1"


# --- topology ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("accelerator_type", "topology"),
    [
        ("v4-32", "2x2x4"),
        ("v4-8", "2x2x1"),
        ("v5p-16", "2x2x2"),
        ("v5litepod-16", "4x4"),
        ("v6e-8", "2x4"),
        ("v2-32", "4x4"),
        ("v3-8", "2x2"),
    ],
)
def test_a_topology_of_the_types_chips_and_family_is_accepted(accelerator_type: str, topology: str) -> None:
    """AxB for v2, v3, v5e and v6e, AxBxC for v4 and v5p, with the type's chips; and back."""
    assert spec(accelerator_type=accelerator_type, topology=topology).topology == topology
    config_type = FAMILIES[parse_accelerator_type(accelerator_type).family].config_type
    assert accelerator_type_of(config_type, topology) == accelerator_type


@pytest.mark.parametrize(
    ("accelerator_type", "topology", "said"),
    [
        ("v4-32", "2x2x2", "topology '2x2x2' has 8 chips but accelerator_type 'v4-32' has 16"),
        ("v4-32", "4x4", "topology '4x4' has 2 dimensions; v4 slices have 3"),
        ("v5litepod-16", "2x2x4", "topology '2x2x4' has 3 dimensions; v5litepod slices have 2"),
        ("v6e-8", "4x4", "topology '4x4' has 16 chips but accelerator_type 'v6e-8' has 8"),
        ("v4-8", "2x2x1x1", "is not of the form AxB or AxBxC"),
        ("v4-8", "2*2*1", "is not of the form AxB or AxBxC"),
        ("v4-8", "0x2x2", "is not of the form AxB or AxBxC"),
    ],
)
def test_a_topology_that_does_not_fit_the_type_is_rejected_naming_both(
    accelerator_type: str, topology: str, said: str
) -> None:
    message = rejection(accelerator_type=accelerator_type, topology=topology)
    assert message.startswith("topology ") and said in message


def test_check_topology_raises_bad_topology() -> None:
    """The domain function raises its own error type, a ValueError."""
    with pytest.raises(BadTopology, match="has 8 chips"):
        check_topology("v4-32", "2x2x2")


def test_an_accelerator_config_of_a_size_not_offered_names_no_type() -> None:
    """A config of a size the family is not offered in, or an unknown type, names no accelerator type."""
    with pytest.raises(ValueError, match="not offered with size"):
        accelerator_type_of("V2", "4x8")
    with pytest.raises(ValueError, match=r"accelerator_config\.type 'V9'"):
        accelerator_type_of("V9", "2x2")


# --- deployment defaults ----------------------------------------------------------------

TEAM = VmDefaults(
    network=NETWORK,
    subnetwork=SUBNET,
    internal_ips=True,
    tags=("tpu-training",),
    data_disks=((DISK, "read-only"),),
    runtime_version="v2-alpha-tpuv4",
)


def test_defaults_fill_every_option_the_spec_left_out_and_count_as_given() -> None:
    """A spec without VM options gets the team's, and the stored spec shows them."""
    filled = with_deployment_defaults(spec(), TEAM, default_zone="us-central2-b")
    assert (filled.network, filled.subnetwork, filled.internal_ips, filled.tags) == (
        NETWORK,
        SUBNET,
        True,
        ["tpu-training"],
    )
    assert [d.source_disk for d in filled.data_disks] == [DISK] and filled.runtime_version == "v2-alpha-tpuv4"
    assert {"network", "subnetwork", "internal_ips", "tags", "data_disks", "runtime_version"} <= filled.model_fields_set
    assert filled.job_id == "vm-1" and filled.command == "python train.py"


def test_options_the_spec_gives_win_even_when_empty_or_false() -> None:
    """Given is given: an empty list or false is not a missing field."""
    given = spec(
        network="other",
        subnetwork="s",
        internal_ips=False,
        tags=[],
        data_disks=[],
        runtime_version="rt-2",
        platform="tpu-api",
    )
    kept = with_deployment_defaults(given, TEAM, default_zone="us-central2-b")
    assert kept == given


def test_no_defaults_leave_the_spec_as_it_is() -> None:
    """A deployment without defaults changes nothing in a spec that names its platform."""
    plain = spec(platform="tpu-api")
    assert with_deployment_defaults(plain, VmDefaults(), default_zone="us-central2-b") is plain


def test_a_default_that_does_not_fit_the_job_is_a_rejection_naming_the_default() -> None:
    """The team's subnetwork is regional: a job in another region is told which default clashed."""
    with pytest.raises(SpecError) as info:
        with_deployment_defaults(spec(zone="us-east5-a"), VmDefaults(network="n", subnetwork=SUBNET))
    message = str(info.value)
    assert "in region us-central2, but the job may run in zone us-east5-a" in message
    assert message.endswith("(with the deployment's default network, subnetwork)")


def test_zonal_options_of_a_job_without_a_zone_are_checked_against_the_default_zone() -> None:
    """A job without a zone runs in the default zone, so its disks must be there."""
    with pytest.raises(SpecError, match="the deployment's default zone"):
        with_deployment_defaults(spec(data_disks=[{"source_disk": DISK}]), VmDefaults(), default_zone="us-east5-a")
    fits = spec(data_disks=[{"source_disk": DISK}], platform="tpu-api")
    assert with_deployment_defaults(fits, VmDefaults(), default_zone="us-central2-b") is fits


def test_settings_read_the_defaults_from_the_environment() -> None:
    """TPUJOBS_DEFAULT_* become Settings.vm_defaults; none set: no defaults."""
    settings = Settings.from_env(
        {
            "TPUJOBS_DEFAULT_NETWORK": NETWORK,
            "TPUJOBS_DEFAULT_SUBNETWORK": SUBNET,
            "TPUJOBS_DEFAULT_INTERNAL_IPS": "true",
            "TPUJOBS_DEFAULT_TAGS": "tpu-training, allow-ssh",
            "TPUJOBS_DEFAULT_DATA_DISKS": f"{DISK},{DISK}-2:read-write",
            "TPUJOBS_DEFAULT_RUNTIME_VERSION": "v2-alpha-tpuv4",
        }
    )
    assert settings.vm_defaults == VmDefaults(
        network=NETWORK,
        subnetwork=SUBNET,
        internal_ips=True,
        tags=("tpu-training", "allow-ssh"),
        data_disks=((DISK, "read-only"), (f"{DISK}-2", "read-write")),
        runtime_version="v2-alpha-tpuv4",
    )
    assert Settings.from_env({}).vm_defaults == VmDefaults()
    assert Settings.from_env({"TPUJOBS_DEFAULT_INTERNAL_IPS": "0"}).vm_defaults.internal_ips is False


def test_a_default_internal_ips_that_is_not_a_yes_or_no_stops_the_settings() -> None:
    """A typo in a deployment variable is an error, never silently external IPs."""
    with pytest.raises(ValueError, match="TPUJOBS_DEFAULT_INTERNAL_IPS must be true or false"):
        Settings.from_env({"TPUJOBS_DEFAULT_INTERNAL_IPS": "maybe"})
