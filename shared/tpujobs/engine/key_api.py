"""The `attempt_key` HTTP function's front door: a worker host trades its VM's identity token for
its attempt's report key, and asks nothing else (a warm-pool unit's agent registers its secret
first, `unit-register`: `jobs_api.unit_secrets`).

It is a function of its own, with its own URL (`TPUJOBS_KEY_URL`, also the audience of the tokens
hosts mint for it), so that the VMs' accounts may invoke it and no other function (infra/functions.tf):
a job's code that mints a token on its VM can ask for a key (which `AttemptKeys` grants only to
the attempt's own hosts) and can no longer call the `jobs` API, which refuses that audience
(`JobsApi.refuse_key_audience`). The caller is the ID token Cloud Run checked for this function's
URL, or in the local stack the caller header. The rules of a grant are `jobs_api.attempt_keys`';
it reads capacity too, one holding's state per request, and changes none (`jobs_api.slice_readiness`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from tpujobs.engine.identity import CallerIdentity, Headers, InvalidToken, TokenVerifier, Unauthenticated, header
from tpujobs.engine.jobs_api.answers import ApiError, Response, answered
from tpujobs.engine.jobs_api.attempt_keys import AttemptKeys, KeyHolders
from tpujobs.engine.jobs_api.requests import (
    CALLER_HEADER,
    AttemptKeyRequest,
    UnitRegisterRequest,
    parse_body,
    validated,
)
from tpujobs.engine.jobs_api.slice_readiness import HoldingStates
from tpujobs.engine.jobs_api.unit_secrets import REGISTER_ACTION
from tpujobs.engine.ports import Clock
from tpujobs.engine.settings import Settings

log = logging.getLogger(__name__)

ACTION = "attempt-key"  # what a host asks for (the body names it, as the agent sends it)
ACTIONS = (ACTION, REGISTER_ACTION)  # and a warm-pool unit's agent registers its secret first


class KeyApi:
    """The `attempt_key` function: who asks (a VM's account), and its attempt's key or the reason not."""

    def __init__(
        self,
        store: KeyHolders,
        settings: Settings,
        clock: Clock,
        verify_vm_token: TokenVerifier | None = None,
        verify_token: TokenVerifier | None = None,
        holdings: HoldingStates | None = None,
    ) -> None:
        """`verify_vm_token` checks the VM identity token in the body (Google's certificates, or the
        local simulator's); `verify_token` the caller's signed token, when Cloud Run left its
        signature. None: no signed token verifies (and no key is handed out). `holdings`: where
        the attempt's holding is read (read-only), so a key waits for its slice to be ACTIVE."""
        self.settings = settings
        self.keys = AttemptKeys(store, settings, verify_vm_token or _no_signed_tokens, clock, holdings)
        self.identity = CallerIdentity(verify_token or _no_signed_tokens, platform_auth=settings.api_platform_auth)

    def handle(self, method: str, url: str, headers: Headers, body: bytes) -> Response:
        """Answer one HTTP request; every refusal is a JSON `{"error": sentence}`."""
        return answered("the attempt_key function", lambda: self._answer(method, url, headers, body))

    def _answer(self, method: str, url: str, headers: Headers, body: bytes) -> Response:
        """The answer to one request; an ApiError says why not."""
        if method.upper() != "POST":
            raise ApiError(405, f"Use POST with a JSON body, not {method}.", {"Allow": "POST"})
        caller = self.caller(headers)
        data = parse_body(body)
        action = data.pop("action")
        if action not in ACTIONS:
            raise ApiError(
                404, f"This function answers {' and '.join(ACTIONS)} only, not {action!r}: use the jobs API."
            )
        request = validated(action, data)
        if isinstance(request, UnitRegisterRequest):
            return self.keys.units.register(caller, request)
        assert isinstance(request, AttemptKeyRequest)
        return self.keys.grant(caller, request)

    def caller(self, headers: Headers) -> str:
        """The VM's account: the verified email of a token for the key URL, or (local stack only)
        the caller header. TransientError when Google's certificates are out of reach."""
        if self.settings.local_stack:
            caller = header(headers, CALLER_HEADER).strip()
            if not caller:
                raise ApiError(401, f"No caller: in the local stack, name yourself in the {CALLER_HEADER} header.")
            return caller
        key_url = self.settings.key_url
        try:
            return self.identity.email(headers, lambda: [key_url] if key_url else [])
        except Unauthenticated as error:
            log.warning("refused a key request: %s", error)
            raise ApiError(401, str(error)) from None


def _no_signed_tokens(token: str, audiences: Sequence[str]) -> Mapping[str, Any]:
    """The verifier of a function built without one: no signed token verifies."""
    raise InvalidToken("this function verifies no signed ID tokens")
