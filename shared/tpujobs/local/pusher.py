"""The local stack's push delivery: each subscription pushed concurrently, as production pushes it.

Why not the emulator's own push: the Pub/Sub emulator pushes each subscription from two loops,
each posting one message and waiting for its answer (`PushLoop` in its jar), so no function ever
had more than 2 requests at once and a burst measured the emulator. Production pushes as fast as
the endpoint answers, and Cloud Run serves up to max instances x concurrency requests of a
function at once (infra/functions.tf; `tpujobs.local.function_scale`).

So `tpujobs dev up` wires each route's subscription with production's policies but no push
endpoint (`wiring.wire_pubsub(..., pushed_by_emulator=False)`: the emulator pushes nothing), and
this process pushes in its place. For each subscription it pulls as many messages as the function
has free request slots, posts each to the function's bare URL as the push envelope the emulator
posts (`push_envelope`), and

- acknowledges on 102, 200, 201, 203 or 204, as Pub/Sub's push does (202 is a failure);
- nacks on anything else (another status, no answer, none within the ack deadline): a
  ModifyAckDeadline of 0, after which Pub/Sub redelivers with the subscription's retry policy
  and dead-letters after its max_delivery_attempts, as after a failed push.

Plain pull rather than streaming pull: a pull asks for exactly the free slots, so no message
waits here leased while its ack deadline (the function's time to answer) runs, and the emulator's
long poll answers within tens of milliseconds of a publish. Acknowledgements go in batches: one
call for whatever finished while the previous call was under way. Measured:
docs/local-stack.md#push-delivery.
"""

from __future__ import annotations

import argparse
import base64
import http.client
import json
import logging
import queue
import signal
import sys
import threading
import time
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from tpujobs.engine import topology
from tpujobs.local import wiring
from tpujobs.local.function_scale import requests_at_once

if TYPE_CHECKING:
    from google.pubsub_v1 import PubsubMessage, SubscriberClient

log = logging.getLogger(__name__)

ACK_STATUSES = frozenset({102, 200, 201, 203, 204})  # what Pub/Sub's push counts as acknowledged
PULL_WAIT_S = 10.0  # a pull's long poll; an empty one ends then and is asked again
MAX_PULL = 100  # the emulator returns at most 100 messages a pull
MAX_ACK_IDS = 500  # per Acknowledge or ModifyAckDeadline call: well inside Pub/Sub's 512 KB request
RETRY_AFTER_ERROR_S = 1.0  # after a failed pull (the emulator restarting, say)
STOP_GRACE_S = 5.0  # how long a stopping pusher waits for the posts under way

Post = Callable[[str, bytes, float], "int | None"]
"""POST a body to a URL within a timeout: the HTTP status, or None when nothing answered in time."""


@dataclass(frozen=True)
class Route:
    """One subscription and where its messages go: the function's bare URL, at most
    `concurrency` at once, each within the subscription's ack deadline."""

    subscription: str  # projects/P/subscriptions/NAME
    endpoint: str
    concurrency: int
    ack_deadline_s: float

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Route:
        return cls(
            subscription=str(data["subscription"]),
            endpoint=str(data["endpoint"]),
            concurrency=int(data["concurrency"]),
            ack_deadline_s=float(data["ack_deadline_s"]),
        )


@dataclass(frozen=True)
class Pulled:
    """A message handed out by a pull: its ack id and the body to post."""

    ack_id: str
    envelope: bytes


class PullSource(Protocol):
    """One subscription, as the pusher uses it."""

    def pull(self, max_messages: int) -> Sequence[Pulled]:
        """Up to max_messages, waiting a while for the first; may return none."""
        ...

    def acknowledge(self, ack_ids: Sequence[str]) -> None: ...

    def nack(self, ack_ids: Sequence[str]) -> None:
        """Hand the messages back for redelivery with the subscription's retry policy."""
        ...


