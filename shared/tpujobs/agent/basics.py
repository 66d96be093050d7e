"""The agent's common ground: its errors, its log line, times in RFC 3339 and its exit codes."""

from __future__ import annotations

import datetime
import json
import re
import sys
import time

PASSABLE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")  # an environment variable a container can be given
RETRYABLE_STATUS = frozenset({408, 429, 500, 502, 503, 504})
AGENT_FAILED = 1  # the exit code reported when the agent fails the attempt (e.g. no code)
AGENT_CANNOT_START = 2  # bad config or unknown identity: nothing can be reported
AGENT_STARTED_AGAIN = 3  # the attempt had already started on this host: lost, nothing run


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


def parse_rfc3339(text: str) -> float | None:
    """An RFC 3339 UTC time (`...Z` or `...+00:00`) as epoch seconds; None if it is not one."""
    try:
        moment = datetime.datetime.fromisoformat(text[:-1] + "+00:00" if text.endswith("Z") else text)
    except ValueError:
        return None
    return moment.timestamp() if moment.tzinfo is not None else None


def host_variables(environ: dict[str, str]) -> dict[str, str]:
    """The host's environment without its TPUJOBS_ variables (the simulator's TPUJOBS_WORKDIR,
    TPUJOBS_METADATA_URL): the prefix is reserved for what the agent itself sets."""
    return {name: value for name, value in environ.items() if not name.startswith("TPUJOBS_")}


def safe_name(value: str) -> str:
    """A value usable as one file-name segment."""
    return re.sub(r"[^A-Za-z0-9_-]", "_", value) or "_"
