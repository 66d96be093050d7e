"""The notify function: post each job state change on tpujobs-status to the webhooks that want it.

Level-based on the job: the status message names the job and its event; the job's own `notify`
(else its team's defaults, `config/notify`) says who wants that state. Retries are Pub/Sub's: a
target that failed for a passing reason fails the handler, and the subscription redelivers with
its backoff (10 s doubling to 60 s, infra/pubsub.tf). That keeps no instance asleep between tries,
and survives the instance. Each (event, target) is settled once: delivered, or given up after
MAX_ATTEMPTS (before the subscription's 5 deliveries dead-letter it), so a redelivery posts only
to the targets still owed. Every outcome goes to a record per job and target; none touches the job.

Only a change of state is told: an event that leaves the state as it was (a label change) reaches
no target. A job's targets are posted to side by side, each post bounded by the poster's deadline,
so one slow receiver costs a handler at most one deadline; a receiver whose host already has its
share of posts in flight (`ReceiverBusy`) is tried again later, without counting as a try.
Each team signs with its own key (`tpujobs.domain.notify_delivery.NotifyKeys`).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from datetime import datetime
from typing import TYPE_CHECKING, Protocol

from tpujobs.domain.access import AccessPolicies
from tpujobs.domain.job import Job
from tpujobs.domain.notify import NotifyTarget, team_defaults, wanted, webhook_secret_version
from tpujobs.domain.notify_delivery import Notice, NotifyKeys, derived_signing_key, headers, signing_team
from tpujobs.engine.errors import PermanentError, TransientError
from tpujobs.engine.inbound import InboundMessage
from tpujobs.engine.ports import Clock

if TYPE_CHECKING:
    from tpujobs.engine.settings import Settings

log = logging.getLogger(__name__)

MAX_ATTEMPTS = 4  # per (event, target); the push subscription dead-letters at its 5th delivery
MAX_DELIVERED_KEPT = 50  # delivered event ids a record keeps: redeliveries come within minutes
MAX_ERROR_CHARS = 300


@dataclass(frozen=True)
class DeliveryRecord:
    """What became of one job's notifications to one target: `jobs/{id}/notifications/{key}`."""

    target: str  # the target's label: `webhook` or `webhook_secret NAME`, never a URL
    event: str = ""  # the last event tried, `{job_id}/{seq}`
    state: str = ""  # its state
    attempts: int = 0  # tries of that event so far
    delivered: tuple[str, ...] = ()  # the events delivered, newest last
    last_error: str = ""  # why the last try failed; "" after a success
    gave_up: bool = False  # the last event failed for good (or MAX_ATTEMPTS times)
    updated_at: datetime | None = None

    def settled(self, event: str) -> bool:
        """Whether `event` needs no more tries here: delivered, or given up."""
        return event in self.delivered or (event == self.event and self.gave_up)

    def tries_of(self, event: str) -> int:
        return self.attempts if event == self.event else 0

    def after_success(self, event: str, state: str, at: datetime) -> DeliveryRecord:
        kept = (*self.delivered, event)[-MAX_DELIVERED_KEPT:]
        return replace(
            self, event=event, state=state, attempts=self.tries_of(event) + 1, delivered=kept,
            last_error="", gave_up=False, updated_at=at,
        )  # fmt: skip

    def after_failure(self, event: str, state: str, error: str, at: datetime, *, final: bool) -> DeliveryRecord:
        attempts = self.tries_of(event) + 1
        return replace(
            self, event=event, state=state, attempts=attempts, last_error=error[:MAX_ERROR_CHARS],
            gave_up=final or attempts >= MAX_ATTEMPTS, updated_at=at,
        )  # fmt: skip


class NotifyJobs(Protocol):
    def get(self, job_id: str) -> Job | None: ...


class NotifyConfig(Protocol):
    def notify_defaults(self) -> Mapping[str, Sequence[NotifyTarget]]:
        """`config/notify`: owner or `group:NAME` -> its default targets (bad entries left out)."""

    def policies(self) -> AccessPolicies:
        """config/groups among the rest: who is in which `group:NAME`."""