def push_envelope(
    subscription: str, message_id: str, data: bytes, attributes: Mapping[str, str], published: datetime
) -> bytes:
    """The JSON body Pub/Sub's push posts (tests/data/pubsub_push_envelope.json): the message with
    both spellings of its id and publish time, as the emulator and the service send them."""
    at = published.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.") + f"{published.microsecond // 1000:03d}Z"
    message = {
        "attributes": dict(attributes),
        "data": base64.b64encode(data).decode("ascii"),
        "messageId": message_id,
        "message_id": message_id,
        "publishTime": at,
        "publish_time": at,
    }
    return json.dumps({"message": message, "subscription": subscription}).encode()


class Slots:
    """The requests a function may have under way: taken before a post, given back after it."""

    def __init__(self, size: int) -> None:
        if size < 1:
            raise ValueError(f"a route needs at least one request at once, not {size}")
        self.size = size
        self._busy = 0
        self._changed = threading.Condition()

    @property
    def busy(self) -> int:
        with self._changed:
            return self._busy

    def wait_free(self, stop: threading.Event, poll_s: float = 0.5) -> int:
        """How many are free, once at least one is (0 once `stop` is set)."""
        with self._changed:
            while self._busy >= self.size and not stop.is_set():
                self._changed.wait(poll_s)
            return 0 if stop.is_set() else self.size - self._busy

    def take(self) -> None:
        with self._changed:
            self._busy += 1

    def give_back(self) -> None:
        with self._changed:
            self._busy -= 1
            self._changed.notify_all()

    def wait_idle(self, timeout_s: float) -> bool:
        """Until nothing is under way, at most timeout_s; whether nothing is."""
        with self._changed:
            return self._changed.wait_for(lambda: self._busy == 0, timeout_s)


class Verdicts:
    """Acks and nacks of one subscription, sent in batches by one thread: whatever finished while
    the last call was under way goes in the next. A call that fails is logged and dropped: its
    messages come back when their ack deadline passes, as Pub/Sub redelivers an unanswered push."""

    def __init__(self, source: PullSource) -> None:
        self._source = source
        self._queue: queue.Queue[tuple[str, bool]] = queue.Queue()

    def add(self, ack_id: str, acknowledged: bool) -> None:
        self._queue.put((ack_id, acknowledged))

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            self.flush(wait_s=0.5)

    def flush(self, wait_s: float = 0.0) -> int:
        """Send what is waiting (waiting up to wait_s for a first one); how many were sent."""
        try:
            batch = [self._queue.get(timeout=wait_s) if wait_s > 0 else self._queue.get_nowait()]
        except queue.Empty:
            return 0
        while True:
            try:
                batch.append(self._queue.get_nowait())
            except queue.Empty:
                break
        for verdict, send in ((True, self._source.acknowledge), (False, self._source.nack)):
            ids = [ack_id for ack_id, acknowledged in batch if acknowledged is verdict]
            for start in range(0, len(ids), MAX_ACK_IDS):
                try:
                    send(ids[start : start + MAX_ACK_IDS])
                except Exception:  # the emulator stopping or restarting: redelivered after the deadline
                    log.exception("could not send %d %s", len(ids), "acks" if verdict else "nacks")
        return len(batch)


class SubscriptionPusher:
    """Pushes one subscription: pulls what the function has room for and posts each message at once."""

    def __init__(self, route: Route, source: PullSource, post: Post) -> None:
        self.route = route
        self.slots = Slots(route.concurrency)
        self.verdicts = Verdicts(source)
        self._source = source
        self._post = post
        self._posting = ThreadPoolExecutor(max_workers=route.concurrency, thread_name_prefix="push")

    def run(self, stop: threading.Event) -> None:
        """Pull and post until `stop`; messages pulled as it came are handed back at once."""
        while True:
            free = self.slots.wait_free(stop)
            if free == 0:
                return
            try:
                batch = self._source.pull(min(free, MAX_PULL))
            except Exception:
                log.exception("pulling %s failed; again in %g s", self.route.subscription, RETRY_AFTER_ERROR_S)
                stop.wait(RETRY_AFTER_ERROR_S)
                continue
            for pulled in batch:
                if stop.is_set():
                    self.verdicts.add(pulled.ack_id, False)
                    continue
                self.slots.take()
                self._posting.submit(self.deliver, pulled)

    def deliver(self, pulled: Pulled) -> bool:
        """Post one message and record its verdict; whether the function acknowledged it."""
        try:
            try:
                status = self._post(self.route.endpoint, pulled.envelope, self.route.ack_deadline_s)
            except Exception:  # a fault of the post itself: the message must still come back
                log.exception("posting to %s failed", self.route.endpoint)
                status = None
            acknowledged = status in ACK_STATUSES
            if not acknowledged:
                log.info("%s answered %s: redelivery", self.route.endpoint, status or "nothing")
            self.verdicts.add(pulled.ack_id, acknowledged)
            return acknowledged
        finally:
            self.slots.give_back()

    def drain(self, timeout_s: float = STOP_GRACE_S) -> None:
        """Wait for the posts under way (at most timeout_s), then send their verdicts."""
        self.slots.wait_idle(timeout_s)
        self._posting.shutdown(wait=False, cancel_futures=True)
        self.verdicts.flush()


def post_http(url: str, body: bytes, timeout_s: float) -> int | None:
    """POST a push envelope as Pub/Sub does (JSON, no proxy); the status, or None for no answer."""
    parts = urllib.parse.urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port, timeout=timeout_s)
    try:
        connection.request("POST", parts.path or "/", body, {"Content-Type": "application/json"})
        response = connection.getresponse()
        response.read()
        return int(response.status)
    except (OSError, http.client.HTTPException):
        return None
    finally:
        connection.close()


