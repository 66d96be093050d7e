"""Planned and random API errors, hosts that never boot, and new settings at run time."""

from __future__ import annotations

import dataclasses
import random
from typing import Any

from tpujobs.local.simulator.clockwork import Clockwork
from tpujobs.local.simulator.errors import FAULT_METHODS, Code, Fault, SimulatorError
from tpujobs.local.simulator.records import LIVE_STATES, QrState, QueuedResourceRecord, SimulatorConfig
from tpujobs.local.simulator.world import World


class FaultPlan:
    """The errors the next TPU API calls answer with, the no-boot budget, and reconfiguring.
    It owns the planned faults and the dice; the world's lock guards them."""

    def __init__(self, world: World, clockwork: Clockwork) -> None:
        self._world = world
        self._clockwork = clockwork
        self._dice = random.Random(world.config.seed)
        self._planned_faults: dict[str, list[Fault]] = {method: [] for method in FAULT_METHODS}
        self._no_boot_budget = 0  # how many of the next QRs created get hosts that never boot

    def take_no_boot(self) -> bool:
        """Whether the hosts of what is created now never boot, spending one of the budget.
        Callers hold the lock."""
        if self._no_boot_budget == 0:
            return False
        self._no_boot_budget -= 1
        return True

    def reconfigure(self, config: SimulatorConfig) -> None:
        """Apply new delays, capacity or fault settings; scheduled transitions keep their times."""
        with self._clockwork.transaction() as now:
            if config.seed != self._world.config.seed:
                self._dice = random.Random(config.seed)
            self._world.config = config
            self._clockwork.admit(now)

    def roll_for_fault(self, project: str = "", zone: str = "") -> None:
        """Raise a random injected error as often as api_error_rate says (the method-blind
        dice; ``next_fault`` also serves the planned ones)."""
        with self._world.lock:
            fault = self._roll()
        if fault is not None:
            raise fault.error(project, zone)

    def inject_errors(self, method: str, fault: Fault, count: int = 1) -> dict[str, Any]:
        """The next *count* calls of *method* (create, get, list, delete, update) answer with *fault*,
        after any planned before; returns every planned fault (``faults()``)."""
        if method not in FAULT_METHODS:
            raise SimulatorError(
                Code.INVALID_ARGUMENT,
                f"method must be one of {', '.join(FAULT_METHODS)}, got {method!r}",
            )
        if count < 1:
            raise SimulatorError(Code.INVALID_ARGUMENT, f"count must be at least 1, got {count}")
        with self._world.lock:
            self._planned_faults[method].extend([fault] * count)
            return self._faults_json()

    def next_fault(self, method: str | None) -> Fault | None:
        """The error a TPU API call of *method* answers with, if any: a planned one first,
        else the dice. The server calls this once per TPU API call; operations pass None."""
        with self._world.lock:
            planned = self._planned_faults.get(method or "")
            if planned:
                return planned.pop(0)
            return self._roll()

    def no_boot(self, count: int) -> dict[str, Any]:
        """The hosts of the next *count* queued resources created never run their startup
        script: they turn ACTIVE and READY, and nothing reports from them."""
        if count < 1:
            raise SimulatorError(Code.INVALID_ARGUMENT, f"count must be at least 1, got {count}")
        with self._world.lock:
            self._no_boot_budget += count
            return self._faults_json()

    def faults(self) -> dict[str, Any]:
        """The planned faults: errors per method and the no-boot budget, as JSON."""
        with self._world.lock:
            return self._faults_json()

    def clear_faults(self) -> dict[str, Any]:
        """Forget every planned error and the no-boot budget (random errors stay configured)."""
        with self._world.lock:
            for planned in self._planned_faults.values():
                planned.clear()
            self._no_boot_budget = 0
            return self._faults_json()

    def no_boot_queued_resource(
        self, qr_id: str, *, zone: str | None = None, project: str | None = None
    ) -> QueuedResourceRecord:
        """The hosts of a QR that has not turned ACTIVE yet will never run their startup script."""
        with self._clockwork.transaction():
            qr = self._world.resolve(qr_id, zone, project)
            if qr.state not in LIVE_STATES - {QrState.ACTIVE}:
                raise SimulatorError(
                    Code.FAILED_PRECONDITION,
                    f"Queued resource {qr.name} is {qr.state.value}; only one that is not ACTIVE "
                    "yet can get hosts that never boot (use a count for the next ones)",
                )
            return self._world.put_qr(dataclasses.replace(qr, hosts_boot=False))

    def _roll(self) -> Fault | None:
        rate = self._world.config.api_error_rate
        if rate <= 0 or self._dice.random() >= rate:
            return None
        return Fault.parse(self._dice.choice(self._world.config.api_error_codes))

    def _faults_json(self) -> dict[str, Any]:
        return {
            "errors": {
                method: [fault.to_json() for fault in planned] for method, planned in self._planned_faults.items()
            },
            "noBoot": self._no_boot_budget,
        }
