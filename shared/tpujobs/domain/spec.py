"""The job spec: what a user submits, validated once at the door.

Every rule of a spec's fields (types, defaults, patterns, ranges) lives here. A spec that fails gives one `SpecError`
whose message is a sentence naming the bad field, because that sentence is what the
user reads in the `rejections` collection. Validation is pydantic in strict mode:
JSON types are not coerced ("2" is not a slice count) and unknown fields are errors.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import ErrorDetails

from tpujobs.domain.accelerators import BadTopology, UnknownAcceleratorType, check_topology, parse_accelerator_type
from tpujobs.domain.notify import MAX_TARGETS as MAX_NOTIFY_TARGETS
from tpujobs.domain.notify import NotifyTarget
from tpujobs.domain.platforms import (
    COMPUTE,
    SERVED_BY,
    Platform,
    compute_shape,
    default_platform,
    family_of,
    platform_refusal,
)
from tpujobs.domain.secrets import check_secret_ref
from tpujobs.domain.vm_defaults import VmDefaults

MAX_SPEC_BYTES = 64 * 1024
MAX_COMMAND_CHARS = 32 * 1024
MAX_ENV_VALUE_CHARS = 8 * 1024
MAX_ENV_VARS = 128
MAX_LABELS = 48  # GCP allows 64; tpujobs keeps some for its own labels
MAX_ZONES = 8

ID_PATTERN = r"^[a-z][a-z0-9-]{0,38}[a-z0-9]$"
POOL_NAME_PATTERN = ID_PATTERN  # a warm pool (2 to 40 characters); its units' TPU names grow from it
OWNER_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._@+-]{0,127}$"
ZONE_PATTERN = r"^[a-z]+-[a-z]+[0-9]+-[a-z]$"
RUNTIME_PATTERN = r"^[a-z0-9][a-z0-9._-]{0,62}$"
RESERVATION_PATTERN = r"^[a-zA-Z0-9][a-zA-Z0-9/_.-]{0,255}$"
CODE_URI_PATTERN = r"^gs://[a-z0-9][a-z0-9._-]{1,221}[a-z0-9](/[^\x00-\x1f\x7f]*)?$"
SHA256_PATTERN = r"^[0-9a-f]{64}$"
GIT_COMMIT_PATTERN = r"^[0-9a-f]{40}([0-9a-f]{24})?$"  # SHA-1, or SHA-256 repositories
# A container image reference as Docker parses it: [registry[:port]/]path[:tag][@sha256:digest].
# Lowercase path components joined by `.`, `_`, `__` or `-`; the whole is passed to `docker` as
# one argument, never through a shell.
_IMAGE_PATH = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
IMAGE_PATTERN = (
    r"^(?:[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?(?:\.[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)*(?::[0-9]{1,5})?/)?"
    rf"{_IMAGE_PATH}(?:/{_IMAGE_PATH})*"
    r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(?:@sha256:[0-9a-f]{64})?$"
)
MAX_IMAGE_CHARS = 512
# A service account's email: user-managed (`name@project.iam.gserviceaccount.com`) or any
# other Google-managed form; never a Compute default, which a job must not run as.
SERVICE_ACCOUNT_PATTERN = r"^[a-z][a-z0-9-]{4,28}[a-z0-9]@[a-z][a-z0-9.-]{3,200}\.gserviceaccount\.com$"
MAX_SECRETS = 64
# Networks, subnetworks, tags and disks as Compute Engine names them: RFC 1035 labels (1 to 63
# lowercase letters, digits and hyphens, starting with a letter, not ending with a hyphen).
_LABEL = r"[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?"
_PROJECT = r"(?:[a-z0-9.-]+:)?[a-z][-a-z0-9]{4,28}[a-z0-9]"  # domain-scoped ids too (example.com:proj)
_REGION = r"[a-z]+-[a-z]+[0-9]+"
NETWORK_PATTERN = rf"^(?:{_LABEL}|projects/{_PROJECT}/global/networks/{_LABEL})$"
SUBNETWORK_PATTERN = rf"^(?:{_LABEL}|projects/{_PROJECT}/regions/(?P<region>{_REGION})/subnetworks/{_LABEL})$"
DISK_PATTERN = rf"^projects/{_PROJECT}/zones/(?P<zone>{_REGION}-[a-z])/disks/{_LABEL}$"
TAG_PATTERN = rf"^{_LABEL}$"
MAX_TAGS = 64  # Compute Engine's limit of network tags on one VM
MAX_DATA_DISKS = 16  # ours: far more than a training job attaches, and a bound on the request
MAX_FIELD_NAME_BYTES = 1500  # Firestore's limit on a map key, and so on an env name
ENV_NAME = re.compile(r"^[A-Z_][A-Z0-9_]*$")
LABEL_KEY = re.compile(r"^[a-z][a-z0-9_-]{0,62}$")
LABEL_VALUE = re.compile(r"^[a-z0-9_-]{0,63}$")
RESERVED_ENV_PREFIX = "TPUJOBS_"
RESERVED_LABEL_PREFIX = "tpujobs"

# flex-start: Compute Engine's FLEX_START VMs, which wait for capacity and then run at most
# their maxRunDuration (the job's time limits); `domain.platforms` says which platform serves what.
Capacity = Literal["on-demand", "spot", "reserved", "flex-start"]
Priority = Literal["very-low", "low", "medium", "high", "very-high"]
RecoveryRule = Literal["resume", "rerun", "fail"]
ImagePullPolicy = Literal["always", "if-missing"]
DiskMode = Literal["read-only", "read-write"]
PoolFallback = Literal["wait", "provision"]
MaintenanceRule = Literal["wait", "checkpoint-and-move"]
PRIORITY_RANK: dict[str, int] = {"very-low": 0, "low": 1, "medium": 2, "high": 3, "very-high": 4}


DURATION = re.compile(r"^(?:(?P<h>[0-9]{1,5})h)?(?:(?P<m>[0-9]{1,5})m)?(?:(?P<s>[0-9]{1,7})s)?$")
MAX_DURATION_SECONDS = 90 * 24 * 3600  # longer than any job a team would leave unattended
MAX_RETRY_PATTERNS = 20
MAX_RETRY_PATTERN_CHARS = 256
MAX_RETRY_EXIT_CODES = 64


def parse_duration(text: str) -> int:
    """Seconds in a duration such as `90s`, `45m`, `2h` or `1h30m`; ValueError with a sentence."""
    match = DURATION.fullmatch(text) if isinstance(text, str) and text else None
    if match is None:
        raise ValueError(f"{text!r} is not a duration such as 90s, 45m, 2h or 1h30m")
    seconds = int(match["h"] or 0) * 3600 + int(match["m"] or 0) * 60 + int(match["s"] or 0)
    if seconds <= 0:
        raise ValueError(f"{text!r} is no time at all: give a positive duration")
    if seconds > MAX_DURATION_SECONDS:
        raise ValueError(f"{text!r} is over 90 days")
    return seconds


Duration = Annotated[str, Field(max_length=32)]


class ContainerOptions(BaseModel):
    """How the job's container runs: unprivileged (the TPU devices passed in) unless
    `privileged` asks for all of the host's devices and capabilities."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    privileged: bool = False


