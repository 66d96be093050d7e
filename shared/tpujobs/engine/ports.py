"""The small interfaces the service needs from the outside world.

Adapters in `tpujobs.adapters` implement them with Google's libraries, and `tpujobs.local.fakes`
in memory; `tests/contract` runs one suite against both, so a fake cannot drift.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol

from tpujobs.domain.access import AccessPolicies
from tpujobs.domain.admission import Holder
from tpujobs.domain.fair_share import Waiting
from tpujobs.domain.holdings import HoldingState
from tpujobs.domain.job import Job, JobEvent
from tpujobs.domain.pools import Pool
from tpujobs.domain.quotas import QuotaBook
from tpujobs.domain.shards import Placement, Shard
from tpujobs.domain.spec import JobSpec
from tpujobs.domain.teams import TeamBook
from tpujobs.domain.transitions import Decision, Ignored, Observation

Clock = Callable[[], datetime]


@dataclass(frozen=True)
class Rejection:
    """A message that could not be used: one document of `rejections`, id = its message id."""

    message_id: str
    at: datetime
    reason: str
    payload: str  # the first 4 KiB of the message, as text
    topic: str
    count: int = 1  # messages it stands for: more than 1 for forgeries counted, not each recorded


@dataclass(frozen=True)
class WorkerRecord:
    """The latest word from one worker host of one attempt (None: not reported this time)."""

    attempt: int
    worker: str  # "slice-worker"
    slice_id: int
    worker_id: int
    last_report_at: datetime
    started_at: datetime | None = None
    exited_at: datetime | None = None
    exit_code: int | None = None
    checkpoint_step: int | None = None
    checkpoint_at: datetime | None = None
    live: bool | None = None  # True while its command runs; the reconciler watches live ones
    last_output_at: datetime | None = None  # the command's last output line, as its heartbeat said
    # When the host is silent unless it reports again; only ever moved later (a late, reordered
    # report cannot bring it back). A host worker 0 speaks for gets SPOKEN_FOR: never.
    silent_after: datetime | None = None
    # Worker 0 whose command exited 0 while it still spoke for peers of its slice: its record
    # stays live (and watched for silence) until those peers end, since no one else hears them.
    speaks_for_peers: bool | None = None

    def fields(self) -> dict[str, object]:
        return {
            "attempt": self.attempt,
            "worker": self.worker,
            "slice_id": self.slice_id,
            "worker_id": self.worker_id,
            "last_report_at": self.last_report_at,
            "started_at": self.started_at,
            "exited_at": self.exited_at,
            "exit_code": self.exit_code,
            "checkpoint_step": self.checkpoint_step,
            "checkpoint_at": self.checkpoint_at,
            "live": self.live,
            "last_output_at": self.last_output_at,
            "silent_after": self.silent_after,
            "speaks_for_peers": self.speaks_for_peers,
        }


@dataclass(frozen=True)
class SilentWorker:
    """A live worker whose last report is older than the heartbeat timeout."""

    job_id: str
    attempt: int
    worker: str
    last_report_at: datetime
    after_its_exit: bool = False  # worker 0 that ended its command and still spoke for its peers


@dataclass(frozen=True)
class AttemptLogs:
    """Where one attempt's exported output is: `jobs/{id}/attempts/{N}` (`tpujobs.engine.output_export`)."""

    attempt: int
    log_uri: str  # gs:// URI of the combined, worker-prefixed log (attempt.log)
    worker_logs: Mapping[int, str]  # worker number K -> gs:// URI of worker-K.log
    exported_at: datetime
    cut_off_workers: tuple[int, ...] = ()  # workers whose output ends with the cut-off line

    def fields(self) -> dict[str, object]:
        return {
            "attempt": self.attempt,
            "log_uri": self.log_uri,
            # Firestore map keys are strings.
            "worker_logs": {str(k): uri for k, uri in sorted(self.worker_logs.items())},
            "exported_at": self.exported_at,
            "cut_off_workers": list(self.cut_off_workers),
        }


@dataclass(frozen=True)
class JobFilter:
    """What `list` narrows jobs to: every field given must match (labels: each of them)."""

    states: tuple[str, ...] = ()  # any of these states; empty: every state
    owner: str | None = None
    name_prefix: str | None = None  # the job's name starts with it
    labels: Mapping[str, str] = field(default_factory=dict)