class WebhookSecrets(Protocol):
    def webhook_url(self, version_name: str) -> str:
        """The URL held by a secret version; PermanentError when absent or not readable."""


class ReceiverBusy(TransientError):
    """The receiver's host has as many posts in flight as it may have: nothing was sent, so the
    post is owed without counting as a try."""


class WebhookPoster(Protocol):
    def post(self, url: str, headers: Mapping[str, str], body: bytes) -> None:
        """POST once, within a total deadline; PermanentError when refused for good (address,
        redirect, 4xx), ReceiverBusy when its host's lane is full, else TransientError."""


class DeliveryRecords(Protocol):
    def read(self, job_id: str, key: str) -> DeliveryRecord | None: ...

    def write(self, job_id: str, key: str, record: DeliveryRecord) -> None: ...


@dataclass(frozen=True)
class NotifySettings:
    """What the notifier needs of the deployment's settings."""

    project: str
    prefix: str
    tpu_service_account: str  # whose namespace a job without `service_account` names secrets in
    keys: NotifyKeys | None  # the notify master key's versions; None: the deployment has none, nothing is sent
    dashboard_url: str = ""


class AttemptEnds(Protocol):
    def record_attempt(self, job: Job, attempt: int) -> None:
        """Count an ended attempt's chip-hours in its team's month, once (`engine.budgets.TeamBudgets`)."""


class Notifier:
    """Delivers one status change to every target that wants it, and records each outcome."""

    def __init__(
        self, jobs: NotifyJobs, config: NotifyConfig, secrets: WebhookSecrets, poster: WebhookPoster,
        records: DeliveryRecords, settings: NotifySettings, clock: Clock, budgets: AttemptEnds | None = None,
    ) -> None:  # fmt: skip
        """`budgets`: where an attempt's end is counted against its team's budget (None: nowhere)."""
        self.jobs, self.config, self.secrets, self.poster = jobs, config, secrets, poster
        self.records, self.settings, self.clock, self.budgets = records, settings, clock, budgets

    def handle(self, message: InboundMessage) -> None:
        """Deliver the change `message` announces; raise TransientError while a target is still owed a try."""
        change = decode_change(message)
        if change is None:
            return
        if not change.changes_state:
            log.info("%s leaves %s in %s: no state target is told", change.event_id, change.job_id, change.state)
            return
        job = self.jobs.get(change.job_id)
        if job is None:
            return
        if self.budgets is not None:  # every change comes here: an attempt's end is counted once
            self.budgets.record_attempt(job, change.attempt)
        if job.spec.notify is not None:
            targets = wanted(job.spec.notify, change.state, "notify")
        else:
            targets = wanted(self._team_defaults(job), change.state, "team")
        if not targets:
            return
        notice = replace(change, link=self._link(job.job_id))
        if len(targets) == 1:
            settled = [self._deliver(job, notice, *targets[0])]
        else:  # side by side: a slow receiver holds up no other target of the job
            with ThreadPoolExecutor(max_workers=len(targets), thread_name_prefix="notify") as pool:
                settled = list(pool.map(lambda pair: self._deliver(job, notice, *pair), targets))
        owed = [key for (key, _), done in zip(targets, settled, strict=True) if not done]
        if owed:
            raise TransientError(f"notifications of {notice.event_id} to {', '.join(owed)} will be tried again")

    def _team_defaults(self, job: Job) -> list[NotifyTarget]:
        """config/notify's targets for the job's owner and its groups; none for an owner nobody
        verified (a topic's claim), unless config/policies trusts topic owners: a claim must not
        post in another team's channel."""
        defaults = self.config.notify_defaults()
        if not defaults:
            return []
        policies = self.config.policies()
        if not (job.owner_verified or policies.trust_topic_owners):
            return []
        return team_defaults(defaults, policies.members(job.owner))

    def _deliver(self, job: Job, notice: Notice, key: str, target: NotifyTarget) -> bool:
        """Try one target unless settled; True when nothing more is owed to it for this event."""
        record = self.records.read(job.job_id, key) or DeliveryRecord(target.label())
        record = replace(record, target=target.label())
        if record.settled(notice.event_id):
            return True
        now = self.clock()
        try:
            self._post(job, notice, target, now)
        except ReceiverBusy as error:  # nothing was sent: owed, and not a try
            log.info("notification of %s to %s waits: %s", notice.event_id, key, error)
            return False
        except (PermanentError, TransientError) as error:
            final = isinstance(error, PermanentError)
            failed = record.after_failure(notice.event_id, notice.state, str(error), now, final=final)
            self.records.write(job.job_id, key, failed)
            log.warning(
                "notification of %s (%s) to %s (%s) failed, try %d%s: %s", notice.event_id, notice.state, key,
                failed.target, failed.attempts, ", given up" if failed.gave_up else "", error,
            )  # fmt: skip
            return failed.gave_up
        self.records.write(job.job_id, key, record.after_success(notice.event_id, notice.state, now))
        log.info("notified %s (%s) of %s %s", key, record.target, notice.event_id, notice.state)
        return True

    def _post(self, job: Job, notice: Notice, target: NotifyTarget, now: datetime) -> None:
        if self.settings.keys is None:
            raise PermanentError("this deployment has no notify signing key (TPUJOBS_NOTIFY_SIGNING_KEY)")
        if target.webhook_secret is not None:
            account = job.spec.service_account or self.settings.tpu_service_account
            try:
                version = webhook_secret_version(
                    target.webhook_secret, self.settings.project, self.settings.prefix, account
                )
            except ValueError as error:
                raise PermanentError(str(error)) from None
            url = self.secrets.webhook_url(version)
        else:
            url = target.webhook or ""
        timestamp = str(int(now.timestamp()))
        team = self.team(job)
        signed = headers(notice, team, self.settings.keys.signing(team), timestamp)
        self.poster.post(url, signed, notice.body())

    def team(self, job: Job) -> str:
        """Whose key signs the job's notifications (`domain.notify_delivery.signing_team`)."""
        trusted = job.owner_verified or (not job.spec.service_account and self.config.policies().trust_topic_owners)
        return signing_team(job.spec.service_account, job.owner, owner_trusted=trusted)

    def _link(self, job_id: str) -> str:
        base = self.settings.dashboard_url.rstrip("/")
        return f"{base}/jobs/{job_id}" if base else ""


