"""Notifications in the CLI: `tpujobs describe`'s lines (what became of each notify target of the
job), and `tpujobs notify-key` (the key a team's receivers verify its notifications with)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any

import typer

from tpujobs.cli.common import Format, Output, Stop, api_url, ask_api, caller, out, print_document, settings


def notification_lines(answer: Mapping[str, Any]) -> list[str]:
    """One line per target record of a `describe` answer (none when the job has no records)."""
    records = answer.get("notifications") or []
    if not records:
        return []
    lines = ["Notifications:"]
    for record in records:
        name = f"{record.get('id', '?')} ({record.get('target', '?')})"
        event, state = record.get("event", ""), record.get("state", "")
        delivered = event in (record.get("delivered") or [])
        if delivered:
            outcome = "delivered"
        else:
            given_up = " (given up)" if record.get("gave_up") else " (will retry)"
            outcome = f"failed {record.get('attempts', 0)} tries{given_up}: {record.get('last_error', '')}"
        lines.append(f"  {name}: {state} {event}: {outcome}")
    return lines


def notify_key(
    service_account: Annotated[
        str | None, typer.Option(help="The key of this service account's team (one your jobs may run as).")
    ] = None,
    team: Annotated[str | None, typer.Option(help="Admins: any team's key, `account:EMAIL` or `owner:EMAIL`.")] = None,
    owner: Annotated[str | None, typer.Option(help="Who asks, locally (the local stack's caller header).")] = None,
    output: Output = Format.table,
) -> None:
    """Print your team's notification signing key: what your receivers verify X-Tpujobs-Signature with.

    Your own (`owner:YOU`) signs your jobs that run as the default account; `--service-account`
    gives the key of the jobs that run as that account. While the deployment's master key rotates,
    the previous version's key is printed too (docs/operations.md, "Notifications"). It is a secret:
    keep it where your receiver reads it, never in code.
    """
    url = api_url()
    if not url:
        raise Stop("notify-key asks the jobs API: set TPUJOBS_API_URL.")
    request: dict[str, Any] = {"action": "notify-key"}
    if service_account:
        request["service_account"] = service_account
    if team:
        request["team"] = team
    answer = ask_api(settings(), url, request, caller(owner)) or {}
    if output is not Format.table:
        print_document(answer, output)
        return
    out.print(f"Team {answer.get('team')}: key version {answer.get('key_version')}", highlight=False)
    typer.echo(str(answer.get("key", "")))
    for previous in answer.get("previous") or []:
        out.print(f"Previous version {previous.get('key_version')} (while the rotation lasts):", highlight=False)
        typer.echo(str(previous.get("key", "")))