class JobRecords(Protocol):
    """A job and its timeline: every change a compare-and-set on the job, its event in the same commit."""

    def create(self, job: Job, event: JobEvent) -> bool:
        """Create the job and its first event if the job id is new; False if it existed."""

    def get(self, job_id: str) -> Job | None: ...

    def apply(self, job_id: str, seen: Observation, clock: Clock) -> Decision | Ignored:
        """Decide and commit in one transaction: compare-and-set on the job, plus its event."""

    def record_checkpoint(self, job_id: str, attempt: int, at: datetime, step: int | None = None) -> bool:
        """Note a newer checkpoint of an attempt for its accounting; False when not newer."""

    def record_image_digest(self, job_id: str, attempt: int, digest: str) -> bool:
        """Note on the attempt's usage the image digest a host ran (`accounting.image_reported`);
        False when that changes nothing."""

    def record_all_started(self, job_id: str, attempt: int, at: datetime) -> bool:
        """Note on the attempt's usage that every host has reported, so the boot check is
        over for it; False when already noted (or the attempt is unknown)."""

    def events(self, job_id: str) -> list[JobEvent]: ...

    def mark_announced(self, job_id: str, event: JobEvent) -> None:
        """Record that the change was published on tpujobs-status."""

    def unannounced_events(self, before: datetime, page_size: int = 500) -> list[tuple[str, JobEvent]]:
        """(job_id, event) of changes committed before `before` and not yet announced."""


class WorkerRecords(Protocol):
    """The latest word of each worker host, kept apart from the job so heartbeats never contend with transitions."""

    def record_worker(self, job_id: str, worker: WorkerRecord) -> None: ...

    def attempt_workers(self, job_id: str, attempt: int) -> list[WorkerRecord]:
        """The latest word of each host of one attempt that ever reported (one document each)."""

    def attempt_workers_heard(self, job_id: str, attempt: int) -> int:
        """How many hosts of the attempt have a record (reported anything): a count, billed one read
        per 1,000 records counted."""

    def attempt_workers_succeeded(self, job_id: str, attempt: int) -> int:
        """How many hosts of the attempt exited 0, by their records: the job's success count."""

    def silent_workers(self, before: datetime, page_size: int = 500) -> list[SilentWorker]:
        """Live workers, of any job, whose `silent_after` deadline is earlier than `before` (now)."""

    def retire_worker(self, job_id: str, attempt: int, worker: str) -> None:
        """Stop watching a worker (its attempt is over)."""


class JobQueries(Protocol):
    """Reads over many jobs: listing, and the reconciler's paged, projected reads."""

    def list_jobs(
        self, state: str | None = None, owner: str | None = None, limit: int = 100, where: JobFilter | None = None
    ) -> list[Job]:
        """The newest jobs matching `state`, `owner` and `where`, at most `limit`."""

    def active_placements(self, page_size: int = 500) -> list[Placement]:
        """Where every job not yet ended is (its zone, the zones it may use, its warm-pool unit),
        and nothing else, page after page with no cap: the reconcile coordinator's read."""

    def active_in_shard(self, zone: str, after: str, through: str, page_size: int = 500) -> list[Job]:
        """The jobs not yet ended in `zone` whose ids are in (after, through] ("" an open end),
        page after page with no cap: one reconcile shard's read, what it compares.

        Projected: each job's spec lacks its env, secrets, setup, command, code and labels (the
        fields that grow with what a user writes), so a shard's memory grows with the number of
        its jobs, never with their size. Read the job (`get`) before requesting capacity.
        """

    def outlines(self, job_ids: Sequence[str], page_size: int = 500) -> list[Job]:
        """These jobs, projected like `active_in_shard`, read by id in batches; missing ones left out."""

    def ended_between(self, start: datetime, end: datetime, page_size: int = 500) -> list[Job]: ...


class Retention(Protocol):
    """What is deleted when its time is up."""

    def prune_expired_jobs(self, now: datetime, limit: int = 100) -> list[str]:
        """Delete up to `limit` ended jobs past their `expire_at`, each with its timeline, workers
        and attempts (Firestore's TTL would delete the document alone); the job ids deleted."""


