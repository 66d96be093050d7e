"""The simulated Compute Engine's operations, workload policies and instance templates, and when
an operation is due: its effect (the part that owns what it changes registers a handler) and DONE.

Every mutation answers a compute#operation that is PENDING, then RUNNING, then DONE after
``compute_operation_seconds``; what a delete removes goes when its operation is DONE. VMs and MIGs
are parts of their own (compute_vms.py, compute_groups.py); the states: docs/local-stack.md#compute-engine.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any

from tpujobs.local.simulator.clockwork import Clockwork, DueStep
from tpujobs.local.simulator.compute_checks import check_name, check_policy_body, check_vm
from tpujobs.local.simulator.compute_errors import already_exists, in_use, not_found
from tpujobs.local.simulator.compute_lists import name_filter, page_of
from tpujobs.local.simulator.compute_records import (
    ComputeOperation,
    Effect,
    PolicyRecord,
    TemplateRecord,
)
from tpujobs.local.simulator.world import World

FIRST_COMPUTE_NUMBER = 2_000_000_000_000_000_000  # Compute ids are 19-digit numbers too


@dataclass(frozen=True)
class OperationView:
    """An operation and its status now."""

    record: ComputeOperation
    status: str  # PENDING, RUNNING or DONE


@dataclass(frozen=True)
class Listing:
    """One page of a list call."""

    items: tuple[Any, ...]
    next_page_token: str = ""


# What a due operation's effect says: put off until a time (None: now DONE), its errors and HTTP status.
Verdict = tuple[float | None, tuple[tuple[str, str], ...], tuple[int, str]]
EffectHandler = Callable[[ComputeOperation], Verdict]
DONE: Verdict = (None, (), (0, ""))


class ComputeOperations:
    """Operations, policies and templates; the operations' timed completion (a due source of the
    clockwork), whose effects on VMs and MIGs are the handlers those parts register (`handle`)."""

    def __init__(self, world: World, clockwork: Clockwork) -> None:
        self._world = world
        self._clockwork = clockwork
        self._effects: dict[Effect, EffectHandler] = {}
        clockwork.add_due_source(self._due)

    def handle(self, effect: Effect, handler: EffectHandler) -> None:
        """When an operation with *effect* is due, *handler* applies it and gives its verdict."""
        self._effects[effect] = handler

    def _due(self, now: float) -> list[DueStep]:
        return [
            (op.due_at, 2, op.number, partial(self.complete, op))
            for op in self._world.compute.operations.values()
            if not op.done and op.due_at <= now
        ]

    def complete(self, op: ComputeOperation, at: float) -> None:
        """An operation is due: apply its effect and mark it DONE (or put it off: a lone VM's
        insert waits until its slice is admitted or known to find no capacity). Callers hold the lock."""
        key = (op.project, op.scope, op.name)
        later, errors, http = DONE
        handler = self._effects.get(op.effect)
        if handler is not None:
            later, errors, http = handler(op)
            if later is not None:
                self._world.compute.operations[key] = dataclasses.replace(op, due_at=max(later, at))
                self._world.dirty = True
                return
        elif op.effect is Effect.REMOVE_POLICY:
            self._world.compute.policies.pop(_key_of(op.target), None)
        elif op.effect is Effect.REMOVE_TEMPLATE:
            self._world.compute.templates.pop(_template_key(op.target), None)
        elif op.effect is Effect.REMOVE_INSTANCE:
            self._world.compute.instances.pop(_key_of(op.target), None)
        self._world.compute.operations[key] = dataclasses.replace(
            op,
            done=True,
            end_time=self._world.wall_clock(),
            errors=errors,
            http_status=http[0],
            http_message=http[1],
        )
        self._world.dirty = True

    # -- operations -------------------------------------------------------------------------

    def new_operation(
        self,
        project: str,
        scope: str,
        operation_type: str,
        target: str,
        target_number: int,
        now: float,
        effect: Effect = Effect.NONE,
        delay: float | None = None,
    ) -> OperationView:
        wall = self._world.wall_clock()
        number = self.new_number()
        wait = self._world.config.compute_operation_seconds if delay is None else delay
        op = ComputeOperation(
            project=project,
            scope=scope,
            name=f"operation-{int(wall * 1000)}-{number % 16**12:012x}",
            number=number,
            operation_type=operation_type,
            target=target,
            target_number=target_number,
            insert_time=wall,
            start_at=now + wait / 2,
            due_at=now + wait,
            effect=effect,
        )
        self._world.compute.operations[(project, scope, op.name)] = op
        self._world.dirty = True
        return OperationView(op, "PENDING" if wait > 0 else "RUNNING")

    def new_number(self) -> int:
        return FIRST_COMPUTE_NUMBER + self._world.count("compute")

    def get_compute_operation(self, project: str, scope: str, name: str) -> OperationView:
        """zoneOperations, regionOperations and globalOperations get (and wait, polling this)."""
        with self._clockwork.transaction() as now:
            op = self._world.compute.operations.get((project, scope, name))
            if op is None:
                raise not_found(f"projects/{project}/{scope}/operations/{name}")
            return self._shown(op, now)

    def list_compute_operations(
        self, project: str, scope: str, filter_text: str = "", max_results: int = 0, page_token: str = ""
    ) -> Listing:
        keep = name_filter(filter_text)
        with self._clockwork.transaction() as now:
            found = [
                self._shown(op, now)
                for (p, s, name), op in self._world.compute.operations.items()
                if (p, s) == (project, scope) and keep(name)
            ]
        return self.page(found, lambda view: view.record.name, max_results, page_token)

    @staticmethod
    def _shown(op: ComputeOperation, now: float) -> OperationView:
        status = "DONE" if op.done else "RUNNING" if now >= op.start_at else "PENDING"
        return OperationView(op, status)

    def page(self, items: list[Any], name: Callable[[Any], str], max_results: int, page_token: str) -> Listing:
        shown, token = page_of(items, name, max_results or self._world.config.default_page_size, page_token)
        return Listing(tuple(shown), token)

    # -- workload policies ------------------------------------------------------------------

    def insert_policy(self, project: str, region: str, body: Mapping[str, Any]) -> OperationView:
        """resourcePolicies.insert of a workload policy (check_policy_body)."""
        check_policy_body(body)
        with self._clockwork.transaction() as now:
            key = (project, region, str(body["name"]))
            policy = PolicyRecord(project, region, key[2], self.new_number(), dict(body), self._world.wall_clock())
            if key in self._world.compute.policies:
                raise already_exists(policy.path)
            self._world.compute.policies[key] = policy
            return self.new_operation(project, f"regions/{region}", "insert", policy.path, policy.number, now)

    def get_policy(self, project: str, region: str, name: str) -> PolicyRecord:
        with self._clockwork.transaction():
            return self.policy(project, region, name)

    def list_policies(
        self, project: str, region: str, filter_text: str = "", max_results: int = 0, token: str = ""
    ) -> Listing:
        keep = name_filter(filter_text)
        with self._clockwork.transaction():
            found = [p for k, p in self._world.compute.policies.items() if k[:2] == (project, region) and keep(p.name)]
        return self.page(found, lambda p: p.name, max_results, token)

    def delete_policy(self, project: str, region: str, name: str) -> OperationView:
        """Refused while a MIG (one being deleted too) names the policy, as Google refuses it."""
        with self._clockwork.transaction() as now:
            policy = self.policy(project, region, name)
            users = sorted(g.path for g in self._world.compute.groups.values() if g.policy == policy.path)
            if users:
                raise in_use("resource_policy", policy.path, users[0])
            scope = f"regions/{region}"
            return self.new_operation(project, scope, "delete", policy.path, policy.number, now, Effect.REMOVE_POLICY)

    def policy(self, project: str, region: str, name: str) -> PolicyRecord:
        policy = self._world.compute.policies.get((project, region, name))
        if policy is None:
            raise not_found(f"projects/{project}/regions/{region}/resourcePolicies/{name}")
        return policy

    # -- instance templates (region "" for global ones) ---------------------------------------

    def insert_template(self, project: str, region: str, body: Mapping[str, Any]) -> OperationView:
        check_name(body.get("name"))
        check_vm(body.get("properties") or {}, "resource.properties", None)
        with self._clockwork.transaction() as now:
            key = (project, region, str(body["name"]))
            template = TemplateRecord(project, region, key[2], self.new_number(), dict(body), self._world.wall_clock())
            if key in self._world.compute.templates:
                raise already_exists(template.path)
            self._world.compute.templates[key] = template
            scope = f"regions/{region}" if region else "global"
            return self.new_operation(project, scope, "insert", template.path, template.number, now)

    def get_template(self, project: str, region: str, name: str) -> TemplateRecord:
        with self._clockwork.transaction():
            return self.template(project, region, name)

    def list_templates(
        self, project: str, region: str, filter_text: str = "", max_results: int = 0, token: str = ""
    ) -> Listing:
        keep = name_filter(filter_text)
        with self._clockwork.transaction():
            found = [t for k, t in self._world.compute.templates.items() if k[:2] == (project, region) and keep(t.name)]
        return self.page(found, lambda t: t.name, max_results, token)

    def delete_template(self, project: str, region: str, name: str) -> OperationView:
        """Refused while a MIG uses the template."""
        with self._clockwork.transaction() as now:
            template = self.template(project, region, name)
            users = sorted(g.path for g in self._world.compute.groups.values() if g.template == template.path)
            if users:
                raise in_use("instance_template", template.path, users[0])
            scope = f"regions/{region}" if region else "global"
            return self.new_operation(
                project, scope, "delete", template.path, template.number, now, Effect.REMOVE_TEMPLATE
            )

    def template(self, project: str, region: str, name: str) -> TemplateRecord:
        template = self._world.compute.templates.get((project, region, name))
        if template is None:
            where = f"regions/{region}" if region else "global"
            raise not_found(f"projects/{project}/{where}/instanceTemplates/{name}")
        return template


def _key_of(path: str) -> tuple[str, str, str]:
    """(project, location, name) of `projects/P/{zones|regions}/L/KIND/NAME`."""
    parts = path.split("/")
    return parts[1], parts[3], parts[5]


def _template_key(path: str) -> tuple[str, str, str]:
    parts = path.split("/")
    if parts[2] == "global":
        return parts[1], "", parts[4]
    return parts[1], parts[3], parts[5]
