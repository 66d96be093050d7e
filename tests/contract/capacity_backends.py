"""The backends the capacity contract runs on, and how each makes Google act meanwhile.

`memory` is the fake; `tpu-api` the TPU adapter, `compute` the Compute Engine adapter and `router`
the router over both, each through Google's own client on an in-process simulator. Each backend
says how it makes a job and a unit of its platform, how Google preempts a holding, and how
someone else makes a resource of a holding's name (without tpujobs' marker).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from typing import Any

from contract_data import ZONE, a_job

from tpujobs.domain.holdings import HoldingState
from tpujobs.domain.job import Job
from tpujobs.domain.spec import parse_spec
from tpujobs.engine.ports import Capacity, HostBoot, UnitRequest
from tpujobs.local.fakes import InMemoryCapacity
from tpujobs.local.testing import wait_for

PROJECT = "contract-capacity"
BOOT = HostBoot("vm@example.iam.gserviceaccount.com", {"startup-script": "#!/bin/sh"})
COMPUTE_JOB = {"accelerator_type": "v7x-8", "platform": "compute", "capacity": "spot"}  # one host
Holder = Job | UnitRequest  # what a holding is asked for


@dataclass
class Backend:
    """A Capacity port, the jobs and units of its platform, and Google's hand on its holdings."""

    name: str
    port: Capacity
    job: Callable[[str], Job]  # a job of its platform, by id
    unit: Callable[[], UnitRequest]  # the warm-pool unit of its platform (pool `demo`)
    preempt: Callable[[str], None]  # Google takes back the holding of that name, in ZONE
    plant_foreign: Callable[[Holder], None]  # someone else makes a resource of that holding's name
    foreign_left: Callable[[str], bool]  # someone else's resource of that name is still there


def holding_name(holder: Holder) -> str:
    return holder.queued_resource if isinstance(holder, Job) else holder.name


def tpu_job(job_id: str) -> Job:
    return a_job(job_id)[0]


def compute_job(job_id: str) -> Job:
    return a_job(job_id, **COMPUTE_JOB)[0]


def a_unit(letter: str = "u", **changes: Any) -> UnitRequest:
    """A warm-pool unit of one slice (a v4-8 on the TPU API, `letter` c and a v7x-8 on Compute Engine)."""
    fields = {"job_id": "demo-unit", "name": "demo", "owner": "ada@example.com", "accelerator_type": "v4-8"}
    name = f"demo-{letter}0-g1"
    return UnitRequest(name, ZONE, parse_spec({**fields, "command": "-", **changes}), {"tpujobs-pool": "demo"})


def memory() -> Backend:
    fake = InMemoryCapacity()

    def preempt(name: str) -> None:
        fake.set_state(name, HoldingState.LOST)

    def plant_foreign(holder: Holder) -> None:
        fake.plant_foreign(ZONE, holding_name(holder))

    def foreign_left(name: str) -> bool:
        return (ZONE, name) in fake.holdings and not fake.holdings[(ZONE, name)].labels

    return Backend("memory", fake, tpu_job, a_unit, preempt, plant_foreign, foreign_left)


class TpuApiHand:
    """Google's hand on the TPU API side of a simulator: preemption, someone else's queued resource."""

    def __init__(self, url: str, port: Capacity) -> None:
        from tpujobs.adapters.tpu import build_client
        from tpujobs.local.simulator.client import SimulatorControl

        self.client = build_client(url)
        self.control = SimulatorControl(url)
        self.port = port

    def preempt(self, name: str) -> None:
        """Spot capacity taken back once it is provisioned (the simulator preempts nothing sooner)."""

        def provisioned() -> bool:
            """the queued resource PROVISIONING or ACTIVE"""
            status = self.port.status(ZONE, name)
            return status is not None and status.state in (HoldingState.PROVISIONING, HoldingState.ACTIVE)

        wait_for(provisioned, timeout=30)  # quick provisioning, generous deadline
        self.control.configure(preemption_grace_seconds=0.2)  # LOSING lasts the hosts' grace: a short one
        self.control.preempt(ZONE, name, project=PROJECT)

    def plant_foreign(self, holder: Holder) -> None:
        """A queued resource made by someone else's code: a plain node, none of tpujobs' labels."""
        from google.cloud import tpu_v2

        name = holding_name(holder)
        parent = f"projects/{PROJECT}/locations/{ZONE}"
        node = tpu_v2.Node(accelerator_type="v4-8", runtime_version="tpu-ubuntu2204-base", labels={"team": "other"})
        spec = tpu_v2.QueuedResource.Tpu.NodeSpec(parent=parent, node_id=name, node=node)
        resource = tpu_v2.QueuedResource(tpu=tpu_v2.QueuedResource.Tpu(node_spec=[spec]))
        self.client.create_queued_resource(parent=parent, queued_resource=resource, queued_resource_id=name)
        wait_for(lambda: self.foreign_left(name), timeout=30)

    def foreign_left(self, name: str) -> bool:
        """someone else's queued resource ACTIVE, unlabelled by tpujobs"""
        status = self.port.status(ZONE, name)
        return status is not None and status.state is HoldingState.ACTIVE and status.job_label is None


