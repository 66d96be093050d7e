"""Settings read from the environment, once, at the edge (functions, CLI, local stack)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field

from tpujobs.domain.vm_defaults import VmDefaults

DEFAULT_PROJECT = "tpujobs-local"
DEFAULT_ZONE = "us-central2-b"


@dataclass(frozen=True)
class Settings:
    """Where tpujobs runs and what it talks to. Empty endpoints mean the real Google APIs."""

    project: str = DEFAULT_PROJECT
    default_zone: str = DEFAULT_ZONE
    prefix: str = ""
    tpu_endpoint: str = ""  # the simulator's base URL locally; empty in production
    secrets_endpoint: str = ""  # the local Secret Manager's base URL; empty: the real API
    logs_bucket: str = ""
    local_stack: bool = False  # True only in the local stack: trust X-Tpujobs-Caller
    admins: tuple[str, ...] = ()  # who may cancel anyone's job
    # ID-token audiences the `jobs` HTTP function accepts; empty: its own URL, from the request.
    api_audiences: tuple[str, ...] = ()
    # The jobs function's IAM admits only invokers, so Cloud Run checked every token that reaches
    # it: one whose signature Cloud Run removed may be trusted (tpujobs.engine.identity). infra/ sets it
    # on the jobs function alone.
    api_platform_auth: bool = False
    api_certs_url: str = ""  # Google's ID-token certificates; empty: Google's own URL
    stuck_after_seconds: float = 30.0  # the reconciler finishes QUEUED/RECOVERING work older than this
    # A queued resource waiting this long for capacity moves a job with more `zones` to the next.
    zone_wait_seconds: float = 600.0
    tpu_service_account: str = ""  # what TPU VMs run as (publish worker events, write logs)
    # The accounts infra/ made for jobs of their own (`service_account`), which the functions may act as.
    job_service_accounts: tuple[str, ...] = ()
    # The deployment's report-signing master key (a secret, from Secret Manager): each attempt's
    # key is derived from it (`tpujobs.domain.signing`). Never printed, so not in repr.
    report_key: str = field(default="", repr=False)
    # How often a host (worker 0 for a multi-host slice) reports that it is alive: every
    # heartbeat_seconds during an attempt's first heartbeat_fast_window_seconds, then every
    # heartbeat_sparse_seconds (at most half the timeout, or detection gets slower).
    heartbeat_seconds: float = 10.0
    heartbeat_sparse_seconds: float = 30.0
    heartbeat_fast_window_seconds: float = 300.0
    # A worker silent this long is lost: several missed heartbeats, never just one.
    heartbeat_timeout_seconds: float = 60.0
    # A multi-host slice's peers tell worker 0 they are alive every peer_seconds over the
    # slice's network; one it heard and then did not hear for peer_timeout_seconds is lost.
    peer_seconds: float = 2.0
    peer_timeout_seconds: float = 10.0
    # Capacity ACTIVE this long with a host whose agent never reported (counted from the first
    # host's `started`, else from the capacity becoming ACTIVE) is a lost host: never held silently.
    boot_timeout_seconds: float = 600.0
    # A node whose health is TIMEOUT or UNHEALTHY_TENSORFLOW, or whose state is RESTARTING or
    # UNKNOWN (`adapters.tpu.NODE_STATES`), often recovers: its host is lost only past this.
    unhealthy_grace_seconds: float = 300.0
    # A reconcile tick is cut into shards of at most this many active jobs of one zone, each
    # handled by its own invocation (`tpujobs.domain.shards`): the bound on one invocation's work.
    reconcile_shard_size: int = 500
    # VM options for the specs that leave them out (network, subnetwork, internal IPs, tags,
    # data disks, runtime): `domain.spec.with_deployment_defaults` fills them in at submit.
    vm_defaults: VmDefaults = field(default_factory=VmDefaults)
    # Records Firestore's TTL deletes (`expire_at`), in days: an ended job (with its timeline)
    # that long after it ended, a rejection or a dead letter that long after it was recorded.
    record_retention_days: int = 180
    rejection_retention_days: int = 30
    dead_letter_retention_days: int = 30

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        env = os.environ if environ is None else environ
        project = env.get("GOOGLE_CLOUD_PROJECT") or env.get("GCLOUD_PROJECT") or DEFAULT_PROJECT
        return cls(
            project=project,
            default_zone=env.get("TPUJOBS_DEFAULT_ZONE") or DEFAULT_ZONE,
            prefix=env.get("TPUJOBS_PREFIX", ""),
            tpu_endpoint=env.get("TPUJOBS_TPU_ENDPOINT", ""),
            secrets_endpoint=env.get("TPUJOBS_SECRETS_ENDPOINT", ""),
            logs_bucket=env.get("TPUJOBS_LOGS_BUCKET") or f"{project}-tpujobs-logs",
            local_stack=env.get("TPUJOBS_LOCAL_STACK", "") == "1",
            admins=tuple(a.strip() for a in env.get("TPUJOBS_ADMINS", "").split(",") if a.strip()),
            api_audiences=tuple(a.strip() for a in env.get("TPUJOBS_API_AUDIENCE", "").split(",") if a.strip()),
            api_platform_auth=env.get("TPUJOBS_API_PLATFORM_AUTH", "") == "1",
            api_certs_url=env.get("TPUJOBS_API_CERTS_URL", ""),
            stuck_after_seconds=float(env.get("TPUJOBS_STUCK_AFTER_SECONDS") or 30.0),
            zone_wait_seconds=float(env.get("TPUJOBS_ZONE_WAIT_SECONDS") or 600.0),
            tpu_service_account=env.get("TPUJOBS_TPU_SERVICE_ACCOUNT", ""),
            job_service_accounts=tuple(
                a.strip() for a in env.get("TPUJOBS_JOB_SERVICE_ACCOUNTS", "").split(",") if a.strip()
            ),
            report_key=env.get("TPUJOBS_REPORT_KEY", ""),
            heartbeat_seconds=float(env.get("TPUJOBS_HEARTBEAT_SECONDS") or 10.0),
            heartbeat_sparse_seconds=float(env.get("TPUJOBS_HEARTBEAT_SPARSE_SECONDS") or 30.0),
            heartbeat_fast_window_seconds=float(env.get("TPUJOBS_HEARTBEAT_FAST_WINDOW_SECONDS") or 300.0),
            heartbeat_timeout_seconds=float(env.get("TPUJOBS_HEARTBEAT_TIMEOUT_SECONDS") or 60.0),
            peer_seconds=float(env.get("TPUJOBS_PEER_SECONDS") or 2.0),
            peer_timeout_seconds=float(env.get("TPUJOBS_PEER_TIMEOUT_SECONDS") or 10.0),
            boot_timeout_seconds=float(env.get("TPUJOBS_BOOT_TIMEOUT_SECONDS") or 600.0),
            unhealthy_grace_seconds=float(env.get("TPUJOBS_UNHEALTHY_GRACE_SECONDS") or 300.0),
            reconcile_shard_size=_count("TPUJOBS_RECONCILE_SHARD_SIZE", env, 500),
            vm_defaults=vm_defaults_from_env(env),
            record_retention_days=_days("TPUJOBS_RECORD_RETENTION_DAYS", env, 180),
            rejection_retention_days=_days("TPUJOBS_REJECTION_RETENTION_DAYS", env, 30),
            dead_letter_retention_days=_days("TPUJOBS_DEAD_LETTER_RETENTION_DAYS", env, 30),
        )


def _days(name: str, env: Mapping[str, str], default: int) -> int:
    """A retention in whole days, at least 1: a record that expires at once would vanish
    before anyone could read why its job ended."""
    return _count(name, env, default, "number of days")


def _count(name: str, env: Mapping[str, str], default: int, what: str = "number") -> int:
    """A whole number, at least 1."""
    text = env.get(name, "").strip()
    if not text:
        return default
    if not text.isdigit() or int(text) < 1:
        raise ValueError(f"{name} must be a whole {what}, at least 1, got {text!r}")
    return int(text)


def _items(text: str) -> tuple[str, ...]:
    return tuple(item.strip() for item in text.split(",") if item.strip())


def _flag(name: str, text: str) -> bool | None:
    """A yes/no variable: unset or empty is no default; anything else but a yes or no is an error."""
    value = text.strip().lower()
    if not value:
        return None
    if value in ("1", "true", "yes"):
        return True
    if value in ("0", "false", "no"):
        return False
    raise ValueError(f"{name} must be true or false, got {text!r}")


def vm_defaults_from_env(env: Mapping[str, str]) -> VmDefaults:
    """The deployment's VM defaults (infra/vm_defaults.tf sets them): TPUJOBS_DEFAULT_NETWORK,
    _SUBNETWORK, _INTERNAL_IPS (true/false), _TAGS (comma list), _DATA_DISKS (comma list of
    projects/P/zones/Z/disks/D, each optionally followed by `:read-write` or `:read-only`, the
    default) and _RUNTIME_VERSION. They are validated with the spec they fill in."""
    disks = []
    for item in _items(env.get("TPUJOBS_DEFAULT_DATA_DISKS", "")):
        source, _, mode = item.partition(":")
        disks.append((source, mode or "read-only"))
    return VmDefaults(
        network=env.get("TPUJOBS_DEFAULT_NETWORK", "").strip(),
        subnetwork=env.get("TPUJOBS_DEFAULT_SUBNETWORK", "").strip(),
        internal_ips=_flag("TPUJOBS_DEFAULT_INTERNAL_IPS", env.get("TPUJOBS_DEFAULT_INTERNAL_IPS", "")),
        tags=_items(env.get("TPUJOBS_DEFAULT_TAGS", "")),
        data_disks=tuple(disks),
        runtime_version=env.get("TPUJOBS_DEFAULT_RUNTIME_VERSION", "").strip(),
    )
