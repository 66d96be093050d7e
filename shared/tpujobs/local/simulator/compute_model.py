"""The simulated Compute Engine's core: operations, workload policies and instance templates, and
time for Compute records (operations finish, preempted VMs terminate) beside the TPU model's.

Every mutation answers a compute#operation that is PENDING, then RUNNING, then DONE after
``compute_operation_seconds``; what a delete removes goes when its operation is DONE. VMs and MIGs
are in compute_vms.py and compute_groups.py; the states: docs/local-stack.md#compute-engine.
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
    InstanceRecord,
    PolicyRecord,
    Step,
    TemplateRecord,
)
from tpujobs.local.simulator.records import NodeState, QrState, settled

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


class ComputeCore(Clockwork):
    """Operations, policies, templates, and the timed steps of Compute records."""

    # -- time -------------------------------------------------------------------------------

    def _due(self, now: float) -> list[DueStep]:
        """The TPU model's due steps and Compute Engine's: operations, then VMs, at equal times."""
        due = super()._due(now)
        due.extend(
            (op.due_at, 2, op.number, partial(self._complete, op))
            for op in self._compute.operations.values()
            if not op.done and op.due_at <= now
        )
        due.extend(
            (vm.next_at, 3, vm.number, partial(self._step_instance, vm))
            for vm in self._compute.instances.values()
            if vm.next_at is not None and vm.next_at <= now
        )
        return due

    def _complete(self, op: ComputeOperation, at: float) -> None:
        """An operation is due: apply its effect and mark it DONE (or put it off: a lone VM's
        insert waits until its slice is admitted or known to find no capacity)."""
        key = (op.project, op.scope, op.name)
        errors: tuple[tuple[str, str], ...] = ()
        http = (0, "")
        if op.effect is Effect.CHECK_CAPACITY:
            later, errors, http = self._capacity_verdict(op)
            if later is not None:
                self._compute.operations[key] = dataclasses.replace(op, due_at=max(later, at))
                self._dirty = True
                return
        elif op.effect is Effect.REMOVE_POLICY:
            self._compute.policies.pop(_key_of(op.target), None)
        elif op.effect is Effect.REMOVE_TEMPLATE:
            self._compute.templates.pop(_template_key(op.target), None)
        elif op.effect is Effect.REMOVE_GROUP:
            self._remove_group(op.target)
        elif op.effect is Effect.REMOVE_INSTANCE:
            self._compute.instances.pop(_key_of(op.target), None)
        self._compute.operations[key] = dataclasses.replace(
            op,
            done=True,
            end_time=self._wall_clock(),
            errors=errors,
            http_status=http[0],
            http_message=http[1],
        )
        self._dirty = True

    # Subclasses say what these do (compute_vms, compute_groups).
    def _capacity_verdict(
        self, op: ComputeOperation
    ) -> tuple[float | None, tuple[tuple[str, str], ...], tuple[int, str]]:  # pragma: no cover
        raise NotImplementedError

    def _step_instance(self, vm: InstanceRecord, at: float) -> None:  # pragma: no cover
        raise NotImplementedError

    def _remove_group(self, path: str) -> None:  # pragma: no cover
        raise NotImplementedError

    # -- operations -------------------------------------------------------------------------

    def _new_compute_operation(
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
        wall = self._wall_clock()
        number = self._new_number()
        wait = self._config.compute_operation_seconds if delay is None else delay
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
        self._compute.operations[(project, scope, op.name)] = op
        self._dirty = True
        return OperationView(op, "PENDING" if wait > 0 else "RUNNING")

    def _new_number(self) -> int:
        return FIRST_COMPUTE_NUMBER + self._count("compute")

    def get_compute_operation(self, project: str, scope: str, name: str) -> OperationView:
        """zoneOperations, regionOperations and globalOperations get (and wait, polling this)."""
        with self._transaction() as now:
            op = self._compute.operations.get((project, scope, name))
            if op is None:
                raise not_found(f"projects/{project}/{scope}/operations/{name}")
            return self._shown(op, now)

    def list_compute_operations(
        self, project: str, scope: str, filter_text: str = "", max_results: int = 0, page_token: str = ""
    ) -> Listing:
        keep = name_filter(filter_text)
        with self._transaction() as now:
            found = [
                self._shown(op, now)
                for (p, s, name), op in self._compute.operations.items()
                if (p, s) == (project, scope) and keep(name)
            ]
        return self._page(found, lambda view: view.record.name, max_results, page_token)

    @staticmethod
    def _shown(op: ComputeOperation, now: float) -> OperationView:
        status = "DONE" if op.done else "RUNNING" if now >= op.start_at else "PENDING"
        return OperationView(op, status)

    def _page(self, items: list[Any], name: Callable[[Any], str], max_results: int, page_token: str) -> Listing:
        shown, token = page_of(items, name, max_results or self._config.default_page_size, page_token)
        return Listing(tuple(shown), token)

    # -- workload policies ------------------------------------------------------------------

    def insert_policy(self, project: str, region: str, body: Mapping[str, Any]) -> OperationView:
        """resourcePolicies.insert of a workload policy (check_policy_body)."""
        check_policy_body(body)
        with self._transaction() as now:
            key = (project, region, str(body["name"]))
            policy = PolicyRecord(project, region, key[2], self._new_number(), dict(body), self._wall_clock())
            if key in self._compute.policies:
                raise already_exists(policy.path)
            self._compute.policies[key] = policy
            return self._new_compute_operation(project, f"regions/{region}", "insert", policy.path, policy.number, now)

    def get_policy(self, project: str, region: str, name: str) -> PolicyRecord:
        with self._transaction():
            return self._policy(project, region, name)

    def list_policies(
        self, project: str, region: str, filter_text: str = "", max_results: int = 0, token: str = ""
    ) -> Listing:
        keep = name_filter(filter_text)
        with self._transaction():
            found = [p for k, p in self._compute.policies.items() if k[:2] == (project, region) and keep(p.name)]
        return self._page(found, lambda p: p.name, max_results, token)

    def delete_policy(self, project: str, region: str, name: str) -> OperationView:
        """Refused while a MIG (one being deleted too) names the policy, as Google refuses it."""
        with self._transaction() as now:
            policy = self._policy(project, region, name)
            users = sorted(g.path for g in self._compute.groups.values() if g.policy == policy.path)
            if users:
                raise in_use("resource_policy", policy.path, users[0])
            scope = f"regions/{region}"
            return self._new_compute_operation(
                project, scope, "delete", policy.path, policy.number, now, Effect.REMOVE_POLICY
            )

    def _policy(self, project: str, region: str, name: str) -> PolicyRecord:
        policy = self._compute.policies.get((project, region, name))
        if policy is None:
            raise not_found(f"projects/{project}/regions/{region}/resourcePolicies/{name}")
        return policy

    # -- instance templates (region "" for global ones) ---------------------------------------

    def insert_template(self, project: str, region: str, body: Mapping[str, Any]) -> OperationView:
        check_name(body.get("name"))
        check_vm(body.get("properties") or {}, "resource.properties", None)
        with self._transaction() as now:
            key = (project, region, str(body["name"]))
            template = TemplateRecord(project, region, key[2], self._new_number(), dict(body), self._wall_clock())
            if key in self._compute.templates:
                raise already_exists(template.path)
            self._compute.templates[key] = template
            scope = f"regions/{region}" if region else "global"
            return self._new_compute_operation(project, scope, "insert", template.path, template.number, now)

    def get_template(self, project: str, region: str, name: str) -> TemplateRecord:
        with self._transaction():
            return self._template(project, region, name)

    def list_templates(
        self, project: str, region: str, filter_text: str = "", max_results: int = 0, token: str = ""
    ) -> Listing:
        keep = name_filter(filter_text)
        with self._transaction():
            found = [t for k, t in self._compute.templates.items() if k[:2] == (project, region) and keep(t.name)]
        return self._page(found, lambda t: t.name, max_results, token)

    def delete_template(self, project: str, region: str, name: str) -> OperationView:
        """Refused while a MIG uses the template."""
        with self._transaction() as now:
            template = self._template(project, region, name)
            users = sorted(g.path for g in self._compute.groups.values() if g.template == template.path)
            if users:
                raise in_use("instance_template", template.path, users[0])
            scope = f"regions/{region}" if region else "global"
            return self._new_compute_operation(
                project, scope, "delete", template.path, template.number, now, Effect.REMOVE_TEMPLATE
            )

    def _template(self, project: str, region: str, name: str) -> TemplateRecord:
        template = self._compute.templates.get((project, region, name))
        if template is None:
            where = f"regions/{region}" if region else "global"
            raise not_found(f"projects/{project}/{where}/instanceTemplates/{name}")
        return template

    # -- the TPU model's slices under Compute resources ------------------------------------------

    def _unback(self, qr_id: str, project: str, zone: str, now: float) -> None:
        """Take a Compute slice's queued resource away as a TPU delete does (its hosts get SIGTERM,
        SIGKILL after delete_grace_seconds); one that never got capacity just goes."""
        qr = self._qrs.get((project, zone, qr_id))
        if qr is None or qr.state is QrState.DELETING:
            return
        nodes = self._nodes_of(qr)
        if not nodes and not qr.holds_capacity:
            del self._qrs[(project, zone, qr_id)]
            self._dirty = True
            return
        for node in nodes:
            self._put_node(settled(node, state=NodeState.DELETING, health=""))
        deleting = self._put_qr(
            dataclasses.replace(qr, state=QrState.DELETING, next_at=now + self._config.deleting_seconds)
        )
        self._queue_hooks(self.on_stopped, deleting)
        self._admit(now)

    def _clear_step(self, vm: InstanceRecord) -> InstanceRecord:
        return dataclasses.replace(vm, next_at=None, step=Step.NONE)


def _key_of(path: str) -> tuple[str, str, str]:
    """(project, location, name) of `projects/P/{zones|regions}/L/KIND/NAME`."""
    parts = path.split("/")
    return parts[1], parts[3], parts[5]


def _template_key(path: str) -> tuple[str, str, str]:
    parts = path.split("/")
    if parts[2] == "global":
        return parts[1], "", parts[4]
    return parts[1], parts[3], parts[5]
