"""`tpujobs pool`: warm pools, TPU capacity held under a name for jobs that ask for it (`pool: NAME`).

Like the job verbs: with TPUJOBS_API_URL set, every verb asks the `jobs` API, where the caller
is verified (the one way to create a pool unless config/policies trusts topic owners). Without
it, create, resize and delete are published to tpujobs-control and followed in Firestore until
they take effect or are refused (the rejection's reason is printed), and list and describe
read Firestore. Who may do what is the service's rule (`tpujobs.engine.warm_pools`), never the CLI's:
the CLI checks a new pool's fields only to say what is wrong before anything is sent.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Annotated, Any

import typer

from tpujobs.cli import tables
from tpujobs.cli.common import Format, Output, Stop, api_url, ask_api, caller, out, print_document, settings
from tpujobs.cli.reads import StoreReads, reads
from tpujobs.cli.terminal import shown
from tpujobs.engine.settings import Settings
from tpujobs.engine.topology import CONTROL

pool_app = typer.Typer(
    help="Warm pools: TPU capacity held under a name; jobs with `pool: NAME` start on it in seconds.",
    no_args_is_help=True,
)
FOLLOW_SECONDS = 60.0  # how long a verb without an API waits for tpujobs-control to act

Who = Annotated[
    str | None,
    typer.Option(
        help="Who asks, locally: for resize and delete the pool's owner or an admin. Default: $TPUJOBS_OWNER, "
        "else your login. Deployed, your ID token says who you are and this is ignored."
    ),
]
Wait = Annotated[
    bool, typer.Option(help="Without an API URL: wait until tpujobs-control has acted, or say why it refused.")
]


class Capacity(str, enum.Enum):
    """What a pool's units are asked for as (the `capacity` of a job spec)."""

    on_demand = "on-demand"
    spot = "spot"
    reserved = "reserved"


@pool_app.command("create")
def create(
    name: Annotated[str, typer.Argument(help="2 to 40 lowercase letters, digits or hyphens, starting with a letter.")],
    accelerator: Annotated[str, typer.Option("--accelerator", help="Each unit's accelerator type, e.g. v4-32.")],
    slices: Annotated[int | None, typer.Option(help="Slices per unit (more than one: multislice). Default 1.")] = None,
    count: Annotated[int, typer.Option(help="Units to hold, 1 to 64.")] = 1,
    capacity: Annotated[Capacity, typer.Option(help="What each unit is asked for as.")] = Capacity.on_demand,
    reservation: Annotated[str | None, typer.Option(help="A named reservation (with --capacity reserved).")] = None,
    zone: Annotated[str | None, typer.Option(help="The zone of every unit. Default: the deployment's.")] = None,
    zones: Annotated[str | None, typer.Option(help="Zones in order of preference, comma separated.")] = None,
    image: Annotated[str | None, typer.Option(help="The container image units pull at boot; jobs run in it.")] = None,
    idle_minutes: Annotated[
        int | None,
        typer.Option(help="Release a unit idle this long; it is asked for again when a job needs it. Default: kept."),
    ] = None,
    user: Annotated[
        list[str], typer.Option("--user", help="Who else may run jobs on it: an e-mail or group:NAME (repeat).")
    ] = [],  # noqa: B006
    service_account: Annotated[
        str | None, typer.Option(help="What its VMs run as (config/service_accounts). Default: the deployment's.")
    ] = None,
    owner: Who = None,
    wait: Wait = True,
) -> None:
    """Hold COUNT units of capacity, each one queued resource, under NAME; you own the pool.

    Admins, and owners an admin lists in config/policies.pools, may create pools. Units count
    against the chip quotas as jobs do, and are asked for at once.
    """
    if zone is not None and zones is not None:
        raise typer.BadParameter("give --zone or --zones, not both")
    given = {
        "slices": slices,
        "capacity": capacity.value,
        "reservation": reservation,
        "zone": zone,
        "zones": [z.strip() for z in zones.split(",") if z.strip()] if zones is not None else None,
        "image": image,
        "idle_minutes": idle_minutes,
        "users": list(user) or None,
        "service_account": service_account,
    }
    fields = {"name": name, "accelerator_type": accelerator, "count": count}
    fields.update({key: value for key, value in given.items() if value is not None})
    config = settings()
    who = caller(owner)
    _checked(fields, who, config)
    url = api_url()
    if url:
        answer = ask_api(config, url, {"action": "pool-create", **fields}, who) or {}
        _created(answer.get("pool") or {})
        return
    _must_exist(config, name, wanted=False)
    message_id = _publish(config, {"action": "pool-create", "owner": who, "pool": fields})
    out.print(f"Asked tpujobs-control to create pool [bold]{shown(name)}[/bold] as {shown(who)}.")
    if wait:
        _created(_follow(config, message_id, name, lambda pool: pool is not None) or {})


def _checked(fields: dict[str, Any], who: str, config: Settings) -> None:
    """The pool's fields checked as the service checks them: exit 2 with its sentence if not valid."""
    from tpujobs.domain.pools import PoolError, parse_pool_request

    try:
        parse_pool_request({**fields, "owner": who}, config.default_zone)
    except PoolError as error:
        raise Stop(f"Invalid pool: {error}", code=2) from None


def _created(pool: dict[str, Any]) -> None:
    out.print(
        f"Created pool [bold]{shown(pool.get('name'))}[/bold]: {shown(tables.pool_shape(pool))}, units "
        f"{shown(tables.unit_counts(pool.get('units') or []))} (`tpujobs pool describe {shown(pool.get('name'))}`)."
    )