class RetryOn(BaseModel):
    """Which errors are worth another attempt: a worker's exit code listed in `exit_codes`, or
    a line of its last output that a pattern of `output` matches (Python `re.search`)."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    exit_codes: Annotated[list[Annotated[int, Field(ge=1, le=255)]], Field(max_length=MAX_RETRY_EXIT_CODES)] = Field(
        default_factory=list
    )
    output: Annotated[
        list[Annotated[str, Field(min_length=1, max_length=MAX_RETRY_PATTERN_CHARS)]],
        Field(max_length=MAX_RETRY_PATTERNS),
    ] = Field(default_factory=list)

    @field_validator("output")
    @classmethod
    def _patterns_compile(cls, patterns: list[str]) -> list[str]:
        for pattern in patterns:
            try:
                re.compile(pattern)
            except re.error as error:
                raise ValueError(
                    f"retry_on.output pattern {pattern[:64]!r} is not a regular expression: {error}"
                ) from None
        return patterns


class SpecError(ValueError):
    """A submission that cannot become a job; the message names the field and why."""


def _no_control_chars(field: str, value: str) -> str:
    if "\x00" in value:
        raise ValueError(f"{field} must not contain NUL characters")
    return value


class DataDisk(BaseModel):
    """An existing persistent disk attached to every TPU VM of the job (AttachedDisk).

    Read-only by default, unlike gcloud's read-write: a disk attaches read-write to one VM
    only, so read-only is the mode every job shape can use."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    source_disk: str
    mode: DiskMode = "read-only"

    @field_validator("source_disk")
    @classmethod
    def _disk_path(cls, value: str) -> str:
        if not re.fullmatch(DISK_PATTERN, value):
            raise ValueError(
                f"data_disks source_disk {_excerpt(value)} is not a disk path projects/PROJECT/zones/ZONE/disks/NAME"
            )
        return value

    @property
    def zone(self) -> str:
        """The disk's zone: a persistent disk attaches only to VMs of its own zone."""
        return self.source_disk.split("/")[3]


