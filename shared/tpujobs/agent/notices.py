"""What tells the agent to stop: SIGTERM, and the metadata server's `instance/preempted` and
`instance/maintenance-event`, each waited on with `wait_for_change`; and what warns it ahead:
`instance/upcoming-maintenance`, where a TPU VM learns of maintenance days before its window.

SIGTERM is the one signal every end gives: Google fills `instance/maintenance-event` only for VMs
that live-migrate or have GPUs, so a Compute Engine TPU VM (onHostMaintenance TERMINATE) never sees
it change; its host maintenance arrives as the ACPI soft-off's SIGTERM, announced ahead (when
scheduled) on `instance/upcoming-maintenance`. The key is still watched for the TPU API's nodes.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Callable

from .basics import HttpError, log
from .reports import Preemption, Reporter
from .rest import Metadata

PREEMPTED_METADATA = "instance/preempted"
MAINTENANCE_METADATA = "instance/maintenance-event"
UPCOMING_MAINTENANCE_METADATA = "instance/upcoming-maintenance?alt=json"
ATTRIBUTES_METADATA = "instance/attributes/"  # the listing of the instance's own keys
STOP_REQUEST_KEY = "tpujobs-stop"  # engine/startup_script.py's STOP_REQUEST_KEY
TERMINATE_ON_MAINTENANCE = "TERMINATE_ON_HOST_MAINTENANCE"
WATCH_WAIT_SECONDS = 60.0  # how long one wait_for_change request may be held
WATCH_FLOOR_SECONDS = 0.5  # the least time between two requests answered unchanged


def watch_sigterm(on_signal: Callable[[str], None]) -> None:
    """SIGTERM calls on_signal from a thread at once, even while the main thread is blocked.

    Must be called from the main thread. The C-level handler writes the signal number to a
    pipe (`signal.set_wakeup_fd`); a thread waiting on the pipe acts on it.
    """
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    signal.signal(signal.SIGTERM, lambda number, frame: None)
    signal.set_wakeup_fd(write_fd)

    def wait() -> None:
        while True:
            try:
                data = os.read(read_fd, 64)
            except OSError:
                return
            if not data:
                return
            if int(signal.SIGTERM) in data:
                on_signal("SIGTERM")

    threading.Thread(target=wait, name="sigterm", daemon=True).start()


def watch_metadata(
    metadata: Metadata,
    path: str,
    on_value: Callable[[str], bool],
    stop: threading.Event,
    wait_seconds: float = WATCH_WAIT_SECONDS,
    floor: float = WATCH_FLOOR_SECONDS,
) -> threading.Thread:
    """Calls on_value with every value a metadata key takes, until it returns True or `stop`.

    Waits with `wait_for_change`, so a change is seen as the server announces it. An answer
    that comes back unchanged sooner than `floor` (a server that does not hold requests) is
    followed by a pause of `floor`, so the watch never spins; an unanswered request is
    tried again a second later (ten for a key the server does not have), never taken for a
    value.
    """

    def watch() -> None:
        etag = ""
        while not stop.is_set():
            asked = time.monotonic()
            try:
                value, new_etag = metadata.wait_for_change(path, etag, wait_seconds)
            except HttpError as error:
                stop.wait(10.0 if error.status == 404 else 1.0)
                continue
            except Exception:  # connection refused, reset, timeout: not a value
                stop.wait(1.0)
                continue
            if on_value(value.strip()):
                return
            quick = time.monotonic() - asked < floor
            if quick and (not new_etag or new_etag == etag):
                stop.wait(floor)
            etag = new_etag

    thread = threading.Thread(target=watch, name=f"watch {path}", daemon=True)
    thread.start()
    return thread


def watch_preempted(metadata: Metadata, on_preempted: Callable[[str], None], stop: threading.Event) -> threading.Thread:
    """On `instance/preempted` turning TRUE, calls on_preempted once."""

    def seen(value: str) -> bool:
        if value.upper() != "TRUE":
            return False
        on_preempted(f"metadata: {PREEMPTED_METADATA}")
        return True

    return watch_metadata(metadata, PREEMPTED_METADATA, seen, stop)


def maintenance_notice(value: str) -> str | None:
    """The preemption notice's reason for an `instance/maintenance-event` value, else None.

    TERMINATE_ON_HOST_MAINTENANCE: the VM is about to be stopped for host maintenance, so
    the attempt is lost like a preempted one. NONE: nothing is announced. A TPU VM is never
    live-migrated, so MIGRATE_ON_HOST_MAINTENANCE should not appear; if it did, the VM
    would keep running, so it stops nothing, and neither does a value Google may add later
    (a wrong notice would throw away a healthy attempt; a VM that really stops is still
    seen by the reconciler).
    """
    if value.strip().upper() == TERMINATE_ON_MAINTENANCE:
        return f"metadata: {MAINTENANCE_METADATA} is {TERMINATE_ON_MAINTENANCE} (host maintenance)"
    return None


def watch_maintenance(metadata: Metadata, on_notice: Callable[[str], None], stop: threading.Event) -> threading.Thread:
    """On `instance/maintenance-event` announcing termination, calls on_notice once."""
    logged: set[str] = set()

    def seen(value: str) -> bool:
        reason = maintenance_notice(value)
        if reason is not None:
            on_notice(reason)
            return True
        if value.upper() != "NONE" and value not in logged and len(logged) < 10:
            logged.add(value)
            log(f"{MAINTENANCE_METADATA} is {value[:80]!r}: no action for it on a TPU VM")
        return False

    return watch_metadata(metadata, MAINTENANCE_METADATA, seen, stop)


def upcoming_window(value: str) -> dict[str, str] | None:
    """The report fields of an `instance/upcoming-maintenance` window; None: nothing scheduled."""
    try:
        data = json.loads(value)
    except ValueError:
        return None
    if not isinstance(data, dict) or not isinstance(data.get("window_start_time"), str):
        return None
    fields = {"window_start": data["window_start_time"]}
    if isinstance(data.get("window_end_time"), str):
        fields["window_end"] = data["window_end_time"]
    kind = data.get("type")
    if isinstance(kind, str) and kind.isupper() and len(kind) <= 40:
        fields["maintenance_type"] = kind
    return fields


def watch_upcoming_maintenance(
    metadata: Metadata, on_window: Callable[[dict[str, str]], None], stop: threading.Event
) -> threading.Thread:
    """Calls on_window once per new maintenance window Google schedules for this VM."""
    seen: set[str] = set()

    def changed(value: str) -> bool:
        window = upcoming_window(value)
        if window is not None and window["window_start"] not in seen and len(seen) < 100:
            seen.add(window["window_start"])
            on_window(window)
        return False

    return watch_metadata(metadata, UPCOMING_MAINTENANCE_METADATA, changed, stop)


def watch_stop_request(metadata: Metadata, on_stop: Callable[[str], None], stop: threading.Event) -> threading.Thread:
    """On `tpujobs-stop` appearing among the instance's attributes (tpujobs took the attempt's
    chips back: a reclaim, an eviction), calls on_stop once with tpujobs' reason. The attributes'
    listing is watched, since a key that does not exist yet cannot be waited on (404). Only the
    control plane writes a VM's metadata; the value is shown, never run."""

    def seen(listing: str) -> bool:
        if STOP_REQUEST_KEY not in listing.split():
            return False
        try:
            why = metadata.get(f"{ATTRIBUTES_METADATA}{STOP_REQUEST_KEY}").strip()
        except Exception:  # asked all the same: the key is there
            why = "no reason given"
        on_stop(f"tpujobs asked this attempt to stop: {why[:200]}")
        return True

    return watch_metadata(metadata, ATTRIBUTES_METADATA, seen, stop)


def watch_host_notices(metadata: Metadata, preemption: Preemption, reporter: Reporter, stop: threading.Event) -> None:
    """Every watch an attempt's host keeps: a preemption or a host maintenance (a notice, then the
    stop), a stop asked by tpujobs (the stop alone), and maintenance windows scheduled ahead."""
    watch_preempted(metadata, preemption.trigger, stop)
    watch_maintenance(metadata, preemption.trigger, stop)
    watch_stop_request(metadata, lambda why: preemption.trigger(why, tell=False), stop)
    watch_upcoming_maintenance(metadata, lambda window: reporter.report("maintenance", **window), stop)
