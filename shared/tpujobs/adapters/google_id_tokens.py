"""Google-signed JWTs verified with google-auth, the signing keys cached as Google allows.

`SignedTokens` is the one verifier: google-auth's `verify_token` checks signature (RS256 or ES256,
from the token's header), expiry and audience against the keys at `certs_url`, fetched through a
CacheControl session as google-auth recommends, so a warm instance verifies without asking Google.
The keys must be in Google's `{key id: PEM}` format (the JWK Set format needs PyJWT, not installed).
Library errors become `InvalidToken` (401) or `TransientError` (503). `GoogleIdTokens`, the `jobs`
function's `TokenVerifier`, also checks the issuer; `adapters.iap_tokens` reads IAP's keys with it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from tpujobs.engine.errors import TransientError
from tpujobs.engine.identity import CLOCK_SKEW_SECONDS, GOOGLE_ISSUERS, InvalidToken, without

GOOGLE_CERTS_URL = "https://www.googleapis.com/oauth2/v1/certs"  # google-auth's default
CERTS_TIMEOUT_SECONDS = 10.0  # google-auth's own default is 120 s: longer than the function's


class SignedTokens:
    """Verifies tokens signed with the keys published at `certs_url` (signature, expiry, audience)."""

    def __init__(
        self,
        certs_url: str,
        keys_name: str,
        request: Callable[..., Any] | None = None,
        clock_skew_seconds: int = CLOCK_SKEW_SECONDS,
        timeout: float = CERTS_TIMEOUT_SECONDS,
    ) -> None:
        """`keys_name` says whose keys could not be fetched; `request`: a google-auth transport
        request (tests pass one serving their own keys), None: a caching session, built once."""
        self.certs_url = certs_url
        self.keys_name = keys_name
        self.clock_skew_seconds = clock_skew_seconds
        self.timeout = timeout
        self._request = request
        self._lock = threading.Lock()

    def __call__(self, token: str, audiences: Sequence[str]) -> Mapping[str, Any]:
        from google.auth import exceptions
        from google.oauth2 import id_token

        try:
            claims: Mapping[str, Any] = id_token.verify_token(
                token,
                self._transport(),
                audience=list(audiences),
                certs_url=self.certs_url,
                clock_skew_in_seconds=self.clock_skew_seconds,
            )
        except exceptions.TransportError as error:
            raise TransientError(f"could not fetch {self.keys_name}: {error}") from None
        except (ValueError, exceptions.GoogleAuthError) as error:
            raise InvalidToken(without(str(error), token)) from None
        return claims

    def _transport(self) -> Any:
        """google-auth's requests transport over a caching session, built once."""
        with self._lock:
            if self._request is None:
                import cachecontrol
                import requests
                from google.auth.transport.requests import Request

                cached = Request(session=cachecontrol.CacheControl(requests.Session()))
                timeout = self.timeout

                def request(url: str, method: str = "GET", **kwargs: Any) -> Any:
                    kwargs.setdefault("timeout", timeout)
                    return cached(url, method=method, **kwargs)

                self._request = request
            return self._request


class GoogleIdTokens(SignedTokens):
    """Verifies Google-signed ID tokens against the certificates at `certs_url`; the issuer must be Google."""

    def __init__(
        self,
        certs_url: str = GOOGLE_CERTS_URL,
        clock_skew_seconds: int = CLOCK_SKEW_SECONDS,
        timeout: float = CERTS_TIMEOUT_SECONDS,
    ) -> None:
        super().__init__(
            certs_url or GOOGLE_CERTS_URL,
            "Google's token certificates",
            clock_skew_seconds=clock_skew_seconds,
            timeout=timeout,
        )

    def __call__(self, token: str, audiences: Sequence[str]) -> Mapping[str, Any]:
        claims = super().__call__(token, audiences)
        if claims.get("iss") not in GOOGLE_ISSUERS:
            raise InvalidToken(f"its issuer is not Google: 'iss' must be one of {', '.join(GOOGLE_ISSUERS)}.")
        return claims
