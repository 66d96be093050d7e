"""The `jobs` HTTP function: submit, list, describe, cancel, resume and rerun jobs over HTTP POST,
and create, list, describe, resize and delete warm pools (`pool-*`).

For `gcloud functions call jobs --data '{"action": "list"}'`, curl, and the CLI's submit,
describe and cancel. `submit` is the one path where a job's owner is verified: it is the
caller (a body `owner` that differs is a 403), and privileges are checked against it.
Thin on purpose: request -> caller identity -> action -> JSON answer with a status code.

The caller's identity never comes from the body. In production it is the `email` of the
Google ID token that Cloud Run checked (`X-Serverless-Authorization` when present, else
`Authorization`), with `email_verified`: verified again here when it carries a signature,
trusted without one only where the deployment vouches for Cloud Run's check
(`tpujobs.engine.identity` says how and why). In the local stack only, it is the header
`X-Tpujobs-Caller`, since there is no Google to sign tokens. The rule of who may cancel is
the domain's (`domain.access.may_cancel`), the same as on `tpujobs-control`; the same rule
decides who sees the values of a job's `spec.env` in `list` and `describe` (others see the
names, each value replaced by `<hidden>`). A warm pool is created by an admin or an owner
`config/policies.pools` allows, resized and deleted by its owner or an admin
(`tpujobs.engine.pool_service` checks); anyone may list and describe pools, but which jobs run on a
pool and wait for it is shown only to its owner, the users it names and admins.

Status codes: 200 done; 400 a body that is not a JSON object with a known `action` and
valid fields (for submit: a valid spec that fits the quota); 401 no identity or one that
does not verify; 403 not the owner nor an admin, or a privilege the caller may not use;
404 no such job or pool; 405 not POST; 409 cancelling a job that already SUCCEEDED or FAILED
(cancelling a CANCELLED job again is a 200 that changes nothing, so retries are safe), or
creating a pool whose name is taken;
503 Firestore or Google's certificates unreachable for now: try again; 500 anything else, logged.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import re
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from tpujobs.domain.access import may_cancel
from tpujobs.domain.labels import LabelError
from tpujobs.domain.pools import MAX_UNITS, POOL_REQUEST_FIELDS, may_use
from tpujobs.domain.restart_overrides import RestartAction
from tpujobs.domain.spec import ID_PATTERN, POOL_NAME_PATTERN, DuplicateKey, SpecError, parse_spec, unique_keys
from tpujobs.domain.states import JobState
from tpujobs.domain.transitions import Decision
from tpujobs.engine.errors import TransientError
from tpujobs.engine.identity import CallerIdentity, Headers, TokenVerifier, Unauthenticated, header
from tpujobs.engine.identity import InvalidToken as InvalidToken  # what a TokenVerifier raises
from tpujobs.engine.pool_service import pool_summary
from tpujobs.engine.ports import JobFilter
from tpujobs.engine.settings import Settings

if TYPE_CHECKING:
    from tpujobs.domain.job import Job
    from tpujobs.domain.pools import Pool
    from tpujobs.engine.job_service import JobService
    from tpujobs.engine.pool_service import PoolOutcome, WarmPoolService
    from tpujobs.engine.ports import DeadLetterStore, JobDocuments

log = logging.getLogger(__name__)

CALLER_HEADER = "X-Tpujobs-Caller"
DEFAULT_LIMIT = 100
MAX_LIMIT = 1000
MAX_BODY_BYTES = 64 * 1024
HIDDEN = "<hidden>"  # what other callers see instead of a job's env values
# action -> the JobsApi method that answers it, called with (caller, request): add one here.
HANDLERS = {
    "list": "list_jobs",
    "describe": "describe",
    "cancel": "cancel",
    "submit": "submit",
    "dead_letters": "dead_letters",
    "rejections": "rejections",
    "quotas": "quotas",
    "resume": "resume",
    "rerun": "rerun",
    "label": "label",
    "pool-create": "pool_create",
    "pool-list": "pool_list",
    "pool-describe": "pool_describe",
    "pool-resize": "pool_resize",
    "pool-delete": "pool_delete",
}
# What each outcome of a resume or rerun answers (`JobService.restart`).
RESTART_STATUS = {"started": 200, "duplicate": 200, "missing": 404, "forbidden": 403, "invalid": 400, "refused": 409}
# What each outcome of a pool's create, resize or delete answers (`WarmPoolService`).
POOL_STATUS = {"done": 200, "missing": 404, "forbidden": 403, "invalid": 400, "exists": 409}
POOL_CREATE_FIELDS = frozenset(POOL_REQUEST_FIELDS - {"owner"})  # the owner is the caller
WAITING_SHOWN = 100  # waiting jobs a pool's answer names (or counts)
REQUEST_ID = re.compile(r"^[A-Za-z0-9._-]{1,128}$")
ACTIONS = tuple(HANDLERS)


@dataclass(frozen=True)
class Response:
    """What the function answers: a status code and a JSON object."""

    status: int
    body: dict[str, Any]
    headers: Mapping[str, str] = field(default_factory=dict)


class ApiError(Exception):
    """A request refused with `status` and a sentence saying why."""

    def __init__(self, status: int, message: str, headers: Mapping[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = dict(headers or {})


class JobsApi:
    """The actions of the `jobs` function, on the job service's store and its cancel."""

    def __init__(
        self,
        service: JobService,
        store: JobDocuments,
        settings: Settings,
        verify_token: TokenVerifier | None = None,
        dead_letters: DeadLetterStore | None = None,
    ) -> None:
        """`store` is the service's job store, with its documents (what `describe` shows);
        `verify_token` checks signed ID tokens (`adapters.google_id_tokens`, which `runtime`
        wires): without one, only the local stack's caller header and tokens Cloud Run
        checked are accepted. `dead_letters`: the deployment's, for admins; None: none kept."""
        self.service = service
        self.store = store
        self.settings = settings
        self.verify_token = verify_token or _no_signed_tokens
        self.identity = CallerIdentity(self.verify_token, platform_auth=settings.api_platform_auth)
        self._dead_letters = dead_letters

    def handle(self, method: str, url: str, headers: Headers, body: bytes) -> Response:
        """Answer one HTTP request; every refusal is a JSON `{"error": sentence}`."""
        try:
            if method.upper() != "POST":
                raise ApiError(405, f"Use POST with a JSON body, not {method}.", {"Allow": "POST"})
            caller = self.caller(headers, url)
            request = parse_body(body)
            action = request.pop("action")
            log.info("%s asks to %s %s", caller, action, request.get("job_id") or request.get("name") or "")
            answer: Callable[[str, dict[str, Any]], Response] = getattr(self, HANDLERS[action])
            return answer(caller, request)
        except ApiError as error:
            return Response(error.status, {"error": error.message}, error.headers)
        except TransientError as error:
            log.warning("jobs API unavailable for now: %s", error)
            return Response(503, {"error": f"Temporarily unavailable, try again: {error}"})
        except Exception:  # still a JSON answer; the details go to the log, not the caller
            log.exception("the jobs API failed")
            return Response(500, {"error": "Internal error: see the function's logs."})

    # -- identity ---------------------------------------------------------------------

    def caller(self, headers: Headers, url: str) -> str:
        """Who is asking: the token's verified email (tpujobs.engine.identity), or (local stack only)
        the caller header. TransientError when Google's certificates are out of reach."""
        if self.settings.local_stack:
            caller = header(headers, CALLER_HEADER).strip()
            if not caller:
                raise ApiError(401, f"No caller: in the local stack, name yourself in the {CALLER_HEADER} header.")
            return caller
        try:
            return self.identity.email(headers, lambda: self.settings.api_audiences or own_urls(url))
        except Unauthenticated as error:
            log.warning("refused a request: %s", error)
            raise ApiError(401, str(error)) from None

    def shown(self, caller: str, job: Job) -> dict[str, Any]:
        """The job's document as `caller` may see it: `spec.env` values only for its owner or an
        admin (the rule of cancel); anyone else gets the names, each value `<hidden>`."""
        document = to_json(self.store.job_document(job))
        spec = document.get("spec")
        if isinstance(spec, dict) and spec.get("env") and not may_cancel(job.owner, caller, self.settings.admins):
            spec["env"] = {name: HIDDEN for name in spec["env"]}
        return document

    # -- actions ----------------------------------------------------------------------

    def list_jobs(self, caller: str, request: dict[str, Any]) -> Response:
        """Jobs newest first, at most `limit`, narrowed by `state` (one, or a list: any of them),
        `owner`, `name_prefix` and `labels` (an object: every label must match)."""
        _only(request, "list", {"state", "owner", "limit", "name_prefix", "labels"})
        states = _states(request.get("state"))
        owner = request.get("owner")
        if owner is not None and (not isinstance(owner, str) or not owner):
            raise ApiError(400, "'owner' must be a non-empty string.")
        prefix = request.get("name_prefix")
        if prefix is not None and (not isinstance(prefix, str) or not prefix):
            raise ApiError(400, "'name_prefix' must be a non-empty string: the start of the jobs' names.")
        labels = _labels(request)
        where = JobFilter(states=states, owner=owner, name_prefix=prefix, labels=labels)
        jobs = self.store.list_jobs(limit=_limit(request, DEFAULT_LIMIT), where=where)
        return Response(200, {"jobs": [self.shown(caller, job) for job in jobs]})

    def label(self, caller: str, request: dict[str, Any]) -> Response:
        """Set (`labels`, an object) and remove (`remove`, a list of keys) a job's labels, if the
        caller owns the job or is an admin; the labels after. A retry that changes nothing is a 200."""
        if "owner" in request or "caller" in request:
            raise ApiError(400, "The caller is never taken from the body: remove 'owner'.")
        _only(request, "label", {"job_id", "labels", "remove"})
        put = _labels(request)
        remove = request.get("remove") or []
        if not isinstance(remove, list) or not all(isinstance(k, str) for k in remove):
            raise ApiError(400, "'remove' must be a list of label names.")
        if not put and not remove:
            raise ApiError(400, "'labels' or 'remove' is required: what to change.")
        job = self._job(request)
        if not may_cancel(job.owner, caller, self.settings.admins):
            raise ApiError(403, f"{caller} may not label {job.job_id}: only its owner or an admin may.")
        try:
            outcome = self.store.relabel(job.job_id, put, remove, caller, self.service.clock)
        except LabelError as error:
            raise ApiError(400, f"Invalid labels: {error}.") from None
        if isinstance(outcome, Decision):
            self.service.announce(outcome.job, outcome.event)
            labels = dict(outcome.job.spec.labels)
        else:
            after = self.store.get(job.job_id)
            labels = dict(after.spec.labels) if after is not None else {}
        return Response(200, {"job_id": job.job_id, "labels": labels, "changed": isinstance(outcome, Decision)})

    def describe(self, caller: str, request: dict[str, Any]) -> Response:
        """The job's document, its timeline, and its attempts' exported logs."""
        _only(request, "describe", {"job_id"})
        job = self._job(request)
        return Response(
            200,
            {
                "job": self.shown(caller, job),
                "events": [to_json(e) for e in self.store.event_documents(job.job_id)],
                "attempts": [to_json(a) for a in self.store.attempt_documents(job.job_id)],
            },
        )

    def cancel(self, caller: str, request: dict[str, Any]) -> Response:
        """Cancel now, if the caller owns the job or is an admin; the job's state after."""
        if "owner" in request or "caller" in request:
            raise ApiError(
                400,
                "The caller is never taken from the body: remove 'owner'; the ID token "
                f"(locally the {CALLER_HEADER} header) says who asks.",
            )
        _only(request, "cancel", {"job_id"})
        job = self._job(request)
        if not may_cancel(job.owner, caller, self.settings.admins):
            raise ApiError(403, f"{caller} may not cancel {job.job_id}: only its owner or an admin may.")
        if job.state is JobState.CANCELLED:
            # A retry of a cancel whose first call died after its commit: finish its release.
            self.service.converge(job.job_id)
        if job.state.is_terminal:
            return self._already_ended(job.job_id, job.state)
        self.service.cancel(job.job_id, f"Cancelled by {caller}.")
        after = self.store.get(job.job_id)
        state = after.state if after is not None else JobState.CANCELLED
        if state is not JobState.CANCELLED:  # it ended otherwise in the meantime
            return self._already_ended(job.job_id, state)
        return Response(200, {"job_id": job.job_id, "state": state.value, "previous_state": job.state.value})

    def resume(self, caller: str, request: dict[str, Any]) -> Response:
        """A new attempt of a FAILED or CANCELLED job, from its checkpoint (`restart`)."""
        return self.restart(caller, request, "resume")

    def rerun(self, caller: str, request: dict[str, Any]) -> Response:
        """A new attempt of an ended job (SUCCEEDED too), from scratch (`restart`)."""
        return self.restart(caller, request, "rerun")

    def restart(self, caller: str, request: dict[str, Any], action: RestartAction) -> Response:
        """Resume or rerun, if the caller owns the job or is an admin; idempotent per `request_id`.

        The body: `job_id`, an optional `request_id` (a retried call with the same one starts
        nothing and answers `"outcome": "duplicate"`) and optional `overrides` (zone, zones,
        capacity, max_restarts, time_limit). 200 started or duplicate; 400 a bad override; 403
        not the owner nor an admin, or an override the owner may not use; 404 no such job; 409
        the job has not ended (or SUCCEEDED, for resume).
        """
        if "owner" in request or "caller" in request:
            raise ApiError(400, f"The caller is never taken from the body: remove 'owner'; the ID token "
                           f"(locally the {CALLER_HEADER} header) says who asks.")  # fmt: skip
        _only(request, action, {"job_id", "request_id", "overrides"})
        job_id = self._job(request).job_id
        request_id = request.get("request_id") or uuid.uuid4().hex
        if not isinstance(request_id, str) or not REQUEST_ID.fullmatch(request_id):
            raise ApiError(400, "'request_id' must be 1 to 128 letters, digits, '.', '_' or '-'.")
        overrides = request.get("overrides") or {}
        if not isinstance(overrides, dict):
            raise ApiError(400, "'overrides' must be an object of fields to change, such as zone or max_restarts.")
        outcome = self.service.restart(job_id, action, caller, request_id, overrides, verified=True)
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

    def submit(self, caller: str, request: dict[str, Any]) -> Response:
        """Submit a job whose owner is the caller: the one path where the owner is verified.

        The body is a job spec (the fields of tpujobs-submit) plus an optional `request_id`
        that makes a retried call the same job when the spec has no `job_id`. A body
        `owner` that is not the caller is refused; privileges (priority, reserved capacity,
        a service account) and quota are checked before anything is written.
        """
        owner = request.get("owner", caller)
        if owner != caller:
            raise ApiError(403, f"You are {caller}: you may not submit a job as {owner!r}.")
        request_id = request.pop("request_id", None) or uuid.uuid4().hex
        if not isinstance(request_id, str) or not REQUEST_ID.fullmatch(request_id):
            raise ApiError(400, "'request_id' must be 1 to 128 letters, digits, '.', '_' or '-'.")
        digest = hashlib.sha256(f"{caller}\n{request_id}".encode()).hexdigest()
        try:
            spec = self.service.completed(parse_spec({**request, "owner": caller}, message_id=f"api-{digest}"))
        except SpecError as error:
            raise ApiError(400, f"Invalid spec: {error}") from None
        refusal = self.service.submission_refusal(spec, owner_verified=True)
        if refusal is not None:
            raise ApiError(403, refusal)
        too_big = self.service.oversize_refusal(spec)
        if too_big is not None:
            raise ApiError(400, too_big)
        outcome = self.service.submit_verified(spec)
        if outcome.kind == "rejected":
            raise ApiError(409, outcome.reason)
        job = self.store.get(spec.job_id) if spec.job_id else None
        state = job.state.value if job is not None else None
        return Response(200, {"job_id": spec.job_id, "state": state, "outcome": outcome.kind, "reason": outcome.reason})

    # -- warm pools: `tpujobs pool` ------------------------------------------------------

    def pool_create(self, caller: str, request: dict[str, Any]) -> Response:
        """Create a pool the caller owns (admins, or owners `config/policies.pools` allows; the
        service checks): 200 with the pool, 400 invalid, 403 not allowed, 409 the name is taken."""
        if "owner" in request:
            raise ApiError(400, "The caller is never taken from the body: remove 'owner'; the caller owns the pool.")
        _only(request, "pool-create", set(POOL_CREATE_FIELDS))
        return self._pool_answer(caller, self.warm.create(request, caller, verified=True))

    def pool_list(self, caller: str, request: dict[str, Any]) -> Response:
        """Every pool by name, each as `pool-describe` shows it to the caller."""
        _only(request, "pool-list", set())
        found = sorted(self.warm.store.list_pools(), key=lambda pool: pool.name)
        return Response(200, {"pools": [self._summary(caller, pool) for pool in found]})

    def pool_describe(self, caller: str, request: dict[str, Any]) -> Response:
        """One pool: settings, units, its queue and its chip-hours (any caller; `_summary` says
        who sees which jobs)."""
        _only(request, "pool-describe", {"name"})
        name = _pool_name(request)
        pool = self.warm.store.get(name)
        if pool is None:
            raise ApiError(404, f"No pool {name!r}.")
        return Response(200, {"pool": self._summary(caller, pool)})

    def pool_resize(self, caller: str, request: dict[str, Any]) -> Response:
        """Ask for `count` units (the pool's owner or an admin): new ones are requested at once,
        surplus ones go once no job is on them."""
        _only(request, "pool-resize", {"name", "count"})
        name = _pool_name(request)
        count = request.get("count")
        if isinstance(count, bool) or not isinstance(count, int):
            raise ApiError(400, f"'count' is required: the number of units, a whole number from 1 to {MAX_UNITS}.")
        return self._pool_answer(caller, self.warm.resize(name, count, caller))

    def pool_delete(self, caller: str, request: dict[str, Any]) -> Response:
        """Delete a pool (its owner or an admin): its jobs are cancelled or moved, its units
        released; `pool` is null once the document is gone."""
        _only(request, "pool-delete", {"name"})
        return self._pool_answer(caller, self.warm.delete(_pool_name(request), caller))

    @property
    def warm(self) -> WarmPoolService:
        """The service's warm pools; 503 when this deployment was built without them."""
        if self.service.warm is None:
            raise ApiError(503, "This deployment's API was built without warm pools.")
        return self.service.warm

    def _summary(self, caller: str, pool: Pool) -> dict[str, Any]:
        """The pool as `caller` may see it: which jobs run on it and wait for it only for its
        owner, the users it names (an e-mail or a group the caller is in) and admins."""
        policies = self.service.access.policies() if self.service.access is not None else None
        members = policies.members(caller) if policies is not None else frozenset({caller})
        show_jobs = may_use(pool, caller, tuple(self.settings.admins), members)
        waiting = self.warm.store.queue(pool.name, WAITING_SHOWN)
        return dict(to_json(pool_summary(pool, self.service.clock(), waiting, show_jobs=show_jobs)))

    def _pool_answer(self, caller: str, outcome: PoolOutcome) -> Response:
        status = POOL_STATUS[outcome.kind]
        if status != 200:
            raise ApiError(status, outcome.reason)
        shown = self._summary(caller, outcome.pool) if outcome.pool is not None else None
        return Response(200, {"outcome": outcome.kind, "reason": outcome.reason, "pool": shown})

    # -- admin reads: the CLI's dead-letters, rejections and quota show -----------------

    def dead_letters(self, caller: str, request: dict[str, Any]) -> Response:
        """Messages that failed too many deliveries, newest first (admins only)."""
        _only(request, "dead_letters", {"topic", "limit"})
        self._admin_only(caller, "dead letters")
        topic = request.get("topic")
        if topic is not None and (not isinstance(topic, str) or not topic):
            raise ApiError(400, "'topic' must be a topic name such as tpujobs-submit.")
        letters = self.dead_letter_reader.list_dead_letters(topic=topic, limit=_limit(request, 50))
        return Response(200, {"dead_letters": [dead_letter_document(letter) for letter in letters]})

    def rejections(self, caller: str, request: dict[str, Any]) -> Response:
        """Messages that could not become jobs, newest first, with the reason (admins only)."""
        _only(request, "rejections", {"limit"})
        self._admin_only(caller, "rejections")
        found = self.store.recent_rejections(limit=_limit(request, 50))
        return Response(200, {"rejections": [rejection_document(rejection) for rejection in found]})

    def quotas(self, caller: str, request: dict[str, Any]) -> Response:
        """Every pool's quota, the chips held under it and how many jobs wait (admins only)."""
        _only(request, "quotas", set())
        self._admin_only(caller, "quotas")
        return Response(200, quota_document(self.service.pools))

    @functools.cached_property
    def dead_letter_reader(self) -> DeadLetterStore:
        """The dead letters of this deployment, as `runtime` passed them in."""
        if self._dead_letters is None:
            raise ApiError(503, "This deployment's API was built without its dead letters.")
        return self._dead_letters

    def _admin_only(self, caller: str, what: str) -> None:
        if caller not in self.settings.admins:
            raise ApiError(403, f"{caller} may not read {what}: only an admin (TPUJOBS_ADMINS) may.")

    def _already_ended(self, job_id: str, state: JobState) -> Response:
        if state is JobState.CANCELLED:
            return Response(200, {"job_id": job_id, "state": state.value, "previous_state": state.value})
        raise ApiError(409, f"{job_id} already ended {state.value}: there is nothing to cancel.")

    def _job(self, request: dict[str, Any]) -> Job:
        job_id = request.get("job_id")
        if not isinstance(job_id, str) or not job_id:
            raise ApiError(400, "'job_id' is required: the job's id as a string.")
        job = self.store.get(job_id) if re.match(ID_PATTERN, job_id) else None  # no such id exists
        if job is None:
            raise ApiError(404, f"No job {job_id!r}.")
        return job


