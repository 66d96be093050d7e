"""The simulated Compute Engine's all-instances configuration (local.simulator.compute_aic): a MIG
made with one shows it, gives its metadata and labels to the VMs it creates (over its template's),
their hosts' metadata servers answer it, and two MIGs share one template each with its own."""

from __future__ import annotations

from typing import Any

import pytest

from tpujobs.local.simulator import Simulator, SimulatorConfig, SimulatorError
from tpujobs.local.simulator.compute_errors import ComputeError
from tpujobs.local.simulator.compute_hosts import host_overlay
from tpujobs.local.simulator.compute_json import group_json, instance_json
from tpujobs.local.simulator.metadata import lookup
from tpujobs.local.testing import SecondsClock

P, R, Z = "proj", "us-central1", "us-central1-a"
TEMPLATE = f"projects/{P}/regions/{R}/instanceTemplates/shared"
QUICK = SimulatorConfig(
    waiting_seconds=1.0, provisioning_seconds=2.0, compute_operation_seconds=1.0, deleting_seconds=1.0
)


@pytest.fixture
def sim() -> tuple[Simulator, SecondsClock]:
    clock = SecondsClock()
    simulator = Simulator(QUICK, clock=clock, wall_clock=lambda: 1_700_000_000.0 + clock.now)
    simulator.compute.operations.insert_template(
        P,
        R,
        {
            "name": "shared",
            "properties": {
                "machineType": "tpu7x-standard-4t",
                "disks": [{"boot": True}],
                "networkInterfaces": [{"network": "global/networks/default"}],
                "scheduling": {"provisioningModel": "SPOT", "instanceTerminationAction": "DELETE"},
                "metadata": {
                    "items": [{"key": "from-template", "value": "t"}, {"key": "startup-script", "value": "x"}]
                },
                "labels": {"team": "infra"},
            },
        },
    )
    clock.tick(2)
    return simulator, clock


def mig(name: str, config: dict[str, Any] | None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "name": name,
        "baseInstanceName": name,
        "instanceTemplate": TEMPLATE,
        "targetSize": 1,
        "instanceLifecyclePolicy": {"defaultActionOnFailure": "DO_NOTHING"},
    }
    if config is not None:
        body["allInstancesConfig"] = {"properties": config}
    return body


def test_a_migs_vms_get_its_all_instances_metadata_and_labels_over_the_templates(
    sim: tuple[Simulator, SecondsClock],
) -> None:
    """Two MIGs of one template, each with its own startup script and labels: each VM carries its
    MIG's (the all-instances configuration wins a key both set), and its host's metadata server
    answers them; the MIG shows its configuration, effective."""
    simulator, clock = sim
    for name in ("job-a-c1", "job-b-c1"):
        config = {"metadata": {"startup-script": f"run {name}"}, "labels": {"tpujobs-job": name, "team": "ml"}}
        simulator.compute.groups.insert_group(P, Z, mig(name, config))
    clock.tick(10)
    for name in ("job-a-c1", "job-b-c1"):
        view = simulator.compute.groups.get_group(P, Z, name)
        shown = group_json(view)
        assert shown["allInstancesConfig"]["properties"]["metadata"] == {"startup-script": f"run {name}"}
        assert shown["status"]["allInstancesConfig"]["effective"] is True
        (member,) = view.members
        vm = instance_json(member)
        assert vm["labels"] == {"team": "ml", "tpujobs-job": name}
        items = {item["key"]: item["value"] for item in vm["metadata"]["items"]}
        assert (items["startup-script"], items["from-template"]) == (f"run {name}", "t")
        node = simulator.node_updates.host_node(P, Z, view.record.backing)
        host = simulator.compute.vms.host_instance(node, 0)
        assert host is not None
        answer = lookup(node, 0, "instance/attributes/startup-script", host_overlay(node, 0, host)).body
        assert answer == f"run {name}"


def test_a_mig_without_an_all_instances_configuration_gives_its_vms_the_templates(
    sim: tuple[Simulator, SecondsClock],
) -> None:
    """No allInstancesConfig: the VM has the template's metadata and labels, and the MIG no status of one."""
    simulator, clock = sim
    simulator.compute.groups.insert_group(P, Z, mig("plain-c1", None))
    clock.tick(10)
    view = simulator.compute.groups.get_group(P, Z, "plain-c1")
    assert "allInstancesConfig" not in group_json(view)["status"]
    vm = instance_json(view.members[0])
    assert vm["labels"] == {"team": "infra"}


@pytest.mark.parametrize(
    "config",
    [
        {"labels": {"Bad Key": "x"}},
        {"metadata": {"bad key!": "x"}},
        {"metadata": ["startup-script"]},
    ],
)
def test_an_all_instances_configuration_google_refuses_is_400(
    sim: tuple[Simulator, SecondsClock], config: dict[str, Any]
) -> None:
    """Labels and metadata are checked as a VM's: a bad label or metadata key, or metadata not a
    map, is refused (400 through the API, as_compute)."""
    simulator, _ = sim
    with pytest.raises(SimulatorError):
        simulator.compute.groups.insert_group(P, Z, mig("bad-c1", config))
    assert not simulator.compute.groups.list_groups(P, Z).items


def test_a_shared_template_is_refused_deletion_while_any_mig_uses_it(sim: tuple[Simulator, SecondsClock]) -> None:
    """resourceInUseByAnotherResource while one of two MIGs of the template remains."""
    simulator, clock = sim
    simulator.compute.groups.insert_group(P, Z, mig("job-a-c1", {"metadata": {"k": "a"}}))
    simulator.compute.groups.insert_group(P, Z, mig("job-b-c1", {"metadata": {"k": "b"}}))
    simulator.compute.groups.delete_group(P, Z, "job-a-c1")
    clock.tick(2)
    with pytest.raises(ComputeError) as refused:
        simulator.compute.operations.delete_template(P, R, "shared")
    assert refused.value.reason == "resourceInUseByAnotherResource"
