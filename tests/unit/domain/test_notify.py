"""Notify targets in a spec, what a post holds, and where a post may go (SSRF)."""

from __future__ import annotations

import http.server
import ipaddress
import threading
from collections.abc import Iterator
from typing import ClassVar

import pytest

from tpujobs.adapters.firestore_notifications import defaults_from_document
from tpujobs.adapters.webhooks import HttpWebhookPoster
from tpujobs.domain.notify import EVERY_END_STATE, NotifyTarget, team_defaults, wanted
from tpujobs.domain.notify_delivery import Notice, address_refusal, signature
from tpujobs.domain.spec import SpecError, parse_spec
from tpujobs.engine.errors import PermanentError, TransientError

BASE = {"job_id": "train-1", "name": "train", "owner": "ada@example.com", "accelerator_type": "v4-8", "command": "x"}


def spec_error(notify: object) -> str:
    with pytest.raises(SpecError) as caught:
        parse_spec({**BASE, "notify": notify})
    return str(caught.value)


def test_a_spec_keeps_its_targets_and_on_defaults_to_every_end_state() -> None:
    """Both kinds of target validate; without `on` a target wants SUCCEEDED, FAILED and CANCELLED."""
    spec = parse_spec(
        {**BASE, "notify": [{"webhook": "https://hooks.example.com/x", "on": ["RUNNING"]}, {"webhook_secret": "slack"}]}
    )
    assert spec.notify is not None
    assert spec.notify[0].states() == {"RUNNING"}
    assert spec.notify[1].states() == set(EVERY_END_STATE) == {"SUCCEEDED", "FAILED", "CANCELLED"}
    assert parse_spec(BASE).notify is None


@pytest.mark.parametrize(
    ("notify", "says"),
    [
        ([{"webhook": "http://hooks.example.com/x"}], "notify.0.webhook: webhook must be https://"),
        ([{"webhook": "https://user:pw@hooks.example.com/"}], "must not hold a user or password"),
        ([{"webhook": "hooks.example.com"}], "must be an https:// URL with a host"),
        ([{"webhook": "https://a.example.com/ x"}], "space or a control character"),
        ([{"webhook_secret": "projects/p/secrets/s"}], "notify.0.webhook_secret: secret name"),
        ([{"webhook": "https://a.example.com", "webhook_secret": "slack"}], "exactly one of webhook"),
        ([{}], "exactly one of webhook"),
        ([{"webhook_secret": "slack", "on": ["DONE"]}], "'DONE' is not a job state"),
        ([{"webhook_secret": "slack", "on": ["FAILED", "FAILED"]}], "on names a state twice"),
        ([{"webhook_secret": "slack", "on": []}], "notify.0.on"),
        ([{"webhook_secret": "slack", "url": "x"}], "notify.0.url"),
        ([{"webhook_secret": f"s{i}"} for i in range(9)], "notify"),
    ],
)
def test_a_bad_target_is_a_clear_rejection(notify: object, says: str) -> None:
    """Each mistake is refused with a sentence that names the target and the field."""
    assert says in spec_error(notify)


def test_wanted_keys_name_the_list_and_index_never_the_url() -> None:
    """Keys are `notify-N` / `team-N`, for the targets whose states hold the change."""
    targets = [
        NotifyTarget(webhook="https://a.example.com/secret-token"),
        NotifyTarget(webhook_secret="s", on=["RUNNING"]),
    ]
    assert [key for key, _ in wanted(targets, "RUNNING", "notify")] == ["notify-1"]
    assert [key for key, _ in wanted(targets, "FAILED", "team")] == ["team-0"]
    assert targets[0].label() == "webhook" and "token" not in targets[0].label()


def test_team_defaults_gather_the_owners_and_its_groups_once_each() -> None:
    """A target configured for the owner and for its group is used once."""
    hook = NotifyTarget(webhook_secret="slack")
    config = {"ada@example.com": [hook], "group:ml": [hook, NotifyTarget(webhook_secret="chat")], "group:x": [hook]}
    assert team_defaults(config, {"ada@example.com", "group:ml"}) == [hook, NotifyTarget(webhook_secret="chat")]
    assert team_defaults(config, {"bob@example.com"}) == []


def test_config_notify_leaves_out_entries_that_do_not_validate() -> None:
    """A typo in config/notify drops that entry (logged), never sends elsewhere."""
    found = defaults_from_document(
        {"group:ml": [{"webhook_secret": "slack"}], "bob@example.com": [{"webhook": "http://x.example.com"}], "c": "x"}
    )
    assert found == {"group:ml": [NotifyTarget(webhook_secret="slack")]}


def test_the_signature_is_hmac_sha256_over_timestamp_dot_body() -> None:
    """A receiver can check it with the standard library alone (the documented recipe)."""
    import hashlib
    import hmac

    body = Notice("train-1", "SUCCEEDED", "", 1, 4).body()
    expected = hmac.new(b"k", b"1700000000." + body, hashlib.sha256).hexdigest()
    assert signature(b"k", "1700000000", body) == f"sha256={expected}"
    assert b'"text":"tpujobs job train-1 is SUCCEEDED (attempt 1)"' in body


@pytest.mark.parametrize(
    "address",
    [
        "127.0.0.1",
        "169.254.169.254",  # the metadata server
        "10.1.2.3",
        "172.16.0.1",
        "192.168.1.1",
        "100.64.0.1",  # carrier-grade NAT
        "0.0.0.0",
        "224.0.0.1",
        "240.0.0.1",
        "::1",
        "fe80::1",
        "fd00::1",
        "ff02::1",
        "::ffff:127.0.0.1",
        "::ffff:169.254.169.254",
    ],
)
def test_non_public_addresses_are_refused(address: str) -> None:
    """Loopback, private, link-local, multicast, reserved and mapped forms of them: refused."""
    assert address_refusal(ipaddress.ip_address(address)) is not None


