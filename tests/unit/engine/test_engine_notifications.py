"""The notifier on in-memory ports: who a change reaches, what is sent, retries and records."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Any

import pytest

from tpujobs.domain.access import AccessPolicies
from tpujobs.domain.job import Job, new_job
from tpujobs.domain.notify import NotifyTarget, webhook_secret_version
from tpujobs.domain.notify_delivery import DELIVERY_HEADER, SIGNATURE_HEADER, TIMESTAMP_HEADER, NotifyKeys, verify
from tpujobs.domain.spec import parse_spec
from tpujobs.engine.errors import PermanentError, TransientError
from tpujobs.engine.inbound import InboundMessage
from tpujobs.engine.notifications import MAX_ATTEMPTS, Notifier, NotifySettings
from tpujobs.local.fakes.notifications import (
    InMemoryDeliveryRecords,
    InMemoryNotifyConfig,
    InMemoryWebhookSecrets,
    RecordingPoster,
)

NOW = datetime(2026, 11, 27, 8, 0, tzinfo=timezone.utc)
MASTER = NotifyKeys.of(b"notify-master-key-of-32-bytes-at-least")
KEY = MASTER.team_key("claimed:ada@example.com")  # the team key of a_job()'s (unverified) owner
HOOK = "https://hooks.example.com/a"
OTHER = "https://hooks.example.com/b"
VM_ACCOUNT = "tpujobs-tpu-vm@proj.iam.gserviceaccount.com"


class Jobs:
    def __init__(self, *jobs: Job) -> None:
        self.jobs = {job.job_id: job for job in jobs}

    def get(self, job_id: str) -> Job | None:
        return self.jobs.get(job_id)


def a_job(**spec: Any) -> Job:
    data = {"job_id": "train-1", "name": "train", "owner": "ada@example.com", "accelerator_type": "v4-8"}
    job, _ = new_job(parse_spec({**data, "command": "python train.py", **spec}), "us-central2-b", NOW)
    return job


def status(state: str, seq: int = 3, job_id: str = "train-1", reason: str = "every worker exited 0") -> InboundMessage:
    payload = {"job_id": job_id, "to_state": state, "reason": reason, "attempt": 1, "seq": seq, "owner": "x"}
    return InboundMessage(f"m{seq}", "tpujobs-status", json.dumps(payload).encode())


class Harness:
    def __init__(
        self, job: Job, *, config: InMemoryNotifyConfig | None = None, key: NotifyKeys | None = MASTER
    ) -> None:
        self.records = InMemoryDeliveryRecords()
        self.poster = RecordingPoster()
        self.secrets = InMemoryWebhookSecrets()
        settings = NotifySettings("proj", "", VM_ACCOUNT, key, "https://dash.example.com")
        self.notifier = Notifier(
            Jobs(job), config or InMemoryNotifyConfig(), self.secrets, self.poster, self.records, settings, lambda: NOW
        )

    def urls(self) -> list[str]:
        return [post.url for post in self.poster.posts]


def test_a_state_reaches_only_the_targets_that_want_it() -> None:
    """RUNNING goes to the target that lists it; the one without `on` hears only end states."""
    job = a_job(notify=[{"webhook": HOOK, "on": ["RUNNING", "SUCCEEDED"]}, {"webhook": OTHER}])
    harness = Harness(job)
    harness.notifier.handle(status("RUNNING", seq=2))
    assert harness.urls() == [HOOK]
    harness.notifier.handle(status("SUCCEEDED", seq=5))
    assert harness.urls() == [HOOK, HOOK, OTHER]


def test_the_body_is_chat_text_plus_fields_and_the_signature_verifies() -> None:
    """`text` for Slack and Chat, the structured fields, the dashboard link; signed over timestamp and body."""
    harness = Harness(a_job(notify=[{"webhook": HOOK}]))
    harness.notifier.handle(status("SUCCEEDED", seq=7))
    [post] = harness.poster.posts
    body = json.loads(post.body)
    assert body["job_id"] == "train-1" and body["state"] == "SUCCEEDED" and body["attempt"] == 1
    assert body["reason"] == "every worker exited 0"
    assert body["link"] == "https://dash.example.com/jobs/train-1"
    assert "train-1" in body["text"] and "SUCCEEDED" in body["text"]
    assert post.headers[TIMESTAMP_HEADER] == str(int(NOW.timestamp()))
    assert post.headers[DELIVERY_HEADER] == "train-1/7"
    assert verify(KEY, post.headers[TIMESTAMP_HEADER], post.body, post.headers[SIGNATURE_HEADER])
    assert not verify(b"another key", post.headers[TIMESTAMP_HEADER], post.body, post.headers[SIGNATURE_HEADER])
    assert not verify(KEY, "1", post.body, post.headers[SIGNATURE_HEADER])


def test_a_redelivery_after_success_sends_nothing_again() -> None:
    """The same event delivered twice posts once; the next event posts again."""
    harness = Harness(a_job(notify=[{"webhook": HOOK}]))
    harness.notifier.handle(status("FAILED", seq=4))
    harness.notifier.handle(status("FAILED", seq=4))
    assert len(harness.poster.posts) == 1
    harness.notifier.handle(status("FAILED", seq=9))
    assert len(harness.poster.posts) == 2


def test_a_passing_failure_is_retried_by_redelivery_and_only_for_the_target_owed() -> None:
    """One target fails with a 503: the handler raises (Pub/Sub redelivers), the other target is
    not posted twice, and the retry delivers; the record shows the tries and clears the error."""
    harness = Harness(a_job(notify=[{"webhook": HOOK}, {"webhook": OTHER}]))
    harness.poster.failures[OTHER] = [TransientError("the webhook answered 503")]
    with pytest.raises(TransientError):
        harness.notifier.handle(status("SUCCEEDED"))
    failed = harness.records.records["train-1", "notify-1"]
    assert (failed.attempts, failed.gave_up, failed.last_error) == (1, False, "the webhook answered 503")
    harness.notifier.handle(status("SUCCEEDED"))
    assert harness.urls() == [HOOK, OTHER]
    done = harness.records.records["train-1", "notify-1"]
    assert (done.attempts, done.last_error, done.delivered) == (2, "", ("train-1/3",))


def test_a_target_that_keeps_failing_is_given_up_and_recorded_without_raising() -> None:
    """After MAX_ATTEMPTS tries the event is acknowledged, before the subscription dead-letters it."""
    harness = Harness(a_job(notify=[{"webhook": HOOK}]))
    harness.poster.failures[HOOK] = [TransientError("timed out") for _ in range(10)]
    for _ in range(MAX_ATTEMPTS - 1):
        with pytest.raises(TransientError):
            harness.notifier.handle(status("FAILED"))
    harness.notifier.handle(status("FAILED"))  # the last try: recorded, acknowledged
    record = harness.records.records["train-1", "notify-0"]
    assert (record.attempts, record.gave_up, record.event, record.state) == (MAX_ATTEMPTS, True, "train-1/3", "FAILED")
    harness.notifier.handle(status("FAILED"))
    assert len(harness.poster.failures[HOOK]) == 10 - MAX_ATTEMPTS, "a given-up event is not tried again"


def test_a_permanent_failure_is_recorded_once_and_never_retried() -> None:
    """A 404 (or a refused address) is final at once; the record names the target, never its URL."""
    harness = Harness(a_job(notify=[{"webhook": HOOK}]))
    harness.poster.failures[HOOK] = [PermanentError("the webhook answered 404")]
    harness.notifier.handle(status("SUCCEEDED"))
    record = harness.records.records["train-1", "notify-0"]
    assert (record.gave_up, record.attempts, record.target) == (True, 1, "webhook")
    assert HOOK not in str(record)


def test_a_webhook_secret_is_read_in_the_namespace_of_the_jobs_own_account() -> None:
    """`webhook_secret: slack` of a job running as team-a reads team-a's `notify-slack`, no other."""
    team_a = "team-a@proj.iam.gserviceaccount.com"
    harness = Harness(a_job(service_account=team_a, notify=[{"webhook_secret": "slack"}]))
    version = webhook_secret_version("slack", "proj", "", team_a)
    assert version == "projects/proj/secrets/tpujobs_team-a_notify-slack/versions/latest"
    harness.secrets.urls[version] = HOOK
    harness.notifier.handle(status("SUCCEEDED"))
    assert harness.secrets.read_versions == [version] and harness.urls() == [HOOK]


