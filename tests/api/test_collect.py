"""Collection runs: a failing source never stops the others, partial fetches keep good prices."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sqlalchemy import Engine

from costopt.domain import Cloud, Market, OfferKey, PricePoint
from costopt.errors import SourceUnavailable
from pricing.base import FetchResult
from pricing.collect import backoff_delay, collect_once, run_source
from pricing.store import PriceStore
from tests.fakes.sources import FakeSource

T0 = datetime(2020, 3, 1, tzinfo=UTC)
KEY = OfferKey(Cloud.AWS, "us-east-1", "us-east-1a", "p3.2xlarge", Market.SPOT)


def _result(name: str, prices: list[float], *, partial: bool = False, bad: int = 0) -> FetchResult:
    pts = [PricePoint(KEY, T0 + timedelta(hours=i), p, name) for i, p in enumerate(prices)]
    return FetchResult(name, points=pts, partial=partial, bad_records=bad, errors=["page 2: 503"] if partial else [])


def test_a_failing_source_does_not_stop_the_next_one(engine: Engine) -> None:
    store = PriceStore(engine)
    down = FakeSource("down", [SourceUnavailable("endpoint unreachable: check the network")])
    up = FakeSource("up", [_result("up", [1.0, 1.1])])
    outcomes = collect_once(store, [down, up])
    assert [o.ok for o in outcomes] == [False, True]
    assert store.count_points() == 2
    status = {s.name: s for s in store.sources()}
    assert status["down"].consecutive_failures == 1
    assert "unreachable" in (status["down"].last_error or "")
    assert status["up"].last_success_at is not None and status["up"].consecutive_failures == 0


def test_an_unexpected_exception_in_a_source_is_recorded_not_raised(engine: Engine) -> None:
    store = PriceStore(engine)
    outcome = run_source(store, FakeSource("boom", [RuntimeError("parser crashed")]))
    assert not outcome.ok and outcome.error is not None and "RuntimeError" in outcome.error
    assert store.sources()[0].consecutive_failures == 1


def test_a_partial_fetch_stores_its_good_points_and_is_reported_partial(engine: Engine) -> None:
    store = PriceStore(engine)
    outcome = run_source(store, FakeSource("half", [_result("half", [2.0, 2.5], partial=True, bad=3)]))
    assert outcome.ok and outcome.partial and outcome.inserted == 2 and outcome.bad_records == 3
    status = store.sources()[0]
    assert status.last_partial and status.last_bad_records == 3 and "503" in (status.last_error or "")


def test_a_failed_fetch_never_removes_prices_already_stored(engine: Engine) -> None:
    store = PriceStore(engine)
    src = FakeSource("aws", [_result("aws", [1.0, 2.0]), SourceUnavailable("down")])
    run_source(store, src)
    before = store.history(T0 - timedelta(days=1), T0 + timedelta(days=1))
    run_source(store, src)
    after = store.history(T0 - timedelta(days=1), T0 + timedelta(days=1))
    assert before.equals(after) and len(after) == 2


def test_consecutive_failures_count_up_and_a_success_resets_them(engine: Engine) -> None:
    store = PriceStore(engine)
    src = FakeSource("flaky", [SourceUnavailable("a"), SourceUnavailable("b"), _result("flaky", [1.0])])
    run_source(store, src)
    run_source(store, src)
    assert store.sources()[0].consecutive_failures == 2
    run_source(store, src)
    assert store.sources()[0].consecutive_failures == 0


def test_backoff_doubles_per_failure_and_is_capped() -> None:
    hour = timedelta(hours=1)
    assert backoff_delay(hour, 0) == hour
    assert backoff_delay(hour, 1) == hour
    assert backoff_delay(hour, 2) == 2 * hour
    assert backoff_delay(hour, 3) == 4 * hour
    assert backoff_delay(hour, 30) == timedelta(hours=6)
    assert backoff_delay(timedelta(days=1), 5) == timedelta(days=1)  # never below the interval
