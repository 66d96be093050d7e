"""In-memory stand-ins for the notifier's ports: records, team defaults, webhook secrets, and a
poster that keeps what it was asked to send (or fails as told). tests/contract/test_contract_notifications.py
holds them to their adapters (Firestore, the local Secret Manager, http.client to a loopback receiver)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tpujobs.adapters.firestore_config import policies_from_documents
from tpujobs.adapters.firestore_notifications import defaults_from_document
from tpujobs.domain.access import AccessPolicies
from tpujobs.domain.notify import NotifyTarget, check_webhook_url
from tpujobs.engine.errors import PermanentError, TransientError
from tpujobs.engine.notifications import DeliveryRecord

MAX_URL_BYTES = 4096  # what a secret may hold to be read as a webhook URL (adapters.webhook_secrets)


class InMemoryDeliveryRecords:
    """DeliveryRecords in a dict keyed by (job id, target key)."""

    def __init__(self) -> None:
        self.records: dict[tuple[str, str], DeliveryRecord] = {}

    def read(self, job_id: str, key: str) -> DeliveryRecord | None:
        return self.records.get((job_id, key))

    def write(self, job_id: str, key: str, record: DeliveryRecord) -> None:
        self.records[job_id, key] = record


@dataclass
class InMemoryNotifyConfig:
    """NotifyConfig from given defaults and policies (config/notify, config/groups)."""

    defaults: Mapping[str, Sequence[NotifyTarget]] = field(default_factory=dict)
    access: AccessPolicies = field(default_factory=AccessPolicies)

    @classmethod
    def from_documents(cls, documents: Mapping[str, Mapping[str, Any]]) -> InMemoryNotifyConfig:
        """As admins wrote `config/notify` and the access documents (`config/groups`, ...), read by
        the adapter's own rules: an entry that fails validation is left out."""
        notify = defaults_from_document(documents.get("notify", {}))
        return cls(notify, policies_from_documents(documents))

    def notify_defaults(self) -> Mapping[str, Sequence[NotifyTarget]]:
        return self.defaults

    def policies(self) -> AccessPolicies:
        return self.access


@dataclass
class InMemoryWebhookSecrets:
    """WebhookSecrets from a dict of version name -> the secret's text; an unknown version is
    PermanentError, as NOT_FOUND; like the adapter, the URL is the text stripped, and a secret
    over MAX_URL_BYTES is no URL."""

    urls: dict[str, str] = field(default_factory=dict)
    read_versions: list[str] = field(default_factory=list)

    def webhook_url(self, version_name: str) -> str:
        self.read_versions.append(version_name)
        if version_name not in self.urls:
            raise PermanentError(f"Secret Manager: {version_name} not found")
        text = self.urls[version_name]
        if len(text.encode("utf-8")) > MAX_URL_BYTES:
            raise PermanentError(f"{version_name} holds more than {MAX_URL_BYTES} bytes: not a webhook URL")
        return text.strip()


@dataclass(frozen=True)
class Post:
    url: str
    headers: Mapping[str, str]
    body: bytes


@dataclass
class RecordingPoster:
    """WebhookPoster that keeps each post. `failures` (URL -> errors) are raised first, one per
    post, and nothing is sent (the receiver was never reached); `answers` (URL -> HTTP statuses)
    are the receiver's, one per post, judged as the adapter judges them. A URL the adapter refuses
    by its form (`domain.notify.check_webhook_url`) is PermanentError, and nothing is sent."""

    posts: list[Post] = field(default_factory=list)
    failures: dict[str, list[Exception]] = field(default_factory=dict)
    answers: dict[str, list[int]] = field(default_factory=dict)

    def post(self, url: str, headers: Mapping[str, str], body: bytes) -> None:
        try:
            check_webhook_url(url)
        except ValueError as error:
            raise PermanentError(f"the {error}") from None
        pending = self.failures.get(url)
        if pending:
            raise pending.pop(0)
        self.posts.append(Post(url, dict(headers), body))
        answers = self.answers.get(url)
        if answers:
            judge(answers.pop(0))


def judge(status: int) -> None:
    """As `adapters.webhooks` judges an answer: 2xx delivered; a redirect, or a 4xx other than 408
    and 429, final; the rest may pass."""
    if 200 <= status < 300:
        return
    if 300 <= status < 400:
        raise PermanentError(f"the webhook answered {status}: redirects are not followed")
    if status in (408, 429) or status >= 500:
        raise TransientError(f"the webhook answered {status}")
    raise PermanentError(f"the webhook answered {status}")
