"""In-memory stand-ins for the notifier's ports: records, team defaults, webhook secrets, and a
poster that keeps what it was asked to send (or fails as told)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from tpujobs.domain.access import AccessPolicies
from tpujobs.domain.notify import NotifyTarget
from tpujobs.engine.errors import PermanentError
from tpujobs.engine.notifications import DeliveryRecord


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

    def notify_defaults(self) -> Mapping[str, Sequence[NotifyTarget]]:
        return self.defaults

    def policies(self) -> AccessPolicies:
        return self.access


@dataclass
class InMemoryWebhookSecrets:
    """WebhookSecrets from a dict of version name -> URL; an unknown version is PermanentError, as NOT_FOUND."""

    urls: dict[str, str] = field(default_factory=dict)
    read_versions: list[str] = field(default_factory=list)

    def webhook_url(self, version_name: str) -> str:
        self.read_versions.append(version_name)
        if version_name not in self.urls:
            raise PermanentError(f"Secret Manager: {version_name} not found")
        return self.urls[version_name]


@dataclass(frozen=True)
class Post:
    url: str
    headers: Mapping[str, str]
    body: bytes


@dataclass
class RecordingPoster:
    """WebhookPoster that keeps each post; `failures` (URL -> errors) are raised first, one per post."""

    posts: list[Post] = field(default_factory=list)
    failures: dict[str, list[Exception]] = field(default_factory=dict)

    def post(self, url: str, headers: Mapping[str, str], body: bytes) -> None:
        pending = self.failures.get(url)
        if pending:
            raise pending.pop(0)
        self.posts.append(Post(url, dict(headers), body))
