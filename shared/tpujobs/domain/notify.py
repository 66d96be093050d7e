"""Notifications: where a job's state changes are posted, and which changes each target wants.

A job's `notify` lists targets: a webhook URL, or the NAME of a secret that holds one (Slack and
Google Chat put their credential in the URL, so theirs belong in Secret Manager). A secret NAME is
read as `notify-NAME` in the namespace of the account the job runs as (tpujobs.domain.secrets): a
job can name its own account's webhooks only, and the notify function reads those and no other
secret. A job without `notify` gets its team's defaults (`config/notify`); `notify: []` opts out.
A webhook URL often is its own credential, so only the job's owner and admins see it whole
(`describe`); everyone else, `list` and the dashboard see its host (`webhook_host`).
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping, Sequence
from typing import Annotated
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from tpujobs.domain.secrets import check_secret_name, secret_version_name
from tpujobs.domain.states import TERMINAL, JobState

MAX_TARGETS = 8
MAX_URL_CHARS = 2048
NOTIFY_SECRET_STEM = "notify-"  # webhook secrets are `notify-NAME` in the job account's namespace
EVERY_END_STATE = tuple(sorted(state.value for state in TERMINAL))
LOOPBACK_HOSTS = frozenset({"localhost", "127.0.0.1", "::1"})
_CONTROL = re.compile(r"[\x00-\x20\x7f]")
_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s\"'<>]+")
ELIDED = "\u2026"  # what stands for the rest of a URL shown by its host


class NotifyTarget(BaseModel):
    """One place to post state changes to, and the states it wants (none given: every end state)."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    webhook: str | None = None
    webhook_secret: str | None = None
    on: Annotated[list[str], Field(min_length=1, max_length=len(JobState))] | None = None

    @field_validator("webhook")
    @classmethod
    def _webhook_url(cls, url: str | None) -> str | None:
        if url is not None:
            check_webhook_url(url)
        return url

    @field_validator("webhook_secret")
    @classmethod
    def _secret_name(cls, name: str | None) -> str | None:
        if name is not None:
            check_secret_name(name)
        return name

    @field_validator("on")
    @classmethod
    def _known_states(cls, states: list[str] | None) -> list[str] | None:
        if states is None:
            return None
        known = [state.value for state in JobState]
        for state in states:
            if state not in known:
                raise ValueError(f"{str(state)[:40]!r} is not a job state; use some of {', '.join(known)}")
        if len(set(states)) != len(states):
            raise ValueError("on names a state twice")
        return states

    @model_validator(mode="after")
    def _one_destination(self) -> NotifyTarget:
        if (self.webhook is None) == (self.webhook_secret is None):
            raise ValueError("a notify target has exactly one of webhook (a URL) and webhook_secret (a secret NAME)")
        return self

    def states(self) -> frozenset[str]:
        """The states this target is told about."""
        return frozenset(self.on if self.on is not None else EVERY_END_STATE)

    def label(self) -> str:
        """How logs and records name the target: never its URL, which may carry a credential."""
        return f"webhook_secret {self.webhook_secret}" if self.webhook_secret else "webhook"


def check_webhook_url(url: str, *, http_by_name: bool = True) -> None:
    """Raise ValueError with a sentence unless `url` is an https URL a spec may hold (http only to loopback).
    `http_by_name=False` leaves plain http to the caller, which judges the addresses the host resolves to."""
    if len(url) > MAX_URL_CHARS:
        raise ValueError(f"webhook is over {MAX_URL_CHARS} characters")
    if _CONTROL.search(url):
        raise ValueError("webhook holds a space or a control character")
    try:
        parts = urlsplit(url)
        host, port = parts.hostname, parts.port
    except ValueError:
        raise ValueError("webhook is not a URL") from None
    if parts.scheme not in ("https", "http") or not host:
        raise ValueError("webhook must be an https:// URL with a host")
    if http_by_name and parts.scheme == "http" and host not in LOOPBACK_HOSTS:
        raise ValueError("webhook must be https:// (plain http only to loopback, on the local stack)")
    if parts.username is not None or parts.password is not None:
        raise ValueError("webhook must not hold a user or password: keep a credential-bearing URL in webhook_secret")
    if port == 0:
        raise ValueError("webhook names port 0")


def targets_from(entries: Sequence[object], where: str) -> list[NotifyTarget]:
    """Validated targets from JSON-like entries; ValueError naming `where` and the entry's index."""
    if len(entries) > MAX_TARGETS:
        raise ValueError(f"{where} has {len(entries)} targets; at most {MAX_TARGETS} are allowed")
    targets = []
    for index, entry in enumerate(entries):
        try:
            targets.append(NotifyTarget.model_validate(entry))
        except ValidationError as error:
            first = error.errors()[0]
            field = ".".join(str(part) for part in first["loc"])
            message = str(first["msg"]).removeprefix("Value error, ")
            raise ValueError(f"{where}[{index}]{'.' + field if field else ''}: {message}") from None
    return targets


def team_defaults(config: Mapping[str, Sequence[NotifyTarget]], memberships: Collection[str]) -> list[NotifyTarget]:
    """The defaults for a job whose owner is, or is in, each of `memberships` (the owner and its
    `group:NAME`s): every target configured for any of them, in `config`'s order, each once."""
    found: list[NotifyTarget] = []
    for who, targets in config.items():
        if who in memberships:
            found.extend(target for target in targets if target not in found)
    return found[:MAX_TARGETS]


def wanted(targets: Sequence[NotifyTarget], state: str, source: str) -> list[tuple[str, NotifyTarget]]:
    """(key, target) of each target that wants `state`; the key (`notify-0`, `team-1`) names the
    target in records and logs: its list (`source`) and index, never its URL."""
    return [(f"{source}-{index}", target) for index, target in enumerate(targets) if state in target.states()]


def webhook_secret_version(name: str, project: str, prefix: str, account_email: str) -> str:
    """The secret version that holds webhook NAME for a job running as `account_email`."""
    return secret_version_name(NOTIFY_SECRET_STEM + name, project, prefix, account_email)


def webhook_host(url: str) -> str:
    """The part of a webhook URL anyone may see: its host (and port), then `/…` for the rest
    (`hooks.slack.com/…`). A URL that does not parse shows as `…` alone; one already shown so stays."""
    if "://" not in url:
        return url if url.endswith(f"/{ELIDED}") and not _CONTROL.search(url) else ELIDED
    try:
        parts = urlsplit(url)
        host, port = parts.hostname, parts.port
    except ValueError:
        return ELIDED
    if not host:
        return ELIDED
    return f"{host}:{port}/{ELIDED}" if port else f"{host}/{ELIDED}"


def without_urls(text: str) -> str:
    """`text` with every URL in it cut to its host (`webhook_host`): for sentences shown to anyone."""
    return _URL.sub(lambda match: webhook_host(match.group(0)), text)


def hidden_webhooks(spec: Mapping[str, object]) -> dict[str, object]:
    """A spec document with each `notify[].webhook` cut to its host; the rest as it was."""
    shown = dict(spec)
    targets = shown.get("notify")
    if isinstance(targets, list):
        shown["notify"] = [
            {**target, "webhook": webhook_host(target["webhook"])}
            if isinstance(target, dict) and isinstance(target.get("webhook"), str)
            else target
            for target in targets
        ]
    return shown
