"""Signed worker reports (`tpujobs.domain.signing`): keys, signatures, the checks, the scrubbing.

Pure: a job is made by `new_job` from a valid spec, times are passed in, and the master key
is a fresh random one per test, as `local_settings` makes it.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from hypothesis import assume, example, given
from hypothesis import strategies as st

from tpujobs.domain import signing
from tpujobs.domain.accounting import next_attempt
from tpujobs.domain.job import Job, new_job
from tpujobs.domain.signing import CLOCK_SKEW, MissingMasterKey
from tpujobs.domain.spec import parse_spec

CREATED = datetime(2025, 3, 1, 12, 0, 0, 123456, tzinfo=timezone.utc)
NOW = CREATED + timedelta(minutes=30)
ZONE = "us-central2-b"
MASTER = secrets.token_urlsafe(48)  # one random key for the hypothesis tests; never a fixed one

UNSIGNED = "the report is unsigned (no tpujobs-signature attribute)"
MALFORMED = "the tpujobs-signature attribute is not a v1 HMAC-SHA256 signature"
MISMATCH = "the signature does not match the key of the attempt the report names"


@pytest.fixture
def master() -> str:
    """A fresh master key, as long as the deployment's."""
    return secrets.token_urlsafe(48)


def make_job(**spec_changes: Any) -> Job:
    """A v4-16 job (2 hosts per slice) created at CREATED, at attempt 1."""
    data = {
        "job_id": "train-1",
        "name": "train",
        "owner": "ada",
        "accelerator_type": "v4-16",
        "command": "python train.py",
        **spec_changes,
    }
    job, _ = new_job(parse_spec(data), ZONE, CREATED)
    return job


def at_attempt_2(job: Job, began: datetime) -> Job:
    """`job` after its first attempt ended at `began` and the second began waiting then."""
    ended = tuple(u if u.attempt != 1 else replace(u, ended_at=began) for u in job.usage)
    return job.evolve(attempt=2, restarts=1, usage=next_attempt(ended, 2, job.spec.chips, began, ZONE))


def report_bytes(**changes: Any) -> bytes:
    """The bytes of a worker report as the agent writes them."""
    body = {
        "kind": "exited",
        "job_id": "train-1",
        "attempt": 1,
        "slice_id": 0,
        "worker_id": 0,
        "exit_code": 0,
        "at": NOW.isoformat(),
        "nonce": secrets.token_hex(16),
        **changes,
    }
    return json.dumps(body).encode()


def attributes_for(job: Job, master: str, data: bytes, attempt: int, *, version: str = "1") -> dict[str, str]:
    """What the attempt's agent sends with `data`: signed with `attempt`'s key of `job`."""
    assert job.created_at is not None
    created = signing.created_micros(job.created_at)
    key = signing.MasterKeys.of(master, version).attempt_key(job.job_id, created, attempt)
    return {
        signing.SIGNATURE_ATTRIBUTE: signing.sign(key, data),
        signing.KEY_VERSION_ATTRIBUTE: version,
        signing.JOB_CREATED_ATTRIBUTE: str(created),
    }


def check(
    job: Job,
    master: str,
    *,
    key_attempt: int | None = None,
    signed_for: Job | None = None,
    signature: str | None = None,
    **fields: Any,
):
    """What the engine finds wrong with a report of `job`, from the message first (`forgery`), then
    against the job (`report_problem`): signed with the key of `key_attempt` (default: the attempt it
    names) of `signed_for` (default: `job`) unless `signature` is given; `fields` override attempt,
    ids and time."""
    values: dict[str, Any] = {"attempt": 1, "slice_id": 0, "worker_id": 0, "at": NOW, **fields}
    data = report_bytes(attempt=values["attempt"], slice_id=values["slice_id"], worker_id=values["worker_id"])
    attributes = attributes_for(signed_for or job, master, data, key_attempt or values["attempt"])
    if signature is not None:
        attributes[signing.SIGNATURE_ATTRIBUTE] = signature
    keys = signing.MasterKeys.of(master)
    forged = signing.forgery(keys, job.job_id, values["attempt"], data, attributes)
    if forged is not None:
        return forged
    created = attributes[signing.JOB_CREATED_ATTRIBUTE]
    return signing.report_problem(job, created=created, now=NOW, **values)


