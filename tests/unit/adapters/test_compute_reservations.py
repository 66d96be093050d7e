"""Reservations on Compute Engine as Google accepts them: RESERVATION_BOUND VMs name the one
reservation they consume (SPECIFIC_RESERVATION), so a reserved job on Compute Engine names it,
the adapter never sends ANY_RESERVATION for it, and the simulator refuses what Google refuses."""

from __future__ import annotations

import dataclasses
import re
from datetime import datetime, timezone
from typing import Any

import pytest
from google.cloud import compute_v1
from google.protobuf import json_format

from tpujobs.adapters import compute_requests as requests
from tpujobs.domain.job import new_job
from tpujobs.domain.spec import SpecError, parse_spec, with_deployment_defaults
from tpujobs.domain.vm_defaults import VmDefaults
from tpujobs.engine.errors import PermanentError
from tpujobs.engine.ports import HostBoot
from tpujobs.local.simulator import Simulator, SimulatorConfig
from tpujobs.local.simulator.compute_errors import ComputeError
from tpujobs.local.testing import SecondsClock

P, R, Z = "p", "us-central1", "us-central1-a"
BOOT = HostBoot("tpu-vm@p.iam.gserviceaccount.com", {"startup-script": "echo hi"})
QUICK = SimulatorConfig(waiting_seconds=1.0, provisioning_seconds=2.0, compute_operation_seconds=1.0)
BASE = {"job_id": "train-1", "name": "train", "owner": "ada", "command": "x"}


def holding(**fields: Any) -> requests.Holding:
    spec = parse_spec({**BASE, "accelerator_type": "v7x-16", "platform": "compute", **fields})
    job, _ = new_job(spec, Z, datetime(2026, 1, 1, tzinfo=timezone.utc))
    return requests.job_holding(job)


def template(h: requests.Holding) -> compute_v1.InstanceTemplate:
    return requests.instance_template(h, BOOT, P, requests.Images())


def as_json(message: Any) -> dict[str, Any]:
    return json_format.MessageToDict(type(message).pb(message))


def test_a_reserved_job_on_compute_engine_must_name_its_reservation() -> None:
    """Google has no 'any reservation' for RESERVATION_BOUND VMs: validate says so and asks for one."""
    with pytest.raises(SpecError, match=r"RESERVATION_BOUND with SPECIFIC_RESERVATION.*give reservation"):
        parse_spec({**BASE, "accelerator_type": "v7x-16", "capacity": "reserved"})
    assert parse_spec({**BASE, "accelerator_type": "v7x-16", "capacity": "reserved", "reservation": "r"})


def test_a_reserved_job_without_a_reservation_still_runs_on_the_tpu_api() -> None:
    """The TPU API's guaranteed tier takes any reservation of the project; only Compute Engine needs
    a name, including where the deployment's default puts the generation there."""
    spec = parse_spec({**BASE, "accelerator_type": "v6e-8", "capacity": "reserved"})
    assert with_deployment_defaults(spec, VmDefaults()).platform == "tpu-api"
    with pytest.raises(SpecError, match="give reservation"):
        with_deployment_defaults(spec, VmDefaults(), compute_by_default=frozenset({"v6e"}))


def test_the_adapter_never_sends_any_reservation_for_reservation_bound_vms() -> None:
    """A reserved holding with no reservation (a spec made for the TPU API) is refused, never sent
    as ANY_RESERVATION; with one it is SPECIFIC_RESERVATION naming it, as compute_v1 types."""
    spec = parse_spec({**BASE, "accelerator_type": "v6e-8", "capacity": "reserved", "platform": "tpu-api"})
    unnamed = requests.Holding("train-1-c1", Z, spec, "reserved", {"tpujobs-job": "train-1"})
    with pytest.raises(PermanentError, match="SPECIFIC_RESERVATION"):
        template(unnamed)
    affinity = template(holding(capacity="reserved", reservation="tpu-res")).properties.reservation_affinity
    assert isinstance(affinity, compute_v1.ReservationAffinity)
    assert (affinity.consume_reservation_type, affinity.key, list(affinity.values)) == (
        "SPECIFIC_RESERVATION",
        "compute.googleapis.com/reservation-name",
        ["tpu-res"],
    )


@pytest.fixture
def clock() -> SecondsClock:
    return SecondsClock()


def test_the_simulator_takes_the_adapters_reserved_slice_and_refuses_any_reservation(clock: SecondsClock) -> None:
    """The adapter's reserved template and bulk MIG run on the named reservation; the same template
    targeting ANY_RESERVATION (or naming no affinity, the API's default) is 400 with the reason."""
    quota = {Z: {"v7x": 0}, "reservations": {"tpu-res": 8}}
    sim = Simulator(dataclasses.replace(QUICK, quota=quota), clock=clock, wall_clock=lambda: 1.7e9 + clock.now)
    h = holding(capacity="reserved", reservation="tpu-res")
    body = as_json(template(h))
    policy = requests.workload_policy(h)
    sim.compute.operations.insert_policy(P, R, as_json(policy))
    sim.compute.operations.insert_template(P, R, body)
    sim.compute.groups.insert_group(
        P, Z, as_json(requests.instance_group_manager(h, 0, P, body["name"], BOOT, policy.name))
    )
    clock.tick(10)
    assert [m.status for m in sim.compute.groups.get_group(P, Z, "train-1-c1").members] == ["RUNNING"] * 2
    reason = "RESERVATION_BOUND VMs must specifically target a reservation"
    for affinity in ({"consumeReservationType": "ANY_RESERVATION"}, None):
        properties = {k: v for k, v in body["properties"].items() if k != "reservationAffinity"}
        if affinity:
            properties["reservationAffinity"] = affinity
        with pytest.raises(ComputeError, match=re.escape(reason)):
            sim.compute.operations.insert_template(P, R, {**body, "name": "other", "properties": properties})


@pytest.mark.parametrize(
    ("affinity", "field"),
    [
        ({"consumeReservationType": "SPECIFIC_RESERVATION"}, "reservationAffinity.key"),
        (
            {"consumeReservationType": "SPECIFIC_RESERVATION", "key": "compute.googleapis.com/reservation-name"},
            "reservationAffinity.values",
        ),
    ],
)
def test_a_specific_reservation_must_name_it(clock: SecondsClock, affinity: dict[str, Any], field: str) -> None:
    """SPECIFIC_RESERVATION "must specify key value fields": without them, 400 on that field."""
    sim = Simulator(QUICK, clock=clock, wall_clock=lambda: 1.7e9 + clock.now)
    vm = {
        "name": "vm",
        "machineType": f"zones/{Z}/machineTypes/tpu7x-standard-4t",
        "disks": [{"boot": True}],
        "networkInterfaces": [{"network": "global/networks/default"}],
        "scheduling": {"provisioningModel": "RESERVATION_BOUND", "instanceTerminationAction": "DELETE"},
        "reservationAffinity": affinity,
    }
    with pytest.raises(ComputeError, match=re.escape(f"resource.{field}")):
        sim.compute.vms.insert_instance(P, Z, vm)
