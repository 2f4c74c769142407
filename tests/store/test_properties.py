"""Property tests of the price store against a naive model of the step function, on both backends.

The *naive model* (the spec's): every observation ``(key, t) -> price`` is kept, the last write of a
``(key, t)`` winning; the price at t is the observation with the greatest time <= t.

The store answers from change points but keeps every observation (repeats of the price in effect in
``price_repeats``), so the step function is the naive model's whatever order writes arrive in: a late
older change landing before a repeat is resolved against it (e.g. 3.0@0h and 3.0@8h, then 1.0@1h:
3.0 again from 8h).
"""

from __future__ import annotations

import bisect
import itertools
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from sqlalchemy import Engine

from costopt.domain import Cloud, Market, OfferKey, PricePoint
from pricing.store import PriceStore
from tests.store.helpers import comparable, h, key, pt, reset, steps

KEYS = [
    key(),
    key(zone="us-east-1a"),
    key(Cloud.GCP, "us-central1", "", "a2-highgpu-1g", Market.ON_DEMAND),
]
PRICES = [1.0, 2.0, 3.0]
HOURS = 12
STALE_AFTER = timedelta(hours=6)
QUERY_TIMES = [h(t) for t in (-1, 0, 0.5, 1, 2.5, 3, 4, 5.5, 6, 7.5, 8, 9, 10.5, 11, 12, 12.5, 30)]
"""Before the first hour, at change hours and between them, and long after the last one."""
PROPERTY = settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
OUT_OF_ORDER = settings(PROPERTY, max_examples=20)
"""The out-of-order properties: 20 random examples each (twice ``PROPERTY``'s: the late-point cases are the
point of them) on each backend, besides the explicit ``@example`` cases of every late-point bug found so
far. Each example checks 17 snapshot times, so 40 examples cost ~1 minute of the suite's 2 workers."""

Row = tuple[int, int, float, int | None]
"""(key index, hour, price, observed_at in hours after valid_from, or None)."""


def to_point(row: Row) -> PricePoint:
    k, t, price, obs = row
    return pt(t, price, k=KEYS[k], observed_at=None if obs is None else t + obs)


def collapse(points: list[tuple[datetime, float]]) -> list[tuple[datetime, float]]:
    out: list[tuple[datetime, float]] = []
    for t, p in sorted(points):
        if not out or out[-1][1] != p:
            out.append((t, p))
    return out


@dataclass
class NaiveModel:
    observations: dict[OfferKey, dict[datetime, float]] = field(default_factory=lambda: defaultdict(dict))
    confirmed: dict[OfferKey, datetime] = field(default_factory=dict)

    def write(self, batch: list[PricePoint]) -> None:
        for p in batch:
            self.observations[p.key][p.valid_from] = p.usd_per_hour
            seen = max(p.valid_from, p.observed_at or p.valid_from)
            self.confirmed[p.key] = max(self.confirmed.get(p.key, seen), seen)

    def points(self, k: OfferKey) -> list[tuple[datetime, float]]:
        return sorted(self.observations[k].items())

    def change_points(self, k: OfferKey) -> list[tuple[datetime, float]]:
        return collapse(self.points(k))

    def price(self, k: OfferKey, t: datetime) -> float | None:
        points = self.points(k)
        i = bisect.bisect_right([vf for vf, _ in points], t)
        return None if i == 0 else points[i - 1][1]


def fresh_store(engine: Engine) -> PriceStore:
    reset(engine)
    return PriceStore(engine, stale_after=STALE_AFTER)


def write_both(store: PriceStore, model: NaiveModel, writes: list[list[Row]]) -> None:
    for batch in writes:
        points = [to_point(r) for r in batch]
        store.write(points)
        model.write(points)


def check_step_function(store: PriceStore, model: NaiveModel) -> None:
    """price_at and as-of snapshots (with and without stale offers) equal the model at every query time."""
    for i, t in enumerate(QUERY_TIMES):
        snap = {o.key: o for o in store.snapshot(t, include_stale=True)}
        expected = {k: p for k in KEYS if (p := model.price(k, t)) is not None}
        assert {k: o.usd_per_hour for k, o in snap.items()} == expected, t
        for k, o in snap.items():
            assert o.last_confirmed_at == model.confirmed[k], (k, t)
            assert o.stale == (model.confirmed[k] < t - STALE_AFTER), (k, t)
        if i % 3 == 0:
            fresh = {o.key for o in store.snapshot(t)}
            assert fresh == {k for k in expected if model.confirmed[k] >= t - STALE_AFTER}, t
    for t in QUERY_TIMES[::4]:
        for k in KEYS:
            offer = store.price_at(k, t)
            assert (None if offer is None else offer.usd_per_hour) == model.price(k, t), (k, t)


