"""The local stack's pusher (tpujobs.local.pusher) against fakes: production's envelope, its
acknowledgement codes, and as many posts at once as the function serves, never more."""

from __future__ import annotations

import base64
import http.server
import json
import threading
from collections import deque
from collections.abc import Iterator, Sequence
from datetime import datetime, timezone
from pathlib import Path

import pytest

from tpujobs.engine import topology
from tpujobs.local import function_scale, pusher, wiring
from tpujobs.local.testing import wait_for

GOLDEN = Path(__file__).resolve().parents[2] / "data" / "pubsub_push_envelope.json"
ROUTE = pusher.Route("projects/p/subscriptions/tpujobs-submit--submit_job", "http://127.0.0.1:9/", 8, 60.0)


class FakeSubscription:
    """A subscription's backlog in memory: pulls hand out what waits, verdicts are recorded."""

    def __init__(self, count: int = 0) -> None:
        self.waiting = deque(pusher.Pulled(f"ack-{i}", b"{}") for i in range(count))
        self.asked: list[int] = []
        self.acked: list[str] = []
        self.nacked: list[str] = []
        self.failures = 0  # the next acknowledge calls that fail

    def pull(self, max_messages: int) -> list[pusher.Pulled]:
        self.asked.append(max_messages)
        taken = [self.waiting.popleft() for _ in range(min(max_messages, len(self.waiting)))]
        if not taken:
            threading.Event().wait(0.01)  # a long poll, shortened
        return taken

    def acknowledge(self, ack_ids: Sequence[str]) -> None:
        if self.failures:
            self.failures -= 1
            raise RuntimeError("emulator unavailable")
        self.acked.extend(ack_ids)

    def nack(self, ack_ids: Sequence[str]) -> None:
        self.nacked.extend(ack_ids)


class HeldFunction:
    """A function whose answers wait until released; it counts the requests under way."""

    def __init__(self, status: int = 200) -> None:
        self.status = status
        self.release = threading.Event()
        self.under_way = 0
        self.most_at_once = 0
        self.calls: list[tuple[str, bytes, float]] = []
        self._lock = threading.Lock()

    def __call__(self, url: str, body: bytes, timeout_s: float) -> int | None:
        with self._lock:
            self.calls.append((url, body, timeout_s))
            self.under_way += 1
            self.most_at_once = max(self.most_at_once, self.under_way)
        self.release.wait(30)
        with self._lock:
            self.under_way -= 1
        return self.status


@pytest.fixture
def stop() -> Iterator[threading.Event]:
    event = threading.Event()
    yield event
    event.set()


def start(subject: pusher.SubscriptionPusher, stop: threading.Event) -> None:
    for work in (subject.run, subject.verdicts.run):
        threading.Thread(target=work, args=(stop,), daemon=True).start()


def test_the_envelope_is_the_one_pubsub_posts():
    """Built from the golden envelope's own fields, it is that envelope, field for field."""
    golden = json.loads(GOLDEN.read_text())
    message = golden["message"]
    built = pusher.push_envelope(
        golden["subscription"],
        message["messageId"],
        base64.b64decode(message["data"]),
        message["attributes"],
        datetime(2025, 3, 1, 12, 0, 0, 123456, tzinfo=timezone.utc),
    )
    assert json.loads(built) == golden


def test_an_envelope_without_attributes_carries_an_empty_map_as_the_emulator_sends():
    """No attributes: `attributes` is {} and `data` may be empty, as the emulator posts them."""
    built = json.loads(pusher.push_envelope("projects/p/subscriptions/s", "7", b"", {}, datetime.now(timezone.utc)))
    assert built["message"]["attributes"] == {}
    assert built["message"]["data"] == ""


@pytest.mark.parametrize("status", [102, 200, 201, 203, 204])
def test_the_statuses_pubsub_counts_as_acknowledged_acknowledge(status):
    """102, 200, 201, 203 and 204 acknowledge the message."""
    source = FakeSubscription()
    subject = pusher.SubscriptionPusher(ROUTE, source, lambda url, body, timeout: status)
    assert subject.deliver(pusher.Pulled("a", b"{}")) is True
    subject.verdicts.flush()
    assert (source.acked, source.nacked) == (["a"], [])


