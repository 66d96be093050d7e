"""The local stack's pusher on the real Pub/Sub emulator: what only the emulator can show.

The stack's subscriptions are pull twins of production's push subscriptions (`wire_pubsub(...,
pushed_by_emulator=False)`), pushed by `tpujobs.local.pusher`. Here one such twin, wired for
tpujobs-submit with its retry and dead-letter policies, is pushed to a tiny server: a message it
answers 200 is acknowledged once and never comes back; one it answers 202 (a success elsewhere,
a failure to Pub/Sub) is nacked, redelivered and, after 5 attempts, dead-lettered by the
emulator with Pub/Sub's attributes, as after a failed push. The fake-based tests cover the rest.
"""

from __future__ import annotations

import base64
import json
import threading
from collections import Counter
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from tpujobs.engine import dead_letters as letters
from tpujobs.engine import topology
from tpujobs.local import pusher, wiring
from tpujobs.local.testing import wait_for

pytestmark = pytest.mark.emulator

PREFIX = "t7-"
SUBMIT_ROUTE = next(r for r in topology.FUNCTIONS if r.topic == topology.SUBMIT)


class Function:
    """Answers each push with the status its message's data names; counts pushes by message id."""

    def __init__(self) -> None:
        pushes = self.pushes = Counter[str]()

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                envelope = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                pushes[envelope["message"]["messageId"]] += 1
                self.send_response(int(base64.b64decode(envelope["message"]["data"])))
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def function() -> Iterator[Function]:
    served = Function()
    try:
        yield served
    finally:
        served.server.shutdown()
        served.server.server_close()


def test_the_pusher_acknowledges_200_and_has_202_redelivered_then_dead_lettered(emulators, project_id, function):
    """200: one push, acknowledged. 202: pushed 5 times, then on the dead-letter topic with
    a delivery count of 5, as the emulator treats a failed push."""
    host = emulators["PUBSUB_EMULATOR_HOST"]
    urls = {route.target: function.url for route in topology.FUNCTIONS}
    wired = wiring.wire_pubsub(host, project_id, PREFIX, urls, pushed_by_emulator=False)
    publisher, subscriber = wiring.publisher_client(host), wiring.subscriber_client(host)
    stop = threading.Event()
    try:
        (route,) = [r for r in pusher.routes(project_id, PREFIX, urls) if r.subscription.endswith("submit_job")]
        assert subscriber.get_subscription(subscription=route.subscription).push_config.push_endpoint == ""
        assert wired.subscriptions[route.subscription] == function.url
        dead = subscriber.subscription_path(project_id, "t7-dead-letters-pull")
        dead_topic = publisher.topic_path(project_id, topology.topic_name(topology.DEAD_LETTER, PREFIX))
        subscriber.create_subscription(name=dead, topic=dead_topic, ack_deadline_seconds=10)

        subject = pusher.SubscriptionPusher(
            route, pusher.EmulatorSubscription(subscriber, route.subscription), pusher.post_http
        )
        for work in (subject.run, subject.verdicts.run):
            threading.Thread(target=work, args=(stop,), daemon=True).start()
        topic = publisher.topic_path(project_id, topology.topic_name(topology.SUBMIT, PREFIX))
        good, refused = publisher.publish(topic=topic, messages=[{"data": b"200"}, {"data": b"202"}]).message_ids

        def dead_lettered():
            """the refused message on the dead-letter topic"""
            answer = subscriber.pull(subscription=dead, max_messages=1, timeout=5.0)
            return answer.received_messages[0].message if answer.received_messages else None

        letter = wait_for(dead_lettered, timeout=60, interval=0.2)
    finally:
        stop.set()
        publisher.transport.close()
        subscriber.transport.close()
    assert letter.data == b"202"
    assert letter.attributes[letters.DELIVERY_COUNT] == str(wiring.MAX_DELIVERY_ATTEMPTS)
    assert letter.attributes[letters.SOURCE_SUBSCRIPTION] == topology.push_subscription_name(SUBMIT_ROUTE, PREFIX)
    assert function.pushes[refused] == wiring.MAX_DELIVERY_ATTEMPTS
    assert function.pushes[good] == 1
