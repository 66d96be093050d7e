"""The production wiring: real clients, built lazily and once per function instance.

Nothing is built at import time, so a cold start pays only for what the invoked
function uses. Tests build `JobService` themselves with their own clients.
"""

from __future__ import annotations

import functools
from datetime import datetime, timezone
from typing import TYPE_CHECKING

from tpujobs.config import Settings
from tpujobs.service import JobService

if TYPE_CHECKING:
    from tpujobs.dead_letters import DeadLetters
    from tpujobs.logs_export import LogExporter
    from tpujobs.reconciler import Reconciler


def utc_now() -> datetime:
    """The only clock tpujobs reads; everything below the service gets time passed in."""
    return datetime.now(timezone.utc)


@functools.cache
def job_service() -> JobService:
    """The JobService of this process, on clients configured from the environment."""
    from google.cloud import firestore

    from tpujobs.adapters.firestore_config import FirestoreAccessPolicies
    from tpujobs.adapters.firestore_pools import FirestorePools
    from tpujobs.adapters.firestore_store import FirestoreJobStore
    from tpujobs.adapters.pubsub import Publisher
    from tpujobs.adapters.tpu import CloudTpu, build_client

    settings = Settings.from_env()
    client = firestore.Client(project=settings.project)
    tpu = CloudTpu(build_client(settings.tpu_endpoint), settings.project)
    publisher = Publisher.build(settings.project, settings.prefix)
    return JobService(
        FirestoreJobStore(client),
        tpu,
        settings,
        utc_now,
        status=publisher,
        exports=publisher,
        pools=FirestorePools(client),
        access=FirestoreAccessPolicies(client),
    )


@functools.cache
def reconciler() -> Reconciler:
    """The Reconciler of this process, on the same service as the event handlers."""
    from tpujobs.reconciler import Reconciler

    return Reconciler(job_service())


@functools.cache
def dead_letters() -> DeadLetters:
    """The dead-letter recorder of this process, on a Firestore client from the environment."""
    from tpujobs import dead_letters as module

    return module.build(Settings.from_env(), utc_now)


@functools.cache
def log_exporter() -> LogExporter:
    """The log exporter of this process, on Storage and Firestore clients from the environment."""
    from tpujobs import logs_export

    return logs_export.build(Settings.from_env(), utc_now)
