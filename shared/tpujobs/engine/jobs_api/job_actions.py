"""The `jobs` API's job actions: list, describe, cancel, resume, rerun and label.

Who may change a job is the domain's rule (`domain.access.may_cancel`): its owner or an admin;
the same rule decides who sees the values of a job's `spec.env` (others see the names, each
value `<hidden>`) and its `notify[].webhook` URLs, which may be credentials: whole in `describe`
for them, their host only (`hooks.slack.com/…`) for anyone else and in `list`. Submit is
`JobsApi.submit`'s.
"""

from __future__ import annotations

import json
import re
import uuid
from typing import TYPE_CHECKING, Any

from tpujobs.domain.access import may_cancel
from tpujobs.domain.job_output import output_link
from tpujobs.domain.labels import LabelError
from tpujobs.domain.notify import hidden_webhooks, without_urls
from tpujobs.domain.pools import may_use
from tpujobs.domain.restart_overrides import RestartAction
from tpujobs.domain.spec import ID_PATTERN
from tpujobs.domain.states import JobState
from tpujobs.domain.transitions import Decision
from tpujobs.engine.jobs_api.answers import ApiError, Response, to_json
from tpujobs.engine.jobs_api.requests import JobRequest, LabelRequest, ListRequest, RestartRequest
from tpujobs.engine.ports import JobFilter

if TYPE_CHECKING:
    from tpujobs.domain.job import Job
    from tpujobs.engine.ports import JobDocuments
    from tpujobs.engine.services import Engine
    from tpujobs.engine.settings import Settings

HIDDEN = "<hidden>"  # what other callers see instead of a job's env values (and pool placement)
# Fields, at any depth of a job's or an event's document, that name the warm pool or unit it runs on.
PLACEMENT_FIELDS = frozenset({"warm_pool", "warm_pool_unit", "unit_requested_at", "pool"})
SENTENCE_FIELDS = frozenset({"reason", "state_reason"})  # sentences that may name them
# What each outcome of a resume or rerun answers (the restart service's `restart`).
RESTART_STATUS = {"started": 200, "duplicate": 200, "missing": 404, "forbidden": 403, "invalid": 400, "refused": 409}


