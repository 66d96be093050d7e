"""The production wiring: real clients, built lazily and once per function instance.

Nothing is built, and nothing heavy imported, at import time, so a cold start pays only for
what the invoked function uses: the service and its validation models load with the first
message, each Google client library with the first adapter that needs it, and the TPU, Compute
Engine and Pub/Sub clients only at their first call (a worker's heartbeat never loads tpu_v2).
This is the one place that picks adapters for ports: the engine's services, the reconciler, the
HTTP API, dead letters and log export get theirs passed in. Tests build the same objects
themselves, on the emulators.

The internet-facing functions (`jobs`, and `dashboard` through it) get an engine of their own,
`api_engine`, built on no capacity at all (`capacity_handoff.NoCapacity`): it commits in Firestore
and hands capacity work to the converge function, and never builds a TPU or Compute Engine client.
`attempt_key` reads jobs and the master key, and one holding's state per key request (a key waits
for its slice to be ACTIVE): the capacity port, built at its first read, on an account that may
read capacity and change none (infra/iam.tf).
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any, Generic, TypeVar, cast

from tpujobs.engine.settings import Settings

if TYPE_CHECKING:
    from google.cloud import firestore

    from tpujobs.adapters.capacity_router import PlatformCapacity
    from tpujobs.adapters.compute import ComputeEngine
    from tpujobs.adapters.firestore_config import FirestoreAccessPolicies
    from tpujobs.adapters.firestore_pools import FirestorePools
    from tpujobs.adapters.firestore_store import FirestoreJobStore
    from tpujobs.adapters.firestore_teams import FirestoreTeams
    from tpujobs.adapters.firestore_warm_pools import FirestoreWarmPools
    from tpujobs.adapters.pubsub import Publisher
    from tpujobs.engine.api import JobsApi
    from tpujobs.engine.dead_letters import DeadLetters
    from tpujobs.engine.key_api import KeyApi
    from tpujobs.engine.notifications import Notifier
    from tpujobs.engine.output_export import OutputExporter, OutputObjects
    from tpujobs.engine.ports import Capacity, Clock
    from tpujobs.engine.reconciler import Reconciler
    from tpujobs.engine.services import Engine
    from tpujobs.runtime.dashboard_site import DashboardSite

Built = TypeVar("Built")


def utc_now() -> datetime:
    """The only clock tpujobs reads; everything below the service gets time passed in."""
    return datetime.now(timezone.utc)


class OnFirstUse(Generic[Built]):
    """Stands for an object built at its first attribute access, once, whichever thread asks.

    The engine's adapters are built together, but a handler may never call some of them: the
    TPU client's library alone takes about 0.45 s to import, and a worker's report needs it
    only when the report ends an attempt."""

    def __init__(self, build: Callable[[], Built]) -> None:
        self._build = build
        self._built: Built | None = None
        self._lock = threading.Lock()

    def built(self) -> Built:
        """The object, built now if no one asked before."""
        if self._built is None:
            with self._lock:
                if self._built is None:
                    self._built = self._build()
        return self._built

    def __getattr__(self, name: str) -> Any:
        return getattr(self.built(), name)


@dataclass(frozen=True)
class Adapters:
    """The adapters of the engine (the service, the reconciler, the API), shared by all three;
    the capacity port is `capacity()`'s, built only for the internal functions."""

    settings: Settings
    firestore: firestore.Client
    store: FirestoreJobStore
    publisher: Publisher  # tpujobs-status, tpujobs-log-export, the reconcile shards, the API's hand-offs
    pools: FirestorePools
    access: FirestoreAccessPolicies
    warm_pools: FirestoreWarmPools
    teams: FirestoreTeams  # config/teams: a job's team at submit, and `tpujobs team`


@functools.cache
def settings() -> Settings:
    """This instance's settings, read from the environment once: every message and builder shares them."""
    return Settings.from_env()


