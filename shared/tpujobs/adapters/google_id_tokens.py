"""Google ID tokens verified with google-auth, Google's certificates cached as they allow.

`GoogleIdTokens` is the `tpujobs.engine.identity.TokenVerifier` of the deployed `jobs` function:
google-auth's `verify_token` checks signature, expiry and audience, and the issuer is checked here. The
certificates come through a CacheControl session, as google-auth recommends, so a warm instance verifies
without asking Google. `certs_url` must serve Google's `{key id: X.509 PEM}` format (the JWK Set format
needs PyJWT, not installed). Library errors become `InvalidToken` (401) or `TransientError` (503).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from typing import Any

from tpujobs.engine.errors import TransientError
from tpujobs.engine.identity import CLOCK_SKEW_SECONDS, GOOGLE_ISSUERS, InvalidToken, without

GOOGLE_CERTS_URL = "https://www.googleapis.com/oauth2/v1/certs"  # google-auth's default
CERTS_TIMEOUT_SECONDS = 10.0  # google-auth's own default is 120 s: longer than the function's


class GoogleIdTokens:
    """Verifies Google-signed ID tokens against the certificates at `certs_url`."""

    def __init__(
        self,
        certs_url: str = GOOGLE_CERTS_URL,
        clock_skew_seconds: int = CLOCK_SKEW_SECONDS,
        timeout: float = CERTS_TIMEOUT_SECONDS,
    ) -> None:
        self.certs_url = certs_url or GOOGLE_CERTS_URL
        self.clock_skew_seconds = clock_skew_seconds
        self.timeout = timeout
        self._request: Any = None
        self._lock = threading.Lock()

    def __call__(self, token: str, audiences: Sequence[str]) -> Mapping[str, Any]:
        from google.auth import exceptions
        from google.oauth2 import id_token

        try:
            claims = id_token.verify_token(
                token,
                self._transport(),
                audience=list(audiences),
                certs_url=self.certs_url,
                clock_skew_in_seconds=self.clock_skew_seconds,
            )
        except exceptions.TransportError as error:
            raise TransientError(f"could not fetch Google's token certificates: {error}") from None
        except (ValueError, exceptions.GoogleAuthError) as error:
            raise InvalidToken(without(str(error), token)) from None
        if claims.get("iss") not in GOOGLE_ISSUERS:
            raise InvalidToken(f"its issuer is not Google: 'iss' must be one of {', '.join(GOOGLE_ISSUERS)}.")
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
