"""What a user does to one Compute Engine VM besides get, list and delete, as gcloud asks it:
`instances stop`, `instances simulate-maintenance-event`, `instances get-serial-port-output`, and
the aggregated list that `instance-templates list` reads when no region is named.

Paths and query parameters are google-cloud-compute's (services/instances/transports/rest_base.py
and instance_templates'); what the VM goes through is the model's (stop_instance,
simulate_instance_maintenance). The serial console is the simulated host's: boot lines, then its
startup script's output as Google's guest agent prints it, of which Compute Engine keeps the last
1 MB (docs/local-stack.md#gcloud-against-the-simulator).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from tpujobs.local.simulator.compute_errors import invalid_field
from tpujobs.local.simulator.compute_json import operation_json, template_json
from tpujobs.local.simulator.compute_lists import name_filter, query_whole
from tpujobs.local.simulator.compute_records import self_link
from tpujobs.local.simulator.compute_vms import InstanceView
from tpujobs.local.simulator.messages import query_str
from tpujobs.local.simulator.model import Simulator
from tpujobs.local.simulator.workers import WorkerPool

Json = dict[str, Any]
Query = Mapping[str, list[str]]
Handler = Callable[[dict[str, str], Query, bytes], tuple[int, Json]]
SERIAL_BUFFER_BYTES = 1 << 20  # "Returns the last 1 MB of serial port output"
SERIAL_PORTS = range(1, 5)  # "up to four serial port outputs, numbered 1 through 4" (gcloud)
_PROJECT = "/compute/v1/projects/<project>"
_INSTANCE = _PROJECT + "/zones/<zone>/instances/<id:id>"


def serial_window(console: bytes, start: int, kept: int = SERIAL_BUFFER_BYTES) -> tuple[int, int, bytes]:
    """(start, next, bytes) of a getSerialPortOutput answer over everything the port has written:
    only the last *kept* bytes are there; a start before them is moved to the oldest kept byte; a
    negative start counts back from the end; a start past the end answers nothing from there."""
    total = len(console)
    oldest = max(0, total - kept)
    if start > total:
        return start, start, b""
    begin = max(total + start if start < 0 else start, oldest)
    return begin, total, console[begin:]


def console_of(view: InstanceView, script_output: bytes) -> bytes:
    """Serial port 1 of a VM whose host has booted: kernel and agent lines, then each line the
    startup script wrote, as google_metadata_script_runner prints it. Append-only, so byte offsets
    hold from one call to the next."""
    vm = view.record
    machine = str(vm.body.get("machineType", "")).rsplit("/", 1)[-1]
    runner = f"{vm.name} google_metadata_script_runner"
    head = (
        f"Booting {vm.name} ({machine}) in {vm.zone}: a TPU VM host simulated by tpujobs\n"
        "[    0.000000] Linux version 6.8.0-gcp (simulated)\n"
        f"{runner}: Starting startup scripts.\n"
        f"{runner}: Found startup-script in metadata.\n"
    ).encode()
    lines = script_output.splitlines(keepends=True)
    return head + b"".join(f"{runner}: startup-script: ".encode() + line for line in lines)


class InstanceVerbs:
    """The routes of these verbs, composed into ComputeApi; the worker pool (None: no hosts run)
    is where each host's output is."""

    def __init__(self, simulator: Simulator, worker_pool: WorkerPool | None = None) -> None:
        self._simulator = simulator
        self._worker_pool = worker_pool

    def rules(self) -> list[tuple[str, str, Handler]]:
        return [
            ("POST", _INSTANCE + "/stop", self._stop),
            ("POST", _INSTANCE + "/simulateMaintenanceEvent", self._simulate_maintenance),
            ("GET", _INSTANCE + "/serialPort", self._serial_port),
            ("GET", _PROJECT + "/aggregated/instanceTemplates", self._aggregated_templates),
        ]

    def _stop(self, params: dict[str, str], query: Query, body: bytes) -> tuple[int, Json]:
        """instances.stop: ACPI soft-off (the host gets SIGTERM), STOPPING, then TERMINATED."""
        return 200, operation_json(
            self._simulator.compute.vms.stop_instance(params["project"], params["zone"], params["id"])
        )

    def _simulate_maintenance(self, params: dict[str, str], query: Query, body: bytes) -> tuple[int, Json]:
        """A TPU VM cannot live-migrate: it is terminated as its onHostMaintenance TERMINATE says."""
        operation = self._simulator.compute.faults.simulate_instance_maintenance(
            params["project"], params["zone"], params["id"]
        )
        return 200, operation_json(operation)

    def _serial_port(self, params: dict[str, str], query: Query, body: bytes) -> tuple[int, Json]:
        port = query_whole(query, "port", 1)
        if port not in SERIAL_PORTS:
            raise invalid_field("port", port, "It must be within 1..4.")
        view = self._simulator.compute.vms.get_instance(params["project"], params["zone"], params["id"])
        console = self._console(view) if port == 1 else b""
        start, next_, shown = serial_window(console, query_whole(query, "start", 0))
        return 200, {
            "kind": "compute#serialPortOutput",
            "contents": shown.decode("utf-8", errors="replace"),
            "start": str(start),
            "next": str(next_),
            "selfLink": self_link(view.record.path) + "/serialPort",
        }

    def _console(self, view: InstanceView) -> bytes:
        """Nothing until the VM's host has booted (or where no hosts run)."""
        vm = view.record
        if self._worker_pool is None:
            return b""
        hosts = self._worker_pool.workers(vm.backing, zone=vm.zone, project=vm.project)
        host = next((h for h in hosts if (h.slice_index, h.worker) == (0, vm.worker)), None)
        if host is None:
            return b""
        try:
            output = host.log.read_bytes()
        except FileNotFoundError:
            output = b""
        return console_of(view, output)

    def _aggregated_templates(self, params: dict[str, str], query: Query, body: bytes) -> tuple[int, Json]:
        """Every template of the project: regional ones under "regions/R", global ones under "global"."""
        project = params["project"]
        keep = name_filter(query_str(query, "filter"))
        items: dict[str, Json] = {}
        for template in self._simulator.compute.groups.compute_snapshot()["templates"]:
            if template.project == project and keep(template.name):
                scope = f"regions/{template.region}" if template.region else "global"
                items.setdefault(scope, {"instanceTemplates": []})["instanceTemplates"].append(template_json(template))
        base = f"projects/{project}/aggregated/instanceTemplates"
        return 200, {
            "kind": "compute#instanceTemplateAggregatedList",
            "id": base,
            "items": dict(sorted(items.items())),
            "selfLink": self_link(base),
        }
