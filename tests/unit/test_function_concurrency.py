"""The local stack runs each function with the processes and threads chosen for it."""

from __future__ import annotations

from pathlib import Path

from tpujobs.engine.topology import FUNCTIONS
from tpujobs.local import processes

ROUTES = {route.target: route for route in FUNCTIONS}


def test_each_function_gets_its_workers_and_threads_from_the_table():
    """WORKERS and THREADS come from FUNCTION_CONCURRENCY, or its default, for every target."""
    for target, route in ROUTES.items():
        spec = processes.function(route, 8080, source=Path("functions"), env={"PATH": "/usr/bin"})
        workers, threads = processes.FUNCTION_CONCURRENCY.get(target, processes.DEFAULT_FUNCTION_CONCURRENCY)
        assert spec.env is not None
        assert (spec.env["WORKERS"], spec.env["THREADS"]) == (str(workers), str(threads)), target
        assert spec.env["PATH"] == "/usr/bin"


def test_the_api_has_more_threads_than_a_push_subscription_can_use():
    """The emulator pushes at most 2 messages at once per subscription; the HTTP API has any number of callers."""
    submit = processes.function(ROUTES["submit_job"], 8080, source=Path("functions"), env={})
    api = processes.function(ROUTES["jobs"], 8081, source=Path("functions"), env={})
    assert submit.env is not None and api.env is not None
    assert int(submit.env["THREADS"]) >= 2
    assert int(api.env["THREADS"]) > int(submit.env["THREADS"])


def test_workers_and_threads_in_the_environment_win():
    """A WORKERS or THREADS the caller sets is kept, so other values can be measured."""
    spec = processes.function(
        ROUTES["submit_job"], 8080, source=Path("functions"), env={"WORKERS": "3", "THREADS": "2"}
    )
    assert spec.env is not None
    assert (spec.env["WORKERS"], spec.env["THREADS"]) == ("3", "2")
