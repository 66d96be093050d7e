"""Warm pools: capacity held under a name, and the jobs that run on it one after another.

A pool holds `count` units, each one queued resource whose VMs run the agent in pool mode, waiting for an
assignment. Everything here is pure: a `Pool` is an immutable value, each change returns a new one, and
`now` is passed in; the services (`tpujobs.engine.warm_pools`) write it back as a compare-and-set, and the
pool document is the one place that says which job a unit runs. A pool is one trust domain: only those
`may_use` admits run jobs on it. See docs/pools.md.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from enum import Enum
from typing import Any, Literal

from tpujobs.domain.accelerators import parse_accelerator_type
from tpujobs.domain.naming import unit_queued_resource_name
from tpujobs.domain.platforms import default_platform
from tpujobs.domain.spec import POOL_NAME_PATTERN, JobSpec, SpecError, parse_spec

MAX_UNITS = 64  # per pool: a pool is one Firestore document, written at every assignment
RECENT_WINDOW = timedelta(days=1)  # how far back `recent` keeps closed stretches: utilisation over a day
MAX_RECENT = 500  # closed stretches kept, newest last (a pool of short jobs fills it fastest)


class PoolState(str, Enum):
    """Where a pool is in its life. The value is the document's `state`."""

    ACTIVE = "ACTIVE"
    """Holding and healing its units; jobs run on it."""
    DELETING = "DELETING"
    """`pool delete` asked: its jobs are cancelled (or moved, `pool_fallback: provision`), its
    units released; the document goes once no unit is left."""


class UnitState(str, Enum):
    """Where one unit is. The value is the unit's `state` in the pool document."""

    WAITING_FOR_QUOTA = "WAITING_FOR_QUOTA"
    """Its chips do not fit the admission quota yet: nothing is requested; asked again every tick."""
    REQUESTED = "REQUESTED"
    """The queued resource of its current generation is asked for and not ACTIVE yet."""
    IDLE = "IDLE"
    """ACTIVE, its agents waiting, no job: the head of the pool's queue takes it."""
    BUSY = "BUSY"
    """One job's attempt is assigned to it (`job_id`, `attempt`)."""
    RELEASED = "RELEASED"
    """Holds nothing: it was idle past `idle_minutes`. Asked for again when a job needs it."""


HELD = frozenset({UnitState.IDLE, UnitState.BUSY})
"""Unit states whose capacity is ACTIVE and paid for: idle or busy chip time."""
QUOTA_HELD = frozenset({UnitState.REQUESTED, UnitState.IDLE, UnitState.BUSY})
"""Unit states that hold chips of the admission quota (a request counts, as a job's does)."""


@dataclass(frozen=True)
class Unit:
    """One unit of a pool, as its entry in the pool document's `units`."""

    index: int
    state: UnitState
    generation: int  # its queued resource is `{pool}-u{index}-g{generation}`; +1 at every new request
    zone: str
    since: datetime  # when it entered its state
    capacity_state: str | None = None  # its holding's state (`domain.holdings`), as last seen
    job_id: str | None = None  # BUSY: the job whose attempt runs on it
    attempt: int | None = None
    seq: int = 0  # its assignment counter: +1 at every change of what it should run
    written: bool = True  # its node metadata says what `seq` says (the agents were told)
    held_since: datetime | None = None  # ACTIVE since: idle and busy time count from here
    requested_at: datetime | None = None  # when the current generation was asked for
    removing: bool = False  # resized away, or the pool is being deleted: goes once no job is on it
    platform: str = "tpu-api"  # its pool's: where its capacity is held, which its holding's name says

    def queued_resource(self, pool: str) -> str:
        """What holds its capacity: `domain.naming` names it by pool, index, generation and platform."""
        return unit_queued_resource_name(pool, self.index, self.generation, self.platform)

    def runs(self, job_id: str, attempt: int) -> bool:
        return self.state is UnitState.BUSY and self.job_id == job_id and self.attempt == attempt


StretchKind = Literal["busy", "idle"]


