"""The tpujobs worker agent: runs a job's command on one TPU worker host and reports on it.

Started by the startup script as `python3 agent.py config.json`, from the attempt's work
directory. Standard library only and Python 3.8+, because it runs on stock TPU VM images
and the startup script embeds this file whole.

Pool mode (`python3 agent.py --pool config.json`, from a warm pool unit's startup script):
a long-lived agent that waits on the node metadata's `tpujobs-assignment` (with
`wait_for_change`) and runs each assigned attempt as below, one at a time, each in a fresh
`jobs/{job}/attempt-{n}/work` directory, signed with the attempt's key from the assignment.
An assignment that changes while a job runs withdraws it: stopped as a preemption stops it,
with nothing published. After each job every process still descended from the pool agent
(a child subreaper, so a job's double-forked daemons are among them) is killed and the work
directory deleted. The "pool mode" section below has the table of what each assignment does.

What it does, in order:
  1. learns which worker and slice it is, and its attempt's report key
     (`instance/attributes/tpujobs-report-key`), from the metadata server; without a valid
     key it does not start, since nothing it said would be believed; every MEGASCALE_* key
     of `tpu-env` (what a multislice TPU VM is told about its slices) is kept, unchanged;
  2. reads the job's secrets from Secret Manager with the VM's own token; their values go
     into the environment of setup and command and nowhere else;
  3. fetches the code (a gs:// tarball, checked against the job's code_sha256 before it is
     unpacked safely, or every object under a gs:// prefix);
  4. without an image: runs `setup` once per host, then `command`, each with `bash -c` in its
     own process group and the job's environment (`job_environment`: the spec's env and
     secrets, the MEGASCALE_* values, TPUJOBS_ variables);
     with an image (`image` in the config): pulls it as `image_pull_policy` says (`always`;
     `if-missing`: only when `docker image inspect` finds nothing), logging in to Google's
     registries with the host's own token in a private config directory of that pull alone;
     then runs setup and command in ONE container (`docker run`, so setup's changes to the
     container's files are there for the command), the way TPU VMs run containers:
     privileged, host network and IPC, /dev mounted, docker's init forwarding signals to the
     command's whole process group, the code directory (when there is code) mounted at the
     image's working directory (/workspace when it names none). The job's variables pass by
     name only (`-e NAME`, the value in the docker CLI's own environment), so no secret is
     ever on a command line or on disk; the host's other variables stay out. Setup runs in
     every attempt's container, since each starts fresh from the image (the once-per-host
     marker is neither read nor written). The container is named after the job, attempt,
     slice and worker, labelled with them, and removed (`docker rm -f`) on every way out.
     A pull that fails ends the attempt with a sentence naming the image and why (not found,
     access denied, no network, or docker's own words) in the `exited` report's `detail`;
     nothing of the job runs then. The `started` report carries the image's registry digest
     (`image_digest`); the container's exit code is the command's;
  5. streams their merged output to Cloud Storage in numbered chunk objects (and to its own
     stdout), so little is lost when the host dies;
  6. reports started (when setup or the command starts), heartbeat, checkpoint and exited
     to the worker-events topic, or `aborted` with a sentence when a secret cannot be read
     or the code is not what was submitted (then nothing of the job runs); in a multi-host
     slice worker 0 heartbeats for the slice and reports a quiet peer (`peer_silent`), the
     others tell it they are alive over the slice's network (see "one host speaks for its
     slice" below); a heartbeat says when the next comes (`heartbeat_period`);
  7. on SIGTERM, `instance/preempted` turning TRUE or `instance/maintenance-event` turning
     TERMINATE_ON_HOST_MAINTENANCE (both waited on with `wait_for_change`), publishes one
     preemption notice first, then stops the command (SIGTERM to its group, SIGKILL after
     the grace period; in a container through `docker kill --signal TERM`, then `docker
     kill`), flushes the output and reports nothing more.

Containers on a simulated host: the local simulator's hosts cannot run privileged containers
(the sandbox refuses them), so it sets TPUJOBS_CONTAINER_PRIVILEGED=0 in their environment
and the agent then drops `--privileged`, and only that; a real VM has no such variable. A
simulated host also has SIMULATED_TPU_VM, its mark: the agent labels the container with it
(`tpujobs.host`), and the simulator removes the host's containers when it kills the host, as
a real VM's containers die with it.

A VM runs its startup script at every boot, so after a reboot (repair, maintenance, reset)
the agent starts again for the same attempt. Its first start leaves a record beside the
work directory, on the boot disk (`AttemptRecord`); a later start finds it, reports
`rebooted` with what it found (the attempt is lost: whatever ran was killed by the reboot,
or still runs and gets no twin) and runs nothing.

Every report and notice carries `at` and a fresh `nonce`, and is signed: the attribute
`tpujobs-signature` is `v1=` + hex HMAC-SHA256 under the attempt's key of the exact data
bytes published (as tpujobs.domain.signing checks it).

Why it is built this way: SIGTERM reaches a thread through `signal.set_wakeup_fd`, so the
notice goes out even while the main thread is blocked; output is read by one thread and
uploaded by another, so a slow upload never stalls the command; reports leave in order from
one publishing thread. Every call to a Google API is retried on 5xx, 429 and connection
errors, a bounded number of times. The access token, the report key and the secrets'
values are never printed.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import ctypes
import datetime
import hashlib
import hmac
import http.client
import json
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from secrets import token_hex
from typing import Any

DEFAULT_METADATA_URL = "http://metadata.google.internal/computeMetadata/v1"
PUBSUB_API = "https://pubsub.googleapis.com"
STORAGE_API = "https://storage.googleapis.com"
SECRETS_API = "https://secretmanager.googleapis.com"
SECRETS_ENDPOINT_VARIABLE = "TPUJOBS_SECRETS_ENDPOINT"  # the local stack's Secret Manager

# Signing, as tpujobs.domain.signing checks it (this file cannot import tpujobs).
KEY_METADATA = "instance/attributes/tpujobs-report-key"
KEY_PREFIX = "tpujobs-key-v1:"
KEY_BYTES = 32
SIGNATURE_ATTRIBUTE = "tpujobs-signature"
SIGNATURE_PREFIX = "v1="
ACCOUNT_METADATA = "instance/service-accounts/default/email"
SECRET_VERSION = re.compile(r"projects/[^/\s]+/secrets/[^/\s]+/versions/[^/\s]+")
ENV_NAME = re.compile(r"[A-Z_][A-Z0-9_]*")
SHA256_HEX = re.compile(r"[0-9a-fA-F]{64}")
PASSABLE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")  # an environment variable a container can be given
TPU_ENV_METADATA = "instance/attributes/tpu-env"

MAX_CHUNK_BYTES = 256 * 1024
MAX_PENDING_BYTES = 64 * 1024 * 1024  # output kept while uploads fail; older output is dropped
MAX_LINE_BYTES = 64 * 1024  # longer lines are not scanned for checkpoint markers
TAIL_BYTES = 4096  # of the output kept to read docker's own last words
LAST_LINES = 20  # of the output sent with a failed `exited`, and at most LAST_BYTES of them
LAST_BYTES = 4096
MAX_SECRET_BYTES = 64 * 1024  # Secret Manager's largest value: how far back a cut secret may start
MAX_QUOTED_LINE = 256  # chars of the line a retry_on pattern matched, as tpujobs.engine.reports accepts
MATCH_SECONDS = 10.0  # for the job's retry_on patterns over its last lines (a child process)
MAX_DETAIL_CHARS = 1024  # of a checkpoint report's detail, as tpujobs.engine.reports accepts
RETRYABLE_STATUS = frozenset({408, 429, 500, 502, 503, 504})
AGENT_FAILED = 1  # the exit code reported when the agent fails the attempt (e.g. no code)
AGENT_CANNOT_START = 2  # bad config or unknown identity: nothing can be reported
CHECKPOINT_LINE = re.compile(rb"^[ \t]*TPUJOBS_CHECKPOINT[ \t]+step=([0-9]+)(.*)$")
AGENT_STARTED_AGAIN = 3  # the attempt had already started on this host: lost, nothing run
DEFAULTS = {
    "heartbeat_seconds": 10,  # during an attempt's first heartbeat_fast_window_seconds on a host
    "heartbeat_sparse_seconds": 30,  # after that
    "heartbeat_fast_window_seconds": 300,
    "peer_seconds": 2,  # a peer's beat to worker 0 of its slice, over the slice's network
    "peer_timeout_seconds": 10,  # worker 0 reports a peer it heard and then did not hear this long
    "grace_seconds": 30,
    "chunk_seconds": 2,
}
POOL_TIMINGS = frozenset({"heartbeat_seconds", "grace_seconds", "chunk_seconds"})
PREEMPTED_METADATA = "instance/preempted"
MAINTENANCE_METADATA = "instance/maintenance-event"
TERMINATE_ON_MAINTENANCE = "TERMINATE_ON_HOST_MAINTENANCE"
WATCH_WAIT_SECONDS = 60.0  # how long one wait_for_change request may be held
WATCH_FLOOR_SECONDS = 0.5  # the least time between two requests answered unchanged
BOOT_ID = "/proc/sys/kernel/random/boot_id"  # Linux: a new value at every boot
REQUIRED = {
    "job_id": str,
    "attempt": int,
    "resume": bool,
    "command": str,
    "num_slices": int,
    "hosts_per_slice": int,
    "queued_resource": str,
    "checkpoint_uri": str,
    "log_prefix": str,
    "project": str,
    "worker_events_topic": str,
    "preemption_topic": str,
}

_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # metadata, emulators
_DEFAULT = urllib.request.build_opener()  # Google APIs: honour the host's proxy settings


class AgentError(Exception):
    """Something the agent cannot do; the message says what."""


class Refused(AgentError):
    """The attempt cannot run and no restart would help (a secret it cannot read, code that
    is not what was submitted); the message is the sentence reported with kind `aborted`."""


class HttpError(AgentError):
    """An HTTP answer other than 2xx."""

    def __init__(self, status: int, method: str, url: str, body: bytes) -> None:
        where = url.split("?", 1)[0]
        text = body[:300].decode("utf-8", "replace").strip()
        super().__init__(f"{method} {where} answered HTTP {status}: {text}")
        self.status = status
        self.retryable = status in RETRYABLE_STATUS
        self.google_status = _google_status(body)  # PERMISSION_DENIED and the like, or ""


def _google_status(body: bytes) -> str:
    """The `error.status` of a Google API error answer (PERMISSION_DENIED, ...), or ""."""
    try:
        status = json.loads(body.decode("utf-8"))["error"]["status"]
    except (ValueError, KeyError, TypeError, AttributeError):
        return ""
    return status if isinstance(status, str) and re.fullmatch(r"[A-Z_]{1,40}", status) else ""


def log(message: str) -> None:
    """A line on the agent's stderr (the serial console on a TPU VM)."""
    try:
        sys.stderr.write(f"tpujobs-agent: {message}\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass


def rfc3339(when: float | None = None) -> str:
    """UTC time as RFC 3339 with milliseconds: 2025-03-01T12:00:00.123Z."""
    moment = datetime.datetime.fromtimestamp(time.time() if when is None else when, tz=datetime.timezone.utc)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


def exit_status(returncode: int) -> int:
    """A process's exit code as a shell reports it: killed by signal N is 128 + N."""
    return 128 - returncode if returncode < 0 else returncode


# --- signing --------------------------------------------------------------------------


def parse_report_key(text: str) -> bytes:
    """The attempt's 32-byte key from its metadata value, `tpujobs-key-v1:` and base64url.

    The inverse of tpujobs.domain.signing.key_text; anything else is refused. The message
    never quotes the value: it is a secret.
    """
    value = text.strip()
    if not value.startswith(KEY_PREFIX):
        raise AgentError(f"the report key does not start with {KEY_PREFIX!r}")
    body = value[len(KEY_PREFIX) :]
    if not re.fullmatch(r"[A-Za-z0-9_-]+", body):
        raise AgentError("the report key is not base64url without padding")
    try:
        key = base64.urlsafe_b64decode(body + "=" * (-len(body) % 4))
    except (binascii.Error, ValueError):
        raise AgentError("the report key is not base64url without padding") from None
    if len(key) != KEY_BYTES or base64.urlsafe_b64encode(key).decode("ascii").rstrip("=") != body:
        raise AgentError(f"the report key is not {KEY_BYTES} bytes in canonical base64url")
    return key


def sign(key: bytes, data: bytes) -> str:
    """The `tpujobs-signature` attribute of a message whose data is exactly `data`."""
    return SIGNATURE_PREFIX + hmac.new(key, data, hashlib.sha256).hexdigest()


def encode_payload(payload: dict[str, Any]) -> bytes:
    """The bytes a report is published (and signed) as: compact JSON with sorted keys."""
    return json.dumps(payload, separators=(",", ":"), sort_keys=True).encode("utf-8")


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
        url = f"{self.base_url}/{path}" + (f"?{urllib.parse.urlencode(query)}" if last_etag else "")
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

    def __init__(self, api: GoogleApi, project: str, key: bytes) -> None:
        if len(key) != KEY_BYTES:
            raise AgentError(f"a report key is {KEY_BYTES} bytes")
        self.api = api
        self.project = project
        self._key = key

    @property
    def key(self) -> bytes:
        """The attempt's key, which also signs the datagrams of its slice (`SliceLink`)."""
        return self._key

    def publish(
        self,
        topic: str,
        payload: dict[str, Any],
        attributes: dict[str, str],
        attempts: int = 6,
        timeout: float = 10.0,
    ) -> None:
        data = encode_payload(payload)
        signed = {**attributes, SIGNATURE_ATTRIBUTE: sign(self._key, data)}
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

    def upload(self, bucket: str, name: str, data: bytes, content_type: str, attempts: int = 6) -> None:
        path = f"/upload/storage/v1/b/{self._q(bucket)}/o?uploadType=media&name={self._q(name)}"
        self.api.call("POST", path, data, content_type, attempts, timeout=60.0)

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


# --- identity -------------------------------------------------------------------------


def parse_tpu_env(text: str) -> dict[str, str]:
    """The `tpu-env` metadata attribute (lines like `NODE_ID: 'train-1-a2-1'`) as a dict."""
    values: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        key = key.strip()
        if not sep or not key or key.startswith("#"):
            continue
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        values[key] = value
    return values


def slice_id_from_node_id(node_id: str, queued_resource: str) -> int:
    """The slice of a multislice node: the number after `{queued_resource}-` in its node id."""
    prefix = queued_resource + "-"
    if queued_resource and node_id.startswith(prefix):
        suffix = node_id[len(prefix) :]
        if re.fullmatch(r"[0-9]+", suffix):
            return int(suffix)
    match = re.search(r"-([0-9]+)$", node_id)  # a node named otherwise: its trailing number
    if match is None:
        raise AgentError(f"cannot tell the slice from NODE_ID {node_id!r}")
    return int(match.group(1))


def read_tpu_env(metadata: Metadata) -> dict[str, str]:
    """This host's `tpu-env` attribute as a dict ({} when the server has none)."""
    return parse_tpu_env(metadata.get_optional(TPU_ENV_METADATA) or "")


def megascale_environment(tpu_env: dict[str, str]) -> dict[str, str]:
    """Every MEGASCALE_* key of `tpu-env`, unchanged: what a multislice TPU VM is told about
    its slices (coordinator address, slice id, number of slices, port). Nothing is invented:
    a single slice has none, and a key the metadata lacks stays unset."""
    return {
        name: value
        for name, value in tpu_env.items()
        if name.startswith("MEGASCALE_") and PASSABLE_NAME.fullmatch(name)
    }


def discover_identity(
    metadata: Metadata, config: dict[str, Any], tpu_env: dict[str, str] | None = None
) -> tuple[int, int]:
    """(worker id, slice id) of this host, from the metadata server (and `tpu-env`, if read already)."""
    if tpu_env is None:
        tpu_env = read_tpu_env(metadata)
    number = metadata.get_optional("instance/attributes/agent-worker-number")
    if number is None:
        number = tpu_env.get("WORKER_ID")
    if number is None or not re.fullmatch(r"[0-9]+", number.strip()):
        raise AgentError(f"no worker number in the metadata (agent-worker-number: {number!r})")
    slice_id = 0
    if int(config["num_slices"]) > 1:
        node_id = tpu_env.get("NODE_ID")
        if not node_id:
            raise AgentError("a multislice job but no NODE_ID in instance/attributes/tpu-env")
        slice_id = slice_id_from_node_id(node_id, str(config["queued_resource"]))
    return int(number.strip()), slice_id


# --- configuration --------------------------------------------------------------------


def parse_rfc3339(text: str) -> float | None:
    """An RFC 3339 UTC time (`...Z` or `...+00:00`) as epoch seconds; None if it is not one."""
    try:
        moment = datetime.datetime.fromisoformat(text[:-1] + "+00:00" if text.endswith("Z") else text)
    except ValueError:
        return None
    return moment.timestamp() if moment.tzinfo is not None else None


def attempt_deadline(config: dict[str, Any], started: float) -> tuple[float, str] | None:
    """When this attempt must stop (epoch seconds) and the limit that says so, the earliest of:
    `time_limit_at` (the whole job's, absolute), `started` + `time_limit_seconds` (the first
    attempt: its capacity was not held yet when the config was written), `started` +
    `attempt_time_limit_seconds`. None without a limit."""
    found = []
    at = config.get("time_limit_at")
    whole = parse_rfc3339(at) if at else None
    if whole is not None:
        found.append((whole, "time_limit"))
    elif config.get("time_limit_seconds"):
        found.append((started + float(config["time_limit_seconds"]), "time_limit"))
    if config.get("attempt_time_limit_seconds"):
        found.append((started + float(config["attempt_time_limit_seconds"]), "attempt_time_limit"))
    return min(found) if found else None


def read_json_object(path: str) -> dict[str, Any]:
    """A config file written by the startup script: one JSON object."""
    try:
        with open(path, encoding="utf-8") as handle:
            config = json.load(handle)
    except (OSError, ValueError) as error:
        raise AgentError(f"cannot read the config {path}: {error}") from None
    if not isinstance(config, dict):
        raise AgentError("the config is not a JSON object")
    return config


def check_required(config: dict[str, Any], required: dict[str, type]) -> None:
    """Every required key is there, with its type (a bool is no int)."""
    for key, kind in required.items():
        value = config.get(key)
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise AgentError(f"config key {key!r} must be {kind.__name__}, got {value!r}")


def check_image(config: dict[str, Any]) -> None:
    """`image` and `image_pull_policy`, checked; an image without a policy gets the default one."""
    image = config.setdefault("image", None)
    if image is not None and not (isinstance(image, str) and IMAGE_REFERENCE.fullmatch(image)):
        shown = image[:200] if isinstance(image, str) else image
        raise AgentError(f"config key 'image' must be a container image reference or null, got {shown!r}")
    policy = config.setdefault("image_pull_policy", None)
    if policy is not None and policy not in PULL_POLICIES:
        raise AgentError(f"config key 'image_pull_policy' must be one of {', '.join(PULL_POLICIES)} or null")
    if image is not None and policy is None:
        config["image_pull_policy"] = default_pull_policy(image)


def check_timings(config: dict[str, Any], pool: bool = False) -> None:
    """The DEFAULTS' periods: positive numbers, defaults filled in (a config written before
    a key existed gets its default); `peer_port` a port number. A pool unit's config has only
    POOL_TIMINGS: each job it runs brings its own."""
    for key, default in DEFAULTS.items():
        if pool and key not in POOL_TIMINGS:
            continue
        value = config.setdefault(key, default)
        zero_ok = key == "heartbeat_fast_window_seconds"  # 0: sparse from the start
        number = not isinstance(value, bool) and isinstance(value, (int, float))
        if not number or value < 0 or (value == 0 and not zero_ok):
            raise AgentError(
                f"config key {key!r} must be {'0 or more' if zero_ok else 'a positive number'}, got {value!r}"
            )
    if pool:
        return
    port = config.setdefault("peer_port", PEER_PORT)
    if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
        raise AgentError(f"config key 'peer_port' must be a port number, got {port!r}")


def load_config(path: str) -> dict[str, Any]:
    """The config JSON written by the startup script, checked, with defaults filled in."""
    return check_config(read_json_object(path))


def check_config(config: dict[str, Any]) -> dict[str, Any]:
    """An attempt's config (from the startup script, or a pool unit's assignment), checked,
    with defaults filled in."""
    check_required(config, REQUIRED)
    for key in ("setup", "code_uri"):
        if config.get(key) is not None and not isinstance(config[key], str):
            raise AgentError(f"config key {key!r} must be a string or null")
        config.setdefault(key, None)
    env = config.setdefault("env", {})
    if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        raise AgentError("config key 'env' must map strings to strings")
    wanted = config.setdefault("secrets", {})
    if not isinstance(wanted, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in wanted.items()):
        raise AgentError("config key 'secrets' must map env names to secret version names")
    for env_name, version in wanted.items():
        if not ENV_NAME.fullmatch(env_name) or env_name.startswith("TPUJOBS_"):
            raise AgentError(f"config key 'secrets' has a bad env name {env_name[:64]!r}")
        if not SECRET_VERSION.fullmatch(version):
            raise AgentError(
                f"config key 'secrets': {env_name} must name projects/P/secrets/S/versions/V, got {version[:200]!r}"
            )
    check_image(config)
    digest = config.setdefault("code_sha256", None)
    if digest is not None and not (isinstance(digest, str) and SHA256_HEX.fullmatch(digest)):
        raise AgentError(f"config key 'code_sha256' must be 64 hex digits or null, got {digest!r}")
    patterns = config.setdefault("retry_output", [])
    if not isinstance(patterns, list) or not all(isinstance(p, str) for p in patterns):
        raise AgentError("config key 'retry_output' must be a list of strings")
    for key in ("time_limit_seconds", "attempt_time_limit_seconds"):
        value = config.setdefault(key, None)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0):
            raise AgentError(f"config key {key!r} must be a positive number or null, got {value!r}")
    at = config.setdefault("time_limit_at", None)
    if at is not None and (not isinstance(at, str) or parse_rfc3339(at) is None):
        raise AgentError(f"config key 'time_limit_at' must be an RFC 3339 time or null, got {str(at)[:64]!r}")
    check_timings(config)
    return config