class MessageRecords(Protocol):
    """Messages refused, and the signed reports seen (a replay is known by its digest)."""

    def reject(self, rejection: Rejection) -> None:
        """Record a rejection once per message id."""

    def remember_report(self, digest: str, message_id: str, job_id: str, attempt: int, now: datetime) -> str:
        """Remember a signed report by its digest; the id of the first message that carried it."""

    def recall_report(self, digest: str) -> str | None:
        """The id `remember_report` kept first for `digest`; None while none is remembered."""


class UnitSecretRecords(Protocol):
    """The SHA-256 of each warm-pool unit VM's secret, which its pool agent registers before any
    job runs (`unit_secrets/{digest}`, one per VM: instance id and creation time). Never expire."""

    def register_unit_secret(self, digest: str, secret_sha256: str, instance_id: str, now: datetime) -> str:
        """Keep the hash, create-only; the hash kept first for `digest` (`secret_sha256` if new)."""

    def unit_secret_sha256(self, digest: str) -> str | None:
        """The hash `register_unit_secret` kept for `digest`; None while the VM registered none."""

    def count_refused_unit_secret(self, digest: str, now: datetime) -> None:
        """One more registration with another hash was refused for `digest` (its `refused` count)."""


class AttemptLogStore(Protocol):
    """Where each attempt's exported output is."""

    def record_attempt_logs(self, job_id: str, logs: AttemptLogs) -> None:
        """Keep where an attempt's exported logs are (merged into `jobs/{id}/attempts/{N}`),
        and make the job's log_uri the combined log, unless it names a later attempt's."""

    def attempt_logs(self, job_id: str, attempt: int) -> AttemptLogs | None:
        """The attempt's exported logs, as recorded; None before its export."""


class JobStore(JobRecords, WorkerRecords, JobQueries, Retention, MessageRecords, AttemptLogStore, Protocol):
    """The whole job store: what a caller that needs every part of it takes."""


@dataclass(frozen=True)
class CapacityStatus:
    """What the capacity backend says about one holding (a job attempt's, or a warm-pool unit's),
    in the engine's words: each adapter maps its platform's states to `HoldingState` in one table
    (`domain.holdings` groups them by what they mean)."""

    name: str
    zone: str
    state: HoldingState
    detail: str = ""  # why, in Google's words: a FAILED holding's error, what a WAITING one waits on
    unhealthy_hosts: int = 0  # hosts that are lost (`adapters.tpu.NODE_STATES`, `adapters.compute_states`)
    job_label: str | None = None  # the `tpujobs-job` label: set on every resource tpujobs made for a job
    pool_label: str | None = None  # the `tpujobs-pool` label: set on every warm-pool unit's resource
    # (node, condition) of its nodes in a condition that is often transient: lost past the grace
    suspect_hosts: tuple[tuple[str, str], ...] = ()
    operation: str = ""  # from `request`: the create's long-running operation, if one was made
    # (host, window start) of its hosts with host maintenance scheduled (Compute Engine's
    # and the TPU API's v2alpha1 nodes' `upcomingMaintenance`; RFC 3339 as Google says it)
    maintenance: tuple[tuple[str, str], ...] = ()
    # WAITING because a REGION's quota is full (Compute Engine's QUOTA_EXCEEDED
    # "... in region us-east5"): zone failover skips that region's zones; "": not known to be
    quota_region: str = ""
    # When Google ends its VMs by their run duration (Compute Engine's earliest
    # `terminationTimestamp`, set once a VM with maxRunDuration runs; RFC 3339); "": never
    run_ends: str = ""


@dataclass(frozen=True)
class HostBoot:
    """What the hosts of one holding boot with, on any platform: the account they run as (never
    the Compute default) and their metadata (the startup script, the attempt's report key)."""

    service_account: str
    metadata: Mapping[str, str]


@dataclass(frozen=True)
class UnitRequest:
    """One warm-pool unit's slices to ask for: its name, zone, the pool's shape (a spec that says
    the accelerator, slices, capacity, reservation, runtime, image, account and VM options)
    and its labels (`tpujobs-pool`, `tpujobs-unit`)."""

    name: str
    zone: str
    spec: JobSpec
    labels: Mapping[str, str]


