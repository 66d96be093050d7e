"""Posting a team's budget notice to a webhook, signed as job notifications are.

The same targets as `config/notify` holds (a `webhook` URL, or a `webhook_secret` NAME), the same
poster and signature (`domain.notify_delivery`): the body is JSON with `text` for Slack and Chat,
signed with the key of `team:NAME`, derived from the notify master key like any team key. A budget
belongs to no job and so to no job's account: a `webhook_secret` is read in the namespace of the
deployment's TPU VM account (`notify-NAME` there). Any target of a member or an admin is told,
whatever states its `on` lists: a budget notice is no job state. See docs/usage.md#budgets.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from tpujobs.domain.notify import NotifyTarget, webhook_secret_version
from tpujobs.domain.notify_delivery import (
    DELIVERY_HEADER,
    IDEMPOTENCY_HEADER,
    KEY_ID_HEADER,
    KEY_VERSION_HEADER,
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    signature,
)
from tpujobs.engine.errors import PermanentError

if TYPE_CHECKING:
    from tpujobs.engine.budgets import BudgetNotice
    from tpujobs.engine.notifications import NotifySettings, WebhookPoster, WebhookSecrets
    from tpujobs.engine.ports import Clock


def budget_signer(team: str) -> str:
    """Whose key signs a team's budget notices: `team:NAME`."""
    return f"team:{team}"


class WebhookBudgetNotices:
    """`engine.budgets.BudgetNotices` on the notify function's webhook poster."""

    def __init__(self, secrets: WebhookSecrets, poster: WebhookPoster, settings: NotifySettings, clock: Clock) -> None:
        self.secrets, self.poster, self.settings, self.clock = secrets, poster, settings, clock

    def post(self, target: NotifyTarget, notice: BudgetNotice) -> None:
        if self.settings.keys is None:
            raise PermanentError("this deployment has no notify signing key (TPUJOBS_NOTIFY_SIGNING_KEY)")
        self.poster.post(self._url(target), self.headers(notice), self.body(notice))

    def _url(self, target: NotifyTarget) -> str:
        if target.webhook_secret is None:
            return target.webhook or ""
        try:
            version = webhook_secret_version(
                target.webhook_secret, self.settings.project, self.settings.prefix, self.settings.tpu_service_account
            )
        except ValueError as error:
            raise PermanentError(str(error)) from None
        return self.secrets.webhook_url(version)

    @staticmethod
    def body(notice: BudgetNotice) -> bytes:
        return json.dumps(notice.fields(), separators=(",", ":")).encode("utf-8")

    def headers(self, notice: BudgetNotice) -> dict[str, str]:
        assert self.settings.keys is not None
        timestamp = str(int(self.clock().timestamp()))
        signer = budget_signer(notice.team)
        version, key = self.settings.keys.signing(signer)[0]
        delivery = f"budget/{notice.team}/{notice.month}/{notice.threshold}"
        return {
            "Content-Type": "application/json",
            TIMESTAMP_HEADER: timestamp,
            SIGNATURE_HEADER: signature(key, timestamp, self.body(notice)),
            KEY_ID_HEADER: signer,
            KEY_VERSION_HEADER: version,
            DELIVERY_HEADER: delivery,
            IDEMPOTENCY_HEADER: delivery,
        }