class EmulatorSubscription:
    """A subscription of the Pub/Sub emulator as a PullSource (a shared gRPC client)."""

    def __init__(self, client: SubscriberClient, subscription: str) -> None:
        self._client = client
        self._subscription = subscription

    def pull(self, max_messages: int) -> list[Pulled]:
        from google.api_core.exceptions import DeadlineExceeded

        try:
            response = self._client.pull(
                request={"subscription": self._subscription, "max_messages": max_messages},
                timeout=PULL_WAIT_S,
                retry=None,
            )
        except DeadlineExceeded:  # nothing came during the long poll
            return []
        return [Pulled(r.ack_id, self.envelope(r.message)) for r in response.received_messages]

    def envelope(self, message: PubsubMessage) -> bytes:
        published: Any = message.publish_time  # proto-plus hands out a datetime; its stubs say Timestamp
        if not isinstance(published, datetime):
            published = published.ToDatetime(tzinfo=timezone.utc)
        return push_envelope(self._subscription, message.message_id, message.data, message.attributes, published)

    def acknowledge(self, ack_ids: Sequence[str]) -> None:
        self._client.acknowledge(request={"subscription": self._subscription, "ack_ids": list(ack_ids)})

    def nack(self, ack_ids: Sequence[str]) -> None:
        self._client.modify_ack_deadline(
            request={"subscription": self._subscription, "ack_ids": list(ack_ids), "ack_deadline_seconds": 0}
        )


def routes(project: str, prefix: str, function_urls: Mapping[str, str]) -> list[Route]:
    """What `tpujobs.local.pusher` pushes: each cloudevent route's subscription to its function's
    URL, as many at once as production serves (`function_scale`), each within the ack deadline."""
    return [
        Route(
            subscription=f"projects/{project}/subscriptions/{topology.push_subscription_name(route, prefix)}",
            endpoint=wiring.push_endpoint(function_urls[route.target]),
            concurrency=requests_at_once(route.target),
            ack_deadline_s=float(topology.ack_deadline_s(route)),
        )
        for route in topology.FUNCTIONS
        if route.signature == "cloudevent" and route.topic is not None
    ]


def write_config(path: Path, emulator_host: str, routes: Sequence[Route]) -> None:
    """What `main` reads: the emulator and every route."""
    config = {"emulator_host": emulator_host, "routes": [route.to_json() for route in routes]}
    path.write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")


def main(argv: Sequence[str] | None = None) -> int:
    """Push every route of the config until SIGTERM or SIGINT."""
    parser = argparse.ArgumentParser(description="The local stack's push delivery")
    parser.add_argument("--config", type=Path, required=True, help="written by pusher.write_config")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", stream=sys.stderr)
    config = json.loads(args.config.read_text(encoding="utf-8"))
    routes = [Route.from_json(route) for route in config["routes"]]
    client = wiring.subscriber_client(config["emulator_host"])
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    pushers = [SubscriptionPusher(r, EmulatorSubscription(client, r.subscription), post_http) for r in routes]
    for pusher in pushers:
        for work in (pusher.run, pusher.verdicts.run):
            threading.Thread(target=work, args=(stop,), daemon=True, name=pusher.route.subscription).start()
        log.info(
            "pushing %s to %s, %d at once", pusher.route.subscription, pusher.route.endpoint, pusher.route.concurrency
        )
    while not stop.wait(1.0):
        pass
    deadline = time.monotonic() + STOP_GRACE_S  # one grace for all: `tpujobs dev down` waits 10 s
    for pusher in pushers:
        pusher.drain(max(0.0, deadline - time.monotonic()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
