"""Who opens the dashboard: the email in Identity-Aware Proxy's signed header, and nothing else.

In production IAP stands in front of the dashboard's Cloud Run service and signs every request it
lets through with `X-Goog-IAP-JWT-Assertion` (ES256, its audience the service's). Only that header
is trusted, verified by the verifier given (`adapters.iap_tokens`): never IAP's unsigned
`X-Goog-Authenticated-User-Email`, which anyone reaching the service directly could set. In the
local stack (`Settings.local_stack`) the caller is the local user its settings name.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tpujobs.engine.identity import Headers, InvalidToken, TokenVerifier, header

IAP_HEADER = "X-Goog-IAP-JWT-Assertion"
IAP_ISSUER = "https://cloud.google.com/iap"
ACCOUNTS_PREFIX = "accounts.google.com:"  # IAP's `email` is plain; its header form has this prefix


class Unauthenticated(Exception):
    """No caller: the message says why, for a 401 (it never holds the token)."""


class DashboardCaller:
    """Reads the caller of one dashboard request."""

    def __init__(
        self,
        verify_token: TokenVerifier,
        audience: str,
        *,
        local_stack: bool = False,
        local_user: str = "",
    ) -> None:
        self.verify_token = verify_token
        self.audience = audience
        self.local_stack = local_stack
        self.local_user = local_user

    def email(self, headers: Headers) -> str:
        """The caller's email; Unauthenticated when no signed IAP header proves one."""
        if self.local_stack:
            if not self.local_user:
                raise Unauthenticated("The local stack names no dashboard user: set TPUJOBS_DASHBOARD_LOCAL_USER.")
            return self.local_user
        token = header(headers, IAP_HEADER).strip()
        if not token:
            raise Unauthenticated(f"No {IAP_HEADER} header: open the dashboard through Identity-Aware Proxy.")
        if not self.audience:
            raise Unauthenticated("This dashboard has no IAP audience to check: set TPUJOBS_DASHBOARD_IAP_AUDIENCE.")
        try:
            claims = self.verify_token(token, [self.audience])
        except InvalidToken as error:
            raise Unauthenticated(f"IAP's header does not verify: {error}") from None
        return iap_email(claims)


def iap_email(claims: Mapping[str, Any]) -> str:
    """The email of verified IAP claims; Unauthenticated when the issuer is not IAP or there is none."""
    if claims.get("iss") != IAP_ISSUER:
        raise Unauthenticated(f"IAP's header does not verify: its issuer is not {IAP_ISSUER}.")
    email = claims.get("email")
    if not isinstance(email, str) or not email.strip():
        raise Unauthenticated("IAP's header carries no email.")
    return email.removeprefix(ACCOUNTS_PREFIX)