@dataclass(frozen=True)
class Stretch:
    """A closed stretch of one unit's held capacity: busy with a job, or idle."""

    unit: int
    kind: StretchKind
    start: datetime
    end: datetime
    chips: int
    job_id: str | None = None

    def chip_hours(self, since: datetime | None = None) -> float:
        start = max(self.start, since) if since is not None else self.start
        return max(0.0, (self.end - start).total_seconds()) * self.chips / 3600.0


@dataclass(frozen=True)
class Pool:
    """A pool as stored in `pools/{name}`."""

    name: str
    owner: str
    accelerator_type: str
    slices: int
    count: int  # units wanted
    capacity: str  # on-demand, spot or reserved
    zones: tuple[str, ...]  # where units are asked for, in order: the first, then the next after a long wait
    created_at: datetime
    updated_at: datetime
    reservation: str | None = None
    image: str | None = None  # the image units pull at boot, and jobs without one of their own run in
    idle_minutes: int | None = None  # a unit idle this long is released; None: kept while the pool lives
    service_account: str | None = None  # what its VMs run as (None: the deployment's account)
    users: tuple[str, ...] = ()  # besides the owner and admins, who may run jobs on it (e-mail or group:NAME)
    platform: str = "tpu-api"  # where its units are held (`domain.platforms`): older documents, the TPU API
    # False: made on tpujobs-control, whose owner is a claim. True for the jobs API's, and for a
    # document older than the field: only a claim-made pool may be resized or deleted by a claim.
    owner_verified: bool = True
    state: PoolState = PoolState.ACTIVE
    reason: str = ""  # the last thing that happened to it, as a sentence
    units: tuple[Unit, ...] = ()
    busy_chip_hours: float = 0.0  # closed busy stretches since the pool was made (charged to the jobs)
    idle_chip_hours: float = 0.0  # closed idle stretches since the pool was made (charged to the pool)
    recent: tuple[Stretch, ...] = ()  # closed stretches of the last day, oldest first
    version: Any = None  # the document's update time as read: the compare-and-set's condition

    @property
    def chips_per_unit(self) -> int:
        return parse_accelerator_type(self.accelerator_type).chips * self.slices

    def unit(self, index: int) -> Unit | None:
        return next((u for u in self.units if u.index == index), None)

    def unit_of(self, job_id: str, attempt: int | None = None) -> Unit | None:
        """The unit the job (that attempt, if given) is assigned to, if any."""
        return next(
            (
                u
                for u in self.units
                if u.state is UnitState.BUSY and u.job_id == job_id and (attempt is None or u.attempt == attempt)
            ),
            None,
        )

    def free_unit(self) -> Unit | None:
        """The idle unit the next job takes: the lowest index not being removed."""
        return next((u for u in self.units if u.state is UnitState.IDLE and not u.removing), None)

    def sleeping_unit(self) -> Unit | None:
        """A released unit a waiting job may wake (ask for again)."""
        return next((u for u in self.units if u.state is UnitState.RELEASED and not u.removing), None)

    def shape(self) -> JobSpec:
        """What its units are asked for as: a spec of the pool's accelerator, slices, capacity,
        zones, image and account (the deployment's VM defaults are added by the service)."""
        fields: dict[str, Any] = {
            "job_id": self.name,
            "name": self.name,
            "owner": self.owner,
            "command": "tpujobs pool unit",  # a shape has no command of its own: the pool's jobs bring theirs
            "accelerator_type": self.accelerator_type,
            "slices": self.slices,
            "capacity": self.capacity,
            "zones": list(self.zones),
            "platform": self.platform,
        }
        for key in ("reservation", "image", "service_account"):
            if getattr(self, key) is not None:
                fields[key] = getattr(self, key)
        return parse_spec(fields)


def settings_of(pool: Pool) -> dict[str, Any]:
    """The pool's settings and state as plain fields: what its document and its API answer share."""
    return {
        "name": pool.name,
        "owner": pool.owner,
        "users": list(pool.users),
        "owner_verified": pool.owner_verified,
        "state": pool.state.value,
        "reason": pool.reason,
        "accelerator_type": pool.accelerator_type,
        "slices": pool.slices,
        "chips_per_unit": pool.chips_per_unit,
        "count": pool.count,
        "capacity": pool.capacity,
        "reservation": pool.reservation,
        "zones": list(pool.zones),
        "image": pool.image,
        "idle_minutes": pool.idle_minutes,
        "service_account": pool.service_account,
        "platform": pool.platform,
        "created_at": pool.created_at,
    }


