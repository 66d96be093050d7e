"""The startup script each TPU VM runs at boot: it writes the worker agent and its config, then runs it.

The agent (`tpujobs.agent`, standard library only) travels as a zipapp built here from the package's own
files, deterministically, compressed with bz2 and base64-encoded in a quoted heredoc; the config JSON
travels base64-encoded too, so nothing from a spec is ever parsed by the shell. A VM re-runs its startup
script at every boot, and the script writes the same files again; the agent's boot record
(`agent/boot_record.py`) keeps a second start from running the attempt twice. A warm pool's unit boots
the same way into the pool-mode agent (`render_unit_startup_script`).
"""

from __future__ import annotations

import ast
import base64
import bz2
import functools
import io
import json
import re
import shlex
import textwrap
import zipfile
from dataclasses import asdict, dataclass
from importlib import resources
from typing import Any

from tpujobs import agent
from tpujobs.domain import job_output, limits
from tpujobs.domain.job import Job
from tpujobs.domain.naming import checkpoint_prefix, job_prefix
from tpujobs.domain.secrets import secret_version_name
from tpujobs.domain.spec import POOL_NAME_PATTERN, JobSpec
from tpujobs.engine import topology
from tpujobs.engine.ports import HostBoot
from tpujobs.engine.settings import Settings

STARTUP_SCRIPT_KEY = "startup-script"  # the metadata key a TPU VM runs at every boot
AGENT_DELIMITER = "TPUJOBS_AGENT_EOF"
CONFIG_DELIMITER = "TPUJOBS_CONFIG_EOF"
DEFAULT_WORKDIR_ROOT = "/var/lib/tpujobs"
DECODE = "import base64,sys; sys.stdout.buffer.write(base64.b64decode(sys.stdin.buffer.read()))"
UNPACK = "import base64,bz2,sys; sys.stdout.buffer.write(bz2.decompress(base64.b64decode(sys.stdin.buffer.read())))"
AGENT_FILE = "agent.pyz"
ZIPAPP_PACKAGE = "tpujobs_agent"  # the agent package's name inside the zipapp
ZIPAPP_MAIN = f"import sys\nfrom {ZIPAPP_PACKAGE}.main import main\n\nsys.exit(main())\n"
FIXED_TIME = (1980, 1, 1, 0, 0, 0)  # the earliest time a zip entry can carry


@dataclass(frozen=True)
class AgentTimings:
    """How often the agent reports and ships output, and how long a stopped command may take."""

    heartbeat_seconds: float = 10  # during the attempt's first heartbeat_fast_window_seconds
    grace_seconds: float = 30  # between SIGTERM and SIGKILL when the agent stops the command itself
    chunk_seconds: float = 2
    heartbeat_sparse_seconds: float = 30  # after that window
    heartbeat_fast_window_seconds: float = 300
    peer_seconds: float = 2  # a multi-host slice's peers to worker 0, over the slice's network
    peer_timeout_seconds: float = 10  # a peer worker 0 heard and then did not hear this long is lost
    # A preempted TPU VM is switched off 30 s after its notice (Spot: ACPI soft-off, then off): the
    # command gets SIGKILL 20 s after the notice, so its last output is shipped in the 10 s left.
    preemption_grace_seconds: float = 20
    preemption_window_seconds: float = 30

    @classmethod
    def of(cls, settings: Settings) -> AgentTimings:
        """The deployment's periods (grace and chunks keep their defaults)."""
        return cls(
            heartbeat_seconds=settings.heartbeat_seconds,
            heartbeat_sparse_seconds=settings.heartbeat_sparse_seconds,
            heartbeat_fast_window_seconds=settings.heartbeat_fast_window_seconds,
            peer_seconds=settings.peer_seconds,
            peer_timeout_seconds=settings.peer_timeout_seconds,
        )

    def config(self) -> dict[str, float]:
        """The agent config's timing keys, named as the fields are (`check_timings` in agent/config.py
        fills in any missing)."""
        return asdict(self)


def agent_files() -> dict[str, bytes]:
    """{file name: bytes} of the agent package's modules as they ship (`without_docstrings`), read
    through the package itself, so it works from a checkout, an install and the deployed function
    bundle alike."""
    return {
        entry.name: without_docstrings(entry.read_bytes())
        for entry in resources.files(agent).iterdir()
        if entry.is_file() and entry.name.endswith(".py")
    }


