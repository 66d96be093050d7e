"""A local Secret Manager: the v1 REST API as google-cloud-secret-manager's REST client calls it.

Secrets and versions in memory (or a 0600 state file); a VM's `Bearer simulated:EMAIL` token may
only access its account's namespace of secrets, the operator's token anything, no token nothing
(401). Never logs a value.
"""

from __future__ import annotations

import argparse
import base64
import binascii
import hashlib
import json
import logging
import os
import re
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from types import TracebackType
from typing import Any

from google.cloud import secretmanager_v1

from tpujobs.adapters.secrets import LOCAL_OPERATOR_TOKEN
from tpujobs.domain.secrets import NAMESPACE_MARK, SECRET_ID_PATTERN, account_id
from tpujobs.local.simulator.errors import Code, SimulatorError
from tpujobs.local.simulator.http import (
    ApiServer,
    BackgroundApi,
    JsonRequestHandler,
    Routes,
    google_answer,
    serve_until_signalled,
)
from tpujobs.local.simulator.messages import BadBody, canonical, json_object, query_str, timestamp
from tpujobs.local.simulator.model import JsonStateFile

_log = logging.getLogger(__name__)

Json = dict[str, Any]
Query = Mapping[str, list[str]]

TOKEN_PREFIX = "simulated:"  # what the simulated metadata server hands a VM: simulated:EMAIL
MAX_PAYLOAD_BYTES = 64 * 1024
MAX_PAGE_SIZE = 25000
DEFAULT_PAGE_SIZE = 25000  # pageSize 0: the server decides
MAX_LABELS = 64
_SECRET_ID = re.compile(SECRET_ID_PATTERN)
_VERSION = re.compile(r"[1-9][0-9]{0,18}|latest")
_LABEL_KEY = re.compile(r"[a-z\u00c0-\U0010ffff][a-z0-9_\u00c0-\U0010ffff-]{0,62}")
_LABEL_VALUE = re.compile(r"[a-z0-9_\u00c0-\U0010ffff-]{0,63}")
UNAUTHENTICATED_MESSAGE = (
    "Request had invalid authentication credentials. Expected OAuth 2 access token, login "
    "cookie or other valid authentication credential. See "
    "https://developers.google.com/identity/sign-in/web/devconsole-project."
)


class SecretManagerError(SimulatorError):
    """A request the local Secret Manager refuses; answered as Google's error JSON."""


# -- CRC32C (Castagnoli), as payload.dataCrc32c carries it --------------------------------


def crc32c(data: bytes) -> int:
    """The CRC32C of data, by google-crc32c: the library the real client checks it with."""
    import google_crc32c

    return int(google_crc32c.value(data))


# -- state --------------------------------------------------------------------------------


class VersionState(str, Enum):
    ENABLED = "ENABLED"  # may be accessed
    DISABLED = "DISABLED"  # may not be accessed; can be enabled again
    DESTROYED = "DESTROYED"  # the data is gone for good


