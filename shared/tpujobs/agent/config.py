"""What the agent is told and who it is: the config the startup script wrote, checked with
defaults filled in; this host's worker and slice from the metadata server; the job's environment.
"""

from __future__ import annotations

import json
import re
from typing import Any

from .basics import PASSABLE_NAME, AgentError, host_variables, parse_rfc3339
from .containers import IMAGE_REFERENCE, PULL_POLICIES, default_pull_policy
from .rest import Metadata
from .slice_link import PEER_PORT

SECRET_VERSION = re.compile(r"projects/[^/\s]+/secrets/[^/\s]+/versions/[^/\s]+")
ENV_NAME = re.compile(r"[A-Z_][A-Z0-9_]*")
SHA256_HEX = re.compile(r"[0-9a-fA-F]{64}")
TPU_ENV_METADATA = "instance/attributes/tpu-env"
SLICE_ID_METADATA = "instance/attributes/tpujobs-slice-id"
DEFAULTS = {
    "heartbeat_seconds": 10,  # during an attempt's first heartbeat_fast_window_seconds on a host
    "heartbeat_sparse_seconds": 30,  # after that
    "heartbeat_fast_window_seconds": 300,
    "peer_seconds": 2,  # a peer's beat to worker 0 of its slice, over the slice's network
    "peer_timeout_seconds": 10,  # worker 0 reports a peer it heard and then did not hear this long
    "grace_seconds": 30,  # SIGTERM to SIGKILL when the agent stops the command (a time limit, a withdrawal)
    "chunk_seconds": 2,
    # A preempted VM is switched off this long after its notice (Spot: ACPI soft-off, then off
    # 30 s later). The command gets SIGKILL preemption_grace_seconds after the notice, so that
    # its last output is shipped in the rest of the window.
    "preemption_grace_seconds": 20,
    "preemption_window_seconds": 30,
}
POOL_TIMINGS = frozenset({"heartbeat_seconds", "grace_seconds", "chunk_seconds"})
REQUIRED = {  # an attempt's config: its keys and their types
    "job_id": str,
    "attempt": int,
    "resume": bool,
    "command": str,
    "num_slices": int,
    "hosts_per_slice": int,
    "queued_resource": str,
    "checkpoint_uri": str,
    "log_prefix": str,
    "project": str,
    "worker_events_topic": str,
    "preemption_topic": str,
}


# --- identity -------------------------------------------------------------------------


def parse_tpu_env(text: str) -> dict[str, str]:
    """The `tpu-env` metadata attribute (lines like `NODE_ID: 'train-1-a2-1'`) as a dict."""
    values: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        key = key.strip()
        if not sep or not key or key.startswith("#"):
            continue
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        values[key] = value
    return values


def slice_id_from_node_id(node_id: str, queued_resource: str) -> int:
    """The slice of a multislice node: the number after `{queued_resource}-` in its node id."""
    prefix = queued_resource + "-"
    if queued_resource and node_id.startswith(prefix):
        suffix = node_id[len(prefix) :]
        if re.fullmatch(r"[0-9]+", suffix):
            return int(suffix)
    match = re.search(r"-([0-9]+)$", node_id)  # a node named otherwise: its trailing number
    if match is None:
        raise AgentError(f"cannot tell the slice from NODE_ID {node_id!r}")
    return int(match.group(1))


def read_tpu_env(metadata: Metadata) -> dict[str, str]:
    """This host's `tpu-env` attribute as a dict ({} when the server has none)."""
    return parse_tpu_env(metadata.get_optional(TPU_ENV_METADATA) or "")


def megascale_environment(tpu_env: dict[str, str]) -> dict[str, str]:
    """Every MEGASCALE_* key of `tpu-env`, unchanged: what a multislice TPU VM is told about
    its slices (coordinator address, slice id, number of slices, port). Nothing is invented:
    a single slice has none, and a key the metadata lacks stays unset."""
    return {
        name: value
        for name, value in tpu_env.items()
        if name.startswith("MEGASCALE_") and PASSABLE_NAME.fullmatch(name)
    }


