"""What every `tpujobs` verb needs: its consoles, its project and settings, the `jobs` API, and
failures said in one sentence instead of a traceback.

The project comes from `--project`, then GOOGLE_CLOUD_PROJECT, then gcloud's configured
project (`gcloud config get-value project`, else the project of the credentials file), then
the running local stack; never from a silent default. A running local stack's other settings
(emulator hosts, TPUJOBS_API_URL) apply only when its project is the one chosen, so a real
project is never read through an emulator.
"""

from __future__ import annotations

import enum
import getpass
import json
import os
import subprocess
from collections.abc import Mapping
from typing import Annotated, Any

import typer
import yaml
from rich.console import Console
from typer.core import TyperGroup

from tpujobs.cli.terminal import shown, uncontrolled
from tpujobs.engine.settings import Settings

out = Console()
err = Console(stderr=True)

PROJECT_HELP = "say where tpujobs runs: pass --project, set GOOGLE_CLOUD_PROJECT, or run `gcloud config set project ID`"
CREDENTIALS_HELP = (
    "run `gcloud auth application-default login`, or set GOOGLE_APPLICATION_CREDENTIALS to a key file, "
    "or start the local stack with `tpujobs dev up`"
)
_REFUSALS = {401: "Not signed in", 403: "Not allowed", 404: "No such job", 409: "Refused"}


class Stop(Exception):
    """A failure the user can act on: printed as one sentence on stderr, exit 1 (or `code`)."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.message = message
        self.code = code


class Refused(Stop):
    """The jobs API said no, with this HTTP status."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


class Group(TyperGroup):
    """The root command group: a Stop, and the library failures users cause (no credentials, no
    network, no permission), end as one sentence on stderr, never a traceback."""

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except Stop as stop:
            _say(stop.message)
            raise typer.Exit(stop.code) from None
        except (typer.Exit, typer.Abort, KeyboardInterrupt):
            raise
        except Exception as error:
            sentence = as_sentence(error)
            if sentence is None:
                raise
            _say(sentence)
            raise typer.Exit(1) from None


def _say(sentence: str) -> None:
    err.print(uncontrolled(sentence), markup=False, highlight=False, soft_wrap=True, style="red")


def as_sentence(error: BaseException) -> str | None:
    """What to tell the user about a failure of a Google library or of a store, or None."""
    from google.api_core import exceptions as api
    from google.auth import exceptions as auth

    from tpujobs.engine.errors import PermanentError, TransientError

    project = _chosen.get("project") or "this project"
    if isinstance(error, auth.DefaultCredentialsError):
        return f"No usable Google credentials ({_first_line(error)}): {CREDENTIALS_HELP}."
    if isinstance(error, auth.RefreshError):
        return "Your Google credentials were refused: run `gcloud auth application-default login` again."
    if isinstance(error, (api.PermissionDenied, api.Unauthenticated)):
        return f"Not allowed in {project}: ask an admin for access, or set TPUJOBS_API_URL to the jobs API."
    if isinstance(error, (TransientError, api.ServiceUnavailable, api.DeadlineExceeded, api.RetryError)):
        return (
            f"Could not reach the tpujobs deployment in {project} ({_first_line(error)}): check the project "
            "and your network, or start the local stack with `tpujobs dev up`."
        )
    if isinstance(error, PermanentError):
        return f"Failed in {project}: {_first_line(error)}"
    return None


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return text[0][:200] if text else type(error).__name__


# --- project and settings ----------------------------------------------------------------

_chosen: dict[str, str] = {}  # this invocation's --project (set by the root callback)


def choose_project(project: str | None) -> None:
    """Remember `--project` for this invocation (None forgets an earlier one)."""
    _chosen.clear()
    if project:
        _chosen["project"] = project


def gcloud_project() -> str:
    """gcloud's configured project, else the credentials file's; "" when neither says."""
    try:
        found = subprocess.run(
            ["gcloud", "config", "get-value", "project"], capture_output=True, text=True, timeout=20, check=False
        )
        project = found.stdout.strip() if found.returncode == 0 else ""
    except (OSError, subprocess.TimeoutExpired):
        project = ""
    if project and project != "(unset)":
        return project
    if os.environ.get("GOOGLE_APPLICATION_CREDENTIALS"):  # never the metadata server: it may hang
        import google.auth
        from google.auth import exceptions

        try:
            return google.auth.default()[1] or ""
        except exceptions.GoogleAuthError:
            return ""
    return ""