def parse_body(body: bytes) -> dict[str, Any]:
    """The request as a JSON object with a known `action`; ApiError(400) saying what is wrong."""
    if len(body) > MAX_BODY_BYTES:
        raise ApiError(400, f"The body is over {MAX_BODY_BYTES // 1024} KiB.")
    try:
        request = json.loads(body.decode("utf-8"), object_pairs_hook=unique_keys)
    except DuplicateKey as error:
        raise ApiError(400, f"The body is refused: {error}.") from None
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise ApiError(400, 'The body is not JSON: send an object such as {"action": "list"}.') from None
    if not isinstance(request, dict):
        raise ApiError(400, 'The body must be a JSON object such as {"action": "list"}.')
    action = request.get("action")
    if action not in ACTIONS:
        raise ApiError(400, f"'action' must be one of {', '.join(ACTIONS)}, not {action!r}.")
    return request


def dead_letter_document(letter: Any) -> dict[str, Any]:
    """A dead letter as JSON: its document less the original bytes (the payload shows them as text)."""
    document = letter.to_document()
    document.pop("data", None)
    return dict(to_json(document))


def rejection_document(rejection: Any) -> dict[str, Any]:
    """A rejection (a document of `rejections`) as JSON."""
    return {
        "message_id": rejection.message_id,
        "at": to_json(rejection.at),
        "reason": rejection.reason,
        "payload": rejection.payload,
        "topic": rejection.topic,
    }