def discover_identity(
    metadata: Metadata, config: dict[str, Any], tpu_env: dict[str, str] | None = None
) -> tuple[int, int]:
    """(worker id, slice id) of this host, from the metadata server (and `tpu-env`, if read already)."""
    if tpu_env is None:
        tpu_env = read_tpu_env(metadata)
    number = metadata.get_optional("instance/attributes/agent-worker-number")
    if number is None:
        number = tpu_env.get("WORKER_ID")
    if number is None or not re.fullmatch(r"[0-9]+", number.strip()):
        raise AgentError(f"no worker number in the metadata (agent-worker-number: {number!r})")
    slice_id = 0
    # On Compute Engine each slice's template names its slice (`tpujobs-slice-id`); the TPU API's
    # multislice names it in each node's id.
    named = metadata.get_optional(SLICE_ID_METADATA) if int(config["num_slices"]) > 1 else None
    if named is not None and re.fullmatch(r"[0-9]{1,5}", named.strip()):
        slice_id = int(named.strip())
    elif int(config["num_slices"]) > 1:
        node_id = tpu_env.get("NODE_ID")
        if not node_id:
            raise AgentError("a multislice job but no NODE_ID in instance/attributes/tpu-env")
        slice_id = slice_id_from_node_id(node_id, str(config["queued_resource"]))
    return int(number.strip()), slice_id


# --- configuration --------------------------------------------------------------------


def attempt_deadline(config: dict[str, Any], started: float) -> tuple[float, str] | None:
    """When this attempt must stop (epoch seconds) and the limit that says so, the earliest of:
    `time_limit_at` (the whole job's, absolute), `started` + `time_limit_seconds` (the first
    attempt: its capacity was not held yet when the config was written), `started` +
    `attempt_time_limit_seconds`. None without a limit."""
    found = []
    at = config.get("time_limit_at")
    whole = parse_rfc3339(at) if at else None
    if whole is not None:
        found.append((whole, "time_limit"))
    elif config.get("time_limit_seconds"):
        found.append((started + float(config["time_limit_seconds"]), "time_limit"))
    if config.get("attempt_time_limit_seconds"):
        found.append((started + float(config["attempt_time_limit_seconds"]), "attempt_time_limit"))
    return min(found) if found else None


def read_json_object(path: str) -> dict[str, Any]:
    """A config file written by the startup script: one JSON object."""
    try:
        with open(path, encoding="utf-8") as handle:
            config = json.load(handle)
    except (OSError, ValueError) as error:
        raise AgentError(f"cannot read the config {path}: {error}") from None
    if not isinstance(config, dict):
        raise AgentError("the config is not a JSON object")
    return config


def check_required(config: dict[str, Any], required: dict[str, type]) -> None:
    """Every required key is there, with its type (a bool is no int)."""
    for key, kind in required.items():
        value = config.get(key)
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise AgentError(f"config key {key!r} must be {kind.__name__}, got {value!r}")


def check_image(config: dict[str, Any]) -> None:
    """`image` and `image_pull_policy`, checked; an image without a policy gets the default one."""
    image = config.setdefault("image", None)
    if image is not None and not (isinstance(image, str) and IMAGE_REFERENCE.fullmatch(image)):
        shown = image[:200] if isinstance(image, str) else image
        raise AgentError(f"config key 'image' must be a container image reference or null, got {shown!r}")
    policy = config.setdefault("image_pull_policy", None)
    if policy is not None and policy not in PULL_POLICIES:
        raise AgentError(f"config key 'image_pull_policy' must be one of {', '.join(PULL_POLICIES)} or null")
    if image is not None and policy is None:
        config["image_pull_policy"] = default_pull_policy(image)


def check_timings(config: dict[str, Any], pool: bool = False) -> None:
    """The DEFAULTS' periods: positive numbers, defaults filled in (a config written before
    a key existed gets its default); `peer_port` a port number. A pool unit's config has only
    POOL_TIMINGS: each job it runs brings its own."""
    for key, default in DEFAULTS.items():
        if pool and key not in POOL_TIMINGS:
            continue
        value = config.setdefault(key, default)
        zero_ok = key == "heartbeat_fast_window_seconds"  # 0: sparse from the start
        number = not isinstance(value, bool) and isinstance(value, (int, float))
        if not number or value < 0 or (value == 0 and not zero_ok):
            raise AgentError(
                f"config key {key!r} must be {'0 or more' if zero_ok else 'a positive number'}, got {value!r}"
            )
    if pool:
        return
    if config["preemption_grace_seconds"] >= config["preemption_window_seconds"]:
        raise AgentError("config key 'preemption_grace_seconds' must be less than 'preemption_window_seconds'")
    port = config.setdefault("peer_port", PEER_PORT)
    if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
        raise AgentError(f"config key 'peer_port' must be a port number, got {port!r}")


