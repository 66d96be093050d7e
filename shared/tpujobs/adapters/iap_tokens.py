"""Identity-Aware Proxy's signed headers verified with google-auth.

IAP signs `X-Goog-IAP-JWT-Assertion` with ES256 keys it publishes at IAP_CERTS_URL as
`{key id: PEM public key}`, the format google-auth reads without PyJWT ("Securing your app with
signed headers"). The verification is `adapters.google_id_tokens.SignedTokens`' (signature, expiry,
audience); the issuer and email are `engine.dashboard.caller`'s.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tpujobs.adapters.google_id_tokens import SignedTokens
from tpujobs.engine.identity import CLOCK_SKEW_SECONDS

IAP_CERTS_URL = "https://www.gstatic.com/iap/verify/public_key"


class IapTokens(SignedTokens):
    """A TokenVerifier of IAP's header against the keys at `certs_url`."""

    def __init__(
        self,
        certs_url: str = IAP_CERTS_URL,
        request: Callable[..., Any] | None = None,
        clock_skew_seconds: int = CLOCK_SKEW_SECONDS,
    ) -> None:
        """`request`: a google-auth transport request (tests pass one serving their own keys);
        None: a caching requests session, built at the first verification."""
        super().__init__(certs_url or IAP_CERTS_URL, "IAP's public keys", request, clock_skew_seconds)