def host_variables(environ: dict[str, str]) -> dict[str, str]:
    """The host's environment without its TPUJOBS_ variables (the simulator's TPUJOBS_WORKDIR,
    TPUJOBS_METADATA_URL): the prefix is reserved for what the agent itself sets."""
    return {name: value for name, value in environ.items() if not name.startswith("TPUJOBS_")}


def job_environment(
    base: dict[str, str],
    config: dict[str, Any],
    worker_id: int,
    slice_id: int,
    secret_values: dict[str, str] | None = None,
    megascale: dict[str, str] | None = None,
) -> dict[str, str]:
    """The command's environment: the host's, its MEGASCALE_* values from `tpu-env`, the spec's
    env, its secrets, then TPUJOBS_ variables.

    The host's own TPUJOBS_ variables (the simulator's TPUJOBS_WORKDIR, TPUJOBS_METADATA_URL)
    are left out: the prefix is reserved, and the job sees exactly the TPUJOBS_ variables set here.
    """
    env = host_variables(base)
    env.update(megascale or {})
    env.update(config["env"])
    env.update(secret_values or {})
    env.update(
        {
            "TPUJOBS_JOB_ID": config["job_id"],
            "TPUJOBS_ATTEMPT": str(config["attempt"]),
            "TPUJOBS_RESUME": "1" if config["resume"] else "0",
            "TPUJOBS_CHECKPOINT_URI": config["checkpoint_uri"],
            "TPUJOBS_WORKER_ID": str(worker_id),
            "TPUJOBS_NUM_WORKERS": str(config["hosts_per_slice"]),
            "TPUJOBS_SLICE_ID": str(slice_id),
            "TPUJOBS_NUM_SLICES": str(config["num_slices"]),
        }
    )
    return env


def safe_name(value: str) -> str:
    """A value usable as one file-name segment."""
    return re.sub(r"[^A-Za-z0-9_-]", "_", value) or "_"


# --- fetching code --------------------------------------------------------------------


def _relative_parts(name: str, what: str) -> list[str]:
    """The parts of a relative archive or object path; absolute paths and `..` are refused."""
    if name.startswith("/") or name.startswith("\\") or "\\" in name:
        raise AgentError(f"{what} {name!r} is absolute or uses backslashes")
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise AgentError(f"{what} {name!r} climbs out with '..'")
    return parts


def _inside(root: str, path: str) -> bool:
    root = os.path.realpath(root)
    path = os.path.realpath(path)
    return path == root or path.startswith(root + os.sep)


def safe_extract(archive: str, destination: str, standard_filter: bool = True) -> None:
    """Unpack a tarball into destination; refuse absolute paths, `..`, escaping links, devices.

    The checks here suffice on their own (Python 3.8 has no extraction filters); where the
    standard "data" filter exists it is applied as well.
    """
    os.makedirs(destination, exist_ok=True)
    root = os.path.realpath(destination)
    extra: dict[str, Any] = {}
    if standard_filter and hasattr(tarfile, "data_filter"):
        extra["filter"] = "data"
    with tarfile.open(archive, "r:*") as tar:
        members = tar.getmembers()
        for member in members:
            parts = _relative_parts(member.name, "archive member")
            if not (member.isfile() or member.isdir() or member.issym() or member.islnk()):
                raise AgentError(f"archive member {member.name!r} is not a file, directory or link")
            if member.issym():
                if member.linkname.startswith("/"):
                    raise AgentError(f"symlink {member.name!r} points to an absolute path")
                target = os.path.normpath(os.path.join(root, *parts[:-1], member.linkname))
                if not (target == root or target.startswith(root + os.sep)):
                    raise AgentError(f"symlink {member.name!r} points outside the code directory")
            if member.islnk():
                _relative_parts(member.linkname, f"hard link target of {member.name!r}")
        for member in members:
            parts = _relative_parts(member.name, "archive member")
            if not parts:
                continue
            path = os.path.join(root, *parts)
            # Links already unpacked must not lead anywhere else: check where writing would land.
            if not _inside(root, os.path.dirname(path)) or (
                not member.isdir() and os.path.lexists(path) and not _inside(root, path)
            ):
                raise AgentError(f"archive member {member.name!r} would land outside the code directory")
            if member.islnk() and not _inside(root, os.path.join(root, member.linkname)):
                raise AgentError(f"hard link {member.name!r} points outside the code directory")
            try:
                tar.extract(member, root, **extra)
            except tarfile.TarError as error:  # the standard "data" filter refused it
                raise AgentError(f"archive member {member.name!r} refused: {error}") from None
            if member.issym() and not _inside(root, path):
                os.unlink(path)
                raise AgentError(f"symlink {member.name!r} resolves outside the code directory")


def file_sha256(path: str) -> str:
    """The hex SHA-256 of a file's bytes."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1024 * 1024), b""):
            digest.update(block)
    return digest.hexdigest()


def fetch_code(storage: Storage, code_uri: str, destination: str, sha256: str | None = None) -> None:
    """A gs:// tarball unpacked into destination, or every object under a gs:// prefix.

    With `sha256` (the digest recorded with the job) the downloaded tarball must have it
    before anything is unpacked; otherwise it is `Refused`. A prefix has no one digest.
    """
    bucket, name = split_gs_uri(code_uri)
    os.makedirs(destination, exist_ok=True)
    if name and not name.endswith("/"):
        fd, archive = tempfile.mkstemp(prefix="code-", suffix=".tar", dir=os.path.dirname(destination))
        os.close(fd)
        try:
            storage.download(bucket, name, archive)
            if sha256 is not None:
                found = file_sha256(archive)
                if found != sha256.lower():
                    raise Refused(
                        f"the code tarball {code_uri} has SHA-256 {found}, not {sha256.lower()} "
                        "recorded with the job: refused (it was replaced or planted after submission)"
                    )
            safe_extract(archive, destination)
        finally:
            os.unlink(archive)
        return
    if sha256 is not None:
        raise Refused(
            f"the job records the SHA-256 of a code tarball, but its code {code_uri} is a prefix: "
            "a prefix's objects have no one digest to check, so the code is refused"
        )
    names = storage.list_names(bucket, name)
    if not names:
        raise AgentError(f"no objects under {code_uri}")
    for object_name in names:
        relative = object_name[len(name) :]
        if not relative or relative.endswith("/"):
            continue  # a "folder" placeholder
        parts = _relative_parts(relative, "object")
        path = os.path.join(destination, *parts)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        if not _inside(destination, os.path.dirname(path)):
            raise AgentError(f"object {object_name!r} would land outside the code directory")
        storage.download(bucket, object_name, path)


# --- output ---------------------------------------------------------------------------


def parse_checkpoint(line: bytes) -> tuple[int, str] | None:
    """(step, detail) of a `TPUJOBS_CHECKPOINT step=N ...` line, else None."""
    match = CHECKPOINT_LINE.match(line.rstrip(b"\r\n"))
    if match is None:
        return None
    detail = match.group(2).decode("utf-8", "replace").strip()[:MAX_DETAIL_CHARS]
    return int(match.group(1)), detail


class LogShipper:
    """Output to numbered chunk objects: every chunk_seconds or 256 KiB, and once more at the end."""

    def __init__(
        self,
        storage: Storage,
        bucket: str,
        prefix: str,
        chunk_seconds: float,
        echo: Any = None,
        attempts: int = 6,
        max_pending: int = MAX_PENDING_BYTES,
    ) -> None:
        self.storage = storage
        self.max_pending = max_pending
        self.attempts = attempts  # per upload; a chunk that still fails is tried again next tick
        self.bucket = bucket
        self.prefix = prefix  # ends with "/": objects are prefix + 000000.log, ...
        self.chunk_seconds = chunk_seconds
        self.echo = echo
        self.chunks = 0
        self.dropped = 0
        self._pending = bytearray()
        self._offset = 0  # how many bytes of output came before _pending[0]
        self._cond = threading.Condition()
        self._closing = False
        self._thread = threading.Thread(target=self._run, name="log-shipper", daemon=True)
        self._thread.start()

    def write(self, data: bytes) -> None:
        if self.echo is not None:
            try:
                self.echo.write(data)
                self.echo.flush()
            except (OSError, ValueError):
                pass
        with self._cond:
            self._pending.extend(data)
            excess = len(self._pending) - self.max_pending
            if excess > 0:
                del self._pending[:excess]
                self._offset += excess
                self.dropped += excess
            if len(self._pending) >= MAX_CHUNK_BYTES:
                self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                deadline = time.monotonic() + self.chunk_seconds
                while not self._closing and len(self._pending) < MAX_CHUNK_BYTES:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        break
                    self._cond.wait(remaining)
                closing = self._closing
            self._ship()
            if closing:
                return

    def _ship(self) -> bool:
        """Uploads what is pending; False when an upload failed (the data stays pending)."""
        while True:
            with self._cond:
                start = self._offset
                piece = bytes(self._pending[:MAX_CHUNK_BYTES])
            if not piece:
                return True
            name = f"{self.prefix}{self.chunks:06d}.log"
            try:
                self.storage.upload(self.bucket, name, piece, "text/plain; charset=utf-8", self.attempts)
            except Exception as error:  # keep the data; the next tick tries again
                log(f"could not upload output chunk {name}: {error}")
                return False
            with self._cond:
                shipped = start + len(piece) - self._offset  # less if some was dropped meanwhile
                if shipped > 0:
                    del self._pending[:shipped]
                    self._offset += shipped
            self.chunks += 1

    def close(self, exit_code: int | None, timeout: float = 60.0) -> None:
        """The final flush; with an exit code (a clean end), also the complete.json marker."""
        with self._cond:
            self._closing = True
            self._cond.notify()
        self._thread.join(timeout)
        if self._thread.is_alive() or not self._ship():
            log("output not fully uploaded; no completion marker written")
            return
        if self.dropped:
            log(f"{self.dropped} bytes of output were dropped while uploads failed")
        if exit_code is not None:
            marker = json.dumps({"exit_code": exit_code, "chunks": self.chunks}).encode("utf-8")
            # Not application/json: the storage emulator would take the body for object metadata.
            try:
                self.storage.upload(self.bucket, self.prefix + "complete.json", marker, "text/plain; charset=utf-8")
            except (AgentError, OSError, http.client.HTTPException) as error:
                log(f"could not write the completion marker: {error}")


class OutputPump(threading.Thread):
    """Reads a child's merged stdout and stderr into the shipper; spots checkpoint lines."""

    def __init__(
        self,
        fd: int,
        shipper: LogShipper,
        on_checkpoint: Callable[[int, str], None],
        on_line: Callable[[], None] | None = None,
    ) -> None:
        super().__init__(name="output-pump", daemon=True)
        self.fd = fd
        self.shipper = shipper
        self.on_checkpoint = on_checkpoint
        self.on_line = on_line  # told once per read that ends at least one line (progress)
        self.tail = b""  # the output's last bytes: where docker says why it could not run a container

    def run(self) -> None:
        partial = b""
        while True:
            try:
                data = os.read(self.fd, 65536)
            except OSError:
                break
            if not data:
                break
            self.shipper.write(data)
            self.tail = (self.tail + data)[-TAIL_BYTES:]
            lines = (partial + data).split(b"\n")
            partial = lines.pop()
            if len(partial) > MAX_LINE_BYTES:
                partial = partial[:MAX_LINE_BYTES]
            if lines and self.on_line is not None:
                self.on_line()
            for line in lines:
                self._scan(line)
        if partial:
            self._scan(partial)
        with contextlib.suppress(OSError):
            os.close(self.fd)

    def _scan(self, line: bytes) -> None:
        found = parse_checkpoint(line)
        if found is not None:
            self.on_checkpoint(*found)