@pool_app.command("list")
def list_pools(output: Output = Format.table, owner: Who = None) -> None:
    """Every pool: owner, shape, units by state, jobs waiting and the last day's utilisation."""
    answer = reads(settings(), owner).pools()
    if output is not Format.table:
        print_document(answer, output)
        return
    found = answer.get("pools") or []
    if not found:
        out.print("No pools.")
        return
    tables.show(out, tables.pools_sheet(found))


@pool_app.command("describe")
def describe(name: str, output: Output = Format.table, owner: Who = None) -> None:
    """Show a pool's settings, units, waiting jobs, chip-hours and utilisation over the last day.

    Chip-hours are busy (charged to the jobs that ran, in their own usage) and idle (the
    pool's own). Which jobs run and wait is shown to the pool's owner, its users and admins.
    """
    answer = reads(settings(), owner).pool(name)
    if answer is None:
        raise Stop(f"No pool {name!r}: `tpujobs pool list` shows them.")
    if output is not Format.table:
        print_document(answer, output)
        return
    width = out.width if out.is_terminal else tables.WIDE
    tables.show(out, tables.pool_tables(answer["pool"], datetime.now(timezone.utc), width=width))


@pool_app.command("resize")
def resize(
    name: str,
    count: Annotated[int, typer.Option(help="Units to hold from now on, 1 to 64.")],
    owner: Who = None,
    wait: Wait = True,
) -> None:
    """Hold COUNT units from now on (the pool's owner or an admin).

    New units are asked for at once; surplus ones (idle first) are released once no job runs on them.
    """
    config = settings()
    who = caller(owner)
    url = api_url()
    if url:
        answer = ask_api(config, url, {"action": "pool-resize", "name": name, "count": count}, who) or {}
        _resized(answer.get("pool") or {})
        return
    _must_exist(config, name, wanted=True)
    message_id = _publish(config, {"action": "pool-resize", "owner": who, "name": name, "count": count})
    out.print(f"Asked tpujobs-control to resize pool [bold]{shown(name)}[/bold] to {count} unit(s) as {shown(who)}.")
    if wait:
        _resized(_follow(config, message_id, name, lambda pool: pool is not None and pool.get("count") == count) or {})


def _resized(pool: dict[str, Any]) -> None:
    out.print(
        f"Pool [bold]{shown(pool.get('name'))}[/bold] holds {shown(pool.get('count'))} unit(s) from now on: "
        f"{shown(tables.unit_counts(pool.get('units') or []))}."
    )


@pool_app.command("delete")
def delete(name: str, owner: Who = None, wait: Wait = True) -> None:
    """Delete a pool (its owner or an admin): its jobs are cancelled and its units released.

    A job with `pool_fallback: provision` moves to capacity of its own instead of being cancelled.
    """
    config = settings()
    who = caller(owner)
    url = api_url()
    if url:
        answer = ask_api(config, url, {"action": "pool-delete", "name": name}, who) or {}
        _deleted(name, answer.get("pool"))
        return
    _must_exist(config, name, wanted=True)
    message_id = _publish(config, {"action": "pool-delete", "owner": who, "name": name})
    out.print(f"Asked tpujobs-control to delete pool [bold]{shown(name)}[/bold] as {shown(who)}.")
    if wait:
        _deleted(name, _follow(config, message_id, name, lambda pool: pool is None or pool.get("state") == "DELETING"))


def _deleted(name: str, pool: dict[str, Any] | None) -> None:
    if pool is None:
        out.print(f"Deleted pool [bold]{shown(name)}[/bold]: its capacity is released.")
    else:
        out.print(
            f"Pool [bold]{shown(name)}[/bold] is being deleted: its jobs are cancelled or moved, its units "
            "released as they free up."
        )


# --- without an API: tpujobs-control, followed in Firestore ------------------------------------


def _must_exist(config: Settings, name: str, *, wanted: bool) -> None:
    """Say at once what the topic could only say later: no such pool, or the name is taken."""
    found = StoreReads(config).pool(name)
    if wanted and found is None:
        raise Stop(f"No pool {name!r}: `tpujobs pool list` shows them.")
    if not wanted and found is not None:
        raise Stop(f"A pool named {name} already exists: `tpujobs pool describe {name}` shows it.")


def _publish(config: Settings, payload: dict[str, Any]) -> str:
    from tpujobs.adapters.pubsub import Publisher

    return Publisher.build(config.project, config.prefix).publish_json(CONTROL, payload)


def _follow(
    config: Settings, message_id: str, name: str, done: Callable[[dict[str, Any] | None], bool]
) -> dict[str, Any] | None:
    """Read the pool until `done(pool)` holds (the pool as the API shows it, None when there is
    none) and return it; Stop with the reason if the message was refused, or after a minute."""
    source = StoreReads(config)
    deadline = time.monotonic() + FOLLOW_SECONDS
    while time.monotonic() < deadline:
        answer = source.pool(name)
        pool = answer.get("pool") if answer is not None else None
        if done(pool):
            return pool
        refused = source.rejection(message_id)
        if refused is not None:
            raise Stop(f"Refused: {refused['reason']}")
        time.sleep(0.5)
    raise Stop(
        f"tpujobs-control did not act on message {message_id} within {FOLLOW_SECONDS:.0f} s: see "
        f"`tpujobs rejections` and `tpujobs pool describe {name}`."
    )