def region_of(zone: str) -> str:
    """us-central2-b -> us-central2."""
    return zone.rsplit("-", 1)[0]


class JobSpec(BaseModel):
    """A validated job spec. Immutable once accepted."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    job_id: Annotated[str, Field(pattern=ID_PATTERN)] | None = None
    name: Annotated[str, Field(pattern=ID_PATTERN)]
    owner: Annotated[str, Field(pattern=OWNER_PATTERN)]
    accelerator_type: str
    runtime_version: Annotated[str, Field(pattern=RUNTIME_PATTERN)] = "tpu-ubuntu2204-base"
    zone: Annotated[str, Field(pattern=ZONE_PATTERN)] | None = None
    zones: (
        Annotated[list[Annotated[str, Field(pattern=ZONE_PATTERN)]], Field(min_length=1, max_length=MAX_ZONES)] | None
    ) = None
    slices: Annotated[int, Field(ge=1, le=64)] = 1
    capacity: Capacity = "on-demand"
    reservation: Annotated[str, Field(pattern=RESERVATION_PATTERN)] | None = None
    priority: Priority = "medium"
    setup: Annotated[str, Field(max_length=MAX_COMMAND_CHARS)] | None = None
    command: Annotated[str, Field(min_length=1, max_length=MAX_COMMAND_CHARS)]
    code_uri: Annotated[str, Field(pattern=CODE_URI_PATTERN, max_length=2048)] | None = None
    # The code tarball's SHA-256, recorded with the job: the agent refuses a tarball that differs.
    code_sha256: Annotated[str, Field(pattern=SHA256_PATTERN)] | None = None
    # Where `code_dir` came from when it was a git checkout (the CLI records both; shown by describe).
    code_git_commit: Annotated[str, Field(pattern=GIT_COMMIT_PATTERN)] | None = None
    code_git_dirty: bool | None = None
    # The container image setup and command run in on every host (host network and IPC, /dev
    # mounted, the TPU devices passed in, the code at its working directory); none: on the VM.
    image: str | None = None
    # None: as Kubernetes does, `always` for an untagged or `:latest` image, else `if-missing`.
    image_pull_policy: ImagePullPolicy | None = None
    # How the container runs (`container.privileged`, default false); only with an image.
    container: ContainerOptions | None = None
    env: dict[str, str] = Field(default_factory=dict)
    # Env name -> Secret Manager secret (`name`, `name@version` or a full resource name),
    # read on the host at each attempt's start; the values never reach tpujobs.
    secrets: dict[str, str] = Field(default_factory=dict)
    # What the job's TPU VMs run as; one that config/service_accounts allows for the owner.
    service_account: Annotated[str, Field(pattern=SERVICE_ACCOUNT_PATTERN)] | None = None
    on_preemption: RecoveryRule = "resume"
    on_error: RecoveryRule = "fail"
    max_restarts: Annotated[int, Field(ge=0, le=100)] = 5
    # The whole job's time, across attempts, and one attempt's: past it the job ends FAILED.
    time_limit: Duration | None = None
    attempt_time_limit: Duration | None = None
    # No output line and no checkpoint from any worker of a RUNNING attempt for this long: hung.
    hang_timeout: Duration | None = None
    on_hang: RecoveryRule = "fail"
    # Errors worth another attempt (a listed exit code, or last output a pattern matches), and
    # what they do; `on_error` is for every other non-zero exit.
    retry_on: RetryOn | None = None
    on_retryable_error: RecoveryRule = "resume"
    labels: dict[str, str] = Field(default_factory=dict)
    # Spot only: after this many preemptions within the window, continue on on-demand.
    on_demand_after_preemptions: Annotated[int, Field(ge=1, le=100)] | None = None
    preemption_window_minutes: Annotated[int, Field(ge=1, le=7 * 24 * 60)] = 60
    # The TPU VMs' network options, named as the TPU v2 API's NetworkConfig names them. None:
    # the API's own ("default"). A deployment may set defaults for these (VmDefaults).
    network: str | None = None
    subnetwork: str | None = None
    internal_ips: bool = False  # True: enable_external_ips false; the VMs then need Private Google Access or NAT
    tags: list[str] = Field(default_factory=list)  # network tags, for firewall rules and routes
    # The v2 API has no boot disk size: kept in the contract so asking for one is a clear
    # rejection rather than an unknown field (see _no_boot_disk_size).
    boot_disk_size_gb: int | None = None
    data_disks: list[DataDisk] = Field(default_factory=list)
    # AxB or AxBxC: sent as AcceleratorConfig(type, topology) instead of accelerator_type, which
    # still names the slice (its chips must match the topology's).
    topology: str | None = None
    # A warm pool to run on (`tpujobs pool create`): a free unit of that pool, whose shape must be
    # the job's; `pool_fallback: provision` lets the job leave for fresh capacity rather than wait.
    pool: Annotated[str, Field(pattern=POOL_NAME_PATTERN)] | None = None
    pool_fallback: PoolFallback = "wait"
    # Where its slices run: the Cloud TPU API (queued resources) or Compute Engine (instances in
    # MIGs). None: the deployment's default for the generation, filled in at submit.
    platform: Platform | None = None
    # Host maintenance Google announces for the attempt's hosts: `wait` rides it out (the hosts stop
    # when the window starts, and on_preemption applies), `checkpoint-and-move` ends the attempt
    # shortly before the window (its hosts get SIGTERM and save) and resumes on other capacity.
    on_maintenance: MaintenanceRule = "wait"
    # Webhooks told of the job's state changes (tpujobs.domain.notify); None: the team's defaults.
    notify: Annotated[list[NotifyTarget], Field(max_length=MAX_NOTIFY_TARGETS)] | None = None
    # Output lines to Cloud Logging too (domain.job_output); None: as the deployment says.
    cloud_logging: bool | None = None

    @field_validator("accelerator_type")
    @classmethod
    def _known_accelerator(cls, value: str) -> str:
        """A known type, kept by its canonical name (`tpu7x-16`, as GKE and xpk write it, is `v7x-16`)."""
        try:
            return parse_accelerator_type(value).accelerator_type
        except UnknownAcceleratorType as error:
            raise ValueError(str(error)) from None

    @field_validator("network")
    @classmethod
    def _network_name(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(NETWORK_PATTERN, value):
            raise ValueError(
                f"network {_excerpt(value)} is not a network name (lowercase letters, digits and hyphens, "
                "starting with a letter) nor projects/PROJECT/global/networks/NAME"
            )
        return value

    @field_validator("subnetwork")
    @classmethod
    def _subnetwork_name(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(SUBNETWORK_PATTERN, value):
            raise ValueError(
                f"subnetwork {_excerpt(value)} is not a subnetwork name (lowercase letters, digits and hyphens, "
                "starting with a letter) nor projects/PROJECT/regions/REGION/subnetworks/NAME"
            )
        return value

    @field_validator("tags")
    @classmethod
    def _network_tags(cls, tags: list[str]) -> list[str]:
        if len(tags) > MAX_TAGS:
            raise ValueError(f"tags has {len(tags)} entries; a VM takes at most {MAX_TAGS}")
        for tag in tags:
            if not re.fullmatch(TAG_PATTERN, tag):
                raise ValueError(
                    f"tags entry {_excerpt(tag)} must be 1 to 63 lowercase letters, digits or hyphens, "
                    "starting with a letter and not ending with a hyphen"
                )
        if len(set(tags)) != len(tags):
            raise ValueError(f"tags lists {sorted(t for t in tags if tags.count(t) > 1)[0]!r} twice")
        return tags

    @field_validator("boot_disk_size_gb")
    @classmethod
    def _no_boot_disk_size(cls, value: int | None) -> int | None:
        if value is not None:
            raise ValueError(
                "boot_disk_size_gb cannot be honoured: the TPU v2 API offers no boot disk size (TPU VMs get "
                "their runtime's own boot disk), so attach an existing persistent disk with data_disks for space"
            )
        return value

    @field_validator("data_disks")
    @classmethod
    def _distinct_disks(cls, disks: list[DataDisk]) -> list[DataDisk]:
        if len(disks) > MAX_DATA_DISKS:
            raise ValueError(f"data_disks has {len(disks)} entries; at most {MAX_DATA_DISKS} are allowed")
        sources = [disk.source_disk for disk in disks]
        if len(set(sources)) != len(sources):
            twice = sorted(s for s in sources if sources.count(s) > 1)[0]
            raise ValueError(f"data_disks lists {twice} twice: a disk attaches once")
        return disks

    @field_validator("topology")
    @classmethod
    def _topology_form(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(r"[1-9][0-9]{0,2}(x[1-9][0-9]{0,2}){1,2}", value):
            raise ValueError(f"topology {_excerpt(value)} is not of the form AxB or AxBxC, such as 2x2x4")
        return value

    @field_validator("time_limit", "attempt_time_limit", "hang_timeout")
    @classmethod
    def _durations(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is not None:
            try:
                parse_duration(value)
            except ValueError as error:
                raise ValueError(f"{info.field_name}: {error}") from None
        return value

    @field_validator("image")
    @classmethod
    def _image_reference(cls, value: str | None) -> str | None:
        if value is not None and (len(value) > MAX_IMAGE_CHARS or not re.fullmatch(IMAGE_PATTERN, value)):
            raise ValueError(
                f"image {_excerpt(value)} is not a container image reference such as "
                "us-docker.pkg.dev/PROJECT/REPOSITORY/IMAGE:TAG (lowercase path, optional tag and @sha256: digest)"
            )
        return value

    @field_validator("command", "setup")
    @classmethod
    def _command_text(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is None:
            return value
        field = str(info.field_name)  # "command" or "setup": a field validator's info names its field
        _no_control_chars(field, value)
        if field == "command" and not value.strip():
            raise ValueError("command must not be blank")
        return value

    @field_validator("env")
    @classmethod
    def _env_names_and_values(cls, env: dict[str, str]) -> dict[str, str]:
        if len(env) > MAX_ENV_VARS:
            raise ValueError(f"env has {len(env)} variables; at most {MAX_ENV_VARS} are allowed")
        for name, value in env.items():
            _check_env_name("env", name)
            if len(value) > MAX_ENV_VALUE_CHARS:
                raise ValueError(f"env value of {name} is longer than {MAX_ENV_VALUE_CHARS} characters")
            _no_control_chars(f"env value of {name}", value)
        return env

    @field_validator("secrets")
    @classmethod
    def _secret_names(cls, secrets: dict[str, str]) -> dict[str, str]:
        if len(secrets) > MAX_SECRETS:
            raise ValueError(f"secrets has {len(secrets)} entries; at most {MAX_SECRETS} are allowed")
        for name, ref in secrets.items():
            _check_env_name("secrets", name)
            try:
                check_secret_ref(ref)
            except ValueError as error:
                raise ValueError(f"secret of {name}: {error}") from None
        return secrets

    @field_validator("labels")
    @classmethod
    def _gcp_labels(cls, labels: dict[str, str]) -> dict[str, str]:
        return check_labels(labels)

    @model_validator(mode="after")
    def _consistent(self) -> JobSpec:
        if self.zone is not None and self.zones is not None:
            raise ValueError("give either zone or zones, not both")
        if self.zones is not None and len(set(self.zones)) != len(self.zones):
            raise ValueError("zones lists a zone twice")
        if self.capacity != "reserved" and self.reservation is not None:
            raise ValueError("reservation is only allowed with capacity 'reserved'")
        if self.on_demand_after_preemptions is not None and self.capacity != "spot":
            raise ValueError("on_demand_after_preemptions is only allowed with capacity 'spot'")
        both = sorted(set(self.env) & set(self.secrets))
        if both:
            raise ValueError(f"{both[0]} is in both env and secrets: give it once")
        if self.code_sha256 is not None and (self.code_uri is None or self.code_uri.endswith("/")):
            raise ValueError("code_sha256 is the digest of code_uri's tarball: give code_uri, a tarball")
        if self.code_git_dirty is not None and self.code_git_commit is None:
            raise ValueError("code_git_dirty says whether code_git_commit had changes: give code_git_commit")
        if self.image_pull_policy is not None and self.image is None:
            raise ValueError("image_pull_policy is only allowed with an image")
        if self.container is not None and self.image is None:
            raise ValueError("container is only allowed with an image")
        check_vm_options(self)
        check_platform(self)
        return self

    @property
    def time_limit_seconds(self) -> int | None:
        return parse_duration(self.time_limit) if self.time_limit else None

    @property
    def attempt_time_limit_seconds(self) -> int | None:
        return parse_duration(self.attempt_time_limit) if self.attempt_time_limit else None

    @property
    def hang_timeout_seconds(self) -> int | None:
        return parse_duration(self.hang_timeout) if self.hang_timeout else None

    @property
    def pull_policy(self) -> ImagePullPolicy | None:
        """How hosts get the image: as given, else `always` for an untagged or `:latest`
        reference (it may change) and `if-missing` for any other tag or a digest."""
        if self.image is None:
            return None
        if self.image_pull_policy is not None:
            return self.image_pull_policy
        if "@" in self.image:
            return "if-missing"
        last = self.image.rsplit("/", 1)[-1]
        tag = last.split(":", 1)[1] if ":" in last else "latest"
        return "always" if tag == "latest" else "if-missing"

    @property
    def preferred_zones(self) -> tuple[str, ...]:
        """Zones in order of preference; empty when the deployment's default applies."""
        if self.zones:
            return tuple(self.zones)
        return (self.zone,) if self.zone else ()

    @property
    def chips(self) -> int:
        """Chips held while the job runs: chips per slice times slices."""
        return parse_accelerator_type(self.accelerator_type).chips * self.slices

    @property
    def hosts_per_slice(self) -> int:
        return parse_accelerator_type(self.accelerator_type).hosts

    def to_document(self) -> dict[str, Any]:
        """The spec as stored on the job document: every field, defaults included."""
        return self.model_dump(mode="json")


