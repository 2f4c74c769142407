"""Exact integer splits of micro-dollar amounts.

A report cuts ledger lines into pieces (a price segment into UTC days; a job's baseline over its rows).
Each split here is exact: the pieces are integers that sum to the whole, proportional to the weights,
with the largest-remainder method (ties to the earlier piece), so no micro-dollar is made or lost by
grouping a report by day, month, team or anything else.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, time, timedelta

__all__ = ["day_cuts", "largest_remainder", "split_by_days"]

_US = timedelta(microseconds=1)
_DAY = timedelta(days=1)


def largest_remainder(total: int, weights: Sequence[int]) -> list[int]:
    """``total`` split in proportion to ``weights`` (non-negative integers), as integers that sum to
    ``total`` exactly: each piece gets the floor of its exact share, and the micro-dollars left go one
    each to the largest remainders (ties: the earlier piece). All weights 0: all to the first piece."""
    if not weights:
        if total:
            raise ValueError("cannot split a non-zero amount over no pieces")
        return []
    if any(w < 0 for w in weights):
        raise ValueError("weights must be >= 0")
    if total < 0:
        return [-p for p in largest_remainder(-total, weights)]
    weight = sum(weights)
    if weight == 0:
        return [total] + [0] * (len(weights) - 1)
    floors = [total * w // weight for w in weights]
    left = total - sum(floors)
    order = sorted(range(len(weights)), key=lambda i: (-((total * weights[i]) % weight), i))
    for i in order[:left]:
        floors[i] += 1
    return floors


def day_cuts(start: datetime, end: datetime) -> list[tuple[datetime, datetime]]:
    """``[start, end)`` cut at each UTC midnight inside it (one piece per day it touches)."""
    if end <= start:
        return [(start, end)] if end == start else []
    out: list[tuple[datetime, datetime]] = []
    lo = start
    while lo < end:
        midnight = datetime.combine(lo.date(), time(0), tzinfo=lo.tzinfo) + _DAY
        hi = min(midnight, end)
        out.append((lo, hi))
        lo = hi
    return out


def split_by_days(start: datetime, end: datetime, amount: int) -> list[tuple[datetime, datetime, int]]:
    """``amount`` over ``[start, end)`` apportioned to its UTC days by their microseconds (exact)."""
    cuts = day_cuts(start, end)
    if len(cuts) <= 1:
        return [(start, end, amount)]
    parts = largest_remainder(amount, [(b - a) // _US for a, b in cuts])
    return [(a, b, p) for (a, b), p in zip(cuts, parts, strict=True)]
