"""Notifications among teams, at the edges: a post's total deadline against a receiver that trickles,
per-host lanes that keep a slow host from holding up others, targets posted side by side, team
keys, and webhook URLs shown by their host."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, suppress
from datetime import datetime, timezone

import pytest

from tpujobs.adapters.webhooks import HostLanes, HttpWebhookPoster
from tpujobs.domain.job import new_job
from tpujobs.domain.notify import hidden_webhooks, webhook_host, without_urls
from tpujobs.domain.notify_delivery import NotifyKeys, signing_team
from tpujobs.domain.spec import parse_spec
from tpujobs.engine.errors import TransientError
from tpujobs.engine.inbound import InboundMessage
from tpujobs.engine.notifications import Notifier, NotifySettings, ReceiverBusy
from tpujobs.local.fakes.notifications import (
    InMemoryDeliveryRecords,
    InMemoryNotifyConfig,
    InMemoryWebhookSecrets,
    RecordingPoster,
)

ANSWER = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
NOW = datetime(2026, 11, 27, 8, 0, tzinfo=timezone.utc)
MASTER = b"m" * 32


def loopback(host: str, port: int) -> list[str]:
    return ["127.0.0.1"]


@contextmanager
def receiver(answer: callable) -> Iterator[int]:  # type: ignore[valid-type]
    """A loopback TCP server that reads each request's head and hands the connection to `answer`."""
    server = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                connection, _ = server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=handle, args=(connection,), daemon=True).start()

    def handle(connection: socket.socket) -> None:
        with connection:
            data = b""
            while b"\r\n\r\n" not in data:
                chunk = connection.recv(4096)
                if not chunk:
                    return
                data += chunk
            with suppress(OSError):  # the poster hung up
                answer(connection)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield server.getsockname()[1]
    finally:
        stop.set()
        server.close()
        thread.join(timeout=5)


def trickle(connection: socket.socket) -> None:
    """A whole, valid answer, one byte every 0.1 s: several seconds for the 60 bytes."""
    for byte in ANSWER:
        connection.sendall(bytes([byte]))
        time.sleep(0.1)


def test_a_receiver_that_trickles_its_answer_is_cut_at_the_posts_deadline() -> None:
    """Every byte comes well within the per-read timeout, but the whole answer would take ~6 s:
    the post fails at its 1 s deadline (a passing failure, retried), instead of waiting it out."""
    with receiver(trickle) as port:
        poster = HttpWebhookPoster(allow_loopback=True, resolve=loopback, timeout_s=5.0, deadline_s=1.0)
        with pytest.raises(TransientError, match="did not answer within 1 s"):
            poster.post(f"http://slow.test:{port}/hook", {}, b"{}")


def test_the_deadline_is_at_most_ten_seconds_and_bounds_every_socket_operation() -> None:
    """The default post deadline is 10 s, and no per-operation timeout may exceed it."""
    poster = HttpWebhookPoster()
    assert poster.deadline_s <= 10.0
    assert HttpWebhookPoster(timeout_s=30.0, deadline_s=2.0).timeout_s == 2.0


def test_a_slow_hosts_full_lane_refuses_its_next_post_and_leaves_other_hosts_free() -> None:
    """With one post to slow.test in flight (its lane holds 1), a second post to it is not sent
    (ReceiverBusy), while a post to another host goes through at once."""
    arrived, release = threading.Event(), threading.Event()

    def hold(connection: socket.socket) -> None:
        arrived.set()
        release.wait(10)
        connection.sendall(ANSWER)

    def answer(connection: socket.socket) -> None:
        connection.sendall(ANSWER)

    with receiver(hold) as slow, receiver(answer) as fast:
        poster = HttpWebhookPoster(allow_loopback=True, resolve=loopback, lanes=HostLanes(per_host=1, wait_s=0))
        outcome: list[BaseException | None] = []

        def first() -> None:
            try:
                poster.post(f"http://slow.test:{slow}/a", {}, b"{}")
                outcome.append(None)
            except BaseException as error:  # the test reads it
                outcome.append(error)

        held = threading.Thread(target=first)
        held.start()
        assert arrived.wait(10), "the first post reached the slow receiver"
        with pytest.raises(ReceiverBusy):
            poster.post(f"http://slow.test:{slow}/b", {}, b"{}")
        poster.post(f"http://fast.test:{fast}/c", {}, b"{}")  # not held up
        release.set()
        held.join(10)
        assert outcome == [None]
        poster.post(f"http://slow.test:{slow}/b", {}, b"{}")  # the lane is free again


