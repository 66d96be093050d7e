"""`tpujobs usage` and the jobs API's `usage`: a month's chip-hours, goodput and estimated cost per group.

Reads every job that may have held chips in the month through the usage page's port
(`UsageJobs`, which the usage page reads too: the jobs not yet ended, then those ended since the month
began, a page at a time, projected), prices from `config/prices` over the shipped defaults
(`PriceBook`), and sums with `domain.usage`. An owner's report (`owner`) sums only their jobs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from tpujobs.domain.prices import CURRENCY, READ_ON, SOURCES, Prices
from tpujobs.domain.usage import Month, check_by, usage_report

PAGE_SIZE = 500  # jobs read per query page

if TYPE_CHECKING:
    from collections.abc import Iterator
    from datetime import datetime

    from tpujobs.domain.job import Job
    from tpujobs.engine.ports import Clock


class UsageJobs(Protocol):
    """The jobs a usage window sums (`adapters.firestore_usage`, `local.fakes.usage_jobs`)."""

    def overlapping(self, since: datetime, page_size: int = PAGE_SIZE) -> Iterator[list[Job]]:
        """Every job that may hold chips at or after `since`: those not yet ended, then those that
        ended at or after it, a page at a time with a cursor between pages (never a cap). A job
        that ends between the two reads comes twice. Projected: owner, labels and usage are read;
        the rest of the spec is not."""


class PriceBook(Protocol):
    """`config/prices` over the shipped defaults (`adapters.firestore_prices`)."""

    def prices(self) -> Prices: ...


class FixedPrices:
    """A PriceBook of given prices (default: the shipped ones): tests, and a deployment without Firestore."""

    def __init__(self, prices: Prices | None = None) -> None:
        self._prices = prices or Prices()

    def prices(self) -> Prices:
        return self._prices


class MonthlyUsage:
    """The month's sums per group, as the CLI prints them and the API answers them."""

    def __init__(self, jobs: UsageJobs, prices: PriceBook, clock: Clock) -> None:
        self.jobs, self.price_book, self.clock = jobs, prices, clock

    def report(self, by: str = "team", month: str | None = None, owner: str | None = None) -> dict[str, Any]:
        """The document `tpujobs usage -o json` prints; ValueError for a bad `by` or `month`."""
        check_by(by)
        now = self.clock()
        wanted = Month.parse(month) if month else Month.of(now)
        prices = self.price_book.prices()
        report = usage_report(self._pages(wanted, owner), wanted, by, prices, now)
        return {
            **report.as_dict(),
            "scope": f"owner {owner}" if owner else "all",
            "prices": {
                "currency": CURRENCY,
                "estimate": True,
                "config_prices": prices.overridden,
                "problems": list(prices.problems),
                "defaults_read_on": READ_ON,
                "sources": list(SOURCES),
            },
        }

    def _pages(self, month: Month, owner: str | None) -> Iterator[list[Job]]:
        for page in self.jobs.overlapping(month.start):
            yield [job for job in page if owner is None or job.owner == owner]