def check_labels(labels: dict[str, str]) -> dict[str, str]:
    """`labels` if GCP and tpujobs accept them (a spec's, or a later change's); ValueError naming the label."""
    if len(labels) > MAX_LABELS:
        raise ValueError(f"labels has {len(labels)} entries; at most {MAX_LABELS} are allowed")
    for key, value in labels.items():
        if not LABEL_KEY.fullmatch(key):
            raise ValueError(
                f"label key {key[:64]!r} must be lowercase letters, digits, _ or -, starting with a letter"
            )
        if key.startswith(RESERVED_LABEL_PREFIX):
            raise ValueError(f"label key {key!r} uses the reserved prefix tpujobs")
        if not LABEL_VALUE.fullmatch(value):
            raise ValueError(f"label value of {key} must be at most 63 lowercase letters, digits, _ or -")
    return labels


def check_zones_fit(spec: JobSpec, zones: Iterable[str]) -> None:
    """ValueError unless the spec's zonal and regional resources fit every zone it may use: a
    subnetwork path's region, and the one zone of its data disks (a persistent disk is zonal)."""
    zones = tuple(zones)
    match = re.fullmatch(SUBNETWORK_PATTERN, spec.subnetwork or "")
    region = match["region"] if match else None
    for zone in zones:
        if region is not None and region_of(zone) != region:
            raise ValueError(
                f"subnetwork {spec.subnetwork} is in region {region}, but the job may run in zone {zone} "
                f"of region {region_of(zone)}: a TPU VM uses a subnetwork of its own region"
            )
    if spec.data_disks and len(zones) > 1:
        raise ValueError(
            f"data_disks are zonal, but the job may run in {len(zones)} zones ({', '.join(zones)}): "
            "give the one zone of its disks"
        )
    for disk in spec.data_disks:
        if zones and disk.zone != zones[0]:
            raise ValueError(
                f"data_disks: {disk.source_disk} is in zone {disk.zone}, but the job runs in {zones[0]}: "
                "a persistent disk attaches only to VMs of its own zone"
            )


