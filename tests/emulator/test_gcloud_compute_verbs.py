"""The real gcloud as a user inspects and tests a Compute Engine slice on the simulator
(CLOUDSDK_API_ENDPOINT_OVERRIDES_COMPUTE): `instance-templates list` with no region, a VM's serial
console with its offsets, `instances stop` and `instances simulate-maintenance-event`. Each test
skips, saying why, where gcloud is not installed."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from google.cloud import compute_v1
from test_simulator_compute_api import (
    FAST,
    PROJECT,
    REGION,
    STARTUP_SCRIPT,
    ZONE,
    Clients,
    group,
    statuses,
    vm_properties,
    workload_policy,
)

from tpujobs.local.gcloud_cli import Gcloud
from tpujobs.local.simulator import SimulatorServer
from tpujobs.local.simulator.client import SimulatorControl
from tpujobs.local.simulator.compute_records import predicted_member_names
from tpujobs.local.testing import wait_for

pytestmark = pytest.mark.emulator

NAMES = predicted_member_names("slice", "slice", 2)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[SimulatorServer]:
    with SimulatorServer(FAST, workers_root=tmp_path / "workers") as running:
        yield running


@pytest.fixture
def gcloud(server: SimulatorServer, tmp_path: Path) -> Gcloud:
    cli = Gcloud.against({"COMPUTE": f"{server.url}/compute/v1/"}, tmp_path / "gcloud", PROJECT)
    if cli is None:
        pytest.skip("gcloud is not installed on this machine")
    return cli


def running_slice(server: SimulatorServer, script: str = STARTUP_SCRIPT) -> list[Path]:
    """A 2-host slice as tpujobs makes one (onHostMaintenance TERMINATE, automaticRestart false)
    whose hosts run *script* and have started; each host's work folder."""
    gce = Clients(server.url)
    properties = vm_properties(script=script)
    properties.scheduling.automatic_restart = False
    gce.regional(gce.policies.insert(project=PROJECT, region=REGION, resource_policy_resource=workload_policy()))
    template = compute_v1.InstanceTemplate(name="slice-template", properties=properties)
    gce.regional(gce.templates.insert(project=PROJECT, region=REGION, instance_template_resource=template))
    gce.zonal(gce.groups.insert(project=PROJECT, zone=ZONE, instance_group_manager_resource=group()))
    wait_for(lambda: statuses(gce) == dict.fromkeys(NAMES, "RUNNING"), timeout=10, what="both VMs RUNNING")
    workers = SimulatorControl(server.url).group_workers(ZONE, "slice")
    scratch = [Path(w["scratch"]) / "work" for w in workers]
    wait_for(lambda: all((s / "started").exists() for s in scratch), timeout=10, what="both hosts started")
    return scratch


def test_gcloud_lists_instance_templates_without_naming_a_region(server: SimulatorServer, gcloud: Gcloud) -> None:
    """`instance-templates list` with no --regions reads aggregated/instanceTemplates: the slice's
    regional template is listed with its machine type."""
    running_slice(server)
    listed = gcloud.ok("compute", "instance-templates", "list", "--format=value(name,properties.machineType)")
    assert listed.split() == ["slice-template", "tpu7x-standard-4t"]


def test_gcloud_reads_a_vms_serial_console_and_only_whats_new_from_next(
    server: SimulatorServer, gcloud: Gcloud
) -> None:
    """get-serial-port-output: the boot, then the startup script's lines as the guest agent prints
    them; --start at the `next` gcloud reports gives only what came after."""
    scratch = running_slice(server)
    first = gcloud.run("compute", "instances", "get-serial-port-output", NAMES[0], f"--zone={ZONE}")
    assert first.returncode == 0, first.stderr
    assert first.stdout.startswith(f"Booting {NAMES[0]} (tpu7x-standard-4t)")
    next_ = int(first.stderr.split("--start=")[1].split()[0])
    assert next_ == len(first.stdout.encode()) - 1  # gcloud prints the contents and a newline
    (scratch[0].parent / "worker.log").open("a").write("checkpoint saved at step 7\n")
    later = gcloud.ok("compute", "instances", "get-serial-port-output", NAMES[0], f"--zone={ZONE}", f"--start={next_}")
    assert later.strip() == f"{NAMES[0]} google_metadata_script_runner: startup-script: checkpoint saved at step 7"


def test_gcloud_says_serial_output_was_lost_when_asked_for_more_than_the_last_megabyte(
    server: SimulatorServer, gcloud: Gcloud
) -> None:
    """A host that printed over 1 MB: --start=1 is older than what Compute Engine keeps, so the
    answer starts later and gcloud warns that output was lost; what comes back is the newest."""
    script = (
        'touch "$TPUJOBS_WORKDIR/started"\n'
        "seq -f \"line %g $(printf '%080d' 0)\" 1 12000\n"
        "echo last-line\n"
        "while true; do sleep 0.05; done\n"
    )
    running_slice(server, script)
    worker_log = Path(SimulatorControl(server.url).group_workers(ZONE, "slice")[0]["scratch"]) / "worker.log"
    wait_for(lambda: b"last-line" in worker_log.read_bytes(), timeout=10, what="the host printed it all")
    done = gcloud.run("compute", "instances", "get-serial-port-output", NAMES[0], f"--zone={ZONE}", "--start=1")
    assert done.returncode == 0, done.stderr
    assert "Some serial port output was lost due to a limited buffer" in done.stderr
    assert done.stdout.rstrip().endswith("startup-script: last-line")
    assert (1 << 20) - 1 <= len(done.stdout.encode()) <= (1 << 20) + 1 and "line 1 " not in done.stdout


def test_gcloud_stops_a_slices_vm_its_host_gets_sigterm_and_the_mig_lists_it_terminated(
    server: SimulatorServer, gcloud: Gcloud
) -> None:
    """`instances stop` waits for its operation: the host got SIGTERM, the VM is TERMINATED and
    stays (a DO_NOTHING MIG does not repair it), and the other VM runs on."""
    scratch = running_slice(server)
    gcloud.ok("compute", "instances", "stop", NAMES[0], f"--zone={ZONE}")
    wait_for(lambda: (scratch[0] / "signals").exists(), timeout=10, what="SIGTERM on the stopped host")
    assert not (scratch[1] / "signals").exists()
    gce = Clients(server.url)
    wait_for(lambda: statuses(gce) == {NAMES[0]: "TERMINATED", NAMES[1]: "RUNNING"}, timeout=10)
    described = json.loads(
        gcloud.ok("compute", "instances", "describe", NAMES[0], f"--zone={ZONE}", "--format=json(status)")
    )
    assert described == {"status": "TERMINATED"}


def test_gcloud_simulates_host_maintenance_and_the_tpu_vm_is_terminated(
    server: SimulatorServer, gcloud: Gcloud
) -> None:
    """simulate-maintenance-event on a TPU VM (onHostMaintenance TERMINATE, which cannot live-migrate):
    the host gets SIGTERM and the VM ends TERMINATED; the other VM runs on."""
    scratch = running_slice(server)
    gcloud.ok("compute", "instances", "simulate-maintenance-event", NAMES[0], f"--zone={ZONE}")
    wait_for(lambda: (scratch[0] / "signals").exists(), timeout=30, what="SIGTERM on the host in maintenance")
    gce = Clients(server.url)
    wait_for(lambda: statuses(gce) == {NAMES[0]: "TERMINATED", NAMES[1]: "RUNNING"}, timeout=30)
