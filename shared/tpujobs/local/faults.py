"""`tpujobs dev fault ...` and `tpujobs dev preempt`: make the local simulator as unkind as Google, one
fault at a time, to a job on either platform.

Each verb is a call of the simulator's control API (``/simulator/v1/...``), so a test can do the same
over HTTP. Verbs that name a JOB read from the local Firestore what holds it now (its own holding, or
its warm-pool unit's) and its zone, then hit the TPU API's queued resource or, on Compute Engine, each
slice's MIG. ``error`` and ``no-boot --count`` need only the simulator. Progress goes to stderr as
sentences; only ``show`` prints to stdout (JSON). The verbs: docs/local-stack.md#faults-of-the-local-stack.
"""

from __future__ import annotations

import json
import os
import urllib.error
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from functools import partial
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from rich.console import Console

from tpujobs.domain.naming import node_id, platform_of
from tpujobs.domain.platforms import COMPUTE
from tpujobs.local import stack
from tpujobs.local.simulator.client import SimulatorControl
from tpujobs.local.simulator.errors import FAULT_METHODS, Fault
from tpujobs.local.simulator.model import NODE_HEALTHS, NodeState

fault_app = typer.Typer(
    help="Faults of the local simulator, for jobs on the TPU API or Compute Engine: API errors, hosts that "
    "never boot, reboots, maintenance (now or announced ahead), node health and state.",
    no_args_is_help=True,
)

StateDir = Annotated[
    Path | None,
    typer.Option(
        "--state-dir",
        help="Where stack.json and the logs live (default: $TPUJOBS_STATE_DIR or ./.tpujobs).",
    ),
]
JobId = Annotated[
    str, typer.Argument(help="The job whose capacity it hits: its queued resource, its MIGs, or its warm-pool unit's.")
]
Slice = Annotated[
    int | None,
    typer.Option("--slice", min=0, help="Only this slice (node) of a multislice (default: all)."),
]
Worker = Annotated[int | None, typer.Option("--worker", min=0, help="Only this worker host (default: every host).")]

Method = Enum("Method", {name: name for name in FAULT_METHODS}, type=str)  # type: ignore[misc]
Health = Enum("Health", {name: name for name in NODE_HEALTHS}, type=str)  # type: ignore[misc]


@dataclass(frozen=True)
class Capacity:
    """What a job runs on now: its own holding or its warm-pool unit's, with the zone and slice count."""

    job_id: str
    zone: str
    holding: str  # `{job}-a{N}` / `{pool}-u{i}-g{N}` (a queued resource) or `-c{N}` (one MIG per slice)
    slices: int
    on_unit: bool

    @property
    def platform(self) -> str:
        return platform_of(self.holding)

    @property
    def on_compute(self) -> bool:
        return self.platform == COMPUTE

    def groups(self, slice_index: int | None = None) -> list[str]:
        """The MIGs of every slice, or of one (Compute Engine)."""
        chosen = range(self.slices) if slice_index is None else [slice_index]
        return [node_id(self.holding, index, self.slices) for index in chosen]

    def __str__(self) -> str:
        unit = ", its warm-pool unit" if self.on_unit else ""
        return f"{self.holding} (job {self.job_id}{unit})"