@functools.cache
def firestore_client() -> firestore.Client:
    """This instance's one Firestore client, which every Firestore adapter built here shares."""
    from google.cloud import firestore

    return firestore.Client(project=settings().project)


@functools.cache
def job_store() -> FirestoreJobStore:
    """This instance's job store, shared by the engine and the log exporter."""
    from tpujobs.adapters.firestore_store import FirestoreJobStore

    return FirestoreJobStore(
        firestore_client(), rejection_retention=timedelta(days=settings().rejection_retention_days)
    )


@functools.cache
def adapters() -> Adapters:
    """This process's adapters, on clients configured from the environment."""
    from tpujobs.adapters.firestore_config import FirestoreAccessPolicies
    from tpujobs.adapters.firestore_pools import FirestorePools
    from tpujobs.adapters.firestore_teams import FirestoreTeams
    from tpujobs.adapters.firestore_warm_pools import FirestoreWarmPools
    from tpujobs.adapters.pubsub import Publisher
    from tpujobs.runtime import metrics

    metrics.recorder(settings(), utc_now)  # the engine's metric events go to Cloud Monitoring from here on
    config, client = settings(), firestore_client()
    return Adapters(
        config,
        client,
        job_store(),
        cast(Publisher, OnFirstUse(lambda: Publisher.build(config.project, config.prefix))),
        FirestorePools(client),
        FirestoreAccessPolicies(client),
        FirestoreWarmPools(client),
        FirestoreTeams(client),
    )


@functools.cache
def capacity() -> PlatformCapacity:
    """The capacity port of the internal functions: the TPU API's queued resources and Compute
    Engine's slices, each client built at its first call. The jobs API never builds it."""
    from tpujobs.adapters.capacity_router import PlatformCapacity
    from tpujobs.adapters.tpu import CloudTpu, build_client

    config = settings()
    tpu = cast(CloudTpu, OnFirstUse(lambda: CloudTpu(build_client(config.tpu_endpoint), config.project)))
    compute = cast("ComputeEngine", OnFirstUse(lambda: build_compute(config))) if compute_configured(config) else None
    return PlatformCapacity(tpu, compute)


def compute_configured(config: Settings) -> bool:
    """Whether this deployment has Compute Engine: always against Google's APIs (infra/ enables
    it), and locally only with its simulator (`compute_endpoint`): a local stack without one
    must not list the real API every tick."""
    return bool(config.compute_endpoint) or not config.tpu_endpoint


def build_compute(config: Settings) -> ComputeEngine:
    """The Compute Engine adapter on clients for `compute_endpoint` (empty: the real API)."""
    from tpujobs.adapters.compute import ComputeEngine, build_clients
    from tpujobs.adapters.compute_requests import Images

    images = Images.from_settings(config.compute_image_project, config.compute_image_families)
    return ComputeEngine(build_clients(config.compute_endpoint), config.project, images)


@functools.cache
def engine() -> Engine:
    """The Engine of this process: every use case's service, each on the adapters it uses;
    building it creates no client (the adapters build theirs at first use)."""
    return _engine_on(capacity(), handoff=False)


@functools.cache
def api_engine() -> Engine:
    """The engine of the internet-facing functions: the same services on no capacity. What a user
    asks is committed in Firestore, and its capacity work handed to the converge function
    (tpujobs-converge, a job's id or a pool's name only), whose own engine converges it."""
    from tpujobs.engine.capacity_handoff import NoCapacity

    return _engine_on(NoCapacity(), handoff=True)


def _engine_on(capacity: Capacity, handoff: bool) -> Engine:
    """Every use case's service on this process's adapters and `capacity`; with `handoff`, capacity
    work goes to the converge function instead."""
    from tpujobs.adapters.firestore_budgets import FirestoreBudgetTally
    from tpujobs.engine.budgets import TeamBudgets
    from tpujobs.engine.services import Engine

    a = adapters()
    return Engine(
        a.store,
        capacity,
        a.settings,
        utc_now,
        status=a.publisher,
        exports=a.publisher,
        pools=a.pools,
        access=a.access,
        warm_pools=a.warm_pools,
        handoff=a.publisher if handoff else None,
        teams=a.teams,
        budgets=TeamBudgets(FirestoreBudgetTally(a.firestore), utc_now),
    )