# -- keys ---------------------------------------------------------------------------------


def test_an_attempt_key_is_32_bytes(master):
    """attempt_key gives the 32 bytes of an HMAC-SHA256."""
    key = signing.attempt_key(master, "train-1", CREATED, 1)
    assert isinstance(key, bytes) and len(key) == 32


def test_the_same_attempt_always_gets_the_same_key(master):
    """The key is derived, not stored: deriving it twice gives the same bytes."""
    assert signing.attempt_key(master, "train-1", CREATED, 3) == signing.attempt_key(master, "train-1", CREATED, 3)


def test_keys_differ_per_attempt_job_creation_time_and_master_key(master):
    """Changing any one of attempt, job id, creation time (by a microsecond) or master key changes the key."""
    base = signing.attempt_key(master, "train-1", CREATED, 1)
    others = [
        signing.attempt_key(master, "train-1", CREATED, 2),
        signing.attempt_key(master, "train-2", CREATED, 1),
        signing.attempt_key(master, "train-1", CREATED + timedelta(microseconds=1), 1),
        signing.attempt_key(secrets.token_urlsafe(48), "train-1", CREATED, 1),
    ]
    assert len({base, *others}) == 5


job_ids = st.from_regex(r"\A[a-z][a-z0-9-]{0,20}[a-z0-9]\Z")
created_times = st.datetimes(
    min_value=datetime(2000, 1, 1),
    max_value=datetime(2199, 12, 31),
    timezones=st.just(timezone.utc),
)
attempts = st.integers(min_value=1, max_value=10_000)


@given(
    st.tuples(job_ids, created_times, attempts),
    st.tuples(job_ids, created_times, attempts),
)
@example(("train-1", CREATED, 1), ("train-1", CREATED + timedelta(microseconds=1), 1))
@example(("train-1", CREATED, 1), ("train-1", CREATED, 2))
def test_two_different_attempts_never_share_a_key(one, other):
    """Any two (job id, creation time, attempt) that differ get different keys under one master key."""
    if one == other:
        assert signing.attempt_key(MASTER, *one) == signing.attempt_key(MASTER, *other)
    else:
        assert signing.attempt_key(MASTER, *one) != signing.attempt_key(MASTER, *other)


def test_a_creation_time_in_another_zone_that_is_the_same_instant_gets_the_same_key(master):
    """The creation time is an instant: the same moment written with another offset derives the same key."""
    elsewhere = CREATED.astimezone(timezone(timedelta(hours=-7)))
    assert signing.attempt_key(master, "train-1", elsewhere, 1) == signing.attempt_key(master, "train-1", CREATED, 1)


@pytest.mark.parametrize("length", [0, 1, 31])
def test_a_master_key_shorter_than_32_characters_raises_missing_master_key(length):
    """A master key of fewer than 32 characters is refused with a sentence naming TPUJOBS_REPORT_KEY."""
    with pytest.raises(MissingMasterKey, match="TPUJOBS_REPORT_KEY must hold at least 32 characters"):
        signing.attempt_key("k" * length, "train-1", CREATED, 1)


def test_a_master_key_of_exactly_32_characters_is_enough():
    """32 characters is the minimum, and it is accepted."""
    assert len(signing.attempt_key(secrets.token_hex(16), "train-1", CREATED, 1)) == 32


def test_key_text_is_the_prefix_and_unpadded_base64url(master):
    """key_text writes `tpujobs-key-v1:` and 43 base64url characters, no padding."""
    text = signing.key_text(signing.attempt_key(master, "train-1", CREATED, 1))
    assert text.startswith("tpujobs-key-v1:")
    body = text[len("tpujobs-key-v1:") :]
    assert len(body) == 43 and "=" not in body
    assert set(body) <= set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")


# -- signatures ---------------------------------------------------------------------------


