"""The `jobs` HTTP function seen from the CLI: one POST, and its JSON turned back into jobs.

The API answers with the Firestore documents as JSON, timestamps as RFC 3339 strings
(`tpujobs.engine.api.to_json`). `described` and `listed` read answers back into jobs, their timelines
and their exported attempts, so that the CLI renders the same tables whether it read Firestore
or asked the API. Standard library only, apart from the document readers.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from tpujobs.domain.job import Job, JobEvent
from tpujobs.engine.ports import AttemptLogs

# Fields that hold timestamps: an event's `at`, and those ending so (created_at, waiting_since, held_from).
_TIME_SUFFIXES = ("_at", "_since", "_from")


class Unreachable(Exception):
    """The API could not be asked at all (no connection, a timeout); the message says why."""


def post(
    url: str, body: Mapping[str, Any], headers: Mapping[str, str], direct: bool, timeout: float = 60
) -> tuple[int, dict[str, Any]]:
    """POST `body` as JSON; (status, the JSON answer). A refusal is an answer too: only a failure
    to reach the API raises Unreachable. `direct` bypasses proxies (the local stack's loopback)."""
    request = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", **headers},
        method="POST",
    )
    opener = urllib.request.build_opener(*([urllib.request.ProxyHandler({})] if direct else []))
    try:
        with opener.open(request, timeout=timeout) as answer:
            status, raw = answer.status, answer.read()
    except urllib.error.HTTPError as error:
        status, raw = error.code, error.read()
    except OSError as error:
        raise Unreachable(str(error)) from None
    try:
        answer_body = json.loads(raw)
    except ValueError:
        answer_body = None
    if not isinstance(answer_body, dict):
        answer_body = {"error": raw.decode("utf-8", "replace")[:500]}
    return status, answer_body


def described(answer: Mapping[str, Any]) -> tuple[Job, list[JobEvent], dict[int, AttemptLogs]]:
    """A `describe` answer as the job, its events in order, and its exported attempts by number."""
    from tpujobs.adapters.firestore_store import event_from_document

    job = job_from_json(answer["job"])
    events = [event_from_document(_with_times(event)) for event in answer.get("events") or ()]
    logs = {}
    for attempt in answer.get("attempts") or ():
        data = _with_times(attempt)
        if not isinstance(data.get("exported_at"), datetime):
            continue  # not exported yet
        number = data.get("attempt") or int(data.get("id", 0))
        logs[number] = AttemptLogs(
            attempt=number,
            log_uri=data.get("log_uri", ""),
            worker_logs={int(k): v for k, v in (data.get("worker_logs") or {}).items()},
            exported_at=data["exported_at"],
            cut_off_workers=tuple(data.get("cut_off_workers") or ()),
        )
    return job, events, logs


def listed(answer: Mapping[str, Any]) -> list[Job]:
    """A `list` answer as jobs, in its order."""
    return [job_from_json(document) for document in answer.get("jobs") or ()]


def job_from_json(document: Mapping[str, Any]) -> Job:
    """One job document as the API gives it, read back into a Job. A warm pool the caller may not
    see is `<hidden>` in the answer: the spec then reads as naming none (the job's `warm_pool`
    still says `<hidden>`), since no pool is named that."""
    from tpujobs.adapters.firestore_store import job_from_document
    from tpujobs.engine.jobs_api.job_actions import HIDDEN

    data = _with_times(document)
    spec = data.get("spec")
    if isinstance(spec, dict) and spec.get("pool") == HIDDEN:
        data["spec"] = spec = {**spec, "pool": None}
    if isinstance(spec, dict) and isinstance(spec.get("notify"), list):
        # A webhook shown by its host only (`hooks.slack.com/…`) is no URL to read back: the target
        # is left out of the Job, and the answer's JSON still shows it.
        targets = [t for t in spec["notify"] if not (isinstance(t, dict) and _host_only(t.get("webhook")))]
        data["spec"] = {**spec, "notify": targets}
    data["usage"] = [_with_times(usage) for usage in data.get("usage") or ()]
    data["suspect_hosts"] = [_with_times(host) for host in data.get("suspect_hosts") or ()]
    return job_from_document(data)


def _host_only(webhook: Any) -> bool:
    """Whether a webhook is shown by its host alone (the API's answer to all but its owner and admins)."""
    return isinstance(webhook, str) and "://" not in webhook


def parse_time(value: Any) -> datetime | None:
    """An RFC 3339 string from the API as a datetime; None for anything else."""
    parsed = _time(value)
    return parsed if isinstance(parsed, datetime) else None


def _with_times(document: Mapping[str, Any]) -> dict[str, Any]:
    """The document with its timestamp fields as datetimes again."""
    return {
        name: _time(value) if name == "at" or name.endswith(_TIME_SUFFIXES) else value
        for name, value in document.items()
    }


def _time(value: Any) -> Any:
    if not isinstance(value, str):
        return value
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return value
