"""The `jobs` HTTP function's front door: request -> caller identity -> action -> JSON answer.

The actions live by topic in `tpujobs.engine.jobs_api`, each request a pydantic model; `submit` is here,
the one path where a job's owner is verified: it is the caller. The caller never comes from the body: it
is the Google ID token Cloud Run checked (`tpujobs.engine.identity`) or, in the local stack only, the
header `X-Tpujobs-Caller`. A token minted for the key URL (the `attempt_key` function's, which a job's
code can mint on its VM) is refused with 403 whatever the action: a VM asks for its key and nothing
else. Actions and status codes: docs/cli.md#the-http-api-the-jobs-function.
"""

from __future__ import annotations

import hashlib
import logging
import re
import uuid
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from tpujobs.domain.spec import SpecError, parse_spec
from tpujobs.engine.identity import (
    CallerIdentity,
    Headers,
    TokenVerifier,
    Unauthenticated,
    bearer_token,
    header,
    unverified_claims,
)
from tpujobs.engine.identity import InvalidToken as InvalidToken  # what a TokenVerifier raises
from tpujobs.engine.jobs_api.answers import ApiError as ApiError
from tpujobs.engine.jobs_api.answers import Response as Response
from tpujobs.engine.jobs_api.answers import answered
from tpujobs.engine.jobs_api.answers import dead_letter_document as dead_letter_document
from tpujobs.engine.jobs_api.answers import quota_document as quota_document
from tpujobs.engine.jobs_api.answers import rejection_document as rejection_document
from tpujobs.engine.jobs_api.answers import to_json as to_json
from tpujobs.engine.jobs_api.job_actions import JobActions
from tpujobs.engine.jobs_api.job_output import JobOutput
from tpujobs.engine.jobs_api.notify_keys import NotifyKeyActions
from tpujobs.engine.jobs_api.pool_actions import WAITING_SHOWN as WAITING_SHOWN
from tpujobs.engine.jobs_api.pool_actions import PoolActions
from tpujobs.engine.jobs_api.records import Records
from tpujobs.engine.jobs_api.requests import CALLER_HEADER as CALLER_HEADER
from tpujobs.engine.jobs_api.requests import ApiRequest, parse_body, validated
from tpujobs.engine.jobs_api.team_actions import TeamActions
from tpujobs.engine.jobs_api.usage_actions import UsageActions
from tpujobs.engine.settings import Settings

if TYPE_CHECKING:
    from tpujobs.engine.jobs_api.job_output import OutputEntries
    from tpujobs.engine.ports import DeadLetterStore, JobDocuments
    from tpujobs.engine.services import Engine, WarmPools
    from tpujobs.engine.usage_report import MonthlyUsage

log = logging.getLogger(__name__)

REQUEST_ID = re.compile(r"^[A-Za-z0-9._-]{1,128}$")
KEY_ACTION = "attempt-key"  # answered by the attempt_key function alone (tpujobs.engine.key_api)
KEY_ACTIONS = (KEY_ACTION, "unit-register")  # both answered there alone
# action -> (the part of the API that answers it, its method): add one here and in jobs_api.requests.
ROUTES = {
    "list": ("job_actions", "list_jobs"),
    "describe": ("job_actions", "describe"),
    "cancel": ("job_actions", "cancel"),
    "resume": ("job_actions", "resume"),
    "rerun": ("job_actions", "rerun"),
    "label": ("job_actions", "label"),
    "dead_letters": ("records", "dead_letters"),
    "rejections": ("records", "rejections"),
    "quotas": ("records", "quotas"),
    "pool-create": ("pool_actions", "create"),
    "pool-list": ("pool_actions", "list"),
    "pool-describe": ("pool_actions", "describe"),
    "pool-resize": ("pool_actions", "resize"),
    "pool-delete": ("pool_actions", "delete"),
    "logs": ("job_output", "read"),
    "notify-key": ("notify_keys", "key"),
    "usage": ("usage_actions", "report"),
    "team-set": ("team_actions", "set"),
    "team-unset": ("team_actions", "unset"),
    "team-show": ("team_actions", "show"),
}