class Simulator:
    """The local stack's simulator control API, and its Firestore for job lookups."""

    def __init__(self, state_dir: Path | None, err: Console) -> None:
        directory = state_dir or stack.default_state_dir()
        self.err = err
        self.env = stack.stack_environment(directory)
        if not self.env:
            fail(err, "no local stack", f"none is running from {directory}; run `tpujobs dev up`")
        self.project = self.env.get("GOOGLE_CLOUD_PROJECT", "")
        self.endpoint = self.env.get("TPUJOBS_TPU_ENDPOINT", "").rstrip("/")
        if not self.project or not self.endpoint:
            fail(err, "the local stack is incomplete", "GOOGLE_CLOUD_PROJECT or TPUJOBS_TPU_ENDPOINT unset")
        self.control = SimulatorControl(self.endpoint)

    def capacity_of(self, job_id: str) -> Capacity:
        """What the job's current attempt holds (its warm-pool unit's holding when it runs on one), from Firestore."""
        try:
            job = job_document(self.project, job_id, self.env.get("FIRESTORE_EMULATOR_HOST", ""))
        except Exception as error:  # the emulator is gone or refuses: say so, not a traceback
            fail(self.err, "could not read the job", f"{type(error).__name__}: {error}")
        if job is None:
            fail(
                self.err,
                "no such job",
                f"{job_id!r} is not in the jobs collection of project {self.project}",
            )
        unit = str(job.get("warm_pool_unit") or "")
        holding, zone = unit or str(job.get("queued_resource") or ""), str(job.get("zone") or "")
        if not holding or not zone:
            fail(
                self.err,
                "no capacity to hit",
                f"job {job_id} (state {job.get('state')}) holds no capacity yet",
            )
        slices = (job.get("spec") or {}).get("slices") or 1
        return Capacity(job_id, zone, holding, int(slices), on_unit=bool(unit))

    def on_groups(
        self, capacity: Capacity, slice_index: int | None, doing: str, call: Callable[[str], dict[str, Any]]
    ) -> list[dict[str, Any]]:
        """Call the control API on the job's MIGs (one slice's, or every slice's); the answers."""
        if slice_index is not None and not 0 <= slice_index < capacity.slices:
            fail(self.err, "no such slice", f"{capacity} has slices 0..{capacity.slices - 1}, not {slice_index}")
        return [self.call(f"{doing} {group}", partial(call, group)) for group in capacity.groups(slice_index)]

    def on_capacity(
        self, zone: str, qr_id: str, verb: str, query: dict[str, Any], body: dict[str, Any]
    ) -> dict[str, Any]:
        """POST a control verb on one queued resource (``{zone}/{id}:{verb}``)."""
        return self.call(
            f"{verb} {qr_id}",
            lambda: self.control.on_queued_resource(zone, qr_id, verb, body, **query, project=self.project),
        )

    def on_job(self, capacity: Capacity, verb: str, query: dict[str, Any], body: dict[str, Any]) -> dict[str, Any]:
        """POST a control verb on the job's queued resource (TPU API)."""
        return self.on_capacity(capacity.zone, capacity.holding, verb, query, body)

    def call(self, doing: str, request: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        """Make one control call; a refusal or silence becomes a sentence and exit status 1."""
        try:
            return request()
        except urllib.error.HTTPError as error:
            fail(self.err, f"the simulator refused to {doing}", error_message(error))
        except OSError as error:
            fail(self.err, "the simulator does not answer", f"{self.endpoint}: {error}")

    def say(self, line: str) -> None:
        self.err.print(line, markup=False, highlight=False, soft_wrap=True)


def not_on_compute(err: Console, verb: str, capacity: Capacity, why: str) -> NoReturn:
    """A verb that has no meaning on Compute Engine: say why, exit 1."""
    fail(err, f"{verb} cannot apply", f"{capacity} runs on Compute Engine, {why}")


def job_document(project: str, job_id: str, emulator: str = "") -> dict[str, Any] | None:
    """The job's document; read from the Firestore emulator at `emulator` when given. The client finds
    the emulator only in os.environ: it is set for the read alone, so a caller in the same process
    (a test) is left with its own environment."""
    from google.cloud import firestore  # slow to import: only the verbs naming a job need it

    name = "FIRESTORE_EMULATOR_HOST"
    before = os.environ.get(name)
    if emulator:
        os.environ[name] = emulator
    try:
        snapshot = firestore.Client(project=project).collection("jobs").document(job_id).get(timeout=10)
    finally:
        if before is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = before
    return snapshot.to_dict() if snapshot.exists else None


def error_message(error: urllib.error.HTTPError) -> str:
    try:
        return str(json.load(error)["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return f"HTTP {error.code}"


def fail(err: Console, what: str, why: object) -> NoReturn:
    err.print(f"{what}:", style="bold red", end=" ")
    err.print(str(why), markup=False, highlight=False, soft_wrap=True)
    raise typer.Exit(1)


def _nodes(answer: dict[str, Any]) -> str:
    return ", ".join(
        f"{node.get('name', '?').rsplit('/', 1)[-1]} {node.get('state')}"
        + (f" {node['health']}" if node.get("health") else "")
        for node in answer.get("nodes", [])
    )


def _instances(answers: list[dict[str, Any]]) -> str:
    """The VMs of control answers on MIGs (compute_control.slice_json), with their statuses."""
    return ", ".join(f"{vm.get('name')} {vm.get('status') or 'none'}" for a in answers for vm in a.get("instances", []))


def preempt_job(job_id: str, silent: bool, state_dir: Path | None) -> None:
    """`tpujobs dev preempt`: Spot preemption of the job's capacity (every slice), or with *silent*
    the death of worker 0 of slice 0 without notice."""
    sim = Simulator(state_dir, Console(stderr=True))
    capacity = sim.capacity_of(job_id)
    if capacity.on_compute:
        zone, project = capacity.zone, sim.project
        if silent:
            (first,) = capacity.groups(0)
            answers = sim.on_groups(
                capacity, 0, "kill worker 0 of", lambda g: sim.control.kill_group_host(zone, g, 0, project)
            )
            sim.say(
                f"worker 0 of MIG {first} of {capacity} failed without notice (a host error): {_instances(answers)}"
            )
        else:
            answers = sim.on_groups(capacity, None, "preempt", lambda g: sim.control.preempt_group(zone, g, project))
            sim.say(f"preempted the Spot VMs of {capacity}: {_instances(answers)}")
        return
    verb, query = ("kill-host", {"slice": 0, "worker": 0}) if silent else ("preempt", {})
    answer = sim.on_job(capacity, verb, query, {})
    if silent:
        sim.say(
            f"killed worker 0 of node {answer.get('name', capacity.holding)} of {capacity} without notice "
            f"(node {answer.get('state')})"
        )
    else:
        state = answer.get("state", {}).get("state")
        sim.say(f"preempted {answer.get('name', capacity.holding)} ({state}) of {capacity}")


@fault_app.command()
def error(
    method: Annotated[Method, typer.Option("--method", help="The TPU API call to fail: create, get, list or delete.")],
    code: Annotated[
        str,
        typer.Option(
            "--code",
            help="An HTTP status (400..599) or a google.rpc.Code name (UNKNOWN, CANCELLED, "
            "DEADLINE_EXCEEDED, UNAVAILABLE, DATA_LOSS, ...), sent as Google's REST frontends do.",
        ),
    ],
    count: Annotated[int, typer.Option("--count", min=1, help="How many calls in a row fail.")] = 1,
    quota: Annotated[
        bool,
        typer.Option(
            "--quota",
            help="A 429 that is a quota running out (ErrorInfo RESOURCE_QUOTA_EXCEEDED and a "
            "QuotaFailure) instead of a rate limit.",
        ),
    ] = False,
    applied: Annotated[
        bool,
        typer.Option(
            "--applied",
            help="The call takes effect and only its answer is the error, as when a deadline "
            "expires after the service acted.",
        ),
    ] = False,
    message: Annotated[str, typer.Option("--message", help="The error message (default: Google's).")] = "",
    state_dir: StateDir = None,
) -> None:
    """The next calls of one TPU API method answer with an error, as Google sends it."""
    err = Console(stderr=True)
    try:
        fault = Fault.parse(code, quota=quota, applied=applied, message=message)
    except ValueError as exc:
        fail(err, "bad --code", exc)
    sim = Simulator(state_dir, err)
    body = {
        "method": method.value,
        "code": fault.http_status if code.strip().isdigit() else fault.code.name,
        "count": count,
        "quota": quota,
        "applied": applied,
        "message": message,
    }
    sim.call("plan the errors", lambda: sim.control.plan_errors(**body))
    kind = " (quota)" if quota else ""
    sim.say(
        f"the next {count} {method.value} call{'s' if count > 1 else ''} answer "
        f"{fault.http_status} {fault.code.name}{kind}{', after taking effect' if applied else ''}"
    )


@fault_app.command("no-boot")
def no_boot(
    job_id: Annotated[
        str | None,
        typer.Argument(help="A job whose capacity is not running yet (default: the next --count slices created)."),
    ] = None,
    count: Annotated[
        int | None,
        typer.Option("--count", min=1, help="The next K queued resources or MIG slices created (default: 1)."),
    ] = None,
    state_dir: StateDir = None,
) -> None:
    """Capacity turns ACTIVE (VMs RUNNING) but its hosts never run the startup script, so no agent reports."""
    err = Console(stderr=True)
    if job_id is not None and count is not None:
        fail(err, "no-boot takes a JOB or --count", "not both")
    sim = Simulator(state_dir, err)
    if job_id is None:
        answer = sim.call("plan hosts that never boot", lambda: sim.control.no_boot_next(count or 1))
        sim.say(
            f"the next {answer.get('noBoot', count)} queued resources or MIG slices created get hosts that never boot"
        )
        return
    capacity = sim.capacity_of(job_id)
    if capacity.on_compute:
        zone, project = capacity.zone, sim.project
        sim.on_groups(
            capacity, None, "mark hosts that never boot of", lambda g: sim.control.no_boot_group(zone, g, project)
        )
    else:
        sim.on_job(capacity, "no-boot", {}, {})
    sim.say(f"the hosts of {capacity} will never run their startup script")


def _hosts(worker: int | None) -> str:
    return "every host" if worker is None else f"worker {worker}"


@fault_app.command()
def reboot(
    job_id: JobId,
    worker: Worker = None,
    slice_index: Slice = None,
    state_dir: StateDir = None,
) -> None:
    """Reset hosts as a VM reset does: processes die at once, the startup script runs again on the same disk."""
    sim = Simulator(state_dir, Console(stderr=True))
    capacity = sim.capacity_of(job_id)
    which = _hosts(worker)
    if capacity.on_compute:
        zone, project = capacity.zone, sim.project
        answers = sim.on_groups(
            capacity, slice_index, "reset", lambda g: sim.control.reset_group(zone, g, worker, project)
        )
        sim.say(f"resetting {which} of {capacity}: {_instances(answers)}")
        return
    answer = sim.on_job(capacity, "reboot", {"slice": slice_index, "worker": worker}, {})
    sim.say(f"rebooting {which} of {capacity}: {_nodes(answer)}")


@fault_app.command()
def sigterm(
    job_id: JobId,
    worker: Worker = None,
    slice_index: Slice = None,
    state_dir: StateDir = None,
) -> None:
    """SIGTERM to hosts' processes with no preemption notice, as an unannounced shutdown sends it (TPU API)."""
    sim = Simulator(state_dir, Console(stderr=True))
    capacity = sim.capacity_of(job_id)
    if capacity.on_compute:
        not_on_compute(sim.err, "sigterm", capacity, "where `reboot` or `tpujobs dev preempt` stand for it")
    answer = sim.on_job(capacity, "sigterm", {"slice": slice_index, "worker": worker}, {})
    sim.say(f"sent SIGTERM without notice to {_hosts(worker)} of {capacity}: {len(answer.get('workers', []))} host(s)")


@fault_app.command()
def maintenance(
    job_id: JobId,
    notice: Annotated[
        float | None,
        typer.Option(
            "--notice",
            min=0,
            help="Seconds between the maintenance event and the hosts going down "
            "(default: the simulator's maintenance_notice_seconds).",
        ),
    ] = None,
    scheduled_in: Annotated[
        float | None,
        typer.Option(
            "--scheduled-in",
            min=0,
            help="Instead, announce a maintenance window starting in SECONDS, as Google does days ahead: "
            "each VM's or TPU node's upcomingMaintenance and its hosts' instance/upcoming-maintenance. "
            "Nothing else happens until then; on the TPU API the hosts go down when the window starts.",
        ),
    ] = None,
    window: Annotated[
        float, typer.Option("--window", min=1, help="With --scheduled-in: how long the window lasts, in seconds.")
    ] = 3600.0,
    slice_index: Slice = None,
    state_dir: StateDir = None,
) -> None:
    """Host maintenance now (instance/maintenance-event turns TERMINATE_ON_HOST_MAINTENANCE, then the hosts go
    down), or announced ahead with --scheduled-in."""
    sim = Simulator(state_dir, Console(stderr=True))
    capacity = sim.capacity_of(job_id)
    zone, project = capacity.zone, sim.project
    if scheduled_in is not None:
        ahead = scheduled_in
        if not capacity.on_compute:
            body = {"notice": ahead, "window": window}
            answer = sim.on_job(capacity, "upcoming-maintenance", {"slice": slice_index}, body)
            sim.say(f"maintenance scheduled in {ahead:g} s for {window:g} s on {capacity}: {_nodes(answer)}")
            return
        answers = sim.on_groups(
            capacity,
            slice_index,
            "announce a maintenance on",
            lambda g: sim.control.schedule_group_maintenance(zone, g, ahead, window, project),
        )
        sim.say(f"maintenance scheduled in {ahead:g} s for {window:g} s on {capacity}: {_instances(answers)}")
        return
    if capacity.on_compute:
        answers = sim.on_groups(
            capacity,
            slice_index,
            "start a maintenance on",
            lambda g: sim.control.group_maintenance(zone, g, notice, project),
        )
        sim.say(f"maintenance announced on {capacity}: {_instances(answers)}")
        return
    answer = sim.on_job(capacity, "maintenance", {"slice": slice_index, "notice": notice}, {})
    sim.say(f"maintenance announced on {capacity}: {_nodes(answer)}")


class Interconnect(str, Enum):
    """What `topology` may make a slice's interconnect show."""

    FAILED = "FAILED"
    INCOMPLETE = "INCOMPLETE"


_ONLY_COMPUTE = "whose queued resource has no interconnect state or partial grant of its own (Compute Engine only)"


@fault_app.command()
def topology(
    job_id: JobId,
    state: Annotated[
        Interconnect, typer.Argument(help="What the MIG's appliedAcceleratorTopologies shows.", case_sensitive=False)
    ] = Interconnect.FAILED,
    message: Annotated[str, typer.Option("--message", help="The stateDetails error message shown.")] = "",
    slice_index: Slice = None,
    state_dir: StateDir = None,
) -> None:
    """A Compute Engine slice's interconnect turns FAILED or INCOMPLETE (its VMs run on)."""
    sim = Simulator(state_dir, Console(stderr=True))
    capacity = sim.capacity_of(job_id)
    if not capacity.on_compute:
        fail(sim.err, "topology cannot apply", f"{capacity} runs on the TPU API, {_ONLY_COMPUTE}")
    zone, project, chosen = capacity.zone, sim.project, state.value
    answers = sim.on_groups(
        capacity,
        slice_index,
        f"make the interconnect {chosen} of",
        lambda g: sim.control.fail_topology(zone, g, chosen, message, project),
    )
    sim.say(f"the interconnect of {capacity} is {chosen}: {_instances(answers)}")


@fault_app.command("partial")
def partial_grant(
    job_id: JobId,
    hosts: Annotated[
        int | None, typer.Option("--hosts", min=1, help="How many of the slice's VMs come (default: all but one).")
    ] = None,
    slice_index: Slice = None,
    state_dir: StateDir = None,
) -> None:
    """Of a Compute Engine slice waiting for capacity (individual mode), only some VMs come; the rest wait."""
    sim = Simulator(state_dir, Console(stderr=True))
    capacity = sim.capacity_of(job_id)
    if not capacity.on_compute:
        fail(sim.err, "partial cannot apply", f"{capacity} runs on the TPU API, {_ONLY_COMPUTE}")
    zone, project = capacity.zone, sim.project
    answers = sim.on_groups(
        capacity, slice_index, "grant part of", lambda g: sim.control.grant_partially(zone, g, hosts, project)
    )
    sim.say(f"part of {capacity} came: {_instances(answers)}")


@fault_app.command("node-health")
def node_health(
    job_id: JobId,
    health: Annotated[Health, typer.Argument(help="The Node.Health the API shows.", case_sensitive=False)],
    description: Annotated[str, typer.Option("--description", help="The healthDescription shown.")] = "",
    slice_index: Slice = None,
    state_dir: StateDir = None,
) -> None:
    """Show a health on the job's TPU API nodes (only what the API shows: processes run on)."""
    sim = Simulator(state_dir, Console(stderr=True))
    capacity = sim.capacity_of(job_id)
    if capacity.on_compute:
        not_on_compute(sim.err, "node-health", capacity, _NO_NODES)
    body = {"health": health.value, "description": description}
    answer = sim.on_job(capacity, "node-health", {"slice": slice_index}, body)
    sim.say(f"nodes of {capacity}: {_nodes(answer)}")


@fault_app.command("node-state")
def node_state(
    job_id: JobId,
    state: Annotated[NodeState, typer.Argument(help="The Node.State the API shows.", case_sensitive=False)],
    slice_index: Slice = None,
    state_dir: StateDir = None,
) -> None:
    """Show a state on the job's TPU API nodes (only what the API shows: processes run on)."""
    sim = Simulator(state_dir, Console(stderr=True))
    capacity = sim.capacity_of(job_id)
    if capacity.on_compute:
        not_on_compute(sim.err, "node-state", capacity, _NO_NODES)
    answer = sim.on_job(capacity, "node-state", {"slice": slice_index}, {"state": state.value})
    sim.say(f"nodes of {capacity}: {_nodes(answer)}")


_NO_NODES = (
    "whose VMs have an instance status and no TPU node with a health or state to show; "
    "use `reboot`, `maintenance` or `tpujobs dev preempt [--silent]` instead"
)


@fault_app.command()
def show(state_dir: StateDir = None) -> None:
    """Print the planned errors and the no-boot budget as JSON."""
    sim = Simulator(state_dir, Console(stderr=True))
    typer.echo(json.dumps(sim.call("show the faults", sim.control.faults), indent=2))


@fault_app.command()
def clear(state_dir: StateDir = None) -> None:
    """Forget the planned errors and the no-boot budget (random errors stay as configured)."""
    sim = Simulator(state_dir, Console(stderr=True))
    sim.call("clear the faults", sim.control.clear_faults)
    sim.say("no planned errors and no hosts that never boot")