def check_vm_options(spec: JobSpec) -> None:
    """The VM options' rules that need more than one field; ValueError with a sentence."""
    if spec.subnetwork is not None and spec.network is None:
        # Without a network the API uses "default" and refuses a subnetwork of any other
        # network; a subnetwork's path does not say its network, so it cannot be inferred.
        raise ValueError("subnetwork needs network alongside: without one the TPU API uses the network 'default'")
    if spec.topology is not None:
        try:
            check_topology(spec.accelerator_type, spec.topology)
        except BadTopology as error:
            raise ValueError(str(error)) from None
    if any(disk.mode == "read-write" for disk in spec.data_disks) and (spec.slices > 1 or spec.hosts_per_slice > 1):
        raise ValueError(
            f"data_disks: a read-write disk attaches to one VM only, but this job has "
            f"{spec.slices * spec.hosts_per_slice} (slices x hosts of {spec.accelerator_type}); use read-only"
        )
    disk_zones = sorted({disk.zone for disk in spec.data_disks})
    if len(disk_zones) > 1:
        raise ValueError(f"data_disks are in zones {', '.join(disk_zones)}: a job's disks share its one zone")
    check_zones_fit(spec, spec.preferred_zones)


def check_platform(spec: JobSpec) -> None:
    """ValueError unless the spec's platform serves its generation, offers its shape and its capacity
    kind (a spec that names no platform: the one that must serve it, if only one can)."""
    platform = spec.platform or _only_platform(spec.accelerator_type)
    if spec.platform is not None:
        refusal = platform_refusal(spec.accelerator_type, spec.platform)
        if refusal:
            raise ValueError(f"platform {spec.platform}: {refusal}")
    if platform == COMPUTE:
        try:
            compute_shape(spec.accelerator_type, spec.topology)
        except (UnknownAcceleratorType, BadTopology) as error:
            raise ValueError(str(error)) from None
    if spec.capacity == "reserved" and platform == COMPUTE and not spec.reservation:
        # Compute Engine's RESERVATION_BOUND VMs "must specifically target the reservation"
        # (about-reservation-bound-vms): there is no "any reservation" for them.
        raise ValueError(
            f"capacity 'reserved' on Compute Engine binds {spec.accelerator_type}'s VMs to one reservation they "
            "name (RESERVATION_BOUND with SPECIFIC_RESERVATION; Google has no 'any reservation' for them): "
            "give reservation"
        )
    if spec.capacity == "flex-start":
        if platform is not None and platform != COMPUTE:
            raise ValueError(
                "capacity 'flex-start' is Compute Engine's FLEX_START provisioning: "
                f"{spec.accelerator_type} on platform {platform} has none; give platform: compute"
            )
        limit = min(x for x in (spec.time_limit_seconds, spec.attempt_time_limit_seconds, MAX_RUN_SECONDS) if x)
        if not (spec.time_limit or spec.attempt_time_limit) or limit < MIN_RUN_SECONDS:
            raise ValueError(
                "capacity 'flex-start' VMs run at most their maxRunDuration, taken from time_limit "
                "(or attempt_time_limit): give one of at least 10m"
            )


