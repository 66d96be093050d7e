"""The Compute Engine verbs a user runs on one VM with gcloud, on a fake clock without sockets:
instances.stop, the serial console and its byte offsets, and the aggregated instance templates."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from test_simulator_compute_model import QUICK, P, R, Z, properties, running_slice, simulator

from tpujobs.local.simulator.compute_api import ComputeApi
from tpujobs.local.simulator.compute_errors import ComputeError
from tpujobs.local.simulator.compute_instance_verbs import console_of, serial_window
from tpujobs.local.simulator.records import HostAction, HostEvent
from tpujobs.local.testing import SecondsClock

GRACE = QUICK.delete_grace_seconds


@pytest.fixture
def clock() -> SecondsClock:
    return SecondsClock()


def test_a_serial_read_from_zero_gets_everything_and_next_is_the_end() -> None:
    """start 0: all that was written; next: the byte after it."""
    assert serial_window(b"abcdef", 0) == (0, 6, b"abcdef")


def test_a_serial_read_from_next_gets_only_what_came_since() -> None:
    """start = the last answer's next: the new bytes only (nothing when nothing came)."""
    assert serial_window(b"abcdefgh", 6) == (6, 8, b"gh")
    assert serial_window(b"abcdef", 6) == (6, 6, b"")


def test_a_serial_read_older_than_what_is_kept_starts_at_the_oldest_kept_byte() -> None:
    """Only the last 1 MB is kept: a start before it is moved to the oldest byte still there, and the
    answer's start says where that is."""
    assert serial_window(b"0123456789", 2, kept=4) == (6, 10, b"6789")
    assert serial_window(b"0123456789", 8, kept=4) == (8, 10, b"89")


def test_a_negative_serial_start_is_the_most_recent_bytes_within_what_is_kept() -> None:
    """-3: the last 3 bytes; a count back past what is kept stops at the oldest kept byte."""
    assert serial_window(b"0123456789", -3) == (7, 10, b"789")
    assert serial_window(b"0123456789", -9, kept=4) == (6, 10, b"6789")


def test_a_serial_start_past_the_end_answers_nothing_from_there() -> None:
    """Nothing exists there yet: no contents, and next is that start."""
    assert serial_window(b"abc", 10) == (10, 10, b"")


def test_the_console_shows_the_boot_then_each_script_line_as_the_guest_agent_prints_it(clock: SecondsClock) -> None:
    """Kernel and agent lines, then `NAME google_metadata_script_runner: startup-script: LINE`; more
    output only adds bytes at the end, so offsets hold between calls."""
    sim = simulator(clock)
    first, _ = running_slice(clock, sim)
    view = sim.compute.vms.get_instance(P, Z, first)
    before = console_of(view, b"step 1\nstep")
    after = console_of(view, b"step 1\nstep 2\n")
    assert after.startswith(before)
    text = after.decode()
    assert text.splitlines()[0].startswith(f"Booting {first} (tpu7x-standard-4t) in {Z}")
    assert f"{first} google_metadata_script_runner: startup-script: step 2" in text.splitlines()


def test_a_stopped_mig_vm_gets_sigterm_is_stopping_for_the_grace_then_terminated_and_kept(clock: SecondsClock) -> None:
    """instances.stop: a `stop` operation; the host is shut down (SIGTERM, SIGKILL after the grace),
    the VM STOPPING, not preempted, then TERMINATED; a Spot VM whose termination action is DELETE
    is kept, and its DO_NOTHING MIG lists it TERMINATED while the other VM runs on."""
    sim = simulator(clock)
    events: list[HostEvent] = []
    sim.on_hosts.append(events.append)
    first, second = running_slice(clock, sim)
    operation = sim.compute.vms.stop_instance(P, Z, first)
    assert operation.record.operation_type == "stop" and operation.record.target.endswith(f"/instances/{first}")
    assert [(e.workers, e.action) for e in events] == [((0,), HostAction.SHUTDOWN)]
    stopping = sim.compute.vms.get_instance(P, Z, first)
    assert (stopping.status, stopping.record.preempted) == ("STOPPING", False)
    clock.tick(GRACE + 0.1)
    assert sim.compute.vms.get_instance(P, Z, first).status == "TERMINATED"
    clock.tick(60)
    assert [(m.record.name, m.status) for m in sim.compute.groups.get_group(P, Z, "mig").members] == [
        (first, "TERMINATED"),
        (second, "RUNNING"),
    ]