def without_docstrings(source: bytes) -> bytes:
    """The module with every docstring emptied (a fifth of the agent's compressed bytes), its
    newlines kept so that a traceback from a host names the source's own line numbers."""
    text = source.decode("utf-8")
    starts = [0]
    for line in text.splitlines(keepends=True):
        starts.append(starts[-1] + len(line))
    spans = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            first = node.body[0] if node.body else None
            if (
                isinstance(first, ast.Expr)
                and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str)
            ):
                assert first.end_lineno is not None and first.end_col_offset is not None
                spans.append((first.lineno, first.col_offset, first.end_lineno, first.end_col_offset))
    for start_line, start_col, end_line, end_col in sorted(spans, reverse=True):
        kept = '"""' + "\n" * (end_line - start_line) + '"""' if end_line > start_line else '""'
        # Offsets are in UTF-8 bytes of their line: measured on the line's bytes.
        head = starts[start_line - 1] + len(_line(text, starts, start_line).encode()[:start_col].decode())
        tail = starts[end_line - 1] + len(_line(text, starts, end_line).encode()[:end_col].decode())
        text = text[:head] + kept + text[tail:]
    return text.encode("utf-8")


def _line(text: str, starts: list[int], number: int) -> str:
    return text[starts[number - 1] : starts[number]]


@functools.lru_cache(maxsize=1)
def agent_zipapp() -> bytes:
    """The agent as a zipapp: `__main__.py` and the package as `tpujobs_agent/`. Sorted entries,
    fixed times and modes, stored: the same source gives the same bytes (the whole is compressed
    once, for transport, by `agent_blob`). Built once per process."""
    entries = {"__main__.py": ZIPAPP_MAIN.encode("utf-8")}
    entries.update({f"{ZIPAPP_PACKAGE}/{name}": data for name, data in agent_files().items()})
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name in sorted(entries):
            info = zipfile.ZipInfo(name, FIXED_TIME)
            info.create_system = 3  # Unix, so the mode below is read as one
            info.external_attr = 0o644 << 16
            info.compress_type = zipfile.ZIP_STORED
            archive.writestr(info, entries[name])
    return buffer.getvalue()


@functools.lru_cache(maxsize=1)
def agent_blob() -> str:
    """The zipapp compressed whole (bz2 shrinks the modules together far better than a zip's
    entry-by-entry deflate) and base64-encoded in lines of 76, as the heredoc carries it."""
    return _base64_lines(bz2.compress(agent_zipapp(), 9))


def _base64_lines(data: bytes) -> str:
    return "\n".join(textwrap.wrap(base64.b64encode(data).decode("ascii"), 76))


def agent_config(job: Job, settings: Settings, timings: AgentTimings | None = None) -> dict[str, Any]:
    """What the agent on every worker host of the job's current attempt needs to know."""
    timings = timings or AgentTimings.of(settings)
    bucket = settings.logs_bucket or f"{settings.project}-tpujobs-logs"  # as Settings.from_env
    spec = job.spec
    # The only prefixes its account may touch; checkpoints apart from logs, out of their retention.
    logs = job_prefix(job.job_id, spec.service_account)
    checkpoints = checkpoint_prefix(job.job_id, spec.service_account)
    return {
        "job_id": job.job_id,
        "attempt": job.attempt,
        # Where a host trades its VM's identity token for the attempt's key (no key is in metadata).
        "key_url": settings.key_url,
        "resume": bool(job.resume_next) and job.attempt > 1,
        "command": spec.command,
        "setup": spec.setup,
        "code_uri": spec.code_uri,
        # No `env`: metadata is readable by every API viewer, so its values come with the
        # attempt's key (`attempt-key`), to the hosts alone.
        # Names only: the agent reads the values on the host, as the VM's own account.
        "secrets": secret_versions(job, settings),
        "code_sha256": spec.code_sha256,
        # The container image setup and command run in, and when to pull it (None: on the VM).
        "image": spec.image,
        "image_pull_policy": spec.pull_policy,
        # Unprivileged unless the spec asks (`container.privileged`).
        "privileged": bool(spec.container is not None and spec.container.privileged),
        "num_slices": spec.slices,
        "hosts_per_slice": spec.hosts_per_slice,
        "queued_resource": job.queued_resource,
        "checkpoint_uri": f"gs://{bucket}/{checkpoints}",
        "log_prefix": f"gs://{bucket}/{logs}attempt-{job.attempt}/",
        "project": settings.project,
        "worker_events_topic": topology.topic_name(topology.WORKER_EVENTS, settings.prefix),
        "preemption_topic": topology.topic_name(topology.PREEMPTION, settings.prefix),
        **timings.config(),
        # time_limit_at, time_limit_seconds, attempt_time_limit_seconds: the agent's own deadline.
        **limits.agent_deadlines(job),
        # Matched by the agent on its host against a failed command's last lines, never here.
        "retry_output": list(spec.retry_on.output) if spec.retry_on else [],
        # Output lines to Cloud Logging as well (None: not for this job), at most so many a second.
        "cloud_logging": cloud_logging_config(spec, settings),
    }


