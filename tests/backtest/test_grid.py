"""Prices on a grid of days: the end-of-day rule, no back-fill, the last known price after the data."""

from __future__ import annotations

from datetime import date, timedelta

import numpy as np
import pandas as pd
import pytest

from costopt.backtest.grid import BacktestError, OfferSet, build_price_grid, change_days
from tests.backtest.conftest import DAY0, history, offer, offers

A = offer("a", zone="r1a")
B = offer("b", zone="r1b")


def test_a_change_at_23_59_counts_for_that_day() -> None:
    h = history([(A, "2020-02-01T00:00:00Z", 1.0), (A, "2020-03-01T23:59:59Z", 2.0)])
    grid = build_price_grid(h, offers(A), DAY0, 3)
    assert grid.usd_per_hour[:, 0].tolist() == [2.0, 2.0, 2.0]


def test_a_day_without_change_keeps_the_previous_price() -> None:
    h = history([(A, "2020-02-01T00:00:00Z", 1.0), (A, "2020-03-02T10:00:00Z", 3.0)])
    grid = build_price_grid(h, offers(A), DAY0, 3)
    assert grid.usd_per_hour[:, 0].tolist() == [1.0, 3.0, 3.0]


def test_the_last_change_of_the_day_wins_and_a_change_at_midnight_belongs_to_the_new_day() -> None:
    h = history(
        [
            (A, "2020-02-01T00:00:00Z", 1.0),
            (A, "2020-03-01T08:00:00Z", 5.0),
            (A, "2020-03-01T20:00:00Z", 4.0),
            (A, "2020-03-02T00:00:00Z", 6.0),
        ]
    )
    grid = build_price_grid(h, offers(A), DAY0, 2)
    assert grid.usd_per_hour[:, 0].tolist() == [4.0, 6.0]


def test_no_price_is_back_filled_before_an_offers_first_known_price() -> None:
    h = history([(A, "2020-02-01T00:00:00Z", 1.0), (B, "2020-03-02T15:00:00Z", 0.5)])
    grid = build_price_grid(h, offers(A, B), DAY0, 3)
    b = grid.usd_per_hour[:, grid.offers.frame.index[grid.offers.frame["instance_type"] == "b"][0]]
    assert np.isnan(b[0]) and b[1:].tolist() == [0.5, 0.5]


def test_after_the_data_the_last_known_price_holds_and_data_end_says_where_it_stopped() -> None:
    h = history([(A, "2020-02-01T00:00:00Z", 1.0), (A, "2020-03-02T15:00:00Z", 2.0)])
    grid = build_price_grid(h, offers(A), DAY0, 5)
    assert grid.usd_per_hour[:, 0].tolist() == [1.0, 2.0, 2.0, 2.0, 2.0]
    assert grid.data_end == DAY0 + timedelta(days=2)
    assert grid.data_end_hours == 48.0


def test_hourly_grid_uses_the_price_in_effect_at_the_end_of_each_hour() -> None:
    h = history([(A, "2020-02-01T00:00:00Z", 1.0), (A, "2020-03-01T01:30:00Z", 2.0), (A, "2020-03-01T03:00:00Z", 3.0)])
    grid = build_price_grid(h, offers(A), DAY0, 4, period_hours=1.0)
    assert grid.usd_per_hour[:, 0].tolist() == [1.0, 2.0, 2.0, 3.0]


def test_constant_prices_hold_in_every_period_regardless_of_their_date() -> None:
    od = offer("a", market="on_demand")
    constant = pd.DataFrame(
        [{**{k: od[k] for k in ("cloud", "region", "zone", "instance_type", "market")}, "usd_per_hour": 3.06}]
    )
    grid = build_price_grid(history([(A, "2020-02-01T00:00:00Z", 1.0)]), offers(A, od), DAY0, 2, constant=constant)
    col = int(np.flatnonzero(grid.offers.column("market") == "on_demand")[0])
    assert grid.usd_per_hour[:, col].tolist() == [3.06, 3.06]


def test_offers_are_sorted_and_need_a_gpu_count() -> None:
    s = offers(B, A)
    assert list(s.frame["instance_type"]) == ["a", "b"]
    with pytest.raises(BacktestError):
        OfferSet.from_frame(pd.DataFrame([{**A, "gpu_count": 0}]))


def test_change_days_count_real_changes_not_first_points_or_repeats() -> None:
    h = history(
        [
            (A, "2020-03-01T05:00:00Z", 1.0),  # first point: not a change
            (A, "2020-03-02T05:00:00Z", 1.0),  # repeat: not a change
            (A, "2020-03-03T05:00:00Z", 2.0),
            (B, "2020-03-01T05:00:00Z", 1.0),
            (B, "2020-03-04T23:59:00Z", 1.5),
        ]
    )
    assert change_days(h, {"region": "r1"}) == [date(2020, 3, 3), date(2020, 3, 4)]
    assert change_days(h, {"instance_type": "a"}) == [date(2020, 3, 3)]