# Compute Engine's bounds on a FLEX_START VM's maxRunDuration: 10 minutes to 7 days.
MIN_RUN_SECONDS = 10 * 60
MAX_RUN_SECONDS = 7 * 24 * 3600


def _only_platform(accelerator_type: str) -> Platform | None:
    """The platform of a generation only one serves; None while the deployment's default decides."""
    served = SERVED_BY.get(family_of(accelerator_type)) if _known(accelerator_type) else None
    return next(iter(served)) if served and len(served) == 1 else None


def _known(accelerator_type: str) -> bool:
    try:
        family_of(accelerator_type)
    except UnknownAcceleratorType:
        return False
    return True


def with_deployment_defaults(
    spec: JobSpec,
    defaults: VmDefaults,
    *,
    default_zone: str = "",
    compute_by_default: frozenset[str] = frozenset(),
) -> JobSpec:
    """The spec with the deployment's VM defaults in every field its author left out (fields
    given, even empty, are kept), its platform (`compute_by_default`: the generations the
    deployment runs on Compute Engine when both serve them), validated again; and, when the
    spec names no zone, its zonal resources checked against the deployment's default zone.
    SpecError with a sentence if the result is not a valid job. Called at submit, so the stored
    spec shows what was requested."""
    filled = {name: value for name, value in defaults.spec_fields().items() if name not in spec.model_fields_set}
    if spec.platform is None:
        filled["platform"] = default_platform(spec.accelerator_type, compute_by_default)
    result = spec
    if filled:
        try:
            result = _validated({**spec.model_dump(mode="json", exclude_unset=True), **filled})
        except SpecError as error:
            named = sorted(name for name in filled if name != "platform") or ["platform"]
            raise SpecError(f"{error} (with the deployment's default {', '.join(named)})") from None
    if default_zone and not result.preferred_zones:
        try:
            check_zones_fit(result, (default_zone,))
        except ValueError as error:
            raise SpecError(f"{error} (the deployment's default zone; give zone to choose another)") from None
    return result


