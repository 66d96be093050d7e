"""Notifications among teams, on the engine's fakes: webhook URLs shown only to their owners and
admins, one signing key per team handed to its members only, and one announcement per state change."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Any

from engine_harness import Engine

from tpujobs.domain.access import AccessPolicies
from tpujobs.domain.notify_delivery import KEY_ID_HEADER, KEY_VERSION_HEADER, SIGNATURE_HEADER, TIMESTAMP_HEADER, verify
from tpujobs.engine.dashboard.views import DashboardViews
from tpujobs.engine.inbound import InboundMessage
from tpujobs.engine.notifications import Notifier, NotifySettings, notify_keys
from tpujobs.local.fakes.notifications import (
    InMemoryDeliveryRecords,
    InMemoryNotifyConfig,
    InMemoryWebhookSecrets,
    RecordingPoster,
)

OWNER, OTHER, ADMIN = "ada@example.com", "eve@example.com", "root@example.com"
SLACK = "https://hooks.slack.com/services/T0/B0/s3cr3t-token"
TEAM_A = "team-a@test-project.iam.gserviceaccount.com"
NOW = datetime(2026, 11, 27, 8, 0, tzinfo=timezone.utc)


def submitted(jobs: Engine, job_id: str = "train-1", owner: str = OWNER, **spec: Any) -> str:
    """A job submitted through the jobs API (its owner verified), with a Slack webhook unless told."""
    body = {
        "action": "submit", "job_id": job_id, "name": "train", "accelerator_type": "v4-8", "command": "x",
        "notify": [{"webhook": SLACK, "on": ["RUNNING", "SUCCEEDED"]}], **spec,
    }  # fmt: skip
    answer = jobs.api(body, owner)
    assert answer.status == 200, answer.body
    return job_id


def webhooks(answer_job: dict[str, Any]) -> list[str]:
    return [target.get("webhook") for target in answer_job["spec"]["notify"]]


def notifier(jobs: Engine, poster: RecordingPoster, access: AccessPolicies | None = None) -> Notifier:
    settings = NotifySettings("test-project", "", "vm@test", notify_keys(jobs.api_settings), "")
    config = InMemoryNotifyConfig(access=access or AccessPolicies())
    records = InMemoryDeliveryRecords()
    return Notifier(jobs.store, config, InMemoryWebhookSecrets(), poster, records, settings, lambda: NOW)


def status_messages(jobs: Engine) -> list[InboundMessage]:
    """What tpujobs-status carried, as the notify function receives it."""
    return [
        InboundMessage(f"m{i}", "tpujobs-status", json.dumps(change.payload()).encode())
        for i, change in enumerate(jobs.published.announced)
    ]


# -- 1. who sees a webhook URL ---------------------------------------------------------------------


def test_describe_shows_a_webhook_whole_to_its_owner_and_admins_and_its_host_to_anyone_else(engine) -> None:
    """The owner and an admin read the URL in `describe`; another caller reads `hooks.slack.com/…`."""
    jobs = engine(admins=(ADMIN,))
    job_id = submitted(jobs)
    for caller in (OWNER, ADMIN):
        assert webhooks(jobs.api({"action": "describe", "job_id": job_id}, caller).body["job"]) == [SLACK]
    other = jobs.api({"action": "describe", "job_id": job_id}, OTHER).body
    assert webhooks(other["job"]) == ["hooks.slack.com/\u2026"]
    assert "s3cr3t" not in json.dumps(other)


def test_list_shows_only_webhook_hosts_even_to_the_owner(engine) -> None:
    """`list` answers many jobs at once, for tables and scripts: no URL in it, whoever asks."""
    jobs = engine(admins=(ADMIN,))
    submitted(jobs)
    for caller in (OWNER, ADMIN, OTHER):
        listed = jobs.api({"action": "list"}, caller).body
        assert [webhooks(job) for job in listed["jobs"]] == [["hooks.slack.com/\u2026"]]
        assert "s3cr3t" not in json.dumps(listed), caller


def test_the_cli_reads_a_listed_job_whose_webhook_shows_by_its_host(engine) -> None:
    """`tpujobs list` reads each answered job back: a host-only webhook is no URL, so its target is
    left out of the Job instead of failing the whole listing."""
    from tpujobs.cli.api_client import job_from_json

    jobs = engine(admins=(ADMIN,))
    job_id = submitted(jobs)
    for caller in (OWNER, OTHER):
        (listed,) = jobs.api({"action": "list"}, caller).body["jobs"]
        job = job_from_json(listed)
        assert (job.job_id, list(job.spec.notify)) == (job_id, [])


def test_the_dashboards_spec_block_shows_webhook_hosts_only(engine) -> None:
    """The job page's spec block, even for the owner, names the host and never the URL's path."""
    from tpujobs.engine.api import JobsApi
    from tpujobs.local.fakes.usage_jobs import InMemoryUsageJobs

    jobs = engine(admins=(ADMIN,))
    job_id = submitted(jobs)
    api = JobsApi(jobs.service, jobs.store, jobs.api_settings)
    views = DashboardViews(api, jobs.clock, InMemoryUsageJobs(jobs.store))
    for caller in (OWNER, ADMIN, OTHER):
        page = views.job(caller, job_id)
        assert webhooks({"spec": json.loads(page.spec_text)}) == ["hooks.slack.com/\u2026"], caller
        assert "s3cr3t" not in page.spec_text, caller
        assert all("s3cr3t" not in json.dumps(event, default=str) for event in page.events)


def test_describes_notification_records_hold_no_url(engine) -> None:
    """A record names its target by label; a URL a receiver's error put in it is cut to its host."""
    jobs = engine()
    job_id = submitted(jobs)
    record = {"id": "notify-0", "target": "webhook", "last_error": f"the post to {SLACK} failed", "attempts": 1}
    jobs.store.notification_documents = lambda _job_id: [record]  # type: ignore[method-assign]
    for caller in (OWNER, OTHER):
        [shown] = jobs.api({"action": "describe", "job_id": job_id}, caller).body["notifications"]
        assert shown["last_error"] == "the post to hooks.slack.com/\u2026 failed"


