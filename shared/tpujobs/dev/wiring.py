"""Create in the emulators what production gets from Terraform: topics, push subscriptions, bucket.

The table is `tpujobs.topology`: every topic exists, and every cloudevent route gets a push
subscription whose endpoint is its function's local URL, so the Pub/Sub emulator delivers the
same push envelope Eventarc does and functions-framework turns it into a CloudEvent. Every
step is idempotent, so `tpujobs dev up` can run against emulators that already hold them.

Clients are built inside the functions, against the addresses given, never from the process
environment: the caller says which emulator it means.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tpujobs import topology

if TYPE_CHECKING:
    from google.cloud import storage
    from google.pubsub_v1 import PublisherClient, SubscriberClient

ACK_DEADLINE_S = 20
MAX_DELIVERY_ATTEMPTS = 5  # then the message goes to the dead-letter topic, as in production


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
) -> Wiring:
    """Every topic of the contract, and a push subscription per cloudevent route.

    `function_urls` maps a route's target to its URL. Existing topics and subscriptions are
    kept; a subscription that pushes elsewhere (a function on a new port) is re-pointed.
    """
    from google.api_core.exceptions import AlreadyExists
    from google.pubsub_v1 import DeadLetterPolicy, PushConfig, Subscription

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
            path = subscriber.subscription_path(
                project, topology.push_subscription_name(route, prefix)
            )
            wanted = Subscription(
                name=path,
                topic=publisher.topic_path(project, topic),
                push_config=PushConfig(push_endpoint=endpoint),
                ack_deadline_seconds=ack_deadline_s,
                dead_letter_policy=DeadLetterPolicy(
                    dead_letter_topic=dead_letter, max_delivery_attempts=MAX_DELIVERY_ATTEMPTS
                ),
            )
            try:
                subscriber.create_subscription(request=wanted)
            except AlreadyExists:
                existing = subscriber.get_subscription(subscription=path)
                if existing.push_config.push_endpoint != endpoint:
                    subscriber.modify_push_config(
                        subscription=path, push_config=PushConfig(push_endpoint=endpoint)
                    )
            subscriptions[path] = endpoint
        return Wiring(topics=tuple(topics), subscriptions=subscriptions)
    finally:
        publisher.transport.close()
        subscriber.transport.close()


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
