"""The cheapest instances for a number of GPUs of each accelerator (a fleet made "by plan").

For one accelerator, given offers (instance price in USD/h and whole GPUs per instance), choose how many
instances of each offer to lease so that they carry at least ``n`` GPUs at the least total price per
hour: an unbounded knapsack over the GPU count, solved exactly by dynamic programming over ``0..n``
(only the cheapest offer of each GPU count can be part of an optimum). Ties: fewer GPUs beyond ``n``,
then fewer instances, then the offers' order.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["Pick", "cheapest_cover"]


@dataclass(frozen=True, slots=True)
class Pick:
    """``count`` instances of offer number ``offer`` (an index into the caller's list)."""

    offer: int
    count: int


def cheapest_cover(prices: Sequence[float], gpus: Sequence[int], n: int) -> tuple[list[Pick], float] | None:
    """The cheapest multiset of offers (``prices[i]`` USD/h, ``gpus[i]`` GPUs each) with at least ``n``
    GPUs, as picks and its total USD/h; None when no offer has a GPU. Offers with a non-positive GPU count
    or a non-finite or negative price are ignored."""
    if n < 1:
        raise ValueError(f"need at least one GPU, got {n}")
    best: dict[int, int] = {}  # gpu count -> the cheapest offer with it
    for i, (p, g) in enumerate(zip(prices, gpus, strict=True)):
        if g < 1 or not math.isfinite(p) or p < 0:
            continue
        if g not in best or p < prices[best[g]]:
            best[g] = i
    if not best:
        return None
    sizes = sorted(best)
    top = n + max(sizes) - 1  # an optimum never overshoots by a whole instance
    inf = (math.inf, math.inf, math.inf)
    # cost[k]: (USD/h, instances, -) of the cheapest way to carry exactly k GPUs; choice[k]: last size used
    cost: list[tuple[float, float, float]] = [inf] * (top + 1)
    choice = [0] * (top + 1)
    cost[0] = (0.0, 0.0, 0.0)
    for k in range(1, top + 1):
        for g in sizes:
            if g <= k and cost[k - g][0] < math.inf:
                cand = (cost[k - g][0] + prices[best[g]], cost[k - g][1] + 1, 0.0)
                if cand < cost[k]:
                    cost[k], choice[k] = cand, g
    k_best = min(
        (k for k in range(n, top + 1) if cost[k][0] < math.inf),
        key=lambda k: (round(cost[k][0], 9), k, cost[k][1]),
        default=None,
    )
    if k_best is None:
        return None
    counts: dict[int, int] = {}
    k = k_best
    while k > 0:
        g = choice[k]
        counts[g] = counts.get(g, 0) + 1
        k -= g
    picks = [Pick(best[g], c) for g, c in sorted(counts.items(), key=lambda gc: best[gc[0]])]
    return picks, float(sum(prices[p.offer] * p.count for p in picks))