def _check_env_name(field: str, name: str) -> None:
    """An environment name a process takes and Firestore can keep as a map key."""
    if len(name.encode("utf-8")) > MAX_FIELD_NAME_BYTES:
        raise ValueError(f"{field} name {name[:64]!r}... is over {MAX_FIELD_NAME_BYTES} bytes")
    if not ENV_NAME.fullmatch(name):
        raise ValueError(f"{field} name {name[:64]!r} must match ^[A-Z_][A-Z0-9_]*$")
    if name.startswith("__") and name.endswith("__"):
        raise ValueError(f"{field} name {name[:64]!r} is reserved by Firestore (__NAME__)")
    if name.startswith(RESERVED_ENV_PREFIX):
        raise ValueError(f"{field} name {name!r} uses the reserved prefix TPUJOBS_")


DERIVED_DIGEST_CHARS = 16  # 64 bits: two messages of one name never meet by chance


def derive_job_id(name: str, message_id: str) -> str:
    """`name` plus 64 bits of a hash of the message id: unique per message, stable on redelivery."""
    digest = hashlib.sha256(message_id.encode("utf-8")).hexdigest()[:DERIVED_DIGEST_CHARS]
    return f"{name[: 39 - DERIVED_DIGEST_CHARS].rstrip('-')}-{digest}"


