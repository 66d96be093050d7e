"""`tpujobs quota`: read and change the chip quotas of `config/quotas` at run time.

Admins only in production: `show` reads through the jobs API when TPUJOBS_API_URL is set
(it answers admins), `set` and `unset` write Firestore directly (IAM decides who may). A raised
quota admits waiting jobs at the next reconcile tick, or at once when any job of the pool
ends; a lowered one never stops running jobs, it only holds new ones back. A waiting job
bigger than the whole new quota could never run: it moves on to its next zone, or fails,
and the jobs behind it are admitted. A quota of 0 pauses the pool: its jobs wait.
"""

from __future__ import annotations

import re
from typing import Annotated, Any

import typer

from tpujobs.cli.common import Format, Output, out, print_document, settings
from tpujobs.cli.tables import quotas_sheet
from tpujobs.cli.tables import show as show_sheet
from tpujobs.domain.accelerators import FAMILIES

quota_app = typer.Typer(help="Chip quotas per accelerator family and zone (config/quotas).", no_args_is_help=True)
ZONE = re.compile(r"^[a-z]+-[a-z]+[0-9]+-[a-z]$")


def _pools() -> Any:
    from google.cloud import firestore

    from tpujobs.adapters.firestore_pools import FirestorePools

    return FirestorePools(firestore.Client(project=settings().project))


def _checked(zone: str, family: str) -> None:
    if not ZONE.fullmatch(zone):
        raise typer.BadParameter(f"zone {zone!r} is not a zone such as us-central2-b")
    if family not in FAMILIES:
        raise typer.BadParameter(f"family {family!r} is not one of {', '.join(sorted(FAMILIES))}")


@quota_app.command("show")
def show(
    output: Output = Format.table,
    owner: Annotated[str | None, typer.Option(help="Who asks, locally, when TPUJOBS_API_URL is set.")] = None,
) -> None:
    """Every quota, the chips held under it, and how many jobs wait (through the jobs API if set)."""
    from tpujobs.cli.reads import reads

    answer = reads(settings(), owner).quotas()
    if output is not Format.table:
        print_document(answer, output)
        return
    pools = answer.get("pools") or []
    if not pools:
        out.print("No quotas: every pool is unlimited.")
        return
    show_sheet(out, quotas_sheet(pools))


@quota_app.command("set")
def set_quota(
    zone: str,
    family: str,
    chips: Annotated[int, typer.Argument(min=0, help="Chips of this family in this zone, at most.")],
) -> None:
    """Set one pool's quota, e.g. `tpujobs quota set us-central2-b v4 64`."""
    _checked(zone, family)
    _pools().set_quota(zone, family, chips)
    out.print(f"Quota of {family} in {zone}: {chips} chips.")


@quota_app.command("unset")
def unset_quota(zone: str, family: str) -> None:
    """Remove one pool's quota: no limit."""
    _checked(zone, family)
    _pools().set_quota(zone, family, None)
    out.print(f"No quota for {family} in {zone}: no limit.")
