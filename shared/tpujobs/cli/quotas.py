"""`tpujobs quota`: read and change the chip quotas of `config/quotas` at run time.

A quota is a zone's or a region's chips of one family and tier (on-demand, spot, reserved), or
a named reservation's size, as Google counts them (`tpujobs.domain.quotas`, docs/quotas.md).
Admins only in production: `show` reads through the jobs API when TPUJOBS_API_URL is set (it
answers admins), the edits write Firestore directly (IAM decides who may). A raised quota
admits waiting jobs at the next reconcile tick, or at once when a job of the pool ends; a
lowered one never stops running jobs, it only holds new ones back.
"""

from __future__ import annotations

import enum
import re
from typing import TYPE_CHECKING, Annotated

import typer

from tpujobs.cli.common import Format, Output, err, out, print_document, settings, shown
from tpujobs.cli.tables import quotas_sheet
from tpujobs.cli.tables import show as show_sheet
from tpujobs.domain.quota_edits import with_limit, with_reservation
from tpujobs.domain.quotas import ZONE
from tpujobs.domain.spec import RESERVATION_PATTERN

if TYPE_CHECKING:
    from tpujobs.engine.ports import Pools

quota_app = typer.Typer(
    help="Chip quotas per family and tier, in a zone or a region, and reservations (config/quotas).",
    no_args_is_help=True,
)


class Tier(str, enum.Enum):
    """The quota a limit is of: Google keeps each apart (flex-start draws on spot)."""

    on_demand = "on-demand"
    spot = "spot"
    reserved = "reserved"


TierOption = Annotated[
    Tier,
    typer.Option(help="on-demand, spot (spot and flex-start jobs) or reserved (a zone's unnamed reservations)."),
]
Location = Annotated[str, typer.Argument(help="A zone (us-central2-b) or a region (us-central2): its zones share it.")]
Family = Annotated[str, typer.Argument(help="The TPU family: v4, v5p, v5litepod, ...")]
ReservationName = Annotated[str, typer.Argument(help="The reservation's name, as jobs give it in `reservation`.")]


def _pools() -> Pools:
    from google.cloud import firestore

    from tpujobs.adapters.firestore_pools import FirestorePools

    return FirestorePools(firestore.Client(project=settings().project))


def _checked_limit(location: str, family: str, tier: Tier, chips: int | None) -> None:
    """Refuse, naming what is wrong, a limit that `config/quotas` cannot hold: before any write."""
    try:
        with_limit({}, location, family, tier.value, chips)
    except ValueError as error:
        raise typer.BadParameter(str(error)) from None


def _checked_reservation(name: str) -> None:
    if not re.fullmatch(RESERVATION_PATTERN, name):
        raise typer.BadParameter(f"{name!r} is not a reservation name (letters, digits, '/', '_', '.', '-')")
    with_reservation({}, name, None)


def _limit_words(location: str, family: str, tier: Tier) -> str:
    where = location if ZONE.fullmatch(location) else f"region {location}"
    return f"{family} {tier.value} chips in {where}"


@quota_app.command("show")
def show(
    output: Output = Format.table,
    owner: Annotated[str | None, typer.Option(help="Who asks, locally, when TPUJOBS_API_URL is set.")] = None,
) -> None:
    """Every limit (zone, region, reservation), the chips held and the jobs waiting; via the jobs API if set."""
    from tpujobs.cli.reads import reads

    answer = reads(settings(), owner).quotas()
    if output is not Format.table:
        print_document(answer, output)
        return
    for problem in answer.get("problems") or []:
        err.print(f"[yellow]Warning:[/yellow] {shown(problem)}")
    pools = answer.get("pools") or []
    if not pools:
        out.print("No quotas: every pool is unlimited.")
        return
    show_sheet(out, quotas_sheet(pools))


@quota_app.command("set")
def set_quota(
    location: Location,
    family: Family,
    chips: Annotated[int, typer.Argument(min=0, help="Chips of this family and tier there, at most; 0 pauses it.")],
    tier: TierOption = Tier.on_demand,
) -> None:
    """Set one limit, e.g. `tpujobs quota set us-east5 v5p 512 --tier spot`."""
    _checked_limit(location, family, tier, chips)
    _pools().set_quota(location, family, tier.value, chips)
    out.print(f"Quota of {shown(_limit_words(location, family, tier))}: {chips}.")


@quota_app.command("unset")
def unset_quota(location: Location, family: Family, tier: TierOption = Tier.on_demand) -> None:
    """Remove one limit: no limit there (another of the same family and tier, the region's or a zone's, still holds)."""
    _checked_limit(location, family, tier, None)
    _pools().set_quota(location, family, tier.value, None)
    out.print(f"No quota of {shown(_limit_words(location, family, tier))}.")


@quota_app.command("set-reservation")
def set_reservation(
    name: ReservationName,
    chips: Annotated[int, typer.Argument(min=0, help="The reservation's chips: its jobs never hold more.")],
) -> None:
    """Set a named reservation's size, e.g. `tpujobs quota set-reservation team-a-v5p 256`."""
    _checked_reservation(name)
    _pools().set_reservation(name, chips)
    out.print(f"Reservation {shown(name)}: {chips} chips.")


@quota_app.command("unset-reservation")
def unset_reservation(name: ReservationName) -> None:
    """Forget a reservation's size: its jobs are then limited by nothing but the capacity Google gives."""
    _checked_reservation(name)
    _pools().set_reservation(name, None)
    out.print(f"No size for reservation {shown(name)}.")
