"""The simulator's Compute Engine v1 API through the real google-cloud-compute REST clients: a v7x
slice made of a workload policy, a template and a MIG runs its startup script on two hosts, Spot
preemption, cleanup in order, and Compute Engine's errors."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import google.auth.credentials
import pytest
from google.api_core import exceptions
from google.cloud import compute_v1

from tpujobs.local.gcloud_cli import Gcloud
from tpujobs.local.simulator import SimulatorConfig, SimulatorServer
from tpujobs.local.simulator.client import SimulatorControl
from tpujobs.local.simulator.compute_records import predicted_member_names
from tpujobs.local.testing import wait_for

pytestmark = pytest.mark.emulator

PROJECT = "tpujobs-test"
REGION = "us-central1"
ZONE = "us-central1-a"
POLICY = f"projects/{PROJECT}/regions/{REGION}/resourcePolicies/slice-policy"
TEMPLATE = f"projects/{PROJECT}/regions/{REGION}/instanceTemplates/slice-template"
FAST = SimulatorConfig(
    waiting_seconds=0.05,
    provisioning_seconds=0.3,
    compute_operation_seconds=0.2,
    # Generous, so a slow machine still sees the preempted VM STOPPING before it is TERMINATED.
    preemption_grace_seconds=5.0,
    delete_grace_seconds=1.0,
    tick_seconds=0.02,
)
# Each host notes its metadata URL, says it started, and notes the SIGTERM it gets (then exits).
STARTUP_SCRIPT = """
trap 'echo TERM >> "$TPUJOBS_WORKDIR/signals"; exit 0' TERM
echo "$TPUJOBS_METADATA_URL" > "$TPUJOBS_WORKDIR/metadata-url"
touch "$TPUJOBS_WORKDIR/started"
while true; do sleep 0.05; done
"""


@pytest.fixture
def server(tmp_path: Path) -> Iterator[SimulatorServer]:
    with SimulatorServer(FAST, workers_root=tmp_path / "workers") as running:
        yield running


class Clients:
    """The google-cloud-compute clients a control plane builds, all against the simulator."""

    def __init__(self, url: str) -> None:
        options = {
            "transport": "rest",
            "client_options": {"api_endpoint": url},
            "credentials": google.auth.credentials.AnonymousCredentials(),
        }
        self.instances = compute_v1.InstancesClient(**options)
        self.groups = compute_v1.InstanceGroupManagersClient(**options)
        self.templates = compute_v1.RegionInstanceTemplatesClient(**options)
        self.global_templates = compute_v1.InstanceTemplatesClient(**options)
        self.policies = compute_v1.ResourcePoliciesClient(**options)
        self.zone_operations = compute_v1.ZoneOperationsClient(**options)
        self.region_operations = compute_v1.RegionOperationsClient(**options)
        self.global_operations = compute_v1.GlobalOperationsClient(**options)

    def zonal(self, operation: Any) -> compute_v1.Operation:
        """Follow a zonal operation to DONE with zoneOperations.wait. (The client's own
        ExtendedOperation.result() polls through an operations client it builds without the
        api_endpoint, so it would call compute.googleapis.com.)"""
        return self._follow(lambda: self.zone_operations.wait(project=PROJECT, zone=ZONE, operation=operation.name))

    def regional(self, operation: Any) -> compute_v1.Operation:
        return self._follow(
            lambda: self.region_operations.wait(project=PROJECT, region=REGION, operation=operation.name)
        )

    def global_(self, operation: Any) -> compute_v1.Operation:
        return self._follow(lambda: self.global_operations.wait(project=PROJECT, operation=operation.name))

    @staticmethod
    def _follow(wait: Any) -> compute_v1.Operation:
        done: compute_v1.Operation = wait()
        while done.status != compute_v1.Operation.Status.DONE:
            done = wait()
        return done


@pytest.fixture
def gce(server: SimulatorServer) -> Clients:
    return Clients(server.url)


def workload_policy(name: str = "slice-policy", topology: str = "2x2x2") -> compute_v1.ResourcePolicy:
    return compute_v1.ResourcePolicy(
        name=name,
        workload_policy=compute_v1.ResourcePolicyWorkloadPolicy(type_="HIGH_THROUGHPUT", accelerator_topology=topology),
    )


def vm_properties(model: str = "SPOT", script: str = STARTUP_SCRIPT) -> compute_v1.InstanceProperties:
    return compute_v1.InstanceProperties(
        machine_type="tpu7x-standard-4t",
        disks=[
            compute_v1.AttachedDisk(
                boot=True,
                auto_delete=True,
                initialize_params=compute_v1.AttachedDiskInitializeParams(
                    source_image="projects/ubuntu-os-accelerator-images/global/images/family/ubuntu-accel-2404-amd64-tpu-tpu7x"
                ),
            )
        ],
        network_interfaces=[compute_v1.NetworkInterface(network="global/networks/default", nic_type="GVNIC")],
        scheduling=compute_v1.Scheduling(
            provisioning_model=model, instance_termination_action="DELETE", on_host_maintenance="TERMINATE"
        ),
        metadata=compute_v1.Metadata(items=[compute_v1.Items(key="startup-script", value=script)]),
        labels={"tpujobs-job": "train"},
    )


def group(name: str = "slice", size: int = 2, policy: str = POLICY) -> compute_v1.InstanceGroupManager:
    return compute_v1.InstanceGroupManager(
        name=name,
        base_instance_name=name,
        instance_template=TEMPLATE,
        target_size=size,
        resource_policies=compute_v1.InstanceGroupManagerResourcePolicies(workload_policy=policy),
        instance_lifecycle_policy=compute_v1.InstanceGroupManagerInstanceLifecyclePolicy(
            default_action_on_failure="DO_NOTHING"
        ),
    )


def make_slice(gce: Clients, size: int = 2) -> compute_v1.InstanceGroupManager:
    """Policy, template, MIG; each insert followed to DONE. Returns the MIG as made."""
    gce.regional(gce.policies.insert(project=PROJECT, region=REGION, resource_policy_resource=workload_policy()))
    template = compute_v1.InstanceTemplate(name="slice-template", properties=vm_properties())
    gce.regional(gce.templates.insert(project=PROJECT, region=REGION, instance_template_resource=template))
    done = gce.zonal(gce.groups.insert(project=PROJECT, zone=ZONE, instance_group_manager_resource=group(size=size)))
    assert done.status == compute_v1.Operation.Status.DONE and not done.error.errors
    return gce.groups.get(project=PROJECT, zone=ZONE, instance_group_manager="slice")


def managed(gce: Clients, name: str = "slice") -> list[compute_v1.ManagedInstance]:
    return list(gce.groups.list_managed_instances(project=PROJECT, zone=ZONE, instance_group_manager=name))


def statuses(gce: Clients) -> dict[str, str]:
    return {m.name: m.instance_status for m in managed(gce)}


def metadata(url: str, key: str, **query: str) -> str:
    suffix = "?" + "&".join(f"{k}={v}" for k, v in query.items()) if query else ""
    request = urllib.request.Request(f"{url}/{key}{suffix}", headers={"Metadata-Flavor": "Google"})
    with urllib.request.urlopen(request, timeout=5) as answer:
        text: str = answer.read().decode("utf-8")
    return text


def reason(error: pytest.ExceptionInfo[exceptions.GoogleAPICallError]) -> str:
    return str(error.value.response.json()["error"]["errors"][0]["reason"])  # type: ignore[union-attr]


def test_a_v7x_slice_runs_on_two_hosts_survives_nothing_of_a_preemption_and_is_cleaned_up_in_order(
    server: SimulatorServer, gce: Clients
) -> None:
    """Policy 2x2x2, a SPOT/DELETE template, a MIG of 2: both VMs RUNNING with their hosts started;
    a preempted VM is STOPPING (SIGTERM, preempted TRUE), TERMINATED, then gone; MIG -> template ->
    policy, the policy refused while the MIG exists."""
    made = make_slice(gce)
    assert made.target_size == 2 and made.resource_policies.workload_policy.endswith(POLICY)
    names = predicted_member_names("slice", "slice", 2)
    wait_for(lambda: statuses(gce) == dict.fromkeys(names, "RUNNING"), timeout=10, what="both VMs RUNNING")
    wait_for(lambda: gce.groups.get(project=PROJECT, zone=ZONE, instance_group_manager="slice").status.is_stable)
    control = SimulatorControl(server.url)
    workers = control.group_workers(ZONE, "slice")
    assert [(w["worker"], w["instance"]) for w in workers] == [(0, names[0]), (1, names[1])]
    scratch = [Path(w["scratch"]) / "work" for w in workers]
    wait_for(lambda: all((s / "started").exists() for s in scratch), timeout=10, what="both hosts started")

    url = (scratch[0] / "metadata-url").read_text().strip()
    assert metadata(url, "instance/attributes/accelerator-type") == "v7x-16"
    assert "TOPOLOGY: '2x2x2'" in metadata(url, "instance/attributes/tpu-env")
    assert metadata(url, "instance/attributes/agent-worker-number") == "0"
    endpoints = metadata(url, "instance/attributes/worker-network-endpoints").split(",")
    vm = gce.instances.get(project=PROJECT, zone=ZONE, instance=names[0])
    assert len(endpoints) == 2 and endpoints[0].endswith(vm.network_interfaces[0].network_i_p)
    assert metadata(url, "instance/attributes/startup-script") == STARTUP_SCRIPT
    assert metadata(url, "instance/preempted") == "FALSE"

    control.preempt_instance(ZONE, names[0])
    # A TERMINATED Spot VM is deleted compute_operation_seconds later: long enough, so a slow
    # machine still sees it TERMINATED (then short again for the cleanup below).
    control.configure(compute_operation_seconds=3.0)
    assert metadata(url, "instance/preempted") == "TRUE"
    assert gce.instances.get(project=PROJECT, zone=ZONE, instance=names[0]).status == "STOPPING"
    wait_for(lambda: (scratch[0] / "signals").exists(), timeout=5, what="the preempted host's SIGTERM")
    assert (scratch[0] / "signals").read_text().split() == ["TERM"]
    wait_for(lambda: statuses(gce)[names[0]] == "TERMINATED", timeout=15, what="TERMINATED after the grace")
    control.configure(compute_operation_seconds=FAST.compute_operation_seconds)
    wait_for(lambda: statuses(gce)[names[0]] == "", timeout=10, what="the preempted VM deleted")
    with pytest.raises(exceptions.NotFound):
        gce.instances.get(project=PROJECT, zone=ZONE, instance=names[0])
    assert statuses(gce)[names[1]] == "RUNNING" and not (scratch[1] / "signals").exists()
    listed = [i.name for i in gce.instances.list(project=PROJECT, zone=ZONE)]
    assert listed == [names[1]]

    with pytest.raises(exceptions.BadRequest) as refused:
        gce.policies.delete(project=PROJECT, region=REGION, resource_policy="slice-policy")
    assert reason(refused) == "resourceInUseByAnotherResource"
    gce.zonal(gce.groups.delete(project=PROJECT, zone=ZONE, instance_group_manager="slice"))
    wait_for(lambda: (scratch[1] / "signals").exists(), timeout=5, what="the other host's SIGTERM")
    gce.regional(gce.templates.delete(project=PROJECT, region=REGION, instance_template="slice-template"))
    gce.regional(gce.policies.delete(project=PROJECT, region=REGION, resource_policy="slice-policy"))
    assert not list(gce.groups.list(project=PROJECT, zone=ZONE))
    assert not list(gce.templates.list(project=PROJECT, region=REGION))
    assert not list(gce.policies.list(project=PROJECT, region=REGION))
    assert not list(gce.instances.list(project=PROJECT, zone=ZONE))


def test_a_bad_enum_or_an_unknown_field_is_400_and_a_second_insert_409(gce: Clients, server: SimulatorServer) -> None:
    """provisioningModel CHEAP and a field no Instance has are refused as invalid; inserting the
    same policy twice is alreadyExists; an absent one notFound."""
    template = compute_v1.InstanceTemplate(name="bad", properties=vm_properties(model="CHEAP"))
    with pytest.raises(exceptions.BadRequest) as bad_enum:
        gce.templates.insert(project=PROJECT, region=REGION, instance_template_resource=template)
    assert reason(bad_enum) == "invalid" and "provisioningModel" in str(bad_enum.value)
    url = f"{server.url}/compute/v1/projects/{PROJECT}/regions/{REGION}/resourcePolicies"
    body = json.dumps({"name": "p", "workloadPolicy": {"type": "HIGH_THROUGHPUT"}, "colour": "blue"}).encode()
    request = urllib.request.Request(url, data=body, method="POST", headers={"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as unknown:
        urllib.request.urlopen(request, timeout=5)
    answer = json.loads(unknown.value.read())
    assert unknown.value.code == 400 and answer["error"]["errors"][0]["reason"] == "invalid"
    assert "colour" in answer["error"]["message"]

    gce.regional(gce.policies.insert(project=PROJECT, region=REGION, resource_policy_resource=workload_policy()))
    with pytest.raises(exceptions.Conflict) as twice:
        gce.policies.insert(project=PROJECT, region=REGION, resource_policy_resource=workload_policy())
    assert reason(twice) == "alreadyExists"
    with pytest.raises(exceptions.NotFound) as absent:
        gce.policies.get(project=PROJECT, region=REGION, resource_policy="nothing")
    assert reason(absent) == "notFound"


def test_a_mig_that_does_not_make_its_policys_topology_is_refused(gce: Clients) -> None:
    """tpu7x-standard-4t x 4 is 2x2x4, not the policy's 2x2x2."""
    gce.regional(gce.policies.insert(project=PROJECT, region=REGION, resource_policy_resource=workload_policy()))
    template = compute_v1.InstanceTemplate(name="slice-template", properties=vm_properties())
    gce.regional(gce.templates.insert(project=PROJECT, region=REGION, instance_template_resource=template))
    with pytest.raises(exceptions.BadRequest):
        gce.groups.insert(project=PROJECT, zone=ZONE, instance_group_manager_resource=group(size=4))


