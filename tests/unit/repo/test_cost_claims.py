"""The Firestore read counts the docs give, computed again from Firestore's billing rule for
aggregation queries: one document read per batch of up to 1,000 index entries matched, at least one."""

from __future__ import annotations

import math
import re
from pathlib import Path

DOCS = Path(__file__).resolve().parents[3] / "docs"
COUNT_BATCH = 1_000  # index entries billed as one document read by a count()


def count_reads(entries: int) -> int:
    """What one count() matching `entries` index entries is billed, in document reads."""
    return max(1, math.ceil(entries / COUNT_BATCH))


def test_count_billing_follows_firestores_examples() -> None:
    """0 to 1,000 entries are one read, 1,500 are two (Firestore's pricing page's own examples)."""
    assert [count_reads(n) for n in (0, 1, 1_000, 1_001, 1_500, 2_000, 2_001)] == [1, 1, 1, 2, 2, 2, 3]


def test_the_counts_of_a_1024_host_attempt_cost_what_scale_md_says() -> None:
    """Each `started` counts the hosts heard so far (the k-th matches k entries): docs/scale.md's
    figure is the sum of those counts' reads, not zero."""
    text = " ".join((DOCS / "scale.md").read_text().split())
    said = re.search(r"a 1,024-host attempt cost ([0-9,]+) reads", text)
    assert said is not None
    assert int(said.group(1).replace(",", "")) == sum(count_reads(k) for k in range(1, 1_025)) == 1_048


def test_no_doc_says_a_count_reads_nothing() -> None:
    """The claim issue 28 found (`count()`: no document is read) is gone from every page."""
    for page in DOCS.glob("*.md"):
        text = " ".join(page.read_text().split())
        assert "`count()`: no document is read" not in text, page.name
