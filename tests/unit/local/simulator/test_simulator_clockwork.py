"""The clockwork is the simulator's one event loop: a part joins it by registering, not by inheriting."""

from __future__ import annotations

from functools import partial

from tpujobs.local.simulator.clockwork import Clockwork, DueStep
from tpujobs.local.simulator.records import SimulatorConfig
from tpujobs.local.simulator.world import World
from tpujobs.local.testing import SecondsClock


def test_registered_timed_steps_run_earliest_first_then_the_advanced_listeners() -> None:
    """Steps from two sources run in time order, each once, and on_advanced hears the time reached."""
    clock = SecondsClock()
    world = World(SimulatorConfig(), clock=clock, wall_clock=lambda: 1_700_000_000.0)
    clockwork = Clockwork(world)
    pending = {"a": 3.0, "b": 1.0, "c": 2.0}
    ran: list[tuple[str, float]] = []

    def run(name: str, at: float) -> None:
        ran.append((name, at))
        del pending[name]

    def source(names: str, now: float) -> list[DueStep]:
        return [
            (when, 9, ord(name), partial(run, name)) for name, when in pending.items() if name in names and when <= now
        ]

    clockwork.add_due_source(partial(source, "ab"))
    clockwork.add_due_source(partial(source, "c"))
    clockwork.on_advanced(lambda now: ran.append(("advanced", now)))
    clock.tick(5.0)
    clockwork.advance()
    assert ran == [("b", 1.0), ("c", 2.0), ("a", 3.0), ("advanced", clock.now)]
