"""Container images in reports, accounting and `describe`: the digest that ran, per attempt.

The agent says in its `started` report which image digest its host runs the command in;
the attempt's usage keeps the first host's, and a different one beside it, never a mix.
"""

from __future__ import annotations

import json
import re

import pytest

from support.job_timelines import a_job, at, move
from support.rich_text import rendered
from tpujobs.cli import commands as cli
from tpujobs.domain.accounting import image_reported
from tpujobs.domain.spec import parse_spec
from tpujobs.domain.states import EventKind
from tpujobs.engine.messages import ReportError, decode_report
from tpujobs.engine.worker_reports import WorkerReport

DIGEST = "sha256:" + "ab" * 32
OTHER = "sha256:" + "cd" * 32


def report(**fields: object) -> bytes:
    body = {
        "kind": "started",
        "job_id": "train-1",
        "attempt": 1,
        "slice_id": 0,
        "worker_id": 0,
        "at": "2026-03-01T09:00:00Z",
        "nonce": "0123456789abcdef",
        **fields,
    }
    return json.dumps(body).encode()


def test_a_started_report_carries_the_image_digest_its_host_runs() -> None:
    """A well-formed digest is read as it was sent."""
    assert decode_report(WorkerReport, report(image_digest=DIGEST)).image_digest == DIGEST
    assert decode_report(WorkerReport, report()).image_digest is None


@pytest.mark.parametrize(
    "digest",
    ["sha256:" + "AB" * 32, "sha256:" + "ab" * 31, "sha512:" + "ab" * 32, "ab" * 32, "", 42],
)
def test_a_malformed_image_digest_refuses_the_report_naming_the_field(digest: object) -> None:
    """Anything but sha256: and 64 lower-case hex digits is refused like any malformed report."""
    with pytest.raises(ReportError, match="image_digest"):
        decode_report(WorkerReport, report(image_digest=digest))


def test_an_exited_report_may_say_why_the_agent_ended_the_attempt() -> None:
    """`detail` on `exited` is read; an overlong one is refused like other details."""
    said = "could not pull image 127.0.0.1:5000/t:x: not found"
    exited = decode_report(WorkerReport, report(kind="exited", exit_code=1, detail=said))
    assert exited.detail == said
    with pytest.raises(ReportError, match="detail"):
        decode_report(WorkerReport, report(kind="exited", exit_code=1, detail="x" * 2000))


def test_the_first_digest_is_the_attempts_and_a_different_one_is_kept_beside_it() -> None:
    """Hosts that pulled different images (the tag moved) are shown as such, never merged."""
    usage = move(a_job(), 5, EventKind.ADMITTED, capacity_state="ACTIVE").usage

    first = image_reported(usage, 1, DIGEST)
    assert first is not None and first[0].image_digest == DIGEST and first[0].other_image_digest is None
    assert image_reported(first, 1, DIGEST) is None  # the same again changes nothing
    both = image_reported(first, 1, OTHER)
    assert both is not None and (both[0].image_digest, both[0].other_image_digest) == (DIGEST, OTHER)
    assert image_reported(both, 1, "sha256:" + "ef" * 32) is None  # one other is enough to say so
    assert image_reported(usage, 7, DIGEST) is None  # an attempt the job never had


def test_describe_shows_the_image_its_pull_policy_each_attempts_digest_and_the_code_commit() -> None:
    """Everything needed to run the same bytes again is on the describe page, whole."""
    spec = a_job().spec.model_dump()
    spec.update(image="127.0.0.1:5000/team/trainer:v1", code_git_commit="a" * 40, code_git_dirty=True)
    job = a_job().evolve(spec=parse_spec(spec))
    job = move(job, 5, EventKind.ADMITTED, capacity_state="ACTIVE")
    usage = image_reported(image_reported(job.usage, 1, DIGEST) or (), 1, OTHER)
    assert usage is not None

    text = rendered(cli.describe_tables(job.evolve(usage=usage), [], {}, now=at(20)))

    assert "127.0.0.1:5000/team/trainer:v1 (pull if-missing)" in text
    assert re.search(rf"image, attempt 1 +{DIGEST}, and {OTHER} on another host", text)
    assert f"{'a' * 40} (with uncommitted changes)" in text


def test_describe_of_a_job_without_an_image_has_no_image_rows() -> None:
    """No image, no commit: nothing about them is shown."""
    text = rendered(cli.describe_tables(a_job(), [], {}, now=at(1)))
    assert "image" not in text and "code commit" not in text
