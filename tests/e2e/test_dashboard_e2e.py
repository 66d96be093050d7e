"""The web dashboard on the whole local stack, as a person sees it in headless Chromium.

One job still running (it printed a `<script>` line), one finished, and a warm pool whose unit
holds a third: every page is loaded at a phone width (390) and a desktop width (1280); what the
browser built is checked (ids, states, chip-hours, the SVG plots, the pool's holder, the script
shown as text), and a screenshot of each page is kept under .tpujobs/screenshots/ (gitignored)
for a person to look at.
"""

from __future__ import annotations

import getpass
import os
import re
import shutil
import subprocess
import sys
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tpujobs.cli.demo_pool import LocalPools
from tpujobs.domain.states import JobState
from tpujobs.engine.settings import Settings
from tpujobs.local.testing import wait_for

# A stack, two jobs, a pool of one unit booting and a job on it, 18 Chromium runs of ~5 s.
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parents[2]
SCREENSHOTS = ROOT / ".tpujobs" / "screenshots"
WIDTHS = (390, 1280)
SCRIPT = "<script>alert(1)</script>"
ESCAPED = "&lt;script&gt;alert(1)&lt;/script&gt;"
CHROMIUM_TIMEOUT_S = 60  # a cold Chromium on a loaded two-core machine takes seconds, never a minute
POOL_TIMEOUT_S = 180  # a unit boots its agent, a job is placed on it: seconds, generously bounded
POOL_OWNER = "dash-pools@example.com"


def chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        pytest.skip("chromium is not installed (Debian: apt-get install chromium)")
    return found


def browse(browser: str, url: str, width: int, *action: str) -> str:
    """Chromium headless on `url` at `width` x 900, doing `action` (--dump-dom, --screenshot=F)."""
    result = subprocess.run(
        [
            browser,
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            f"--window-size={width},900",
            *action,
            url,
        ],
        capture_output=True,
        text=True,
        timeout=CHROMIUM_TIMEOUT_S,
        check=True,
    )
    return result.stdout


def fetch(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as answer:
        return answer.read().decode()


@pytest.fixture
def held_pool(local_stack) -> Iterator[tuple[str, str]]:
    """(pool, job): a one-unit pool that the dashboard's user may use (a `users` entry), its unit
    holding a sleeping job; the pool is deleted afterwards (its job cancelled, its unit released)."""
    viewer = os.environ.get("TPUJOBS_OWNER") or getpass.getuser()
    pools = LocalPools(Settings.from_env(), local_stack, owner=POOL_OWNER)
    pools.allow()
    name = f"dash-{uuid.uuid4().hex[:6]}"
    pools.create(name, count=1, users=[viewer])
    try:
        pools.wait_idle(name, 1, POOL_TIMEOUT_S)
        job_id, _ = pools.submit({"name": "on-pool", "accelerator_type": "v4-8", "pool": name, "command": "sleep 600"})

        def holding():
            job = pools.store.get(job_id)
            return job if job is not None and job.state is JobState.RUNNING and job.warm_pool_unit else None

        wait_for(holding, timeout=POOL_TIMEOUT_S, interval=0.5, what=f"{job_id} RUNNING on a unit of {name}")
        yield name, job_id
    finally:
        if pools.describe(name) is not None:
            pools.delete(name)
        pools.wait_gone(name, POOL_TIMEOUT_S)


def pool_section(dom: str, name: str) -> str:
    """The pool's own <section> of the pools page."""
    start = dom.index(f"<h2>{name} ")
    end = dom.find("</section>", start)
    return dom[start:end]


def test_each_page_shows_a_running_and_a_finished_job_at_phone_and_desktop_widths(env, submit_job, held_pool):
    """Jobs, both job pages, pools, usage and teams: the ids, states, chip-hours, SVG plots, the pool's
    unit and its holder, and the `<script>` output as text, in what Chromium built at both widths;
    a screenshot of each."""
    browser = chromium()
    base = os.environ["TPUJOBS_DASHBOARD_URL"].rstrip("/")
    owner = os.environ.get("TPUJOBS_OWNER") or getpass.getuser()  # the stack's dashboard user
    pool, on_pool = held_pool
    running = submit_job(prefix="dash-run", owner=owner, command=f"echo '{SCRIPT}'; sleep 600")
    finished = submit_job(prefix="dash-done", owner=owner, command="echo all-done")

    def ended():
        job = env["store"].get(finished)
        return job if job and job.state.is_terminal else None

    ended.__doc__ = f"{finished} to end"
    wait_for(ended, timeout=120)

    def output_shown():
        return ESCAPED in fetch(f"{base}/jobs/{running}")

    output_shown.__doc__ = f"{running}'s <script> line on its page"
    wait_for(output_shown, timeout=120, interval=1.0)

    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    pages = {
        "jobs": ("/", [running, finished, "RUNNING", "SUCCEEDED", "Chip-hours"]),
        "job-running": (f"/jobs/{running}", [running, "RUNNING", "chip-hours", 'class="timeline"', ESCAPED]),
        "job-finished": (f"/jobs/{finished}", [finished, "SUCCEEDED", "chip-hours", 'class="timeline"', "all-done"]),
        "pools": (
            "/pools",
            ["Warm pools", pool, f'<a href="/jobs/{on_pool}">{on_pool}</a>', "Busy share of held chips"],
        ),
        "usage": ("/usage", ["Chip-hours per day", 'class="chart"', f"owner {owner}"]),
        "teams": ("/teams", ["<h1>Teams</h1>", "every team"]),  # whatever teams the stack keeps: the page, its rule
    }
    for name, (path, wanted) in pages.items():
        dom = browse(browser, base + path, 1280, "--dump-dom")
        for text in wanted:
            assert text in dom, f"{name}: {text!r} not on the page"
        assert "<script" not in dom, f"{name}: a script element was built"
        if name == "pools":  # the unit, held; the plot has a bar for the hour its job runs in
            section = pool_section(dom, pool)
            assert "BUSY" in section and on_pool in section, section
            heights = [float(h) for h in re.findall(r'<rect class="bar"[^>]* height="([0-9.]+)"', section)]
            assert len(heights) == 24 and max(heights) > 0, heights
        for width in WIDTHS:
            shot = SCREENSHOTS / f"{name}-{width}.png"
            shot.unlink(missing_ok=True)
            browse(browser, base + path, width, f"--screenshot={shot}")
            assert shot.exists() and shot.stat().st_size > 1000, f"no screenshot of {name} at {width}"
    subprocess.run(
        [str(Path(sys.executable).with_name("tpujobs")), "cancel", running, "--owner", owner],
        capture_output=True,
        timeout=60,
        check=False,
    )