@pytest.mark.parametrize("status", [202, 400, 404, 415, 429, 500, 503, None])
def test_any_other_answer_or_none_hands_the_message_back(status):
    """202 (a success elsewhere), client and server errors, and no answer at all are nacks:
    Pub/Sub redelivers with the retry policy and dead-letters after the last attempt."""
    source = FakeSubscription()
    subject = pusher.SubscriptionPusher(ROUTE, source, lambda url, body, timeout: status)
    assert subject.deliver(pusher.Pulled("a", b"{}")) is False
    subject.verdicts.flush()
    assert (source.acked, source.nacked) == ([], ["a"])


def test_a_burst_is_posted_as_many_at_once_as_the_function_serves_and_never_more(stop):
    """50 messages, a limit of 8: 8 under way at once, each pull asks only for free slots,
    and once the function answers every message is acknowledged exactly once."""
    source = FakeSubscription(50)
    function = HeldFunction()
    subject = pusher.SubscriptionPusher(ROUTE, source, function)
    start(subject, stop)

    wait_for(lambda: function.under_way == ROUTE.concurrency, timeout=10, what="8 posts under way")
    assert len(source.waiting) == 50 - ROUTE.concurrency  # nothing pulled beyond the free slots
    assert all(asked <= ROUTE.concurrency for asked in source.asked)
    function.release.set()
    wait_for(lambda: len(source.acked) == 50, timeout=10, what="all 50 acknowledged")
    assert function.most_at_once == ROUTE.concurrency
    assert sorted(source.acked) == sorted(f"ack-{i}" for i in range(50))
    assert source.nacked == []


def test_each_post_goes_to_the_functions_url_within_the_ack_deadline(stop):
    """The envelope pulled is the body posted, to the route's endpoint, with its deadline as the timeout."""
    source = FakeSubscription()
    source.waiting.append(pusher.Pulled("a", b'{"message": {}}'))
    function = HeldFunction()
    function.release.set()
    start(pusher.SubscriptionPusher(ROUTE, source, function), stop)
    wait_for(lambda: source.acked, timeout=10, what="the message acknowledged")
    assert function.calls == [(ROUTE.endpoint, b'{"message": {}}', ROUTE.ack_deadline_s)]


def test_a_pull_never_asks_for_more_than_the_emulator_returns():
    """A limit of 160 (submit_job's) still pulls at most MAX_PULL at a time."""
    source = FakeSubscription(300)
    stop = threading.Event()
    route = pusher.Route(ROUTE.subscription, ROUTE.endpoint, 160, 60.0)
    subject = pusher.SubscriptionPusher(route, source, lambda url, body, timeout: (stop.set(), 200)[1])
    subject.run(stop)
    assert source.asked and max(source.asked) == pusher.MAX_PULL


def test_messages_pulled_while_stopping_are_handed_back_unposted():
    """A pull that returns after the stop: its messages are nacked at once, not posted."""
    stop = threading.Event()

    class StopsDuringPull(FakeSubscription):
        def pull(self, max_messages: int) -> list[pusher.Pulled]:
            stop.set()
            return super().pull(max_messages)

    source = StopsDuringPull(3)
    posts: list[bytes] = []
    subject = pusher.SubscriptionPusher(ROUTE, source, lambda url, body, timeout: posts.append(body) or 200)
    subject.run(stop)
    subject.drain()
    assert posts == []
    assert sorted(source.nacked) == ["ack-0", "ack-1", "ack-2"]


def test_a_failed_acknowledge_call_is_dropped_and_later_verdicts_still_go_out():
    """The emulator refusing one call loses only that batch (redelivered after its deadline)."""
    source = FakeSubscription()
    source.failures = 1
    subject = pusher.SubscriptionPusher(ROUTE, source, lambda url, body, timeout: 200)
    subject.deliver(pusher.Pulled("lost", b"{}"))
    subject.verdicts.flush()
    subject.deliver(pusher.Pulled("kept", b"{}"))
    subject.verdicts.flush()
    assert source.acked == ["kept"]


