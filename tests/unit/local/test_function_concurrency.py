"""The local stack runs each function with as many threads as production serves requests at once."""

from __future__ import annotations

from pathlib import Path

from tpujobs.engine.topology import FUNCTIONS
from tpujobs.local import function_scale, processes, pusher

ROUTES = {route.target: route for route in FUNCTIONS}


def test_each_function_runs_one_process_with_a_thread_per_request_production_serves_at_once():
    """WORKERS is 1 and THREADS is max instances x concurrency (function_scale), for every target."""
    for target, route in ROUTES.items():
        spec = processes.function(route, 8080, source=Path("functions"), env={"PATH": "/usr/bin"})
        assert spec.env is not None
        expected = str(function_scale.SCALES[target].requests_at_once)
        assert (spec.env["WORKERS"], spec.env["THREADS"]) == ("1", expected), target
        assert spec.env["PATH"] == "/usr/bin"


def test_every_function_has_a_scale_and_no_other():
    """function_scale names exactly topology's targets: none is left at a guessed default."""
    assert set(function_scale.SCALES) == set(ROUTES)


def test_the_pusher_sends_no_more_at_once_than_the_function_has_threads():
    """Each route's pusher limit is its function's THREADS: no push waits for a free thread."""
    urls = {target: f"http://127.0.0.1:{8000 + i}/" for i, target in enumerate(ROUTES)}
    for route in pusher.routes("p", "", urls):
        target = next(t for t, url in urls.items() if url == route.endpoint)
        spec = processes.function(ROUTES[target], 8080, source=Path("functions"), env={})
        assert spec.env is not None
        assert int(spec.env["THREADS"]) == route.concurrency, target


def test_workers_and_threads_in_the_environment_win():
    """A WORKERS or THREADS the caller sets is kept, so other values can be measured."""
    spec = processes.function(
        ROUTES["submit_job"], 8080, source=Path("functions"), env={"WORKERS": "3", "THREADS": "2"}
    )
    assert spec.env is not None
    assert (spec.env["WORKERS"], spec.env["THREADS"]) == ("3", "2")