def quota_document(pools: Any) -> dict[str, Any]:
    """Each pool (`family@zone`) with its quota (None: unlimited), chips held, holders and waiting jobs."""
    if pools is None:
        return {"pools": []}
    quotas = pools.quotas()
    names = sorted({f"{family}@{zone}" for zone, limits in quotas.items() for family in limits} | set(pools.pools()))
    rows = []
    for name in names:
        family, _, zone = name.partition("@")
        holders = pools.view(name).holders
        rows.append(
            {
                "pool": name,
                "quota": (quotas.get(zone) or {}).get(family),
                "held": sum(holder.chips for holder in holders),
                "holders": len(holders),
                "waiting": len(pools.queue(name, limit=MAX_LIMIT)),
            }
        )
    return {"pools": rows}


def _states(value: Any) -> tuple[str, ...]:
    """`state` of a list request: a state's name or a list of them, any case; ApiError(400) otherwise."""
    names = [s.value for s in JobState]
    given = value if isinstance(value, list) else [] if value is None else [value]
    if not all(isinstance(v, str) and v.upper() in names for v in given):
        raise ApiError(400, f"'state' must be one of {', '.join(names)}, or a list of them.")
    return tuple(dict.fromkeys(v.upper() for v in given))


def _labels(request: Mapping[str, Any]) -> dict[str, str]:
    """`labels` of a request: an object of names to strings (none: empty); ApiError(400) otherwise."""
    labels = request.get("labels") or {}
    if not isinstance(labels, dict) or not all(isinstance(v, str) for v in labels.values()):
        raise ApiError(400, "'labels' must be an object of label names to string values.")
    return labels


