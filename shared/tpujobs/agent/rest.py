"""Google's REST APIs as the agent calls them, with the standard library only.

The metadata server (values and `wait_for_change`), the VM's access token, Pub/Sub publish
(signed with the attempt's key), Cloud Storage and Secret Manager. Every call is retried on
5xx, 429 and connection errors, a bounded number of times; the emulators are reached directly.
"""

from __future__ import annotations

import base64
import binascii
import http.client
import json
import os
import shutil
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from typing import Any

from .basics import AgentError, HttpError, Refused
from .wire import KEY_BYTES, SIGNATURE_ATTRIBUTE, encode_payload, parse_key_text, sign

DEFAULT_METADATA_URL = "http://metadata.google.internal/computeMetadata/v1"
PUBSUB_API = "https://pubsub.googleapis.com"
STORAGE_API = "https://storage.googleapis.com"
SECRETS_API = "https://secretmanager.googleapis.com"
SECRETS_ENDPOINT_VARIABLE = "TPUJOBS_SECRETS_ENDPOINT"  # the local stack's Secret Manager
ACCOUNT_METADATA = "instance/service-accounts/default/email"
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # metadata, emulators
_DEFAULT = urllib.request.build_opener()  # Google APIs: honour the host's proxy settings

# --- the report key, and the checksum of a secret ----------------------------------


def parse_report_key(text: str) -> bytes:
    """The attempt's 32-byte key from its text (`wire.key_text`); AgentError for
    anything else, never quoting the value: it is a secret."""
    try:
        return parse_key_text(text)
    except ValueError as error:
        raise AgentError(str(error)) from None


def _crc32c_table() -> list[int]:
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
        table.append(crc)
    return table


_CRC32C = _crc32c_table()


