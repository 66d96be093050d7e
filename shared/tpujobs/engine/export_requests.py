"""tpujobs-log-export: a request to put one ended attempt's output chunks together."""

from __future__ import annotations

from tpujobs.engine.messages import Attempt, JobId, Strict


class LogExportRequest(Strict):
    """tpujobs-log-export: put one ended attempt's output chunks together (`tpujobs.engine.output_export`)."""

    job_id: JobId
    attempt: Attempt