def a_job(**spec: object):
    data = {"job_id": "train-1", "name": "train", "owner": "ada@example.com", "accelerator_type": "v4-8"}
    job, _ = new_job(parse_spec({**data, "command": "python train.py", **spec}), "us-central2-b", NOW)
    return job


class Jobs:
    def __init__(self, job) -> None:  # type: ignore[no-untyped-def]
        self.job = job

    def get(self, job_id: str):  # type: ignore[no-untyped-def]
        return self.job if job_id == self.job.job_id else None


def status(state: str, seq: int = 3, from_state: str | None = "RUNNING") -> InboundMessage:
    payload = {"job_id": "train-1", "from_state": from_state, "to_state": state, "reason": "", "attempt": 1, "seq": seq}
    return InboundMessage(f"m{seq}", "tpujobs-status", json.dumps(payload).encode())


def notifier(job, poster, records: InMemoryDeliveryRecords | None = None) -> Notifier:  # type: ignore[no-untyped-def]
    settings = NotifySettings("proj", "", "vm@proj.iam.gserviceaccount.com", NotifyKeys.of(MASTER), "")
    return Notifier(
        Jobs(job), InMemoryNotifyConfig(), InMemoryWebhookSecrets(), poster, records or InMemoryDeliveryRecords(),
        settings, lambda: NOW,
    )  # fmt: skip


class WaitsForTheOther(RecordingPoster):
    """Posting to SLOW waits (at most 5 s) until FAST was posted: only side-by-side posts both deliver."""

    def __init__(self) -> None:
        super().__init__()
        self.fast_posted = threading.Event()

    def post(self, url: str, headers: Mapping[str, str], body: bytes) -> None:
        if url == SLOW_URL and not self.fast_posted.wait(5):
            raise TransientError("the webhook did not answer within 10 s")
        super().post(url, headers, body)
        if url == FAST_URL:
            self.fast_posted.set()


SLOW_URL, FAST_URL = "https://slow.example.com/hook", "https://fast.example.com/hook"


def test_a_jobs_targets_are_posted_side_by_side() -> None:
    """The first target's receiver is slow: the second is posted meanwhile, not after it."""
    job = a_job(notify=[{"webhook": SLOW_URL}, {"webhook": FAST_URL}])
    poster = WaitsForTheOther()
    notifier(job, poster).handle(status("SUCCEEDED"))
    assert sorted(post.url for post in poster.posts) == [FAST_URL, SLOW_URL]


class Busy(RecordingPoster):
    def post(self, url: str, headers: Mapping[str, str], body: bytes) -> None:
        raise ReceiverBusy("4 posts to the webhook's host are in flight")


def test_a_post_left_for_a_full_lane_is_owed_without_counting_as_a_try() -> None:
    """ReceiverBusy sent nothing: the handler raises (Pub/Sub redelivers) and no try is recorded."""
    job = a_job(notify=[{"webhook": SLOW_URL}])
    records = InMemoryDeliveryRecords()
    for _ in range(6):
        with pytest.raises(TransientError):
            notifier(job, Busy(), records).handle(status("SUCCEEDED"))
    assert records.records == {}
    poster = RecordingPoster()
    notifier(job, poster, records).handle(status("SUCCEEDED"))
    assert [post.url for post in poster.posts] == [SLOW_URL]
    assert records.records["train-1", "notify-0"].attempts == 1


def test_an_event_that_keeps_the_state_reaches_no_target() -> None:
    """RUNNING -> RUNNING (a label change, a note) posts nothing; QUEUED -> RUNNING posts once."""
    job = a_job(notify=[{"webhook": FAST_URL, "on": ["RUNNING"]}])
    poster = RecordingPoster()
    deliver = notifier(job, poster)
    deliver.handle(status("RUNNING", seq=3, from_state="PROVISIONING"))
    for seq in range(4, 12):
        deliver.handle(status("RUNNING", seq=seq, from_state="RUNNING"))
    assert len(poster.posts) == 1


