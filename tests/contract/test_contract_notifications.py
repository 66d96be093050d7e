"""The contracts of the notifier's ports (`notifications.DeliveryRecords`, `notifications.NotifyConfig`,
`notifications.WebhookSecrets`, `notifications.WebhookPoster`): each fake of
`tpujobs.local.fakes.notifications` and its adapter answer alike. The records and the team
defaults on the Firestore emulator; the secrets through the real Secret Manager client on the
local Secret Manager; the poster's http.client post to a receiver on loopback.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

import pytest
from contract_data import T0

from tpujobs.domain.notify import NotifyTarget, team_defaults
from tpujobs.engine.errors import PermanentError, TransientError
from tpujobs.engine.notifications import DeliveryRecord
from tpujobs.local.fakes.notifications import (
    InMemoryDeliveryRecords,
    InMemoryNotifyConfig,
    InMemoryWebhookSecrets,
    RecordingPoster,
)

PROJECT = "tpujobs-test"

# -- DeliveryRecords -----------------------------------------------------------------------------


@pytest.fixture(params=["memory", pytest.param("firestore", marks=pytest.mark.emulator)])
def records(request: pytest.FixtureRequest) -> Any:
    if request.param == "memory":
        return InMemoryDeliveryRecords()
    from tpujobs.adapters.firestore_notifications import FirestoreDeliveryRecords

    return FirestoreDeliveryRecords(request.getfixturevalue("firestore_client"))


def test_a_record_reads_back_as_written_one_per_job_and_target(records):
    """Every field round-trips (times as written); another key or job is its own record; none is None."""
    failed = DeliveryRecord("webhook_secret slack").after_failure("j-1/4", "FAILED", "answered 503", T0, final=False)
    records.write("j-1", "notify-0", failed)
    delivered = failed.after_success("j-1/4", "FAILED", T0 + timedelta(seconds=30))
    records.write("j-1", "notify-0", delivered)
    records.write("j-1", "team-0", DeliveryRecord("webhook"))
    assert records.read("j-1", "notify-0") == delivered
    assert records.read("j-1", "team-0") == DeliveryRecord("webhook")
    assert records.read("j-1", "notify-1") is None and records.read("j-2", "notify-0") is None


# -- NotifyConfig --------------------------------------------------------------------------------

Documents = Mapping[str, Mapping[str, Any]]


@pytest.fixture(params=["memory", pytest.param("firestore", marks=pytest.mark.emulator)])
def config(request: pytest.FixtureRequest) -> Callable[[Documents], Any]:
    """`config(documents)`: the NotifyConfig a notifier reads once admins wrote `documents` in `config`."""
    if request.param == "memory":
        return InMemoryNotifyConfig.from_documents
    from tpujobs.adapters.firestore_notifications import FirestoreNotifyConfig

    client = request.getfixturevalue("firestore_client")

    def written(documents: Documents) -> Any:
        for name, fields in documents.items():
            client.collection("config").document(name).set(dict(fields))
        return FirestoreNotifyConfig(client)

    return written


def test_nothing_written_gives_no_defaults(config):
    """No config/notify: no owner or group has default targets."""
    assert dict(config({}).notify_defaults()) == {}


def test_an_owner_gets_its_own_and_its_groups_defaults_and_a_bad_entry_none(config):
    """config/notify by owner and by `group:NAME` (config/groups says who is in it); an entry that
    does not validate is left out whole, so a typo sends nothing anywhere."""
    slack = {"webhook_secret": "slack", "on": ["FAILED"]}
    reader = config(
        {
            "groups": {"ml": ["ada@example.com"]},
            "notify": {
                "group:ml": [slack],
                "ada@example.com": [{"webhook": "https://hooks.example.com/ada"}],
                "bob@example.com": [{"webhook": "http://x.example.com"}],  # plain http: refused
                "carol@example.com": "https://hooks.example.com/carol",  # not a list
            },
        }
    )
    defaults = reader.notify_defaults()
    assert sorted(defaults) == ["ada@example.com", "group:ml"]
    members = reader.policies().members("ada@example.com")
    assert sorted(team_defaults(defaults, members), key=repr) == sorted(
        [NotifyTarget(webhook="https://hooks.example.com/ada"), NotifyTarget(webhook_secret="slack", on=["FAILED"])],
        key=repr,
    )


# -- WebhookSecrets ------------------------------------------------------------------------------


@dataclass
class Secrets:
    """A WebhookSecrets, and how a test stores a secret's text (the version's name back)."""

    port: Any
    store: Callable[[str, bytes], str]


@pytest.fixture(params=["memory", "secret-manager"])
def secrets(request: pytest.FixtureRequest) -> Iterator[Secrets]:
    if request.param == "memory":
        fake = InMemoryWebhookSecrets()

        def keep(secret: str, data: bytes) -> str:
            name = f"projects/{PROJECT}/secrets/{secret}/versions/1"
            fake.urls[name] = data.decode("utf-8")
            return name

        yield Secrets(fake, keep)
        return
    import google_crc32c

    from tpujobs.adapters.secrets import build_client
    from tpujobs.adapters.webhook_secrets import SecretManagerWebhooks
    from tpujobs.local.simulator.secret_manager import SecretManagerServer

    with SecretManagerServer() as server:
        client = build_client(server.url)

        def add(secret: str, data: bytes) -> str:
            made = client.create_secret(
                parent=f"projects/{PROJECT}", secret_id=secret, secret={"replication": {"automatic": {}}}
            )
            payload = {"data": data, "data_crc32c": int(google_crc32c.value(data))}
            return str(client.add_secret_version(parent=made.name, payload=payload).name)

        yield Secrets(SecretManagerWebhooks(client), add)


def test_a_secret_webhook_is_its_text_stripped(secrets):
    """The URL a version holds, without the newline `echo` leaves."""
    version = secrets.store("notify-slack", b"https://hooks.example.com/T0/B0/token\n")
    assert secrets.port.webhook_url(version) == "https://hooks.example.com/T0/B0/token"


def test_a_missing_or_oversized_secret_is_refused_for_good(secrets):
    """No such version, or more than 4 KiB: PermanentError, and the error never holds the value."""
    with pytest.raises(PermanentError):
        secrets.port.webhook_url(f"projects/{PROJECT}/secrets/notify-none/versions/1")
    version = secrets.store("notify-big", b"https://hooks.example.com/" + b"x" * 4096)
    with pytest.raises(PermanentError, match="more than 4096 bytes") as refused:
        secrets.port.webhook_url(version)
    assert "xxxx" not in str(refused.value)


# -- WebhookPoster -------------------------------------------------------------------------------


@dataclass
class Receiver:
    """A WebhookPoster, a receiver's URL for a path, the statuses it answers there (one a post),
    and what it received: (path, headers, body)."""

    port: Any
    url: Callable[[str], str]
    answer: Callable[[str, list[int]], None]
    received: Callable[[], list[tuple[str, dict[str, str], bytes]]]


class LoopbackReceiver:
    """An http server on loopback that keeps each post and answers the status queued for its path (200)."""

    def __init__(self) -> None:
        self.posts: list[tuple[str, dict[str, str], bytes]] = []
        self.statuses: dict[str, list[int]] = {}
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                receiver.posts.append((self.path, dict(self.headers.items()), body))
                queued = receiver.statuses.get(self.path)
                self.send_response(queued.pop(0) if queued else 200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(params=["memory", "http"])
def receiver(request: pytest.FixtureRequest) -> Iterator[Receiver]:
    if request.param == "memory":
        fake = RecordingPoster()
        base = "http://127.0.0.1:8080"
        yield Receiver(
            fake,
            lambda path: base + path,
            lambda path, statuses: fake.answers.__setitem__(base + path, statuses),
            lambda: [(urlsplit(post.url).path, dict(post.headers), post.body) for post in fake.posts],
        )
        return
    from tpujobs.adapters.webhooks import HttpWebhookPoster

    loopback = LoopbackReceiver()
    base = f"http://127.0.0.1:{loopback.server.server_port}"
    try:
        yield Receiver(
            HttpWebhookPoster(allow_loopback=True),
            lambda path: base + path,
            loopback.statuses.__setitem__,
            lambda: list(loopback.posts),
        )
    finally:
        loopback.close()


def test_a_post_reaches_the_receiver_with_its_headers_and_body(receiver):
    """The body as given, every header given (names as sent), at the URL's path; a 2xx is delivered."""
    signed = {"Content-Type": "application/json", "X-Tpujobs-Signature": "v1=abc"}
    receiver.answer("/hooks/a", [204])
    receiver.port.post(receiver.url("/hooks/a"), signed, b'{"job_id": "train-1"}')
    [(path, headers, body)] = receiver.received()
    assert (path, body) == ("/hooks/a", b'{"job_id": "train-1"}')
    assert {name: headers.get(name) for name in signed} == signed


@pytest.mark.parametrize(
    ("status", "error"),
    [(500, TransientError), (503, TransientError), (408, TransientError), (429, TransientError),
     (404, PermanentError), (400, PermanentError), (301, PermanentError)],
)  # fmt: skip
def test_an_answer_other_than_2xx_is_judged_by_whether_a_retry_can_help(receiver, status, error):
    """5xx, 408 and 429 may pass (TransientError); a redirect or another 4xx is final; the post arrived."""
    receiver.answer("/hooks/b", [status])
    with pytest.raises(error, match=str(status)):
        receiver.port.post(receiver.url("/hooks/b"), {}, b"{}")
    assert [path for path, _, _ in receiver.received()] == ["/hooks/b"]


@pytest.mark.parametrize(
    "url", ["ftp://127.0.0.1/hook", "http://user:pw@127.0.0.1/hook", "http://127.0.0.1:0/hook", "https:///hook"]
)
def test_a_url_refused_by_its_form_sends_nothing(receiver, url):
    """Not http(s), a credential in it, port 0, no host: PermanentError before any connection."""
    with pytest.raises(PermanentError):
        receiver.port.post(url, {}, b"{}")
    assert receiver.received() == []
