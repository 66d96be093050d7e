"""Every port Protocol of the engine has a contract suite here, run against its fake and its adapter.

A suite names the ports it holds in its module docstring, in backticks (`ports.Teams`,
`notifications.WebhookPoster`). A Protocol that is no port has its reason in SEAMS or VIEWS; a port
still without a suite is in STILL_MISSING, which may only shrink: a name there that gets a suite,
or is no Protocol any more, fails here until it is taken off.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ENGINE = Path(__file__).parents[2] / "shared" / "tpujobs" / "engine"
CONTRACTS = Path(__file__).parent

# Protocols between the engine's own services: the engine implements them, no adapter or fake does.
SEAMS = {
    "AttemptEnds": "engine.budgets.TeamBudgets, for the notifier",
    "BudgetNotices": "engine.budget_notices.WebhookBudgetNotices, over WebhookPoster and WebhookSecrets",
    "Headers": "a request's headers, Flask's or a dict: no I/O",
    "JobRepairs": "the reconciler's view of the job services",
    "PoolAccess": "warm_pools.PoolAccess, for vetting",
    "PoolControls": "warm_pools.PoolManagement, for controls",
    "PoolConvergence": "warm_pools.PoolManagement, for converge",
    "PoolRepairs": "the reconciler's view of the warm pools",
    "UnitObserver": "the warm pools' units, for capacity events",
    "UnitZones": "the warm pools' units, for audit entries",
    "WarmPoolJobs": "warm_pools.PoolJobs, for the lifecycle",
}
# Protocols that narrow a port with a suite to the methods one caller needs (checked below).
VIEWS = {
    "EarlierHosts": "WorkerRecords",
    "HoldingStates": "Capacity",
    "NotifyJobs": "JobRecords",
}
# Ports with an adapter but no contract suite yet: this list only shrinks (none is left).
STILL_MISSING: set[str] = set()


def protocols() -> dict[str, ast.ClassDef]:
    """Every class of engine/ that derives from Protocol, by name."""
    found = {}
    for path in sorted(ENGINE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ClassDef) and any(_is_protocol(base) for base in node.bases):
                assert node.name not in found, f"two Protocols named {node.name} in engine/: name them apart"
                found[node.name] = node
    return found


def _is_protocol(base: ast.expr) -> bool:
    return (isinstance(base, ast.Name) and base.id == "Protocol") or (
        isinstance(base, ast.Attribute) and base.attr == "Protocol"
    )


def named_by_suites() -> set[str]:
    """The names in backticks in the docstrings of the contract suites, less any qualifier."""
    named = set()
    for path in CONTRACTS.glob("test_contract_*.py"):
        docstring = ast.get_docstring(ast.parse(path.read_text())) or ""
        named |= {match.rsplit(".", 1)[-1] for match in re.findall(r"`([\w.]+)`", docstring)}
    return named


def methods(name: str, found: dict[str, ast.ClassDef]) -> set[str]:
    """A Protocol's methods, its Protocol bases' included."""
    node = found[name]
    own = {item.name for item in node.body if isinstance(item, ast.FunctionDef)}
    bases = [base.id for base in node.bases if isinstance(base, ast.Name) and base.id in found]
    return own.union(*(methods(base, found) for base in bases))


def covered(found: dict[str, ast.ClassDef]) -> set[str]:
    """Named by a suite, or a union of covered Protocols and views that adds no method of its own."""
    named = named_by_suites() & set(found)
    held = named | {view for view, port in VIEWS.items() if port in named}
    for name, node in found.items():
        bases = [base.id for base in node.bases if isinstance(base, ast.Name) and base.id in found]
        adds = any(isinstance(item, ast.FunctionDef) for item in node.body)
        if bases and not adds and set(bases) <= held:
            named.add(name)
    return named


def test_every_port_of_the_engine_has_a_contract_suite():
    """A new port comes with its suite (fake and adapter), or says here why it has none."""
    found = protocols()
    unexplained = set(found) - covered(found) - set(SEAMS) - set(VIEWS) - STILL_MISSING
    assert not unexplained, (
        f"{sorted(unexplained)}: no suite in tests/contract names these ports in its docstring; "
        "write one (the fake and the adapter), or say here why it needs none"
    )


def test_the_lists_of_ports_without_a_suite_only_shrink():
    """A listed name that got a suite, or is no Protocol any more, comes off its list."""
    found = protocols()
    listed = set(SEAMS) | set(VIEWS) | STILL_MISSING
    assert not listed - set(found), f"{sorted(listed - set(found))}: no such Protocol in engine/ now"
    assert not listed & covered(found), f"{sorted(listed & covered(found))}: a suite holds them now"


def test_a_view_only_narrows_a_port_that_has_a_suite():
    """Each view's methods are its port's, so the port's suite holds them."""
    found = protocols()
    for view, port in VIEWS.items():
        assert port in covered(found), f"{view} narrows {port}, which no suite holds"
        assert methods(view, found) <= methods(port, found), f"{view} has methods {port} lacks"
