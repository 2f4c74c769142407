"""Placing a round's units on instances, and the cheapest cover of GPUs per accelerator (pure functions)."""

from __future__ import annotations

import itertools

import pytest

from costopt.fleets.placement import Slot, Unit, place
from costopt.fleets.plan import Pick, cheapest_cover

SLOTS = [Slot("a", "v100", 4), Slot("b", "v100", 1), Slot("c", "k80", 2)]


def test_a_job_keeps_its_gpus_when_they_are_free_and_its_type_is_the_same() -> None:
    where, left = place([Unit("j1", "v100", 2)], SLOTS, {"j1": ("a", (2, 3))})
    assert where == {"j1": ("a", (2, 3))} and left == []
    # another type this round: placed anew (best fit), not on its old GPUs
    where, _ = place([Unit("j1", "k80", 2)], SLOTS, {"j1": ("a", (2, 3))})
    assert where == {"j1": ("c", (0, 1))}


def test_new_units_go_largest_first_to_the_tightest_instance_and_those_that_fit_nowhere_wait() -> None:
    units = [Unit("s1", "v100", 1), Unit("s2", "v100", 1), Unit("big", "v100", 4), Unit("x", "v100", 2)]
    where, left = place(units, SLOTS, {})
    assert where["big"] == ("a", (0, 1, 2, 3))  # the 4-GPU hole kept for the 4-GPU job
    assert where["s1"] == ("b", (0,))  # best fit: the 1-GPU instance
    assert sorted(left) == ["s2", "x"]  # the rest of the V100 GPUs are taken


def test_kept_gpus_are_taken_before_new_units_are_placed() -> None:
    where, left = place([Unit("n", "v100", 1), Unit("k", "v100", 1)], [Slot("b", "v100", 1)], {"k": ("b", (0,))})
    assert where == {"k": ("b", (0,))} and left == ["n"]


def test_cheapest_cover_is_exact_against_brute_force() -> None:
    prices, gpus = [0.9, 3.0, 2.2, 1.0], [1, 4, 2, 1]
    for n in range(1, 11):
        picked = cheapest_cover(prices, gpus, n)
        assert picked is not None
        picks, total = picked
        assert sum(gpus[p.offer] * p.count for p in picks) >= n
        assert total == pytest.approx(sum(prices[p.offer] * p.count for p in picks))
        best = min(
            sum(c * prices[i] for i, c in enumerate(counts))
            for counts in itertools.product(range(n + 1), repeat=len(prices))
            if sum(c * g for c, g in zip(counts, gpus, strict=True)) >= n
        )
        assert total == pytest.approx(best)
    for n, picks, total in ((4, [Pick(1, 1)], 3.0), (5, [Pick(0, 1), Pick(1, 1)], 3.9)):
        covered = cheapest_cover(prices, gpus, n)
        assert covered is not None, n
        assert covered[0] == picks and covered[1] == pytest.approx(total), n
    assert cheapest_cover([1.0], [0], 1) is None
    with pytest.raises(ValueError):
        cheapest_cover(prices, gpus, 0)
