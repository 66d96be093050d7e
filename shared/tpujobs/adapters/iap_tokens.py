"""Identity-Aware Proxy's signed headers verified with google-auth.

IAP signs `X-Goog-IAP-JWT-Assertion` with ES256 keys it publishes at IAP_CERTS_URL as
`{key id: PEM public key}`, the format google-auth reads without PyJWT ("Securing your app with
signed headers"). `verify_token` checks the signature, expiry and audience; the issuer and email
are `engine.dashboard.caller`'s. Library errors become InvalidToken (401) or TransientError (503).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from tpujobs.engine.errors import TransientError
from tpujobs.engine.identity import CLOCK_SKEW_SECONDS, InvalidToken, without

IAP_CERTS_URL = "https://www.gstatic.com/iap/verify/public_key"
CERTS_TIMEOUT_SECONDS = 10.0


class IapTokens:
    """A TokenVerifier of IAP's header against the keys at `certs_url`."""

    def __init__(
        self,
        certs_url: str = IAP_CERTS_URL,
        request: Callable[..., Any] | None = None,
        clock_skew_seconds: int = CLOCK_SKEW_SECONDS,
    ) -> None:
        """`request`: a google-auth transport request (tests pass one serving their own keys);
        None: a caching requests session, built at the first verification."""
        self.certs_url = certs_url or IAP_CERTS_URL
        self.clock_skew_seconds = clock_skew_seconds
        self._request = request
        self._lock = threading.Lock()

    def __call__(self, token: str, audiences: Sequence[str]) -> Mapping[str, Any]:
        from google.auth import exceptions
        from google.oauth2 import id_token

        try:
            return id_token.verify_token(
                token,
                self._transport(),
                audience=list(audiences),
                certs_url=self.certs_url,
                clock_skew_in_seconds=self.clock_skew_seconds,
            )
        except exceptions.TransportError as error:
            raise TransientError(f"could not fetch IAP's public keys: {error}") from None
        except (ValueError, exceptions.GoogleAuthError) as error:
            raise InvalidToken(without(str(error), token)) from None

    def _transport(self) -> Any:
        with self._lock:
            if self._request is None:
                import cachecontrol
                import requests
                from google.auth.transport.requests import Request

                cached = Request(session=cachecontrol.CacheControl(requests.Session()))

                def request(url: str, method: str = "GET", **kwargs: Any) -> Any:
                    kwargs.setdefault("timeout", CERTS_TIMEOUT_SECONDS)
                    return cached(url, method=method, **kwargs)

                self._request = request
            return self._request
