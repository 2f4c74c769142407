"""One report's price reads, memoized: each offer's steps read once over the report's window.

A savings report prices every job's copies and both of its baselines over the store's history; jobs
share a handful of offers, and a report of 300 jobs read the same few offers' history 700 times (one SQL
query and one pandas frame each: ~6-8 s of a 2-core machine for that report, docs/reliability.md
"Soak"). :class:`MemoSteps` reads an offer's steps once over ``[start, end)`` of its window and answers
every range inside the window from memory, exactly as the wrapped view would (the
:class:`~costopt.ledger.prices.PriceSteps` contract); a range outside it, or an offer whose steps are
not one time-ordered series, is passed to the wrapped view. Made for one report (one request): the
store's later changes are not seen.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Sequence
from datetime import datetime
from itertools import pairwise

from costopt.domain import OfferKey
from costopt.ledger.prices import PriceStep, PriceView, WrappedView

__all__ = ["MemoSteps"]


class MemoSteps(WrappedView):
    """``view`` with each offer's steps over ``[start, end)`` (tz-aware UTC) read once (module doc)."""

    def __init__(self, view: PriceView, start: datetime, end: datetime) -> None:
        if end < start:
            raise ValueError(f"the window ends {end} before it starts {start}")
        super().__init__(view)
        self.start, self.end = start, end
        self._steps: dict[OfferKey, tuple[list[PriceStep], list[datetime]] | None] = {}

    def steps(self, key: OfferKey, start: datetime, end: datetime) -> Sequence[PriceStep]:
        if start < self.start or end > self.end:
            return self.view.steps(key, start, end)
        if key not in self._steps:
            got = list(self.view.steps(key, self.start, self.end))
            times = [s.valid_from for s in got]
            ordered = all(a < b for a, b in pairwise(times))
            self._steps[key] = (got, times) if ordered else None  # not one series: never sliced
        memo = self._steps[key]
        if memo is None:
            return self.view.steps(key, start, end)
        got, times = memo
        first = bisect_right(times, start) - 1  # the step in effect at start, if any
        last = bisect_left(times, end)  # steps before end
        return got[max(first, 0) : last]
