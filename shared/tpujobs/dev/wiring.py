"""Create in the emulators what production gets from Terraform: topics, push subscriptions, bucket.

The table is `tpujobs.topology`: every topic exists, and every cloudevent route gets a push
subscription whose endpoint is its function's local URL, so the Pub/Sub emulator delivers the
same push envelope Eventarc does and functions-framework turns it into a CloudEvent. Every
step is idempotent, so `tpujobs dev up` can run against emulators that already hold them,
and re-wiring brings an existing subscription's endpoint and policies up to date.

Every push subscription retries a failed delivery with exponential backoff and, after
MAX_DELIVERY_ATTEMPTS, hands the message to the dead-letter topic, where `record_dead_letter`
keeps it (`tpujobs.dead_letters`). The dead-letter topic's own subscription retries but never
dead-letters: it would dead-letter into itself.

What the Pub/Sub emulator (gcloud 528) really does, measured: with a retry policy the second
delivery comes ~1 s after the first whatever the minimum, later ones after roughly
max(minimum, ~3 s), growing with larger minimums (10 s gave gaps of 1, 17, 18, 20 s); the
message is dead-lettered when the next delivery would be due, so with a 1 s minimum a poison
message reaches the dead-letter topic ~13 s after it was published (~5 s without a retry
policy). The dead-lettered copy has a new message id, the original data and attributes, and
CloudPubSubDeadLetterSourceDeliveryCount, ...SourceSubscription (the short name),
...SourceSubscriptionProject and ...SourceTopicPublishTime, as the real service adds.

Clients are built inside the functions, against the addresses given, never from the process
environment: the caller says which emulator it means.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING

from tpujobs import topology

if TYPE_CHECKING:
    from google.cloud import storage
    from google.pubsub_v1 import PublisherClient, RetryPolicy, SubscriberClient, Subscription

ACK_DEADLINE_S = 20
MAX_DELIVERY_ATTEMPTS = 5  # then the message goes to the dead-letter topic, as in production

# Pub/Sub waits between the minimum and the maximum before redelivering a failed push, doubling
# each time. Handlers raise only for transient trouble (Firestore or the TPU API briefly
# unavailable), so in production the 5 attempts should span a few minutes of such trouble:
# 10 s, 20 s, 40 s, 60 s. Locally a poison message should reach the dead letters while you
# watch (and the end-to-end test stays short): the emulator's own floor is ~1-3 s anyway.
PRODUCTION_MINIMUM_BACKOFF_S = 10.0
LOCAL_MINIMUM_BACKOFF_S = 1.0
MAXIMUM_BACKOFF_S = 60.0  # a recovered dependency is noticed within a minute

# The fields `wire_pubsub` owns on a subscription, as update_subscription's field mask names them.
_MANAGED_FIELDS = ("push_config", "ack_deadline_seconds", "dead_letter_policy", "retry_policy")


@dataclass(frozen=True)
class Wiring:
    """What exists after `wire_pubsub`: full resource names."""

    topics: tuple[str, ...]
    subscriptions: Mapping[str, str]  # subscription path -> push endpoint


def publisher_client(emulator_host: str) -> PublisherClient:
    """An admin Publisher client for the Pub/Sub emulator at host:port (plain gRPC, no auth)."""
    import grpc
    from google.pubsub_v1 import PublisherClient
    from google.pubsub_v1.services.publisher.transports import PublisherGrpcTransport

    channel = grpc.insecure_channel(emulator_host)
    return PublisherClient(transport=PublisherGrpcTransport(channel=channel))


def subscriber_client(emulator_host: str) -> SubscriberClient:
    """An admin Subscriber client for the Pub/Sub emulator at host:port (plain gRPC, no auth)."""
    import grpc
    from google.pubsub_v1 import SubscriberClient
    from google.pubsub_v1.services.subscriber.transports import SubscriberGrpcTransport

    channel = grpc.insecure_channel(emulator_host)
    return SubscriberClient(transport=SubscriberGrpcTransport(channel=channel))


def storage_client(emulator_url: str, project: str) -> storage.Client:
    """A google-cloud-storage client for the storage emulator at http://host:port."""
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage

    return storage.Client(
        project=project,
        credentials=AnonymousCredentials(),
        client_options={"api_endpoint": emulator_url},
    )


