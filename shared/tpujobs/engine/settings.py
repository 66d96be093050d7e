"""What tpujobs runs with: one frozen dataclass, each field with its type, default and why.

`Settings.from_env` reads each field from the variable TPUJOBS_<FIELD> (tpujobs.engine.settings_env
names the exceptions); the edge (functions, CLI, local stack) reads them once and passes them in.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from tpujobs.domain.vm_defaults import VmDefaults

if TYPE_CHECKING:
    from tpujobs.domain.signing import MasterKeys

DEFAULT_PROJECT = "tpujobs-local"
DEFAULT_ZONE = "us-central2-b"


@dataclass(frozen=True)
class Settings:
    """Where tpujobs runs and what it talks to. Empty endpoints mean the real Google APIs."""

    project: str = DEFAULT_PROJECT  # GOOGLE_CLOUD_PROJECT (or GCLOUD_PROJECT), as Google's tools set it
    # The project's number: Google may name the project by it in a resource path (an audit entry's
    # resourceName); empty: only the id is taken (engine.jobs.audit_entries).
    project_number: str = ""
    default_zone: str = DEFAULT_ZONE
    prefix: str = ""
    tpu_endpoint: str = ""  # the simulator's base URL locally; empty in production
    compute_endpoint: str = ""  # Compute Engine's: the simulator's base URL locally; empty in production
    # The generations that Compute Engine and the TPU API both serve (v5p, v6e) and that run on
    # Compute Engine when a spec names no platform; the others go where they must (domain.platforms).
    compute_by_default: tuple[str, ...] = ()
    # The boot images of Compute Engine TPU VMs: the image project, and `generation=family` for
    # the generations whose family is not the one domain.platforms names.
    compute_image_project: str = "ubuntu-os-accelerator-images"
    compute_image_families: tuple[str, ...] = ()
    secrets_endpoint: str = ""  # the local Secret Manager's base URL; empty: the real API
    logs_bucket: str = ""  # from_env: empty reads as "<project>-tpujobs-logs", the bucket infra/ makes
    local_stack: bool = False  # True only in the local stack: trust X-Tpujobs-Caller
    admins: tuple[str, ...] = ()  # who may cancel anyone's job
    # ID-token audiences the `jobs` HTTP function accepts; empty: its own URL, from the request.
    api_audiences: tuple[str, ...] = ()  # TPUJOBS_API_AUDIENCE, a comma list like every tuple here
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
    # Its version in Secret Manager, named by every signature; the previous version (and its secret)
    # still verifies while a rotation completes (docs/security.md#rotating-the-master-key).
    report_key_version: str = "1"
    report_key_previous: str = field(default="", repr=False)
    report_key_previous_version: str = ""
    # The notify master key (a secret, from Secret Manager, mounted into the notify and jobs
    # functions): each team's signing key is derived from it (`domain.notify_delivery.NotifyKeys`).
    # The local stack derives one from report_key. Its version is named by every post; the
    # previous version signs beside it while a rotation lasts (docs/operations.md, "Notifications").
    notify_signing_key: str = field(default="", repr=False)
    notify_signing_key_version: str = "1"
    notify_signing_key_previous: str = field(default="", repr=False)
    notify_signing_key_previous_version: str = ""
    # The dashboard's base URL, for the link in a notification (`{url}/jobs/{id}`); empty: no link.
    dashboard_url: str = ""
    # Where a host trades its VM's identity token for its attempt's key: the jobs function's URL,
    # also the token's audience (`engine.attempt_keys`). infra/ and the local stack set it.
    key_url: str = ""
    # The certificates that sign VM identity tokens; empty: Google's. The local stack's simulator
    # serves its own.
    vm_certs_url: str = ""
    # The web dashboard (`dashboard` function): the audience of IAP's signed header in front of it
    # (`/projects/NUMBER/locations/REGION/services/NAME`, infra/dashboard.tf), and where IAP's
    # public keys are (empty: Google's). In the local stack only, the user every page is shown to.
    dashboard_iap_audience: str = ""
    dashboard_certs_url: str = ""
    dashboard_local_user: str = ""
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
    # A job with `on_maintenance: checkpoint-and-move` leaves its hosts this long before the
    # earliest maintenance window Google announced for them: time to save and to find capacity.
    maintenance_lead_seconds: float = 600.0
    # Whole numbers (this and the retentions) are counts, at least 1: from_env refuses 0.
    # A reconcile tick is cut into shards of at most this many active jobs of one zone, each
    # handled by its own invocation (`tpujobs.domain.shards`): the bound on one invocation's work.
    reconcile_shard_size: int = 500
    # The most shards of a tick in flight at once: the reconcile function's requests at once
    # (max instances x concurrency) less one kept for the tick itself. infra/ sets it from the
    # numbers the function scales by; more shards wait in lanes (`tpujobs.domain.shards.lanes`)
    # rather than in Cloud Run's queue, which fails them (429) after a few seconds.
    reconcile_shards_in_flight: int = 19
    # How often the scheduler ticks (infra/'s reconcile_schedule): a lane still running when its
    # tick is this old hands nothing on, as the newer tick's shards cover the same jobs.
    reconcile_tick_seconds: float = 60.0
    # VM options for the specs that leave them out (network, subnetwork, internal IPs, tags,
    # data disks, runtime): `domain.spec.with_deployment_defaults` fills them in at submit.
    # Read from TPUJOBS_DEFAULT_<FIELD>; data disks as `source[:read-write|:read-only]`.
    vm_defaults: VmDefaults = field(default_factory=VmDefaults)
    # Records Firestore's TTL deletes (`expire_at`), in days: an ended job (with its timeline)
    # that long after it ended, a rejection or a dead letter that long after it was recorded.
    record_retention_days: int = 180
    rejection_retention_days: int = 30
    dead_letter_retention_days: int = 30
    # Job output to Cloud Logging (TPUJOBS_CLOUD_LOGGING): each job's unless its spec says
    # `cloud_logging: false`; at most logging_lines_per_second lines a second per host, the rest
    # counted. logging_endpoint: the local stand-in's base URL; empty: Google's. logging_view: the
    # log view the jobs API reads job output through (infra/job_output.tf); empty: the project.
    cloud_logging: bool = False
    logging_lines_per_second: int = 200
    logging_endpoint: str = ""
    logging_view: str = ""
    # Metrics go to Cloud Monitoring (engine.metrics). monitoring_endpoint: the local stand-in's
    # HOST:PORT; empty: Google's. function_account: the account this function runs as, set by the
    # local stack only, whose `simulated:` token the stand-ins know callers by (production's
    # clients use the instance's credentials).
    monitoring_endpoint: str = ""
    function_account: str = ""

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        """The settings the environment (or `environ`) sets; a bad value is a ValueError naming its
        variable. pydantic-settings reads them (tpujobs.engine.settings_env), imported only here, so
        importing functions/main.py loads no pydantic."""
        from tpujobs.engine.settings_env import read

        return read(cls, os.environ if environ is None else environ)

    def master_keys(self) -> MasterKeys:
        """The report-signing master keys: the current version, and the previous while a rotation runs."""
        from tpujobs.domain.signing import MasterKeys  # not at import: it loads the job model

        return MasterKeys.of(
            self.report_key, self.report_key_version, self.report_key_previous, self.report_key_previous_version
        )
