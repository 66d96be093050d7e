"""The function module stays cheap to import: no Google client library until a call needs it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

FUNCTIONS = Path(__file__).resolve().parents[3] / "functions"
HEAVY = ("google.cloud.firestore", "google.cloud.pubsub", "google.cloud.tpu_v2", "google.cloud.storage")


def test_importing_functions_main_loads_no_client_library():
    """Cold start pays only for functions-framework: clients are imported and built on first use."""
    probe = (
        "import json, sys; sys.path.insert(0, sys.argv[1]); import main; "
        "print(json.dumps(sorted(m for m in sys.modules if m.startswith('google.cloud'))))"
    )
    result = subprocess.run([sys.executable, "-c", probe, str(FUNCTIONS)], capture_output=True, text=True, check=True)
    loaded = json.loads(result.stdout.strip().splitlines()[-1])
    assert not [m for m in loaded if m.startswith(HEAVY)], loaded


def test_every_route_has_its_target_in_functions_main():
    """topology.FUNCTIONS and functions/main.py name the same targets."""
    import ast

    from tpujobs.engine.topology import FUNCTIONS as ROUTES

    tree = ast.parse((FUNCTIONS / "main.py").read_text(encoding="utf-8"))
    targets = {
        node.name
        for node in tree.body
        if isinstance(node, ast.FunctionDef) and node.decorator_list  # the framework's targets
    }
    assert {route.target for route in ROUTES} == targets