def test_set_metadata_needs_the_current_fingerprint_and_its_items_reach_the_host(
    server: SimulatorServer, gce: Clients
) -> None:
    """A missing or stale fingerprint is 412 conditionNotMet; the current one replaces the items,
    which the host's metadata server answers; a scheduled maintenance shows on both sides."""
    make_slice(gce)
    name = predicted_member_names("slice", "slice", 2)[1]
    wait_for(lambda: statuses(gce).get(name) == "RUNNING", timeout=10)
    workers = SimulatorControl(server.url).group_workers(ZONE, "slice")
    url_file = Path(workers[1]["scratch"]) / "work" / "metadata-url"
    wait_for(url_file.exists, timeout=10)
    url = url_file.read_text().strip()
    for stale in ("", "stale"):
        with pytest.raises(exceptions.PreconditionFailed) as refused:
            gce.instances.set_metadata(
                project=PROJECT, zone=ZONE, instance=name, metadata_resource=compute_v1.Metadata(fingerprint=stale)
            )
        assert reason(refused) == "conditionNotMet"
    current = gce.instances.get(project=PROJECT, zone=ZONE, instance=name).metadata
    items = [*current.items, compute_v1.Items(key="tpujobs-assignment", value="job-1")]
    gce.zonal(
        gce.instances.set_metadata(
            project=PROJECT,
            zone=ZONE,
            instance=name,
            metadata_resource=compute_v1.Metadata(fingerprint=current.fingerprint, items=items),
        )
    )
    assert metadata(url, "instance/attributes/tpujobs-assignment") == "job-1"
    assert metadata(url, "instance/attributes/agent-worker-number") == "1"
    assert metadata(url, "instance/upcoming-maintenance") == "NONE"

    SimulatorControl(server.url).schedule_maintenance(ZONE, name, notice=600)
    shown = gce.instances.get(project=PROJECT, zone=ZONE, instance=name).resource_status.upcoming_maintenance
    assert shown.type_ == "SCHEDULED" and shown.maintenance_status == "PENDING"
    announced = json.loads(metadata(url, "instance/upcoming-maintenance", alt="json"))
    assert announced["window_start_time"] == shown.window_start_time and announced["type"] == "SCHEDULED"