def test_public_addresses_pass_and_loopback_only_when_allowed() -> None:
    """A public address passes; loopback passes only on the local stack, never the metadata server."""
    assert address_refusal(ipaddress.ip_address("8.8.8.8")) is None
    assert address_refusal(ipaddress.ip_address("2001:4860:4860::8888")) is None
    assert address_refusal(ipaddress.ip_address("127.0.0.1"), allow_loopback=True) is None
    assert address_refusal(ipaddress.ip_address("169.254.169.254"), allow_loopback=True) is not None


def resolving(*addresses: str):
    return lambda host, port: list(addresses)


@pytest.mark.parametrize("address", ["127.0.0.1", "169.254.169.254", "10.0.0.5"])
def test_a_host_name_that_resolves_to_a_refused_address_is_never_connected_to(address: str) -> None:
    """hooks.example.com -> 127.0.0.1 / the metadata server / a private address: PermanentError
    naming no URL, before any connection."""
    poster = HttpWebhookPoster(resolve=resolving(address))
    with pytest.raises(PermanentError) as caught:
        poster.post("https://hooks.example.com/T000/B000/secret", {}, b"{}")
    assert "refused" in str(caught.value) and "secret" not in str(caught.value)


def test_one_refused_address_among_public_ones_refuses_the_host() -> None:
    """A name that also resolves to a private address is refused, whichever would be picked."""
    poster = HttpWebhookPoster(resolve=resolving("8.8.8.8", "10.0.0.1"))
    with pytest.raises(PermanentError):
        poster.post("https://hooks.example.com/x", {}, b"{}")


def test_plain_http_is_refused_outside_the_local_stack() -> None:
    poster = HttpWebhookPoster(resolve=resolving("8.8.8.8"))
    with pytest.raises(PermanentError, match="https"):
        poster.post("http://hooks.example.com/x", {}, b"{}")


@pytest.mark.parametrize(
    ("url", "says"),
    [("https://user:pw@hooks.example.com/x", "user or password"), ("https://hooks.example.com/a b", "space")],
)
def test_a_url_from_a_secret_is_held_to_the_specs_rules_before_any_lookup(url: str, says: str) -> None:
    """A webhook_secret's URL is never checked at submit: the poster refuses it the same way, resolving nothing."""
    looked_up: list[str] = []
    poster = HttpWebhookPoster(resolve=lambda host, port: looked_up.append(host) or ["8.8.8.8"])
    with pytest.raises(PermanentError, match=says) as caught:
        poster.post(url, {}, b"{}")
    assert looked_up == []
    assert "pw@" not in str(caught.value)


class _Receiver(http.server.BaseHTTPRequestHandler):
    answers: ClassVar[list[int]] = []
    seen: ClassVar[list[tuple[str, str, bytes]]] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.seen.append((self.path, self.headers["Host"], body))
        status = self.answers.pop(0)
        self.send_response(status)
        if 300 <= status < 400:
            self.send_header("Location", "http://169.254.169.254/computeMetadata/v1/")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def receiver() -> Iterator[tuple[int, type[_Receiver]]]:
    handler = type("Receiver", (_Receiver,), {"answers": [], "seen": []})
    server = http.server.HTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1], handler
    server.shutdown()
    server.server_close()


def test_the_post_goes_to_the_checked_address_and_a_redirect_is_not_followed(receiver) -> None:
    """On the local stack a name resolved to loopback is posted there (the Host header kept); a
    302 to the metadata server is a permanent failure, not followed; a 500 is worth a retry."""
    port, handler = receiver
    handler.answers.extend([204, 302, 500])
    poster = HttpWebhookPoster(allow_loopback=True, resolve=resolving("127.0.0.1"))
    url = f"http://receiver.test:{port}/hook?x=1"
    poster.post(url, {"X-Test": "1"}, b'{"a":1}')
    assert handler.seen == [("/hook?x=1", f"receiver.test:{port}", b'{"a":1}')]
    with pytest.raises(PermanentError, match="redirects are not followed"):
        poster.post(url, {}, b"{}")
    with pytest.raises(TransientError, match="500"):
        poster.post(url, {}, b"{}")
    assert len(handler.seen) == 3, "the redirect's target was never asked"


def test_a_closed_port_is_a_passing_failure() -> None:
    """Connection refused: TransientError (Pub/Sub redelivers), with no URL in the message."""
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    poster = HttpWebhookPoster(allow_loopback=True, resolve=resolving("127.0.0.1"), timeout_s=2.0)
    with pytest.raises(TransientError) as caught:
        poster.post(f"http://receiver.test:{port}/secret-path", {}, b"{}")
    assert "secret-path" not in str(caught.value)


def test_describe_shows_each_targets_outcome_without_its_url() -> None:
    """`tpujobs describe`: a delivered target and one given up, with its error; nothing when no record."""
    from tpujobs.cli.notifications import notification_lines

    answer = {
        "notifications": [
            {"id": "notify-0", "target": "webhook", "event": "j/4", "state": "SUCCEEDED", "delivered": ["j/4"]},
            {
                "id": "notify-1",
                "target": "webhook_secret slack",
                "event": "j/4",
                "state": "SUCCEEDED",
                "attempts": 1,
                "gave_up": True,
                "last_error": "the webhook answered 404",
            },
        ]
    }
    lines = notification_lines(answer)
    assert lines[1] == "  notify-0 (webhook): SUCCEEDED j/4: delivered"
    assert (
        lines[2]
        == "  notify-1 (webhook_secret slack): SUCCEEDED j/4: failed 1 tries (given up): the webhook answered 404"
    )
    assert notification_lines({"notifications": []}) == []
