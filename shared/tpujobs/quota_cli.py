"""`tpujobs quota`: read and change the chip quotas of `config/quotas` at run time.

Admins only in production (it writes Firestore directly; IAM decides who may). A raised
quota admits waiting jobs at the next reconcile tick, or at once when any job of the pool
ends; a lowered one never stops running jobs, it only holds new ones back. A waiting job
bigger than the whole new quota could never run: it moves on to its next zone, or fails,
and the jobs behind it are admitted. A quota of 0 pauses the pool: its jobs wait.
"""

from __future__ import annotations

import re
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Column, Table

from tpujobs.domain.accelerators import FAMILIES
from tpujobs.terminal import shown

quota_app = typer.Typer(help="Chip quotas per accelerator family and zone (config/quotas).", no_args_is_help=True)
out = Console()
ZONE = re.compile(r"^[a-z]+-[a-z]+[0-9]+-[a-z]$")


def _pools() -> Any:
    from google.cloud import firestore

    from tpujobs.adapters.firestore_pools import FirestorePools
    from tpujobs.cli import _settings

    return FirestorePools(firestore.Client(project=_settings().project))


def _checked(zone: str, family: str) -> None:
    if not ZONE.fullmatch(zone):
        raise typer.BadParameter(f"zone {zone!r} is not a zone such as us-central2-b")
    if family not in FAMILIES:
        raise typer.BadParameter(f"family {family!r} is not one of {', '.join(sorted(FAMILIES))}")


@quota_app.command("show")
def show() -> None:
    """Every quota, the chips held under it, and how many jobs wait."""
    pools = _pools()
    quotas = pools.quotas()
    names = sorted({f"{family}@{zone}" for zone, limits in quotas.items() for family in limits} | set(pools.pools()))
    if not names:
        out.print("No quotas: every pool is unlimited.")
        return
    table = Table(
        Column("POOL", no_wrap=True),
        Column("QUOTA", justify="right"),
        Column("HELD", justify="right"),
        Column("HOLDERS", justify="right"),
        Column("WAITING", justify="right"),
    )
    for name in names:
        family, _, zone = name.partition("@")
        limit = (quotas.get(zone) or {}).get(family)
        holders = pools.view(name).holders
        waiting = len(pools.queue(name, limit=1000))
        table.add_row(
            shown(name),  # config/quotas is edited by hand in the console: its keys are text
            "none" if limit is None else str(limit),
            str(sum(h.chips for h in holders)),
            str(len(holders)),
            str(waiting),
        )
    out.print(table)


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
