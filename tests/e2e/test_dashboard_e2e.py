"""The web dashboard on the whole local stack, as a person sees it in headless Chromium.

One job still running (it printed a `<script>` line) and one finished: every page is loaded at a
phone width (390) and a desktop width (1280); what the browser built is checked (ids, states,
chip-hours, the SVG plots, the script shown as text), and a screenshot of each page is kept
under .tpujobs/screenshots/ (gitignored) for a person to look at.
"""

from __future__ import annotations

import getpass
import os
import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from tpujobs.local.testing import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(480)]  # a stack, two jobs, 15 Chromium runs of ~5 s

ROOT = Path(__file__).resolve().parents[2]
SCREENSHOTS = ROOT / ".tpujobs" / "screenshots"
WIDTHS = (390, 1280)
SCRIPT = "<script>alert(1)</script>"
ESCAPED = "&lt;script&gt;alert(1)&lt;/script&gt;"
CHROMIUM_TIMEOUT_S = 60  # a cold Chromium on a loaded two-core machine takes seconds, never a minute


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


def test_each_page_shows_a_running_and_a_finished_job_at_phone_and_desktop_widths(env, submit_job):
    """Jobs, both job pages, pools and usage: the ids, states, chip-hours, SVG plots and the
    `<script>` output as text, in what Chromium built at both widths; a screenshot of each."""
    browser = chromium()
    base = os.environ["TPUJOBS_DASHBOARD_URL"].rstrip("/")
    owner = os.environ.get("TPUJOBS_OWNER") or getpass.getuser()  # the stack's dashboard user
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
        "pools": ("/pools", ["Warm pools"]),
        "usage": ("/usage", ["Chip-hours per day", 'class="chart"', f"owner {owner}"]),
    }
    for name, (path, wanted) in pages.items():
        dom = browse(browser, base + path, 1280, "--dump-dom")
        for text in wanted:
            assert text in dom, f"{name}: {text!r} not on the page"
        assert "<script" not in dom, f"{name}: a script element was built"
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