# ------------------------------------------------------------------------------------------------
# Strategies
# ------------------------------------------------------------------------------------------------

_observed = st.one_of(st.none(), st.integers(0, 8))


@st.composite
def price_tables(draw: st.DrawFn) -> list[float]:
    """The true price of every (key, hour): the same (key, t) always carries the same price."""
    n = len(KEYS) * (HOURS + 1)
    return draw(st.lists(st.sampled_from(PRICES), min_size=n, max_size=n))


def _rows(draw: st.DrawFn, table: list[float], hours: st.SearchStrategy[int]) -> list[Row]:
    """One write: random cells of ``table`` in random order, with duplicates, observed_at, and decoys
    (a row of another price at the same (key, t) placed before the true one: the last row wins)."""
    cells = draw(
        st.lists(st.tuples(st.integers(0, len(KEYS) - 1), hours, _observed, st.booleans()), min_size=1, max_size=12)
    )
    batch: list[Row] = []
    for k, t, obs, decoy in cells:
        price = table[k * (HOURS + 1) + t]
        if decoy:
            batch.append((k, t, PRICES[(PRICES.index(price) + 1) % len(PRICES)], None))
        batch.append((k, t, price, obs))
    return batch


@st.composite
def writes_in_time_order(draw: st.DrawFn) -> list[list[Row]]:
    """Writes whose hours move forward from one write to the next (each write shuffled inside)."""
    table = draw(price_tables())
    cuts = sorted(draw(st.lists(st.integers(1, HOURS), max_size=3, unique=True)))
    bounds = [0, *cuts, HOURS + 1]
    return [_rows(draw, table, st.integers(lo, hi - 1)) for lo, hi in itertools.pairwise(bounds)]


@st.composite
def writes_in_any_order(draw: st.DrawFn) -> list[list[Row]]:
    table = draw(price_tables())
    return [_rows(draw, table, st.integers(0, HOURS)) for _ in range(draw(st.integers(1, 4)))]


rows_with_any_price = st.lists(
    st.tuples(st.integers(0, len(KEYS) - 1), st.integers(0, HOURS), st.sampled_from(PRICES), _observed),
    min_size=1,
    max_size=10,
)


# ------------------------------------------------------------------------------------------------
# Properties that hold
# ------------------------------------------------------------------------------------------------


@PROPERTY
@given(writes=writes_in_time_order())
def test_writes_moving_forward_in_time_follow_the_naive_model(engine: Engine, writes: list[list[Row]]) -> None:
    store, model = fresh_store(engine), NaiveModel()
    write_both(store, model, writes)

    check_step_function(store, model)
    for k in KEYS:
        stored = steps(store, k)
        assert stored == model.change_points(k), k
        assert all(a[1] != b[1] for a, b in itertools.pairwise(stored)), f"consecutive equal prices stored: {k}"
    latest = {o.key: (o.valid_from, o.usd_per_hour) for o in store.snapshot(include_stale=True)}
    assert latest == {k: model.change_points(k)[-1] for k in KEYS if model.observations[k]}


@PROPERTY
@given(writes=writes_in_any_order())
def test_writing_any_batch_twice_in_a_row_changes_nothing_the_second_time(
    engine: Engine, writes: list[list[Row]]
) -> None:
    store = fresh_store(engine)
    for batch in writes:
        store.write([to_point(r) for r in batch])
        before = [steps(store, k) for k in KEYS], store.count_points()
        confirmed = [(o.key, o.last_confirmed_at) for o in store.snapshot(h(0), include_stale=True)]

        again = store.write([to_point(r) for r in batch])

        assert (again.inserted, again.corrected, again.offers_created) == (0, 0, 0)
        assert again.unchanged == again.received == len(batch)
        assert ([steps(store, k) for k in KEYS], store.count_points()) == before
        assert [(o.key, o.last_confirmed_at) for o in store.snapshot(h(0), include_stale=True)] == confirmed


@PROPERTY
@given(writes=st.lists(rows_with_any_price, min_size=1, max_size=4))
def test_with_corrections_the_last_write_wins_at_its_points_and_only_observed_prices_are_stored(
    engine: Engine, writes: list[list[Row]]
) -> None:
    store = fresh_store(engine)
    latest_write: dict[tuple[OfferKey, datetime], float] = {}
    for batch in writes:
        points = [to_point(r) for r in batch]
        store.write(points)
        latest_write.update({(p.key, p.valid_from): p.usd_per_hour for p in points})

    last = {(p.key, p.valid_from): p.usd_per_hour for p in map(to_point, writes[-1])}
    for (k, t), price in last.items():
        offer = store.price_at(k, t)
        assert offer is not None
        assert offer.usd_per_hour == price, (k, t)
    for k in KEYS:
        stored = steps(store, k)
        assert all((k, t) in latest_write and latest_write[(k, t)] == p for t, p in stored), k
        written = sorted(t for kk, t in latest_write if kk == k)
        if written:
            assert stored[0][0] == written[0]
            assert store.price_at(k, written[0] - timedelta(microseconds=1)) is None
    newest = {o.key: (o.valid_from, o.usd_per_hour) for o in store.snapshot(include_stale=True)}
    assert newest == {k: steps(store, k)[-1] for k in KEYS if steps(store, k)}