def load_config(path: str) -> dict[str, Any]:
    """The config JSON written by the startup script, checked, with defaults filled in."""
    return check_config(read_json_object(path))


def check_config(config: dict[str, Any]) -> dict[str, Any]:
    """An attempt's config (from the startup script, or a pool unit's assignment), checked,
    with defaults filled in."""
    check_required(config, REQUIRED)
    for key in ("setup", "code_uri"):
        if config.get(key) is not None and not isinstance(config[key], str):
            raise AgentError(f"config key {key!r} must be a string or null")
        config.setdefault(key, None)
    env = config.setdefault("env", {})
    if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        raise AgentError("config key 'env' must map strings to strings")
    wanted = config.setdefault("secrets", {})
    if not isinstance(wanted, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in wanted.items()):
        raise AgentError("config key 'secrets' must map env names to secret version names")
    for env_name, version in wanted.items():
        if not ENV_NAME.fullmatch(env_name) or env_name.startswith("TPUJOBS_"):
            raise AgentError(f"config key 'secrets' has a bad env name {env_name[:64]!r}")
        if not SECRET_VERSION.fullmatch(version):
            raise AgentError(
                f"config key 'secrets': {env_name} must name projects/P/secrets/S/versions/V, got {version[:200]!r}"
            )
    check_image(config)
    if not isinstance(config.setdefault("privileged", False), bool):
        raise AgentError("config key 'privileged' must be true or false")
    digest = config.setdefault("code_sha256", None)
    if digest is not None and not (isinstance(digest, str) and SHA256_HEX.fullmatch(digest)):
        raise AgentError(f"config key 'code_sha256' must be 64 hex digits or null, got {digest!r}")
    patterns = config.setdefault("retry_output", [])
    if not isinstance(patterns, list) or not all(isinstance(p, str) for p in patterns):
        raise AgentError("config key 'retry_output' must be a list of strings")
    for key in ("time_limit_seconds", "attempt_time_limit_seconds"):
        value = config.setdefault(key, None)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0):
            raise AgentError(f"config key {key!r} must be a positive number or null, got {value!r}")
    at = config.setdefault("time_limit_at", None)
    if at is not None and (not isinstance(at, str) or parse_rfc3339(at) is None):
        raise AgentError(f"config key 'time_limit_at' must be an RFC 3339 time or null, got {str(at)[:64]!r}")
    check_timings(config)
    return config


def job_environment(
    base: dict[str, str],
    config: dict[str, Any],
    worker_id: int,
    slice_id: int,
    secret_values: dict[str, str] | None = None,
    megascale: dict[str, str] | None = None,
) -> dict[str, str]:
    """The command's environment: the host's, its MEGASCALE_* values from `tpu-env`, the spec's
    env, its secrets, then TPUJOBS_ variables.

    The host's own TPUJOBS_ variables (the simulator's TPUJOBS_WORKDIR, TPUJOBS_METADATA_URL)
    are left out: the prefix is reserved, and the job sees exactly the TPUJOBS_ variables set here.
    """
    env = host_variables(base)
    env.update(megascale or {})
    env.update(config["env"])
    env.update(secret_values or {})
    env.update(
        {
            "TPUJOBS_JOB_ID": config["job_id"],
            "TPUJOBS_ATTEMPT": str(config["attempt"]),
            "TPUJOBS_RESUME": "1" if config["resume"] else "0",
            "TPUJOBS_CHECKPOINT_URI": config["checkpoint_uri"],
            "TPUJOBS_WORKER_ID": str(worker_id),
            "TPUJOBS_NUM_WORKERS": str(config["hosts_per_slice"]),
            "TPUJOBS_SLICE_ID": str(slice_id),
            "TPUJOBS_NUM_SLICES": str(config["num_slices"]),
        }
    )
    return env
