"""Messages that could not be used: recorded with why, then acknowledged."""

from __future__ import annotations

import hashlib
import logging
import threading
from dataclasses import dataclass
from datetime import datetime, timedelta

from tpujobs.domain import signing
from tpujobs.engine import metric_events
from tpujobs.engine.inbound import InboundMessage
from tpujobs.engine.ports import Clock, MessageRecords, Rejection

log = logging.getLogger(__name__)


class Rejections:
    """Records why a message was refused, scrubbed of attempt keys."""

    def __init__(self, store: MessageRecords, clock: Clock) -> None:
        self.store = store
        self.clock = clock

    def reject(self, message: InboundMessage, reason: str) -> None:
        """Record why a message could not be used; the caller then acknowledges it. A reason
        may quote the message, so it is scrubbed of attempt keys like the payload."""
        reason = signing.scrub(reason)
        log.warning("rejected message %s on %s: %s", message.message_id, message.topic, reason)
        metric_events.emit(log, metric_events.rejected(message.topic), logging.WARNING)
        self.store.reject(
            Rejection(message.message_id, self.clock(), reason, signing.scrub(message.payload_text()), message.topic)
        )


COUNT_WINDOW = timedelta(minutes=1)  # forgeries of one (topic, reason) are written at most this often


@dataclass
class _Tally:
    since: datetime  # the window's start: its first forgery was written then
    count: int = 0  # forgeries since, not yet written
    sample: InboundMessage | None = None  # the latest of them, kept as the record's payload


class ForgeryCounts:
    """Messages that do not prove themselves signed, counted per (topic, reason) in memory.

    A flood of forgeries must cost no Firestore write each: the first of a (topic, reason) is
    recorded at once as itself, the rest are counted and written as one record (`deliveries` =
    how many) when a minute has passed, on the next signed message or forgery. Reasons are fixed sentences
    (`domain.signing.forgery`), so the tallies stay few whatever a flood sends. An instance
    that stops loses at most a minute of counts; the log has no line per forgery either.
    """

    def __init__(self, rejections: Rejections) -> None:
        self.rejections = rejections
        self._tallies: dict[tuple[str, str], _Tally] = {}
        self._lock = threading.Lock()
        self.last_counted = ""  # the id of the last forgery counted, not recorded as itself

    def count(self, message: InboundMessage, reason: str, said: str = "") -> None:
        """One forged or unsigned message, refused; it is acknowledged by the caller. The first of
        a window is recorded as itself, with `said` (else `reason`) as its rejection's reason."""
        now = self.rejections.clock()
        with self._lock:
            tally = self._tallies.get((message.topic, reason))
            first = tally is None
            if tally is None:
                self._tallies[(message.topic, reason)] = _Tally(since=now)
            else:
                tally.count += 1
                tally.sample = message
                self.last_counted = message.message_id
        if first:
            self.rejections.reject(message, said or f"Refused unread: {reason}.")
        self.flush_due()

    def flush_due(self) -> None:
        """Write the tallies whose minute has passed (at most one record each)."""
        now = self.rejections.clock()
        with self._lock:
            due = [(key, t) for key, t in self._tallies.items() if now - t.since >= COUNT_WINDOW]
            for key, _ in due:
                del self._tallies[key]
        for (topic, reason), tally in due:
            if tally.count and tally.sample is not None:
                self._write(topic, reason, tally.sample, tally.count, now)
                with self._lock:  # the next window starts now, its first already written
                    self._tallies.setdefault((topic, reason), _Tally(since=now))

    def _write(self, topic: str, reason: str, sample: InboundMessage, count: int, now: datetime) -> None:
        window = hashlib.sha256(f"{topic}\n{reason}\n{now.isoformat()}".encode()).hexdigest()[:24]
        said = f"Refused unread: {reason} ({count} more in a minute, counted; the last one kept)."
        log.warning("refused %d message(s) on %s unread: %s", count, topic, reason)
        metric_events.emit(log, metric_events.rejected(topic, count), logging.WARNING)
        self.rejections.store.reject(
            Rejection(f"forged-{window}", now, said, signing.scrub(sample.payload_text()), topic, count=count)
        )
