"""The TPU adapter's warm-pool methods through the real google-cloud-tpu REST client against the
simulator: a unit's queued resource is requested and adopted as a job's is, and its nodes'
metadata (the assignment channel) is replaced with UpdateNode and seen at once by its hosts'
metadata servers, a held wait_for_change included."""

from __future__ import annotations

import threading
import urllib.parse
import urllib.request
from collections.abc import Iterator

import pytest
from google.cloud import tpu_v2

from tpujobs.adapters.google_errors import transient_retry
from tpujobs.adapters.tpu import CloudTpu, build_client
from tpujobs.domain import naming
from tpujobs.domain.spec import JobSpec, parse_spec
from tpujobs.engine.errors import PermanentError, TransientError
from tpujobs.engine.ports import HostBoot, UnitRequest
from tpujobs.local.simulator import SimulatorConfig, SimulatorServer
from tpujobs.local.simulator.client import SimulatorControl
from tpujobs.local.simulator.metadata import metadata_url
from tpujobs.local.testing import wait_for

pytestmark = pytest.mark.emulator

PROJECT = "tpujobs-units"
ZONE = "us-central2-b"
SA = "tpu-vm@tpujobs-units.iam.gserviceaccount.com"
IDLE = '{"seq": 1}'
BOOT = HostBoot(SA, {"startup-script": "#!/bin/bash\necho pool", "tpujobs-assignment": IDLE})
ASSIGNMENT = "instance/attributes/tpujobs-assignment"


@pytest.fixture
def server() -> Iterator[SimulatorServer]:
    config = SimulatorConfig(waiting_seconds=0.02, provisioning_seconds=0.05, tick_seconds=0.01)
    with SimulatorServer(config, run_workers=False) as running:
        yield running


@pytest.fixture
def client(server: SimulatorServer) -> tpu_v2.TpuClient:
    return build_client(server.url)


@pytest.fixture
def tpu(client: tpu_v2.TpuClient) -> CloudTpu:
    return CloudTpu(client, PROJECT)


def pool_spec(slices: int = 1, capacity: str = "spot") -> JobSpec:
    return parse_spec(
        {
            "name": "demo",
            "job_id": "pool-demo",
            "owner": "ada@example.com",
            "accelerator_type": "v4-16",
            "slices": slices,
            "capacity": capacity,
            "command": "true",
            "labels": {"team": "ml"},
            "tags": ["tpu-vm"],
        }
    )


def a_unit(index: int = 0, slices: int = 1) -> UnitRequest:
    return UnitRequest(
        name=naming.unit_queued_resource_name("demo", index, 1),
        zone=ZONE,
        spec=pool_spec(slices),
        labels={"tpujobs-pool": "demo", "tpujobs-unit": str(index)},
    )


def node(client: tpu_v2.TpuClient, node_id: str) -> tpu_v2.Node:
    return client.get_node(name=f"projects/{PROJECT}/locations/{ZONE}/nodes/{node_id}")


def active(tpu: CloudTpu, unit: UnitRequest) -> None:
    """Request the unit and wait until its queued resource is ACTIVE."""
    tpu.request_unit(unit, BOOT)

    def is_active() -> bool:
        status = tpu.status(ZONE, unit.name)
        return status is not None and status.state == "ACTIVE"

    wait_for(is_active)


def metadata_get(server: SimulatorServer, node_id: str, worker: int, **query: str) -> tuple[str, str]:
    """(body, ETag) of the assignment as host `worker` of `node_id` reads it from its metadata server."""
    url = metadata_url(server.url, PROJECT, ZONE, node_id, worker) + "/" + ASSIGNMENT
    if query:
        url += "?" + urllib.parse.urlencode(query)
    request = urllib.request.Request(url, headers={"Metadata-Flavor": "Google"})
    with urllib.request.urlopen(request, timeout=120) as answer:
        return answer.read().decode("utf-8"), answer.headers["ETag"]


def test_request_unit_creates_a_queued_resource_labelled_with_the_pool_and_no_job(tpu, client):
    """The unit's QR carries the pool's shape, capacity and boot, and its labels are the pool's
    and unit's only: no tpujobs-job, and not the pool spec's own labels."""
    status = tpu.request_unit(a_unit(), BOOT)
    assert (status.name, status.zone, status.job_label, status.pool_label) == ("demo-u0-g1", ZONE, None, "demo")
    assert status.operation
    resource = client.get_queued_resource(name=f"projects/{PROJECT}/locations/{ZONE}/queuedResources/demo-u0-g1")
    assert "spot" in resource
    spec = resource.tpu.node_spec[0]
    assert spec.node_id == "demo-u0-g1"
    assert dict(spec.node.labels) == {"tpujobs-pool": "demo", "tpujobs-unit": "0"}
    assert (spec.node.accelerator_type, list(spec.node.tags)) == ("v4-16", ["tpu-vm"])
    assert spec.node.service_account.email == SA
    assert dict(spec.node.metadata) == dict(BOOT.metadata)


def test_a_second_request_of_the_same_unit_adopts_it(tpu):
    """ALREADY_EXISTS on create is our own unit: adopted, and still one queued resource."""
    first = tpu.request_unit(a_unit(), BOOT)
    again = tpu.request_unit(a_unit(), BOOT)
    assert (again.name, again.pool_label) == (first.name, "demo")
    assert again.operation == ""  # adopted: no create operation of its own
    listed = tpu.list_capacity(ZONE)
    assert [(s.name, s.pool_label, s.job_label) for s in listed] == [("demo-u0-g1", "demo", None)]