# --- last lines and error classes -----------------------------------------------------
# A failed `exited` carries the command's last lines, with every secret value cut out, and
# which of the job's retry_on.output patterns matched one. The patterns run here, on the
# job's own host, never in the shared control plane: a pathological pattern can stall only
# this one job, and only for MATCH_SECONDS.


class LastOutput:
    """The command's newest output bytes: enough to cut out any secret value, even one that
    began before the LAST_BYTES that are sent, before they are sent (`last_lines`)."""

    def __init__(self, keep: int = LAST_BYTES + MAX_SECRET_BYTES) -> None:
        self.keep = keep
        self.dropped = False  # older output was let go: the window's start may cut a secret
        self._data = bytearray()
        self._lock = threading.Lock()

    def write(self, data: bytes) -> None:
        with self._lock:
            self._data.extend(data)
            excess = len(self._data) - self.keep
            if excess > 0:
                del self._data[:excess]
                self.dropped = True

    def snapshot(self) -> bytes:
        with self._lock:
            return bytes(self._data)


class _Tee:
    """What an output pump writes to: the shipper, and the last output kept for `exited`."""

    def __init__(self, shipper: LogShipper, last: LastOutput) -> None:
        self.shipper = shipper
        self.last = last

    def write(self, data: bytes) -> None:
        self.shipper.write(data)
        self.last.write(data)


def redact(window: bytes, secrets: dict[str, str], dropped: bool = False) -> bytes:
    """`window` with every secret value replaced by `[secret NAME]`. When older output was
    dropped (`dropped`), the window's first bytes, as long as the longest value, are left out
    too: a value cut by the window's start lies wholly within them and cannot be recognised."""
    names: dict[bytes, str] = {}
    for name in sorted(secrets):
        value = os.fsencode(secrets[name])
        if value:
            names.setdefault(value, name)
    values = sorted(names, key=len, reverse=True)  # the longest first: one value may hold another
    cut = max((len(v) for v in values), default=0) if dropped else 0
    out = bytearray()
    pos = 0
    if values:
        for found in re.finditer(b"|".join(re.escape(v) for v in values), window):
            out += window[max(pos, cut) : max(found.start(), cut)]
            if found.end() > cut:  # wholly in the window, so recognised: its name only
                out += f"[secret {names[found.group()]}]".encode()
            pos = found.end()
    out += window[max(pos, cut) :]
    return bytes(out)


def _printable(text: str) -> str:
    """A line without control characters (a tab stays), so its JSON stays small and plain."""
    return "".join(c if c == "\t" or (ord(c) >= 32 and ord(c) != 127) else "?" for c in text)


def last_lines(window: bytes, secrets: dict[str, str], dropped: bool = False) -> list[str]:
    """The output's last lines, oldest first, secret values cut out (`redact`): at most
    LAST_LINES lines and LAST_BYTES bytes of UTF-8, whichever is less."""
    lines = redact(window, secrets, dropped).split(b"\n")
    if lines and lines[-1] == b"":  # the output ended with a newline
        lines.pop()
    if dropped and len(lines) > 1:  # the first line is what was left of a longer one
        lines = lines[1:]
    kept: list[str] = []
    room = LAST_BYTES
    for raw in reversed(lines[-LAST_LINES:]):
        line = _printable(raw.rstrip(b"\r").decode("utf-8", "replace"))
        size = len(line.encode("utf-8"))
        if size > room:
            if not kept:  # one long last line: its end
                kept.append(line.encode("utf-8")[-room:].decode("utf-8", "ignore"))
            break
        kept.append(line)
        room -= size
    return kept[::-1]


# Run by a child python3, so a pattern that backtracks without end can be stopped: the
# first (pattern index, line) with the newest line first, patterns in the spec's order;
# a pattern this Python cannot compile is skipped.
MATCHER = """
import json, re, sys
asked = json.load(sys.stdin)
compiled = []
for index, pattern in enumerate(asked["patterns"]):
    try:
        compiled.append((index, re.compile(pattern)))
    except re.error:
        pass
found = None
for line in reversed(asked["lines"]):
    found = next(([index, line] for index, pattern in compiled if pattern.search(line)), None)
    if found:
        break
json.dump(found, sys.stdout)
"""


def match_retry_output(
    patterns: list[str], lines: list[str], timeout: float = MATCH_SECONDS
) -> tuple[int, str] | str | None:
    """(index of the first pattern that matches, the line it matched) of the newest line a
    pattern matches; None when none does; a sentence when the patterns could not be run."""
    if not patterns or not lines:
        return None
    asked = json.dumps({"patterns": patterns, "lines": lines}).encode("utf-8")
    try:
        done = subprocess.run(
            # -I: neither the working directory (writable by the job) nor PYTHON* variables steer it.
            [sys.executable or "python3", "-I", "-c", MATCHER],
            input=asked,
            capture_output=True,
            timeout=timeout,
        )
        found = json.loads(done.stdout.decode("utf-8")) if done.returncode == 0 else None
    except subprocess.TimeoutExpired:
        return f"the retry_on.output patterns took over {timeout:g} s on the last lines; none is taken as matched"
    except (OSError, ValueError) as error:
        return f"the retry_on.output patterns could not be run: {error}"
    if isinstance(found, list) and len(found) == 2 and isinstance(found[0], int) and isinstance(found[1], str):
        return found[0], found[1]
    return None


# --- one host speaks for its slice ----------------------------------------------------
#
# In a slice of several hosts, worker 0 alone publishes heartbeats: the others tell it they
# are alive over the slice's own network, in small UDP datagrams, and it says so for them
# (one invocation and one Firestore write per slice per period, not per host). The table of
# what each side sends and does:
#
#   datagram  from        to          when                        what the receiver does
#   beat      worker k>0  worker 0    every peer_seconds          notes k alive, with its last output
#                                                                 and checkpoint; answers `ack`
#   ack       worker 0    worker k    for every accepted beat     k knows worker 0 speaks for it: it
#                                                                 stops its own heartbeats (sticky)
#   bye       worker k>0  worker 0    when k's agent ends         k is not reported silent
#
# A peer worker 0 heard and then hears nothing from for peer_timeout_seconds is reported at
# once in a signed `peer_silent` report naming it (the service's CAPACITY_LOST for that host).
# A peer never acknowledged (worker 0 not up yet, a firewall, a port taken) publishes its own
# heartbeats as a single host does, so nothing depends on the slice network being there.
#
# Every datagram is `v1=<hex HMAC-SHA256 under the attempt's report key> <JSON>`, and names
# the job, attempt, slice and worker, a sequence number that only grows and the sender's
# time; a receiver drops any datagram that is unsigned, for another attempt or slice, older
# than PEER_SKEW_SECONDS or not newer than the last it took from that sender, so another
# team's VM on the same network can neither forge nor replay a peer's liveness.

PEER_PORT = 8479  # UDP, on each host's own address: where worker 0 of a slice hears its peers
ENDPOINTS_METADATA = "instance/attributes/worker-network-endpoints"  # id:host:ip,... worker 0 first
ADDRESS_METADATA = "instance/network-interfaces/0/ip"
PEER_MAX_BYTES = 2048
PEER_SKEW_SECONDS = 30.0  # a datagram's `at` may differ this much from the receiver's clock
PEER_KINDS = frozenset({"beat", "bye", "ack"})


class PeerRefused(AgentError):
    """A datagram that is not a peer's word for this attempt and slice; the message says why."""


def heartbeat_period(elapsed: float, config: dict[str, Any]) -> float:
    """Seconds until the next heartbeat: `heartbeat_seconds` during the attempt's first
    `heartbeat_fast_window_seconds` on this host (a host that fails at start fails early),
    `heartbeat_sparse_seconds` after (a long run costs a third of the invocations)."""
    if elapsed < float(config["heartbeat_fast_window_seconds"]):
        return float(config["heartbeat_seconds"])
    return float(config["heartbeat_sparse_seconds"])


def worker_address(endpoints: str, worker: int) -> str | None:
    """The address of `worker` in `worker-network-endpoints` (`x:y:10.0.0.2,x:y:10.0.0.3`,
    worker 0 first, the IP last in each entry, as JAX's cloud_tpu_cluster reads it)."""
    entries = [entry.strip() for entry in endpoints.split(",") if entry.strip()]
    if not 0 <= worker < len(entries):
        return None
    address = entries[worker].rsplit(":", 1)[-1]
    return address if re.fullmatch(r"[0-9]{1,3}(?:\.[0-9]{1,3}){3}", address) else None


def seal(key: bytes, fields: dict[str, Any]) -> bytes:
    """A signed datagram: `v1=<hex HMAC> ` and the compact JSON it covers."""
    data = encode_payload(fields)
    return sign(key, data).encode("ascii") + b" " + data


