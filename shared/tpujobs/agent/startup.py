"""The startup script each TPU VM runs at boot: it writes the worker agent and its config, then runs it.

Nothing from a spec is ever parsed by the shell. Every value lives in the config JSON,
which the script carries base64-encoded in a quoted heredoc and decodes with python3; the
agent's source (`worker.py`, standard library only) travels in a quoted heredoc too. The
only job values the shell sees are in the default work directory, made file-name safe and
quoted besides. The local simulator runs the same script per worker host, with
`TPUJOBS_WORKDIR`, `TPUJOBS_METADATA_URL` and the emulator hosts in its environment.

The service renders the script for the attempt it is requesting: the `Job` passed in
already carries that attempt's number, queued resource and resume flag.
"""

from __future__ import annotations

import base64
import functools
import json
import re
import shlex
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tpujobs import topology
from tpujobs.config import Settings
from tpujobs.domain import limits, signing
from tpujobs.domain.job import Job
from tpujobs.domain.naming import checkpoint_prefix, job_prefix
from tpujobs.domain.secrets import secret_version_name
from tpujobs.ports import HostBoot

STARTUP_SCRIPT_KEY = "startup-script"  # the metadata key a TPU VM runs at every boot
AGENT_DELIMITER = "TPUJOBS_AGENT_EOF"
CONFIG_DELIMITER = "TPUJOBS_CONFIG_EOF"
AGENT_SOURCE = Path(__file__).with_name("worker.py")
DEFAULT_WORKDIR_ROOT = "/var/lib/tpujobs"
DECODE = "import base64,sys; sys.stdout.buffer.write(base64.b64decode(sys.stdin.buffer.read()))"


@dataclass(frozen=True)
class AgentTimings:
    """How often the agent reports and ships output, and how long a stopped command may take."""

    heartbeat_seconds: float = 10
    grace_seconds: float = 30  # between SIGTERM and SIGKILL on preemption
    chunk_seconds: float = 2


@functools.lru_cache(maxsize=1)
def agent_source() -> str:
    """The worker agent's source, checked to be safe inside the quoted heredoc."""
    source = AGENT_SOURCE.read_text(encoding="utf-8")
    if AGENT_DELIMITER in source:
        raise RuntimeError(f"{AGENT_SOURCE} contains the heredoc delimiter {AGENT_DELIMITER}")
    return source if source.endswith("\n") else source + "\n"


def agent_config(job: Job, settings: Settings, timings: AgentTimings | None = None) -> dict[str, Any]:
    """What the agent on every worker host of the job's current attempt needs to know."""
    timings = timings or AgentTimings(heartbeat_seconds=settings.heartbeat_seconds)
    bucket = settings.logs_bucket or f"{settings.project}-tpujobs-logs"  # as Settings.from_env
    spec = job.spec
    # The only prefixes its account may touch; checkpoints apart from logs, out of their retention.
    logs = job_prefix(job.job_id, spec.service_account)
    checkpoints = checkpoint_prefix(job.job_id, spec.service_account)
    return {
        "job_id": job.job_id,
        "attempt": job.attempt,
        "resume": bool(job.resume_next) and job.attempt > 1,
        "command": spec.command,
        "setup": spec.setup,
        "code_uri": spec.code_uri,
        "env": dict(spec.env),
        # Names only: the agent reads the values on the host, as the VM's own account.
        "secrets": secret_versions(job, settings),
        "code_sha256": spec.code_sha256,
        # The container image setup and command run in, and when to pull it (None: on the VM).
        "image": spec.image,
        "image_pull_policy": spec.pull_policy,
        "num_slices": spec.slices,
        "hosts_per_slice": spec.hosts_per_slice,
        "queued_resource": job.queued_resource,
        "checkpoint_uri": f"gs://{bucket}/{checkpoints}",
        "log_prefix": f"gs://{bucket}/{logs}attempt-{job.attempt}/",
        "project": settings.project,
        "worker_events_topic": topology.topic_name(topology.WORKER_EVENTS, settings.prefix),
        "preemption_topic": topology.topic_name(topology.PREEMPTION, settings.prefix),
        "heartbeat_seconds": timings.heartbeat_seconds,
        "grace_seconds": timings.grace_seconds,
        "chunk_seconds": timings.chunk_seconds,
        # time_limit_at, time_limit_seconds, attempt_time_limit_seconds: the agent's own deadline.
        **limits.agent_deadlines(job),
        # Matched by the agent on its host against a failed command's last lines, never here.
        "retry_output": list(spec.retry_on.output) if spec.retry_on else [],
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
    # Raw UTF-8, not \u escapes: non-ASCII text would otherwise grow sixfold before base64
    # and a large accepted spec could pass GCE's 256 KiB limit on a metadata value.
    config = json.dumps(agent_config(job, settings, timings), sort_keys=True, ensure_ascii=False).encode("utf-8")
    encoded = "\n".join(textwrap.wrap(base64.b64encode(config).decode("ascii"), 76))
    return (
        "#!/bin/bash\n"
        "# Generated by tpujobs: writes the worker agent and its config, then runs the agent.\n"
        "set -euo pipefail\n"
        f"default_workdir={shlex.quote(default_workdir(job))}\n"
        'workdir="${TPUJOBS_WORKDIR:-$default_workdir}"\n'
        'mkdir -p "$workdir"\n'
        'cd "$workdir"\n'
        f"cat > agent.py <<'{AGENT_DELIMITER}'\n"
        f"{agent_source()}"
        f"{AGENT_DELIMITER}\n"
        f"python3 -c {shlex.quote(DECODE)} > config.json <<'{CONFIG_DELIMITER}'\n"
        f"{encoded}\n"
        f"{CONFIG_DELIMITER}\n"
        "chmod 600 config.json\n"
        'echo "tpujobs: starting the worker agent in $workdir"\n'
        "exec python3 agent.py config.json\n"
    )


def host_boot(job: Job, settings: Settings, *, timings: AgentTimings | None = None) -> HostBoot:
    """How the TPU VMs of the job's current attempt boot: the account they run as (the job's
    own, else the deployment's) and their metadata, the startup script and the report key.

    The key signs every report of this attempt's hosts (`tpujobs.domain.signing`); it is
    derived, never stored, and sits in its own metadata entry so that `signing.scrub` can
    cut it from any text that quotes the request (the TPU audit log).
    """
    assert job.created_at is not None, "a stored job has a creation time"
    key = signing.attempt_key(settings.report_key, job.job_id, job.created_at, job.attempt)
    metadata = {
        STARTUP_SCRIPT_KEY: render_startup_script(job, settings, timings=timings),
        signing.KEY_ATTRIBUTE: signing.key_text(key),
    }
    return HostBoot(job.spec.service_account or settings.tpu_service_account, metadata)