def test_a_missing_secret_is_a_recorded_failure_that_names_the_secret() -> None:
    """The job's account has no such webhook: nothing is sent, the record says which secret."""
    harness = Harness(a_job(notify=[{"webhook_secret": "slack"}]))
    harness.notifier.handle(status("SUCCEEDED"))
    record = harness.records.records["train-1", "notify-0"]
    assert harness.poster.posts == [] and record.gave_up and record.target == "webhook_secret slack"
    assert "tpujobs_tpujobs-tpu-vm_notify-slack" in record.last_error


def test_team_defaults_apply_to_a_job_without_notify_and_an_empty_list_opts_out() -> None:
    """config/notify by owner or group: a member's job without `notify` gets them; `notify: []` none."""
    groups = {"ml": ("ada@example.com",)}
    config = InMemoryNotifyConfig(
        defaults={"group:ml": [NotifyTarget(webhook=HOOK)], "bob@example.com": [NotifyTarget(webhook=OTHER)]},
        access=AccessPolicies(groups=groups),
    )
    harness = Harness(a_job().evolve(owner_verified=True), config=config)
    harness.notifier.handle(status("SUCCEEDED"))
    assert harness.urls() == [HOOK]
    assert ("train-1", "team-0") in harness.records.records
    quiet = Harness(a_job(notify=[]).evolve(owner_verified=True), config=config)
    quiet.notifier.handle(status("SUCCEEDED"))
    assert quiet.urls() == []