def decode_change(message: InboundMessage) -> Notice | None:
    """The change a tpujobs-status message announces (StatusChange.payload), or None when it is not one."""
    try:
        data = json.loads(message.data or b"")
        notice = Notice(
            job_id=data["job_id"], state=data["to_state"], reason=data.get("reason") or "",
            attempt=data["attempt"], seq=data["seq"],
            changes_state="from_state" not in data or data["from_state"] != data["to_state"],
        )  # fmt: skip
    except (ValueError, KeyError, TypeError):
        log.warning("status message %s is not a state change: ignored", message.message_id)
        return None
    fields_ok = isinstance(notice.job_id, str) and isinstance(notice.state, str) and isinstance(notice.reason, str)
    if not fields_ok or not isinstance(notice.attempt, int) or not isinstance(notice.seq, int):
        log.warning("status message %s has fields of the wrong type: ignored", message.message_id)
        return None
    return notice


def notify_keys(config: Settings) -> NotifyKeys | None:
    """The notify master key's versions from the settings; the local stack derives its own from the
    report key. None when the deployment has none (nothing is signed, so nothing is sent); a key
    too short to be a random secret is a ValueError, as a misconfiguration."""
    current = config.notify_signing_key.encode("utf-8")
    if not current and config.local_stack and config.report_key:
        current = derived_signing_key(config.report_key)
    if not current:
        return None
    previous = config.notify_signing_key_previous.encode("utf-8")
    return NotifyKeys.of(
        current, config.notify_signing_key_version, previous, config.notify_signing_key_previous_version
    )