def _pool_name(request: Mapping[str, Any]) -> str:
    """`name` of a pool request; a string no pool can have is a 404, as a job id is."""
    name = request.get("name")
    if not isinstance(name, str) or not name:
        raise ApiError(400, "'name' is required: the pool's name as a string.")
    if not re.match(POOL_NAME_PATTERN, name):
        raise ApiError(404, f"No pool {name!r}.")
    return name


def _limit(request: Mapping[str, Any], default: int) -> int:
    limit = request.get("limit", default)
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIMIT:
        raise ApiError(400, f"'limit' must be a whole number from 1 to {MAX_LIMIT}.")
    return limit


def _no_signed_tokens(token: str, audiences: Sequence[str]) -> Mapping[str, Any]:
    """The verifier of an API built without one: no signed token verifies."""
    raise InvalidToken("this API verifies no signed ID tokens")


def own_urls(url: str) -> list[str]:
    """The audiences a token for this function carries by default: its URL, from the request.

    Behind Cloud Functions the request arrives over plain HTTP, so the scheme is taken as https.
    """
    parts = urlsplit(url)
    if not parts.netloc:
        return []
    origin = f"https://{parts.netloc}"
    path = parts.path.rstrip("/")
    return list(dict.fromkeys([origin, f"{origin}/", *([f"{origin}{path}"] if path else [])]))


def to_json(value: Any) -> Any:
    """A Firestore document as JSON: timestamps as RFC 3339 in UTC, maps and lists as they are."""
    if isinstance(value, datetime):
        return value.astimezone(timezone.utc).isoformat().replace("+00:00", "Z")
    if isinstance(value, Mapping):
        return {str(k): to_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_json(v) for v in value]
    return value


def _only(request: Mapping[str, Any], action: str, allowed: set[str]) -> None:
    unknown = sorted(set(request) - allowed)
    if unknown:
        fields = ", ".join(sorted(allowed)) or "nothing"
        raise ApiError(400, f"Unknown field {unknown[0]!r} for {action}: it takes {fields}.")
