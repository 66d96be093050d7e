"""Reading a webhook's URL from Secret Manager: the notify function's one secret read.

The function's account may read only `notify-` secrets (infra/notify.tf); what it reads is never
logged, and an error names the secret version, never its value.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tpujobs.adapters.google_errors import translated
from tpujobs.adapters.secrets import build_client
from tpujobs.engine.errors import PermanentError

if TYPE_CHECKING:
    from google.cloud import secretmanager

CALL_TIMEOUT_S = 10.0
MAX_URL_BYTES = 4096


class SecretManagerWebhooks:
    """The WebhookSecrets port on google-cloud-secret-manager."""

    def __init__(self, client: secretmanager.SecretManagerServiceClient) -> None:
        self._client = client

    @classmethod
    def build(cls, endpoint: str = "") -> SecretManagerWebhooks:
        return cls(build_client(endpoint))

    def webhook_url(self, version_name: str) -> str:
        with translated("Secret Manager", f"read the webhook in {version_name}"):
            answer = self._client.access_secret_version(name=version_name, timeout=CALL_TIMEOUT_S)
        data = bytes(answer.payload.data)
        if len(data) > MAX_URL_BYTES:
            raise PermanentError(f"{version_name} holds more than {MAX_URL_BYTES} bytes: not a webhook URL")
        try:
            return data.decode("utf-8").strip()
        except UnicodeDecodeError:
            raise PermanentError(f"{version_name} is not UTF-8 text: not a webhook URL") from None
