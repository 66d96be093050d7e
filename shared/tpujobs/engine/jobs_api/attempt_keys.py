"""`attempt-key`: a host trades its VM's instance identity token for its attempt's report key.

No key sits where an API viewer can read it (metadata, labels). A host proves which VM it is with
the identity token Google signs for it (`format=full`), and gets the key only when that VM can be
the job's current placement: same project and zone, running as the job's account, named as its
holding's VMs are named, made after its holding was asked for (the attempt's queued resource, or
the pool unit's that runs it), and the first VM to ask for that worker's key. Who holds a key is
remembered per job incarnation (id and creation time), attempt and worker, so a job submitted
again under a reused id starts clean. See docs/security.md#attempt-keys.

The key is the command's start: it is handed out only once that holding is ACTIVE
(`slice_readiness`), so no command starts on a slice whose interconnect is still activating or
of which only some hosts came; until then the answer is 409, ask again.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Mapping
from datetime import datetime, timedelta, timezone
from typing import Any, Protocol

from tpujobs.domain import signing
from tpujobs.domain.job import Job
from tpujobs.domain.naming import host_name_refusal
from tpujobs.domain.states import JobState
from tpujobs.engine.identity import InvalidToken, TokenVerifier
from tpujobs.engine.jobs_api.answers import ApiError, Response
from tpujobs.engine.jobs_api.requests import AttemptKeyRequest
from tpujobs.engine.jobs_api.slice_readiness import EarlierHosts, HoldingStates, SliceReadiness
from tpujobs.engine.jobs_api.unit_secrets import UnitSecrets
from tpujobs.engine.ports import Clock, JobRecords, MessageRecords, UnitSecretRecords
from tpujobs.engine.settings import Settings

log = logging.getLogger(__name__)

HOLDING = (JobState.PROVISIONING, JobState.RUNNING)  # states in which an attempt's hosts exist
CREATION_SKEW = timedelta(minutes=2)  # Google's VM clock against ours


class KeyHolders(JobRecords, MessageRecords, UnitSecretRecords, EarlierHosts, Protocol):
    """The job, the first VM that held each worker's key (remembered like a signed report),
    each warm-pool unit VM's registered secret, and an earlier attempt's hosts' latest word."""