def test_a_signature_vouches_for_the_data_it_was_made_for(master):
    """sign then signature_problem with the same key and data: no problem."""
    key = signing.attempt_key(master, "train-1", CREATED, 1)
    data = report_bytes()
    signature = signing.sign(key, data)
    assert signature.startswith("v1=") and len(signature) == 3 + 64
    assert signing.signature_problem(key, data, signature) is None


@given(
    data=st.binary(min_size=1, max_size=512),
    where=st.integers(min_value=0),
    change=st.integers(1, 255),
)
@example(data=b'{"kind": "exited", "exit_code": 1}', where=32, change=1)  # exit 1 becomes exit 0
def test_any_single_byte_change_of_signed_data_is_refused(data, where, change):
    """Whatever byte of the data is changed, to whatever other value, the signature no longer matches."""
    key = signing.attempt_key(MASTER, "train-1", CREATED, 1)
    signature = signing.sign(key, data)
    index = where % len(data)
    forged = bytearray(data)
    forged[index] = (forged[index] ^ change) & 0xFF
    assert signing.signature_problem(key, bytes(forged), signature) == MISMATCH


@given(where=st.integers(min_value=0, max_value=63), replacement=st.sampled_from("0123456789abcdef"))
def test_any_changed_hex_digit_of_a_signature_is_refused(where, replacement):
    """A signature with one hex digit changed is well formed but does not match."""
    key = signing.attempt_key(MASTER, "train-1", CREATED, 1)
    data = b'{"kind": "exited", "exit_code": 0}'
    signature = signing.sign(key, data)
    position = 3 + where
    if signature[position] == replacement:
        replacement = "1" if replacement == "0" else "0"
    forged = signature[:position] + replacement + signature[position + 1 :]
    assert signing.signature_problem(key, data, forged) == MISMATCH


def test_a_flipped_byte_of_the_data_fails_with_the_mismatch_sentence(master):
    """exit_code 1 changed to 0 after signing is refused as not matching the attempt's key."""
    key = signing.attempt_key(master, "train-1", CREATED, 1)
    data = report_bytes(exit_code=1)
    signature = signing.sign(key, data)
    forged = data.replace(b'"exit_code": 1', b'"exit_code": 0')
    assert forged != data
    assert signing.signature_problem(key, forged, signature) == MISMATCH


def test_a_signature_made_with_another_attempts_key_fails(master):
    """Data signed with attempt 2's key does not pass for attempt 1's key."""
    data = report_bytes()
    signature = signing.sign(signing.attempt_key(master, "train-1", CREATED, 2), data)
    assert signing.signature_problem(signing.attempt_key(master, "train-1", CREATED, 1), data, signature) == MISMATCH


@pytest.mark.parametrize("signature", [None, ""])
def test_an_unsigned_report_gets_the_unsigned_sentence(master, signature):
    """No signature attribute, or an empty one: the report is unsigned."""
    key = signing.attempt_key(master, "train-1", CREATED, 1)
    assert signing.signature_problem(key, report_bytes(), signature) == UNSIGNED


@pytest.mark.parametrize(
    "signature",
    [
        "v1=",
        "v1=" + "0" * 63,
        "v1=" + "0" * 65,
        "v1=" + "A" * 64,  # upper-case hex is not what sign() writes
        "v2=" + "0" * 64,
        "0" * 64,
        "v1=" + "0" * 64 + "\n",
        " v1=" + "0" * 64,
        "v1=" + "g" * 64,
    ],
)
def test_a_malformed_signature_gets_the_malformed_sentence(master, signature):
    """Anything but `v1=` and 64 lower-case hex digits is not a v1 signature."""
    key = signing.attempt_key(master, "train-1", CREATED, 1)
    assert signing.signature_problem(key, report_bytes(), signature) == MALFORMED


def test_a_flipped_hex_digit_of_the_signature_fails_with_the_mismatch_sentence(master):
    """The last hex digit of a good signature changed: it no longer matches."""
    key = signing.attempt_key(master, "train-1", CREATED, 1)
    data = report_bytes()
    signature = signing.sign(key, data)
    forged = signature[:-1] + ("0" if signature[-1] != "0" else "1")
    assert signing.signature_problem(key, data, forged) == MISMATCH