class PoolError(ValueError):
    """A pool request or change that cannot be honoured; the message is the sentence to show."""


# -- making and changing a pool --------------------------------------------------------------


@dataclass(frozen=True)
class PoolRequest:
    """`tpujobs pool create` as data, checked by `parse_pool_request`."""

    name: str
    owner: str
    accelerator_type: str
    slices: int = 1
    count: int = 1
    capacity: str = "on-demand"
    reservation: str | None = None
    zones: tuple[str, ...] = ()
    image: str | None = None
    idle_minutes: int | None = None
    service_account: str | None = None
    users: tuple[str, ...] = field(default_factory=tuple)
    platform: str = "tpu-api"  # as the shape decided it, with the deployment's default (`with_deployment_defaults`)


POOL_REQUEST_FIELDS = frozenset(
    {
        "name",
        "owner",
        "accelerator_type",
        "slices",
        "count",
        "capacity",
        "reservation",
        "zone",
        "zones",
        "image",
        "idle_minutes",
        "service_account",
        "users",
        "platform",
    }
)


def parse_pool_request(data: dict[str, Any], default_zone: str) -> tuple[PoolRequest, JobSpec]:
    """A pool request from a message or an API body, and the shape its units are asked for as
    (a spec, checked by the same rules as a job's: accelerator, zones, capacity, reservation,
    image, account). PoolError with one sentence when it is not valid."""
    unknown = sorted(set(data) - POOL_REQUEST_FIELDS)
    if unknown:
        raise PoolError(f"unknown pool field {unknown[0]!r}; a pool takes {', '.join(sorted(POOL_REQUEST_FIELDS))}")
    count = data.get("count", 1)
    if not isinstance(count, int) or isinstance(count, bool) or not 1 <= count <= MAX_UNITS:
        raise PoolError(f"count must be a whole number from 1 to {MAX_UNITS}, got {count!r}")
    idle = data.get("idle_minutes")
    if idle is not None and (not isinstance(idle, int) or isinstance(idle, bool) or not 1 <= idle <= 7 * 24 * 60):
        raise PoolError(f"idle_minutes must be a whole number of minutes from 1 to 10080, got {idle!r}")
    users = data.get("users") or []
    if not isinstance(users, list) or not all(isinstance(u, str) and u for u in users) or len(users) > 50:
        raise PoolError("users must be a list of at most 50 e-mail addresses or group:NAME entries")
    name = data.get("name")
    if not isinstance(name, str) or not re.fullmatch(POOL_NAME_PATTERN, name):
        raise PoolError(
            f"pool name {name!r} must be 2 to 40 lowercase letters, digits or hyphens, starting with a letter "
            "and not ending with a hyphen"
        )
    fields: dict[str, Any] = {
        "name": name,
        "job_id": name,
        "owner": data.get("owner"),
        "command": "tpujobs pool unit",  # a shape has no command of its own: the pool's jobs bring theirs
        **{key: data[key] for key in ("accelerator_type", "slices", "capacity", "reservation", "zone", "zones",
                                      "image", "service_account", "platform") if data.get(key) is not None},
    }  # fmt: skip
    try:
        shape = parse_spec(fields)
    except SpecError as error:
        raise PoolError(str(error).replace("job spec", "pool")) from None
    zones = shape.preferred_zones or (default_zone,)
    request = PoolRequest(
        name=name,
        owner=shape.owner,
        accelerator_type=shape.accelerator_type,
        slices=shape.slices,
        count=count,
        capacity=shape.capacity,
        reservation=shape.reservation,
        zones=tuple(zones),
        image=shape.image,
        idle_minutes=idle,
        service_account=shape.service_account,
        users=tuple(users),
        # The service decides a generation both serve by the deployment's default (`with_deployment_defaults`).
        platform=shape.platform or default_platform(shape.accelerator_type),
    )
    return request, shape


