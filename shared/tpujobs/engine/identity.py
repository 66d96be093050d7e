"""Who calls the `jobs` HTTP function: the Google ID token that Cloud Run checked, read as it arrives.

Cloud Run checks the token of `X-Serverless-Authorization` (else `Authorization`) before the request
arrives, and may strip its signature. So a signed token is verified by the verifier given, and an unsigned
one is taken only where `Settings.api_platform_auth` says Cloud Run checked it (its expiry, issuer and email
still checked). The caller is the token's `email`, with `email_verified` true. Pure apart from the verifier.
Sources: infra/README.md; for readers: docs/cli.md#the-http-api-the-jobs-function.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime, timezone
from typing import Any, Protocol

SERVERLESS_AUTHORIZATION = "X-Serverless-Authorization"
AUTHORIZATION = "Authorization"
GOOGLE_ISSUERS = ("accounts.google.com", "https://accounts.google.com")
# What Google puts where it removed a token's signature (Cloud Run troubleshooting, "Identity
# token signature redacted by Google").
SIGNATURE_REMOVED = "SIGNATURE_REMOVED_BY_GOOGLE"
CLOCK_SKEW_SECONDS = 10  # clocks of Google and of this instance may differ by this much


class InvalidToken(Exception):
    """An ID token that does not verify; its message is safe to show (it never holds the token)."""


class Unauthenticated(Exception):
    """No identity could be established; the message says why, for a 401."""


class Headers(Protocol):
    """A request's headers as read here: Flask's (not a Mapping, since a name may repeat) or a dict."""

    def items(self) -> Iterable[tuple[str, str]]: ...


TokenVerifier = Callable[[str, Sequence[str]], Mapping[str, Any]]
"""(token, accepted audiences) -> the token's claims, its signature, expiry, issuer and audience
verified; raises InvalidToken, or TransientError when the certificates are out of reach."""


class CallerIdentity:
    """Reads the caller's verified email from a request's headers (production, not the local stack)."""

    def __init__(
        self,
        verify_token: TokenVerifier,
        platform_auth: bool = False,
        clock: Callable[[], datetime] | None = None,
        clock_skew_seconds: float = CLOCK_SKEW_SECONDS,
    ) -> None:
        self.verify_token = verify_token
        self.platform_auth = platform_auth
        self.clock = clock or (lambda: datetime.now(timezone.utc))
        self.clock_skew_seconds = clock_skew_seconds

    def email(self, headers: Headers, audiences: Callable[[], Sequence[str]]) -> str:
        """The caller's email; Unauthenticated saying why not. `audiences` is asked only when a
        signature is to be verified."""
        source, token = bearer_token(headers)
        if signature_removed(token):
            claims = self.platform_checked(source, token)
        else:
            accepted = list(audiences())
            if not accepted:
                raise Unauthenticated("No audience to check the ID token against: set TPUJOBS_API_AUDIENCE.")
            try:
                claims = self.verify_token(token, accepted)
            except InvalidToken as error:
                raise Unauthenticated(f"The ID token does not verify: {error}") from None
        return verified_email(claims)

    def platform_checked(self, source: str, token: str) -> Mapping[str, Any]:
        """The claims of a token whose signature was removed, if this deployment vouches that
        Cloud Run checked it; its expiry and issuer checked here."""
        if not self.platform_auth:
            raise Unauthenticated(
                f"The ID token in {source} has no signature, so it cannot be verified here, and "
                "this deployment does not vouch that Cloud Run checked it "
                "(TPUJOBS_API_PLATFORM_AUTH is not set): send a complete Google-signed ID token."
            )
        try:
            claims = unverified_claims(token)
        except InvalidToken as error:
            raise Unauthenticated(f"The ID token does not verify: {error}") from None
        now = self.clock().timestamp()
        expiry = claims.get("exp")
        if isinstance(expiry, bool) or not isinstance(expiry, (int, float)):
            raise Unauthenticated("The ID token does not verify: it has no expiry ('exp').")
        if expiry + self.clock_skew_seconds < now:
            raise Unauthenticated("The ID token does not verify: it has expired.")
        if claims.get("iss") not in GOOGLE_ISSUERS:
            raise Unauthenticated("The ID token does not verify: its issuer is not Google.")
        return claims


def bearer_token(headers: Headers) -> tuple[str, str]:
    """(the header it came from, the token): X-Serverless-Authorization when present, since that is
    the one Cloud Run checked, else Authorization; Unauthenticated when neither holds `Bearer TOKEN`."""
    serverless = header(headers, SERVERLESS_AUTHORIZATION).strip()
    source = SERVERLESS_AUTHORIZATION if serverless else AUTHORIZATION
    scheme, _, token = (serverless or header(headers, AUTHORIZATION).strip()).partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        if source == SERVERLESS_AUTHORIZATION:
            raise Unauthenticated(f"{SERVERLESS_AUTHORIZATION} is not 'Bearer TOKEN'.")
        raise Unauthenticated("No identity: send a Google ID token as 'Authorization: Bearer TOKEN'.")
    return source, token


def signature_removed(token: str) -> bool:
    """True for `header.payload`, `header.payload.` and `header.payload.SIGNATURE_REMOVED_BY_GOOGLE`."""
    parts = token.split(".")
    return len(parts) == 2 or (len(parts) == 3 and parts[2] in ("", SIGNATURE_REMOVED))


def unverified_claims(token: str) -> dict[str, Any]:
    """The payload of a JWT, read without any check; InvalidToken if it is not one."""
    parts = token.split(".")
    if len(parts) not in (2, 3):
        raise InvalidToken("it is not a JWT (header.payload.signature).")
    payload = parts[1]
    try:
        raw = base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4))
        claims = json.loads(raw.decode("utf-8"))
    except (binascii.Error, UnicodeDecodeError, ValueError, RecursionError):
        raise InvalidToken("its payload is not base64url-encoded JSON.") from None
    if not isinstance(claims, dict):
        raise InvalidToken("its payload is not a JSON object.")
    return claims


def verified_email(claims: Mapping[str, Any]) -> str:
    """The token's email, if Google says it is verified; Unauthenticated otherwise."""
    email = claims.get("email")
    if not isinstance(email, str) or not email or claims.get("email_verified") not in (True, "true"):
        raise Unauthenticated(
            "The ID token carries no verified email: mint it for a user or service account "
            "(a service account's with --include-email)."
        )
    return email


def header(headers: Headers, name: str) -> str:
    """A header's value, whatever its case (Flask's headers are case-insensitive, dicts are not)."""
    wanted = name.lower()
    return next((str(v) for k, v in headers.items() if k.lower() == wanted), "")


def without(text: str, token: str) -> str:
    """`text` with every sizeable piece of the token cut out: errors may quote what they parsed."""
    for piece in sorted({token, *token.split(".")}, key=len, reverse=True):
        if len(piece) >= 8:
            text = text.replace(piece, "<token>")
    return text