def wire_pubsub(
    emulator_host: str,
    project: str,
    prefix: str,
    function_urls: Mapping[str, str],
    *,
    ack_deadline_s: int = ACK_DEADLINE_S,
    minimum_backoff_s: float = LOCAL_MINIMUM_BACKOFF_S,
) -> Wiring:
    """Every topic of the contract, and a push subscription per cloudevent route.

    `function_urls` maps a route's target to its URL. Existing topics and subscriptions are
    kept; a subscription whose endpoint (a function on a new port) or policies differ from
    the wanted ones is updated in place, and one that already matches is left untouched.
    """
    from google.api_core.exceptions import AlreadyExists

    publisher = publisher_client(emulator_host)
    subscriber = subscriber_client(emulator_host)
    try:
        topics = []
        for base in topology.ALL_TOPICS:
            path = publisher.topic_path(project, topology.topic_name(base, prefix))
            with contextlib.suppress(AlreadyExists):
                publisher.create_topic(name=path)
            topics.append(path)

        dead_letter = publisher.topic_path(
            project, topology.topic_name(topology.DEAD_LETTER, prefix)
        )
        subscriptions: dict[str, str] = {}
        for route in topology.FUNCTIONS:
            if route.signature != "cloudevent" or route.topic is None:
                continue
            topic = topology.topic_name(route.topic, prefix)
            endpoint = push_endpoint(function_urls[route.target], project, topic)
            wanted = push_subscription(
                subscriber.subscription_path(project, topology.push_subscription_name(route, prefix)),
                publisher.topic_path(project, topic),
                endpoint,
                # A dead-letter topic cannot dead-letter into itself: its subscription only retries.
                dead_letter_topic=None if route.topic == topology.DEAD_LETTER else dead_letter,
                ack_deadline_s=ack_deadline_s,
                minimum_backoff_s=minimum_backoff_s,
            )
            try:
                subscriber.create_subscription(request=wanted)
            except AlreadyExists:
                existing = subscriber.get_subscription(subscription=wanted.name)
                changed = changed_fields(existing, wanted)
                if changed:
                    from google.protobuf.field_mask_pb2 import FieldMask

                    subscriber.update_subscription(
                        request={"subscription": wanted, "update_mask": FieldMask(paths=changed)}
                    )
            subscriptions[wanted.name] = endpoint
        return Wiring(topics=tuple(topics), subscriptions=subscriptions)
    finally:
        publisher.transport.close()
        subscriber.transport.close()


def push_subscription(
    path: str,
    topic_path: str,
    endpoint: str,
    *,
    dead_letter_topic: str | None,
    ack_deadline_s: int = ACK_DEADLINE_S,
    minimum_backoff_s: float = LOCAL_MINIMUM_BACKOFF_S,
) -> Subscription:
    """A push subscription as tpujobs wires them: retry with backoff and, unless
    `dead_letter_topic` is None, dead-lettering after MAX_DELIVERY_ATTEMPTS."""
    from google.pubsub_v1 import DeadLetterPolicy, PushConfig, Subscription

    return Subscription(
        name=path,
        topic=topic_path,
        push_config=PushConfig(push_endpoint=endpoint),
        ack_deadline_seconds=ack_deadline_s,
        retry_policy=retry_policy(minimum_backoff_s),
        dead_letter_policy=(
            DeadLetterPolicy(
                dead_letter_topic=dead_letter_topic, max_delivery_attempts=MAX_DELIVERY_ATTEMPTS
            )
            if dead_letter_topic
            else None
        ),
    )


def retry_policy(minimum_backoff_s: float, maximum_backoff_s: float = MAXIMUM_BACKOFF_S) -> RetryPolicy:
    """Exponential backoff between the two bounds (Pub/Sub allows 0 to 600 s)."""
    from google.pubsub_v1 import RetryPolicy

    return RetryPolicy(
        minimum_backoff=timedelta(seconds=minimum_backoff_s),
        maximum_backoff=timedelta(seconds=maximum_backoff_s),
    )


def changed_fields(existing: Subscription, wanted: Subscription) -> list[str]:
    """The fields `wire_pubsub` manages that differ: the update mask that brings `existing`
    to `wanted` (a field absent from `wanted`, such as a dead-letter policy, is cleared)."""
    return [name for name in _MANAGED_FIELDS if getattr(existing, name) != getattr(wanted, name)]


def push_endpoint(function_url: str, project: str, topic: str) -> str:
    """The function's URL with the topic in its path: functions-framework puts that path in
    the CloudEvent's source, which is how a handler knows the topic, as under Eventarc."""
    return f"{function_url.rstrip('/')}/projects/{project}/topics/{topic}"


def ensure_bucket(emulator_url: str, project: str, bucket: str) -> None:
    """The bucket exists in the storage emulator (created if missing)."""
    from google.api_core.exceptions import Conflict

    client = storage_client(emulator_url, project)
    if client.lookup_bucket(bucket) is not None:
        return
    with contextlib.suppress(Conflict):  # created meanwhile by someone else
        client.create_bucket(bucket)