@settings(PROPERTY, max_examples=8)
@example(writes=[[(0, 0, 1.0, None), (0, 5, 2.0, 1)], [(2, 3, 3.0, None)]])
@given(writes=writes_in_any_order())
def test_the_sql_reference_snapshot_equals_the_mirrored_one(
    engine: Engine, request: pytest.FixtureRequest, writes: list[list[Row]]
) -> None:
    store = fresh_store(engine)
    for batch in writes:
        store.write([to_point(r) for r in batch])
    for t in [None, *QUERY_TIMES[::5]]:
        for include_stale in (False, True):
            mirrored = store.snapshot_frame(t, include_stale=include_stale)
            reference = store.snapshot_frame(t, include_stale=include_stale, use_mirror=False)
            assert comparable(mirrored) == comparable(reference), (t, include_stale)


# ------------------------------------------------------------------------------------------------
# Writes in any order (late, older points)
# ------------------------------------------------------------------------------------------------


@pytest.mark.slow
@OUT_OF_ORDER
@example(writes=[[(0, 0, 3.0, None), (0, 8, 3.0, None)], [(0, 1, 1.0, None)]])
@example(writes=[[(0, 0, 3.0, None), (0, 5, 3.0, None), (0, 8, 3.0, None)], [(0, 6, 1.0, None)], [(0, 3, 2.0, 1)]])
@example(writes=[[(0, 0, 1.0, None), (0, 10, 2.0, None)], [(0, 5, 2.0, None)], [(0, 7, 3.0, None)]])
@example(writes=[[(0, 5, 1.0, None), (0, 8, 1.0, None)], [(0, 0, 1.0, None)], [(0, 6, 2.0, None)]])
@given(writes=writes_in_any_order())
def test_writes_in_any_order_follow_the_naive_model(engine: Engine, writes: list[list[Row]]) -> None:
    store, model = fresh_store(engine), NaiveModel()
    write_both(store, model, writes)

    check_step_function(store, model)
    for k in KEYS:
        assert steps(store, k) == model.change_points(k), k


@pytest.mark.slow
@OUT_OF_ORDER
@example(writes=[[(0, 0, 1.0, None), (0, 4, 1.0, None), (0, 8, 2.0, None)], [(0, 4, 3.0, None)], [(0, 4, 1.0, None)]])
@given(writes=st.lists(rows_with_any_price, min_size=1, max_size=4))
def test_with_corrections_in_any_order_the_step_function_is_that_of_the_last_write_of_each_point(
    engine: Engine, writes: list[list[Row]]
) -> None:
    store, model = fresh_store(engine), NaiveModel()
    write_both(store, model, writes)

    check_step_function(store, model)
    for k in KEYS:
        assert steps(store, k) == model.change_points(k), k


@pytest.mark.slow
@OUT_OF_ORDER
@example(batch=[(0, 0, 3.0, None), (0, 8, 3.0, None), (0, 1, 1.0, None)], cut=2, swap=False)
@example(batch=[(0, 0, 3.0, None), (0, 5, 3.0, None), (0, 8, 3.0, None), (0, 6, 1.0, None)], cut=3, swap=False)
@given(batch=rows_with_any_price, cut=st.integers(0, 10), swap=st.booleans())
def test_splitting_a_write_in_two_in_any_order_gives_the_same_step_function(
    engine: Engine, batch: list[Row], cut: int, swap: bool
) -> None:
    unique = list({(r[0], r[1]): r for r in batch}.values())  # one row per (key, t): no last-row ambiguity
    first, second = unique[:cut], unique[cut:]
    if swap:
        first, second = second, first

    store = fresh_store(engine)
    store.write([to_point(r) for r in unique])
    whole = [[o.usd_per_hour for o in store.snapshot(t, include_stale=True)] for t in QUERY_TIMES]
    whole_steps = [steps(store, k) for k in KEYS]

    store = fresh_store(engine)
    store.write([to_point(r) for r in first])
    store.write([to_point(r) for r in second])
    assert [[o.usd_per_hour for o in store.snapshot(t, include_stale=True)] for t in QUERY_TIMES] == whole
    assert [steps(store, k) for k in KEYS] == whole_steps