def resolve_project(flag: str | None, environ: Mapping[str, str], stack: Mapping[str, str]) -> str:
    """--project, GOOGLE_CLOUD_PROJECT, gcloud's, the local stack's; Stop when none says."""
    project = (
        flag
        or environ.get("GOOGLE_CLOUD_PROJECT")
        or environ.get("GCLOUD_PROJECT")
        or gcloud_project()
        or stack.get("GOOGLE_CLOUD_PROJECT", "")
    )
    if not project:
        raise Stop(f"No Google Cloud project: {PROJECT_HELP}, or start the local stack with `tpujobs dev up`.")
    return project


def settings() -> Settings:
    """Settings for this invocation: the resolved project, with the local stack's environment
    filled in where unset when the stack serves that project."""
    from tpujobs.local.stack import stack_environment

    stack = stack_environment()
    project = resolve_project(_chosen.get("project"), os.environ, stack)
    _chosen["project"] = project
    if stack and stack.get("GOOGLE_CLOUD_PROJECT") == project:
        for name, value in stack.items():
            os.environ.setdefault(name, value)
    return Settings.from_env({**os.environ, "GOOGLE_CLOUD_PROJECT": project})


# --- the jobs API ------------------------------------------------------------------------


def api_url() -> str:
    """The `jobs` API to read and write through; "" when none is configured (call settings() first)."""
    return os.environ.get("TPUJOBS_API_URL", "").strip()


def caller(owner: str | None) -> str:
    """Who asks, in the local stack: --owner, else $TPUJOBS_OWNER, else the login."""
    return owner or os.environ.get("TPUJOBS_OWNER") or getpass.getuser()


def ask_api(
    config: Settings, url: str, request: dict[str, Any], who: str, missing_ok: bool = False
) -> dict[str, Any] | None:
    """POST one request to the `jobs` function as `who` (locally the caller header, deployed an
    ID token); its JSON answer (None for a 404 when `missing_ok`), or Stop with the API's reason."""
    from tpujobs.cli import api_client
    from tpujobs.engine.api import CALLER_HEADER

    headers = {CALLER_HEADER: who} if config.local_stack else {"Authorization": f"Bearer {id_token(url)}"}
    try:
        status, body = api_client.post(url, request, headers, direct=config.local_stack)
    except api_client.Unreachable as error:
        raise Stop(f"Could not reach the jobs API at {url} ({error}): check TPUJOBS_API_URL.") from None
    if status == 404 and missing_ok:
        return None
    if status != 200:
        reason = body.get("error") or f"HTTP {status}"
        raise Refused(f"{_REFUSALS.get(status, f'Failed (HTTP {status})')}: {reason}", status)
    return body


def id_token(url: str) -> str:
    """A Google ID token for the jobs API: a service account's, else the gcloud user's."""
    from google.auth import exceptions
    from google.auth.transport.requests import Request
    from google.oauth2 import id_token as tokens

    audience = (os.environ.get("TPUJOBS_API_AUDIENCE", "").split(",")[0].strip()) or url
    try:
        return str(tokens.fetch_id_token(Request(), audience))
    except exceptions.GoogleAuthError:
        pass  # user credentials cannot mint a token for an audience: ask gcloud
    try:
        found = subprocess.run(["gcloud", "auth", "print-identity-token"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        found = None
    token = found.stdout.strip() if found is not None and found.returncode == 0 else ""
    if not token:
        raise Stop(
            "No Google ID token for the jobs API: run `gcloud auth login`, or set "
            "GOOGLE_APPLICATION_CREDENTIALS to a service account key."
        )
    return token


# --- output for scripts ------------------------------------------------------------------


class Format(str, enum.Enum):
    """What `-o/--output` prints: tables for people, the API's documents for scripts."""

    table = "table"
    json = "json"
    yaml = "yaml"


Output = Annotated[
    Format,
    typer.Option(
        "--output", "-o", help="table (for people), or json / yaml: the documents as the jobs API gives them."
    ),
]


def print_document(document: Any, fmt: Format) -> None:
    """The document as JSON or YAML on stdout, exactly (no markup, no wrapping)."""
    if fmt is Format.yaml:
        typer.echo(yaml.safe_dump(document, sort_keys=False, allow_unicode=True), nl=False)
    else:
        typer.echo(json.dumps(document, indent=2, ensure_ascii=False))


__all__ = ["err", "out", "shown"]
