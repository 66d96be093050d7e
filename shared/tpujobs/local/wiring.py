"""Create in the emulators what production gets from Terraform: topics, push subscriptions, bucket.

Every cloudevent route of `tpujobs.engine.topology` gets the push subscription infra/pubsub.tf gives it
(`{prefix}{topic}--{target}`, the function's bare URL, an OIDC token, retries, a dead-letter topic);
tests/infra/test_push_wiring.py holds the two to one shape. The local stack has it pushed by
`tpujobs.local.pusher`, concurrently as production pushes, so there the emulator holds its pull twin
(the same subscription without a push endpoint, `pushed_by_emulator=False`); the emulator's own push
(two messages at a time) remains for tests that wire it alone. Every step is idempotent, and clients are
built from the addresses given, never the environment.
The emulator's measured retries: docs/local-stack.md#the-pubsub-emulators-retries-and-dead-letters-measured.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING

from tpujobs.engine import topology

if TYPE_CHECKING:
    from google.cloud import storage
    from google.pubsub_v1 import PublisherClient, RetryPolicy, SubscriberClient, Subscription

ACK_DEADLINE_S = 60  # a handler's usual deadline; route_subscription gives each route its own
MAX_DELIVERY_ATTEMPTS = 5  # then the message goes to the dead-letter topic, as in production

# Pub/Sub waits between the minimum and the maximum before redelivering a failed push, doubling
# each time. Handlers raise only for transient trouble (Firestore or the TPU API briefly
# unavailable), so in production the 5 attempts should span a few minutes of such trouble:
# 10 s, 20 s, 40 s, 60 s. Locally a poison message should reach the dead letters while you
# watch (and the end-to-end test stays short): the emulator's own floor is ~1-3 s anyway.
PRODUCTION_MINIMUM_BACKOFF_S = 10.0
LOCAL_MINIMUM_BACKOFF_S = 1.0
MAXIMUM_BACKOFF_S = 60.0  # a recovered dependency is noticed within a minute
RETENTION = timedelta(days=7)  # unacknowledged messages are kept this long, as in infra/

# The fields `wire_pubsub` owns on a subscription, as update_subscription's field mask names them.
_MANAGED_FIELDS = (
    "push_config",
    "ack_deadline_seconds",
    "dead_letter_policy",
    "retry_policy",
    "message_retention_duration",
    "expiration_policy",
)


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
    minimum_backoff_s: float = LOCAL_MINIMUM_BACKOFF_S,
    pushed_by_emulator: bool = True,
) -> Wiring:
    """Every topic of `topology.ALL_TOPICS`, and a push subscription per cloudevent route.

    `function_urls` maps a route's target to its URL. Existing topics and subscriptions are
    kept; a subscription whose endpoint (a function on a new port) or policies differ from
    the wanted ones is updated in place, and one that already matches is left untouched.
    With `pushed_by_emulator=False` each is created as its pull twin, for `tpujobs.local.pusher`
    to push (`pusher.routes`); `Wiring.subscriptions` names the push endpoints either way.
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

        subscriptions: dict[str, str] = {}
        for route in topology.FUNCTIONS:
            if route.signature != "cloudevent" or route.topic is None:
                continue
            pushed = route_subscription(
                route, project, prefix, function_urls[route.target], minimum_backoff_s=minimum_backoff_s
            )
            wanted = pushed if pushed_by_emulator else pull_twin(pushed)
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
            subscriptions[wanted.name] = pushed.push_config.push_endpoint
        return Wiring(topics=tuple(topics), subscriptions=subscriptions)
    finally:
        publisher.transport.close()
        subscriber.transport.close()


def route_subscription(
    route: topology.FunctionRoute,
    project: str,
    prefix: str,
    function_url: str,
    *,
    minimum_backoff_s: float = LOCAL_MINIMUM_BACKOFF_S,
) -> Subscription:
    """The push subscription infra/pubsub.tf gives `route`, for the function at `function_url`:
    only the minimum backoff differs between the local stack and production."""
    assert route.topic is not None, f"{route.target} is an HTTP function and has no subscription"
    topic = f"projects/{project}/topics/{topology.topic_name(route.topic, prefix)}"
    dead_letter = f"projects/{project}/topics/{topology.topic_name(topology.DEAD_LETTER, prefix)}"
    return push_subscription(
        f"projects/{project}/subscriptions/{topology.push_subscription_name(route, prefix)}",
        topic,
        push_endpoint(function_url),
        # A dead-letter topic cannot dead-letter into itself: its subscription only retries.
        dead_letter_topic=None if route.topic == topology.DEAD_LETTER else dead_letter,
        ack_deadline_s=topology.ack_deadline_s(route),
        minimum_backoff_s=minimum_backoff_s,
        push_account=topology.push_service_account(project, prefix),
    )


def pull_twin(subscription: Subscription) -> Subscription:
    """The subscription without its push endpoint: the emulator then pushes nothing, and
    `tpujobs.local.pusher` pushes it instead, with every other field (ack deadline, retry
    and dead-letter policies, retention) still the emulator's to apply."""
    twin = type(subscription)(subscription)
    type(twin).pb(twin).ClearField("push_config")
    return twin


def push_subscription(
    path: str,
    topic_path: str,
    endpoint: str,
    *,
    dead_letter_topic: str | None,
    ack_deadline_s: int = ACK_DEADLINE_S,
    minimum_backoff_s: float = LOCAL_MINIMUM_BACKOFF_S,
    push_account: str = "",
) -> Subscription:
    """A push subscription as tpujobs wires them: retry with backoff and, unless
    `dead_letter_topic` is None, dead-lettering after MAX_DELIVERY_ATTEMPTS; pushes signed
    as `push_account` (an OIDC token whose audience is the endpoint) when one is given."""
    from google.pubsub_v1 import DeadLetterPolicy, ExpirationPolicy, PushConfig, Subscription

    token = PushConfig.OidcToken(service_account_email=push_account, audience=endpoint) if push_account else None
    return Subscription(
        name=path,
        topic=topic_path,
        push_config=PushConfig(push_endpoint=endpoint, oidc_token=token),
        ack_deadline_seconds=ack_deadline_s,
        retry_policy=retry_policy(minimum_backoff_s),
        dead_letter_policy=(
            DeadLetterPolicy(dead_letter_topic=dead_letter_topic, max_delivery_attempts=MAX_DELIVERY_ATTEMPTS)
            if dead_letter_topic
            else None
        ),
        message_retention_duration=RETENTION,
        expiration_policy=ExpirationPolicy(),  # no ttl: never expires, however quiet
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


def push_endpoint(function_url: str) -> str:
    """Where a push goes: the function's URL as it is, as Terraform pushes to
    `service_config[0].uri`. No topic in the path: the function reads it from the
    envelope's subscription (tpujobs.engine.inbound)."""
    return function_url


def ensure_bucket(emulator_url: str, project: str, bucket: str) -> None:
    """The bucket exists in the storage emulator (created if missing)."""
    from google.api_core.exceptions import Conflict

    client = storage_client(emulator_url, project)
    if client.lookup_bucket(bucket) is not None:
        return
    with contextlib.suppress(Conflict):  # created meanwhile by someone else
        client.create_bucket(bucket)
