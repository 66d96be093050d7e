"""`unit-register`, and the proof a warm-pool job's key request must carry: a unit's key is its
pool agent's alone, not any process's on its VM.

A unit runs one job after another. The next job's assignment is readable by every local process
(the metadata server), and so is the VM's identity token, which is all `attempt-key` asked for:
a process a job left behind could ask for the next job's key in the few milliseconds before the
pool agent kills it. So the pool agent, at its first start on the VM and before any job runs
there, makes 32 random bytes in a root-only file and registers their SHA-256 here, with the VM's
identity token. The record is per VM (instance id and creation time: a VM made again under the
same name starts clean) and create-only: the first hash is kept, another is refused (409) and
counted. A pool job's key request must then carry the secret itself (over HTTPS, to this
function alone), compared by hash in constant time; a unit VM that registered none gets no pool
job's key. A job's user cannot read the file (`agent/unit_secret.py`), so it cannot prove it.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
from collections.abc import Mapping
from typing import Any

from tpujobs.engine.identity import InvalidToken, TokenVerifier
from tpujobs.engine.jobs_api.answers import ApiError, Response
from tpujobs.engine.jobs_api.requests import UnitRegisterRequest
from tpujobs.engine.ports import Clock, UnitSecretRecords
from tpujobs.engine.settings import Settings

log = logging.getLogger(__name__)

REGISTER_ACTION = "unit-register"


class UnitSecrets:
    """Answers `unit-register`, and says whether a pool job's key request proves the unit's secret."""

    def __init__(self, store: UnitSecretRecords, settings: Settings, verify_token: TokenVerifier, clock: Clock) -> None:
        self.store = store
        self.settings = settings
        self.verify_token = verify_token
        self.clock = clock

    def register(self, caller: str, request: UnitRegisterRequest) -> Response:
        """Keep the hash for the token's VM: 200 when it is the one kept (again, after a reboot),
        409 (counted) when the VM registered another; 401 or 403 when the token does not say
        which VM of this project asks."""
        if not self.settings.key_url:
            raise ApiError(503, "This deployment hands out no attempt keys (TPUJOBS_KEY_URL is not set).")
        try:
            claims = self.verify_token(request.identity, [self.settings.key_url])
        except InvalidToken as error:
            raise ApiError(401, f"The identity token does not verify: {error}") from None
        vm = compute_engine(claims)
        refusal = _vm_refusal(claims, vm, caller, self.settings)
        if refusal is not None:
            log.warning("refused a unit registration: %s", refusal)
            raise ApiError(403, f"No registration: {refusal}.")
        digest = unit_digest(vm)
        instance = str(vm["instance_id"])
        kept = self.store.register_unit_secret(digest, request.secret_sha256, instance, self.clock())
        if not hmac.compare_digest(kept, request.secret_sha256):
            self.store.count_refused_unit_secret(digest, self.clock())
            log.warning("refused a second secret for unit VM instance %s: the first registration stands", instance)
            raise ApiError(409, f"Instance {instance} registered another secret already: the first one stands.")
        log.info("unit VM instance %s has its secret registered", instance)
        return Response(200, {"registered": instance})

    def refusal(self, vm: Mapping[str, Any], secret: str | None) -> str | None:
        """Why a pool job's key request from the token's VM does not prove the unit's secret, or None."""
        if not vm.get("instance_id") or not isinstance(vm.get("instance_creation_timestamp"), (int, float)):
            return "the token has no instance or creation time: ask for it with format=full"
        kept = self.store.unit_secret_sha256(unit_digest(vm))
        if kept is None:
            return "the VM registered no unit secret (unit-register) before its first job"
        if secret is None:
            return "the request proves no unit secret: only the unit's pool agent gets its jobs' keys"
        if not hmac.compare_digest(secret_sha256(bytes.fromhex(secret)), kept):
            return "the unit secret does not match the one the VM registered"
        return None


def secret_sha256(secret: bytes) -> str:
    """What is registered for a secret: its SHA-256, lower-case hex."""
    return hashlib.sha256(secret).hexdigest()


def unit_digest(vm: Mapping[str, Any]) -> str:
    """The record of one VM's secret (`unit_secrets/{digest}`): its project, instance id and
    creation time, so a VM deleted and made again (another id, another time) finds none."""
    made = int(vm.get("instance_creation_timestamp") or 0)
    key = f"unit-secret\n{vm.get('project_id')}\n{vm.get('instance_id')}\n{made}"
    return hashlib.sha256(key.encode()).hexdigest()[:40]


def compute_engine(claims: Mapping[str, Any]) -> Mapping[str, Any]:
    """The `google.compute_engine` claims of a `format=full` identity token ({} if none)."""
    google = claims.get("google")
    engine = google.get("compute_engine") if isinstance(google, Mapping) else None
    return engine if isinstance(engine, Mapping) else {}


def _vm_refusal(claims: Mapping[str, Any], vm: Mapping[str, Any], caller: str, settings: Settings) -> str | None:
    """Why the token names no VM of this deployment's project that may register, or None."""
    if claims.get("email_verified") is not True or not claims.get("email"):
        return "the token's account is not verified"
    if not settings.local_stack and caller != claims.get("email"):
        return "the caller is not the VM's account"
    if not vm.get("instance_id"):
        return "the token has no instance: ask for it with format=full"
    if not isinstance(vm.get("instance_creation_timestamp"), (int, float)):
        return "the token has no creation time: ask for it with format=full"
    if vm.get("project_id") != settings.project:
        return f"the VM is not in project {settings.project}"
    return None