def test_the_report_digest_is_the_same_for_the_same_signature_and_differs_otherwise(master):
    """report_digest is stable per signature, and two signatures give two digests."""
    key = signing.attempt_key(master, "train-1", CREATED, 1)
    one, two = signing.sign(key, report_bytes()), signing.sign(key, report_bytes())
    assert signing.report_digest(one) == signing.report_digest(one)
    assert signing.report_digest(one) != signing.report_digest(two)


# -- report_problem -------------------------------------------------------------------------


def test_a_report_signed_by_its_attempt_from_a_host_the_job_has_is_believed(master):
    """Attempt 1, slice 0, worker 1 of a v4-16, signed, timed now: no problem."""
    assert check(make_job(), master, worker_id=1) is None


def test_the_last_host_of_a_two_slice_job_is_in_range(master):
    """Slice 1, worker 1 of a 2-slice v4-16 job is its last host, and it is believed."""
    assert check(make_job(slices=2), master, slice_id=1, worker_id=1) is None


def test_a_worker_beyond_the_slices_hosts_is_out_of_range(master):
    """Worker 2 of a v4-16 (2 hosts per slice) is refused, naming the host count."""
    problem = check(make_job(), master, worker_id=2)
    assert problem == "worker 2 is out of range: each slice has 2 host(s)"


def test_a_slice_beyond_the_jobs_slices_is_out_of_range(master):
    """Slice 2 of a 2-slice job, and slice 1 of a one-slice job, are refused, naming the slice count."""
    assert check(make_job(slices=2), master, slice_id=2) == "slice 2 is out of range: the job has 2 slice(s)"
    assert check(make_job(), master, slice_id=1) == "slice 1 is out of range: the job has 1 slice(s)"


def test_an_attempt_beyond_the_jobs_is_refused(master):
    """A report naming attempt 2 while the job is at attempt 1 is refused, even when signed with attempt 2's key."""
    problem = check(make_job(), master, attempt=2)
    assert problem == "it names attempt 2, but the job is at attempt 1"


def test_a_report_signed_with_another_attempts_key_is_refused(master):
    """A report naming attempt 2 signed with attempt 1's key (a leftover host of attempt 1) is refused."""
    job = at_attempt_2(make_job(), CREATED + timedelta(minutes=10))
    assert check(job, master, attempt=2, key_attempt=1) == signing.MISMATCH


def test_a_report_signed_with_another_jobs_key_is_refused(master):
    """A report about train-1 signed with train-2's key of the same attempt is refused."""
    other = make_job(job_id="train-2")
    assert check(make_job(), master, signed_for=other) == signing.MISMATCH


def test_a_report_signed_under_another_master_key_is_refused(master):
    """Another deployment's key (another master) does not sign for this one."""
    data = report_bytes()
    attributes = attributes_for(make_job(), secrets.token_urlsafe(48), data, 1)
    assert signing.forgery(signing.MasterKeys.of(master), "train-1", 1, data, attributes) == signing.MISMATCH


def test_an_unsigned_or_malformed_report_gets_its_sentence(master):
    """The message alone says it is unsigned, malformed, or of an unknown key version."""
    assert check(make_job(), master, signature="") == signing.UNSIGNED
    assert check(make_job(), master, signature="v1=nothex") == signing.MALFORMED
    data = report_bytes()
    attributes = attributes_for(make_job(), master, data, 1)
    keys = signing.MasterKeys.of(master)
    for name, bad in ((signing.KEY_VERSION_ATTRIBUTE, "one"), (signing.JOB_CREATED_ATTRIBUTE, "-5")):
        assert signing.forgery(keys, "train-1", 1, data, {**attributes, name: bad}) == signing.MALFORMED
    unknown = {**attributes, signing.KEY_VERSION_ATTRIBUTE: "2"}
    assert signing.forgery(keys, "train-1", 1, data, unknown) == signing.UNKNOWN_VERSION


def test_a_job_reused_under_the_same_id_does_not_accept_the_old_jobs_reports(master):
    """A report signed for an earlier job with the same job_id (another creation time) verifies
    (its host was genuine) but is refused against the job of today."""
    earlier = make_job().evolve(created_at=CREATED - timedelta(days=1))
    assert check(make_job(), master, signed_for=earlier) == "it was signed for an earlier job of the same job_id"