def test_team_keys_differ_by_team_and_version_and_a_short_master_is_refused() -> None:
    """HMAC of the team under each master version: no two teams or versions share a key."""
    keys = NotifyKeys.of(MASTER, "2", b"p" * 32, "1")
    a, b = keys.team_key("owner:a@x.com"), keys.team_key("owner:b@x.com")
    assert len({a, b, keys.team_key("owner:a@x.com", "1")}) == 3
    assert [version for version, _ in keys.signing("owner:a@x.com")] == ["2", "1"]
    with pytest.raises(ValueError, match="at least 32 bytes"):
        NotifyKeys.of(b"short")


def test_a_claimed_owner_never_signs_under_the_real_owners_key() -> None:
    """A topic's unverified `owner` is `claimed:`; a service account names the team before any owner."""
    assert signing_team(None, "ada@x.com", owner_trusted=False) == "claimed:ada@x.com"
    assert signing_team(None, "ada@x.com", owner_trusted=True) == "owner:ada@x.com"
    assert signing_team("team-a@p.iam.gserviceaccount.com", "ada@x.com", owner_trusted=False) == (
        "account:team-a@p.iam.gserviceaccount.com"
    )


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("https://hooks.slack.com/services/T/B/X", "hooks.slack.com/\u2026"),
        ("https://chat.googleapis.com:8443/v1/spaces/S?key=K", "chat.googleapis.com:8443/\u2026"),
        ("http://127.0.0.1:9000/hook", "127.0.0.1:9000/\u2026"),
        ("not a url", "\u2026"),
        ("hooks.slack.com/\u2026", "hooks.slack.com/\u2026"),
    ],
)
def test_a_webhook_shows_by_its_host_only(url: str, shown: str) -> None:
    """The host (and port) stay; path, query and anything unparsable go."""
    assert webhook_host(url) == shown


def test_a_spec_and_a_sentence_lose_their_urls_and_keep_the_rest() -> None:
    """`hidden_webhooks` cuts each notify[].webhook, keeps secrets' names; `without_urls` cuts URLs in text."""
    spec = {"name": "x", "notify": [{"webhook": "https://h.example.com/p/q"}, {"webhook_secret": "slack"}]}
    assert hidden_webhooks(spec) == {
        "name": "x",
        "notify": [{"webhook": "h.example.com/\u2026"}, {"webhook_secret": "slack"}],
    }
    assert spec["notify"][0]["webhook"] == "https://h.example.com/p/q", "the original is left as it was"
    assert without_urls("posting to https://h.example.com/p?t=1 failed") == "posting to h.example.com/\u2026 failed"


def test_the_notify_key_verb_asks_the_api_for_the_callers_team_key(monkeypatch) -> None:
    """`tpujobs notify-key --service-account A` posts `notify-key` with it and prints the key,
    and the previous version's while a rotation lasts."""
    from typer.testing import CliRunner

    from tpujobs.cli import app
    from tpujobs.cli import notifications as verb

    asked: list[dict[str, object]] = []

    def ask(config, url, request, who, missing_ok=False):  # type: ignore[no-untyped-def]
        asked.append(request)
        previous = [{"key_version": "1", "key": "b" * 64}]
        return {"team": "account:a@p", "key_version": "2", "key": "a" * 64, "previous": previous}

    monkeypatch.setattr(verb, "ask_api", ask)
    monkeypatch.setenv("TPUJOBS_API_URL", "https://jobs.example.com")
    monkeypatch.setenv("GOOGLE_CLOUD_PROJECT", "proj")
    result = CliRunner().invoke(app, ["notify-key", "--service-account", "a@p"])
    assert result.exit_code == 0, result.output
    assert asked == [{"action": "notify-key", "service_account": "a@p"}]
    assert "a" * 64 in result.output and "b" * 64 in result.output and "account:a@p" in result.output
