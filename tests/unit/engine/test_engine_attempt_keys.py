"""Attempt keys traded for VM identity tokens, forgeries refused before any read, and master-key rotation.

The attempt_key function (`KeyApi`) is driven with a stand-in verifier (the google-auth path against the
simulator's certificates is tested with the simulator itself); the engine and its store are the fakes.
"""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest
from engine_harness import ZONE, Engine

from tpujobs.agent.wire import parse_key_text
from tpujobs.domain import signing
from tpujobs.domain.states import JobState
from tpujobs.engine.api import CALLER_HEADER
from tpujobs.engine.identity import InvalidToken
from tpujobs.engine.inbound import InboundMessage
from tpujobs.engine.key_api import KeyApi
from tpujobs.local.testing import ManualClock, inbound, signed_with

KEY_URL = "https://us-central1-test-project.cloudfunctions.net/jobs"
EVENTS = "tpujobs-worker-events"


class VmTokens:
    """Stand-in for google-auth's check of instance identity tokens: token -> its claims."""

    def __init__(self) -> None:
        self.claims: dict[str, dict[str, Any]] = {}
        self.audiences: list[list[str]] = []

    def __call__(self, token: str, audiences: Any) -> dict[str, Any]:
        self.audiences.append(list(audiences))
        if token not in self.claims:
            raise InvalidToken("Could not verify token signature.")
        return self.claims[token]

    def vm(self, token: str, jobs: Engine, *, instance: str = "1001", **changes: Any) -> str:
        """A token of a VM in the job's project and zone, running as the deployment's account, made now."""
        compute = {
            "project_id": jobs.settings.project,
            "zone": ZONE,
            "instance_id": instance,
            "instance_name": "t1v-n-0a1b2c3d-w-0",
            "instance_creation_timestamp": int(jobs.clock().timestamp()),
        }
        email = changes.pop("email", jobs.settings.tpu_service_account)
        compute.update(changes)
        self.claims[token] = {"email": email, "email_verified": True, "google": {"compute_engine": compute}}
        return token


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def jobs(engine, clock) -> Engine:
    return engine(clock=clock, key_url=KEY_URL)


@pytest.fixture
def tokens() -> VmTokens:
    return VmTokens()


def api(jobs: Engine, tokens: VmTokens) -> KeyApi:
    """The attempt_key function's front door, on the engine's store and clock."""
    return KeyApi(jobs.store, jobs.api_settings, jobs.service.clock, verify_vm_token=tokens)


def ask(jobs: Engine, tokens: VmTokens, token: str, **changes: Any) -> Any:
    """The `attempt-key` answer for worker 0 of train-1's attempt 1, unless `changes` say otherwise."""
    body = {"action": "attempt-key", "identity": token, "job_id": "train-1", "attempt": 1, "slice_id": 0}
    body = {"worker_id": 0, **body, **changes}
    caller = {CALLER_HEADER: jobs.settings.tpu_service_account}
    return api(jobs, tokens).handle("POST", KEY_URL, caller, json.dumps(body).encode())


def provisioning(jobs: Engine, **changes: Any) -> None:
    spec = {
        "job_id": "train-1",
        "name": "train",
        "owner": "ada@example.com",
        "accelerator_type": "v4-16",
        "command": "python train.py",
        **changes,
    }
    assert jobs.submit(spec).kind == "provisioning"


def report_with(jobs: Engine, key_answer: dict[str, str], kind: str = "started") -> InboundMessage:
    """A report signed with the key the API answered, as the agent sends it."""
    payload = {"kind": kind, "job_id": "train-1", "attempt": 1, "slice_id": 0, "worker_id": 0}
    message = signed_with(jobs, parse_key_text(key_answer["key"]), EVENTS, payload)
    attributes = {
        **message.attributes,
        signing.KEY_VERSION_ATTRIBUTE: key_answer["key_version"],
        signing.JOB_CREATED_ATTRIBUTE: key_answer["job_created"],
    }
    return replace(message, attributes=attributes)


# -- the key, for the VM that can be the host -----------------------------------------------------


def test_the_attempts_host_gets_the_key_and_its_reports_are_believed(jobs, tokens):
    """The VM's token verifies for the key URL; the key answered signs reports the engine believes."""
    provisioning(jobs)
    answer = ask(jobs, tokens, tokens.vm("t1", jobs))
    assert answer.status == 200, answer.body
    assert tokens.audiences == [[KEY_URL]]
    assert answer.body["key_version"] == "1"
    jobs.handle(report_with(jobs, answer.body))
    assert jobs.store.get("train-1").state is JobState.RUNNING
    assert jobs.store.rejections() == []