def test_a_forged_creation_time_derives_another_key(master):
    """The creation time travels unsigned, but another one derives another key: a mismatch."""
    data = report_bytes()
    attributes = attributes_for(make_job(), master, data, 1)
    attributes[signing.JOB_CREATED_ATTRIBUTE] = str(int(attributes[signing.JOB_CREATED_ATTRIBUTE]) + 1)
    assert signing.forgery(signing.MasterKeys.of(master), "train-1", 1, data, attributes) == signing.MISMATCH


def test_the_previous_master_key_still_verifies_and_an_older_one_does_not(master):
    """A rotation: keys handed out under version 1 verify while 1 is the previous; once it is
    dropped they do not."""
    data = report_bytes()
    signed_v1 = attributes_for(make_job(), master, data, 1, version="1")
    rotated = signing.MasterKeys.of(secrets.token_urlsafe(48), "2", master, "1")
    assert signing.forgery(rotated, "train-1", 1, data, signed_v1) is None
    assert rotated.current_version == "2"
    dropped = signing.MasterKeys.of(rotated.secrets["2"], "2")
    assert signing.forgery(dropped, "train-1", 1, data, signed_v1) == signing.UNKNOWN_VERSION


def test_a_time_before_the_attempt_began_beyond_the_skew_is_refused(master):
    """`at` more than CLOCK_SKEW before attempt 1's waiting_since is refused with both times."""
    at = CREATED - CLOCK_SKEW - timedelta(seconds=1)
    problem = check(make_job(), master, at=at)
    assert problem == f"its time {at.isoformat()} is before attempt 1 began ({CREATED.isoformat()})"


def test_a_time_just_within_the_skew_before_the_attempt_began_is_accepted(master):
    """`at` exactly CLOCK_SKEW before the attempt began is a host clock running behind: believed."""
    assert check(make_job(), master, at=CREATED - CLOCK_SKEW) is None


def test_a_time_in_the_future_beyond_the_skew_is_refused(master):
    """`at` more than CLOCK_SKEW after now is refused as in the future."""
    at = NOW + CLOCK_SKEW + timedelta(seconds=1)
    assert check(make_job(), master, at=at) == f"its time {at.isoformat()} is in the future (now {NOW.isoformat()})"
    an_hour = NOW + timedelta(hours=1)
    assert "is in the future" in (check(make_job(), master, at=an_hour) or "")


def test_a_time_in_the_future_within_the_skew_is_accepted(master):
    """`at` up to CLOCK_SKEW ahead of now is a host clock running ahead: believed."""
    assert check(make_job(), master, at=NOW + CLOCK_SKEW) is None
    assert check(make_job(), master, at=NOW + CLOCK_SKEW - timedelta(seconds=1)) is None


def test_a_report_without_a_time_is_refused(master):
    """A signed report whose `at` is null is refused: it cannot be placed in the attempt."""
    assert check(make_job(), master, at=None) == "the report carries no time ('at')"


def test_a_time_before_the_current_attempt_began_is_refused_for_that_attempt(master):
    """At attempt 2, a report of attempt 2 timed while attempt 1 was running is refused."""
    began = CREATED + timedelta(minutes=20)
    job = at_attempt_2(make_job(), began)
    at = CREATED + timedelta(minutes=5)
    assert check(job, master, attempt=2, at=at) == (
        f"its time {at.isoformat()} is before attempt 2 began ({began.isoformat()})"
    )


def test_a_late_report_of_an_older_attempt_is_believed(master):
    """At attempt 2, a report of attempt 1 signed with attempt 1's key, timed during attempt 1, is believed."""
    job = at_attempt_2(make_job(), CREATED + timedelta(minutes=20))
    assert check(job, master, attempt=1, at=CREATED + timedelta(minutes=10)) is None


