"""Job secrets in Secret Manager through google-cloud-secret-manager.

Each service account has its own namespace of secret ids (`tpujobs.domain.secrets`):
`set` creates `{prefix}tpujobs_{account id}_{NAME}` when it is missing, labelled
`tpujobs: secret` and annotated with the account's email, then adds a version; `list` shows
tpujobs' secrets with their latest version, never a value. Locally the same client talks REST
to the stack's Secret Manager (`TPUJOBS_SECRETS_ENDPOINT`) with anonymous credentials, which
that server takes as the local user; in production it is the real API with the caller's
default credentials. Library errors become TransientError or PermanentError here, and no
message ever carries a secret's value.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

from google.api_core import exceptions as api_exceptions

from tpujobs.adapters.google_errors import translated
from tpujobs.domain.secrets import account_id, parse_secret_id, secret_id
from tpujobs.engine.errors import PermanentError
from tpujobs.engine.settings import Settings

if TYPE_CHECKING:
    from google.cloud import secretmanager

CALL_TIMEOUT_S = 30.0
LABEL = {"tpujobs": "secret"}  # what Terraform and `list` recognise tpujobs' secrets by
# The bearer token the local stack's operator (the CLI, the tests) shows its local Secret
# Manager, which, like Google's, answers 401 to a request that shows none.
LOCAL_OPERATOR_TOKEN = "local-operator"
ACCOUNT_ANNOTATION = "tpujobs-account"  # the account's full email (the id holds its local part)


def build_client(endpoint: str = "") -> secretmanager.SecretManagerServiceClient:
    """The client: REST against `endpoint` when given (the local stack), else the real API."""
    from google.cloud import secretmanager

    if not endpoint:
        return secretmanager.SecretManagerServiceClient()
    from google.oauth2.credentials import Credentials

    return secretmanager.SecretManagerServiceClient(
        transport="rest",
        client_options={"api_endpoint": endpoint},
        credentials=Credentials(token=LOCAL_OPERATOR_TOKEN),
    )


@dataclass(frozen=True)
class SecretInfo:
    """One tpujobs secret as `list` shows it: never its value."""

    name: str  # NAME, as jobs refer to it
    account: str  # the service account's email, or its id when the secret has no annotation
    secret: str  # projects/P/secrets/S
    version: int | None  # the latest version's number; None when it has none
    created: datetime | None  # when the latest version was added (else the secret was made)


class Secrets:
    """Set and list the secrets of tpujobs' service accounts in one project."""

    def __init__(self, client: secretmanager.SecretManagerServiceClient, project: str, prefix: str = "") -> None:
        self._client = client
        self._project = project
        self._prefix = prefix

    @classmethod
    def build(cls, settings: Settings) -> Secrets:
        return cls(build_client(settings.secrets_endpoint), settings.project, settings.prefix)

    def set_secret(self, name: str, value: bytes | str, account: str) -> str:
        """Add `value` as the newest version of secret NAME of `account`; its version name."""
        import google_crc32c

        try:
            sid = secret_id(name, self._prefix, account)
        except ValueError as error:
            raise PermanentError(str(error)) from error
        data = value.encode("utf-8") if isinstance(value, str) else bytes(value)
        parent = f"projects/{self._project}/secrets/{sid}"
        try:
            with _translated(f"create secret {parent}"):
                self._client.create_secret(
                    request={
                        "parent": f"projects/{self._project}",
                        "secret_id": sid,
                        "secret": {
                            "replication": {"automatic": {}},
                            "labels": LABEL,
                            "annotations": {ACCOUNT_ANNOTATION: account},
                        },
                    },
                    timeout=CALL_TIMEOUT_S,
                )
        except PermanentError as error:
            # ALREADY_EXISTS (a bare 409 Conflict over REST): the secret is there; add to it.
            if not isinstance(error.__cause__, api_exceptions.Conflict):
                raise
        with _translated(f"add a version to secret {parent}"):
            version = self._client.add_secret_version(
                request={
                    "parent": parent,
                    "payload": {"data": data, "data_crc32c": int(google_crc32c.value(data))},
                },
                timeout=CALL_TIMEOUT_S,
            )
        return str(version.name)

    def list_secrets(self, account: str | None = None) -> list[SecretInfo]:
        """Every tpujobs secret of this deployment (of one account when given), by account and name."""
        wanted = None
        if account:
            try:
                wanted = account_id(account)
            except ValueError as error:
                raise PermanentError(str(error)) from error
        found = []
        with _translated(f"list the secrets of projects/{self._project}"):
            secrets = list(
                self._client.list_secrets(
                    request={
                        "parent": f"projects/{self._project}",
                        "filter": "labels.tpujobs=secret",
                    },
                    timeout=CALL_TIMEOUT_S,
                )
            )
        for secret in secrets:
            parsed = parse_secret_id(secret.name.rsplit("/", 1)[-1], self._prefix)
            if parsed is None or (wanted is not None and parsed[0] != wanted):
                continue
            owner = secret.annotations.get(ACCOUNT_ANNOTATION) or parsed[0]
            number, created = self._latest(secret.name)
            found.append(
                SecretInfo(
                    name=parsed[1],
                    account=owner,
                    secret=secret.name,
                    version=number,
                    created=created or _as_datetime(secret.create_time),
                )
            )
        return sorted(found, key=lambda info: (info.account, info.name))

    def _latest(self, secret: str) -> tuple[int | None, datetime | None]:
        try:
            with _translated(f"read the latest version of {secret}"):
                version = self._client.get_secret_version(name=f"{secret}/versions/latest", timeout=CALL_TIMEOUT_S)
        except PermanentError as error:
            if isinstance(error.__cause__, api_exceptions.NotFound):
                return None, None
            raise
        return int(version.name.rsplit("/", 1)[-1]), _as_datetime(version.create_time)


def _as_datetime(value: object) -> datetime | None:
    """proto-plus gives a Timestamp field as a datetime (None when unset), though its hints say Timestamp."""
    return value if isinstance(value, datetime) else None


def _translated(doing: str) -> AbstractContextManager[None]:
    """Library errors through the one table (adapters/google_errors.py): TransientError
    (worth retrying) or PermanentError (not). Messages carry the call's text, never a value."""
    return translated("Secret Manager", doing)