class JobsApi:
    """The `jobs` function: who asks, which action, and its answer; submit is answered here."""

    def __init__(
        self,
        service: Engine,
        store: JobDocuments,
        settings: Settings,
        verify_token: TokenVerifier | None = None,
        dead_letters: DeadLetterStore | None = None,
        output_entries: OutputEntries | None = None,
        usage: MonthlyUsage | None = None,
    ) -> None:
        """`store` is the service's job store, with its documents (what `describe` shows);
        `verify_token` checks signed ID tokens (`adapters.google_id_tokens`, which `runtime`
        wires): without one, only the local stack's caller header and tokens Cloud Run
        checked are accepted. `dead_letters`: the deployment's, for admins; None: none kept.
        `output_entries`: the deployment's Cloud Logging, where `logs` reads jobs' output (None: it reads none)."""
        self.service = service
        self.store = store
        self.settings = settings
        self.verify_token = verify_token or _no_signed_tokens
        self.identity = CallerIdentity(self.verify_token, platform_auth=settings.api_platform_auth)
        self._dead_letters = dead_letters
        self._output_entries = output_entries
        self._usage = usage  # the `usage` action's sums (None: this API answers none)

    def handle(self, method: str, url: str, headers: Headers, body: bytes) -> Response:
        """Answer one HTTP request; every refusal is a JSON `{"error": sentence}`."""
        return answered("the jobs API", lambda: self._answer(method, url, headers, body))

    def _answer(self, method: str, url: str, headers: Headers, body: bytes) -> Response:
        """The answer to one request; an ApiError says why not."""
        if method.upper() != "POST":
            raise ApiError(405, f"Use POST with a JSON body, not {method}.", {"Allow": "POST"})
        self.refuse_key_audience(headers)
        caller = self.caller(headers, url)
        data = parse_body(body)
        action = data.pop("action")
        if action in KEY_ACTIONS:
            raise ApiError(404, f"{action!r} is answered at the key URL (TPUJOBS_KEY_URL), not here.")
        log.info("%s asks to %s %s", caller, action, data.get("job_id") or data.get("name") or "")
        request = validated(action, data)
        if isinstance(request, ApiRequest):
            part, method_name = ROUTES[action]
            answer: Response = getattr(getattr(self, part), method_name)(caller, request)
            return answer
        return self.submit(caller, request)

    def caller(self, headers: Headers, url: str) -> str:
        """Who is asking: the token's verified email (tpujobs.engine.identity), or (local stack only)
        the caller header. TransientError when Google's certificates are out of reach."""
        if self.settings.local_stack:
            caller = header(headers, CALLER_HEADER).strip()
            if not caller:
                raise ApiError(401, f"No caller: in the local stack, name yourself in the {CALLER_HEADER} header.")
            return caller
        try:
            return self.identity.email(headers, lambda: self.audiences(url))
        except Unauthenticated as error:
            log.warning("refused a request: %s", error)
            raise ApiError(401, str(error)) from None

    def audiences(self, url: str) -> list[str]:
        """The ID-token audiences accepted: the configured ones, else this function's own URLs;
        never the key URL (`refuse_key_audience`)."""
        key_url = _url(self.settings.key_url)
        return [a for a in self.settings.api_audiences or own_urls(url) if not key_url or _url(a) != key_url]

    def refuse_key_audience(self, headers: Headers) -> None:
        """403 for a bearer token whose audience is the key URL, before anything else is read.

        Such a token is what a VM's metadata server mints for the `attempt_key` function, and a
        job's code can mint one too: it buys a key there and nothing here. Its claims are read
        unverified, to refuse and never to accept (the caller is still established by `caller`)."""
        key_url = _url(self.settings.key_url)
        if not key_url:
            return
        try:
            claims = unverified_claims(bearer_token(headers)[1])
        except (Unauthenticated, InvalidToken):
            return  # no readable token: `caller` says why, if one is needed
        audience = claims.get("aud")
        audiences = audience if isinstance(audience, list) else [audience]
        if any(isinstance(a, str) and _url(a) == key_url for a in audiences):
            log.warning("refused a token minted for the key URL")
            raise ApiError(
                403,
                "This ID token's audience is the key URL (TPUJOBS_KEY_URL): it is a VM's, good for its "
                "attempt's key and nothing else. Call the jobs API with a token for its own URL.",
            )

    # -- the parts that answer the other actions ------------------------------------------

    @property
    def job_actions(self) -> JobActions:
        """list, describe, cancel, resume, rerun, label."""
        return JobActions(self.service, self.store, self.settings)

    @property
    def pool_actions(self) -> PoolActions:
        """The `pool-*` actions; 503 when this deployment was built without warm pools."""
        return PoolActions(self.warm, self.service.access, self.service.clock, self.settings)

    @property
    def records(self) -> Records:
        """The admin reads: dead letters, rejections, quotas."""
        return Records(self.store, self.service.pools, self._dead_letters, self.settings)

    @property
    def team_actions(self) -> TeamActions:
        """The admin's `team-*` actions, on config/teams and the quota pools."""
        return TeamActions(self.service.teams, self.service.pools, self.settings)

    @property
    def job_output(self) -> JobOutput:
        """`logs`: a job's verified output from Cloud Logging, for its owner or an admin."""
        return JobOutput(self.store, self.settings, self._output_entries, self.job_actions.job)

    @property
    def usage_actions(self) -> UsageActions:
        """`usage`: a month's sums per group; all jobs for admins, the caller's own for others."""
        return UsageActions(self._usage, self.settings)

    @property
    def notify_keys(self) -> NotifyKeyActions:
        """`notify-key`: a team's notification signing key, for its members and admins."""
        return NotifyKeyActions(self.settings, self.service.access)

    @property
    def warm(self) -> WarmPools:
        """The service's warm pools; 503 when this deployment was built without them."""
        if self.service.warm is None:
            raise ApiError(503, "This deployment's API was built without warm pools.")
        return self.service.warm

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
        submission = self.service.submission
        try:
            spec = submission.completed(parse_spec({**request, "owner": caller}, message_id=f"api-{digest}"))
        except SpecError as error:
            raise ApiError(400, f"Invalid spec: {error}") from None
        verdict = submission.vet(spec, owner_verified=True)  # the rights (403), then the size (400)
        if verdict.refusal is not None:
            raise ApiError(400 if verdict.oversized else 403, verdict.refusal)
        outcome = submission.submit_verified(spec, verdict.quotas)
        if outcome.kind == "rejected":
            raise ApiError(409, outcome.reason)
        job = self.store.get(spec.job_id) if spec.job_id else None
        state = job.state.value if job is not None else None
        return Response(200, {"job_id": spec.job_id, "state": state, "outcome": outcome.kind, "reason": outcome.reason})


def _no_signed_tokens(token: str, audiences: Sequence[str]) -> Mapping[str, Any]:
    """The verifier of an API built without one: no signed token verifies."""
    raise InvalidToken("this API verifies no signed ID tokens")


def _url(url: str) -> str:
    """A URL as audiences are compared: without a trailing slash."""
    return url.rstrip("/")


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