class Capacity(Protocol):
    """TPU slices asked for, watched and given back, whichever Google platform holds them.

    A holding is named (deterministically, so a retried request adopts what an earlier one got)
    and lives in a zone: a job attempt's slices, or a warm-pool unit's. `adapters.tpu` holds
    them as the TPU API's queued resources, `adapters.compute` as Compute Engine's MIGs, and
    `adapters.capacity_router` hands each call to the platform's own; each says its states as
    `HoldingState`. `local.fakes.capacity` holds them in memory.
    """

    def request(self, job: Job, boot: HostBoot) -> CapacityStatus:
        """Ask for the slices of the job's current attempt (named `job.queued_resource`), its
        hosts booting as `boot` says (`startup_script.host_boot`); an existing holding is adopted."""

    def request_unit(self, unit: UnitRequest, boot: HostBoot) -> CapacityStatus:
        """Ask for a warm-pool unit's slices, or adopt them, as `request` does for a job."""

    def status(self, zone: str, name: str) -> CapacityStatus | None:
        """What the holding `name` is now; None when it does not exist."""

    def create_error(self, operation: str) -> str | None:
        """What a request's long-running operation said if it failed; None while it runs, once
        it succeeded, or when the backend no longer knows it."""

    def release(self, zone: str, name: str) -> None:
        """Give the holding and its hosts back (forced); absent is fine."""

    def list_capacity(self, zone: str) -> Sequence[CapacityStatus]:
        """Every holding of the zone, with the health of its hosts (`unhealthy_hosts`, `suspect_hosts`)."""

    def tell_hosts(self, zone: str, name: str, slices: int, metadata: Mapping[str, str]) -> None:
        """Tell every host of the holding these keys (its metadata: TPU nodes' or Compute Engine
        VMs'), keeping every other key (`ssh-keys` above all): how a unit's agents learn their
        assignment and a running attempt's hosts that they are to stop. TransientError while a
        write is not confirmed yet: the unit stays untold, and is told again."""


@dataclass(frozen=True)
class StatusChange:
    """One state change of a job, as announced on `tpujobs-status` for anyone to subscribe."""

    job_id: str
    owner: str
    from_state: str | None
    to_state: str
    reason: str
    attempt: int
    at: datetime
    seq: int  # the event's place in the job's timeline: subscribers can order by it

    def payload(self) -> dict[str, object]:
        return {
            "job_id": self.job_id,
            "from_state": self.from_state,
            "to_state": self.to_state,
            "reason": self.reason,
            "attempt": self.attempt,
            "owner": self.owner,
            "at": self.at.isoformat(timespec="milliseconds"),
            "seq": self.seq,
        }


class ReconcileShards(Protocol):
    def publish_shards(self, shards: Sequence[Shard]) -> None:
        """Hand each shard of a reconcile tick to its own invocation (tpujobs-reconcile)."""


class LogExportRequests(Protocol):
    def request_export(self, job_id: str, attempt: int) -> None:
        """Ask for an ended attempt's output to be exported (tpujobs-log-export)."""


class CapacityHandoff(Protocol):
    """Capacity work handed to the `converge` function (tpujobs-converge), by a job's id or a pool's
    name only: the handler reads what is stored and converges it, as the reconciler does. What an
    engine without capacity of its own (the jobs API's) does after each commit."""

    def hand_off_job(self, job_id: str) -> None:
        """Ask for the job to be converged: its capacity requested, released or handed on."""

    def hand_off_pool(self, name: str) -> None:
        """Ask for the warm pool to be converged: its units requested or settled, its jobs moved."""


@dataclass(frozen=True)
class PoolView:
    """A pool's holders as read, and the version a change must find unchanged."""

    pool: str
    holders: tuple[Holder, ...]
    version: object  # the store's own version of the pool (Firestore: its update time); None: not yet stored