def new_pool(request: PoolRequest, now: datetime, *, owner_verified: bool = True) -> Pool:
    """The pool a valid request becomes: every unit waits for quota until the service asks for it.
    `owner_verified`: the jobs API proved its owner (false: a claim on tpujobs-control)."""
    units = tuple(
        Unit(i, UnitState.WAITING_FOR_QUOTA, 1, request.zones[0], now, written=False, platform=request.platform)
        for i in range(request.count)
    )
    return Pool(
        name=request.name,
        owner=request.owner,
        accelerator_type=request.accelerator_type,
        slices=request.slices,
        count=request.count,
        capacity=request.capacity,
        zones=request.zones,
        created_at=now,
        updated_at=now,
        reservation=request.reservation,
        image=request.image,
        idle_minutes=request.idle_minutes,
        service_account=request.service_account,
        users=request.users,
        platform=request.platform,
        owner_verified=owner_verified,
        reason=f"Created by {request.owner}: {request.count} x {request.slices} x {request.accelerator_type}.",
        units=units,
    )


def _with_unit(pool: Pool, unit: Unit, now: datetime, reason: str = "") -> Pool:
    units = tuple(unit if u.index == unit.index else u for u in pool.units)
    return replace(pool, units=units, updated_at=now, reason=reason or pool.reason)


def _closed(pool: Pool, unit: Unit, now: datetime) -> Pool:
    """The pool with the unit's current held stretch (busy or idle) closed at `now` and counted."""
    if unit.state not in HELD or unit.held_since is None:
        return pool
    start = max(unit.since, unit.held_since)
    if now <= start:
        return pool
    kind: StretchKind = "busy" if unit.state is UnitState.BUSY else "idle"
    stretch = Stretch(unit.index, kind, start, now, pool.chips_per_unit, unit.job_id)
    recent = tuple(s for s in (*pool.recent, stretch) if s.end > now - RECENT_WINDOW)[-MAX_RECENT:]
    hours = stretch.chip_hours()
    if kind == "busy":
        return replace(pool, recent=recent, busy_chip_hours=round(pool.busy_chip_hours + hours, 6))
    return replace(pool, recent=recent, idle_chip_hours=round(pool.idle_chip_hours + hours, 6))


def requested(pool: Pool, index: int, now: datetime, zone: str | None = None) -> Pool:
    """The unit's capacity is asked for: a new generation unless this one was never asked for."""
    unit = _must(pool, index)
    pool = _closed(pool, unit, now)
    fresh = unit.state is UnitState.WAITING_FOR_QUOTA and unit.requested_at is None
    generation = unit.generation if fresh else unit.generation + 1
    changed = replace(
        unit,
        state=UnitState.REQUESTED,
        generation=generation,
        zone=zone or unit.zone,
        since=now,
        capacity_state=None,
        job_id=None,
        attempt=None,
        seq=unit.seq + 1,
        written=True,  # the new VMs boot with the idle assignment of this seq in their metadata
        held_since=None,
        requested_at=now,
    )
    return _with_unit(pool, changed, now, f"Unit {index} asked for as {changed.queued_resource(pool.name)}.")


def waiting_for_quota(pool: Pool, index: int, now: datetime, why: str) -> Pool:
    """No quota room for the unit now: it holds and asks for nothing until there is."""
    unit = _must(pool, index)
    pool = _closed(pool, unit, now)
    changed = replace(
        unit, state=UnitState.WAITING_FOR_QUOTA, since=now, job_id=None, attempt=None, held_since=None, written=True
    )
    return _with_unit(pool, changed, now, why)


def active(pool: Pool, index: int, now: datetime) -> Pool:
    """The unit's queued resource is ACTIVE: idle, ready for the next job."""
    unit = _must(pool, index)
    if unit.state is not UnitState.REQUESTED:
        return pool
    changed = replace(unit, state=UnitState.IDLE, since=now, capacity_state="ACTIVE", held_since=now)
    return _with_unit(pool, changed, now, f"Unit {index} is ready ({unit.queued_resource(pool.name)} is ACTIVE).")