class AttemptKeys:
    """Answers `attempt-key` requests; every refusal is an ApiError with the reason."""

    def __init__(
        self,
        store: KeyHolders,
        settings: Settings,
        verify_token: TokenVerifier,
        clock: Clock,
        holdings: HoldingStates | None = None,
    ) -> None:
        """`holdings`: where the attempt's holding is read, to hand its key out only once it is
        ACTIVE (`instances.key_api` always gives one); None grants on the job's state alone."""
        self.store = store
        self.settings = settings
        self.verify_token = verify_token
        self.clock = clock
        self.units = UnitSecrets(store, settings, verify_token, clock)  # a pool job's keys: its agent's alone
        self.readiness = SliceReadiness(holdings, clock, store) if holdings is not None else None

    def grant(self, caller: str, request: AttemptKeyRequest) -> Response:
        """The key of the attempt, when the token's VM can be its host and its slice is ready; 409
        (ask again) while the slice is not ready yet; 401 or 403 otherwise."""
        if not self.settings.key_url:
            raise ApiError(503, "This deployment hands out no attempt keys (TPUJOBS_KEY_URL is not set).")
        try:
            claims = self.verify_token(request.identity, [self.settings.key_url])
        except InvalidToken as error:
            raise ApiError(401, f"The identity token does not verify: {error}") from None
        vm = _compute_engine(claims)
        job = self.store.get(request.job_id)
        where = f"{request.job_id} attempt {request.attempt} worker {request.slice_id}-{request.worker_id}"
        refusal = self._refusal(job, request, claims, vm, caller)
        if refusal is not None:
            log.warning("refused the key of %s: %s", where, refusal)
            raise ApiError(403, f"No key for {where}: {refusal}.")
        assert job is not None and job.created_at is not None
        waiting = self.readiness.not_ready(job, where) if self.readiness is not None else None
        if waiting is not None:  # nothing recorded: the same VM asks again
            log.debug("the key of %s waits: %s", where, waiting.body["error"])
            return waiting
        holder = holder_digest(job, request.attempt, request.slice_id, request.worker_id)
        instance = str(vm.get("instance_id"))
        first = self.store.remember_report(holder, instance, job.job_id, request.attempt, self.clock())
        if first != instance:
            raise ApiError(403, f"No key for {where}: another VM (instance {first}) holds it.")
        keys = self.settings.master_keys()
        created = signing.created_micros(job.created_at)
        key = keys.attempt_key(job.job_id, created, request.attempt)
        log.info("handed the key of %s to instance %s", where, instance)
        answer: dict[str, str | None] = {
            "key": signing.key_text(key),
            "key_version": keys.current_version,
            "job_created": str(created),
        }
        if job.spec.slices > 1:
            answer["coordinator"] = self._coordinator(job, request)
        # The spec's env values reach the hosts here, never through metadata (any viewer reads it).
        return Response(200, {**answer, "env": dict(job.spec.env)})

    def _coordinator(self, job: Job, request: AttemptKeyRequest) -> str | None:
        """The multislice coordinator's address (worker 0 of slice 0), as that host gave it when it
        asked for its key; None until then, so the other hosts ask again. The first address
        given is kept: a second VM cannot move it (it gets no key either)."""
        register = coordinator_digest(job, request.attempt)
        if (request.slice_id, request.worker_id) == (0, 0) and request.address:
            return self.store.remember_report(register, request.address, job.job_id, request.attempt, self.clock())
        return self.store.recall_report(register)

    def _refusal(
        self, job: Job | None, request: AttemptKeyRequest, claims: Mapping[str, Any], vm: Mapping[str, Any], caller: str
    ) -> str | None:
        """Why the token's VM cannot be the host asked about, or None."""
        if job is None or job.created_at is None:
            return "no such job"
        if request.attempt != job.attempt or job.state not in HOLDING:
            return f"the job is {job.state.value} at attempt {job.attempt}"
        if request.slice_id >= job.spec.slices or request.worker_id >= job.spec.hosts_per_slice:
            return "the job has no such host"
        account = job.spec.service_account or self.settings.tpu_service_account
        if claims.get("email") != account or claims.get("email_verified") is not True:
            return f"the VM does not run as the job's account {account}"
        if not self.settings.local_stack and caller != account:
            return "the caller is not the VM's account"
        if not vm.get("instance_id"):
            return "the token has no instance: ask for it with format=full"
        if vm.get("project_id") != self.settings.project or vm.get("zone") != job.zone:
            return f"the VM is not in {self.settings.project} zone {job.zone}"
        holding = job.warm_pool_unit or job.queued_resource
        named = host_name_refusal(
            holding, request.slice_id, job.spec.slices, request.worker_id, str(vm.get("instance_name", ""))
        )
        if named is not None:
            return named
        made = vm.get("instance_creation_timestamp")
        if not isinstance(made, (int, float)):
            return "the token has no creation time: ask for it with format=full"
        if job.warm_pool_unit:  # the unit's VMs are older than the job, never than the unit's request
            if job.unit_requested_at is None:
                return f"the job does not say when unit {job.warm_pool_unit} was asked for"
            if _at(made) < job.unit_requested_at - CREATION_SKEW:
                return f"the VM was made before unit {job.warm_pool_unit} was asked for"
            return self.units.refusal(vm, request.unit_secret)  # the unit's pool agent, not any process
        since = job.requested_at or next((u.waiting_since for u in job.usage if u.attempt == job.attempt), None)
        if since is not None and _at(made) < since - CREATION_SKEW:
            return "the VM was made before the attempt asked for capacity"
        return None


def holder_digest(job: Job, attempt: int, slice_id: int, worker_id: int) -> str:
    """The record of who holds one worker's key (`reports_seen/{digest}`): per job incarnation (its
    id and creation time), attempt and worker, so a job deleted and submitted again under the same
    id finds none of the old job's holders."""
    return _record_digest("key-holder", job, attempt, f"{slice_id}-{worker_id}")


def coordinator_digest(job: Job, attempt: int) -> str:
    """The record of a multislice attempt's coordinator address, per job incarnation and attempt."""
    return _record_digest("coordinator", job, attempt, "")


def _record_digest(kind: str, job: Job, attempt: int, host: str) -> str:
    assert job.created_at is not None, "a stored job has its creation time"
    created = signing.created_micros(job.created_at)
    return hashlib.sha256(f"{kind}\n{job.job_id}\n{created}\n{attempt}\n{host}".encode()).hexdigest()[:40]


def _compute_engine(claims: Mapping[str, Any]) -> Mapping[str, Any]:
    google = claims.get("google")
    engine = google.get("compute_engine") if isinstance(google, Mapping) else None
    return engine if isinstance(engine, Mapping) else {}


def _at(seconds: float) -> datetime:
    return datetime.fromtimestamp(seconds, timezone.utc)
