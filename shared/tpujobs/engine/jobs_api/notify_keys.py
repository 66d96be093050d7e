"""`notify-key`: a team's notification signing key, for the team's own receivers to verify with.

Each team signs with a key of its own (`tpujobs.domain.notify_delivery.NotifyKeys`): the key of a
service account (`account:EMAIL`) goes to those config/service_accounts lets run jobs as it, the
key of an owner (`owner:EMAIL`) to that owner; an admin may ask for any team's. The answer holds
the key under the current version of the notify master key and, while a rotation lasts, under
the previous one too. It is a secret: it is never logged.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tpujobs.domain.notify_delivery import (
    KEY_ID_HEADER,
    KEY_VERSION_HEADER,
    PREVIOUS_KEY_VERSION_HEADER,
    PREVIOUS_SIGNATURE_HEADER,
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
)
from tpujobs.engine.jobs_api.answers import ApiError, Response
from tpujobs.engine.notifications import notify_keys

if TYPE_CHECKING:
    from tpujobs.engine.jobs_api.requests import NotifyKeyRequest
    from tpujobs.engine.ports import AccessPolicyReader
    from tpujobs.engine.settings import Settings

TEAM_KINDS = ("account:", "owner:", "claimed:")


class NotifyKeyActions:
    """Hands a team's signing key to the team's members and to admins."""

    def __init__(self, settings: Settings, access: AccessPolicyReader | None) -> None:
        self.settings = settings
        self.access = access

    def key(self, caller: str, request: NotifyKeyRequest) -> Response:
        """The signing key of the caller's own team (`owner:CALLER`), of a service account the
        caller may run jobs as, or (admins) of any `team`. 403 otherwise; 503 without a key."""
        team = self._team(caller, request)
        keys = notify_keys(self.settings)
        if keys is None:
            raise ApiError(503, "This deployment has no notify signing key: its notifications are not sent.")
        (version, key), *previous = keys.signing(team)
        return Response(
            200,
            {
                "team": team,
                "key_version": version,
                "key": key.decode("ascii"),
                "previous": [{"key_version": v, "key": k.decode("ascii")} for v, k in previous],
                "headers": {
                    "timestamp": TIMESTAMP_HEADER,
                    "signature": SIGNATURE_HEADER,
                    "key_id": KEY_ID_HEADER,
                    "key_version": KEY_VERSION_HEADER,
                    "previous_signature": PREVIOUS_SIGNATURE_HEADER,
                    "previous_key_version": PREVIOUS_KEY_VERSION_HEADER,
                },
            },
        )

    def _team(self, caller: str, request: NotifyKeyRequest) -> str:
        admin = caller in self.settings.admins
        if request.team is not None:
            if not request.team.startswith(TEAM_KINDS):
                raise ApiError(400, f"'team' must start with one of {', '.join(TEAM_KINDS)}.")
            if not admin and request.team != f"owner:{caller}":
                raise ApiError(403, f"{caller} may not have the key of {request.team}: only its members or an admin.")
            return request.team
        account = request.service_account
        if account is None:
            return f"owner:{caller}"
        if not admin and not self._may_run_as(caller, account):
            raise ApiError(
                403, f"{caller} may not have the key of {account}: config/service_accounts does not let it run as it."
            )
        return f"account:{account}"

    def _may_run_as(self, caller: str, account: str) -> bool:
        """Whether config/service_accounts lets `caller` (or a group it is in) run jobs as `account`."""
        if self.access is None:
            return False
        policies = self.access.policies()
        mine = policies.members(caller)
        return any(account in accounts for member, accounts in policies.service_accounts.items() if member in mine)