def test_nothing_a_viewer_reads_holds_the_key(jobs, tokens, tpu_client):
    """The nodes as the TPU API shows them to a viewer (metadata, labels, all of it) hold no key,
    and no key text that would sign for the attempt."""
    provisioning(jobs)
    key = ask(jobs, tokens, tokens.vm("t1", jobs)).body["key"]
    parent = f"projects/{jobs.settings.project}/locations/{ZONE}"
    shown = [*tpu_client.list_queued_resources(parent=parent), *tpu_client.list_nodes(parent=parent)]
    assert shown
    seen = " ".join(type(item).to_json(item) for item in shown)
    assert key not in seen and signing.KEY_PREFIX not in seen


@pytest.mark.parametrize(
    ("changes", "says"),
    [
        ({"email": "someone-else@test-project.iam.gserviceaccount.com"}, "does not run as the job's account"),
        ({"zone": "us-east5-a"}, "is not in test-project zone"),
        ({"project_id": "another-project"}, "is not in test-project zone"),
        ({"instance_name": "t1v-n-0a1b2c3d-w-1"}, "another worker of its node"),
        ({"instance_id": ""}, "format=full"),
    ],
    ids=["account", "zone", "project", "worker", "no_instance"],
)
def test_a_token_of_a_vm_that_cannot_be_the_host_gets_no_key(jobs, tokens, changes, says):
    """Another account, zone, project or worker, or a token without the VM's claims: 403, no key."""
    provisioning(jobs)
    answer = ask(jobs, tokens, tokens.vm("t1", jobs, **changes))
    assert answer.status == 403 and "key" not in answer.body
    assert says in answer.body["error"] or (
        says == "is not in another" and "is not in test-project" in answer.body["error"]
    )


def test_a_vm_made_before_the_attempt_asked_for_capacity_gets_no_key(jobs, tokens, clock):
    """An older VM (someone's, of the same account) cannot be this attempt's host."""
    made = int(clock().timestamp()) - 3600
    provisioning(jobs)
    answer = ask(jobs, tokens, tokens.vm("t1", jobs, instance_creation_timestamp=made))
    assert answer.status == 403 and "made before the attempt" in answer.body["error"]


def test_a_second_vm_asking_for_a_workers_key_gets_none(jobs, tokens):
    """The first VM to hold a worker's key keeps it: another instance asking later is refused, the
    same one asking again (a reboot) is answered."""
    provisioning(jobs)
    assert ask(jobs, tokens, tokens.vm("t1", jobs, instance="1001")).status == 200
    second = ask(jobs, tokens, tokens.vm("t2", jobs, instance="2002"))
    assert second.status == 403 and "another VM (instance 1001) holds it" in second.body["error"]
    assert ask(jobs, tokens, "t1").status == 200
    third = tokens.vm("t3", jobs, instance="3003", instance_name="t1v-n-0a1b2c3d-w-1")
    assert ask(jobs, tokens, third, worker_id=1).status == 200  # its own worker's key is free


def test_a_token_that_does_not_verify_is_401(jobs, tokens):
    provisioning(jobs)
    answer = ask(jobs, tokens, "forged.token.value")
    assert answer.status == 401 and "does not verify" in answer.body["error"]


def test_no_key_for_an_attempt_that_holds_no_capacity(jobs, tokens):
    """An ended job, another attempt or a host the job lacks: refused."""
    provisioning(jobs)
    token = tokens.vm("t1", jobs)
    assert ask(jobs, tokens, token, attempt=2).status == 403
    assert ask(jobs, tokens, token, worker_id=2).status == 403
    assert ask(jobs, tokens, token, job_id="ghost").status == 403
    jobs.cancel("train-1", "done")
    assert ask(jobs, tokens, token).status == 403


# -- forgeries cost nothing ------------------------------------------------------------------------