def cloud_logging_config(spec: JobSpec, settings: Settings) -> dict[str, Any] | None:
    """Where the agent writes the job's output lines in Cloud Logging, and how many a second at
    most; None when the job's output goes to Cloud Storage only (`job_output.wanted`)."""
    if not job_output.wanted(spec.cloud_logging, settings.cloud_logging):
        return None
    return {
        "log_name": job_output.log_name(settings.project, settings.prefix),
        "lines_per_second": settings.logging_lines_per_second,
    }


def secret_versions(job: Job, settings: Settings) -> dict[str, str]:
    """{env name: projects/P/secrets/S/versions/V} of the job's secrets, for its VMs' account.

    A short NAME lives in the namespace of the account the job's VMs run as (its
    `service_account`, else the deployment's), so that account alone may read it.
    """
    account = job.spec.service_account or settings.tpu_service_account
    return {
        name: secret_version_name(ref, settings.project, settings.prefix, account)
        for name, ref in sorted(job.spec.secrets.items())
    }


def default_workdir(job: Job) -> str:
    """Where the attempt runs on a TPU VM: /var/lib/tpujobs/{job}/attempt-{n}."""
    segment = re.sub(r"[^a-z0-9-]", "_", job.job_id) or "_"
    return f"{DEFAULT_WORKDIR_ROOT}/{segment}/attempt-{int(job.attempt)}"


def render_startup_script(job: Job, settings: Settings, *, timings: AgentTimings | None = None) -> str:
    """A bash script for every worker host of the job's current attempt: it runs the agent."""
    return _agent_script(agent_config(job, settings, timings), default_workdir(job), "config.json")


def _agent_script(config_data: dict[str, Any], workdir: str, arguments: str) -> str:
    """The script that writes the agent and its config into `workdir` (or $TPUJOBS_WORKDIR)
    and runs `python3 agent.pyz ARGUMENTS` there."""
    # Raw UTF-8, not \u escapes: non-ASCII text would otherwise grow sixfold before base64.
    config = json.dumps(config_data, sort_keys=True, ensure_ascii=False).encode("utf-8")
    return (
        "#!/bin/bash\n"
        "# Generated by tpujobs: writes the worker agent and its config, then runs the agent.\n"
        "set -euo pipefail\n"
        f"default_workdir={shlex.quote(workdir)}\n"
        'workdir="${TPUJOBS_WORKDIR:-$default_workdir}"\n'
        'mkdir -p "$workdir"\n'
        'cd "$workdir"\n'
        # Beside it, then renamed over it: an agent still running from an earlier start keeps its file.
        f"python3 -c {shlex.quote(UNPACK)} > {AGENT_FILE}.new <<'{AGENT_DELIMITER}'\n"
        f"{agent_blob()}\n"
        f"{AGENT_DELIMITER}\n"
        f"mv -f {AGENT_FILE}.new {AGENT_FILE}\n"
        f"python3 -c {shlex.quote(DECODE)} > config.json <<'{CONFIG_DELIMITER}'\n"
        f"{_base64_lines(config)}\n"
        f"{CONFIG_DELIMITER}\n"
        "chmod 600 config.json\n"
        'echo "tpujobs: starting the worker agent in $workdir"\n'
        f"exec python3 {AGENT_FILE} {arguments}\n"
    )


def host_boot(job: Job, settings: Settings, *, timings: AgentTimings | None = None) -> HostBoot:
    """How the TPU VMs of the job's current attempt boot: the account they run as (the job's
    own, else the deployment's) and their metadata, the startup script alone. No report key: an
    API viewer reads metadata, so the hosts fetch their key with the VM's identity token."""
    assert job.created_at is not None, "a stored job has a creation time"
    metadata = {STARTUP_SCRIPT_KEY: render_startup_script(job, settings, timings=timings)}
    return HostBoot(job.spec.service_account or settings.tpu_service_account, metadata)


