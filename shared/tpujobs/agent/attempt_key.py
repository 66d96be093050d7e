"""The attempt's report key, traded for this VM's identity token at the control plane.

No key sits in metadata (any API viewer reads that). The agent asks the metadata server for the
VM's identity token (`format=full`: Google signs the project, zone and instance into it) and sends
it to the jobs function's `attempt-key` action, which answers the key if this VM can be the host.
The answer carries the spec's `env` too: like the key, its values are in no metadata.

The key is handed out only once the slice is ready (its holding ACTIVE: every host came, the
interconnect is up); before that the key function answers 409, and the agent asks again after a
short growing pause, for at most READY_WAIT_SECONDS, saying once why it waits. A wait is no
failure: nothing is reported, and the command starts when the key comes.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .basics import AgentError, HttpError, log
from .rest import _DEFAULT, _DIRECT, ACCOUNT_METADATA, Metadata, http_call, parse_report_key, with_retries
from .wire import JOB_CREATED_ATTRIBUTE, KEY_VERSION_ATTRIBUTE, VERSION_PATTERN

IDENTITY_METADATA = "instance/service-accounts/default/identity"
# The local stand-ins' address, as the emulator variables name theirs: it wins over the config's.
KEY_URL_VARIABLE = "TPUJOBS_KEY_URL"
CALLER_HEADER = "X-Tpujobs-Caller"  # read by the local stack's API only; production reads the token
NOT_READY = 409  # the key function's "the slice is not ready yet: ask again" (its holding is not ACTIVE)
# How long a host waits for its slice: past the engine's zone wait and boot timeout (600 s each by
# default), by when the engine has released a slice that never became ready, or moved the job on
# (then the key function refuses for good, and the wait ends sooner).
READY_WAIT_SECONDS = 1200.0
READY_FIRST_DELAY = 1.0
READY_MAX_DELAY = 10.0


@dataclass(frozen=True)
class AttemptKey:
    """An attempt's key, and what names it beside every signature."""

    key: bytes = field(repr=False)
    version: str
    job_created: str
    coordinator: str | None = None  # a multislice's, where tpujobs names it (`megascale`)
    env: dict[str, str] = field(default_factory=dict, repr=False)  # the spec's env, for the command

    def names(self) -> dict[str, str]:
        """The attributes that name this key: sent with every signed message."""
        return {KEY_VERSION_ATTRIBUTE: self.version, JOB_CREATED_ATTRIBUTE: self.job_created}


class KeyFunctionRefused(AgentError):
    """The key function's answer was not 2xx (after retries): its status, and its sentence."""

    def __init__(self, error: HttpError) -> None:
        super().__init__(str(error))
        self.status = error.status


def ask_key_function(metadata: Metadata, key_url: str, action: str, fields: dict[str, Any]) -> bytes:
    """The key function's answer to `action` with `fields` and this VM's identity token (minted
    for the config's key URL, which is the token's audience); HttpError when it refuses, after a
    bounded number of retries of transient failures; KeyFunctionRefused when it answers no."""
    audience = key_url
    key_url = os.environ.get(KEY_URL_VARIABLE) or key_url
    if not key_url:
        raise AgentError("no key_url in the config: the attempt's key cannot be fetched")
    query = urllib.parse.urlencode({"audience": audience or key_url, "format": "full"})
    token = str(with_retries(lambda: metadata.get(f"{IDENTITY_METADATA}?{query}"))).strip()
    account = str(with_retries(lambda: metadata.get(ACCOUNT_METADATA))).strip()
    body = json.dumps({"action": action, "identity": token, **fields}).encode("utf-8")
    headers = {"Authorization": f"Bearer {token}", CALLER_HEADER: account, "Content-Type": "application/json"}
    opener = _DIRECT if urllib.parse.urlsplit(key_url).hostname in ("127.0.0.1", "localhost") else _DEFAULT
    try:
        return bytes(with_retries(lambda: http_call(opener, "POST", key_url, body, headers, timeout=15.0)))
    except HttpError as error:
        raise KeyFunctionRefused(error) from None


def fetch_attempt_key(
    metadata: Metadata,
    key_url: str,
    job_id: str,
    attempt: int,
    slice_id: int,
    worker_id: int,
    address: str | None = None,
    unit_secret: bytes | None = None,
    *,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> AttemptKey:
    """This host's key for the attempt, once its slice is ready; AgentError when the control
    plane refuses it (the reason is its answer), the slice is not ready within
    READY_WAIT_SECONDS, or the answer is unusable. Transient failures are retried a bounded
    number of times. `unit_secret`: a warm-pool unit's (`unit_secret.UnitSecret`), the proof that
    the pool agent asks, not any process of the VM."""
    fields = {
        "job_id": job_id,
        "attempt": attempt,
        "slice_id": slice_id,
        "worker_id": worker_id,
        **({"address": address} if address else {}),
        **({"unit_secret": unit_secret.hex()} if unit_secret is not None else {}),
    }
    raw = _ask_until_ready(lambda: ask_key_function(metadata, key_url, "attempt-key", fields), sleep, clock)
    try:
        answer = json.loads(raw)
        version, created = str(answer["key_version"]), str(answer["job_created"])
        key = parse_report_key(str(answer["key"]))
    except (ValueError, KeyError, TypeError) as error:
        raise AgentError(f"the control plane's key answer is unusable: {error}") from None
    if not re.fullmatch(VERSION_PATTERN, version) or not created.isdigit():
        raise AgentError("the control plane's key answer names no usable version or creation time")
    env = answer.get("env") or {}
    if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        raise AgentError("the control plane's key answer has an env that does not map strings to strings")
    coordinator = answer.get("coordinator")
    try:
        coordinator = str(ipaddress.ip_address(coordinator)) if coordinator else None
    except ValueError:
        raise AgentError("the control plane's key answer names a coordinator that is no address") from None
    return AttemptKey(key, version, created, coordinator, dict(env))


def _ask_until_ready(ask: Callable[[], bytes], sleep: Callable[[float], None], clock: Callable[[], float]) -> bytes:
    """`ask()`'s answer, asked again while the key function says the slice is not ready (409),
    after a pause growing from READY_FIRST_DELAY to READY_MAX_DELAY, for at most
    READY_WAIT_SECONDS; the first wait is logged with the key function's reason, and the end of
    the wait. Any other refusal is an AgentError at once."""
    deadline = clock() + READY_WAIT_SECONDS
    delay = READY_FIRST_DELAY
    since: float | None = None
    while True:
        try:
            answer = ask()
        except KeyFunctionRefused as error:
            if error.status != NOT_READY:
                raise AgentError(f"the control plane refused the attempt's key: {error}") from None
            if since is None:
                since = clock()
                log(f"the command waits for the slice to be ready: {error}")
            if clock() + delay > deadline:
                raise AgentError(f"the slice was not ready after {READY_WAIT_SECONDS:.0f} s: {error}") from None
            sleep(delay)
            delay = min(delay * 2, READY_MAX_DELAY)
            continue
        if since is not None:
            log(f"the slice is ready after {clock() - since:.0f} s: the command starts")
        return answer