def _sentence(error: ErrorDetails) -> str:
    """One pydantic error as a sentence that names the field."""
    loc = ".".join(str(part) for part in error["loc"])
    kind = error["type"]
    field = loc or "the spec"
    message = error["msg"] or "is invalid"
    if message.startswith("Value error, "):
        message = message[len("Value error, ") :]
        return message if loc == "" or message.startswith(str(error["loc"][0])) else f"{field}: {message}"
    if kind == "missing":
        return f"field {field!r} is required"
    if kind == "extra_forbidden":
        known = ", ".join(JobSpec.model_fields)
        return f"field {field!r} is not part of a job spec (known fields: {known})"
    if kind == "string_pattern_mismatch":
        pattern = error.get("ctx", {}).get("pattern", "")
        return f"field {field!r} must match {pattern}, got {_excerpt(error['input'])}"
    return f"field {field!r}: {message[0].lower() + message[1:]}, got {_excerpt(error['input'])}"


def _excerpt(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def parse_spec(data: Any, *, message_id: str | None = None) -> JobSpec:
    """A JobSpec from decoded JSON, with `job_id` derived when absent, or SpecError."""
    if not isinstance(data, dict):
        raise SpecError(f"a job spec must be a JSON object, got {type(data).__name__}")
    try:
        require_unicode_text(data)
    except ValueError as error:
        raise SpecError(str(error)) from None
    spec = _validated(data)
    if spec.job_id is None:
        if message_id is None:
            raise SpecError("field 'job_id' is required when no message id can derive it")
        spec = spec.model_copy(update={"job_id": derive_job_id(spec.name, message_id)})
    return spec


def _validated(data: dict[str, Any]) -> JobSpec:
    """JobSpec.model_validate with its errors as one SpecError of sentences."""
    try:
        return JobSpec.model_validate(data)
    except ValidationError as error:
        sentences = [_sentence(e) for e in error.errors(include_url=False)]
        raise SpecError("; ".join(sentences[:5])) from None


def decode_spec(raw: bytes, *, message_id: str | None = None) -> JobSpec:
    """A JobSpec from the bytes of a Pub/Sub message: size, UTF-8 and JSON checked first."""
    if len(raw) > MAX_SPEC_BYTES:
        raise SpecError(f"the message is {len(raw)} bytes; a job spec may be at most {MAX_SPEC_BYTES}")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        raise SpecError(f"the message is not valid UTF-8 (byte {error.start})") from None
    try:
        data = json.loads(text, object_pairs_hook=unique_keys)
    except json.JSONDecodeError as error:
        raise SpecError(f"the message is not JSON: {error.msg} at line {error.lineno} column {error.colno}") from None
    except RecursionError:
        raise SpecError("the message nests JSON too deeply to be a job spec") from None
    except DuplicateKey as error:
        raise SpecError(str(error)) from None
    except ValueError as error:  # e.g. an integer literal longer than Python converts
        raise SpecError(f"the message is not usable JSON: {error}") from None
    return parse_spec(data, message_id=message_id)


class DuplicateKey(ValueError):
    """A JSON object that names a key twice: which value was meant cannot be known."""


def unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """`json.loads` object hook: a dict, or DuplicateKey when a key appears twice."""
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise DuplicateKey(f"the JSON names {key[:64]!r} twice in one object")
        result[key] = value
    return result


def require_unicode_text(data: Any) -> None:
    """ValueError if a JSON value holds a lone surrogate (`"\ud800"`): valid JSON, not text.

    Such strings cannot be stored in Firestore nor passed to a process, so they are
    refused at the door with the rest of the bad input.
    """
    try:
        json.dumps(data, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("the message holds a string that is not valid Unicode (a lone surrogate escape)") from None