def test_lists_page_with_max_results_and_filter_by_name(gce: Clients) -> None:
    """Five policies in pages of two, every one once; `name eq` takes a regular expression and
    `name =` the name itself."""
    for index in range(5):
        policy = workload_policy(f"policy-{index}")
        gce.policies.insert(project=PROJECT, region=REGION, resource_policy_resource=policy)
    pager = gce.policies.list(
        request=compute_v1.ListResourcePoliciesRequest(project=PROJECT, region=REGION, max_results=2)
    )
    assert [len(page.items) for page in pager.pages] == [2, 2, 1]
    every = [p.name for p in gce.policies.list(project=PROJECT, region=REGION)]
    assert every == [f"policy-{i}" for i in range(5)]
    request = compute_v1.ListResourcePoliciesRequest(project=PROJECT, region=REGION, filter='name eq "policy-[13]"')
    assert [p.name for p in gce.policies.list(request=request)] == ["policy-1", "policy-3"]
    request = compute_v1.ListResourcePoliciesRequest(project=PROJECT, region=REGION, filter='name = "policy-4"')
    assert [p.name for p in gce.policies.list(request=request)] == ["policy-4"]


def test_a_stockout_shows_per_managed_instance_and_the_insert_still_succeeds(
    server: SimulatorServer, gce: Clients
) -> None:
    """No v7x capacity in the zone: the MIG insert is DONE without error, and each member is
    CREATING with ZONE_RESOURCE_POOL_EXHAUSTED in lastAttempt; capacity arriving makes them RUNNING."""
    SimulatorControl(server.url).configure(capacity={f"v7x@{ZONE}": 0})
    make_slice(gce)
    wait_for(lambda: all(m.last_attempt.errors.errors for m in managed(gce)), timeout=10)
    for member in managed(gce):
        assert member.current_action == "CREATING" and not member.instance_status
        assert member.last_attempt.errors.errors[0].code == "ZONE_RESOURCE_POOL_EXHAUSTED"
    assert not gce.groups.get(project=PROJECT, zone=ZONE, instance_group_manager="slice").status.is_stable
    SimulatorControl(server.url).configure(capacity={f"v7x@{ZONE}": 8})
    wait_for(lambda: set(statuses(gce).values()) == {"RUNNING"}, timeout=10)