# --- warm pools -----------------------------------------------------------------------
# A pool unit's nodes boot into the pool-mode agent (`python3 agent.pyz --pool config.json`),
# which waits on the `tpujobs-assignment` metadata entry: `{"seq": N}` when the unit is idle,
# else one attempt to run (its hosts fetch the attempt's key as any attempt's hosts do). The
# control plane writes both entries at once with UpdateNode, which replaces the whole metadata
# map (`unit_metadata`).

ASSIGNMENT_KEY = "tpujobs-assignment"
# Set on a running attempt's hosts when tpujobs stops it itself (a reclaim, an eviction): the agent
# stops the command as for a preemption notice, with its grace, and says `stopped` (agent/notices.py).
STOP_REQUEST_KEY = "tpujobs-stop"
POOL_WORKDIR = f"{DEFAULT_WORKDIR_ROOT}/pool"


def pool_agent_config(
    pool_name: str,
    unit_index: int,
    queued_resource: str,
    shape: JobSpec,
    settings: Settings,
    timings: AgentTimings | None = None,
) -> dict[str, Any]:
    """What the pool-mode agent on every host of one unit needs to know: the unit and its shape
    (`shape`: the pool's accelerator type, slices and image), where to report."""
    if not re.fullmatch(POOL_NAME_PATTERN, pool_name):
        raise ValueError(f"pool: {pool_name[:64]!r} is not a pool name (a-z, 0-9 and -, at most 40 characters)")
    if isinstance(unit_index, bool) or not isinstance(unit_index, int) or unit_index < 0:
        raise ValueError(f"unit_index: must be a whole number, 0 or more, got {unit_index!r}")
    timings = timings or AgentTimings.of(settings)
    return {
        "mode": "pool",
        "pool": pool_name,
        "unit": unit_index,
        "queued_resource": queued_resource,
        "project": settings.project,
        "num_slices": shape.slices,
        "hosts_per_slice": shape.hosts_per_slice,
        # Pulled once at boot; a job that names no image runs in this one.
        "image": shape.image,
        "image_pull_policy": shape.pull_policy,
        "worker_events_topic": topology.topic_name(topology.WORKER_EVENTS, settings.prefix),
        "preemption_topic": topology.topic_name(topology.PREEMPTION, settings.prefix),
        # The unit's own; each job's come in its assignment's config (`agent_config`).
        "heartbeat_seconds": timings.heartbeat_seconds,
        "grace_seconds": timings.grace_seconds,
        "chunk_seconds": timings.chunk_seconds,
    }


def render_unit_startup_script(
    pool_name: str,
    unit_index: int,
    queued_resource: str,
    shape: JobSpec,
    settings: Settings,
    *,
    timings: AgentTimings | None = None,
) -> str:
    """A bash script for every host of a pool unit: it runs the pool-mode agent in
    /var/lib/tpujobs/pool (or $TPUJOBS_WORKDIR), at every boot."""
    config = pool_agent_config(pool_name, unit_index, queued_resource, shape, settings, timings)
    return _agent_script(config, POOL_WORKDIR, "--pool config.json")


def assignment_text(
    job: Job,
    settings: Settings,
    seq: int,
    unit_queued_resource: str,
    *,
    timings: AgentTimings | None = None,
) -> str:
    """The `tpujobs-assignment` value that runs the job's current attempt on a unit: the config
    a normal attempt's hosts get (its `queued_resource` the unit's, so a host finds its slice
    from NODE_ID); no key, which its hosts fetch as `host_boot`'s do."""
    assert job.created_at is not None, "a stored job has a creation time"
    config = agent_config(job, settings, timings)
    config["queued_resource"] = unit_queued_resource
    assignment = {"seq": _seq(seq), "job_id": job.job_id, "attempt": job.attempt, "config": config}
    return json.dumps(assignment, sort_keys=True, ensure_ascii=False)


def idle_assignment_text(seq: int) -> str:
    """The `tpujobs-assignment` value of an idle unit: `{"seq": N}`."""
    return json.dumps({"seq": _seq(seq)})


def _seq(seq: int) -> int:
    if isinstance(seq, bool) or not isinstance(seq, int) or seq < 0:
        raise ValueError(f"seq: must be a whole number, 0 or more, got {seq!r}")
    return seq


def unit_metadata(startup_script: str, assignment: str) -> dict[str, str]:
    """tpujobs' own keys of a unit's metadata, merged into what the hosts have: both, always."""
    return {STARTUP_SCRIPT_KEY: startup_script, ASSIGNMENT_KEY: assignment}