# -- 2. one signing key per team -------------------------------------------------------------------


def test_each_team_signs_with_its_own_key_and_a_receiver_of_one_cannot_verify_anothers(engine) -> None:
    """Two owners' jobs are signed with different keys, named in X-Tpujobs-Key-Id; each key, as
    `notify-key` hands it to its owner, verifies its own team's post and not the other's."""
    jobs = engine()
    submitted(jobs, "train-a", OWNER)
    submitted(jobs, "train-b", OTHER)
    for job_id in ("train-a", "train-b"):
        jobs.report("started", 1, job_id=job_id)
    poster = RecordingPoster()
    deliver = notifier(jobs, poster)
    for message in status_messages(jobs):
        deliver.handle(message)
    posts = {json.loads(post.body)["job_id"]: post for post in poster.posts}
    assert set(posts) == {"train-a", "train-b"}
    keys = {who: jobs.api({"action": "notify-key"}, who).body for who in (OWNER, OTHER)}
    assert keys[OWNER]["team"] == f"owner:{OWNER}" and keys[OWNER]["key"] != keys[OTHER]["key"]
    for job_id, mine, theirs in (("train-a", OWNER, OTHER), ("train-b", OTHER, OWNER)):
        post = posts[job_id]
        assert post.headers[KEY_ID_HEADER] == f"owner:{mine}"
        assert post.headers[KEY_VERSION_HEADER] == keys[mine]["key_version"]
        stamp, signed = post.headers[TIMESTAMP_HEADER], post.headers[SIGNATURE_HEADER]
        assert verify(keys[mine]["key"].encode(), stamp, post.body, signed), job_id
        assert not verify(keys[theirs]["key"].encode(), stamp, post.body, signed), job_id


