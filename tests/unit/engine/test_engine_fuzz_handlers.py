"""Every handler, fed random and hostile messages on the fakes: it returns, and the message is accounted for.

A handler that raises makes the function answer 500, and Pub/Sub redelivers the message until
it is dead-lettered, so for input the property is that nothing is raised at all, and that
each message ends as exactly one of: a job, a rejection document (collection `rejections`,
id = message id) with a reason, or an acknowledged no-op (a heartbeat, a report about a job
that does not exist, a stale observation). Hostile values include shell metacharacters,
newlines, `$(...)`, backticks, quotes and unicode in names, commands and env values.

The generators stay inside the limits that crashed the handlers once (JSON numbers beyond
Python's 4300 digits, here at the end; integers beyond Firestore's 64 bits, timestamps whose UTC
time leaves years 1..9999 and lone surrogates in env values, which only Firestore refuses:
tests/emulator/test_fuzz_handlers.py), so the properties keep looking for new failures instead
of finding the same one every run.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from engine_harness import ZONE, Engine
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from support.fuzz_messages import ADMIN, OWNER, message, next_id, three_live_jobs
from tpujobs.domain.holdings import HoldingState
from tpujobs.domain.platforms import default_platform
from tpujobs.domain.spec import SpecError, decode_spec
from tpujobs.domain.states import JobState
from tpujobs.domain.transitions import Decision, Ignored
from tpujobs.engine.control_requests import ControlRequest
from tpujobs.engine.inbound import InboundMessage, from_cloud_event
from tpujobs.engine.messages import ReportError, decode_report
from tpujobs.engine.qr_state_reports import QrStateReport
from tpujobs.engine.worker_reports import PreemptionNotice, WorkerReport

INT64 = (-(2**63), 2**63 - 1)
TOPICS = ["tpujobs-submit", "tpujobs-worker-events", "tpujobs-preemption", "tpujobs-qr-state", "tpujobs-control"]
FUZZ = settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
    ],
)


def utc_now() -> datetime:
    return datetime.now(timezone.utc)


@pytest.fixture
def eng(engine) -> Engine:
    """ONE engine for the whole test function: every hypothesis example shares it."""
    return engine(admins=(ADMIN,), stuck_after_seconds=0.0)


@pytest.fixture
def jobs(eng: Engine) -> list[str]:
    return three_live_jobs(eng.handle)


def rejection(eng: Engine, message_id: str) -> dict[str, Any] | None:
    """The rejection of the message as the store keeps it, if it was refused."""
    return next((d for d in eng.store.rejection_documents() if d["message_id"] == message_id), None)


# --- hostile values ------------------------------------------------------------------------------

SHELL = [
    "'",
    '"',
    "`id`",
    "$(touch /tmp/pwned)",
    "${IFS}",
    ";",
    "&&",
    "|",
    "\n",
    "\r\n",
    "\\",
    "$HOME",
    "*",
    "x'; touch pwned; '",
    '"; touch pwned; "',
    "\nTPUJOBS_CONFIG_EOF\ntouch pwned\n",
    "TPUJOBS_AGENT_EOF",
    "\u202e",
    "\ufeff",
    "\U0001f600",
    "é",
    "日本",
    "\x7f",
    "\x1b[31m",
    "%s%n",
    "../..",
    "gs://",
    "/",
    ".",
    "..",
    "__name__",
    "{}",
    "null",
    "-",
    "--help",
]
# st.characters() leaves out surrogates by default: a lone one in an env value is a known crash.
texts = st.text(max_size=30)


def weighted(*choices: tuple[int, st.SearchStrategy[Any]]) -> st.SearchStrategy[Any]:
    """One of the strategies, picked with the given weights (st.one_of would pick about evenly)."""
    table = [strategy for weight, strategy in choices for _ in range(weight)]
    return st.sampled_from(range(len(table))).flatmap(lambda i: table[i])


hostile = weighted(
    (2, texts),
    (3, st.lists(st.one_of(st.sampled_from(SHELL), texts), min_size=1, max_size=6).map("".join)),
    (
        1,
        st.builds(lambda piece, n: piece * n, st.text(min_size=1, max_size=3), st.integers(0, 34_000)),
    ),
)
int64 = st.integers(*INT64)
json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), int64, st.floats(), hostile),
    lambda children: st.one_of(st.lists(children, max_size=3), st.dictionaries(texts, children, max_size=3)),
    max_leaves=8,
)
# RFC 3339 times whose UTC time stays inside Firestore's years 1..9999
timestamps = st.builds(
    lambda at, minutes: at.replace(tzinfo=timezone(timedelta(minutes=minutes))).isoformat(),
    st.datetimes(min_value=datetime(2, 1, 1), max_value=datetime(9998, 12, 31)),
    st.integers(-14 * 60, 14 * 60),
)
raw_garbage = st.one_of(
    st.binary(max_size=200),
    st.just(b""),
    st.integers(1, 50_000).map(lambda n: b"[" * n + b"]" * n),
    st.sampled_from([b"\xff\xfe{}", b'{"job_id": "\xed\xa0\x80"}', b"\x00", b"null", b"[]", b'"x"', b"1e999"]),
)


def mostly(good: st.SearchStrategy[Any], bad: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """`good` five times in six: enough well-formed input to get past the door and reach the store."""
    return weighted((5, good), (1, bad))


def broken(base: st.SearchStrategy[dict[str, Any]], fields: list[str]) -> st.SearchStrategy[dict[str, Any]]:
    """A payload with one to three fields replaced by any JSON value or dropped, and maybe unknown fields."""

    @st.composite
    def build(draw: st.DrawFn) -> dict[str, Any]:
        payload = dict(draw(base))
        for field in draw(st.lists(st.sampled_from(fields), min_size=1, max_size=3, unique=True)):
            if draw(st.booleans()):
                payload[field] = draw(json_values)
            else:
                payload.pop(field, None)
        payload.update(draw(st.dictionaries(texts, json_values, max_size=2)))
        return payload

    return build()


def inputs(topic: str, well_formed: st.SearchStrategy[dict[str, Any]], fields: list[str]) -> st.SearchStrategy[Any]:
    """Well-formed payloads with hostile text (6 in 10), broken ones (2 in 10), anything else (2 in 10)."""
    return weighted(
        (6, well_formed),
        (2, broken(well_formed, fields)),
        (1, st.one_of(json_values, raw_garbage)),
        (1, envelope_garbage(topic)),
    )


@st.composite
def envelope_garbage(draw: st.DrawFn, topic: str) -> InboundMessage:
    """What from_cloud_event makes of a broken envelope: data None and a reason."""
    data = draw(
        st.one_of(
            st.just({}),
            st.fixed_dictionaries({"message": st.one_of(json_values, st.just("x"))}),
            st.fixed_dictionaries(
                {"message": st.fixed_dictionaries({"data": st.one_of(hostile.map(lambda t: t + "é"), int64)})}
            ),
        )
    )
    message = from_cloud_event(next_id(), f"//pubsub.googleapis.com/projects/p/topics/{topic}", data)
    # Some garbage happens to be valid base64: then send bytes that cannot be UTF-8 JSON.
    if message.data is not None:
        message = InboundMessage(message.message_id, topic, b"\xff" + message.data)
    return message


def as_message(topic: str, payload: Any) -> InboundMessage:
    return payload if isinstance(payload, InboundMessage) else message(topic, payload)


# --- submit ----------------------------------------------------------------------------------------

SPEC_FIELDS = [
    "job_id",
    "name",
    "owner",
    "accelerator_type",
    "runtime_version",
    "zone",
    "zones",
    "slices",
    "capacity",
    "reservation",
    "priority",
    "setup",
    "command",
    "code_uri",
    "env",
    "on_preemption",
    "on_error",
    "max_restarts",
    "labels",
]
env_names = st.from_regex(r"\A[A-Z][A-Z0-9_]{0,5}\Z")
label_keys = st.from_regex(r"\A[a-z][a-z0-9_-]{0,5}\Z")
spec_payloads = st.fixed_dictionaries(
    {
        "name": mostly(st.from_regex(r"\A[a-z][a-z0-9-]{0,10}[a-z0-9]\Z"), hostile),
        "owner": mostly(st.sampled_from([OWNER, "bob", "c.d+e@x-y.org"]), hostile),
        "accelerator_type": mostly(
            st.sampled_from(["v4-8", "v4-16", "v5litepod-4", "v6e-8"]),
            st.sampled_from(["v4-7", "v99-8", "$(id)"]),
        ),
        "command": mostly(hostile.map(lambda text: text if text.strip() else f"true{text}"), hostile),
    },
    optional={
        "setup": hostile,
        "env": st.dictionaries(mostly(env_names, hostile), hostile, max_size=4),
        "labels": st.dictionaries(
            mostly(label_keys, hostile),
            mostly(st.from_regex(r"\A[a-z0-9_-]{0,8}\Z"), hostile),
            max_size=3,
        ),
        "code_uri": hostile.map(lambda path: f"gs://code-bucket/{path}"),
        "zone": mostly(st.just("us-east5-b"), hostile),
        "slices": mostly(st.integers(1, 4), st.one_of(st.integers(-1, 65), json_values)),
        "max_restarts": mostly(st.integers(0, 100), st.one_of(st.integers(-1, 101), json_values)),
        "runtime_version": mostly(st.just("v2-alpha-tpuv5"), hostile),
        "on_error": st.sampled_from(["resume", "rerun", "fail"]),
        "capacity": mostly(st.sampled_from(["spot", "on-demand"]), st.just("free")),
    },
)


@st.composite
def submissions(draw: st.DrawFn) -> InboundMessage | bytes | dict[str, Any] | Any:
    payload = draw(inputs("tpujobs-submit", spec_payloads, SPEC_FIELDS))
    if isinstance(payload, dict) and "command" in payload:
        if "job_id" not in payload or draw(st.booleans()):
            payload["job_id"] = f"fz-{next_id()}"  # unique per example
        if draw(st.integers(0, 4)) == 0:
            del payload["job_id"]  # derived from the (unique) message id
    return payload


@FUZZ
@given(payload=submissions(), redeliver=st.booleans())
def test_any_submission_becomes_a_job_or_a_rejection_with_a_reason(eng, payload, redeliver) -> None:
    """Hostile specs, random JSON, garbage bytes, broken envelopes: a job (maybe FAILED) or a rejection."""
    inbound = as_message("tpujobs-submit", payload)
    deliveries = [eng.handle(inbound) for _ in range(2 if redeliver else 1)]
    outcome = deliveries[0]
    event(outcome.kind)
    rejected = rejection(eng, inbound.message_id)
    if outcome.kind == "rejected":
        assert outcome.job_id is None and outcome.reason
        assert rejected is not None and rejected["reason"] and rejected["topic"] == "tpujobs-submit"
        assert rejected["deliveries"] == len(deliveries)
        assert all(d.kind == "rejected" for d in deliveries)
        if inbound.data is not None:
            with pytest.raises(SpecError):
                decode_spec(inbound.data, message_id=inbound.message_id)
        return
    assert outcome.kind in ("provisioning", "failed"), outcome
    assert rejected is None
    job = eng.store.get(outcome.job_id or "")
    assert job is not None
    assert job.state is (JobState.PROVISIONING if outcome.kind == "provisioning" else JobState.FAILED)
    assert inbound.data is not None
    decoded = decode_spec(inbound.data, message_id=inbound.message_id)
    # The spec as sent, with the platform the deployment chose where it named none.
    assert job.spec == decoded.model_copy(
        update={"platform": decoded.platform or default_platform(decoded.accelerator_type)}
    )
    if isinstance(payload, dict):
        for field in ("command", "setup", "env", "owner", "name"):
            if field in payload:
                assert getattr(job.spec, field) == payload[field]
    assert [d.kind for d in deliveries[1:]] in ([], ["duplicate"])


# --- reports on the other topics --------------------------------------------------------------------


def job_ids(known: list[str]) -> st.SearchStrategy[Any]:
    return mostly(
        st.sampled_from(known),
        st.one_of(st.just("ghost-job"), st.from_regex(r"\Anever-[a-z0-9]{1,8}\Z"), hostile),
    )


def check_report(eng, inbound: InboundMessage, result: Any, model: type) -> None:
    """None only after a rejection (or for a report that moves nothing); a result never with one."""
    rejected = rejection(eng, inbound.message_id)
    try:
        report = decode_report(model, inbound.data)
    except ReportError:
        report = None
    event("rejected" if rejected else type(result).__name__)
    if report is None:
        assert result is None
        if model in (WorkerReport, PreemptionNotice) and rejected is None:  # a host's: anyone's VM may flood it
            assert eng.service.reports.forgeries.last_counted == inbound.message_id, "undecodable input is counted"
            return
        assert rejected is not None and rejected["reason"], "undecodable input must be recorded"
        assert rejected["topic"] == inbound.topic
        return
    if result is None:
        if rejected is not None:
            assert rejected["reason"]
        elif eng.service.reports.forgeries.last_counted == inbound.message_id:
            pass  # a forgery counted, not recorded as itself: a flood of them costs no write each
        else:  # acknowledged no-op: heartbeats and checkpoints are recorded, they move nothing
            assert model is WorkerReport and report.kind in ("heartbeat", "checkpoint")
        return
    assert isinstance(result, (Decision, Ignored)), result
    assert rejected is None
    job_id = getattr(report, "job_id", None)
    if job_id is not None:
        job = eng.store.get(job_id)
        if job is None:
            assert isinstance(result, Ignored), "a report about no job must not make one"
        elif isinstance(result, Decision):
            assert job.event_seq >= result.job.event_seq


worker_kinds = st.sampled_from(["started", "heartbeat", "exited", "checkpoint"])


def worker_reports(known: list[str]) -> st.SearchStrategy[Any]:
    well_formed = st.fixed_dictionaries(
        {
            "kind": mostly(worker_kinds, hostile),
            "job_id": job_ids(known),
            "attempt": mostly(st.integers(1, 3), int64),
            "slice_id": st.integers(0, 1),
            "worker_id": st.integers(0, 1),
        },
        optional={
            "exit_code": st.one_of(st.sampled_from([0, 0, 1, 137, -9]), int64, st.none()),
            "at": mostly(timestamps, st.one_of(hostile, int64)),
            "step": st.one_of(st.integers(0, 10**6), int64),
            "detail": hostile,
        },
    )
    return inputs("tpujobs-worker-events", well_formed, list(WorkerReport.model_fields))


@FUZZ
@given(data=st.data())
def test_any_worker_report_is_applied_ignored_or_rejected(eng, jobs, data) -> None:
    """started/exited/heartbeat/checkpoint with hostile fields: a decision, a no-op, or a rejection."""
    inbound = as_message("tpujobs-worker-events", data.draw(worker_reports(jobs), label="payload"))
    check_report(eng, inbound, eng.handle(inbound), WorkerReport)


def preemptions(known: list[str]) -> st.SearchStrategy[Any]:
    well_formed = st.fixed_dictionaries(
        {"job_id": job_ids(known), "attempt": mostly(st.integers(1, 3), int64)},
        optional={
            "slice_id": st.integers(0, 1),
            "worker_id": mostly(st.integers(0, 1), int64),
            "reason": hostile,
            "at": mostly(timestamps, hostile),
        },
    )
    return inputs("tpujobs-preemption", well_formed, list(PreemptionNotice.model_fields))


@FUZZ
@given(data=st.data())
def test_any_preemption_notice_is_applied_ignored_or_rejected(eng, jobs, data) -> None:
    """Notices with hostile reasons, stale attempts and unknown jobs: a decision, a no-op, or a rejection."""
    inbound = as_message("tpujobs-preemption", data.draw(preemptions(jobs), label="payload"))
    check_report(eng, inbound, eng.handle(inbound), PreemptionNotice)


QR_STATES = [state.value for state in HoldingState] + ["SUSPENDED"]  # and a word of no state


def qr_reports(known: list[str]) -> st.SearchStrategy[Any]:
    names = mostly(
        st.builds(lambda job, n: f"{job}-a{n}", st.sampled_from(known), st.integers(1, 3)),
        st.one_of(st.from_regex(r"\A[a-z][-a-z0-9]{0,20}[a-z0-9]\Z"), hostile),
    )
    well_formed = st.fixed_dictionaries(
        {
            "queued_resource": names,
            "zone": mostly(st.just(ZONE), hostile),
            "state": mostly(st.sampled_from(QR_STATES), hostile),
        },
        optional={
            "detail": hostile,
            "unhealthy_hosts": st.one_of(st.just(0), st.integers(0, 2), int64),
        },
    )
    return inputs("tpujobs-qr-state", well_formed, list(QrStateReport.model_fields))


@FUZZ
@given(data=st.data())
def test_any_queued_resource_observation_is_applied_ignored_or_rejected(eng, jobs, data) -> None:
    """States, hostile details and foreign resource names: a decision, a no-op, or a rejection."""
    inbound = as_message("tpujobs-qr-state", data.draw(qr_reports(jobs), label="payload"))
    check_report(eng, inbound, eng.handle(inbound), QrStateReport)


def control_requests(known: list[str]) -> st.SearchStrategy[Any]:
    well_formed = st.fixed_dictionaries(
        {
            "action": mostly(st.sampled_from(["cancel", "resume", "rerun"]), hostile),
            "job_id": job_ids(known),
            "owner": mostly(st.sampled_from([OWNER, ADMIN, "eve@example.com"]), hostile),
        }
    )
    return inputs("tpujobs-control", well_formed, list(ControlRequest.model_fields))


@FUZZ
@given(data=st.data())
def test_any_control_request_cancels_restarts_or_is_rejected(eng, jobs, data) -> None:
    """Cancels, resumes and reruns by owners, admins, strangers and of unknown jobs: the job is
    cancelled, runs again (a restart of an ended job, by its owner or an admin), or a rejection says why."""
    payload = data.draw(control_requests(jobs), label="payload")
    inbound = as_message("tpujobs-control", payload)
    result = eng.handle(inbound)
    rejected = rejection(eng, inbound.message_id)
    event("rejected" if rejected else type(result).__name__)
    if result is None and rejected is None:  # a restart: started, or one already started by this request
        request = decode_report(ControlRequest, inbound.data)
        restarted = eng.store.get(request.job_id)
        assert request.action in ("resume", "rerun")
        assert restarted is not None and request.owner in (restarted.owner, ADMIN)
        assert not restarted.state.is_terminal
        return
    if result is None:
        assert rejected is not None and rejected["reason"] and rejected["topic"] == "tpujobs-control"
        return
    assert rejected is None
    request = decode_report(ControlRequest, inbound.data)
    job = eng.store.get(request.job_id)
    assert job is not None and request.owner in (job.owner, ADMIN)
    assert job.state is JobState.CANCELLED or isinstance(result, Ignored)


# --- the inputs that crash the handlers today --------------------------------------------------------

HUGE_NUMBER = b"9" * 5000  # valid JSON; json.loads raises a plain ValueError (int max str digits)


@pytest.mark.parametrize("topic", TOPICS)
def test_a_json_number_too_long_for_python_is_rejected_not_raised(eng, topic) -> None:
    """A 5000-digit number (valid JSON, 5 KB) escapes the decoders as ValueError and crashes every handler."""
    inbound = message(topic, b'{"attempt": ' + HUGE_NUMBER + b', "slices": ' + HUGE_NUMBER + b"}")
    eng.handle(inbound)  # today: ValueError, Exceeds the limit (4300 digits)
    assert (rejection(eng, inbound.message_id) or {}).get("reason")
