"""The jobs API's `usage`: a month's chip-hours, goodput and estimated cost per team, owner or label.

An admin's answer sums every job; anyone else's sums only their own jobs (`scope` says which), so
no one learns another team's spend through it. Answered from `engine.usage_report.MonthlyUsage`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tpujobs.engine.jobs_api.answers import ApiError, Response

if TYPE_CHECKING:
    from tpujobs.engine.jobs_api.requests import UsageRequest
    from tpujobs.engine.settings import Settings
    from tpujobs.engine.usage_report import MonthlyUsage


class UsageActions:
    """`usage`, for admins (every job) and everyone else (their own)."""

    def __init__(self, usage: MonthlyUsage | None, settings: Settings) -> None:
        self._usage, self.settings = usage, settings

    def report(self, caller: str, request: UsageRequest) -> Response:
        if self._usage is None:
            raise ApiError(503, "This deployment's API was built without usage reports.")
        owner = None if caller in self.settings.admins else caller
        try:
            return Response(200, self._usage.report(request.by, request.month, owner))
        except ValueError as error:
            raise ApiError(400, str(error)) from None
