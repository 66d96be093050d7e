"""The dashboard's HTML: routes to the engine's views, Jinja2 templates, a strict CSP.

Every name, command, label and output line is a user's text, so autoescape is on for every
template and nothing is marked safe. No script at all: a page whose jobs still move refreshes
itself with `<meta http-equiv="refresh">`, and the CSP forbids scripts, frames and other origins.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from typing import TYPE_CHECKING

import jinja2

from tpujobs.engine.dashboard.caller import Unauthenticated
from tpujobs.engine.dashboard.usage import MAX_DAYS
from tpujobs.engine.errors import TransientError
from tpujobs.engine.jobs_api.answers import ApiError

if TYPE_CHECKING:
    from tpujobs.engine.dashboard.caller import DashboardCaller
    from tpujobs.engine.dashboard.views import DashboardViews
    from tpujobs.engine.identity import Headers

log = logging.getLogger(__name__)

CSP = (
    "default-src 'none'; style-src 'self'; img-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)
SECURITY_HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}
REFRESH_SECONDS = 10
JOB_PATH = re.compile(r"^/jobs/(?P<job_id>[^/]+)$")


@dataclass(frozen=True)
class Page:
    body: str
    status: int
    headers: Mapping[str, str]


def environment() -> jinja2.Environment:
    """The templates shipped beside this module, autoescaped whatever their name."""
    return jinja2.Environment(
        loader=jinja2.PackageLoader("tpujobs.runtime", "templates/dashboard"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
    )


class DashboardSite:
    """One GET -> one page for its caller."""

    def __init__(self, views: DashboardViews, caller: DashboardCaller) -> None:
        self.views = views
        self.caller = caller
        self.templates = environment()
        self.css = resources.files("tpujobs.runtime").joinpath("templates/dashboard/style.css").read_text("utf-8")

    def handle(self, method: str, path: str, query: Mapping[str, str], headers: Headers) -> Page:
        """The page at `path`; 401 without a verified caller, 4xx for bad requests, never a traceback."""
        try:
            if method.upper() not in ("GET", "HEAD"):
                return self._error(405, "The dashboard only reads: use GET.")
            caller = self.caller.email(headers)
            if path == "/style.css":
                return Page(self.css, 200, {**SECURITY_HEADERS, "Content-Type": "text/css; charset=utf-8"})
            return self._page(caller, path, query)
        except Unauthenticated as error:
            log.warning("refused a dashboard request: %s", error)
            return self._error(401, str(error))
        except ApiError as error:
            return self._error(error.status, error.message)
        except TransientError as error:
            log.warning("dashboard unavailable for now: %s", error)
            return self._error(503, "Temporarily unavailable: reload in a moment.")
        except Exception:
            log.exception("the dashboard failed")
            return self._error(500, "Internal error: see the function's logs.")

    def _page(self, caller: str, path: str, query: Mapping[str, str]) -> Page:
        if path in ("/", "/jobs"):
            page = self.views.jobs(caller, query)
            return self._render("jobs.html", caller, "jobs", page.moving, page=page)
        match = JOB_PATH.match(path)
        if match:
            job = self.views.job(caller, match["job_id"])
            return self._render("job.html", caller, "jobs", job.moving, job=job)
        if path == "/pools":
            pools = self.views.pools(caller)
            return self._render("pools.html", caller, "pools", any(pool.held for pool in pools), pools=pools)
        if path == "/usage":
            return self._render(
                "usage.html", caller, "usage", False, usage=self.views.usage(caller, query), max_days=MAX_DAYS
            )
        if path == "/teams":
            return self._render("teams.html", caller, "teams", False, page=self.views.teams(caller))
        raise ApiError(404, f"No page {path!r}.")

    def _render(self, name: str, caller: str, section: str, moving: bool, **context: object) -> Page:
        body = self.templates.get_template(name).render(
            caller=caller, section=section, refresh=REFRESH_SECONDS if moving else None, **context
        )
        return Page(body, 200, {**SECURITY_HEADERS, "Content-Type": "text/html; charset=utf-8"})

    def _error(self, status: int, message: str) -> Page:
        body = self.templates.get_template("error.html").render(status=status, message=message)
        return Page(body, status, {**SECURITY_HEADERS, "Content-Type": "text/html; charset=utf-8"})
