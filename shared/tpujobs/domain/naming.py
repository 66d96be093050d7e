"""Deterministic names: the same job and attempt always give the same resource.

Deterministic names make retries safe: asking twice for `{job_id}-a{attempt}` finds the
first request (ALREADY_EXISTS) instead of buying capacity twice.
"""

from __future__ import annotations

import re

TPU_RESOURCE_ID = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
MAX_TPU_RESOURCE_ID = 63


# The letter before the attempt (or a unit's index) says the platform that holds it, so every
# part of the control plane that has only a name (the reconciler's lists, a release) can tell:
# `{job}-a{N}` and `{pool}-u{i}-g{N}` are TPU API queued resources, `{job}-c{N}` and
# `{pool}-c{i}-g{N}` Compute Engine slices (their MIGs, templates and policies).
_JOB_LETTER = {"tpu-api": "a", "compute": "c"}
_UNIT_LETTER = {"tpu-api": "u", "compute": "c"}
_JOB_NAME = re.compile(r"(?P<job>[a-z][a-z0-9-]*[a-z0-9])-(?P<letter>[ac])(?P<attempt>[1-9][0-9]{0,3})")
_UNIT_NAME = re.compile(
    r"(?P<pool>[a-z]([-a-z0-9]*[a-z0-9])?)-(?P<letter>[uc])(?P<unit>0|[1-9][0-9]{0,2})-g(?P<gen>[1-9][0-9]{0,8})"
)


def queued_resource_name(job_id: str, attempt: int, platform: str = "tpu-api") -> str:
    """What holds one attempt of a job: its queued resource (and node id prefix) on the TPU API,
    `{job_id}-a{attempt}`; its slices' MIGs (and their templates and policies) on Compute
    Engine, `{job_id}-c{attempt}`."""
    if attempt < 1:
        raise ValueError(f"attempt must be 1 or more, got {attempt}")
    name = f"{job_id}-{_JOB_LETTER[platform]}{attempt}"
    if len(name) > MAX_TPU_RESOURCE_ID or not TPU_RESOURCE_ID.fullmatch(name):
        raise ValueError(f"{name!r} is not a valid TPU resource id")
    return name


def parse_queued_resource_name(name: str) -> tuple[str, int] | None:
    """(job_id, attempt) of a name tpujobs made for a job, on either platform, or None for anyone else's."""
    match = _JOB_NAME.fullmatch(name)
    if not match:
        return None
    return match["job"], int(match["attempt"])


def unit_queued_resource_name(pool: str, index: int, generation: int, platform: str = "tpu-api") -> str:
    """What holds one warm-pool unit's `generation`-th request: `{pool}-u{i}-g{n}` on the TPU API,
    `{pool}-c{i}-g{n}` on Compute Engine. A job's names end in `-a{N}` or `-c{N}`, a unit's in
    `-g{N}`: the two never collide."""
    if index < 0 or generation < 1:
        raise ValueError(f"unit index must be 0 or more and generation 1 or more, got {index}, {generation}")
    name = f"{pool}-{_UNIT_LETTER[platform]}{index}-g{generation}"
    if len(name) > MAX_TPU_RESOURCE_ID or not TPU_RESOURCE_ID.fullmatch(name):
        raise ValueError(f"{name!r} is not a valid TPU resource id")
    return name


def parse_unit_queued_resource_name(name: str) -> tuple[str, int, int] | None:
    """(pool, unit index, generation) of a unit's holding, on either platform, or None for any other."""
    match = _UNIT_NAME.fullmatch(name)
    if not match:
        return None
    return match["pool"], int(match["unit"]), int(match["gen"])


def platform_of(holding: str) -> str:
    """The platform a holding's name says holds it: "compute" or "tpu-api" (also for a name
    tpujobs did not make: only the TPU API path ever had such names)."""
    unit = _UNIT_NAME.fullmatch(holding)
    if unit:
        return "compute" if unit["letter"] == "c" else "tpu-api"
    job = _JOB_NAME.fullmatch(holding)
    return "compute" if job and job["letter"] == "c" else "tpu-api"


def node_id(queued_resource: str, slice_index: int, slices: int) -> str:
    """The TPU node (on Compute Engine: the MIG, template and policy) of one slice: the
    holding's name, suffixed per slice in multislice."""
    return queued_resource if slices == 1 else f"{queued_resource}-{slice_index}"


# The name Google gives a TPU API VM's worker: `t1v-n-<hex>-w-<worker>` (the VM's hostname, and the
# `instance_name` of its identity token). Only the TPU API makes such names for tpujobs: a Compute
# Engine holding's VMs are its MIGs' (`{slice}-xxxx`, whose last parts are `-c{N}`/`-g{N}` and four
# characters, never `-w-{N}`), so no tpujobs VM of the other platform can pass for a TPU worker.
_TPU_VM_NAME = re.compile(r"^t1v-n-[0-9a-f]+-w-(?P<worker>0|[1-9][0-9]{0,3})$")