def assigned(pool: Pool, index: int, job_id: str, attempt: int, now: datetime) -> Pool:
    """An idle unit takes a job's attempt; the agents are told next (`written` false until then)."""
    unit = _must(pool, index)
    if unit.state is not UnitState.IDLE:
        raise PoolError(f"unit {index} of pool {pool.name} is {unit.state.value}, not IDLE")
    pool = _closed(pool, unit, now)
    changed = replace(unit, state=UnitState.BUSY, since=now, job_id=job_id, attempt=attempt, seq=unit.seq + 1,
                      written=False)  # fmt: skip
    return _with_unit(pool, changed, now, f"Unit {index} runs {job_id} (attempt {attempt}).")


def freed(pool: Pool, index: int, now: datetime, why: str = "") -> Pool:
    """The job is off the unit (it ended, or moved on): idle again, and the agents are told to
    stop whatever still runs; a unit being removed is released instead (`released`)."""
    unit = _must(pool, index)
    if unit.state is not UnitState.BUSY:
        return pool
    pool = _closed(pool, unit, now)
    changed = replace(unit, state=UnitState.IDLE, since=now, job_id=None, attempt=None, seq=unit.seq + 1, written=False)
    return _with_unit(pool, changed, now, why or f"Unit {index} is free again ({unit.job_id} left it).")


def lost(pool: Pool, index: int, now: datetime, why: str) -> Pool:
    """The unit's capacity is gone (preempted, failed, a host lost): it is asked for again at once,
    as a new generation; the job that was on it recovers by its own rules."""
    unit = _must(pool, index)
    return requested(pool, index, now) if not unit.removing else released(pool, index, now, why)


def released(pool: Pool, index: int, now: datetime, why: str) -> Pool:
    """The unit gives its capacity back: RELEASED, or gone from the pool when it is being removed."""
    unit = _must(pool, index)
    pool = _closed(pool, unit, now)
    if unit.removing:
        units = tuple(u for u in pool.units if u.index != index)
        return replace(pool, units=units, updated_at=now, reason=why)
    changed = replace(unit, state=UnitState.RELEASED, since=now, job_id=None, attempt=None, held_since=None,
                      capacity_state=None, written=True)  # fmt: skip
    return _with_unit(pool, changed, now, why)


def marked_written(pool: Pool, index: int, seq: int) -> Pool:
    """The agents were told what assignment `seq` says."""
    unit = _must(pool, index)
    if unit.seq != seq or unit.written:
        return pool
    return replace(pool, units=tuple(replace(u, written=True) if u.index == index else u for u in pool.units))


def seen_capacity(pool: Pool, index: int, capacity_state: str) -> Pool:
    """Mirror the unit's queued-resource state (for the console and `pool describe`)."""
    unit = _must(pool, index)
    if unit.capacity_state == capacity_state:
        return pool
    return replace(pool, units=tuple(replace(u, capacity_state=capacity_state) if u.index == index else u
                                     for u in pool.units))  # fmt: skip


def resized(pool: Pool, count: int, now: datetime) -> Pool:
    """Ask for `count` units: new ones wait for quota (the service asks for them); the surplus,
    highest index first, is marked for removal and goes once no job is on it."""
    if not 1 <= count <= MAX_UNITS:
        raise PoolError(f"count must be from 1 to {MAX_UNITS}, got {count}")
    keep = sorted(u.index for u in pool.units if not u.removing)
    units = list(pool.units)
    if count > len(keep):
        taken = {u.index for u in pool.units}
        free = [i for i in range(MAX_UNITS * 2) if i not in taken][: count - len(keep)]
        units += [
            Unit(i, UnitState.WAITING_FOR_QUOTA, 1, pool.zones[0], now, written=False, platform=pool.platform)
            for i in free
        ]
    else:
        # Idle and released units go before busy ones, then the highest index.
        order = sorted(
            (u for u in pool.units if not u.removing),
            key=lambda u: (u.state is UnitState.BUSY, -u.index),
        )
        going = {u.index for u in order[: len(keep) - count]}
        units = [replace(u, removing=True) if u.index in going else u for u in units]
    reason = f"Resized to {count} unit(s)."
    return replace(pool, count=count, units=tuple(sorted(units, key=lambda u: u.index)), updated_at=now, reason=reason)


def deleting(pool: Pool, now: datetime, by: str) -> Pool:
    """`pool delete`: every unit goes once no job is on it; the document goes with the last."""
    units = tuple(replace(u, removing=True) for u in pool.units)
    return replace(pool, state=PoolState.DELETING, units=units, updated_at=now, reason=f"Deleted by {by}.")


