"""Error classes: is a worker's failed command worth another attempt (`retry_on`)?

A listed exit code is matched here. Output patterns are not: the agent matches them on the
job's own host against its last lines and says which pattern matched which line, because a
pattern that backtracks without end must never stall a function that serves every team.
That claim is believed as sent: a forged one could only change the retry of the job whose
host signed it, and only within its `max_restarts`, which its owner could set anyway.
"""

from __future__ import annotations

from dataclasses import dataclass

from tpujobs.domain.spec import RetryOn

MAX_QUOTE_CHARS = 200  # of the matching line, in the timeline's reason
MAX_PATTERN_CHARS = 64  # of the pattern, likewise


@dataclass(frozen=True)
class ErrorClass:
    """The class of one failed command, and the words that say why."""

    retryable: bool
    why: str  # 'exit code 7 is listed', 'output matched "X": "the line"', ...


def classify_error(
    retry_on: RetryOn | None, exit_code: int | None, pattern: int | None, line: str
) -> ErrorClass | None:
    """The class of a command that exited with `exit_code`, whose agent said its output matched
    retry_on.output[`pattern`] in `line`; None for a job without `retry_on` (one `on_error` for all)."""
    if retry_on is None:
        return None
    if exit_code is not None and exit_code in retry_on.exit_codes:
        return ErrorClass(True, f"exit code {exit_code} is listed in retry_on.exit_codes")
    if pattern is not None and 0 <= pattern < len(retry_on.output):
        return ErrorClass(
            True, f"output matched {_quoted(retry_on.output[pattern], MAX_PATTERN_CHARS)}: {_quoted(line)}"
        )
    return ErrorClass(
        False, f"exit code {exit_code} is not listed and no retry_on.output pattern matched its last lines"
    )


def _quoted(text: str, limit: int = MAX_QUOTE_CHARS) -> str:
    """`text` in double quotes, cut to `limit` characters with '...' when longer."""
    shown = text if len(text) <= limit else text[: limit - 3] + "..."
    return f'"{shown}"'
