"""The attempt's stops, in-process with stand-ins for the runner and the reports: each stop is
decided once against the attempt's end, and an end already known stands."""

from __future__ import annotations

import threading
from typing import Any

from tpujobs.agent.reports import Preemption
from tpujobs.agent.stops import Stops

CONFIG = {"grace_seconds": 30, "preemption_grace_seconds": 20, "preemption_window_seconds": 30}
IDENTITY = {"job_id": "train-1", "attempt": 1, "slice_id": 0, "worker_id": 0}


class Recorder:
    """Stands in for the runner, the reporter, the shipper and the publisher: records each call."""

    key = b"the attempt key"

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    def sigterm(self, kill_at: float | None = None) -> str | None:
        self.calls.append(("sigterm", kill_at))
        return None

    def sigterm_container(self, container: str | None) -> None:
        self.calls.append(("sigterm_container", container))

    def silence(self, everything: bool = False) -> None:
        self.calls.append(("silence", everything))

    def hurry(self, deadline: float) -> None:
        self.calls.append(("hurry", deadline))

    def publish(self, topic: str, payload: dict[str, Any], attributes: dict[str, str], **retry: Any) -> None:
        self.calls.append(("publish", topic))

    def named(self, name: str) -> list[Any]:
        return [value for called, value in self.calls if called == name]


def stops_of(recorder: Recorder) -> Stops:
    made: list[Stops] = []
    preemption = Preemption(recorder, "preemption", IDENTITY, lambda reason: made[0].for_preemption(reason))  # type: ignore[arg-type]
    made.append(Stops(CONFIG, preemption, threading.Event(), recorder, recorder, recorder, lambda line: None))  # type: ignore[arg-type]
    return made[0]


def test_a_notice_stops_the_command_with_its_sigkill_due_the_preemption_grace_after_the_notice() -> None:
    recorder = Recorder()
    stops = stops_of(recorder)
    stops.preemption.trigger("SIGTERM")
    noticed_at = stops.preemption.noticed_at
    assert noticed_at is not None
    assert recorder.named("publish") == ["preemption"]
    assert recorder.named("sigterm") == [noticed_at + 20]
    assert recorder.named("silence") == [False]  # checkpoints and `stopped` still go out
    assert stops.stopping()
    assert not stops.withdraw("assignment seq 2 replaces it")  # the notice's stop stands
    assert stops.finish() == (False, True)


def test_a_withdrawal_mutes_every_report_and_no_notice_follows_it() -> None:
    recorder = Recorder()
    stops = stops_of(recorder)
    assert stops.withdraw("assignment seq 2 replaces it")
    assert recorder.named("silence") == [True]
    assert recorder.named("sigterm") == [None]  # SIGKILL after the attempt's own grace
    stops.preemption.trigger("SIGTERM")
    assert recorder.named("publish") == []
    assert stops.finish() == (True, True)


def test_after_the_attempt_ended_no_stop_signals_or_silences_anything() -> None:
    recorder = Recorder()
    stops = stops_of(recorder)
    assert stops.finish() == (False, False)
    stops.preemption.trigger("SIGTERM")  # the notice is still published: the VM is going away
    assert not stops.withdraw("assignment seq 2 replaces it")
    assert recorder.named("publish") == ["preemption"]
    assert recorder.named("sigterm") == [] and recorder.named("silence") == []