def unseal(key: bytes, datagram: bytes) -> dict[str, Any]:
    """The fields of a datagram signed with `key`; PeerRefused when it is not one."""
    if len(datagram) > PEER_MAX_BYTES:
        raise PeerRefused(f"the datagram is {len(datagram)} bytes, more than {PEER_MAX_BYTES}")
    signature, sep, data = datagram.partition(b" ")
    if not sep or not hmac.compare_digest(signature, sign(key, data).encode("ascii")):
        raise PeerRefused("the datagram is not signed with this attempt's key")
    try:
        fields = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise PeerRefused("the datagram is not JSON") from None
    if not isinstance(fields, dict) or fields.get("kind") not in PEER_KINDS:
        raise PeerRefused("the datagram is not a beat, an ack or a bye")
    return fields


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _whole(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def check_peer_fields(fields: dict[str, Any], identity: dict[str, Any], sender: int, last_seq: int, now: float) -> int:
    """The datagram's sequence number, if it is `sender`'s word for this attempt and slice,
    timely and newer than `last_seq`; PeerRefused naming the field otherwise."""
    for name in ("job_id", "attempt", "slice_id"):
        if fields.get(name) != identity[name]:
            raise PeerRefused(f"field {name!r} is not this host's {identity[name]!r}")
    if fields.get("worker_id") != sender:
        raise PeerRefused(f"field 'worker_id' is not {sender}")
    at = _number(fields.get("at"))
    if at is None or abs(now - at) > PEER_SKEW_SECONDS:
        raise PeerRefused(f"field 'at' is not within {PEER_SKEW_SECONDS:g} s of this host's clock (a replay?)")
    seq = _whole(fields.get("seq"))
    if seq is None or seq <= last_seq:
        raise PeerRefused("field 'seq' is not newer than the last one taken (a replay)")
    return seq


class SliceWatch:
    """Worker 0's view of its peers (pure: times are passed in), fed by `accept`.

    A peer is watched from its first accepted beat until its bye, or until it is reported
    silent (once). Its last output and checkpoint join worker 0's heartbeat.
    """

    def __init__(self, identity: dict[str, Any], hosts: int, timeout: float) -> None:
        self.identity = identity
        self.hosts = hosts
        self.timeout = timeout
        self.peers: dict[int, dict[str, Any]] = {}
        self._lock = threading.Lock()

    def accept(self, fields: dict[str, Any], now: float, clock: float) -> int:
        """The sequence number to acknowledge, if the datagram is a peer's beat or bye (`now`:
        wall time, `clock`: monotonic); PeerRefused otherwise."""
        sender = _whole(fields.get("worker_id"))
        if fields.get("kind") not in ("beat", "bye") or sender is None or not 0 < sender < self.hosts:
            raise PeerRefused(f"field 'worker_id' names no peer of this slice of {self.hosts} hosts")
        with self._lock:
            peer = self.peers.get(sender, {"seq": -1, "reported": False})
            seq = check_peer_fields(fields, self.identity, sender, peer["seq"], now)
            peer.update(seq=seq, heard=clock, gone=fields["kind"] == "bye")
            for name in ("last_output_at", "checkpoint_at"):
                value = _number(fields.get(name))
                if value is not None:
                    peer[name] = max(value, peer.get(name, value))
            step = _whole(fields.get("checkpoint_step"))
            if step is not None and step >= peer.get("checkpoint_step", -1):
                peer["checkpoint_step"] = step
            self.peers[sender] = peer
        return seq

    def silent(self, clock: float) -> list[tuple[int, float]]:
        """Peers heard, not gone, and quiet past the timeout: (worker, seconds quiet), each once."""
        found = []
        with self._lock:
            for worker, peer in sorted(self.peers.items()):
                quiet = clock - peer["heard"]
                if not peer["gone"] and not peer["reported"] and quiet > self.timeout:
                    peer["reported"] = True
                    found.append((worker, quiet))
        return found

    def watching(self) -> int:
        """How many peers are heard and not yet gone nor reported."""
        with self._lock:
            return sum(1 for peer in self.peers.values() if not peer["gone"] and not peer["reported"])

    def progress(self) -> dict[str, Any]:
        """The peers' latest last output (epoch s), checkpoint step and its time, how many are
        heard, and which were reported silent: what worker 0's heartbeat adds for its slice."""
        with self._lock:
            peers = list(self.peers.values())
            # Reported and never a bye since: said again, so a lost report is not lost for good.
            reported = sorted(w for w, p in self.peers.items() if p["reported"] and not p["gone"])
        found: dict[str, Any] = {"peers_heard": sum(1 for p in peers if not p["gone"] and not p["reported"])}
        if reported:
            found["peers_silent"] = reported
        outputs = [p["last_output_at"] for p in peers if "last_output_at" in p]
        if outputs:
            found["last_output_at"] = max(outputs)
        steps = [(p["checkpoint_step"], p.get("checkpoint_at") or 0.0) for p in peers if "checkpoint_step" in p]
        if steps:
            found["checkpoint_step"], found["checkpoint_at"] = max(steps)
        return found


class PeerState:
    """A peer's side (pure): the sequence numbers it sent, and whether worker 0 acknowledged one."""

    def __init__(self, identity: dict[str, Any]) -> None:
        self.identity = identity
        self.seq = -1
        self.acked_seq = -1
        self._lock = threading.Lock()

    def next_seq(self, now: float) -> int:
        """A number larger than any sent before, even by an earlier agent on this host."""
        with self._lock:
            self.seq = max(self.seq + 1, int(now * 1000))
            return self.seq

    def accept_ack(self, fields: dict[str, Any], now: float) -> bool:
        """Whether the datagram is worker 0's ack of a beat this host sent (the first such ack
        makes worker 0 its speaker); PeerRefused when it is not one."""
        if fields.get("kind") != "ack":
            raise PeerRefused("a peer takes only acks")
        seq = check_peer_fields(fields, self.identity, 0, self.acked_seq, now)
        with self._lock:
            if seq > self.seq:
                raise PeerRefused("field 'seq' acknowledges a beat this host never sent")
            first = self.acked_seq < 0
            self.acked_seq = seq
        return first

    @property
    def watched(self) -> bool:
        return self.acked_seq >= 0


def _datagram_socket(address: str, port: int) -> Any:
    import socket  # only hosts of multi-host slices open one

    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        sock.bind((address, port))
    except OSError:
        sock.close()
        raise
    sock.settimeout(0.5)
    return sock


class SliceLink:
    """The slice's own network, for one host of a multi-host slice: worker 0 listens on
    PEER_PORT of its address and answers; a peer sends beats and reads acks. `progress` is a
    callable giving the host's last output and checkpoint (epoch seconds, step)."""

    def __init__(
        self,
        key: bytes,
        identity: dict[str, Any],
        config: dict[str, Any],
        metadata: Metadata,
        progress: Callable[[], dict[str, Any]],
        on_silent: Callable[[int, float], None],
        on_watched: Callable[[], None],
        on_peer_checkpoint: Callable[[int, int], None],
    ) -> None:
        self._key = key
        self.identity = identity
        self.worker_id = int(identity["worker_id"])
        self.port = int(config["peer_port"])
        self.every = float(config["peer_seconds"])
        self.metadata = metadata
        self.progress = progress
        self.on_silent = on_silent
        self.on_watched = on_watched
        self.on_peer_checkpoint = on_peer_checkpoint
        self.watch = SliceWatch(identity, int(config["hosts_per_slice"]), float(config["peer_timeout_seconds"]))
        self.peer = PeerState(identity)
        self.stop = threading.Event()
        self._sock: Any = None
        self._speaker: tuple[str, int] | None = None
        self._thread = threading.Thread(target=self._run, name="slice-link", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _open(self) -> bool:
        """The socket: worker 0 on its own address and PEER_PORT, a peer on any port of its own."""
        try:
            own = self.metadata.get(ADDRESS_METADATA).strip()
            if self.worker_id != 0:
                speaker = worker_address(self.metadata.get_optional(ENDPOINTS_METADATA) or "", 0)
                if speaker is None:
                    log(f"no worker 0 address in {ENDPOINTS_METADATA}: this host reports its own heartbeats")
                    return False
                self._speaker = (speaker, self.port)
            self._sock = _datagram_socket(own, self.port if self.worker_id == 0 else 0)
        except (AgentError, OSError, http.client.HTTPException) as error:
            log(f"the slice link is not open ({error}): every host of the slice reports its own heartbeats")
            return False
        return True

    def _run(self) -> None:
        if not self._open():
            return
        try:
            if self.worker_id == 0:
                self._listen()
            else:
                self._beat()
        finally:
            self._sock.close()

    def _send(self, kind: str, address: tuple[str, int], **extra: Any) -> None:
        seq = extra.pop("seq", None)
        now = time.time()
        fields = {"kind": kind, **self.identity, "at": now, "seq": self.peer.next_seq(now) if seq is None else seq}
        fields.update({k: v for k, v in extra.items() if v is not None})
        with contextlib.suppress(OSError):  # a lost datagram is one of many
            self._sock.sendto(seal(self._key, fields), address)

    def _listen(self) -> None:
        while not self.stop.is_set():
            try:
                datagram, sender = self._sock.recvfrom(PEER_MAX_BYTES + 1)
            except OSError:  # the timeout, or a socket error: look at the silent ones
                datagram = b""
            if datagram:
                try:
                    fields = unseal(self._key, datagram)
                    seq = self.watch.accept(fields, time.time(), time.monotonic())
                except PeerRefused as refusal:
                    log(f"a datagram from {sender[0]} refused: {refusal}")
                else:
                    self._send("ack", sender, seq=seq)
                    step = _whole(fields.get("checkpoint_step"))
                    if step is not None:
                        self.on_peer_checkpoint(int(fields["worker_id"]), step)
            for worker, quiet in self.watch.silent(time.monotonic()):
                self.on_silent(worker, quiet)

    def _beat(self) -> None:
        assert self._speaker is not None
        while not self.stop.is_set():
            self._send("beat", self._speaker, **self.progress())
            until = time.monotonic() + self.every
            while not self.stop.is_set() and time.monotonic() < until:
                try:
                    datagram, _ = self._sock.recvfrom(PEER_MAX_BYTES + 1)
                except OSError:
                    continue
                try:
                    first = self.peer.accept_ack(unseal(self._key, datagram), time.time())
                except PeerRefused as refusal:
                    log(f"a datagram refused: {refusal}")
                    continue
                if first:
                    log("worker 0 speaks for this host: its own heartbeats stop")
                    self.on_watched()

    def bye(self) -> None:
        """A peer's last word (sent three times: datagrams get lost), then the link closes."""
        if self.worker_id != 0 and self._speaker is not None and self._sock is not None:
            for _ in range(3):
                self._send("bye", self._speaker)
        self.close()

    def close(self) -> None:
        self.stop.set()
        if self._thread.is_alive():
            self._thread.join(2.0)


# --- reports --------------------------------------------------------------------------


class Reporter:
    """Worker events, published in order from one thread so a slow publish never stalls the job.

    Checkpoints coalesce: while one waits to be published, a newer one replaces it (the latest
    step is what counts), so a command printing TPUJOBS_CHECKPOINT lines in a loop queues one
    report, not one per line, and cannot flood the topic or the agent's memory.
    """

    _CHECKPOINT_SLOT = object()  # in the queue: publish the latest pending checkpoint here

    def __init__(self, publisher: Publisher, topic: str, identity: dict[str, Any]) -> None:
        self.publisher = publisher
        self.topic = topic
        self.identity = identity  # job_id, attempt, slice_id, worker_id
        self._queue: queue.Queue[Any] = queue.Queue()
        self._slot_lock = threading.Lock()
        self._pending_checkpoint: dict[str, Any] | None = None
        self._silenced = threading.Event()
        self._muted = threading.Event()  # nothing at all, not even checkpoints (a withdrawn job)
        self._thread = threading.Thread(target=self._run, name="reporter", daemon=True)
        self._thread.start()

    def message(self, kind: str, **extra: Any) -> dict[str, Any]:
        """A report's payload: its kind, who says it, when, and a fresh nonce (no two alike)."""
        payload = {"kind": kind, **self.identity, "at": rfc3339(), "nonce": token_hex(16)}
        payload.update(extra)
        return payload

    # Still published after the preemption notice: a checkpoint saved on SIGTERM keeps work.
    AFTER_SILENCE = frozenset({"checkpoint"})

    def report(self, kind: str, **extra: Any) -> None:
        if self._quiet(kind):
            return
        payload = self.message(kind, **extra)
        if kind != "checkpoint":
            self._queue.put(payload)
            return
        with self._slot_lock:
            waiting = self._pending_checkpoint is not None
            self._pending_checkpoint = payload
        if not waiting:
            self._queue.put(self._CHECKPOINT_SLOT)

    def silence(self, everything: bool = False) -> None:
        """Nothing more is published but checkpoints (with `everything`, not even those), not even
        what is queued."""
        if everything:
            self._muted.set()
        self._silenced.set()

    def _quiet(self, kind: str) -> bool:
        return self._muted.is_set() or (self._silenced.is_set() and kind not in self.AFTER_SILENCE)

    def close(self, timeout: float = 30.0) -> None:
        self._queue.put(None)
        self._thread.join(timeout)

    def _run(self) -> None:
        while True:
            payload = self._queue.get()
            if payload is None:
                return
            if payload is self._CHECKPOINT_SLOT:
                with self._slot_lock:
                    payload, self._pending_checkpoint = self._pending_checkpoint, None
            if self._quiet(payload["kind"]):
                continue
            attributes = {
                "job_id": str(payload["job_id"]),
                "attempt": str(payload["attempt"]),
                "kind": str(payload["kind"]),
            }
            try:
                self.publisher.publish(self.topic, payload, attributes)
            except Exception as error:  # this thread must outlive any one report
                log(f"could not report {payload['kind']}: {error}")


class Preemption:
    """The one preemption notice of this agent: published first, before anything else happens."""

    def __init__(
        self,
        publisher: Publisher,
        topic: str,
        identity: dict[str, Any],
        on_notice: Callable[[str], None],
    ) -> None:
        self.publisher = publisher
        self.topic = topic
        self.identity = identity
        self.on_notice = on_notice
        self.noticed = threading.Event()
        self._lock = threading.Lock()
        self._retry: threading.Thread | None = None
        self._stood_down = False  # the job was withdrawn: no notice is ever sent for it

    def trigger(self, reason: str) -> None:
        with self._lock:
            if self.noticed.is_set() or self._stood_down:
                return
            self.noticed.set()
        payload = {**self.identity, "reason": reason, "at": rfc3339(), "nonce": token_hex(16)}
        attributes = {"job_id": str(payload["job_id"]), "attempt": str(payload["attempt"])}
        try:
            self.publisher.publish(self.topic, payload, attributes, attempts=1, timeout=3.0)
        except Exception as error:  # whatever happened, the command must still be stopped
            log(f"preemption notice failed once ({error}); retrying while the command stops")
            self._retry = threading.Thread(target=self._publish_again, args=(payload, attributes), daemon=True)
            self._retry.start()
        self.on_notice(reason)

    def stand_down(self) -> bool:
        """No notice from now on; False when one was already triggered (that stop stands)."""
        with self._lock:
            if self.noticed.is_set():
                return False
            self._stood_down = True
            return True

    def _publish_again(self, payload: dict[str, Any], attributes: dict[str, str]) -> None:
        try:
            self.publisher.publish(self.topic, payload, attributes, attempts=5)
        except Exception as error:  # a thread of its own: log, never raise
            log(f"could not publish the preemption notice: {error}")

    def wait(self, timeout: float) -> None:
        if self._retry is not None:
            self._retry.join(timeout)


def watch_sigterm(on_signal: Callable[[str], None]) -> None:
    """SIGTERM calls on_signal from a thread at once, even while the main thread is blocked.

    Must be called from the main thread. The C-level handler writes the signal number to a
    pipe (`signal.set_wakeup_fd`); a thread waiting on the pipe acts on it.
    """
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    signal.signal(signal.SIGTERM, lambda number, frame: None)
    signal.set_wakeup_fd(write_fd)

    def wait() -> None:
        while True:
            try:
                data = os.read(read_fd, 64)
            except OSError:
                return
            if not data:
                return
            if int(signal.SIGTERM) in data:
                on_signal("SIGTERM")

    threading.Thread(target=wait, name="sigterm", daemon=True).start()


def watch_metadata(
    metadata: Metadata,
    path: str,
    on_value: Callable[[str], bool],
    stop: threading.Event,
    wait_seconds: float = WATCH_WAIT_SECONDS,
    floor: float = WATCH_FLOOR_SECONDS,
) -> threading.Thread:
    """Calls on_value with every value a metadata key takes, until it returns True or `stop`.

    Waits with `wait_for_change`, so a change is seen as the server announces it. An answer
    that comes back unchanged sooner than `floor` (a server that does not hold requests) is
    followed by a pause of `floor`, so the watch never spins; an unanswered request is
    tried again a second later (ten for a key the server does not have), never taken for a
    value.
    """

    def watch() -> None:
        etag = ""
        while not stop.is_set():
            asked = time.monotonic()
            try:
                value, new_etag = metadata.wait_for_change(path, etag, wait_seconds)
            except HttpError as error:
                stop.wait(10.0 if error.status == 404 else 1.0)
                continue
            except Exception:  # connection refused, reset, timeout: not a value
                stop.wait(1.0)
                continue
            if on_value(value.strip()):
                return
            quick = time.monotonic() - asked < floor
            if quick and (not new_etag or new_etag == etag):
                stop.wait(floor)
            etag = new_etag

    thread = threading.Thread(target=watch, name=f"watch {path}", daemon=True)
    thread.start()
    return thread


def watch_preempted(metadata: Metadata, on_preempted: Callable[[str], None], stop: threading.Event) -> threading.Thread:
    """On `instance/preempted` turning TRUE, calls on_preempted once."""

    def seen(value: str) -> bool:
        if value.upper() != "TRUE":
            return False
        on_preempted(f"metadata: {PREEMPTED_METADATA}")
        return True

    return watch_metadata(metadata, PREEMPTED_METADATA, seen, stop)


def maintenance_notice(value: str) -> str | None:
    """The preemption notice's reason for an `instance/maintenance-event` value, else None.

    TERMINATE_ON_HOST_MAINTENANCE: the VM is about to be stopped for host maintenance, so
    the attempt is lost like a preempted one. NONE: nothing is announced. A TPU VM is never
    live-migrated, so MIGRATE_ON_HOST_MAINTENANCE should not appear; if it did, the VM
    would keep running, so it stops nothing, and neither does a value Google may add later
    (a wrong notice would throw away a healthy attempt; a VM that really stops is still
    seen by the reconciler).
    """
    if value.strip().upper() == TERMINATE_ON_MAINTENANCE:
        return f"metadata: {MAINTENANCE_METADATA} is {TERMINATE_ON_MAINTENANCE} (host maintenance)"
    return None


def watch_maintenance(metadata: Metadata, on_notice: Callable[[str], None], stop: threading.Event) -> threading.Thread:
    """On `instance/maintenance-event` announcing termination, calls on_notice once."""
    logged: set[str] = set()

    def seen(value: str) -> bool:
        reason = maintenance_notice(value)
        if reason is not None:
            on_notice(reason)
            return True
        if value.upper() != "NONE" and value not in logged and len(logged) < 10:
            logged.add(value)
            log(f"{MAINTENANCE_METADATA} is {value[:80]!r}: no action for it on a TPU VM")
        return False

    return watch_metadata(metadata, MAINTENANCE_METADATA, seen, stop)


# --- processes ------------------------------------------------------------------------


def proc_stat(pid: int | str) -> list[str]:
    """The fields of /proc/PID/stat after the command name (state first), or [] when the
    process is gone or there is no /proc."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as handle:
            return handle.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return []


def group_alive(pgid: int) -> bool:
    """Whether any live (non-zombie) process is in the process group."""
    if not os.path.exists("/proc/self/stat"):
        try:
            os.killpg(pgid, 0)
        except (ProcessLookupError, PermissionError):
            return False
        return True
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        fields = proc_stat(entry)
        if len(fields) > 2 and fields[2] == str(pgid) and fields[0] != "Z":
            return True
    return False


def signal_group(pgid: int, number: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, number)


# --- containers -----------------------------------------------------------------------

DOCKER_CLI = "/usr/bin/docker"  # where TPU VM images install it; else the one on PATH
# Conservative: no whitespace, no leading `-` (so never an option); the spec validates the grammar.
IMAGE_REFERENCE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/:@-]{0,1023}")
IMAGE_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
PULL_POLICIES = ("always", "if-missing")
DEFAULT_CONTAINER_WORKDIR = "/workspace"  # the code's mount point when the image names none
PRIVILEGED_VARIABLE = "TPUJOBS_CONTAINER_PRIVILEGED"  # "0" on the host: no --privileged (the simulator)
SIMULATED_HOST_VARIABLE = "SIMULATED_TPU_VM"  # set only on a simulated host: its mark
LABEL_PREFIX = "tpujobs."
HOST_LABEL = LABEL_PREFIX + "host"  # the simulated host's mark: the simulator removes these containers
DOCKER_FAILED = frozenset({125, 126, 127})  # docker run's own failures (or the command's, rarely)
MAX_DOCKER_WORDS = 400  # of docker's own words quoted in a sentence
PULL_SECONDS = 3600.0  # the longest one pull may take
DOCKER_SECONDS = 120.0  # the longest any other docker call may take
# Registries that take the host's own access token (Artifact Registry, Container Registry).
GOOGLE_REGISTRY = re.compile(r"(?:[a-z0-9-]+\.)*(?:pkg\.dev|gcr\.io)")

# Runs in the container as `sh -c WRAPPER tpujobs SETUP COMMAND`: setup (if any), then exec
# the command, each with bash when the image has it, else sh; one container, so the command
# sees whatever setup changed. SETUP and COMMAND arrive as arguments, never as wrapper text.
WRAPPER = """\
if command -v bash >/dev/null 2>&1; then shell=bash; else shell=sh; fi
if [ -n "$1" ]; then
  "$shell" -c "$1"
  code=$?
  if [ "$code" -ne 0 ]; then
    echo "[tpujobs-agent] setup exited with $code; the command does not run"
    exit "$code"
  fi
fi
exec "$shell" -c "$2"
"""

# Why a pull failed, by docker's words: the first row whose pattern matches names it. The
# image's own name is blanked out first, so an image called `timeout-test` is not "no network".
PULL_PROBLEMS = (
    (
        "no network",
        re.compile(
            r"connection refused|no such host|dial tcp|i/o timeout|timeout exceeded|handshake timeout"
            r"|context deadline exceeded|network is unreachable|no route to host|connection reset",
            re.IGNORECASE,
        ),
    ),
    ("access denied", re.compile(r"denied|unauthori[sz]ed|forbidden|\b40[13]\b", re.IGNORECASE)),
    ("not found", re.compile(r"manifest unknown|name unknown|not found|does not exist|\b404\b", re.IGNORECASE)),
)


class AnyOf:
    """Set when any of its events is: the one stop of a pull that a preemption notice or a
    withdrawal (pool mode) ends."""

    def __init__(self, *events: threading.Event) -> None:
        self.events = events

    def is_set(self) -> bool:
        return any(event.is_set() for event in self.events)


class ImageProblem(AgentError):
    """The job's image cannot be pulled or run: the attempt ends with `code`, and the sentence
    goes into the job's output and the `exited` report's detail."""

    def __init__(self, sentence: str, code: int = AGENT_FAILED) -> None:
        super().__init__(sentence)
        self.code = code


def default_pull_policy(image: str) -> str:
    """As Kubernetes (and JobSpec.pull_policy): `always` for an untagged or `:latest` image, else `if-missing`."""
    if "@" in image:
        return "if-missing"
    last = image.rsplit("/", 1)[-1]
    return "if-missing" if ":" in last and not last.endswith(":latest") else "always"


def image_repository(image: str) -> str:
    """The reference without its tag or digest: registry.example/team/trainer."""
    name = image.split("@", 1)[0]
    head, _, last = name.rpartition("/")
    if ":" in last:
        last = last.rsplit(":", 1)[0]
    return f"{head}/{last}" if head else last


def registry_host(image: str) -> str:
    """The registry an image is pulled from: its first component when that names a host."""
    first, slash, _ = image.partition("/")
    if slash and ("." in first or ":" in first or first == "localhost"):
        return first
    return "docker.io"


def docker_words(text: str) -> str:
    """Docker's output on one line, bounded."""
    words = " ".join(text.split())
    return words if len(words) <= MAX_DOCKER_WORDS else words[: MAX_DOCKER_WORDS - 3] + "..."


def pull_problem(image: str, said: str) -> str:
    """The one sentence a failed pull is reported with: why (not found, access denied, no
    network), then docker's own words; docker's words alone when the reason is not known."""
    words = docker_words(said)
    scrubbed = words
    names = {image, image_repository(image), image_repository(image).rsplit("/", 1)[-1]}
    for name in sorted(names, key=len, reverse=True):  # whole names only: `t` is not in `not found`
        scrubbed = re.sub(r"(?<![A-Za-z0-9_.-])" + re.escape(name) + r"(?![A-Za-z0-9_-])", "<image>", scrubbed)
    for why, pattern in PULL_PROBLEMS:
        if pattern.search(scrubbed):
            return f"cannot pull the image {image}: {why} (docker said: {words})"
    return f"cannot pull the image {image}: docker said: {words or 'nothing'}"


def docker_failure(tail: bytes) -> str | None:
    """The line in which docker (or the container's init) said it could not run the container,
    from the end of the output, else None: a 125, 126 or 127 without one is the command's own."""
    for raw in reversed(tail.decode("utf-8", "replace").splitlines()):
        line = raw.strip()
        if line.startswith("docker: ") or line.startswith("[FATAL tini") or "Error response from daemon" in line:
            return docker_words(line)
    return None


def container_name(config: dict[str, Any], slice_id: int, worker_id: int) -> str:
    """The container of one attempt on one worker host: deterministic, so anyone can find it."""
    return f"tpujobs-{safe_name(config['job_id'])}-a{int(config['attempt'])}-s{slice_id}-w{worker_id}"


def container_labels(config: dict[str, Any], slice_id: int, worker_id: int, host_mark: str) -> list[str]:
    """`key=value` labels: the job, attempt, slice, worker, and a simulated host's mark."""
    labels = {
        "job": safe_name(config["job_id"]),
        "attempt": str(int(config["attempt"])),
        "slice": str(slice_id),
        "worker": str(worker_id),
    }
    if host_mark:
        labels["host"] = re.sub(r"[^A-Za-z0-9_./-]", "_", host_mark)
    return [f"{LABEL_PREFIX}{key}={value}" for key, value in labels.items()]


def container_environment(
    job_env: dict[str, str],
    host_environ: dict[str, str],
    config: dict[str, Any],
    secret_names: list[str],
    megascale: dict[str, str],
) -> tuple[list[str], dict[str, str], list[str]]:
    """(names passed with `-e NAME`, the docker CLI's environment, names left out).

    Passed: the TPUJOBS_ variables, MEGASCALE_* from tpu-env, the spec's env and the secrets;
    their values travel in the docker CLI's own environment, so no value is ever on a command
    line or on disk. The host's other variables stay out of the container. Names beginning
    with DOCKER_ are left out: the docker CLI itself obeys them (DOCKER_HOST, DOCKER_CONFIG),
    so the job's values would steer the agent's docker; so are names no shell could set. A
    job's HOME passes, but the CLI keeps the host's config directory (DOCKER_CONFIG), since
    a config under the job's HOME could name another daemon.
    """
    wanted = set(config["env"]) | set(secret_names) | set(megascale)
    wanted |= {name for name in job_env if name.startswith("TPUJOBS_")}
    left_out = sorted(n for n in wanted if n.startswith("DOCKER_") or not PASSABLE_NAME.fullmatch(n))
    names = sorted(wanted - set(left_out))
    cli_env = host_variables(host_environ)
    cli_env.update({name: job_env[name] for name in names})
    if "HOME" in names and "DOCKER_CONFIG" not in cli_env:
        # The CLI reads its config (which daemon, through contexts) from $HOME/.docker: the host's.
        cli_env["DOCKER_CONFIG"] = os.path.join(host_environ.get("HOME") or os.path.expanduser("~"), ".docker")
    return names, cli_env, left_out


def docker_run_argv(
    docker: str,
    image: str,
    name: str,
    labels: list[str],
    env_names: list[str],
    setup: str | None,
    command: str,
    privileged: bool = True,
    mount: tuple[str, str] | None = None,
) -> list[str]:
    """`docker run` as TPU VMs run containers: privileged (unless told otherwise), host network
    and IPC, /dev mounted, docker's init (tini) as PID 1 forwarding signals to the command's
    whole process group; `mount` is (code directory, working directory in the container).
    The image's ENTRYPOINT and CMD are not used: the wrapper runs setup and command."""
    argv = [docker, "run", "--rm", "--name", name, "--init", "--sig-proxy=false"]
    argv += ["--network", "host", "--ipc", "host", "-v", "/dev:/dev", "-e", "TINI_KILL_PROCESS_GROUP=1"]
    if privileged:
        argv.append("--privileged")
    for label in labels:
        argv += ["--label", label]
    for env_name in env_names:
        argv += ["-e", env_name]
    if mount is not None:
        source, target = mount
        for path in (source, target):
            if ":" in path or "," in path or not path.startswith("/"):
                raise ImageProblem(
                    f"the path {path!r} cannot be mounted into a container (it must be absolute, no ':' or ',')"
                )
        argv += ["-v", f"{source}:{target}", "-w", target]
    argv += ["--entrypoint", "sh", image, "-c", WRAPPER, "tpujobs", setup or "", command]
    return argv


class Docker:
    """The host's docker CLI as the agent uses it: pull (with the host's token for Google's
    registries), inspect, kill and remove. Every call is an argv list with the host's own
    environment; nothing goes through a shell."""

    def __init__(self, binary: str, environ: dict[str, str], tokens: TokenSource | None = None) -> None:
        self.binary = binary
        self.environ = host_variables(environ)
        self.tokens = tokens

    @classmethod
    def find(cls, environ: dict[str, str], tokens: TokenSource | None = None) -> Docker | None:
        """The docker CLI of this host, or None when it has none."""
        binary = DOCKER_CLI if os.access(DOCKER_CLI, os.X_OK) else shutil.which("docker", path=environ.get("PATH"))
        return cls(binary, environ, tokens) if binary else None

    def call(
        self, *args: str, stdin: bytes | None = None, timeout: float = DOCKER_SECONDS
    ) -> subprocess.CompletedProcess[bytes]:
        """One docker command, its output captured; a CLI that cannot start or hangs is returncode 125."""
        try:
            return subprocess.run(
                [self.binary, *args],
                input=stdin,
                stdin=None if stdin is not None else subprocess.DEVNULL,
                capture_output=True,
                env=self.environ,
                timeout=timeout,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as error:
            return subprocess.CompletedProcess([self.binary, *args], 125, b"", str(error).encode())

    @staticmethod
    def said(done: subprocess.CompletedProcess[bytes]) -> str:
        return ((done.stderr or b"") + b"\n" + (done.stdout or b"")).decode("utf-8", "replace").strip()

    def has_image(self, image: str) -> bool:
        return self.call("image", "inspect", "--format", "{{.Id}}", image).returncode == 0

    def ensure(self, image: str, policy: str, stop: threading.Event | AnyOf) -> bool:
        """The image is here, pulled as `policy` says (`always`; `if-missing`: only when absent).
        True when a pull ran; ImageProblem with a sentence when it failed."""
        if policy == "if-missing" and self.has_image(image):
            return False
        self.pull(image, stop)
        return True

    def pull(self, image: str, stop: threading.Event | AnyOf) -> None:
        """docker pull, stopped early when `stop` is set. A Google registry gets the host's token
        in a private config directory of this pull's own, removed after it; the token goes to
        docker on stdin only."""
        config_dir = self._login(image)
        try:
            args = ([] if config_dir is None else ["--config", config_dir]) + ["pull", "--quiet", image]
            process = subprocess.Popen(
                [self.binary, *args],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                env=self.environ,
            )
            deadline = time.monotonic() + PULL_SECONDS
            while True:
                try:  # output read before a timeout is kept: the last call returns all of it
                    output = process.communicate(timeout=0.5)[0] or b""
                    break
                except subprocess.TimeoutExpired:
                    if stop.is_set() or time.monotonic() >= deadline:
                        process.kill()
            if stop.is_set():
                return  # a preemption notice: nothing is to run
            if time.monotonic() >= deadline and process.returncode != 0:
                raise ImageProblem(f"cannot pull the image {image}: the pull took over {PULL_SECONDS:g} s")
            if process.returncode != 0:
                raise ImageProblem(pull_problem(image, output.decode("utf-8", "replace")))
        except OSError as error:
            raise ImageProblem(f"cannot pull the image {image}: docker did not start ({error})") from None
        finally:
            if config_dir is not None:
                shutil.rmtree(config_dir, ignore_errors=True)

    def _login(self, image: str) -> str | None:
        """A fresh private docker config directory logged in to the image's Google registry with
        the host's access token; None for any other registry (no login)."""
        host = registry_host(image)
        if self.tokens is None or not GOOGLE_REGISTRY.fullmatch(host):
            return None
        try:
            token = self.tokens.token()
        except (AgentError, OSError, http.client.HTTPException) as error:
            raise ImageProblem(f"cannot pull the image {image}: access denied (no access token: {error})") from None
        config_dir = tempfile.mkdtemp(prefix="tpujobs-docker-")  # 0700: readable by this user only
        done = self.call(
            "--config",
            config_dir,
            "login",
            "--username",
            "oauth2accesstoken",
            "--password-stdin",
            f"https://{host}",
            stdin=token.encode("utf-8"),
        )
        if done.returncode != 0:
            shutil.rmtree(config_dir, ignore_errors=True)
            raise ImageProblem(pull_problem(image, self.said(done)))
        return config_dir

    def digest(self, image: str) -> str | None:
        """The digest of the image as its registry knows it (`sha256:...`), or None."""
        if "@" in image:
            given = image.rsplit("@", 1)[1]
            return given if IMAGE_DIGEST.fullmatch(given) else None
        done = self.call("image", "inspect", "--format", "{{json .RepoDigests}}", image)
        try:
            entries = json.loads(done.stdout or b"null") if done.returncode == 0 else None
        except ValueError:
            entries = None
        repository = image_repository(image)
        for entry in entries or []:
            name, _, digest = str(entry).partition("@")
            if name == repository and IMAGE_DIGEST.fullmatch(digest):
                return digest
        return None

    def working_dir(self, image: str) -> str:
        """The image's WorkingDir, or /workspace when it names none (or `/`)."""
        done = self.call("image", "inspect", "--format", "{{json .Config.WorkingDir}}", image)
        try:
            found = json.loads(done.stdout or b'""') if done.returncode == 0 else ""
        except ValueError:
            found = ""
        found = found if isinstance(found, str) else ""
        return found if found.startswith("/") and found.rstrip("/") else DEFAULT_CONTAINER_WORKDIR

    def kill(self, name: str, signal_name: str = "KILL") -> bool:
        """Sends the signal to the container's init (which passes it to the command's group)."""
        return self.call("kill", "--signal", signal_name, name, timeout=30.0).returncode == 0

    def remove(self, name: str) -> None:
        """The container is gone, whatever it was doing; one that never existed is fine."""
        done = self.call("rm", "--force", name)
        said = self.said(done)
        if done.returncode != 0 and "No such container" not in said:
            log(f"could not remove container {name}: {docker_words(said)}")


# --- the attempt's record on this host -------------------------------------------------


def boot_id() -> str:
    """This boot's id (Linux), or "" where there is none."""
    try:
        with open(BOOT_ID, encoding="ascii") as handle:
            return handle.read().strip()
    except OSError:
        return ""


def process_start(pid: int) -> str:
    """When a live process started, in clock ticks since boot (/proc/PID/stat field 22), or ""
    when it is gone, a zombie, or there is no /proc. With the pid and the boot id it names
    one process, whatever pids are reused later."""
    fields = proc_stat(pid)
    return fields[19] if len(fields) > 19 and fields[0] != "Z" else ""


def still_running(entry: dict[str, Any], boot: str) -> bool:
    """Whether the process an entry of the record names (`pid`, `start`, `boot`) still runs."""
    pid, start = entry.get("pid"), entry.get("start")
    if not isinstance(pid, int) or isinstance(pid, bool) or not start or not boot:
        return False
    return entry.get("boot") == boot and process_start(pid) == start


class AttemptRecord:
    """What this host did for one attempt, in a file beside the attempt's work directory.

    A VM runs its startup script at every boot (repair, maintenance, reset), and so starts
    the agent again with the same config; nothing in memory survives, but the boot disk
    does. The first start creates the record (atomically: of two agents, one creates it);
    a later start finds it and knows the attempt already ran here. The record names the
    job, attempt, slice and worker in its file name, and says when the agent started, what
    it was running (setup or command, with pid and start) and how it ended.
    """

    def __init__(self, path: str) -> None:
        self.path = path

    @classmethod
    def beside(cls, workdir: str, config: dict[str, Any], slice_id: int, worker_id: int) -> AttemptRecord:
        name = (
            f".tpujobs-attempt-{safe_name(config['job_id'])}-a{int(config['attempt'])}"
            f"-slice{slice_id}-worker{worker_id}.json"
        )
        return cls(os.path.join(os.path.dirname(os.path.abspath(workdir)), name))

    def claim(self, first: dict[str, Any]) -> dict[str, Any] | None:
        """None when this is the attempt's first start here (the record now holds `first`),
        else what the earlier start recorded ({} if it cannot be read)."""
        temporary = self._write_temporary(first)
        try:
            os.link(temporary, self.path)  # fails if the record exists: one start wins
        except FileExistsError:
            return self.read()
        finally:
            os.unlink(temporary)
        self._sync_directory()
        return None

    def read(self) -> dict[str, Any]:
        try:
            with open(self.path, encoding="utf-8") as handle:
                data = json.load(handle)
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def update(self, **changes: Any) -> None:
        """Adds to the record; a failure is logged: the record's existence is what matters."""
        try:
            temporary = self._write_temporary({**self.read(), **changes})
            os.replace(temporary, self.path)
            self._sync_directory()
        except OSError as error:
            log(f"could not update {self.path}: {error}")

    def _write_temporary(self, data: dict[str, Any]) -> str:
        directory = os.path.dirname(self.path)
        os.makedirs(directory, exist_ok=True)
        fd, temporary = tempfile.mkstemp(prefix=".tpujobs-record-", dir=directory)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                json.dump(data, handle, sort_keys=True)
                handle.flush()
                os.fsync(handle.fileno())  # on disk before a reset, not only in the page cache
        except BaseException:
            os.unlink(temporary)
            raise
        return temporary

    def _sync_directory(self) -> None:
        with contextlib.suppress(OSError):
            fd = os.open(os.path.dirname(self.path), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)


def started_again_detail(earlier: dict[str, Any], boot: str) -> str:
    """What a second start of the agent found of the first, in one sentence for its report."""
    if not earlier:
        return "the attempt's record on this host is unreadable, but it had started here before"
    first = str(earlier.get("agent_started_at") or "at an unknown time")
    same_boot = bool(boot) and earlier.get("boot") == boot
    where = "earlier in this boot" if same_boot else "before the host rebooted"
    sentence = f"the agent first started {first}, {where}"
    agent = {"pid": earlier.get("agent_pid"), "start": earlier.get("agent_start"), "boot": earlier.get("boot")}
    if still_running(agent, boot):
        sentence += f"; that agent (pid {agent['pid']}) is still running"
    running = earlier.get("running")
    if isinstance(running, dict) and running.get("what") in ("setup", "command"):
        what = running["what"]
        state = "is still running" if still_running(running, boot) else "is gone"
        sentence += f"; its {what} (pid {running.get('pid')}, started {running.get('at')}) {state}"
    else:
        sentence += "; it had not started setup or the command"
    if earlier.get("ended"):
        sentence += f"; it had ended ({earlier['ended']})"
    return sentence + ": nothing is started again"


# --- the agent ------------------------------------------------------------------------


class Agent:
    """One attempt on one worker host: fetch, setup, command, reports, preemption."""

    def __init__(
        self,
        config: dict[str, Any],
        worker_id: int,
        slice_id: int,
        metadata: Metadata,
        publisher: Publisher,
        storage: Storage,
        workdir: str,
        environ: dict[str, str],
        echo: Any = None,
        secret_reader: SecretReader | None = None,
        tokens: TokenSource | None = None,
        megascale: dict[str, str] | None = None,
        docker: Docker | None = None,
    ) -> None:
        self._lock = threading.Lock()
        self._current: subprocess.Popen[bytes] | None = None
        self._container: str | None = None  # the running container's name, in an image
        self._term_sent_at: float | None = None
        self._term_delivered = False  # the container got its SIGTERM (docker kill succeeded)
        self._started = False
        self._started_at: str | None = None  # when the first of setup or command started (RFC 3339)
        self._finished = False
        self.config = config
        self.metadata = metadata
        self.worker_id = worker_id
        self.slice_id = slice_id
        self.storage = storage
        self.workdir = workdir
        self.environ = environ
        tokens = tokens or TokenSource(metadata)
        self.secret_reader = secret_reader or SecretReader(GoogleApi.secrets_from_env(environ, tokens), metadata)
        self.megascale = dict(megascale or {})
        self.docker = docker if docker is not None or not config.get("image") else Docker.find(environ, tokens)
        self.grace = float(config["grace_seconds"])
        identity = {
            "job_id": config["job_id"],
            "attempt": config["attempt"],
            "slice_id": slice_id,
            "worker_id": worker_id,
        }
        self.reporter = Reporter(publisher, config["worker_events_topic"], identity)
        self.preemption = Preemption(publisher, config["preemption_topic"], identity, self._stop_for_preemption)
        bucket, log_prefix = split_gs_uri(config["log_prefix"])
        if log_prefix and not log_prefix.endswith("/"):
            log_prefix += "/"
        self.chunk_prefix = f"{log_prefix}chunks/slice-{slice_id}-worker-{worker_id}/"
        self.shipper = LogShipper(storage, bucket, self.chunk_prefix, float(config["chunk_seconds"]), echo)
        self.last_output = LastOutput()  # setup's and the command's, for a failed `exited`
        self.secret_values: dict[str, str] = {}  # to cut out of those last lines
        self.stop_watching = threading.Event()
        self.record = AttemptRecord.beside(workdir, config, slice_id, worker_id)
        self.boot = boot_id()
        self._limit: str | None = None  # the time limit that ran out, once the agent acted on it
        self._last_output_at: float | None = None  # when the command last printed a line
        self.withdrawn = threading.Event()  # pool mode: the unit was given other work (`withdraw`)
        self.started_again = False  # this attempt had started on this host before: nothing ran
        self.stop_beating = threading.Event()  # heartbeats end (worker 0 may outlive its command)
        self._period = heartbeat_period(0.0, config)  # seconds to the next heartbeat, as the last one said
        self.link: SliceLink | None = None  # a host of a multi-host slice: its slice's network
        if int(config["hosts_per_slice"]) > 1:
            self.link = SliceLink(
                publisher.key, identity, config, metadata, self._progress, self._peer_silent,
                self._watched, self._peer_checkpoint,
            )  # fmt: skip
        self._watched_said = False  # a peer told the service that worker 0 speaks for it
        self._checkpoint_at: tuple[int, float] | None = None  # this host's last checkpoint (step, epoch s)
        self._checkpoint_told = -1  # worker 0: the highest checkpoint step it published

    def note(self, message: str) -> None:
        """A line for the agent's stderr and for the job's output."""
        log(message)
        self.shipper.write(f"[tpujobs-agent] {message}\n".encode("utf-8", "replace"))

    def _stop_for_preemption(self, reason: str) -> None:
        with self._lock:
            if self._finished:  # the command's end is known and reported: keep it
                log(f"preemption notice ({reason}) after the command ended")
                return
            self.reporter.silence()
            container = self._sigterm_locked()
        self.note(f"preemption notice ({reason}): stopping the command, SIGKILL after {self.grace:g} s")
        self._sigterm_container(container)

    def withdraw(self, reason: str) -> bool:
        """Pool mode: the control plane gave the unit other work (or none), so this attempt stops
        as a preemption would stop it (SIGTERM, SIGKILL after the grace) but says nothing more:
        no notice, no `exited`, not even a checkpoint, since the job has already moved on. An end
        already known, or a preemption notice already sent, stands as it is (False)."""
        with self._lock:
            if self._finished or not self.preemption.stand_down():
                return False
            self.withdrawn.set()
            self.reporter.silence(everything=True)
            container = self._sigterm_locked()
        self.note(f"withdrawn ({reason}): stopping the command, SIGKILL after {self.grace:g} s")
        self._sigterm_container(container)
        return True

    def _stopping(self) -> bool:
        """Whether nothing more of the job may start: a notice, a withdrawal or a time limit."""
        return self.preemption.noticed.is_set() or self.withdrawn.is_set() or self._limit is not None

    def _sigterm_locked(self) -> str | None:
        """SIGTERM to the running command's group (the lock held), and its grace starts; in a
        container, the container's name: its SIGTERM goes through `_sigterm_container`."""
        container = self._container
        if self._current is not None:
            if container is None:
                signal_group(self._current.pid, signal.SIGTERM)
            self._term_sent_at = time.monotonic()
        return container

    def _sigterm_container(self, container: str | None) -> None:
        """`docker kill --signal TERM`, never under the lock (docker may be slow); `_wait`
        tries again if it found no container yet."""
        if container is not None and self.docker is not None:
            self._term_delivered = self.docker.kill(container, "TERM")

    def run(self) -> int:
        """Everything, start to end; the command's exit code.

        Only at the attempt's first start on this host: a later one (the VM rebooted and ran
        its startup script again) reports the attempt lost and runs nothing.
        """
        try:
            earlier = self.record.claim(self._first_entry())
        except OSError as error:  # without the record a reboot could run the command twice
            self.note(f"cannot record the attempt's start in {self.record.path}: {error}")
            return self._finish(AGENT_FAILED)
        if earlier is not None:
            return self._started_again(earlier)
        watch_preempted(self.metadata, self.preemption.trigger, self.stop_watching)
        watch_maintenance(self.metadata, self.preemption.trigger, self.stop_watching)
        self._watch_deadline()
        if self.link is not None:  # before the command: worker 0 may speak for it from its `started`
            self.link.start()
        try:
            code = self._attempt()
        except Refused as refusal:  # no restart can fix it: say so, and run nothing
            self.note(str(refusal))
            return self._finish(AGENT_FAILED, aborted=str(refusal))
        except ImageProblem as problem:  # an error under the job's rules, with the reason
            self.note(str(problem))
            return self._finish(problem.code, detail=str(problem))
        except Exception as error:  # a bug or a full disk must still end in a report
            self.note(f"the agent failed: {error!r}")
            code = AGENT_FAILED
        return self._finish(code)

    def _first_entry(self) -> dict[str, Any]:
        me = os.getpid()
        return {
            "job_id": self.config["job_id"],
            "attempt": self.config["attempt"],
            "slice_id": self.slice_id,
            "worker_id": self.worker_id,
            "agent_started_at": rfc3339(),
            "agent_pid": me,
            "agent_start": process_start(me),
            "boot": self.boot,
        }

    def _started_again(self, earlier: dict[str, Any]) -> int:
        """This attempt already started on this host, so it is lost: whatever ran then was
        killed by the reboot, or still runs and must not get a twin. Says so in one signed
        `rebooted` report (unless the attempt had ended here and said so) and runs nothing;
        the job's output is left as the first start wrote it."""
        with self._lock:
            self._finished = True  # a notice now has nothing to stop or silence
            self.started_again = True
        self.stop_watching.set()
        self.shipper.close(None)  # nothing was written: no chunk, no completion marker
        where = f"attempt {self.config['attempt']} (worker {self.slice_id}-{self.worker_id})"
        if earlier.get("ended") in ("exited", "aborted", "withdrawn"):
            log(f"{where} already ended on this host and said so ({earlier['ended']}); nothing to do")
        else:
            detail = started_again_detail(earlier, self.boot)
            log(f"{where} had already started on this host: {detail}")
            self.reporter.report("rebooted", detail=detail[:MAX_DETAIL_CHARS])
        self.reporter.close()
        self.preemption.wait(30.0)
        return AGENT_STARTED_AGAIN

    def _attempt(self) -> int:
        """Read the secrets, fetch the code, run setup (once per host), run the command; or,
        with an image, setup and command in one container of it (`_contained`).

        Returns their exit code; raises Refused, before anything of the job runs, when a
        secret cannot be read or the code is not what was submitted, and ImageProblem when
        the image cannot be pulled or run.
        """
        code_dir = os.path.join(self.workdir, "code")
        os.makedirs(code_dir, exist_ok=True)
        # The values live only here and in the environment of setup and command.
        secret_values = self.secret_reader.read_all(self.config["secrets"])
        self.secret_values = secret_values
        code = 0
        if self.config.get("code_uri"):
            try:
                fetch_code(self.storage, self.config["code_uri"], code_dir, self.config["code_sha256"])
            except Refused:
                raise
            except (AgentError, OSError, http.client.HTTPException, tarfile.TarError) as error:
                self.note(f"could not fetch the code from {self.config['code_uri']}: {error}")
                code = AGENT_FAILED
        env = job_environment(self.environ, self.config, self.worker_id, self.slice_id, secret_values, self.megascale)
        if self.config.get("image"):
            return code or self._contained(self.config["image"], code_dir, env, sorted(secret_values))
        marker = os.path.join(
            os.path.dirname(os.path.abspath(self.workdir)),
            f".setup-done-{safe_name(self.config['job_id'])}",
        )
        if code == 0 and self.config.get("setup"):
            if os.path.exists(marker):
                log("setup already ran on this host for this job; skipping it")
            else:
                code = self._run(["bash", "-c", self.config["setup"]], code_dir, env, "setup")
                if code == 0 and not self.preemption.noticed.is_set() and not self.withdrawn.is_set():
                    with open(marker, "w", encoding="utf-8") as handle:
                        handle.write(rfc3339() + "\n")
                elif code != 0:
                    log(f"setup exited with {code}; the command does not run")
        if code == 0:
            code = self._run(["bash", "-c", self.config["command"]], code_dir, env, "command")
        return code

    def _contained(self, image: str, code_dir: str, env: dict[str, str], secret_names: list[str]) -> int:
        """Setup and command in one container of `image`, pulled as the config's policy says;
        the container's exit code. The container is removed on every way out of here."""
        if self.docker is None:
            raise ImageProblem(f"cannot run the image {image}: this host has no docker CLI")
        docker = self.docker
        name = container_name(self.config, self.slice_id, self.worker_id)
        try:
            if docker.ensure(image, self.config["image_pull_policy"], AnyOf(self.preemption.noticed, self.withdrawn)):
                log(f"pulled the image {image}")
            if self.preemption.noticed.is_set() or self.withdrawn.is_set():
                return 128 + int(signal.SIGTERM)
            digest = docker.digest(image)
            mount = None
            if self.config.get("code_uri"):
                mount = (os.path.abspath(code_dir), docker.working_dir(image))
            names, cli_env, left_out = container_environment(
                env, self.environ, self.config, secret_names, self.megascale
            )
            if left_out:
                self.note(f"not passed into the container (the docker CLI obeys DOCKER_*): {', '.join(left_out)}")
            privileged = self.environ.get(PRIVILEGED_VARIABLE, "1").strip() != "0"
            labels = container_labels(
                self.config, self.slice_id, self.worker_id, self.environ.get(SIMULATED_HOST_VARIABLE, "")
            )
            argv = docker_run_argv(
                docker.binary, image, name, labels, names, self.config.get("setup"), self.config["command"],
                privileged, mount,
            )  # fmt: skip
            log(f"running setup and command in {image} ({digest or 'no registry digest'}) as container {name}")
            started = {"image_digest": digest} if digest else {}
            pump_tail: list[OutputPump] = []
            code = self._run(argv, code_dir, cli_env, "command", container=name, started=started, pumps=pump_tail)
            said = docker_failure(pump_tail[0].tail) if code in DOCKER_FAILED and pump_tail else None
            if said is not None:
                raise ImageProblem(f"docker could not run the image {image}: {said}", code)
            return code
        finally:
            docker.remove(name)

    def _run(
        self,
        argv: list[str],
        cwd: str,
        env: dict[str, str],
        what: str,
        container: str | None = None,
        started: dict[str, Any] | None = None,
        pumps: list[OutputPump] | None = None,
    ) -> int:
        """Runs argv (`bash -c script`, or `docker run` of `container`) in its own process group
        until it and its group are gone; `what` (setup or command) is recorded with its pid,
        for a later start to find. `started` joins the first `started` report."""
        with self._lock:
            if self._stopping():
                return 128 + int(signal.SIGTERM)
            read_fd, write_fd = os.pipe()
            try:
                process = subprocess.Popen(
                    argv,
                    cwd=cwd,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=write_fd,
                    stderr=write_fd,
                    start_new_session=True,
                )
            except OSError as error:
                os.close(read_fd)
                self.note(f"cannot start {os.path.basename(argv[0])}: {error}")
                return 127
            finally:
                os.close(write_fd)
            self._current = process
            self._container = container
            self._term_delivered = False
        pump = OutputPump(read_fd, _Tee(self.shipper, self.last_output), self._checkpoint, self._output_seen)  # type: ignore[arg-type]
        pump.start()
        if pumps is not None:
            pumps.append(pump)
        if not self._started:
            with self._lock:  # against `_watched`: the service hears `watch` once, in order
                self._started = True
                self._started_at = rfc3339()
                self.reporter.report("started", **(started or {}), **self._liveness(heartbeat_period(0.0, self.config)))
            threading.Thread(target=self._heartbeats, name="heartbeat", daemon=True).start()
        running = {"what": what, "pid": process.pid, "start": process_start(process.pid)}
        if container is not None:
            running["container"] = container
        self.record.update(running={**running, "boot": self.boot, "at": rfc3339()})
        try:
            returncode = self._wait(process, container)
            self._clear_group(process.pid)
        except BaseException:  # KeyboardInterrupt or a bug: leave nothing running
            signal_group(process.pid, signal.SIGKILL)
            raise
        pump.join(2.0)  # a process that left the group may hold the pipe open: do not wait for it
        with self._lock:
            self._current = None
            self._container = None
        return exit_status(returncode)

    def _wait(self, process: subprocess.Popen[bytes], container: str | None = None) -> int:
        """The exit of `process`; after a preemption notice, SIGKILL once the grace is over. In a
        container the signals go through `docker kill` (a SIGTERM that found no container yet
        is sent again); a docker CLI still there long after the SIGKILL is killed itself."""
        docker = self.docker if container is not None else None
        killed_at: float | None = None
        tried_term = time.monotonic()
        while True:
            try:
                return process.wait(timeout=0.1)
            except subprocess.TimeoutExpired:
                pass
            sent = self._term_sent_at
            now = time.monotonic()
            if sent is None:
                continue
            term_again = not self._term_delivered and killed_at is None and now - tried_term >= 0.5
            if docker is not None and container is not None and term_again:
                tried_term = now
                self._sigterm_container(container)
            if killed_at is None and now - sent >= self.grace:
                log(f"the command outlived the {self.grace:g} s grace period: SIGKILL")
                killed_at = now
                if docker is not None and container is not None:
                    docker.kill(container, "KILL")
                else:
                    signal_group(process.pid, signal.SIGKILL)
            elif docker is not None and killed_at is not None and now - killed_at >= DOCKER_SECONDS / 4:
                log(f"the docker CLI of container {container} outlived its SIGKILL: killing the CLI")
                signal_group(process.pid, signal.SIGKILL)
                killed_at = now

    def _clear_group(self, pgid: int) -> None:
        """Whatever the command left running in its group: SIGTERM, then SIGKILL after grace."""
        if not group_alive(pgid):
            return
        with self._lock:
            if self._term_sent_at is None:
                signal_group(pgid, signal.SIGTERM)
                self._term_sent_at = time.monotonic()
            deadline = self._term_sent_at + self.grace
        while group_alive(pgid) and time.monotonic() < deadline:
            time.sleep(0.1)
        signal_group(pgid, signal.SIGKILL)
        with self._lock:
            if not self.preemption.noticed.is_set():
                self._term_sent_at = None

    def _heartbeats(self) -> None:
        """Alive, and when the command last printed a line and saved a checkpoint: progress for
        `hang_timeout`, one field per heartbeat rather than a message per line. Each says when
        the next comes (`heartbeat_period`); worker 0 of a multi-host slice adds its peers'
        progress, and a peer worker 0 speaks for says nothing."""
        began = time.monotonic()
        while not self.stop_beating.wait(self._period):
            if self._spoken_for():
                continue
            self._period = every = heartbeat_period(time.monotonic() - began, self.config)
            self.reporter.report("heartbeat", **self._liveness(every), **self._slice_progress())

    def _spoken_for(self) -> bool:
        """A peer whose beats worker 0 acknowledged: worker 0's heartbeats carry its liveness."""
        return self.link is not None and self.link.worker_id != 0 and self.link.peer.watched

    def _liveness(self, period: float) -> dict[str, Any]:
        """What a report that marks this host live adds: `watch: slice` when worker 0 speaks
        for it (the service then never finds it silent itself), else when it reports next."""
        if self._spoken_for():
            self._watched_said = True
            return {"watch": "slice"}
        return {"next_report_seconds": period}

    def _watched(self) -> None:
        """A peer's first ack from worker 0: once the service heard `started`, tell it now (the
        report says worker 0 watches it); before, `started` itself says so."""
        with self._lock:
            if not self._started or self._watched_said:
                return
            self._watched_said = True
            self.reporter.report("heartbeat", watch="slice", **self._slice_progress())

    def _progress(self) -> dict[str, Any]:
        """This host's progress for its beats to worker 0 (epoch seconds)."""
        found: dict[str, Any] = {"last_output_at": self._last_output_at}
        if self._checkpoint_at is not None:
            found["checkpoint_step"], found["checkpoint_at"] = self._checkpoint_at
        return found

    def _slice_progress(self) -> dict[str, Any]:
        """A heartbeat's progress: this host's, and on worker 0 the latest of its slice's."""
        seen = self._last_output_at
        step = self._checkpoint_at
        found: dict[str, Any] = {}
        if self.link is not None and self.link.worker_id == 0:
            peers = self.link.watch.progress()
            found["peers_heard"] = peers["peers_heard"]
            if "peers_silent" in peers:
                found["peers_silent"] = peers["peers_silent"]
            if "last_output_at" in peers:
                seen = max(seen or 0.0, peers["last_output_at"])
            if "checkpoint_step" in peers and (step is None or peers["checkpoint_step"] > step[0]):
                step = (peers["checkpoint_step"], peers["checkpoint_at"])
        if seen is not None:
            found["last_output_at"] = rfc3339(seen)
        if step is not None:
            found["step"] = step[0]
            if step[1]:
                found["checkpoint_at"] = rfc3339(step[1])
        return found

    def _peer_silent(self, worker: int, quiet: float) -> None:
        """Worker 0: a peer it heard went quiet. Said at once, in a report of its own."""
        where = f"{self.slice_id}-{worker}"
        self.note(f"worker {where} sent nothing over the slice network for {quiet:.0f} s: reporting it silent")
        detail = f"worker {self.slice_id}-0 heard nothing from it over the slice network for {quiet:.0f} s"
        self.reporter.report("peer_silent", peer_worker_id=worker, detail=detail)

    def _peer_checkpoint(self, worker: int, step: int) -> None:
        """Worker 0: a peer's checkpoint newer than any it published goes out as its slice's
        (coalesced by the reporter), so the job's usage learns it without the peer's report."""
        with self._lock:
            if step <= self._checkpoint_told:
                return
            self._checkpoint_told = step
        self.reporter.report("checkpoint", step=step, detail=f"saved by worker {self.slice_id}-{worker}")

    def _output_seen(self) -> None:
        self._last_output_at = time.time()

    def _watch_deadline(self) -> None:
        """At the attempt's deadline (`attempt_deadline`, from now), stop the command as a
        preemption would: SIGTERM, SIGKILL after the grace; `exited` then names the limit.
        The host stops on time even when the control plane cannot reach it."""
        deadline = attempt_deadline(self.config, time.time())
        if deadline is None:
            return
        at, limit = deadline
        self.note(f"the job's {limit} ends this attempt at {rfc3339(at)}")

        def wait() -> None:
            if not self.stop_watching.wait(max(0.0, at - time.time())):
                self._stop_for_limit(limit)

        threading.Thread(target=wait, name="deadline", daemon=True).start()

    def _stop_for_limit(self, limit: str) -> None:
        with self._lock:
            if self._finished or self.preemption.noticed.is_set() or self.withdrawn.is_set():
                return
            self._limit = limit
            container = self._sigterm_locked()
        self.note(f"the job's {limit} ran out: stopping the command, SIGKILL after {self.grace:g} s")
        self._sigterm_container(container)

    def _checkpoint(self, step: int, detail: str) -> None:
        """A checkpoint line: reported, except by a peer worker 0 speaks for (its beats carry the
        step to worker 0, which reports the slice's newest) until a preemption notice, when
        the host's own report may be the last word."""
        self._checkpoint_at = (step, time.time())
        if self._spoken_for() and not self.preemption.noticed.is_set():
            return
        with self._lock:
            self._checkpoint_told = max(self._checkpoint_told, step)
        self.reporter.report("checkpoint", step=step, detail=detail)

    def _finish(self, code: int, aborted: str | None = None, detail: str | None = None) -> int:
        """The last report: `exited` with the code (and `detail` when the agent itself ended
        the attempt, an image it could not pull), or `aborted` with why nothing ran; nothing
        after a preemption notice or a withdrawal."""
        self.stop_watching.set()
        with self._lock:
            self._finished = True
            withdrawn = self.withdrawn.is_set()
            preempted = self.preemption.noticed.is_set() or withdrawn  # either way, no end is told
        failed = self._failed_output() if not preempted and aborted is None and code != 0 else {}
        if self._started_at is not None:  # an exit handled before its `started` still counts the time
            failed = {**failed, "command_started_at": self._started_at}
        if self._limit is not None and aborted is None:  # the agent stopped it: the limit, not an error
            detail = f"time limit reached: the job's {self._limit} ran out and the agent stopped the command"
            failed = {**failed, "limit": self._limit}
        self.shipper.close(None if preempted else code)
        if not preempted and aborted is not None:
            self.reporter.report("aborted", detail=aborted[:MAX_DETAIL_CHARS])
        elif not preempted and detail is not None:
            self.reporter.report("exited", exit_code=code, detail=detail[:MAX_DETAIL_CHARS], **failed)
        elif not preempted:
            self.reporter.report("exited", exit_code=code, **failed, **self._still_speaking(code))
        self._leave_slice(speaks=not preempted and aborted is None and code == 0 and self._limit is None)
        self.reporter.close()
        self.preemption.wait(30.0)
        ended = (
            "withdrawn" if withdrawn else "preempted" if preempted else "aborted" if aborted is not None else "exited"
        )
        self.record.update(ended=ended, exit_code=code, ended_at=rfc3339())  # and said so
        return code

    def _still_speaking(self, code: int) -> dict[str, Any]:
        """What worker 0's `exited` 0 adds while it still hears peers: how many, and when it
        reports next, so the service keeps its record live and watched (`_leave_slice` keeps
        the heartbeats going) and a worker 0 that dies then is found like any silent host."""
        link = self.link
        if code != 0 or self._limit is not None or link is None or link.worker_id != 0:
            return {}
        peers = link.watch.watching()
        return {"peers_heard": peers, "next_report_seconds": self._period} if peers else {}

    def _leave_slice(self, speaks: bool) -> None:
        """The heartbeats end, and the slice link: a peer says bye; worker 0 whose command
        succeeded first goes on speaking for the peers it still hears, until each said bye or
        was reported silent (a stop ends that wait), so a peer that hangs after worker 0's end
        is still found at once."""
        link = self.link
        if link is not None and link.worker_id != 0:
            link.bye()
        elif link is not None and speaks and link.watch.watching():
            self.note(f"the command ended; worker 0 speaks for {link.watch.watching()} peers until they end")
            while link.watch.watching() and not (self.preemption.noticed.is_set() or self.withdrawn.is_set()):
                time.sleep(0.5)
        if link is not None:
            link.close()
        self.stop_beating.set()

    def _failed_output(self) -> dict[str, Any]:
        """What a failed `exited` adds: the last lines, secrets cut out, and the retry_on.output
        pattern (its index) that matched one of them, with that line. The control plane believes
        the claim for this job only: it can change nothing but the job's own retry."""
        lines = last_lines(self.last_output.snapshot(), self.secret_values, self.last_output.dropped)
        extra: dict[str, Any] = {"last_lines": lines}
        found = match_retry_output(self.config["retry_output"], lines)
        if isinstance(found, str):
            self.note(found)
        elif found is not None:
            extra.update(retry_pattern=found[0], retry_line=found[1][:MAX_QUOTED_LINE])
        return extra


def read_report_key(metadata: Metadata) -> bytes:
    """This attempt's signing key, from the node metadata; without one nothing can be reported."""
    text = metadata.get_optional(KEY_METADATA)
    if text is None:
        raise AgentError(f"no report key in the metadata ({KEY_METADATA}): no report would be believed")
    try:
        return parse_report_key(text)
    except AgentError as error:
        raise AgentError(f"{error}: no report would be believed") from None


# --- pool mode ------------------------------------------------------------------------
# A warm pool's unit runs one long-lived agent per host (`python3 agent.py --pool CONFIG`): it
# waits on the node metadata's `tpujobs-assignment` and runs each assigned attempt with the
# Agent above, exactly as a normal attempt runs, one at a time, each in a fresh directory.

ASSIGNMENT_METADATA = "instance/attributes/tpujobs-assignment"
POOL_REQUIRED = {
    "mode": str,
    "pool": str,
    "unit": int,
    "queued_resource": str,
    "project": str,
    "num_slices": int,
    "hosts_per_slice": int,
    "worker_events_topic": str,
    "preemption_topic": str,
}
PR_SET_CHILD_SUBREAPER = 36  # prctl(2): orphans below this process are re-parented to it, not to init
CLEAN_ROUNDS = 50  # of killing what a job left (a process forking while it is killed needs more than one)

# What the pool agent does with an assignment (the parsed `tpujobs-assignment`), while idle or
# while one job runs: the one table of its behaviour.
#   stale (seq below the highest seen in this boot) or unusable   ignored, logged
#   idle ({"seq": N}) while idle                                   nothing
#   idle while a job runs                                          the job is withdrawn
#   the running job's (job_id, attempt) again                      nothing: it keeps running
#   another job while idle                                         it starts (unless it already ran in this boot)
#   another job while one runs                                     the running one is withdrawn, then it starts
# After each job (ended, withdrawn, or not run again after a reboot), every process still
# descended from the pool agent is killed and the job's work directory is deleted.


def become_subreaper() -> bool:
    """This process adopts its orphaned descendants (Linux), so a daemon a job double-forked is
    still found below it and killed at the job's end; False where that cannot be had."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)) == 0
    except (OSError, AttributeError, TypeError):
        return False


def descendants(root: int) -> list[int]:
    """Live (non-zombie) processes descended from `root`, by their parent links in /proc."""
    children: dict[int, list[int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for entry in entries:
        if entry.isdigit():
            fields = proc_stat(entry)
            if len(fields) > 1 and fields[0] != "Z" and fields[1].isdigit():
                children.setdefault(int(fields[1]), []).append(int(entry))
    found: list[int] = []
    todo = list(children.get(root, []))
    while todo:
        pid = todo.pop()
        if pid != root and pid not in found:
            found.append(pid)
            todo.extend(children.get(pid, []))
    return found


def reap_children() -> None:
    """Collects every exited child (orphans adopted as a subreaper among them). Only while no
    job runs: it would take a running child's exit status from the code waiting for it."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def kill_descendants(root: int) -> int:
    """SIGKILL to every process still descended from `root`, until none is left (bounded);
    how many were killed."""
    killed: set[int] = set()
    for _ in range(CLEAN_ROUNDS):
        found = descendants(root)
        if not found:
            break
        for pid in found:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
            killed.add(pid)
        reap_children()
        time.sleep(0.02)  # their own children are re-parented to `root` as they die
    reap_children()
    return len(killed)


def load_pool_config(path: str) -> dict[str, Any]:
    """The pool-mode config written by a unit's startup script, checked, with defaults filled in."""
    config = read_json_object(path)
    check_required(config, POOL_REQUIRED)
    if config["mode"] != "pool":
        raise AgentError(f"config key 'mode' must be 'pool', got {config['mode'][:20]!r}")
    check_image(config)
    check_timings(config, pool=True)
    return config


def parse_assignment(text: str) -> dict[str, Any]:
    """A `tpujobs-assignment` value: {"seq": N} (idle), or with job_id, attempt, report_key and
    config (the attempt's). AgentError with a sentence naming the field; it never quotes the
    text, which holds the attempt's report key."""
    try:
        data = json.loads(text)
    except ValueError:
        raise AgentError("the assignment is not JSON") from None
    if not isinstance(data, dict):
        raise AgentError("the assignment is not a JSON object")
    seq = data.get("seq")
    if not isinstance(seq, int) or isinstance(seq, bool) or seq < 0:
        raise AgentError("the assignment's 'seq' must be a whole number, 0 or more")
    if data.get("job_id") is None:
        return {"seq": seq}
    job_id, attempt, config = data.get("job_id"), data.get("attempt"), data.get("config")
    if not isinstance(job_id, str) or not job_id:
        raise AgentError(f"assignment seq {seq}: 'job_id' must be a non-empty string")
    if not isinstance(attempt, int) or isinstance(attempt, bool) or attempt < 1:
        raise AgentError(f"assignment seq {seq}: 'attempt' must be a whole number, 1 or more")
    if not isinstance(data.get("report_key"), str):
        raise AgentError(f"assignment seq {seq}: 'report_key' must be a string")
    if not isinstance(config, dict):
        raise AgentError(f"assignment seq {seq}: 'config' must be a JSON object")
    if config.get("job_id") != job_id or config.get("attempt") != attempt:
        raise AgentError(f"assignment seq {seq}: 'config' is for another job or attempt than 'job_id' and 'attempt'")
    return data


class PoolJob:
    """One attempt the pool agent runs: its Agent, where, and the thread running it."""

    def __init__(self, seq: int, key: tuple[str, int], agent: Agent) -> None:
        self.seq = seq
        self.key = key  # (job_id, attempt)
        self.agent = agent
        self.workdir = agent.workdir  # deleted after the job; its record beside it is kept
        self.code: int | None = None

    def name(self) -> str:
        return f"job {self.key[0]} attempt {self.key[1]}"


class PoolAgent:
    """The long-lived agent of one host of a warm pool's unit (see the table above)."""

    def __init__(
        self,
        config: dict[str, Any],
        worker_id: int,
        slice_id: int,
        metadata: Metadata,
        pubsub: GoogleApi,
        storage: Storage,
        workdir: str,
        environ: dict[str, str],
        echo: Any = None,
        secret_reader: SecretReader | None = None,
        tokens: TokenSource | None = None,
        megascale: dict[str, str] | None = None,
    ) -> None:
        self.config = config
        self.worker_id = worker_id
        self.slice_id = slice_id
        self.metadata = metadata
        self.pubsub = pubsub
        self.storage = storage
        self.workdir = workdir
        self.environ = environ
        self.echo = echo
        self.tokens = tokens or TokenSource(metadata)
        self.secret_reader = secret_reader or SecretReader(GoogleApi.secrets_from_env(environ, self.tokens), metadata)
        self.megascale = dict(megascale or {})
        self.events: queue.Queue[tuple[str, Any]] = queue.Queue()
        self.stop_watching = threading.Event()
        self._lock = threading.Lock()
        self.running: PoolJob | None = None
        self.terminating = False  # SIGTERM: no new job; the agent ends once none runs
        self.highest_seq = -1
        self.pending: dict[str, Any] | None = None  # what runs once the withdrawn job is gone
        self.handled: set[tuple[str, int]] = set()  # attempts started in this boot
        self._last_text: str | None = None

    def prepull(self) -> None:
        """The pool's image, pulled once as its policy says, so the first job starts warm; a
        failure is only logged (the job's own pull says why, in its report)."""
        image = self.config.get("image")
        if not image:
            return
        docker = Docker.find(self.environ, self.tokens)
        if docker is None:
            log(f"the pool's image {image} is not pulled ahead: this host has no docker CLI")
            return
        try:
            pulled = docker.ensure(image, self.config["image_pull_policy"], threading.Event())
            log(f"the pool's image {image} is {'pulled' if pulled else 'already here'}")
        except ImageProblem as problem:
            log(f"the pool's image is not pulled ahead: {problem}")

    def on_sigterm(self, reason: str) -> None:
        """SIGTERM (the VM is stopping): the running job's Agent sends its preemption notice,
        under its own key; with none running nothing is sent. No job starts after it."""
        with self._lock:
            self.terminating = True
            running = self.running
        if running is not None:
            running.agent.preemption.trigger(reason)
        self.events.put(("sigterm", reason))

    def run(self) -> int:
        """Waits for assignments and runs them until a SIGTERM finds no job running; 0."""
        log(
            f"pool {self.config['pool']} unit {self.config['unit']} ({self.config['queued_resource']}): "
            f"slice {self.slice_id} worker {self.worker_id}, waiting for assignments in {self.workdir}"
        )

        def seen(value: str) -> bool:
            self.events.put(("assignment", value))
            return False

        watch_metadata(self.metadata, ASSIGNMENT_METADATA, seen, self.stop_watching)
        try:
            while True:
                kind, value = self.events.get()
                try:
                    if kind == "assignment":
                        self._assigned(value)
                    elif kind == "ended":
                        self._ended(value)
                except Exception as error:  # the unit must outlive any one assignment
                    log(f"the pool agent failed on an {kind} event: {error!r}")
                with self._lock:
                    if self.terminating and self.running is None:
                        log("SIGTERM: no job runs; the pool agent stops")
                        return 0
        finally:
            self.stop_watching.set()

    def _assigned(self, text: str) -> None:
        if text == self._last_text:  # the same value again (a wait that timed out)
            return
        self._last_text = text
        try:
            assignment = parse_assignment(text)
        except AgentError as error:
            log(f"assignment ignored: {error}")
            return
        seq = assignment["seq"]
        if seq < self.highest_seq:
            log(f"assignment seq {seq} ignored: seq {self.highest_seq} was seen already (a late write)")
            return
        self.highest_seq = seq
        key = (assignment["job_id"], assignment["attempt"]) if "job_id" in assignment else None
        running = self.running
        if running is not None:
            if key == running.key:  # written again: it keeps running (or, withdrawn, goes on going)
                if running.agent.withdrawn.is_set():
                    self.pending = None
                return
            self.pending = assignment if key is not None else None
            if running.agent.withdraw(f"assignment seq {seq} replaces it"):
                log(f"{running.name()}: withdrawn, assignment seq {seq} replaces it")
            return
        if key is not None:
            self._start(assignment)

    def _start(self, assignment: dict[str, Any]) -> None:
        key = (assignment["job_id"], assignment["attempt"])
        where = f"job {key[0]} attempt {key[1]}"
        if key in self.handled:
            log(f"{where} already ran on this unit in this boot; not run again")
            return
        with self._lock:
            if self.terminating:
                log(f"{where} not started: the pool agent is stopping (SIGTERM)")
                return
        self.handled.add(key)
        try:
            publisher_key = parse_report_key(assignment["report_key"])
        except AgentError as error:
            log(f"{where} not started: {error}: no report would be believed")
            return
        publisher = Publisher(self.pubsub, str(self.config["project"]), publisher_key)
        config = dict(assignment["config"])
        if not config.get("image") and self.config.get("image"):
            config["image"] = self.config["image"]  # the pool's, when the job names none
            config["image_pull_policy"] = self.config["image_pull_policy"]
        try:
            config = check_config(config)
        except AgentError as error:
            self._refuse(assignment, publisher, f"the assignment's config is unusable: {error}")
            return
        attempt_dir = os.path.join(self.workdir, "jobs", safe_name(key[0]), f"attempt-{int(key[1])}")
        workdir = os.path.join(attempt_dir, "work")
        record = AttemptRecord.beside(workdir, config, self.slice_id, self.worker_id)
        if not os.path.exists(record.path):  # a first start: whatever is there is not this attempt's
            shutil.rmtree(workdir, ignore_errors=True)
        os.makedirs(workdir, exist_ok=True)
        agent = Agent(
            config,
            self.worker_id,
            self.slice_id,
            self.metadata,
            publisher,
            self.storage,
            workdir,
            self.environ,
            echo=self.echo,
            secret_reader=self.secret_reader,
            tokens=self.tokens,
            megascale=self.megascale,
        )
        job = PoolJob(int(assignment["seq"]), key, agent)
        with self._lock:
            self.running = job
            terminating = self.terminating
        if terminating:  # a SIGTERM came meanwhile: this attempt is lost here, and says so
            agent.preemption.trigger("SIGTERM")
        log(f"{where}: started (assignment seq {job.seq}) in {workdir}")
        threading.Thread(target=self._run_job, args=(job,), name=f"job {key[0]}", daemon=True).start()

    def _run_job(self, job: PoolJob) -> None:
        try:
            job.code = job.agent.run()
        except BaseException as error:  # whatever happened, the unit is cleaned for the next job
            log(f"{job.name()}: the agent failed: {error!r}")
            job.code = AGENT_FAILED
        self.events.put(("ended", job))

    def _refuse(self, assignment: dict[str, Any], publisher: Publisher, sentence: str) -> None:
        """An attempt that cannot even start here: one signed `aborted` with why, so it is not
        left waiting for a `started` that never comes."""
        log(f"job {assignment['job_id']} attempt {assignment['attempt']} not started: {sentence}")
        identity = {
            "job_id": assignment["job_id"],
            "attempt": assignment["attempt"],
            "slice_id": self.slice_id,
            "worker_id": self.worker_id,
        }
        reporter = Reporter(publisher, str(self.config["worker_events_topic"]), identity)
        reporter.report("aborted", detail=sentence[:MAX_DETAIL_CHARS])
        reporter.close()

    def _ended(self, job: PoolJob) -> None:
        """The job's Agent is done: the unit is cleaned, then what was assigned meanwhile starts."""
        with self._lock:
            self.running = None
        killed = kill_descendants(os.getpid())
        if job.agent.started_again:
            self._stop_earlier_start(job)
        shutil.rmtree(job.workdir, ignore_errors=True)
        ended = job.agent.record.read().get("ended")
        if job.agent.started_again:
            how = "not run again (it had started on this unit before)"
        elif ended == "withdrawn":
            how = f"withdrawn with exit code {job.code}"
        else:
            how = f"ended ({ended or 'unrecorded'}) with exit code {job.code}"
        extra = f"; {killed} leftover process{'es' if killed != 1 else ''} killed" if killed else ""
        log(f"{job.name()}: {how}{extra}; its work directory is deleted")
        pending, self.pending = self.pending, None
        if pending is not None:
            self._start(pending)

    def _stop_earlier_start(self, job: PoolJob) -> None:
        """After the pool agent itself was restarted (not the VM), what an earlier start of the
        attempt left running on this unit (its command's group, its container) is stopped too:
        the next job gets the unit clean."""
        running = job.agent.record.read().get("running")
        if not isinstance(running, dict) or not still_running(running, boot_id()):
            return
        log(f"{job.name()}: stopping what its earlier start left running (pid {running.get('pid')})")
        signal_group(int(running["pid"]), signal.SIGKILL)
        container = running.get("container")
        docker = Docker.find(self.environ, self.tokens) if isinstance(container, str) else None
        if docker is not None and isinstance(container, str):
            docker.remove(container)


def pool_main(path: str) -> int:
    """`python3 agent.py --pool CONFIG`: the long-lived agent of one host of a pool unit."""
    early: list[str] = []  # a SIGTERM before the pool agent exists is acted on once it does
    target: list[Callable[[str], None]] = [early.append]
    watch_sigterm(lambda reason: target[-1](reason))
    if not become_subreaper():
        log("cannot become a child subreaper: a daemon a job double-forks may outlive the job")
    environ = dict(os.environ)
    metadata = Metadata(environ.get("TPUJOBS_METADATA_URL") or DEFAULT_METADATA_URL)
    try:
        config = load_pool_config(path)
        tpu_env = read_tpu_env(metadata)
        worker_id, slice_id = discover_identity(metadata, config, tpu_env)
    except (AgentError, OSError, http.client.HTTPException) as error:
        log(f"cannot start: {error}")
        return AGENT_CANNOT_START
    tokens = TokenSource(metadata)
    pubsub = GoogleApi.from_env("PUBSUB_EMULATOR_HOST", PUBSUB_API, environ, tokens)
    storage = Storage(GoogleApi.from_env("STORAGE_EMULATOR_HOST", STORAGE_API, environ, tokens))
    if pubsub.tokens is not None or storage.api.tokens is not None:
        try:
            tokens.token()  # fetched now, so a preemption notice never waits for it
        except (AgentError, OSError, http.client.HTTPException, ValueError, KeyError) as error:
            log(f"no access token yet: {error}")
    pool = PoolAgent(
        config,
        worker_id,
        slice_id,
        metadata,
        pubsub,
        storage,
        os.getcwd(),
        environ,
        echo=getattr(sys.stdout, "buffer", None),
        tokens=tokens,
        megascale=megascale_environment(tpu_env),
    )
    pool.prepull()
    target.append(pool.on_sigterm)
    if early:
        pool.on_sigterm(early[0])
    return pool.run()


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["--pool"] and len(args) == 2:
        return pool_main(args[1])
    if len(args) != 1 or args[0].startswith("--"):
        log("usage: python3 agent.py CONFIG_JSON, or python3 agent.py --pool POOL_CONFIG_JSON")
        return AGENT_CANNOT_START
    early: list[str] = []  # a SIGTERM before the agent exists is acted on once it does
    target: list[Callable[[str], None]] = [early.append]
    watch_sigterm(lambda reason: target[-1](reason))
    environ = dict(os.environ)
    metadata = Metadata(environ.get("TPUJOBS_METADATA_URL") or DEFAULT_METADATA_URL)
    try:
        config = load_config(args[0])
        tpu_env = read_tpu_env(metadata)
        worker_id, slice_id = discover_identity(metadata, config, tpu_env)
        key = read_report_key(metadata)
    except (AgentError, OSError, http.client.HTTPException) as error:
        log(f"cannot start: {error}")
        return AGENT_CANNOT_START
    tokens = TokenSource(metadata)
    publisher = Publisher(
        GoogleApi.from_env("PUBSUB_EMULATOR_HOST", PUBSUB_API, environ, tokens),
        config["project"],
        key,
    )
    storage = Storage(GoogleApi.from_env("STORAGE_EMULATOR_HOST", STORAGE_API, environ, tokens))
    secret_reader = SecretReader(GoogleApi.secrets_from_env(environ, tokens), metadata)
    if publisher.api.tokens is not None or storage.api.tokens is not None:
        try:
            tokens.token()  # fetched now, so a preemption notice never waits for it
        except (AgentError, OSError, http.client.HTTPException, ValueError, KeyError) as error:
            log(f"no access token yet: {error}")
    workdir = os.getcwd()
    log(f"job {config['job_id']} attempt {config['attempt']}: slice {slice_id} worker {worker_id}, in {workdir}")
    echo = getattr(sys.stdout, "buffer", None)
    agent = Agent(
        config,
        worker_id,
        slice_id,
        metadata,
        publisher,
        storage,
        workdir,
        environ,
        echo=echo,
        secret_reader=secret_reader,
        tokens=tokens,
        megascale=megascale_environment(tpu_env),
    )
    target.append(agent.preemption.trigger)
    if early:
        agent.preemption.trigger(early[0])
    return agent.run()


if __name__ == "__main__":
    sys.exit(main())
