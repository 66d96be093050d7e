"""The Logging query subset that holds infra/monitoring.tf's filters to the code's lines."""

from __future__ import annotations

import json

import pytest

from tpujobs.local.log_filters import UnsupportedFilter, compile_filter, entry_from_line, extract, matches

RESOURCE = {"type": "cloud_run_revision", "labels": {"service_name": "tpujobs-submit-job"}}


def entry(**payload: object) -> dict:
    line = {
        "severity": "WARNING",
        "message": "rejected topic=tpujobs-submit",
        "logging.googleapis.com/labels": {"component": "tpujobs", "job_id": "train-1"},
        **payload,
    }
    return entry_from_line(json.dumps(line), RESOURCE)


def test_a_json_line_becomes_an_entry_as_cloud_run_makes_it():
    """severity and labels move to the entry; the rest, message included, is the jsonPayload."""
    made = entry(event="rejected", count=2)
    assert made["severity"] == "WARNING"
    assert made["labels"] == {"component": "tpujobs", "job_id": "train-1"}
    assert made["jsonPayload"] == {"message": "rejected topic=tpujobs-submit", "event": "rejected", "count": 2}
    assert made["resource"] == RESOURCE


def test_a_line_that_is_not_json_is_text_of_default_severity():
    """A framework's own banner matches no jsonPayload filter and no severity>=ERROR."""
    made = entry_from_line("Serving Flask app 'x'\n", RESOURCE)
    assert made == {"resource": RESOURCE, "severity": "DEFAULT", "textPayload": "Serving Flask app 'x'"}
    assert not matches("severity>=ERROR", made)
    assert not matches('jsonPayload.event="rejected"', made)


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ('jsonPayload.event="rejected"', True),
        ('jsonPayload.event="REJECTED"', True),  # string equality ignores case, as Cloud Logging's
        ('jsonPayload.event="job_failed"', False),
        ('jsonPayload.event=("job_failed" OR "rejected")', True),
        ('resource.type="cloud_run_revision" AND resource.labels.service_name=~"^tpujobs-"', True),
        ('resource.labels.service_name=~"^other-"', False),
        ('resource.type="cloud_run_revision"\njsonPayload.event="rejected"', True),  # lines: an implicit AND
        ('jsonPayload.event="job_failed" OR jsonPayload.event="rejected"', True),
        ('NOT jsonPayload.event="rejected"', False),
        ('(jsonPayload.event="x" OR severity>=WARNING) AND labels.job_id="train-1"', True),
        ("severity>=ERROR", False),
        ("severity>=WARNING", True),
        ('severity>="warning"', True),
        ("severity<INFO", False),
        ("jsonPayload.count>=2", True),
        ("jsonPayload.count>2", False),
        ("jsonPayload.count=2", True),
        ('jsonPayload.missing="x"', False),
        ("NOT jsonPayload.missing=x", True),
    ],
)
def test_each_supported_form_matches_as_cloud_logging_does(query, expected):
    """Equality, value sets, regexes, severity order, numbers, NOT, groups, implicit AND."""
    assert matches(query, entry(event="rejected", count=2)) is expected


@pytest.mark.parametrize(
    ("query", "why"),
    [
        ('jsonPayload.event:"rej"', "operator ':'"),
        ('jsonPayload.event!="x"', "operator '!='"),
        ('jsonPayload.event!~"x"', "operator '!~'"),
        ('resource.labels.service_name=starts_with("tpujobs-")', "function starts_with"),
        ('SEARCH("rejected")', "function SEARCH"),
        ('"rejected"', "expected a field"),
        ("rejected", "not under"),
        ('jsonPayload.event="a" AND jsonPayload.b="c" OR severity>=ERROR', "mixed without parentheses"),
        ('-jsonPayload.event="a"', "negation by '-'"),
        ('timestamp>="2024-01-01T00:00:00Z"', "not under"),
        ('jsonPayload.event>"a"', "compares numbers or severities only"),
        ("severity>=LOUD", "is not a severity"),
        ('(jsonPayload.event="a"', "not closed"),
        ("", "empty filter"),
        ('jsonPayload.event="a" {x}', "outside the supported subset"),
    ],
)
def test_syntax_outside_the_subset_is_refused_with_the_reason(query, why):
    """A filter the evaluator cannot read exactly fails loudly, never matching by accident."""
    with pytest.raises(UnsupportedFilter, match=why.replace("(", r"\(")):
        compile_filter(query)


def test_extract_reads_a_field_and_refuses_other_extractors():
    """EXTRACT(field) finds the value or None; REGEXP_EXTRACT is outside the subset."""
    made = entry(event="recovered", recovery_seconds=12.5)
    assert extract("EXTRACT(jsonPayload.recovery_seconds)", made) == 12.5
    assert extract("EXTRACT(labels.job_id)", made) == "train-1"
    assert extract("EXTRACT(jsonPayload.nothing)", made) is None
    with pytest.raises(UnsupportedFilter, match="EXTRACT"):
        extract('REGEXP_EXTRACT(jsonPayload.message, "(\\d+)")', made)
    with pytest.raises(UnsupportedFilter, match="not under"):
        extract("EXTRACT(httpRequest.status)", made)