def host_name_refusal(holding: str, slice_index: int, slices: int, worker: int, vm_name: str) -> str | None:
    """Why the VM `vm_name` cannot be that worker of that slice of `holding`, or None. On the TPU
    API a holding's VMs are its nodes' workers, named `t1v-n-<hex>-w-<worker>`: any other name (a
    Compute Engine VM's) is no TPU worker, and another number is another worker. On Compute
    Engine a slice's VMs are its MIG's (`{slice}-xxxx`, the MIG adding four characters to its
    base name): any other name is another slice's, or no tpujobs VM at all."""
    if platform_of(holding) == "compute":
        slice_name = node_id(holding, slice_index, slices)
        if not re.fullmatch(re.escape(slice_name) + r"-[a-z0-9]{4}", vm_name):
            return f"the VM is not one of {slice_name}'s"
        return None
    named = _TPU_VM_NAME.fullmatch(vm_name)
    if named is None:
        return f"the VM is not a TPU API worker (t1v-n-…-w-N), as {holding}'s are"
    if int(named["worker"]) != worker:
        return "the VM is another worker of its node"
    return None


def exported_attempt(log_uri: str | None) -> int | None:
    """The attempt whose combined log (`.../attempt-N/attempt.log`) a log_uri names, if any."""
    match = re.search(r"/attempt-([0-9]+)/attempt\.log$", log_uri or "")
    return int(match[1]) if match else None


# The logs bucket's top-level prefixes, one per kind of object. Each kind has a lifecycle rule of
# its own (infra/storage.tf) whose `matches_prefix` is exactly one of these, so none may be a
# prefix of another: deleting old logs must never reach a checkpoint or the code of a job that
# may still resume (tests/infra/test_storage_lifecycle.py holds the rules to that).
LOGS_PREFIX = "logs/"  # output chunks and exported logs: deleted logs_retention_days after written
CHECKPOINTS_PREFIX = "checkpoints/"  # what jobs save to resume from: kept (checkpoint_retention_days, 0 = always)
CODE_PREFIX = "code/"  # tarballs the CLI uploads, by content: deleted code_retention_days after last use
STORAGE_PREFIXES = (LOGS_PREFIX, CHECKPOINTS_PREFIX, CODE_PREFIX)


def _job_path(job_id: str, service_account: str | None) -> str:
    """`jobs/{id}/`, or `accounts/{email}/jobs/{id}/` for a job on an account of its own: the
    only path under each kind's prefix that account may touch (infra/ grants it per managed
    folder), so no job of another account can read or change its objects."""
    if service_account:
        return f"accounts/{service_account}/jobs/{job_id}/"
    return f"jobs/{job_id}/"


def job_prefix(job_id: str, service_account: str | None = None) -> str:
    """Where a job's logs are (output chunks `attempt-N/chunks/...`, exported `attempt-N/*.log`):
    `logs/jobs/{id}/`, or `logs/accounts/{email}/jobs/{id}/` on an account of its own. The job's
    first `log_uri`; its checkpoints are elsewhere (`checkpoint_prefix`), out of the logs' retention."""
    return LOGS_PREFIX + _job_path(job_id, service_account)


def checkpoint_prefix(job_id: str, service_account: str | None = None) -> str:
    """Where a job saves and resumes its checkpoints (TPUJOBS_CHECKPOINT_URI):
    `checkpoints/jobs/{id}/`, or `checkpoints/accounts/{email}/jobs/{id}/`."""
    return CHECKPOINTS_PREFIX + _job_path(job_id, service_account)


def code_prefix(service_account: str | None = None) -> str:
    """Where the code of jobs on one account lies: `code/jobs/` on the default account,
    `code/accounts/{email}/` on an account of its own. Each account may read its own only
    (infra/ grants it per managed folder), so no team reads or lists another's code."""
    if service_account and not re.fullmatch(r"[a-z0-9][a-z0-9.-]*@[a-z0-9][a-z0-9.-]*", service_account):
        raise ValueError(f"a service account must be an email of [a-z0-9.-], got {service_account!r}")
    return CODE_PREFIX + ("jobs/" if not service_account else f"accounts/{service_account}/")


def code_object(sha256: str, service_account: str | None = None) -> str:
    """The object of an uploaded code tarball, named by its content under its account's prefix:
    `code/jobs/{first 16 hex}.tar.gz`, or `code/accounts/{email}/{first 16 hex}.tar.gz`."""
    if not re.fullmatch(r"[0-9a-f]{64}", sha256):
        raise ValueError(f"code digest must be 64 lower-case hex digits, got {sha256!r}")
    return f"{code_prefix(service_account)}{sha256[:16]}.tar.gz"


def code_location_refusal(code_uri: str | None, code_bucket: str, service_account: str | None) -> str | None:
    """Why a job may not take its code from `code_uri`, or None: code in the deployment's own
    bucket under `code/` must lie under the prefix of the account the job runs as, or a job
    could be pointed at another team's tarball. Code elsewhere is the owner's business (its
    bucket's IAM decides)."""
    if not code_uri or not code_bucket:
        return None
    base = f"gs://{code_bucket}/"
    if not code_uri.startswith(base) or not code_uri[len(base) :].startswith(CODE_PREFIX):
        return None
    own = code_prefix(service_account)
    name = code_uri[len(base) :]
    parts = name.split("/")
    if name.startswith(own) and ".." not in parts and "." not in parts and len(name) > len(own):
        return None
    runs_as = service_account or "the deployment's default account"
    return (
        f"code_uri {code_uri} is under {CODE_PREFIX} of the deployment's bucket but not under {base}{own}, "
        f"the code prefix of {runs_as}, which the job runs as: a job may use only its own account's code"
    )
