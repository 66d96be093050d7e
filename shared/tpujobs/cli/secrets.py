"""`tpujobs secret set | list`: the secrets a job's `secrets` field names, in Secret Manager.

A secret belongs to the service account its jobs run as: `set NAME` stores it as
`{prefix}tpujobs_{account id}_{NAME}`, which only that account's TPU VMs may read, and a
job then asks for it as `secrets: {ENV_NAME: NAME}`. `--account` defaults to the
deployment's TPU VM account (TPUJOBS_TPU_SERVICE_ACCOUNT). Locally it talks to the stack's
Secret Manager (TPUJOBS_SECRETS_ENDPOINT); deployed, to the real API with your credentials,
so IAM decides who may set secrets. A value is never echoed, printed or put in an error.
"""

from __future__ import annotations

import getpass
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, NoReturn

import typer
from rich.console import Console
from rich.table import Column, Table
from rich.text import Text

from tpujobs.cli.common import settings as cli_settings
from tpujobs.cli.terminal import uncontrolled
from tpujobs.domain.secrets import check_secret_name
from tpujobs.engine.errors import PermanentError, TransientError
from tpujobs.engine.settings import Settings

if TYPE_CHECKING:
    from tpujobs.adapters.secrets import Secrets  # imported when used: the CLI starts fast

secret_app = typer.Typer(help="Secrets for a job's `secrets` field, kept in Secret Manager.", no_args_is_help=True)
out = Console()
err = Console(stderr=True)

Account = Annotated[
    str | None,
    typer.Option(
        "--account",
        help="The service account whose jobs may read it "
        "(default: $TPUJOBS_TPU_SERVICE_ACCOUNT, the deployment's TPU VM account).",
    ),
]


def _fail(what: str, why: object) -> NoReturn:
    err.print(f"{what}:", style="bold red", end=" ")
    err.print(uncontrolled(str(why)), markup=False, highlight=False, soft_wrap=True)
    raise typer.Exit(1)


def _when(moment: datetime | None) -> str:
    return "-" if moment is None else moment.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%S")


def _secrets(settings: Settings) -> Secrets:
    from tpujobs.adapters.secrets import Secrets

    return Secrets.build(settings)


def _read_value(name: str, from_file: Path | None) -> bytes:
    """The value from the file as is, else from standard input: hidden when it is a terminal,
    else read whole, less one trailing newline (`echo "$TOKEN" | tpujobs secret set NAME`)."""
    if from_file is not None:
        try:
            return from_file.read_bytes()
        except OSError as error:
            _fail(f"cannot read {from_file}", error.strerror or type(error).__name__)
    stdin = typer.get_binary_stream("stdin")
    if stdin.isatty():
        return getpass.getpass(f"Value of {name} (not echoed): ").encode("utf-8")
    data = stdin.read()
    if data.endswith(b"\r\n"):
        return data[:-2]
    return data[:-1] if data.endswith(b"\n") else data


@secret_app.command("set")
def set_secret(
    name: Annotated[str, typer.Argument(help="The NAME jobs use in `secrets:`.")],
    account: Account = None,
    from_file: Annotated[
        Path | None,
        typer.Option(
            "--from-file",
            dir_okay=False,
            help="Read the value from this file, byte for byte (default: standard input).",
        ),
    ] = None,
) -> None:
    """Add a new version of secret NAME (created if missing); prints the version created."""
    try:
        check_secret_name(name)
    except ValueError as error:
        raise typer.BadParameter(str(error), param_hint="NAME") from None
    settings = cli_settings()
    owner = account or settings.tpu_service_account
    if not owner:
        _fail(
            "no account",
            "pass --account EMAIL or set TPUJOBS_TPU_SERVICE_ACCOUNT: a secret belongs to the "
            "service account whose jobs read it",
        )
    value = _read_value(name, from_file)
    if not value:
        _fail("refused", f"the value of {name} is empty")
    try:
        version = _secrets(settings).set_secret(name, value, owner)
    except (PermanentError, TransientError) as error:
        _fail(f"could not set {name}", error)
    out.print(
        f"Created {version} (secret {name} of {owner}); jobs running as {owner} "
        f"read it with `secrets: {{ENV_NAME: {name}}}`.",
        markup=False,
        highlight=False,
        soft_wrap=True,
    )


@secret_app.command("list")
def list_secrets(
    account: Annotated[
        str | None,
        typer.Option("--account", help="Only this service account's secrets (default: every account's)."),
    ] = None,
) -> None:
    """tpujobs' secrets: name, account, latest version and when it was added; never values."""
    settings = cli_settings()
    try:
        found = _secrets(settings).list_secrets(account)
    except (PermanentError, TransientError) as error:
        _fail("could not list secrets", error)
    if not found:
        out.print("No secrets." if not account else f"No secrets of {uncontrolled(account)}.", markup=False)
        return
    table = Table(
        Column("NAME", overflow="fold"),
        Column("ACCOUNT", overflow="fold"),
        Column("VERSION", justify="right", no_wrap=True, min_width=7),
        Column("CREATED", no_wrap=True, min_width=19),
    )
    for info in found:
        table.add_row(
            Text(uncontrolled(info.name)),
            Text(uncontrolled(info.account)),
            Text("-" if info.version is None else str(info.version)),
            Text(_when(info.created)),
        )
    out.print(table)