class Pools(Protocol):
    """Quotas and who holds the chips of each limited pool (`tpujobs.domain.admission`)."""

    def quotas(self) -> QuotaBook:
        """`config/quotas` as read now (`tpujobs.domain.quotas`)."""

    def set_quota(self, location: str, family: str, tier: str, chips: int | None) -> None:
        """Set (None: remove) one limit: a zone's or a region's chips of a family and tier."""

    def set_reservation(self, name: str, chips: int | None) -> None:
        """Set (None: remove) a named reservation's chips."""

    def view(self, pool: str) -> PoolView: ...

    def change(self, seen: PoolView, add: Holder | Sequence[Holder] = (), remove: frozenset[str] = frozenset()) -> bool:
        """Compare-and-set of the pool's holders; False when it changed since `seen`."""

    def queue(self, pool: str, limit: int = 10) -> list[Job]: ...

    def waiting(self, pool: str) -> list[Waiting]:
        """Every QUEUED job of the pool, unordered (`domain.fair_share` orders them)."""

    def pools(self) -> list[str]: ...

    def active_in(self, pool: str) -> list[Job]: ...


class Teams(Protocol):
    """`config/teams`: who is in which team, and each team's shares of the quota limits (`tpujobs.domain.teams`)."""

    def teams(self) -> TeamBook:
        """`config/teams` as read now, its problems checked against `config/quotas`."""

    def edit_team(self, name: str, edit: Callable[[dict[str, object]], dict[str, object]]) -> None:
        """Rewrite team `name` by `edit(document)`, by compare-and-set: an edit in between is kept."""


class WarmPoolStore(Protocol):
    """Warm pools (`pools/{name}`): every change a compare-and-set on the pool's document."""

    def get(self, name: str) -> Pool | None: ...

    def create(self, pool: Pool) -> bool:
        """Write a new pool; False when the name is taken."""

    def update(self, name: str, change: Callable[[Pool], Pool | None]) -> tuple[Pool, Pool] | None:
        """Apply `change` to a fresh read until the write commits: (before, after); None when the
        pool does not exist; `change` returning None (or the same pool) writes nothing."""

    def delete(self, seen: Pool) -> bool:
        """Delete the pool if it is still as `seen`; False when it changed since."""

    def list_pools(self) -> list[Pool]: ...

    def queue(self, name: str, limit: int = 10) -> list[Job]:
        """The QUEUED jobs waiting for the pool, in its order: priority, then submission."""

    def jobs_on(self, name: str) -> list[Job]:
        """Every job not ended that runs on, or waits for, the pool."""


class AccessPolicyReader(Protocol):
    def policies(self) -> AccessPolicies:
        """What admins allowed: config/policies, config/groups, config/service_accounts."""


class StatusPublisher(Protocol):
    def announce(self, change: StatusChange) -> None:
        """Publish one state change; TransientError when it could not be sent."""


# --- the `jobs` HTTP API's reads (`tpujobs.engine.api`) -------------------------------------------

Document = dict[str, object]  # a stored document as JSON-like data: what the API shows


class JobDocuments(JobStore, Protocol):
    """The job store, and its documents as stored: what `describe` and `list` show."""

    def job_document(self, job: Job) -> Document:
        """The job as its stored document reads (flat fields, real timestamps)."""

    def event_documents(self, job_id: str) -> list[Document]:
        """The job's timeline as stored, in order, each with its `id`."""

    def attempt_documents(self, job_id: str) -> list[Document]:
        """`jobs/{id}/attempts/{N}` as stored, by attempt, each with its `id`."""

    def notification_documents(self, job_id: str) -> list[Document]:
        """`jobs/{id}/notifications/{key}`: what became of each notify target, by key, each with its `id`."""

    def recent_rejections(self, limit: int = 50) -> list[Rejection]:
        """The newest rejections first (`tpujobs rejections`)."""

    def rejection(self, message_id: str) -> Rejection | None:
        """The rejection of one message, if it was refused (`tpujobs submit --wait`)."""

    def relabel(
        self, job_id: str, put: Mapping[str, str], remove: Sequence[str], by: str, clock: Clock
    ) -> Decision | Ignored:
        """Set and remove labels, with a timeline entry naming `by` (`domain.labels.relabeled`)."""


# --- dead letters (`tpujobs.engine.dead_letters`) --------------------------------------------------