def test_a_service_accounts_key_goes_to_those_who_may_run_as_it_and_to_admins(engine) -> None:
    """config/service_accounts lets ada run as team-a: she gets its key, eve gets a 403, an admin
    may ask for any team; the key verifies the team's posts."""
    access = AccessPolicies(service_accounts={OWNER: (TEAM_A,)})
    jobs = engine(access=access, admins=(ADMIN,), job_service_accounts=(TEAM_A,))
    submitted(jobs, service_account=TEAM_A)
    jobs.report("started", 1)
    mine = jobs.api({"action": "notify-key", "service_account": TEAM_A}, OWNER)
    assert mine.status == 200 and mine.body["team"] == f"account:{TEAM_A}"
    assert "key" not in mine.body or mine.body["key"] not in json.dumps(jobs.api({"action": "list"}, OWNER).body)
    refused = jobs.api({"action": "notify-key", "service_account": TEAM_A}, OTHER)
    assert refused.status == 403 and "key" not in refused.body
    assert jobs.api({"action": "notify-key", "team": f"owner:{OWNER}"}, OTHER).status == 403
    admin = jobs.api({"action": "notify-key", "team": f"account:{TEAM_A}"}, ADMIN)
    assert admin.status == 200 and admin.body["key"] == mine.body["key"]
    poster = RecordingPoster()
    for message in status_messages(jobs):
        notifier(jobs, poster, access).handle(message)
    [post] = poster.posts
    assert post.headers[KEY_ID_HEADER] == f"account:{TEAM_A}"
    stamp, signed = post.headers[TIMESTAMP_HEADER], post.headers[SIGNATURE_HEADER]
    assert verify(mine.body["key"].encode(), stamp, post.body, signed)


def test_a_rotation_signs_under_both_versions_and_notify_key_hands_out_both(engine) -> None:
    """With a previous master version set, a post carries a second signature under it, and the
    team's old key (as notify-key gave it before) verifies that one, the new key the first."""
    old_master, new_master = "o" * 40, "n" * 40
    before = engine(notify_signing_key=old_master, notify_signing_key_version="1")
    submitted(before)
    old_key = before.api({"action": "notify-key"}, OWNER).body
    jobs = before.redeployed(
        notify_signing_key=new_master, notify_signing_key_version="2",
        notify_signing_key_previous=old_master, notify_signing_key_previous_version="1",
    )  # fmt: skip
    keys = jobs.api({"action": "notify-key"}, OWNER).body
    assert keys["key_version"] == "2" and keys["previous"] == [{"key_version": "1", "key": old_key["key"]}]
    jobs.report("started", 1)
    poster = RecordingPoster()
    for message in status_messages(jobs):
        notifier(jobs, poster).handle(message)
    [post] = poster.posts
    stamp = post.headers[TIMESTAMP_HEADER]
    assert verify(keys["key"].encode(), stamp, post.body, post.headers[SIGNATURE_HEADER])
    assert post.headers["X-Tpujobs-Key-Version-Previous"] == "1"
    assert verify(old_key["key"].encode(), stamp, post.body, post.headers["X-Tpujobs-Signature-Previous"])


# -- 4. once per state change ----------------------------------------------------------------------


def test_a_label_change_announces_nothing_to_a_state_target(engine) -> None:
    """A target `on: [RUNNING]` hears of RUNNING once, however many label changes follow."""
    jobs = engine()
    job_id = submitted(jobs)
    jobs.report("started", 1)
    for run in range(5):
        answer = jobs.api({"action": "label", "job_id": job_id, "labels": {"run": str(run)}}, OWNER)
        assert answer.body["changed"] is True
    poster = RecordingPoster()
    deliver = notifier(jobs, poster)
    for message in status_messages(jobs):
        deliver.handle(message)
        deliver.handle(message)  # redelivered
    assert [json.loads(post.body)["state"] for post in poster.posts] == ["RUNNING"]
