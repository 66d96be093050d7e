"""The production wiring: real clients, built lazily and once per function instance.

Nothing is built, and nothing heavy imported, at import time, so a cold start pays only for
what the invoked function uses: the service and its validation models load with the first
message, each Google client library with the first adapter that needs it, and the TPU, Compute
Engine and Pub/Sub clients only at their first call (a worker's heartbeat never loads tpu_v2).
This is the one place that picks adapters for ports: the engine's services, the reconciler, the
HTTP API, dead letters and log export get theirs passed in. Tests build the same objects
themselves, on the emulators.
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
    from tpujobs.adapters.firestore_warm_pools import FirestoreWarmPools
    from tpujobs.adapters.pubsub import Publisher
    from tpujobs.engine.api import JobsApi
    from tpujobs.engine.dead_letters import DeadLetters
    from tpujobs.engine.notifications import Notifier
    from tpujobs.engine.output_export import OutputExporter, OutputObjects
    from tpujobs.engine.ports import Clock
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
    """The adapters of the engine (the service, the reconciler, the API), shared by all three."""

    settings: Settings
    firestore: firestore.Client
    store: FirestoreJobStore
    tpu: PlatformCapacity  # the capacity port: the TPU API's queued resources and Compute Engine's slices
    publisher: Publisher  # tpujobs-status, tpujobs-log-export and the reconcile shards
    pools: FirestorePools
    access: FirestoreAccessPolicies
    warm_pools: FirestoreWarmPools


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
    from tpujobs.adapters.capacity_router import PlatformCapacity
    from tpujobs.adapters.firestore_config import FirestoreAccessPolicies
    from tpujobs.adapters.firestore_pools import FirestorePools
    from tpujobs.adapters.firestore_warm_pools import FirestoreWarmPools
    from tpujobs.adapters.pubsub import Publisher
    from tpujobs.adapters.tpu import CloudTpu, build_client

    config, client = settings(), firestore_client()
    tpu = cast(CloudTpu, OnFirstUse(lambda: CloudTpu(build_client(config.tpu_endpoint), config.project)))
    compute = cast("ComputeEngine", OnFirstUse(lambda: build_compute(config))) if compute_configured(config) else None
    return Adapters(
        config,
        client,
        job_store(),
        PlatformCapacity(tpu, compute),
        cast(Publisher, OnFirstUse(lambda: Publisher.build(config.project, config.prefix))),
        FirestorePools(client),
        FirestoreAccessPolicies(client),
        FirestoreWarmPools(client),
    )


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
    from tpujobs.engine.services import Engine

    a = adapters()
    return Engine(
        a.store,
        a.tpu,
        a.settings,
        utc_now,
        status=a.publisher,
        exports=a.publisher,
        pools=a.pools,
        access=a.access,
        warm_pools=a.warm_pools,
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
        a.tpu,
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
    (cached in the verifier), its dead letters for admins."""
    from tpujobs.adapters.firestore_dead_letters import FirestoreDeadLetters
    from tpujobs.adapters.google_id_tokens import GoogleIdTokens
    from tpujobs.adapters.job_output_logs import CloudLoggingEntries
    from tpujobs.engine.api import JobsApi

    a = adapters()
    return JobsApi(
        engine(),
        a.store,
        a.settings,
        verify_token=GoogleIdTokens(a.settings.api_certs_url),
        dead_letters=FirestoreDeadLetters(a.firestore),
        verify_vm_token=GoogleIdTokens(a.settings.vm_certs_url),
        output_entries=CloudLoggingEntries(a.settings.project, a.settings.logging_endpoint, a.settings.logging_view),
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
    """The dead-letter recorder of this process."""
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
    with its published keys (cached), output's last lines read from the logs bucket's newest chunks."""
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
    views = DashboardViews(jobs_api(), utc_now, FirestoreUsageJobs(firestore_client()), output)
    return DashboardSite(views, caller)


@functools.cache
def notifier() -> Notifier:
    """The notify function's notifier: the job store to read, Secret Manager for webhook URLs (its
    client built at the first secret target), posts pinned to public addresses (loopback locally)."""
    from tpujobs.adapters.firestore_notifications import FirestoreDeliveryRecords, FirestoreNotifyConfig
    from tpujobs.adapters.webhook_secrets import SecretManagerWebhooks
    from tpujobs.adapters.webhooks import HttpWebhookPoster
    from tpujobs.domain.notify_delivery import derived_signing_key
    from tpujobs.engine.notifications import Notifier, NotifySettings

    config = settings()
    key: bytes | None = config.notify_signing_key.encode("utf-8") or None
    if key is None and config.local_stack and config.report_key:
        key = derived_signing_key(config.report_key)
    client = firestore_client()
    return Notifier(
        job_store(),
        FirestoreNotifyConfig(client),
        cast(SecretManagerWebhooks, OnFirstUse(lambda: SecretManagerWebhooks.build(config.secrets_endpoint))),
        HttpWebhookPoster(allow_loopback=config.local_stack),
        FirestoreDeliveryRecords(client),
        NotifySettings(config.project, config.prefix, config.tpu_service_account, key, config.dashboard_url),
        utc_now,
    )