class Counting:
    """Counts the job store's reads and rejection writes while the engine handles messages."""

    def __init__(self, jobs: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
        self.reads = 0
        self.writes = 0
        store = jobs.store
        get, reject = store.get, store.reject

        def counted_get(*args: Any, **kwargs: Any) -> Any:
            self.reads += 1
            return get(*args, **kwargs)

        def counted_reject(*args: Any, **kwargs: Any) -> Any:
            self.writes += 1
            return reject(*args, **kwargs)

        monkeypatch.setattr(store, "get", counted_get)
        monkeypatch.setattr(store, "reject", counted_reject)


def forged_reports(jobs: Engine, n: int) -> list[InboundMessage]:
    """`n` reports naming train-1's attempt 1, each signed with a key of nobody's."""
    payload = {"kind": "exited", "job_id": "train-1", "attempt": 1, "slice_id": 0, "worker_id": 0, "exit_code": 0}
    return [signed_with(jobs, bytes([i % 256]) * 32, EVENTS, payload) for i in range(n)]


def test_a_flood_of_forged_reports_reads_nothing_and_writes_once_a_minute(jobs, clock, monkeypatch):
    """1,000 forgeries: no read of the job, one rejection written at once, then one record counting
    the rest once a minute has passed; the job is untouched."""
    provisioning(jobs)
    before = jobs.store.get("train-1")
    flood = forged_reports(jobs, 1000)
    counting = Counting(jobs, monkeypatch)
    for message in flood[:999]:
        assert jobs.handle(message) is None
    assert (counting.reads, counting.writes) == (0, 1)
    clock.advance(61)
    jobs.handle(flood[999])
    assert (counting.reads, counting.writes) == (0, 2)
    counted = [d for d in jobs.store.rejection_documents() if d["message_id"].startswith("forged-")]
    assert [d["deliveries"] for d in counted] == [999]
    assert "not signed by the key it names" in counted[0]["reason"]
    assert jobs.store.get("train-1") == before


def test_unsigned_and_undecodable_reports_are_counted_too(jobs, monkeypatch):
    """No signature, or bytes that are no report: the first of each recorded, the rest counted."""
    provisioning(jobs)
    counting = Counting(jobs, monkeypatch)
    payload = {"kind": "exited", "job_id": "train-1", "attempt": 1, "slice_id": 0, "worker_id": 0, "exit_code": 0}
    payload.update(at=jobs.clock().isoformat(), nonce="ab" * 16)
    for _ in range(50):
        jobs.handle(inbound(EVENTS, payload))
        jobs.handle(InboundMessage(f"junk-{_}", EVENTS, b"{not json"))
    assert (counting.reads, counting.writes) == (0, 2)


# -- rotating the master key -------------------------------------------------------------------------


def test_rotating_the_master_key_mid_attempt_keeps_its_reports_verifying(jobs, tokens):
    """The attempt got its key under version 1; the functions then run with version 2 current and
    1 previous: its reports still verify. Once version 1 is dropped, they do not."""
    provisioning(jobs)
    answer = ask(jobs, tokens, tokens.vm("t1", jobs)).body
    rotated = jobs.redeployed(
        report_key="r" * 48,
        report_key_version="2",
        report_key_previous=jobs.settings.report_key,
        report_key_previous_version="1",
    )
    rotated.handle(report_with(rotated, answer))
    assert rotated.store.get("train-1").state is JobState.RUNNING
    assert ask(rotated, tokens, "t1").body["key_version"] == "2"  # new keys come from the new version
    dropped = rotated.redeployed(report_key_previous="", report_key_previous_version="")
    late = report_with(dropped, answer, kind="exited")
    dropped.handle(late)
    reason = next(r.reason for r in dropped.store.rejections() if r.message_id == late.message_id)
    assert signing.UNKNOWN_VERSION in reason


def test_a_report_of_an_earlier_job_of_the_same_id_is_refused(jobs, tokens):
    """Signed right, but for a job of the same id made before: refused after the one read."""
    provisioning(jobs)
    answer = dict(ask(jobs, tokens, tokens.vm("t1", jobs)).body)
    job = jobs.store.get("train-1")
    earlier = job.created_at - timedelta(days=1)
    keys = jobs.settings.master_keys()
    created = signing.created_micros(earlier)
    answer.update(
        key=signing.key_text(keys.attempt_key("train-1", created, 1)),
        job_created=str(created),
    )
    message = report_with(jobs, answer)
    jobs.handle(message)
    reason = next(r.reason for r in jobs.store.rejections() if r.message_id == message.message_id)
    assert "earlier job of the same job_id" in reason


# -- a multislice's coordinator, where tpujobs names it ---------------------------------------------


def test_slice_0_worker_0_names_the_coordinator_every_host_learns_with_its_key(jobs, tokens):
    """The first host of slice 0 gives its address; until then the others get their key and no
    coordinator (they ask again); a later address changes nothing; a single slice gets none."""
    provisioning(jobs, slices=2)
    other = tokens.vm("s1", jobs, instance="2002", instance_name="t1v-n-0a1b2c3d-w-0")
    early = ask(jobs, tokens, other, slice_id=1)
    assert early.status == 200 and early.body["coordinator"] is None
    first = ask(jobs, tokens, tokens.vm("s0", jobs, instance="1001"), address="10.0.0.5")
    assert first.status == 200 and first.body["coordinator"] == "10.0.0.5"
    assert ask(jobs, tokens, other, slice_id=1).body["coordinator"] == "10.0.0.5"
    assert ask(jobs, tokens, "s0", address="10.9.9.9").body["coordinator"] == "10.0.0.5"  # kept: the first
    bad = ask(jobs, tokens, "s0", address="10.0.0.5; rm -rf /")
    assert bad.status == 400 and "address must be an IP address" in bad.body["error"]


def test_a_single_slice_key_answer_names_no_coordinator(jobs, tokens):
    provisioning(jobs)
    assert "coordinator" not in ask(jobs, tokens, tokens.vm("t1", jobs), address="10.0.0.5").body