def test_global_templates_and_their_operations(gce: Clients) -> None:
    """A global template: insert followed with globalOperations.wait, then get and delete."""
    template = compute_v1.InstanceTemplate(name="global-template", properties=vm_properties())
    done = gce.global_(gce.global_templates.insert(project=PROJECT, instance_template_resource=template))
    assert done.operation_type == "insert" and done.target_link.endswith("/global/instanceTemplates/global-template")
    fetched = gce.global_templates.get(project=PROJECT, instance_template="global-template")
    assert fetched.properties.machine_type == "tpu7x-standard-4t"
    fetched_op = gce.global_operations.get(project=PROJECT, operation=done.name)
    assert fetched_op.status == compute_v1.Operation.Status.DONE
    gce.global_(gce.global_templates.delete(project=PROJECT, instance_template="global-template"))
    with pytest.raises(exceptions.NotFound):
        gce.global_templates.get(project=PROJECT, instance_template="global-template")


def test_the_tpu_api_refuses_v7x(server: SimulatorServer) -> None:
    """TPU7x is served by Compute Engine only: a queued resource of v7x-16 is INVALID_ARGUMENT."""
    from google.cloud import tpu_v2

    client = tpu_v2.TpuClient(
        transport="rest",
        client_options={"api_endpoint": server.url},
        credentials=google.auth.credentials.AnonymousCredentials(),
    )
    parent = f"projects/{PROJECT}/locations/{ZONE}"
    resource = tpu_v2.QueuedResource(
        tpu=tpu_v2.QueuedResource.Tpu(
            node_spec=[
                tpu_v2.QueuedResource.Tpu.NodeSpec(
                    parent=parent,
                    node_id="n",
                    node=tpu_v2.Node(accelerator_type="v7x-16", runtime_version="v2-alpha-tpu7-ubuntu2404"),
                )
            ]
        )
    )
    with pytest.raises(exceptions.BadRequest) as refused:
        client.create_queued_resource(parent=parent, queued_resource_id="qr", queued_resource=resource)
    assert "Compute Engine" in str(refused.value)