class ComputeHand:
    """Google's hand on the Compute Engine side of a simulator: a VM preempted, someone else's MIG."""

    def __init__(self, url: str, port: Capacity) -> None:
        from tpujobs.adapters.compute import build_clients
        from tpujobs.local.simulator.client import SimulatorControl

        self.clients = build_clients(url)
        self.control = SimulatorControl(url)
        self.port = port

    def vms(self, name: str) -> list[str]:
        return sorted(vm["name"] for vm in self.control.state()["compute"]["instances"] if vm["name"].startswith(name))

    def preempt(self, name: str) -> None:
        """A Spot VM of the holding preempted once the holding is ACTIVE."""

        def active() -> bool:
            """the holding ACTIVE"""
            status = self.port.status(ZONE, name)
            return status is not None and status.state is HoldingState.ACTIVE

        wait_for(active, timeout=30)
        self.control.preempt_instance(ZONE, self.vms(name)[0], project=PROJECT)

    def plant_foreign(self, holder: Holder) -> None:
        """Someone else's template and MIG of the holding's slice name: what tpujobs would make,
        less its marker (description) and labels, made by hand with the same client."""
        from tpujobs.adapters import compute_requests as bodies
        from tpujobs.adapters.compute_operations import OperationFollower, is_done

        holding = bodies.job_holding(holder) if isinstance(holder, Job) else bodies.unit_holding(holder)
        follower = OperationFollower(self.clients.zone_operations, self.clients.region_operations, PROJECT, dict)
        region = ZONE.rsplit("-", 1)[0]
        template = bodies.instance_template(holding, BOOT, PROJECT, bodies.Images())
        template.description = ""
        template.properties.labels = {"team": "other"}
        template.name = "hand-made"
        made = self.clients.templates.insert_unary(project=PROJECT, region=region, instance_template_resource=template)
        assert is_done(follower.follow(made, 30))
        mig = bodies.instance_group_manager(holding, 0, PROJECT, template.name, BOOT, "")
        mig.description = "someone else's MIG"
        mig.all_instances_config.properties.labels = {"team": "other"}
        made = self.clients.groups.insert_unary(project=PROJECT, zone=ZONE, instance_group_manager_resource=mig)
        assert is_done(follower.follow(made, 30))

    def foreign_left(self, name: str) -> bool:
        """someone else's MIG of that name still there"""
        groups = self.control.state()["compute"]["instanceGroupManagers"]
        return any(group["name"] == name for group in groups)


@contextmanager
def simulator() -> Iterator[str]:
    """A simulator of the test's own serving both APIs, quick to provision, capacity unbounded."""
    from tpujobs.local.simulator import SimulatorConfig, SimulatorServer

    config = SimulatorConfig(waiting_seconds=0.05, provisioning_seconds=0.1, capacity={})
    with SimulatorServer(config, run_workers=False) as server:
        yield server.url


def tpu_api(url: str) -> Backend:
    from tpujobs.adapters.tpu import CloudTpu, build_client

    port = CloudTpu(build_client(url), PROJECT)
    hand = TpuApiHand(url, port)
    return Backend("tpu-api", port, tpu_job, a_unit, hand.preempt, hand.plant_foreign, hand.foreign_left)


def compute(url: str) -> Backend:
    from tpujobs.adapters.compute import ComputeEngine, build_clients

    port = ComputeEngine(build_clients(url), PROJECT, operation_wait_s=10)
    hand = ComputeHand(url, port)
    unit = partial(a_unit, "c", **COMPUTE_JOB)
    return Backend("compute", port, compute_job, unit, hand.preempt, hand.plant_foreign, hand.foreign_left)


def router(url: str) -> Backend:
    """The router over both adapters on one simulator, asked for Compute Engine's holdings (the
    TPU API's are in `test_the_router_holds_both_platforms_in_one_zone`)."""
    from tpujobs.adapters.capacity_router import PlatformCapacity

    tpu, engine = tpu_api(url), compute(url)
    port = PlatformCapacity(tpu.port, engine.port)
    hand = ComputeHand(url, port)
    return Backend("router", port, compute_job, engine.unit, hand.preempt, hand.plant_foreign, hand.foreign_left)