class JobActions:
    """The job actions, on the job store's documents and the job service's changes."""

    def __init__(self, service: Engine, store: JobDocuments, settings: Settings) -> None:
        self.service = service
        self.store = store
        self.settings = settings

    def shown(
        self, caller: str, job: Job, sees: dict[str, bool] | None = None, *, whole_webhooks: bool = False
    ) -> dict[str, Any]:
        """The job's document as `caller` may see it: `spec.env` values only for its owner or an
        admin (the rule of cancel); anyone else gets the names, each value `<hidden>`. Webhook URLs
        whole only where `whole_webhooks` (describe) and for its owner or an admin; else their
        host. Its warm pool placement only for the pool's owner, its users and admins (`_sees_placement`)."""
        document = dict(to_json(self.store.job_document(job)))
        spec = document.get("spec")
        mine = may_cancel(job.owner, caller, self.settings.admins)
        if isinstance(spec, dict) and spec.get("env") and not mine:
            spec["env"] = {name: HIDDEN for name in spec["env"]}
        if isinstance(spec, dict) and spec.get("notify") and not (whole_webhooks and mine):
            document["spec"] = hidden_webhooks(spec)
        if job.warm_pool and not self._sees_placement(caller, job.warm_pool, {} if sees is None else sees):
            document = hide_placement(document, job)
        return document

    def _sees_placement(self, caller: str, pool_name: str, sees: dict[str, bool]) -> bool:
        """Whether `caller` is the pool's owner, one of its users (or in a group it names), or an
        admin; `sees` remembers the answer per pool, so a page of jobs reads each pool once."""
        if pool_name not in sees:
            sees[pool_name] = self._may_see_placement(caller, pool_name)
        return sees[pool_name]

    def _may_see_placement(self, caller: str, pool_name: str) -> bool:
        if caller in self.settings.admins:
            return True
        warm = self.service.warm
        pool = warm.store.get(pool_name) if warm is not None else None
        if pool is None:
            return False
        access = self.service.access
        members = access.policies().members(caller) if access is not None else frozenset({caller})
        return may_use(pool, caller, tuple(self.settings.admins), members)

    def list_jobs(self, caller: str, request: ListRequest) -> Response:
        """Jobs newest first, at most `limit`, narrowed by `state` (one, or a list: any of them),
        `owner`, `name_prefix` and `labels` (an object: every label must match)."""
        where = JobFilter(
            states=request.state, owner=request.owner, name_prefix=request.name_prefix, labels=dict(request.labels)
        )
        jobs = self.store.list_jobs(limit=request.limit, where=where)
        sees: dict[str, bool] = {}  # pool -> whether the caller sees its placement
        return Response(200, {"jobs": [self.shown(caller, job, sees) for job in jobs]})

    def describe(self, caller: str, request: JobRequest) -> Response:
        """The job's document, its timeline, and its attempts' exported logs."""
        job = self.job(request.job_id)
        events = [dict(to_json(e)) for e in self.store.event_documents(job.job_id)]
        if job.warm_pool and not self._sees_placement(caller, job.warm_pool, {}):
            events = [hide_placement(event, job) for event in events]
        return Response(
            200,
            {
                "job": self.shown(caller, job, whole_webhooks=True),
                "events": events,
                "attempts": [to_json(a) for a in self.store.attempt_documents(job.job_id)],
                "notifications": [_no_urls(to_json(n)) for n in self.store.notification_documents(job.job_id)],
                "output_link": self._output_link(job),
            },
        )

    def _output_link(self, job: Job) -> str | None:
        """The Logs Explorer link of the job's output, with this deployment's project."""
        config = self.settings
        return output_link(config.project, config.prefix, job.job_id, job.spec.cloud_logging, config.cloud_logging)

    def cancel(self, caller: str, request: JobRequest) -> Response:
        """Cancel now, if the caller owns the job or is an admin; the job's state after."""
        job = self.job(request.job_id)
        if not may_cancel(job.owner, caller, self.settings.admins):
            raise ApiError(403, f"{caller} may not cancel {job.job_id}: only its owner or an admin may.")
        if job.state is JobState.CANCELLED:
            # A retry of a cancel whose first call died after its commit: finish its release.
            self.service.converge(job.job_id)
        if job.state.is_terminal:
            return _already_ended(job.job_id, job.state)
        self.service.cancel(job.job_id, f"Cancelled by {caller}.")
        after = self.store.get(job.job_id)
        state = after.state if after is not None else JobState.CANCELLED
        if state is not JobState.CANCELLED:  # it ended otherwise in the meantime
            return _already_ended(job.job_id, state)
        return Response(200, {"job_id": job.job_id, "state": state.value, "previous_state": job.state.value})

    def resume(self, caller: str, request: RestartRequest) -> Response:
        """A new attempt of a FAILED or CANCELLED job, from its checkpoint (`restart`)."""
        return self.restart(caller, request, "resume")

    def rerun(self, caller: str, request: RestartRequest) -> Response:
        """A new attempt of an ended job (SUCCEEDED too), from scratch (`restart`)."""
        return self.restart(caller, request, "rerun")

    def restart(self, caller: str, request: RestartRequest, action: RestartAction) -> Response:
        """Resume or rerun, if the caller owns the job or is an admin; idempotent per `request_id`.

        A retried call with the same `request_id` starts nothing and answers `"outcome":
        "duplicate"`; `overrides` may change zone, zones, capacity, max_restarts, time_limit.
        200 started or duplicate; 400 a bad override; 403 not the owner nor an admin, or an
        override the owner may not use; 404 no such job; 409 the job has not ended (or
        SUCCEEDED, for resume).
        """
        job_id = self.job(request.job_id).job_id
        request_id = request.request_id or uuid.uuid4().hex
        outcome = self.service.restart(job_id, action, caller, request_id, dict(request.overrides), verified=True)
        status = RESTART_STATUS[outcome.kind]
        if status != 200:
            raise ApiError(status, outcome.reason)
        job = outcome.job
        return Response(
            200,
            {
                "job_id": job_id,
                "outcome": outcome.kind,
                "request_id": request_id,
                "state": job.state.value if job else None,
                "attempt": job.attempt if job else None,
                "reason": outcome.reason,
            },
        )

    def label(self, caller: str, request: LabelRequest) -> Response:
        """Set (`labels`) and remove (`remove`) a job's labels, if the caller owns the job or is
        an admin; the labels after. A retry that changes nothing is a 200."""
        job = self.job(request.job_id)
        if not may_cancel(job.owner, caller, self.settings.admins):
            raise ApiError(403, f"{caller} may not label {job.job_id}: only its owner or an admin may.")
        try:
            outcome = self.store.relabel(
                job.job_id, dict(request.labels), list(request.remove), caller, self.service.clock
            )
        except LabelError as error:
            raise ApiError(400, f"Invalid labels: {error}.") from None
        if isinstance(outcome, Decision):
            self.service.announce(outcome.job, outcome.event)
            labels = dict(outcome.job.spec.labels)
        else:
            after = self.store.get(job.job_id)
            labels = dict(after.spec.labels) if after is not None else {}
        return Response(200, {"job_id": job.job_id, "labels": labels, "changed": isinstance(outcome, Decision)})

    def job(self, job_id: str) -> Job:
        """The job, or a 404: an id no job can have is never looked up."""
        job = self.store.get(job_id) if re.match(ID_PATTERN, job_id) else None
        if job is None:
            raise ApiError(404, f"No job {job_id!r}.")
        return job


def hide_placement(document: dict[str, Any], job: Job) -> dict[str, Any]:
    """The document (a job's or an event's) with the pool and unit the job runs on hidden: the
    fields that hold them, and their names in the sentences that say them (reasons)."""
    names = [name for name in (job.warm_pool_unit, job.warm_pool) if name]  # the unit's name first: it holds the pool's

    def hidden(fields: dict[str, Any]) -> dict[str, Any]:
        out = {}
        for key, value in fields.items():
            if key in PLACEMENT_FIELDS and value:
                value = HIDDEN
            elif key in SENTENCE_FIELDS and isinstance(value, str):
                for name in names:
                    value = value.replace(name, HIDDEN)
            out[key] = value
        return out

    answer: dict[str, Any] = json.loads(json.dumps(document), object_hook=hidden)
    return answer


def _no_urls(record: Any) -> Any:
    """A notification record with any URL in its text cut to its host: records name targets by
    label, never by URL, and a receiver's error must not put one back."""
    if not isinstance(record, dict):
        return record
    return {key: without_urls(value) if isinstance(value, str) else value for key, value in record.items()}


def _already_ended(job_id: str, state: JobState) -> Response:
    if state is JobState.CANCELLED:
        return Response(200, {"job_id": job_id, "state": state.value, "previous_state": state.value})
    raise ApiError(409, f"{job_id} already ended {state.value}: there is nothing to cancel.")