def test_a_job_without_a_creation_time_refuses_every_report(master):
    """No creation time: nothing signed can name it."""
    job = make_job()
    data = report_bytes()
    created = attributes_for(job, master, data, 1)[signing.JOB_CREATED_ATTRIBUTE]
    problem = signing.report_problem(
        job.evolve(created_at=None), attempt=1, slice_id=0, worker_id=0, at=NOW, created=created, now=NOW
    )
    assert problem == "it was signed for an earlier job of the same job_id"


# -- scrubbing ------------------------------------------------------------------------------


def test_scrub_removes_a_key_from_an_audit_log_like_json(master):
    """A key_text inside JSON (a queued resource's metadata) is cut out; the rest stays."""
    text = signing.key_text(signing.attempt_key(master, "train-1", CREATED, 1))
    entry = json.dumps({"metadata": {"tpujobs-report-key": text, "startup-script": "#!/bin/bash\necho hi"}})
    scrubbed = signing.scrub(entry)
    assert text not in scrubbed and text[len("tpujobs-key-v1:") :] not in scrubbed
    assert json.loads(scrubbed) == {
        "metadata": {
            "tpujobs-report-key": "tpujobs-key-v1:<redacted>",
            "startup-script": "#!/bin/bash\necho hi",
        }
    }


def test_scrub_removes_every_key_in_the_text(master):
    """Two keys of two attempts, anywhere in the text: both go."""
    one = signing.key_text(signing.attempt_key(master, "train-1", CREATED, 1))
    two = signing.key_text(signing.attempt_key(master, "train-1", CREATED, 2))
    scrubbed = signing.scrub(f"first {one}, then {two}.")
    assert scrubbed == "first tpujobs-key-v1:<redacted>, then tpujobs-key-v1:<redacted>."


def test_scrub_bytes_removes_a_key_from_message_data(master):
    """The bytes form cuts the key out of raw message data and keeps the other bytes, invalid UTF-8 included."""
    text = signing.key_text(signing.attempt_key(master, "train-1", CREATED, 1))
    data = b'\xff{"key": "' + text.encode() + b'", "n": 1}'
    scrubbed = signing.scrub_bytes(data)
    assert text.encode() not in scrubbed
    assert scrubbed == b'\xff{"key": "tpujobs-key-v1:<redacted>", "n": 1}'


@given(st.text())
@example("tpujobs-key-v1")  # the prefix without its colon
@example("tpujobs-key-v2:abcdef")
@example("v1=" + "0" * 64)  # a signature is not a key
def test_scrub_leaves_text_without_a_key_alone(text):
    """Text that holds no `tpujobs-key-v1:` comes back unchanged, as text and as bytes."""
    if "tpujobs-key-v1:" in text:
        return
    assert signing.scrub(text) == text
    assert signing.scrub_bytes(text.encode("utf-8", "surrogatepass")) == text.encode("utf-8", "surrogatepass")


@given(before=st.text(), after=st.text(), key=st.binary(min_size=32, max_size=32))
@example(before="KEY=", after="\n", key=bytes(range(32)))
def test_scrub_removes_any_key_wherever_it_sits(before, after, key):
    """Whatever text surrounds it, the base64 body of a key_text is gone after scrub."""
    body = signing.key_text(key)[len("tpujobs-key-v1:") :]
    assume(body not in before + after)
    assert body not in signing.scrub(before + signing.key_text(key) + after)


def test_scrub_removes_a_key_written_after_a_doubled_prefix(master):
    """`tpujobs-key-v1:` written twice before a key (a script that adds the prefix again) still loses the key."""
    text = signing.key_text(signing.attempt_key(master, "train-1", CREATED, 1))
    body = text[len("tpujobs-key-v1:") :]
    assert body not in signing.scrub(f"REPORT_KEY=tpujobs-key-v1:{text}")


def test_scrub_bytes_removes_a_key_written_after_a_doubled_prefix(master):
    """The bytes form: a doubled prefix before a key still loses the key."""
    text = signing.key_text(signing.attempt_key(master, "train-1", CREATED, 1))
    body = text[len("tpujobs-key-v1:") :].encode()
    assert body not in signing.scrub_bytes(f"REPORT_KEY=tpujobs-key-v1:{text}".encode())