def idle_too_long(pool: Pool, now: datetime) -> list[Unit]:
    """Idle units past the pool's `idle_minutes`: released, to be asked for again on demand."""
    if pool.idle_minutes is None:
        return []
    limit = timedelta(minutes=pool.idle_minutes)
    return [u for u in pool.units if u.state is UnitState.IDLE and now - u.since >= limit]


def _must(pool: Pool, index: int) -> Unit:
    unit = pool.unit(index)
    if unit is None:
        raise PoolError(f"pool {pool.name} has no unit {index}")
    return unit


# -- who may do what ---------------------------------------------------------------------------


def may_use(pool: Pool, owner: str, admins: frozenset[str] | tuple[str, ...], members: frozenset[str]) -> bool:
    """Whether a job of `owner` (whose e-mail and groups are `members`) may run on the pool."""
    return owner == pool.owner or owner in admins or bool(members & set(pool.users))


def may_manage(pool: Pool, caller: str, admins: frozenset[str] | tuple[str, ...]) -> bool:
    """Resize or delete: the pool's owner or an admin."""
    return bool(caller) and (caller == pool.owner or caller in admins)


def misfit(spec: JobSpec, pool: Pool) -> str | None:
    """Why a job cannot run on the pool's units (its shape, account or VM options differ), or None."""
    if spec.accelerator_type != pool.accelerator_type or spec.slices != pool.slices:
        return (
            f"pool {pool.name} has units of {pool.slices} x {pool.accelerator_type}; the job asks for "
            f"{spec.slices} x {spec.accelerator_type}"
        )
    if spec.service_account != pool.service_account:
        runs_as = pool.service_account or "the deployment's account"
        return f"pool {pool.name} runs as {runs_as}; the job asks for {spec.service_account or 'the default account'}"
    vm_options = {
        "topology": spec.topology,
        "network": spec.network,
        "subnetwork": spec.subnetwork,
        "internal_ips": spec.internal_ips or None,
        "tags": spec.tags or None,
        "data_disks": spec.data_disks or None,
    }
    asked = sorted(name for name, value in vm_options.items() if value)
    if asked:
        return f"the job sets {', '.join(asked)}, but a pool's VMs are the pool's own: leave them out"
    return None


# -- accounting --------------------------------------------------------------------------------


@dataclass(frozen=True)
class PoolUsage:
    """A pool's chip-hours over a window: busy (the jobs', charged in their own usage) and idle."""

    busy_chip_hours: float
    idle_chip_hours: float

    @property
    def utilisation(self) -> float | None:
        held = self.busy_chip_hours + self.idle_chip_hours
        return None if held <= 0 else self.busy_chip_hours / held


def _open_stretches(pool: Pool, now: datetime) -> list[Stretch]:
    """The stretch each held unit is in now, as if it closed at `now`."""
    return [
        Stretch(u.index, "busy" if u.state is UnitState.BUSY else "idle", max(u.since, u.held_since), now,
                pool.chips_per_unit, u.job_id)
        for u in pool.units
        if u.state in HELD and u.held_since is not None and now > max(u.since, u.held_since)
    ]  # fmt: skip


def _summed(stretches: list[Stretch], since: datetime | None = None) -> PoolUsage:
    busy = sum(s.chip_hours(since) for s in stretches if s.kind == "busy" and (since is None or s.end > since))
    idle = sum(s.chip_hours(since) for s in stretches if s.kind == "idle" and (since is None or s.end > since))
    return PoolUsage(busy, idle)


def usage_since(pool: Pool, since: datetime, now: datetime) -> PoolUsage:
    """Busy and idle chip-hours between `since` (at most a day back) and `now`."""
    return _summed([*pool.recent, *_open_stretches(pool, now)], since)


def total_usage(pool: Pool, now: datetime) -> PoolUsage:
    """Since the pool was made: the closed totals plus the stretches open now."""
    open_now = _summed(_open_stretches(pool, now))
    return PoolUsage(pool.busy_chip_hours + open_now.busy_chip_hours, pool.idle_chip_hours + open_now.idle_chip_hours)