def crc32c(data: bytes) -> int:
    """CRC-32C (Castagnoli), as Secret Manager's dataCrc32c; secrets are small, so pure Python."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc = _CRC32C[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


# --- HTTP -----------------------------------------------------------------------------


def http_call(
    opener: urllib.request.OpenerDirector,
    method: str,
    url: str,
    body: bytes | None = None,
    headers: dict[str, str] | None = None,
    timeout: float = 15.0,
    sink: str | None = None,
) -> bytes:
    """The body of a 2xx answer (or, with `sink`, streamed into that file), else HttpError."""
    request = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    try:
        with opener.open(request, timeout=timeout) as response:
            if sink is None:
                return bytes(response.read())
            with open(sink, "wb") as out:
                shutil.copyfileobj(response, out, 1024 * 1024)
            return b""
    except urllib.error.HTTPError as error:
        try:
            data = error.read()
        except (OSError, http.client.HTTPException):
            data = b""
        raise HttpError(error.code, method, url, data) from None


def with_retries(
    call: Callable[[], Any],
    attempts: int = 6,
    first_delay: float = 0.2,
    max_delay: float = 3.0,
    sleep: Callable[[float], None] = time.sleep,
) -> Any:
    """call(), again after a short growing pause on 5xx, 429 or a connection error; bounded."""
    delay = first_delay
    for attempt in range(1, attempts + 1):
        try:
            return call()
        except HttpError as error:
            if not error.retryable or attempt == attempts:
                raise
        except (OSError, http.client.HTTPException):  # URLError, resets, timeouts
            if attempt == attempts:
                raise
        sleep(delay)
        delay = min(delay * 2, max_delay)
    raise AssertionError("unreachable")


def _as_url(host: str) -> str:
    value = host.strip().rstrip("/")
    return value if "://" in value else "http://" + value


class Metadata:
    """The metadata server of this VM (or a fake one named by TPUJOBS_METADATA_URL)."""

    def __init__(self, base_url: str, timeout: float = 5.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout

    def get(self, path: str, timeout: float | None = None) -> str:
        url = f"{self.base_url}/{path}"
        data = http_call(
            _DIRECT,
            "GET",
            url,
            headers={"Metadata-Flavor": "Google"},
            timeout=self.timeout if timeout is None else timeout,
        )
        return data.decode("utf-8")

    def wait_for_change(self, path: str, last_etag: str, wait_seconds: float) -> tuple[str, str]:
        """(value, ETag), held by the server until the value's ETag differs from `last_etag`
        or `wait_seconds` pass (GCE's `?wait_for_change=true`); no `last_etag`: at once, by a
        plain GET (a wait without one is held until the next change, and would miss a value
        written before it, such as a pool unit's first assignment)."""
        query = {"wait_for_change": "true", "timeout_sec": str(max(1, int(wait_seconds))), "last_etag": last_etag}
        joiner = "&" if "?" in path else "?"  # a path may ask already (`?alt=json`)
        url = f"{self.base_url}/{path}" + (f"{joiner}{urllib.parse.urlencode(query)}" if last_etag else "")
        request = urllib.request.Request(url, headers={"Metadata-Flavor": "Google"})
        try:
            with _DIRECT.open(request, timeout=wait_seconds + 10) as response:
                body = response.read().decode("utf-8", "replace")
                return body, str(response.headers.get("ETag") or "")
        except urllib.error.HTTPError as error:
            try:
                data = error.read()
            except (OSError, http.client.HTTPException):
                data = b""
            raise HttpError(error.code, "GET", url, data) from None

    def get_optional(self, path: str) -> str | None:
        """The value, or None when the server has no such key (404)."""
        try:
            return str(with_retries(lambda: self.get(path), attempts=5))
        except HttpError as error:
            if error.status == 404:
                return None
            raise


class TokenSource:
    """The VM service account's access token, fetched when first needed and kept until near expiry."""

    def __init__(self, metadata: Metadata, clock: Callable[[], float] = time.monotonic) -> None:
        self._metadata = metadata
        self._clock = clock
        self._lock = threading.Lock()
        self._token: str | None = None
        self._expires = 0.0

    def token(self) -> str:
        with self._lock:
            if self._token is None or self._clock() > self._expires - 300:
                raw = with_retries(lambda: self._metadata.get("instance/service-accounts/default/token"))
                try:
                    data = json.loads(raw)
                    self._token = str(data["access_token"])
                    self._expires = self._clock() + float(data.get("expires_in", 3600))
                except (ValueError, KeyError, TypeError) as error:
                    raise AgentError(f"the metadata server gave no usable token ({error!r})") from None
            return self._token

    def invalidate(self) -> None:
        with self._lock:
            self._token = None


class GoogleApi:
    """One Google API: an emulator (no auth, no proxy) or the real endpoint with a bearer token."""

    def __init__(self, base_url: str, tokens: TokenSource | None, direct: bool | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self.tokens = tokens
        local = tokens is None if direct is None else direct
        self._opener = _DIRECT if local else _DEFAULT

    @classmethod
    def from_env(cls, emulator_variable: str, real_url: str, environ: dict[str, str], tokens: TokenSource) -> GoogleApi:
        host = environ.get(emulator_variable, "").strip()
        return cls(_as_url(host), None) if host else cls(real_url, tokens)

    @classmethod
    def secrets_from_env(cls, environ: dict[str, str], tokens: TokenSource) -> GoogleApi:
        """Secret Manager: always with the VM's token, since who asks decides what it may read.

        The local stack names its own endpoint (reached directly, like the emulators); the
        local Secret Manager tells accounts apart by the simulator's tokens.
        """
        local = environ.get(SECRETS_ENDPOINT_VARIABLE, "").strip()
        return cls(_as_url(local), tokens, direct=True) if local else cls(SECRETS_API, tokens)

    def call(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        content_type: str | None = None,
        attempts: int = 6,
        sink: str | None = None,
        timeout: float = 15.0,
    ) -> bytes:
        url = self.base_url + path

        def once() -> bytes:
            headers = {}
            if content_type is not None:
                headers["Content-Type"] = content_type
            if self.tokens is not None:
                headers["Authorization"] = "Bearer " + self.tokens.token()
            try:
                return http_call(self._opener, method, url, body, headers, timeout, sink)
            except HttpError as error:
                if error.status == 401 and self.tokens is not None:
                    self.tokens.invalidate()  # expired early: fetch a new one and try again
                    error.retryable = True
                raise

        return bytes(with_retries(once, attempts=attempts))


class Publisher:
    """Publishes signed JSON messages with the Pub/Sub REST API.

    The signature (HMAC-SHA256 under the attempt's key) covers the exact data bytes and
    travels as the `tpujobs-signature` attribute. The bytes are made once per publish, so
    every retry of it sends the same bytes and signature; a payload carries its own `at` and
    `nonce`, so publishing the same payload again also gives the same bytes.
    """

    def __init__(self, api: GoogleApi, project: str, key: bytes, names: dict[str, str] | None = None) -> None:
        """`names`: the attributes that name the key (its version, the job's creation time)."""
        if len(key) != KEY_BYTES:
            raise AgentError(f"a report key is {KEY_BYTES} bytes")
        self.api = api
        self.project = project
        self._key = key
        self._names = dict(names or {})

    @property
    def key(self) -> bytes:
        """The attempt's key, which also signs the datagrams of its slice (`SliceLink`)."""
        return self._key

    @property
    def names(self) -> dict[str, str]:
        """The attributes that name the key, sent beside each signature (Cloud Logging's too)."""
        return dict(self._names)

    def publish(
        self,
        topic: str,
        payload: dict[str, Any],
        attributes: dict[str, str],
        attempts: int = 6,
        timeout: float = 10.0,
    ) -> None:
        data = encode_payload(payload)
        signed = {**attributes, **self._names, SIGNATURE_ATTRIBUTE: sign(self._key, data)}
        body = {"messages": [{"data": base64.b64encode(data).decode("ascii"), "attributes": signed}]}
        path = "/v1/projects/{}/topics/{}:publish".format(
            urllib.parse.quote(self.project, safe=""), urllib.parse.quote(topic, safe="")
        )
        data = json.dumps(body).encode("utf-8")
        self.api.call("POST", path, data, "application/json", attempts, timeout=timeout)


class Storage:
    """Uploads, downloads and lists objects with the Cloud Storage JSON API."""

    def __init__(self, api: GoogleApi) -> None:
        self.api = api

    @staticmethod
    def _q(value: str) -> str:
        return urllib.parse.quote(value, safe="")

    def upload(
        self, bucket: str, name: str, data: bytes, content_type: str, attempts: int = 6, timeout: float = 60.0
    ) -> None:
        path = f"/upload/storage/v1/b/{self._q(bucket)}/o?uploadType=media&name={self._q(name)}"
        self.api.call("POST", path, data, content_type, attempts, timeout=timeout)

    def download(self, bucket: str, name: str, destination: str) -> None:
        path = f"/storage/v1/b/{self._q(bucket)}/o/{self._q(name)}?alt=media"
        self.api.call("GET", path, sink=destination, timeout=300.0)

    def read(self, bucket: str, name: str) -> bytes:
        path = f"/storage/v1/b/{self._q(bucket)}/o/{self._q(name)}?alt=media"
        return self.api.call("GET", path)

    def list_names(self, bucket: str, prefix: str) -> list[str]:
        names: list[str] = []
        token = ""
        while True:
            query = "prefix=" + self._q(prefix) + ("&pageToken=" + self._q(token) if token else "")
            raw = self.api.call("GET", f"/storage/v1/b/{self._q(bucket)}/o?{query}")
            page = json.loads(raw or b"{}")
            names.extend(str(item["name"]) for item in page.get("items") or [])
            token = page.get("nextPageToken") or ""
            if not token:
                return names


class SecretReader:
    """Reads the job's secrets with Secret Manager's REST API, as the VM's own account.

    The values it returns go into the environment of the job's setup and command and
    nowhere else; no message it writes (log, output, report, error) holds one. A secret
    that cannot be read is a `Refused` naming the env name, the secret and the account.
    """

    def __init__(self, api: GoogleApi, metadata: Metadata, attempts: int = 8) -> None:
        self.api = api
        self.metadata = metadata
        self.attempts = attempts  # 5xx, 429 and connection errors; then the attempt is aborted
        self._account: str | None = None

    def account(self) -> str:
        """The VM's service account email, as the metadata server says it."""
        if self._account is None:
            try:
                email = self.metadata.get_optional(ACCOUNT_METADATA)
            except (AgentError, OSError, http.client.HTTPException):
                email = None
            email = (email or "").strip()
            self._account = email or "the VM's service account (the metadata server names none)"
        return self._account

    def read_all(self, wanted: dict[str, str]) -> dict[str, str]:
        """{env name: value} for {env name: projects/P/secrets/S/versions/V}."""
        return {env_name: self.read(env_name, wanted[env_name]) for env_name in sorted(wanted)}

    def read(self, env_name: str, version: str) -> str:
        """One secret's value (bytes as the file system decodes them, so any value passes)."""
        what = f"secret {env_name} ({version})"
        path = "/v1/" + urllib.parse.quote(version, safe="/") + ":access"
        try:
            raw = self.api.call("GET", path, attempts=self.attempts)
        except HttpError as error:
            status = f"{error.status} {error.google_status}".strip()
            if error.status == 404:
                raise Refused(f"{what} does not exist or is not readable by {self.account()}: {status}") from None
            if error.status in (401, 403):
                raise Refused(f"{what} is not readable by {self.account()}: {status}") from None
            raise Refused(
                f"{what} could not be read by {self.account()}: Secret Manager answered {status}"
                f" (after {self.attempts} tries)"
            ) from None
        except (OSError, http.client.HTTPException) as error:
            raise Refused(
                f"{what} could not be read by {self.account()}: Secret Manager is unreachable"
                f" ({type(error).__name__}, after {self.attempts} tries)"
            ) from None
        try:
            payload = json.loads(raw.decode("utf-8"))["payload"]
            encoded = payload.get("data") or ""
            data = base64.b64decode(encoded + "=" * (-len(encoded) % 4), b"-_", validate=True)
            crc = payload.get("dataCrc32c")
            crc_matches = crc is None or int(crc) == crc32c(data)
        except (ValueError, KeyError, TypeError, AttributeError, binascii.Error):
            raise Refused(f"{what}: Secret Manager's answer holds no readable value") from None
        if not crc_matches:
            raise Refused(f"{what}: the value read does not match its CRC32C (corrupted)")
        if b"\x00" in data:
            raise Refused(f"{what} holds a NUL byte, which no environment variable can carry")
        return os.fsdecode(data)


def split_gs_uri(uri: str) -> tuple[str, str]:
    """gs://bucket/some/name -> ("bucket", "some/name")."""
    if not uri.startswith("gs://"):
        raise AgentError(f"not a gs:// URI: {uri!r}")
    bucket, _, name = uri[len("gs://") :].partition("/")
    if not bucket:
        raise AgentError(f"no bucket in {uri!r}")
    return bucket, name
