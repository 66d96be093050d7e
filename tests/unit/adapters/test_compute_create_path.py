"""How the Compute Engine adapter creates and releases a holding: which calls, in which order, how
many (adapters.compute, adapters.compute_operations). Behaviour only: calls are counted, never timed.

A holding's MIGs name a shared template (and policy): read first, and only when missing inserted
(both inserts started before any operation is read, followed together); a MIG is inserted only
once its template and policy are DONE, and its own operation is not followed; a fresh create
reads nothing back; a second holding of the same VMs makes no template and waits on nothing.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Any

import pytest
from google.api_core import exceptions as api_exceptions
from google.cloud import compute_v1

from tpujobs.adapters import compute_requests as bodies
from tpujobs.adapters.compute import ComputeClients, ComputeEngine
from tpujobs.adapters.compute_operations import OperationFollower
from tpujobs.domain.job import Job, new_job
from tpujobs.domain.spec import parse_spec
from tpujobs.engine.errors import NotOurs
from tpujobs.engine.ports import HostBoot

PROJECT = "p"
ZONE = "us-central1-c"
REGION = "us-central1"
BOOT = HostBoot("tpu-vm@p.iam.gserviceaccount.com", {"startup-script": "#!/bin/bash"})
NOW = "2026-01-01T03:00:00+00:00"


class Cloud:
    """Compute Engine as the adapter's clients see it: every call goes into `calls` (in order);
    an operation reads RUNNING `running_reads` times, then DONE; `existing` names resources that
    answer 409 alreadyExists (and are marked as tpujobs' when read); a template or policy neither
    made nor existing reads 404; `vanish` names what the next MIG insert finds gone (404, once)."""

    def __init__(self, running_reads: int = 0, existing: frozenset[str] = frozenset()) -> None:
        self.vanish: set[str] = set()
        self.calls: list[str] = []
        self.running_reads = running_reads
        self.reads: dict[str, int] = {}
        self.existing = existing
        self.made: dict[str, Any] = {}
        self.count = 0

    def operation(self, scope: str, target: str) -> compute_v1.Operation:
        self.count += 1
        name = f"op-{self.count}-{target}"
        self.reads[name] = 0
        where = {"zone": f"zones/{ZONE}"} if scope == "zone" else {"region": f"regions/{REGION}"}
        return compute_v1.Operation(name=name, status="PENDING", **where)

    def read(self, scope: str, operation: str) -> compute_v1.Operation:
        self.calls.append(f"{scope}_operations.get {operation}")
        self.reads[operation] += 1
        done = self.reads[operation] > self.running_reads
        where = {"zone": f"zones/{ZONE}"} if scope == "zone" else {"region": f"regions/{REGION}"}
        return compute_v1.Operation(name=operation, status="DONE" if done else "RUNNING", **where)

    def insert(self, kind: str, scope: str, resource: Any) -> compute_v1.Operation:
        self.calls.append(f"{kind}.insert {resource.name}")
        if kind == "groups" and self.vanish:
            gone = self.vanish.pop()
            self.made.pop(gone, None)
            raise api_exceptions.NotFound(f"The resource '{gone}' was not found", errors=[{"reason": "notFound"}])
        if f"{kind}/{resource.name}" in self.existing:
            raise api_exceptions.Conflict(
                f"The resource '{resource.name}' already exists", errors=[{"reason": "alreadyExists"}]
            )
        self.made[f"{kind}/{resource.name}"] = resource
        return self.operation(scope, f"{kind}/{resource.name}")

    def clients(self) -> ComputeClients:
        return ComputeClients(
            _Instances(self), _Groups(self), _Templates(self), _Policies(self), _Ops(self, "zone"), _Ops(self, "region")
        )  # type: ignore[arg-type]


class _Ops:
    def __init__(self, cloud: Cloud, scope: str) -> None:
        self.cloud, self.scope = cloud, scope

    def get(self, *, operation: str, **call: Any) -> compute_v1.Operation:
        return self.cloud.read(self.scope, operation)


NAMED_BY = frozenset({"resource_policy", "instance_template", "instance_group_manager"})


class _Kind:
    kind = ""
    scope = "region"
    field = ""
    message: Any = None

    def __init__(self, cloud: Cloud) -> None:
        self.cloud = cloud

    def insert_unary(self, **call: Any) -> compute_v1.Operation:
        return self.cloud.insert(self.kind, self.scope, call[self.field])

    def get(self, **call: Any) -> Any:
        name = next(
            v for k, v in call.items() if k in {"resource_policy", "instance_template", "instance_group_manager"}
        )
        self.cloud.calls.append(f"{self.kind}.get {name}")
        key = f"{self.kind}/{name}"
        if key in self.cloud.made:
            return self.cloud.made[key]
        if self.kind in ("templates", "policies") and key not in self.cloud.existing:
            raise api_exceptions.NotFound(f"The resource '{name}' was not found", errors=[{"reason": "notFound"}])
        return self.message(name=name, description=_marker(name))

    def list(self, **call: Any) -> list[Any]:
        self.cloud.calls.append(f"{self.kind}.list")
        return [r for key, r in self.cloud.made.items() if key.startswith(f"{self.kind}/")]

    def delete_unary(self, **call: Any) -> compute_v1.Operation:
        name = next(
            v for k, v in call.items() if k in {"resource_policy", "instance_template", "instance_group_manager"}
        )
        self.cloud.calls.append(f"{self.kind}.delete {name}")
        return self.cloud.operation(self.scope, f"{self.kind}/{name}")


class _Policies(_Kind):
    kind, field, message = "policies", "resource_policy_resource", compute_v1.ResourcePolicy


class _Templates(_Kind):
    kind, field, message = "templates", "instance_template_resource", compute_v1.InstanceTemplate


class _Groups(_Kind):
    kind, scope, field, message = "groups", "zone", "instance_group_manager_resource", compute_v1.InstanceGroupManager

    def list_managed_instances(self, **call: Any) -> list[compute_v1.ManagedInstance]:
        self.cloud.calls.append("groups.list_managed_instances")
        return [compute_v1.ManagedInstance(name="vm", instance_status="RUNNING", current_action="NONE")]


class _Instances(_Kind):
    kind = "instances"


def _marker(name: str) -> str:
    """What tpujobs writes in the description of slice 0 of holding `name`, or of the shared
    template or policy `name` (adopted when read)."""
    if name.startswith((bodies.SHARED_TEMPLATE_PREFIX, bodies.SHARED_POLICY_PREFIX)):
        kind = "instance template" if name.startswith(bodies.SHARED_TEMPLATE_PREFIX) else "workload policy"
        return bodies.shared_description(kind, name.rsplit("-h", 1)[1])
    said = {"holding": name, "labels": {"tpujobs-attempt": "1", "tpujobs-job": "train-1"}, "slice": 0, "zone": ZONE}
    return bodies.MARKER + json.dumps(said, sort_keys=True, separators=(",", ":"))


def a_job(accelerator_type: str = "v7x-8", slices: int = 1, job_id: str = "train-1") -> Job:
    spec = parse_spec(
        {
            "job_id": job_id,
            "name": "train",
            "owner": "ada",
            "accelerator_type": accelerator_type,
            "platform": "compute",
            "capacity": "spot",
            "slices": slices,
            "command": "x",
        }
    )
    job, _ = new_job(spec, ZONE, datetime(2026, 1, 1, tzinfo=timezone.utc))
    return job


def engine(cloud: Cloud) -> tuple[ComputeEngine, list[float]]:
    slept: list[float] = []
    return ComputeEngine(cloud.clients(), PROJECT, sleep=slept.append), slept


def kinds(calls: list[str]) -> list[str]:
    """Each call's verb, without the resource it names."""
    return [call.split(" ")[0] for call in calls]


def test_the_first_holding_of_a_shape_makes_its_shared_policy_and_template_at_once() -> None:
    """Two v7x-16 slices: the shared policy and template read (missing), both inserted before any
    operation is read, their two operations read, then the two MIGs: one template for both slices."""
    cloud = Cloud()
    compute, _ = engine(cloud)
    compute.request(a_job("v7x-16", slices=2), BOOT)
    verbs = kinds(cloud.calls)
    assert (
        verbs
        == ["policies.get", "templates.get", "policies.insert", "templates.insert"]
        + ["region_operations.get"] * 2
        + ["groups.insert"] * 2
    )
    (template,) = [r for key, r in cloud.made.items() if key.startswith("templates/")]
    migs = [r for key, r in cloud.made.items() if key.startswith("groups/")]
    assert [m.instance_template.rsplit("/", 1)[-1] for m in migs] == [template.name] * 2


def test_a_second_holding_of_the_same_vms_makes_no_template_and_waits_on_no_operation() -> None:
    """Another job of the same shape after the first: its shared template and policy are read
    (found, marked as tpujobs' shared ones), then its MIG inserted: no insert but the MIG's, no
    operation read, no pause."""
    cloud = Cloud()
    compute, _ = engine(cloud)
    compute.request(a_job("v7x-16"), BOOT)
    cloud.calls.clear()
    compute, slept = engine(cloud)
    status = compute.request(a_job("v7x-16", job_id="eval-2"), BOOT)
    assert kinds(cloud.calls) == ["policies.get", "templates.get", "groups.insert"]
    assert slept == [] and (status.name, status.state) == ("eval-2-c1", "WAITING")
    made = cloud.made["groups/eval-2-c1"]
    assert made.all_instances_config.properties.labels["tpujobs-job"] == "eval-2"
    assert made.all_instances_config.properties.metadata["startup-script"] == "#!/bin/bash"


def test_independent_operations_are_followed_together_one_pause_per_round() -> None:
    """The policy's and the template's operations, each needing a second read: two pauses in all
    (one per round), not one per operation."""
    cloud = Cloud(running_reads=1)
    compute, slept = engine(cloud)
    compute.request(a_job("v7x-16", slices=2), BOOT)
    assert len(slept) == 2
    assert kinds(cloud.calls).count("region_operations.get") == 4


def test_a_mig_is_inserted_only_once_its_template_and_policy_are_done() -> None:
    """Operations RUNNING at first: each MIG insert comes after every policy and template operation read DONE."""
    cloud = Cloud(running_reads=2)
    compute, _ = engine(cloud)
    compute.request(a_job("v7x-16"), BOOT)
    first_mig = kinds(cloud.calls).index("groups.insert")
    assert all(cloud.reads[op] == 3 for op in cloud.reads if not op.split("-", 2)[2].startswith("groups/"))
    last_read = max(i for i, call in enumerate(cloud.calls) if call.startswith("region_operations.get"))
    assert last_read < first_mig


def test_a_fresh_create_reads_nothing_back() -> None:
    """v7x-8, first of its shape: template read (missing), inserted, its operation, MIG insert;
    CREATING with the job's label and the MIG's operation."""
    cloud = Cloud()
    compute, _ = engine(cloud)
    status = compute.request(a_job("v7x-8"), BOOT)
    assert kinds(cloud.calls) == ["templates.get", "templates.insert", "region_operations.get", "groups.insert"]
    assert (status.name, status.state, status.job_label) == ("train-1-c1", "WAITING", "train-1")
    assert status.operation == f"zones/{ZONE}/operations/op-2-groups/train-1-c1"


def test_a_shared_template_gone_before_the_mig_insert_is_made_again_once() -> None:
    """The template read is there, then given back by the sweep before the MIG insert (404): it
    is inserted again, waited for, and the MIG inserted again."""
    cloud = Cloud()
    compute, _ = engine(cloud)
    compute.request(a_job("v7x-8"), BOOT)
    (template,) = [key for key in cloud.made if key.startswith("templates/")]
    cloud.vanish.add(template)
    cloud.calls.clear()
    status = compute.request(a_job("v7x-8", job_id="eval-2"), BOOT)
    assert kinds(cloud.calls) == [
        "templates.get",
        "groups.insert",
        "templates.insert",
        "region_operations.get",
        "groups.insert",
    ]
    assert status.state == "WAITING" and "groups/eval-2-c1" in cloud.made


def test_a_shared_template_without_tpujobs_marker_is_never_used() -> None:
    """Someone else's template named like the shared one: NotOurs, and no MIG is inserted."""
    cloud = Cloud()
    name = bodies.instance_template(bodies.job_holding(a_job("v7x-8")), BOOT, PROJECT, bodies.Images()).name
    cloud.made[f"templates/{name}"] = compute_v1.InstanceTemplate(name=name, description="hand-made")
    compute, _ = engine(cloud)
    with pytest.raises(NotOurs, match=name):
        compute.request(a_job("v7x-8"), BOOT)
    assert "groups.insert" not in kinds(cloud.calls)


def test_a_migs_own_insert_operation_is_never_followed() -> None:
    """No zone operation is read by a request: the MIG's operation is only named, for create_error."""
    cloud = Cloud(running_reads=5)
    compute, _ = engine(cloud)
    compute.request(a_job("v7x-16", slices=2), BOOT)
    assert not [call for call in cloud.calls if call.startswith("zone_operations.get")]


def test_a_mig_that_existed_is_adopted_and_read_for_what_it_is() -> None:
    """A redelivery: the MIG answers 409, is read and found ours, and the holding's state is read (ACTIVE)."""
    cloud = Cloud(existing=frozenset({"groups/train-1-c1"}))
    cloud.made["groups/train-1-c1"] = compute_v1.InstanceGroupManager(
        name="train-1-c1",
        description=_marker("train-1-c1"),
        target_size=1,
        status=compute_v1.InstanceGroupManagerStatus(is_stable=True),
    )
    compute, _ = engine(cloud)
    status = compute.request(a_job("v7x-8"), BOOT)
    assert "groups.get train-1-c1" in cloud.calls and "groups.list_managed_instances" in cloud.calls
    assert (status.state, status.operation) == ("ACTIVE", "")


def test_a_release_deletes_the_migs_and_never_a_shared_template_or_policy() -> None:
    """Two v7x-16 slices: MIG deletes, one round of their reads; the shared template and policy stay."""
    cloud = Cloud()
    compute, _ = engine(cloud)
    compute.request(a_job("v7x-16", slices=2), BOOT)
    cloud.calls.clear()
    compute, slept = engine(cloud)
    compute.release(ZONE, "train-1-c1")
    verbs = [v for v in kinds(cloud.calls) if not v.endswith(".list")]
    assert verbs == ["groups.delete"] * 2 + ["zone_operations.get"] * 2
    assert len(slept) == 1


def test_the_zone_listing_gives_back_shared_templates_and_policies_unused_for_an_hour() -> None:
    """list_capacity: a shared template no MIG names, older than SHARED_IDLE, is deleted (not
    waited for); one a MIG names, one just made, and a look-alike without the marker are kept;
    none is reported as a holding."""
    cloud = Cloud()
    compute, _ = engine(cloud)
    compute.request(a_job("v7x-8"), BOOT)  # a MIG naming its template
    old = "2026-01-01T00:00:00.000-00:00"
    used = next(r for key, r in cloud.made.items() if key.startswith("templates/"))
    used.creation_timestamp = old
    idle = compute_v1.InstanceTemplate(name=bodies.SHARED_TEMPLATE_PREFIX + "0" * 20, creation_timestamp=old)
    idle.description = bodies.shared_description("instance template", "0" * 20)
    young = compute_v1.InstanceTemplate(name=bodies.SHARED_TEMPLATE_PREFIX + "1" * 20, creation_timestamp=NOW)
    young.description = bodies.shared_description("instance template", "1" * 20)
    foreign = compute_v1.InstanceTemplate(name=bodies.SHARED_TEMPLATE_PREFIX + "2" * 20, creation_timestamp=old)
    policy = compute_v1.ResourcePolicy(name=bodies.SHARED_POLICY_PREFIX + "3" * 20, creation_timestamp=old)
    policy.description = bodies.shared_description("workload policy", "3" * 20)
    for resource in (idle, young, foreign):
        cloud.made[f"templates/{resource.name}"] = resource
    cloud.made[f"policies/{policy.name}"] = policy
    cloud.calls.clear()
    compute = ComputeEngine(cloud.clients(), PROJECT, clock=lambda: datetime.fromisoformat(NOW))
    found = compute.list_capacity(ZONE)
    deletes = sorted(call for call in cloud.calls if ".delete" in call)
    assert deletes == [f"policies.delete {policy.name}", f"templates.delete {idle.name}"]
    assert not [call for call in cloud.calls if "operations.get" in call]
    assert [status.name for status in found] == ["train-1-c1"]


@pytest.mark.parametrize("running_reads", [0, 1, 3])
def test_follow_all_reads_only_what_is_not_done_and_keeps_the_order(running_reads: int) -> None:
    """Three operations, one already DONE: it is never read; the others come back DONE, in the order given."""
    cloud = Cloud(running_reads=running_reads)
    slept: list[float] = []
    follower = OperationFollower(
        _Ops(cloud, "zone"),  # type: ignore[arg-type]
        _Ops(cloud, "region"),  # type: ignore[arg-type]
        PROJECT,
        dict,
        sleep=slept.append,
        monotonic=lambda: 0.0,
    )
    pending = [cloud.operation("region", "a"), cloud.operation("zone", "b")]
    done = compute_v1.Operation(name="already", status="DONE", region=f"regions/{REGION}")
    found = follower.follow_all([pending[0], done, pending[1]], wait_s=10)
    assert [op.name for op in found] == [pending[0].name, "already", pending[1].name]
    assert all(op.status.name == "DONE" for op in found)
    assert "already" not in " ".join(cloud.calls)
    assert len(slept) == running_reads + 1