def test_gcloud_lists_and_describes_what_the_simulator_holds(
    server: SimulatorServer, gce: Clients, tmp_path: Path
) -> None:
    """A client no one here wrote: gcloud (CLOUDSDK_API_ENDPOINT_OVERRIDES_COMPUTE) lists the VMs
    across zones, lists a MIG's instances and describes the workload policy."""
    gcloud = Gcloud.against({"COMPUTE": f"{server.url}/compute/v1/"}, tmp_path / "gcloud", PROJECT)
    if gcloud is None:
        pytest.skip("gcloud is not installed on this machine")
    run = gcloud.ok
    make_slice(gce)
    names = predicted_member_names("slice", "slice", 2)
    wait_for(lambda: statuses(gce) == dict.fromkeys(names, "RUNNING"), timeout=10)
    listed = run("compute", "instances", "list", "--format=value(name,status)")
    assert listed.split() == [names[0], "RUNNING", names[1], "RUNNING"]
    members = run(
        "compute",
        "instance-groups",
        "managed",
        "list-instances",
        "slice",
        f"--zone={ZONE}",
        "--format=value(name,instanceStatus)",
    )
    assert members.split() == [names[0], "RUNNING", names[1], "RUNNING"]
    described = run("compute", "resource-policies", "describe", "slice-policy", f"--region={REGION}", "--format=json")
    assert json.loads(described)["workloadPolicy"] == {"type": "HIGH_THROUGHPUT", "acceleratorTopology": "2x2x2"}
    instance = json.loads(run("compute", "instances", "describe", names[1], f"--zone={ZONE}", "--format=json"))
    assert (instance["name"], instance["status"]) == (names[1], "RUNNING")
    assert instance["machineType"].endswith("/machineTypes/tpu7x-standard-4t")
    groups = run("compute", "instance-groups", "managed", "list", "--format=value(name,targetSize)")
    assert groups.split() == ["slice", "2"]
    group = json.loads(
        run("compute", "instance-groups", "managed", "describe", "slice", f"--zone={ZONE}", "--format=json")
    )
    assert group["targetSize"] == 2 and group["status"]["isStable"] is True
    assert group["instanceLifecyclePolicy"]["defaultActionOnFailure"] == "DO_NOTHING"
    policies = run("compute", "resource-policies", "list", "--format=value(name)")
    assert policies.split() == ["slice-policy"]


def test_a_planned_fault_answers_the_next_compute_call_in_computes_shape(server: SimulatorServer, gce: Clients) -> None:
    """plan_errors(get, 503): the next get is ServiceUnavailable with an `errors` list; the one after works."""
    gce.regional(gce.policies.insert(project=PROJECT, region=REGION, resource_policy_resource=workload_policy()))
    control = SimulatorControl(server.url)
    control.plan_errors("get", 503)
    with pytest.raises(exceptions.ServiceUnavailable) as failed:  # no retry: the client's default retries 503
        gce.policies.get(project=PROJECT, region=REGION, resource_policy="slice-policy", retry=None)
    assert control.faults()["errors"]["get"] == []
    assert reason(failed) == "backendError"
    assert gce.policies.get(project=PROJECT, region=REGION, resource_policy="slice-policy").name == "slice-policy"