@dataclass
class VersionRecord:
    number: int
    create_time: float
    data: bytes
    crc32c: int
    client_checksum: bool
    state: VersionState = VersionState.ENABLED
    destroy_time: float | None = None

    def to_json(self) -> Json:
        return {
            "number": self.number,
            "createTime": self.create_time,
            "data": base64.b64encode(self.data).decode("ascii"),
            "crc32c": self.crc32c,
            "clientChecksum": self.client_checksum,
            "state": self.state.value,
            "destroyTime": self.destroy_time,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> VersionRecord:
        return cls(
            number=int(data["number"]),
            create_time=float(data["createTime"]),
            data=base64.b64decode(data["data"]),
            crc32c=int(data["crc32c"]),
            client_checksum=bool(data["clientChecksum"]),
            state=VersionState(data["state"]),
            destroy_time=data.get("destroyTime"),
        )


@dataclass
class SecretRecord:
    name: str  # projects/P/secrets/S
    create_time: float
    replication: Json
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    versions: list[VersionRecord] = field(default_factory=list)  # oldest first
    next_version: int = 1

    def to_json(self) -> Json:
        return {
            "name": self.name,
            "createTime": self.create_time,
            "replication": self.replication,
            "labels": self.labels,
            "annotations": self.annotations,
            "versions": [v.to_json() for v in self.versions],
            "nextVersion": self.next_version,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> SecretRecord:
        return cls(
            name=data["name"],
            create_time=float(data["createTime"]),
            replication=dict(data["replication"]),
            labels=dict(data.get("labels", {})),
            annotations=dict(data.get("annotations", {})),
            versions=[VersionRecord.from_json(v) for v in data.get("versions", [])],
            next_version=int(data.get("nextVersion", 1)),
        )


# -- JSON out -----------------------------------------------------------------------------


def _etag(*parts: object) -> str:
    digest = hashlib.sha256(json.dumps(parts, default=str).encode("utf-8")).hexdigest()[:16]
    return f'"{digest}"'


def secret_json(secret: SecretRecord) -> Json:
    out: Json = {
        "name": secret.name,
        "replication": secret.replication,
        "createTime": timestamp(secret.create_time),
        "etag": _etag(secret.name, secret.create_time, secret.labels, secret.annotations),
    }
    if secret.labels:
        out["labels"] = dict(secret.labels)
    if secret.annotations:
        out["annotations"] = dict(secret.annotations)
    return out


def version_json(secret: SecretRecord, version: VersionRecord) -> Json:
    out: Json = {
        "name": f"{secret.name}/versions/{version.number}",
        "createTime": timestamp(version.create_time),
        "state": version.state.value,
        "etag": _etag(secret.name, version.number, version.state.value),
        "clientSpecifiedPayloadChecksum": version.client_checksum,
    }
    if "automatic" in secret.replication:
        out["replicationStatus"] = {"automatic": {}}
    else:
        replicas = secret.replication.get("userManaged", {}).get("replicas", [])
        out["replicationStatus"] = {
            "userManaged": {"replicas": [{"location": r.get("location", "")} for r in replicas]}
        }
    if version.destroy_time is not None:
        out["destroyTime"] = timestamp(version.destroy_time)
    return out


# -- JSON in ------------------------------------------------------------------------------


def parse_replication(replication: Json | None) -> Json:
    """Secret.replication (canonical JSON): exactly one of automatic and userManaged (with replicas)."""
    if replication is None:
        raise SecretManagerError(Code.INVALID_ARGUMENT, "Secret.replication is required: automatic or user_managed.")
    automatic = replication.get("automatic")
    user_managed = replication.get("userManaged")
    if (automatic is None) == (user_managed is None):
        raise SecretManagerError(
            Code.INVALID_ARGUMENT,
            "Secret.replication must set exactly one of automatic and user_managed.",
        )
    if automatic is not None:
        return {"automatic": automatic}
    replicas = replication["userManaged"].get("replicas")
    if not replicas:
        raise SecretManagerError(Code.INVALID_ARGUMENT, "replication.user_managed.replicas must not be empty.")
    out = []
    for replica in replicas:
        location = replica.get("location")
        if not location:
            raise SecretManagerError(Code.INVALID_ARGUMENT, "Each replica needs a location.")
        out.append({"location": location})
    return {"userManaged": {"replicas": out}}


def parse_labels(labels: dict[str, str]) -> dict[str, str]:
    if len(labels) > MAX_LABELS:
        raise SecretManagerError(Code.INVALID_ARGUMENT, f"A secret has at most {MAX_LABELS} labels, got {len(labels)}.")
    for key, label in labels.items():
        if not _LABEL_KEY.fullmatch(key):
            raise SecretManagerError(
                Code.INVALID_ARGUMENT,
                f"Label key {key[:70]!r} must start with a lowercase letter and hold at most 63 "
                "lowercase letters, digits, _ or -.",
            )
        if not _LABEL_VALUE.fullmatch(label):
            raise SecretManagerError(
                Code.INVALID_ARGUMENT,
                f"The value of label {key!r} must be at most 63 lowercase letters, digits, _ or -.",
            )
    return labels


def parse_annotations(annotations: dict[str, str]) -> dict[str, str]:
    size = sum(len(k.encode()) + len(v.encode()) for k, v in annotations.items())
    if size >= 16 * 1024:
        raise SecretManagerError(Code.INVALID_ARGUMENT, "The annotations of a secret must total less than 16 KiB.")
    return annotations


def parse_payload(body: bytes) -> tuple[bytes, int | None]:
    """AddSecretVersionRequest's payload: the data and the client's CRC32C, if it sent one.
    Errors never quote the body, and the data is decoded as strictly as Google does (json_format
    would skip stray characters)."""
    try:
        request = canonical(body, secretmanager_v1.AddSecretVersionRequest.pb(), "AddSecretVersionRequest")
    except BadBody:
        raise SecretManagerError(  # json_format's message may quote the body: never the secret
            Code.INVALID_ARGUMENT,
            "The request body is not an AddSecretVersionRequest: payload.data must be base64 text, "
            "payload.data_crc32c a number.",
        ) from None
    payload = request.get("payload")
    if payload is None:
        raise SecretManagerError(Code.INVALID_ARGUMENT, "payload is required.")
    raw = json_object(body, "The request body")["payload"].get("data") or ""
    try:
        padded = raw + "=" * (-len(raw) % 4)
        data = base64.b64decode(padded.replace("-", "+").replace("_", "/"), validate=True)
    except (binascii.Error, ValueError):
        raise SecretManagerError(Code.INVALID_ARGUMENT, "payload.data is not valid base64.") from None
    if len(data) > MAX_PAYLOAD_BYTES:
        raise SecretManagerError(
            Code.INVALID_ARGUMENT,
            f"payload.data is {len(data)} bytes; a secret version holds at most 64 KiB.",
        )
    checksum = payload.get("dataCrc32c")
    return data, None if checksum is None else int(checksum)


def _page_size(query: Query) -> int:
    raw = query_str(query, "pageSize") or "0"
    try:
        size = int(raw)
    except ValueError:
        raise SecretManagerError(Code.INVALID_ARGUMENT, f"pageSize must be a number, got {raw[:20]!r}.") from None
    if size < 0:
        raise SecretManagerError(Code.INVALID_ARGUMENT, "pageSize must not be negative.")
    return min(size, MAX_PAGE_SIZE) if size else DEFAULT_PAGE_SIZE


def _encode_token(position: str) -> str:
    return base64.urlsafe_b64encode(position.encode("utf-8")).decode("ascii")


def _decode_token(token: str) -> str:
    try:
        return base64.urlsafe_b64decode(token.encode("ascii")).decode("utf-8")
    except (binascii.Error, ValueError):
        raise SecretManagerError(Code.INVALID_ARGUMENT, "Invalid page token.") from None


# -- filters ------------------------------------------------------------------------------

_TERM = re.compile(r'(?P<field>[A-Za-z_][A-Za-z0-9_.-]*)\s*(?P<op>[:=])\s*(?P<value>"[^"]*"|\S+)')
_TOKEN = re.compile(r'(?:[^\s"]|"[^"]*")+')


def parse_filter(text: str) -> Callable[[SecretRecord], bool]:
    """A secret predicate from a list filter (see the module docstring for what is understood)."""
    tokens = _TOKEN.findall(text or "")
    groups: list[list[Callable[[SecretRecord], bool]]] = []
    joined = False
    for token in tokens:
        if token == "AND":
            joined = False
            continue
        if token == "OR":
            if not groups:
                raise SecretManagerError(Code.INVALID_ARGUMENT, "A filter cannot start with OR.")
            joined = True
            continue
        term = _term(token)
        if joined:
            groups[-1].append(term)
            joined = False
        else:
            groups.append([term])
    if joined:
        raise SecretManagerError(Code.INVALID_ARGUMENT, "A filter cannot end with OR.")
    return lambda secret: all(any(term(secret) for term in group) for group in groups)


def _term(token: str) -> Callable[[SecretRecord], bool]:
    match = _TERM.fullmatch(token)
    if match is None:
        raise SecretManagerError(
            Code.INVALID_ARGUMENT,
            f"Invalid filter term {token[:80]!r}: the local Secret Manager understands "
            "name:TEXT, labels.KEY=VALUE, labels.KEY:VALUE and labels.KEY:*.",
        )
    name, op, value = match["field"], match["op"], match["value"].strip('"')
    if name == "name" and op == ":":
        pattern = re.compile(".*".join(re.escape(part) for part in value.split("*")))
        return lambda secret: pattern.search(secret.name.rsplit("/", 1)[-1]) is not None
    if name.startswith("labels.") and len(name) > len("labels."):
        key = name[len("labels.") :]
        if op == ":" and value == "*":
            return lambda secret: key in secret.labels
        if op == ":":
            return lambda secret: value in secret.labels.get(key, "\0")
        return lambda secret: secret.labels.get(key) == value
    raise SecretManagerError(
        Code.INVALID_ARGUMENT,
        f"Filter field {name[:60]!r} with {op!r} is not supported by the local Secret Manager.",
    )


# -- the service --------------------------------------------------------------------------


def _secret_name(project: str, secret: str) -> str:
    if not _SECRET_ID.fullmatch(secret):
        raise SecretManagerError(
            Code.INVALID_ARGUMENT,
            f"Secret id {secret[:80]!r} must be 1 to 255 letters, digits, underscores or hyphens.",
        )
    return f"projects/{project}/secrets/{secret}"


class SecretManager:
    """Secrets and their versions, in memory (and in a state file when given). Thread-safe."""

    def __init__(
        self,
        *,
        store: JsonStateFile | None = None,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self._lock = threading.Lock()
        self._store = store
        self._wall_clock = wall_clock
        self._secrets: dict[str, SecretRecord] = {}
        if store is not None:
            loaded = store.load()
            for data in (loaded or {}).get("secrets", []):
                record = SecretRecord.from_json(data)
                self._secrets[record.name] = record

    def _save(self) -> None:
        if self._store is not None:
            self._store.save({"secrets": [s.to_json() for s in self._secrets.values()]})

    def _secret(self, name: str) -> SecretRecord:
        secret = self._secrets.get(name)
        if secret is None:
            raise SecretManagerError(Code.NOT_FOUND, f"Secret [{name}] not found.")
        return secret

    def _version(self, secret: SecretRecord, version: str) -> VersionRecord:
        if not _VERSION.fullmatch(version):
            raise SecretManagerError(
                Code.INVALID_ARGUMENT,
                f"Version {version[:40]!r} must be a positive number or latest.",
            )
        if version == "latest":
            if not secret.versions:
                raise SecretManagerError(Code.NOT_FOUND, f"Secret [{secret.name}] not found or has no versions.")
            return secret.versions[-1]
        for record in secret.versions:
            if record.number == int(version):
                return record
        raise SecretManagerError(Code.NOT_FOUND, f"Secret Version [{secret.name}/versions/{version}] not found.")

    def create(
        self,
        project: str,
        secret_id: str,
        replication: Json,
        labels: dict[str, str],
        annotations: dict[str, str],
    ) -> Json:
        if not secret_id:
            raise SecretManagerError(Code.INVALID_ARGUMENT, "secretId is required.")
        name = _secret_name(project, secret_id)
        with self._lock:
            if name in self._secrets:
                raise SecretManagerError(Code.ALREADY_EXISTS, f"Secret [{name}] already exists.")
            record = SecretRecord(name, self._wall_clock(), replication, labels, annotations)
            self._secrets[name] = record
            self._save()
            return secret_json(record)

    def get(self, project: str, secret: str) -> Json:
        name = _secret_name(project, secret)
        with self._lock:
            return secret_json(self._secret(name))

    def delete(self, project: str, secret: str) -> Json:
        name = _secret_name(project, secret)
        with self._lock:
            self._secret(name)
            del self._secrets[name]
            self._save()
        return {}

    def list_secrets(self, project: str, page_size: int, page_token: str, filter_text: str) -> Json:
        matches = parse_filter(filter_text)
        after = _decode_token(page_token) if page_token else ""
        head = f"projects/{project}/secrets/"
        with self._lock:
            found = sorted(
                (s for s in self._secrets.values() if s.name.startswith(head) and matches(s)),
                key=lambda s: s.name,
            )
            rest = [s for s in found if s.name > after]
            page = rest[:page_size]
            out: Json = {"secrets": [secret_json(s) for s in page], "totalSize": len(found)}
        if len(rest) > page_size:
            out["nextPageToken"] = _encode_token(page[-1].name)
        if not out["secrets"]:
            del out["secrets"]
        return out

    def add_version(self, project: str, secret: str, data: bytes, checksum: int | None) -> Json:
        name = _secret_name(project, secret)
        if checksum is not None and checksum != crc32c(data):
            raise SecretManagerError(
                Code.INVALID_ARGUMENT,
                "Checksum mismatch: payload.data_crc32c is not the CRC32C of payload.data.",
            )
        with self._lock:
            record = self._secret(name)
            version = VersionRecord(
                number=record.next_version,
                create_time=self._wall_clock(),
                data=data,
                crc32c=crc32c(data),
                client_checksum=checksum is not None,
            )
            record.versions.append(version)
            record.next_version += 1
            self._save()
            return version_json(record, version)

    def list_versions(self, project: str, secret: str, page_size: int, page_token: str) -> Json:
        name = _secret_name(project, secret)
        position = _decode_token(page_token) if page_token else ""
        if position and not position.isdigit():
            raise SecretManagerError(Code.INVALID_ARGUMENT, "Invalid page token.")
        with self._lock:
            record = self._secret(name)
            newest_first = sorted(record.versions, key=lambda v: -v.number)
            rest = [v for v in newest_first if not position or v.number < int(position)]
            page = rest[:page_size]
            out: Json = {
                "versions": [version_json(record, v) for v in page],
                "totalSize": len(newest_first),
            }
        if len(rest) > page_size:
            out["nextPageToken"] = _encode_token(str(page[-1].number))
        if not out["versions"]:
            del out["versions"]
        return out

    def get_version(self, project: str, secret: str, version: str) -> Json:
        name = _secret_name(project, secret)
        with self._lock:
            record = self._secret(name)
            return version_json(record, self._version(record, version))

    def access(self, project: str, secret: str, version: str) -> Json:
        name = _secret_name(project, secret)
        with self._lock:
            record = self._secrets.get(name)
            if record is None:
                raise SecretManagerError(Code.NOT_FOUND, f"Secret [{name}] not found or has no versions.")
            found = self._version(record, version)
            if found.state is not VersionState.ENABLED:
                raise SecretManagerError(
                    Code.FAILED_PRECONDITION,
                    f"Secret Version [{name}/versions/{found.number}] is in {found.state.value} state.",
                )
            return {
                "name": f"{name}/versions/{found.number}",
                "payload": {
                    "data": base64.b64encode(found.data).decode("ascii"),
                    "dataCrc32c": str(found.crc32c),
                },
            }

    def set_state(self, project: str, secret: str, version: str, state: VersionState) -> Json:
        name = _secret_name(project, secret)
        with self._lock:
            record = self._secret(name)
            found = self._version(record, version)
            if found.state is VersionState.DESTROYED:
                raise SecretManagerError(
                    Code.FAILED_PRECONDITION,
                    f"Secret Version [{name}/versions/{found.number}] is in DESTROYED state.",
                )
            found.state = state
            if state is VersionState.DESTROYED:
                found.data = b""
                found.destroy_time = self._wall_clock()
            self._save()
            return version_json(record, found)


# -- routing and access control -----------------------------------------------------------

_PROJECT = "/v1/projects/<id:project>"
_SECRET = _PROJECT + "/secrets/<id:secret>"
_VERSION_PATH = _SECRET + "/versions/<id:version>"

Handler = Callable[[dict[str, str], Query, bytes], Json]


@dataclass(frozen=True)
class Caller:
    """Who sent a request: the stack's operator (LOCAL_OPERATOR_TOKEN), or a VM's service account."""

    email: str = ""  # empty: the operator, a secret admin of the project

    @property
    def is_local_user(self) -> bool:
        return not self.email


@dataclass(frozen=True)
class _Route:
    permission: str
    resource: str  # "project", "secret" or "version": what the permission is checked on
    handler: Handler


class SecretManagerApi:
    """Routes one request, checks who may make it, and renders the answer; no sockets."""

    def __init__(self, service: SecretManager, prefix: str = "") -> None:
        self.service = service
        self.prefix = prefix  # the deployment's TPUJOBS_PREFIX: it starts every namespace
        routes = [
            ("POST", _PROJECT + "/secrets", "secrets.create", "project", self._create),
            ("GET", _PROJECT + "/secrets", "secrets.list", "project", self._list),
            ("GET", _SECRET, "secrets.get", "secret", self._get),
            ("DELETE", _SECRET, "secrets.delete", "secret", self._delete),
            ("POST", _SECRET + ":addVersion", "versions.add", "secret", self._add_version),
            ("GET", _SECRET + "/versions", "versions.list", "secret", self._list_versions),
            ("GET", _VERSION_PATH, "versions.get", "version", self._get_version),
            ("GET", _VERSION_PATH + ":access", "versions.access", "version", self._access),
            ("POST", _VERSION_PATH + ":disable", "versions.disable", "version", self._disable),
            ("POST", _VERSION_PATH + ":enable", "versions.enable", "version", self._enable),
            ("POST", _VERSION_PATH + ":destroy", "versions.destroy", "version", self._destroy),
        ]
        self._routes = Routes(
            [
                (method, path, _Route(f"secretmanager.{perm}", resource, handler))
                for method, path, perm, resource, handler in routes
            ]
        )

    def handle(self, method: str, path: str, query: Query, headers: Mapping[str, str], body: bytes) -> tuple[int, Json]:
        """The HTTP status and JSON answer to one request; errors become Google's error JSON."""
        return google_answer(
            lambda: self._route(method, path, headers, query, body),
            "Local Secret Manager",
            f"{method} {path}",
            tell_failures=False,  # a failure's words might quote a secret
        )

    def _route(self, method: str, path: str, headers: Mapping[str, str], query: Query, body: bytes) -> tuple[int, Json]:
        if method == "GET" and path == "/health":
            return 200, {"ok": True}
        found = self._routes.match(method, path)
        if found is not None:
            route, params = found
            self._authorize(route, params, self.caller(headers))
            return 200, route.handler(params, query, body)
        if path.startswith("/v1/"):
            raise SecretManagerError(
                Code.UNIMPLEMENTED,
                f"The local Secret Manager does not implement {method} {path}.",
            )
        raise SecretManagerError(Code.NOT_FOUND, f"No such endpoint: {method} {path}.")

    @staticmethod
    def caller(headers: Mapping[str, str]) -> Caller:
        """The caller a request's Authorization header names: the stack's operator, or a VM's
        account; 401 for none (as Google answers) and for any other credential."""
        authorization = next((value for key, value in headers.items() if key.lower() == "authorization"), "").strip()
        scheme, _, token = authorization.partition(" ")
        token = token.strip()
        if scheme.lower() == "bearer" and token == LOCAL_OPERATOR_TOKEN:
            return Caller()
        if scheme.lower() == "bearer" and token.startswith(TOKEN_PREFIX):
            email = token[len(TOKEN_PREFIX) :]
            try:
                account_id(email)
            except ValueError:
                pass
            else:
                return Caller(email)
        raise SecretManagerError(Code.UNAUTHENTICATED, UNAUTHENTICATED_MESSAGE)

    def namespace(self, email: str) -> str:
        """The start of the secret ids `email` may read: {prefix}tpujobs_{account id}_."""
        return f"{self.prefix}{NAMESPACE_MARK}{account_id(email)}_"

    def _authorize(self, route: _Route, params: Mapping[str, str], caller: Caller) -> None:
        if caller.is_local_user:
            return
        allowed = route.permission == "secretmanager.versions.access" and params["secret"].startswith(
            self.namespace(caller.email)
        )
        if allowed:
            return
        resource = f"projects/{params['project']}"
        if route.resource in ("secret", "version"):
            resource += f"/secrets/{params['secret']}"
        if route.resource == "version":
            resource += f"/versions/{params['version']}"
        raise SecretManagerError(
            Code.PERMISSION_DENIED,
            f"Permission '{route.permission}' denied for resource '{resource}' (or it may not exist).",
        )

    # -- handlers -------------------------------------------------------------------------

    def _create(self, params: dict[str, str], query: Query, body: bytes) -> Json:
        secret = canonical(body, secretmanager_v1.Secret.pb(), "Secret")
        return self.service.create(
            params["project"],
            query_str(query, "secretId"),
            parse_replication(secret.get("replication")),
            parse_labels(secret.get("labels", {})),
            parse_annotations(secret.get("annotations", {})),
        )

    def _list(self, params: dict[str, str], query: Query, body: bytes) -> Json:
        return self.service.list_secrets(
            params["project"],
            _page_size(query),
            query_str(query, "pageToken"),
            query_str(query, "filter"),
        )

    def _get(self, params: dict[str, str], query: Query, body: bytes) -> Json:
        return self.service.get(params["project"], params["secret"])

    def _delete(self, params: dict[str, str], query: Query, body: bytes) -> Json:
        return self.service.delete(params["project"], params["secret"])

    def _add_version(self, params: dict[str, str], query: Query, body: bytes) -> Json:
        data, checksum = parse_payload(body)
        return self.service.add_version(params["project"], params["secret"], data, checksum)

    def _list_versions(self, params: dict[str, str], query: Query, body: bytes) -> Json:
        if query_str(query, "filter"):
            raise SecretManagerError(Code.INVALID_ARGUMENT, "The local Secret Manager does not filter versions.")
        return self.service.list_versions(
            params["project"], params["secret"], _page_size(query), query_str(query, "pageToken")
        )

    def _get_version(self, params: dict[str, str], query: Query, body: bytes) -> Json:
        return self.service.get_version(params["project"], params["secret"], params["version"])

    def _access(self, params: dict[str, str], query: Query, body: bytes) -> Json:
        return self.service.access(params["project"], params["secret"], params["version"])

    def _disable(self, params: dict[str, str], query: Query, body: bytes) -> Json:
        return self._set_state(params, VersionState.DISABLED)

    def _enable(self, params: dict[str, str], query: Query, body: bytes) -> Json:
        return self._set_state(params, VersionState.ENABLED)

    def _destroy(self, params: dict[str, str], query: Query, body: bytes) -> Json:
        return self._set_state(params, VersionState.DESTROYED)

    def _set_state(self, params: dict[str, str], state: VersionState) -> Json:
        return self.service.set_state(params["project"], params["secret"], params["version"], state)


# -- the server ---------------------------------------------------------------------------


class _RequestHandler(JsonRequestHandler):
    """Secret Manager v1 REST as JSON."""

    server: ApiServer[SecretManagerApi]

    def answer(self, method: str, path: str, query: Query, body: bytes) -> None:
        self.send_json(*self.server.api.handle(method, path, query, dict(self.headers.items()), body))


class SecretManagerServer:
    """The local Secret Manager on a local port, served by a daemon thread; a context manager."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        prefix: str = "",
        state_file: str | os.PathLike[str] | None = None,
        service: SecretManager | None = None,
    ) -> None:
        store = JsonStateFile(state_file) if state_file is not None else None
        self.service = service or SecretManager(store=store)
        self.prefix = prefix
        self._served: BackgroundApi[SecretManagerApi] = BackgroundApi(
            (host, port), _RequestHandler, "the local Secret Manager"
        )

    @property
    def url(self) -> str:
        return self._served.url

    def start(self) -> str:
        """Bind and serve in the background; returns the base URL for api_endpoint."""
        return self._served.serve(SecretManagerApi(self.service, self.prefix))

    def stop(self) -> None:
        """Stop serving; idempotent."""
        self._served.stop()

    def __enter__(self) -> SecretManagerServer:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m tpujobs.local.simulator.secret_manager",
        description="A local Secret Manager v1 REST API.",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 lets the system choose")
    parser.add_argument(
        "--prefix",
        default=os.environ.get("TPUJOBS_PREFIX", ""),
        help="the deployment's TPUJOBS_PREFIX, which starts each account's secret ids [default: $TPUJOBS_PREFIX]",
    )
    parser.add_argument("--state-file", help="keep secrets in this JSON file (mode 0600)")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """Serve in the foreground until SIGTERM or SIGINT."""
    args = parse_args(argv)
    server = SecretManagerServer(args.host, args.port, prefix=args.prefix, state_file=args.state_file)
    return serve_until_signalled(server.start, server.stop, "tpujobs-secret-manager")


if __name__ == "__main__":
    sys.exit(main())