def test_verdicts_that_wait_together_go_in_one_call():
    """Acks that finished while a call was under way are sent together: one call, not one each."""
    calls: list[list[str]] = []

    class Counting(FakeSubscription):
        def acknowledge(self, ack_ids: Sequence[str]) -> None:
            calls.append(list(ack_ids))

    subject = pusher.SubscriptionPusher(ROUTE, Counting(), lambda url, body, timeout: 200)
    for i in range(5):
        subject.deliver(pusher.Pulled(f"a{i}", b"{}"))
    assert subject.verdicts.flush() == 5
    assert calls == [[f"a{i}" for i in range(5)]]


def test_a_route_without_room_for_a_request_is_refused():
    """A limit below 1 would never deliver: refused when the pusher is built."""
    with pytest.raises(ValueError):
        pusher.SubscriptionPusher(pusher.Route(ROUTE.subscription, ROUTE.endpoint, 0, 60.0), FakeSubscription(), print)


def test_post_http_returns_the_status_and_none_when_nothing_answers():
    """A real loopback server's status comes back with the JSON body it was sent; a closed port is None."""
    received: list[tuple[str | None, bytes]] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            received.append((self.headers["Content-Type"], self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        assert pusher.post_http(f"http://127.0.0.1:{server.server_port}/", b'{"a": 1}', 5.0) == 204
    finally:
        server.shutdown()
        server.server_close()
    assert received == [("application/json", b'{"a": 1}')]
    assert pusher.post_http(f"http://127.0.0.1:{server.server_port}/", b"{}", 5.0) is None


def test_the_config_round_trips_every_route(tmp_path):
    """What the stack writes is what the pusher process reads back."""
    routes = pusher.routes("p", "t1-", {r.target: f"http://127.0.0.1:1/{r.target}" for r in topology.FUNCTIONS})
    path = tmp_path / "pusher.json"
    pusher.write_config(path, "127.0.0.1:8085", routes)
    config = json.loads(path.read_text())
    assert config["emulator_host"] == "127.0.0.1:8085"
    assert [pusher.Route.from_json(r) for r in config["routes"]] == routes


def test_every_cloudevent_route_is_pushed_to_its_function_at_productions_scale():
    """One route per push subscription: its name, the function's bare URL, max instances x
    concurrency at once, the function's ack deadline."""
    urls = {r.target: f"http://127.0.0.1:{7000 + i}/" for i, r in enumerate(topology.FUNCTIONS)}
    routes = {route.subscription: route for route in pusher.routes("p", "t1-", urls)}
    cloudevent = [r for r in topology.FUNCTIONS if r.topic is not None]
    assert len(routes) == len(cloudevent)
    for route in cloudevent:
        pushed = routes[f"projects/p/subscriptions/{topology.push_subscription_name(route, 't1-')}"]
        assert pushed.endpoint == wiring.push_endpoint(urls[route.target])
        assert pushed.concurrency == function_scale.requests_at_once(route.target)
        assert pushed.ack_deadline_s == topology.ack_deadline_s(route)


def test_the_pull_twin_is_the_push_subscription_but_for_its_endpoint():
    """The emulator keeps every policy of production's subscription; only the push config is gone."""
    route = next(r for r in topology.FUNCTIONS if r.topic == topology.SUBMIT)
    pushed = wiring.route_subscription(route, "p", "t1-", "http://127.0.0.1:1/")
    twin = wiring.pull_twin(pushed)
    assert "push_config" not in twin
    assert wiring.changed_fields(twin, pushed) == ["push_config"]
    assert pushed.push_config.push_endpoint == "http://127.0.0.1:1/"  # the original is untouched


def test_a_post_that_raises_hands_the_message_back_and_frees_its_slot():
    """A fault in the post itself is a failed push: nacked, and the slot is free again."""

    def broken(url: str, body: bytes, timeout_s: float) -> int | None:
        raise ValueError("no such URL")

    source = FakeSubscription()
    subject = pusher.SubscriptionPusher(ROUTE, source, broken)
    subject.slots.take()  # as `run` does before each post
    assert subject.deliver(pusher.Pulled("a", b"{}")) is False
    subject.verdicts.flush()
    assert source.nacked == ["a"]
    assert subject.slots.busy == 0