@functools.cache
def reconciler() -> Reconciler:
    """The Reconciler of this process: it repairs through the engine's services, on the same
    ports; its tick publishes its shards on tpujobs-reconcile, each for an invocation of its own."""
    from tpujobs.engine.reconciler import Reconciler

    a = adapters()
    jobs = engine()
    return Reconciler(
        jobs,
        a.store,
        jobs.capacity,
        a.settings,
        utc_now,
        pools=a.pools,
        exports=a.publisher,
        status=a.publisher,
        shards=a.publisher,
        warm=jobs.warm,
        warm_pools=a.warm_pools,
    )


@functools.cache
def jobs_api() -> JobsApi:
    """The `jobs` HTTP API of this process: its ID tokens checked with Google's certificates
    (cached in the verifier), its dead letters for admins; on `api_engine`, which holds no capacity."""
    from tpujobs.adapters.firestore_dead_letters import FirestoreDeadLetters
    from tpujobs.adapters.firestore_prices import FirestorePrices
    from tpujobs.adapters.firestore_usage import FirestoreUsageJobs
    from tpujobs.adapters.google_id_tokens import GoogleIdTokens
    from tpujobs.adapters.job_output_logs import CloudLoggingEntries
    from tpujobs.engine.api import JobsApi
    from tpujobs.engine.usage_report import MonthlyUsage

    a = adapters()
    return JobsApi(
        api_engine(),
        a.store,
        a.settings,
        verify_token=GoogleIdTokens(a.settings.api_certs_url),
        dead_letters=FirestoreDeadLetters(a.firestore),
        output_entries=CloudLoggingEntries(a.settings.project, a.settings.logging_endpoint, a.settings.logging_view),
        usage=MonthlyUsage(FirestoreUsageJobs(a.firestore), FirestorePrices(a.firestore), utc_now),
    )


@functools.cache
def key_api() -> KeyApi:
    """The `attempt_key` function of this process: the job store (jobs, and the key holders it
    records), the master key, and the capacity port to read whether an attempt's holding is
    ACTIVE (built at its first read; the function's account may only read); VM identity tokens
    checked with Google's certificates (the simulator's, locally), the caller's with the API's."""
    from tpujobs.adapters.google_id_tokens import GoogleIdTokens
    from tpujobs.engine.key_api import KeyApi

    config = settings()
    return KeyApi(
        job_store(),
        config,
        utc_now,
        verify_vm_token=GoogleIdTokens(config.vm_certs_url),
        verify_token=GoogleIdTokens(config.api_certs_url),
        holdings=cast("PlatformCapacity", OnFirstUse(capacity)),
    )


def build_dead_letters(settings: Settings, clock: Clock, client: firestore.Client | None = None) -> DeadLetters:
    """DeadLetters on real clients (the emulators when their variables are set): Firestore now
    (`client`, else a new one), the Pub/Sub republisher on the first replay (the function never replays)."""
    from tpujobs.adapters.firestore_dead_letters import FirestoreDeadLetters
    from tpujobs.adapters.pubsub_republisher import PubsubRepublisher
    from tpujobs.engine.dead_letters import DeadLetters

    if client is None:
        from google.cloud import firestore

        client = firestore.Client(project=settings.project)
    return DeadLetters(
        FirestoreDeadLetters(client, timedelta(days=settings.dead_letter_retention_days)),
        settings,
        clock,
        publisher=lambda: PubsubRepublisher.build(settings.project, settings.prefix),
    )


@functools.cache
def dead_letters() -> DeadLetters:
    """The dead-letter recorder of this process; its metric events go to Cloud Monitoring."""
    from tpujobs.runtime import metrics

    metrics.recorder(settings(), utc_now)
    return build_dead_letters(settings(), utc_now, firestore_client())