def test_a_multislice_unit_names_its_nodes_as_naming_says(tpu, client):
    """Two slices: nodes {qr}-0 and {qr}-1, both labelled with the pool."""
    unit = a_unit(index=1, slices=2)
    active(tpu, unit)
    for index in range(2):
        found = node(client, naming.node_id(unit.name, index, 2))
        assert found.labels["tpujobs-pool"] == "demo"


@pytest.mark.parametrize("slices", [1, 2])
def test_tell_hosts_sets_every_nodes_tpujobs_keys_and_every_host_reads_them(tpu, client, server, slices):
    """Each node has the keys written (here every key it booted with), and every host of every
    slice reads the new assignment from its metadata server once the update has propagated."""
    unit = a_unit(slices=slices)
    active(tpu, unit)
    written = {"startup-script": "#!/bin/bash\necho pool v2", "tpujobs-assignment": '{"seq": 2, "job_id": "j"}'}
    tpu.tell_hosts(ZONE, unit.name, slices, written)
    for index in range(slices):
        node_id = naming.node_id(unit.name, index, slices)
        assert dict(node(client, node_id).metadata) == written
        for worker in range(2):  # v4-16: two hosts a slice
            wait_for(lambda: metadata_get(server, node_id, worker)[0] == '{"seq": 2, "job_id": "j"}')  # noqa: B023


def test_a_held_wait_for_change_returns_the_written_assignment(tpu, server):
    """An agent's hanging GET on the assignment returns the value tell_hosts wrote."""
    unit = a_unit()
    active(tpu, unit)
    _, etag = metadata_get(server, unit.name, 0)
    got: list[str] = []
    query = {"wait_for_change": "true", "last_etag": etag, "timeout_sec": "60"}
    waiter = threading.Thread(target=lambda: got.append(metadata_get(server, unit.name, 0, **query)[0]))
    waiter.start()
    tpu.tell_hosts(ZONE, unit.name, 1, {**BOOT.metadata, "tpujobs-assignment": '{"seq": 2}'})
    waiter.join(timeout=90)
    assert got == ['{"seq": 2}']


def test_writing_the_same_value_again_keeps_the_etag(tpu, server):
    """GCE's ETag is a hash of the content: an identical write changes nothing a host sees."""
    unit = a_unit()
    active(tpu, unit)
    assigned = {**BOOT.metadata, "tpujobs-assignment": '{"seq": 5}'}
    tpu.tell_hosts(ZONE, unit.name, 1, assigned)
    first = metadata_get(server, unit.name, 1)
    tpu.tell_hosts(ZONE, unit.name, 1, dict(assigned))
    assert metadata_get(server, unit.name, 1) == first


def test_writing_to_a_node_that_does_not_exist_is_permanent(tpu):
    """No such node: PermanentError naming the node; nothing to retry."""
    with pytest.raises(PermanentError) as raised:
        tpu.tell_hosts(ZONE, "demo-u9-g1", 1, {"tpujobs-assignment": IDLE})
    assert str(raised.value).startswith("TPU API refused to write the metadata of node demo-u9-g1: 404 ")


def test_an_update_that_meets_a_blip_is_retried(tpu, client, server):
    """One UNAVAILABLE and one INTERNAL on UpdateNode cost retries, and the write lands."""
    unit = a_unit()
    active(tpu, unit)
    control = SimulatorControl(server.url)
    control.plan_errors("update", "UNAVAILABLE")
    control.plan_errors("update", 500)
    tpu.tell_hosts(ZONE, unit.name, 1, {"tpujobs-assignment": '{"seq": 2}'})
    assert control.faults()["errors"]["update"] == []
    assert node(client, unit.name).metadata["tpujobs-assignment"] == '{"seq": 2}'


def test_an_update_outage_past_the_retry_deadline_is_transient(client, server):
    """UNAVAILABLE that lasts past the in-call deadline raises TransientError, to be redelivered."""
    tpu = CloudTpu(client, PROJECT, retry=transient_retry(deadline_s=0.5))
    unit = a_unit()
    active(tpu, unit)
    SimulatorControl(server.url).plan_errors("update", "UNAVAILABLE", count=1000)
    with pytest.raises(TransientError) as raised:
        tpu.tell_hosts(ZONE, unit.name, 1, {"tpujobs-assignment": '{"seq": 2}'})
    assert str(raised.value).startswith("TPU API failed to write the metadata of node demo-u0-g1: ")


def test_writing_to_a_preempted_unit_is_permanent_in_googles_words(tpu, client, server):
    """A preempted node is not READY: FAILED_PRECONDITION, a PermanentError saying so; the node's
    metadata is unchanged."""
    unit = a_unit()
    active(tpu, unit)
    SimulatorControl(server.url).preempt(ZONE, unit.name)
    with pytest.raises(PermanentError) as raised:
        tpu.tell_hosts(ZONE, unit.name, 1, {"tpujobs-assignment": '{"seq": 2}'})
    assert "it is PREEMPTED, and only a READY node can be updated" in str(raised.value)
    assert dict(node(client, unit.name).metadata) == dict(BOOT.metadata)