@dataclass(frozen=True)
class DeadLetter:
    """One message that failed too many deliveries, as `dead_letters/{message_id}` holds it."""

    message_id: str  # of the dead-lettered copy (Pub/Sub gives it a new one)
    at: datetime  # when it was recorded
    topic: str  # the original topic's base name, without prefix; "" when unknown
    subscription: str  # projects/P/subscriptions/S that gave up on it; "" when unknown
    delivery_attempts: int | None
    payload: str  # the data as text, first 4 KiB, bytes that are not UTF-8 escaped
    attributes: Mapping[str, str] = field(default_factory=dict)  # the original ones
    data: bytes | None = None  # the exact original bytes, when kept (see MAX_KEPT_DATA_BYTES)
    size: int | None = None  # of the original data, in bytes
    published_at: datetime | None = None  # when the original was published
    replayed_at: datetime | None = None
    replay_message_id: str | None = None
    note: str = ""  # what could not be kept, if anything
    attributes_json: str | None = None  # the attributes, when the store refused them as a map

    def original_attributes(self) -> dict[str, str]:
        """The attributes to publish again: exactly those the original message had."""
        if self.attributes_json is not None:
            return {str(k): str(v) for k, v in json.loads(self.attributes_json).items()}
        return dict(self.attributes)

    def to_document(self) -> dict[str, object]:
        """Every field, flat: what `dead_letters/{message_id}` holds, and the API shows (less `data`)."""
        return {
            "message_id": self.message_id,
            "at": self.at,
            "topic": self.topic,
            "subscription": self.subscription,
            "delivery_attempts": self.delivery_attempts,
            "payload": self.payload,
            "attributes": dict(self.attributes),
            "size": self.size,
            "published_at": self.published_at,
            "replayed_at": self.replayed_at,
            "replay_message_id": self.replay_message_id,
            "note": self.note,
            "attributes_json": self.attributes_json,
            "data": self.data,
        }


class DeadLetterStore(Protocol):
    """Where dead letters are kept; PermanentError when the store refuses a record as it is."""

    def add(self, letter: DeadLetter) -> bool:
        """Create the record; False when this very message is already recorded (its replay kept)."""

    def get(self, message_id: str) -> DeadLetter | None: ...

    def list_dead_letters(self, topic: str | None = None, limit: int = 50) -> list[DeadLetter]:
        """Newest first; only those of one topic (its base name, no prefix) when given."""

    def mark_replayed(self, message_id: str, at: datetime, replay_message_id: str) -> None: ...


class Republisher(Protocol):
    def publish(self, base_topic: str, data: bytes, attributes: Mapping[str, str]) -> str:
        """Publish these bytes and attributes as they are to a contract topic; the new message id."""


# --- exported logs (`tpujobs.engine.output_export`) --------------------------------------------------


@dataclass(frozen=True)
class StoredObject:
    """One object of a bucket, as listed."""

    name: str
    updated: datetime | None


class OutputBucket(Protocol):
    """The logs bucket: chunks the agents upload, and the logs exported from them."""

    def uri(self, name: str) -> str:
        """The object's gs:// URI."""

    def list_objects(self, prefix: str) -> list[StoredObject]: ...

    def read(self, name: str) -> bytes | None:
        """The object's bytes; None when there is no such object."""

    def read_all(self, names: Sequence[str]) -> list[bytes | None]:
        """Each object's bytes, in the order named (downloaded side by side); None for a missing one."""

    def read_each(self, names: Sequence[str]) -> Iterator[bytes | None]:
        """Each object's bytes in the order named, read as asked for (a few ahead), so the
        caller holds a few objects, never all; None for a missing one."""

    def write_stream_if_changed(self, name: str, stream: Callable[[], Iterable[bytes]], content_type: str) -> bool:
        """Upload the bytes `stream()` makes unless the object already holds exactly them; whether
        it uploaded. `stream()` is called once to hash them and once to upload them (a streaming
        upload): the object is never held whole in memory."""

    def mark_used(self, name: str, at: datetime) -> bool:
        """Move the object's custom time forward to `at` (lifecycle rules count from it); whether
        it moved. False for a missing object."""