def build_log_objects(settings: Settings) -> OutputObjects:
    """The logs bucket (`settings.logs_bucket`) on a Storage client from the environment."""
    from tpujobs.adapters.output_bucket import GcsOutputBucket
    from tpujobs.adapters.storage import build_client
    from tpujobs.engine.output_export import OutputObjects

    return OutputObjects(GcsOutputBucket(build_client(settings.project), settings.logs_bucket))


@functools.cache
def output_exporter() -> OutputExporter:
    """The log exporter of this process, on its logs bucket and job store."""
    from tpujobs.engine.output_export import OutputExporter

    return OutputExporter(build_log_objects(settings()), job_store(), utc_now)


@functools.cache
def dashboard() -> DashboardSite:
    """The web dashboard of this process: the jobs API's rules and store, IAP's header checked
    with its published keys (cached), output's last lines read from the logs bucket's newest chunks,
    the teams' months from their budget tallies."""
    from tpujobs.adapters.firestore_budgets import FirestoreBudgetTally
    from tpujobs.adapters.firestore_usage import FirestoreUsageJobs
    from tpujobs.adapters.iap_tokens import IapTokens
    from tpujobs.engine.dashboard.caller import DashboardCaller
    from tpujobs.engine.dashboard.output_tail import RecentOutput
    from tpujobs.engine.dashboard.views import DashboardViews
    from tpujobs.runtime.dashboard_site import DashboardSite

    config = settings()
    caller = DashboardCaller(
        IapTokens(config.dashboard_certs_url),
        config.dashboard_iap_audience,
        local_stack=config.local_stack,
        local_user=config.dashboard_local_user,
    )
    output = RecentOutput(build_log_objects(config).bucket, utc_now)
    client = firestore_client()
    views = DashboardViews(jobs_api(), utc_now, FirestoreUsageJobs(client), output, FirestoreBudgetTally(client))
    return DashboardSite(views, caller)


@functools.cache
def notifier() -> Notifier:
    """The notify function's notifier: the job records to read (the one part of the job store it
    uses), Secret Manager for webhook URLs (its client built at the first secret target), posts
    pinned to public addresses (loopback locally)."""
    from tpujobs.adapters.firestore_budgets import FirestoreBudgetTally
    from tpujobs.adapters.firestore_notifications import FirestoreDeliveryRecords, FirestoreNotifyConfig
    from tpujobs.adapters.firestore_teams import FirestoreTeams
    from tpujobs.adapters.webhook_secrets import SecretManagerWebhooks
    from tpujobs.adapters.webhooks import HttpWebhookPoster
    from tpujobs.engine.budget_notices import WebhookBudgetNotices
    from tpujobs.engine.budgets import TeamBudgets
    from tpujobs.engine.notifications import Notifier, NotifySettings, notify_keys

    config = settings()
    keys = notify_keys(config)
    client = firestore_client()
    notify_config = FirestoreNotifyConfig(client)
    secrets = cast(SecretManagerWebhooks, OnFirstUse(lambda: SecretManagerWebhooks.build(config.secrets_endpoint)))
    poster = HttpWebhookPoster(allow_loopback=config.local_stack)
    notify_settings = NotifySettings(
        config.project, config.prefix, config.tpu_service_account, keys, config.dashboard_url
    )
    # An attempt's end reaches this function as a status change: its chip-hours go to its team's month here.
    budgets = TeamBudgets(
        FirestoreBudgetTally(client), utc_now, WebhookBudgetNotices(secrets, poster, notify_settings, utc_now),
        notify_config, config.admins, teams=FirestoreTeams(client),
    )  # fmt: skip
    return Notifier(
        job_store().job_records, notify_config, secrets, poster, FirestoreDeliveryRecords(client), notify_settings,
        utc_now, budgets=budgets,
    )  # fmt: skip