def test_stopping_a_vm_again_changes_nothing_and_one_not_running_yet_is_refused(clock: SecondsClock) -> None:
    """A second stop answers an operation and sends no second shutdown; a VM still PROVISIONING is
    refused with conditionNotMet naming its status."""
    sim = simulator(clock)
    events: list[HostEvent] = []
    sim.on_hosts.append(events.append)
    first, _ = running_slice(clock, sim)
    sim.compute.vms.stop_instance(P, Z, first)
    assert sim.compute.vms.stop_instance(P, Z, first).record.operation_type == "stop"
    assert len(events) == 1
    sim.compute.vms.insert_instance(
        P, Z, {"name": "lone", **properties(model="STANDARD", machine_type=f"zones/{Z}/machineTypes/tpu7x-standard-4t")}
    )
    clock.tick(QUICK.waiting_seconds + 0.1)
    with pytest.raises(ComputeError) as refused:
        sim.compute.vms.stop_instance(P, Z, "lone")
    assert refused.value.reason == "conditionNotMet" and "PROVISIONING" in str(refused.value)


def test_the_aggregated_templates_list_has_regional_ones_by_region_and_global_ones_under_global(
    clock: SecondsClock,
) -> None:
    """GET aggregated/instanceTemplates (gcloud's `instance-templates list` with no --regions): an
    InstanceTemplateAggregatedList; another project's templates are not in it; `filter` on the name."""
    sim = simulator(clock)
    sim.compute.operations.insert_template(P, R, {"name": "regional", "properties": properties()})
    sim.compute.operations.insert_template(P, "", {"name": "global-one", "properties": properties()})
    sim.compute.operations.insert_template("other", R, {"name": "theirs", "properties": properties()})
    api = ComputeApi(sim)
    path = f"/compute/v1/projects/{P}/aggregated/instanceTemplates"
    status, answer = api.route("GET", path, {}, b"")
    assert status == 200 and answer["kind"] == "compute#instanceTemplateAggregatedList"
    names: dict[str, Any] = {
        scope: [t["name"] for t in scoped["instanceTemplates"]] for scope, scoped in answer["items"].items()
    }
    assert names == {"global": ["global-one"], f"regions/{R}": ["regional"]}
    _, filtered = api.route("GET", path, {"filter": ['name = "regional"']}, b"")
    assert list(filtered["items"]) == [f"regions/{R}"]


def test_the_serial_port_answers_in_computes_shape_and_refuses_a_port_past_four(
    clock: SecondsClock, tmp_path: Path
) -> None:
    """GET .../serialPort with no hosts running: compute#serialPortOutput with start and next as
    int64 strings and the instance's selfLink; port 5 is 400 invalid."""
    sim = simulator(clock)
    first, _ = running_slice(clock, sim)
    api = ComputeApi(sim)
    path = f"/compute/v1/projects/{P}/zones/{Z}/instances/{first}/serialPort"
    status, answer = api.route("GET", path, {"port": ["2"]}, b"")
    assert status == 200
    assert answer == {
        "kind": "compute#serialPortOutput",
        "contents": "",
        "start": "0",
        "next": "0",
        "selfLink": f"https://www.googleapis.com/compute/v1/projects/{P}/zones/{Z}/instances/{first}/serialPort",
    }
    with pytest.raises(ComputeError) as refused:
        api.route("GET", path, {"port": ["5"]}, b"")
    assert refused.value.http_status == 400