def test_team_defaults_need_a_verified_owner_or_trusted_topic_owners() -> None:
    """A topic's `owner` is a claim: it earns no team's defaults unless config/policies trusts it."""
    defaults = {"ada@example.com": [NotifyTarget(webhook=HOOK)]}
    claimed = Harness(a_job(), config=InMemoryNotifyConfig(defaults=defaults))
    claimed.notifier.handle(status("SUCCEEDED"))
    assert claimed.urls() == []
    trusted = InMemoryNotifyConfig(defaults=defaults, access=AccessPolicies(trust_topic_owners=True))
    harness = Harness(a_job(), config=trusted)
    harness.notifier.handle(status("SUCCEEDED"))
    assert harness.urls() == [HOOK]


def test_without_a_signing_key_nothing_is_sent_and_the_record_says_why() -> None:
    """An unsigned post would be unverifiable: a deployment without the key records a failure."""
    harness = Harness(a_job(notify=[{"webhook": HOOK}]), key=None)
    harness.notifier.handle(status("SUCCEEDED"))
    assert harness.poster.posts == []
    assert "TPUJOBS_NOTIFY_SIGNING_KEY" in harness.records.records["train-1", "notify-0"].last_error


@pytest.mark.parametrize("data", [b"", b"not json", b'{"job_id": "train-1"}', b'{"job_id": 1, "to_state": "X"}'])
def test_a_message_that_is_no_state_change_is_acknowledged_quietly(data: bytes) -> None:
    """Malformed status messages post nothing and raise nothing (retrying cannot fix them)."""
    harness = Harness(a_job(notify=[{"webhook": HOOK}]))
    harness.notifier.handle(InboundMessage("m", "tpujobs-status", data))
    assert harness.poster.posts == []


def test_an_unknown_job_posts_nothing() -> None:
    """A change of a job that is gone (retention) is dropped."""
    harness = Harness(a_job(notify=[{"webhook": HOOK}]))
    harness.notifier.handle(status("SUCCEEDED", job_id="other-1"))
    assert harness.poster.posts == []


class FailingWrites(InMemoryDeliveryRecords):
    """Records whose next write fails, as Firestore may after the post went out."""

    def __init__(self) -> None:
        super().__init__()
        self.fail_next = True

    def write(self, job_id: str, key: str, record: Any) -> None:
        if self.fail_next:
            self.fail_next = False
            raise TransientError("Firestore unavailable")
        super().write(job_id, key, record)


def test_a_crash_between_the_post_and_its_record_posts_again_with_the_same_delivery_id() -> None:
    """The one window of a second post: the record was not written, so the redelivery posts again,
    under the same X-Tpujobs-Delivery for the receiver to drop; then it is settled."""
    harness = Harness(a_job(notify=[{"webhook": HOOK}]))
    harness.records = FailingWrites()
    harness.notifier.records = harness.records
    with pytest.raises(TransientError):
        harness.notifier.handle(status("SUCCEEDED"))
    harness.notifier.handle(status("SUCCEEDED"))
    harness.notifier.handle(status("SUCCEEDED"))
    ids = [post.headers[DELIVERY_HEADER] for post in harness.poster.posts]
    assert ids == ["train-1/3", "train-1/3"]
