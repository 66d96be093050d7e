"""Firestore round trips of one submission, counted on the real client's gRPC channel.

A burst of 1,000 submissions is 1,000 times this count against one Firestore, so each
round trip a submission needs is worth knowing and each one it does not need is worth
removing. The engine is wired as `runtime.instances.engine()` wires it (status and export
publisher, admission pools, access policies, warm pools), on the Firestore and Pub/Sub
emulators and the TPU simulator; only the channel under the Firestore client is wrapped,
by a gRPC interceptor that notes each call's method and lets it through.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import pytest
from google.cloud import firestore

from tpujobs.adapters.firestore_config import FirestoreAccessPolicies
from tpujobs.adapters.firestore_pools import FirestorePools
from tpujobs.adapters.firestore_store import FirestoreJobStore
from tpujobs.adapters.firestore_warm_pools import FirestoreWarmPools
from tpujobs.adapters.pubsub import Publisher
from tpujobs.adapters.tpu import CloudTpu
from tpujobs.domain.states import JobState
from tpujobs.engine.services import Engine
from tpujobs.engine.topology import STATUS, SUBMIT
from tpujobs.local.testing import inbound, local_settings
from tpujobs.runtime.instances import utc_now

pytestmark = pytest.mark.emulator

ZONE = "us-central2-b"

# The most Firestore calls one fresh submission (no quota on its pool) may make, by gRPC
# method (the Python client reads even one document with BatchGetDocuments): the access
# policies (three documents in one call) and the quotas (one document, read once for the
# size check and admission alike); the job and its QUEUED event (one Commit), QUEUED marked
# announced (one Commit), the ADMITTED compare-and-set (one Commit: no read, since the
# create's update time is its precondition), PROVISIONING marked announced (one Commit).
# Before issue 17 it was 8 (4 reads, 4 commits): the quotas were read twice, and the
# ADMITTED compare-and-set read the job it had just created.
MOST_CALLS = {"BatchGetDocuments": 2, "Commit": 4}
MOST_ROUND_TRIPS = sum(MOST_CALLS.values())


class CallCounter(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor):
    """Notes the method of every call made on the channel it wraps, and makes the call."""

    def __init__(self) -> None:
        self.calls: collections.Counter[str] = collections.Counter()

    def _note(self, details: grpc.ClientCallDetails) -> None:
        self.calls[details.method.rsplit("/", 1)[-1]] += 1

    def intercept_unary_unary(self, continuation: Callable[..., Any], details: grpc.ClientCallDetails, request: Any):
        self._note(details)
        return continuation(details, request)

    def intercept_unary_stream(self, continuation: Callable[..., Any], details: grpc.ClientCallDetails, request: Any):
        self._note(details)
        return continuation(details, request)


class CountedClient(firestore.Client):
    """The real Firestore client, on the real emulator channel wrapped by a CallCounter."""

    def __init__(self, counter: CallCounter, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._counter = counter

    def _emulator_channel(self, transport: Any) -> grpc.Channel:
        return grpc.intercept_channel(super()._emulator_channel(transport), self._counter)


@pytest.fixture
def counter() -> CallCounter:
    return CallCounter()


@pytest.fixture
def service(counter, project_id, tpu_client, simulator_url) -> Iterator[Engine]:
    """An Engine wired like runtime.instances.engine(), on the counted client."""
    from google.cloud import pubsub_v1

    pubsub_v1.PublisherClient().create_topic(name=f"projects/{project_id}/topics/{STATUS}")
    client = CountedClient(counter, project=project_id)
    publisher = Publisher.build(project_id)
    settings = local_settings(project=project_id, default_zone=ZONE, tpu_endpoint=simulator_url, logs_bucket="logs")
    yield Engine(
        FirestoreJobStore(client),
        CloudTpu(tpu_client, project_id),
        settings,
        utc_now,
        lambda seconds: None,
        status=publisher,
        exports=publisher,
        pools=FirestorePools(client),
        access=FirestoreAccessPolicies(client),
        warm_pools=FirestoreWarmPools(client),
    )


def a_spec(job_id: str) -> dict[str, Any]:
    return {"job_id": job_id, "name": "burst", "owner": "ada@example.com", "accelerator_type": "v4-8", "command": "x"}


def test_a_submission_reaches_provisioning_within_its_round_trip_budget(service, counter):
    """A fresh submission becomes PROVISIONING, announced twice, in at most MOST_CALLS Firestore calls."""
    counter.calls.clear()
    outcome = service.submission.submit(inbound(SUBMIT, a_spec("burst-1")))
    calls = dict(counter.calls)
    assert outcome.kind == "provisioning", outcome
    for method, most in MOST_CALLS.items():
        assert calls.get(method, 0) <= most, calls
    assert set(calls) <= set(MOST_CALLS), calls  # no query, no transaction on the way
    assert sum(calls.values()) <= MOST_ROUND_TRIPS, calls
    job = service.store.get("burst-1")
    assert job is not None and job.state is JobState.PROVISIONING
    events = service.store.events("burst-1")
    assert [e.to_state for e in events] == [JobState.QUEUED, JobState.PROVISIONING]
    assert service.store.unannounced_events(utc_now()) == []  # both announced and marked


def test_a_redelivered_submission_changes_nothing_and_stays_cheap(service, counter):
    """Redelivering a submission that reached PROVISIONING writes nothing and reads little."""
    message = inbound(SUBMIT, a_spec("burst-2"))
    assert service.submission.submit(message).kind == "provisioning"
    counter.calls.clear()
    again = service.submission.submit(message)
    calls = dict(counter.calls)
    assert again.kind == "duplicate", again
    assert calls.get("Commit", 0) == 1, calls  # the create that finds the job there, and nothing else
    assert sum(calls.values()) <= MOST_ROUND_TRIPS, calls
    assert len(service.store.events("burst-2")) == 2
