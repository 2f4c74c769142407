"""Reading prices: as-of lookups, snapshots (ordering, filters, catalog join, staleness), history, clocks,
source health."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pandas as pd
import pytest
from sqlalchemy import Engine
from sqlalchemy.exc import StatementError

from costopt.domain import Cloud, InstanceType, Market
from pricing.mirror import SNAPSHOT_COLUMNS
from pricing.store import PriceStore
from tests.store.helpers import (
    KEY,
    T0,
    ZONAL,
    comparable,
    h,
    key,
    offer_tuple,
    price_of,
    pt,
)

V100 = key(instance_type="p3.2xlarge")
A100 = key(Cloud.GCP, "us-central1", "", "a2-highgpu-1g", Market.SPOT)
A100_OD = key(Cloud.GCP, "us-central1", "", "a2-highgpu-1g", Market.ON_DEMAND)
A100_8 = key(Cloud.GCP, "us-central1", "us-central1-a", "a2-highgpu-8g", Market.SPOT)
UNCATALOGED = key(Cloud.AZURE, "eastus", "", "Standard_ND96asr_v4", Market.SPOT)
CATALOG = [
    InstanceType(Cloud.AWS, "p3.2xlarge", "v100", 1),
    InstanceType(Cloud.GCP, "a2-highgpu-1g", "a100", 1),
    InstanceType(Cloud.GCP, "a2-highgpu-8g", "a100", 8),
]


@pytest.fixture
def market(store: PriceStore) -> PriceStore:
    """A small market: four catalogued offers and one not in the catalog, all at T0."""
    store.upsert_instance_types(CATALOG, now=T0)
    store.write(
        [
            pt(0, 3.06, k=V100),
            pt(0, 1.10, k=A100),
            pt(0, 3.67, k=A100_OD),
            pt(0, 8.80, k=A100_8),
            pt(0, 2.00, k=UNCATALOGED),
        ]
    )
    return store


# ------------------------------------------------------------------------------------------------
# price_at: the step function
# ------------------------------------------------------------------------------------------------


def test_price_at_is_the_point_with_the_greatest_valid_from_at_or_before_the_time(store: PriceStore) -> None:
    store.write([pt(0, 1.0), pt(5, 2.0), pt(10, 3.0)])

    assert price_of(store, h(0)) == 1.0
    assert price_of(store, h(4.99)) == 1.0
    assert price_of(store, h(5)) == 2.0
    assert price_of(store, h(9)) == 2.0
    assert price_of(store, h(10)) == 3.0
    assert price_of(store, h(10_000)) == 3.0


def test_price_at_before_the_first_point_is_none(store: PriceStore) -> None:
    store.write([pt(5, 1.0)])

    assert store.price_at(KEY, h(4.999)) is None
    assert store.price_at(KEY, h(5) - timedelta(microseconds=1)) is None
    assert store.price_at(ZONAL, h(6)) is None


def test_price_at_tells_the_point_it_comes_from(store: PriceStore) -> None:
    store.write([pt(0, 1.0, source="a"), pt(5, 2.0, source="b")])

    offer = store.price_at(KEY, h(7))
    assert offer is not None
    assert (offer.key, offer.usd_per_hour, offer.valid_from, offer.source) == (KEY, 2.0, h(5), "b")


def test_price_at_ignores_staleness(store: PriceStore) -> None:
    store.write([pt(0, 1.0)])
    offer = store.price_at(KEY, h(24 * 365))
    assert offer is not None
    assert offer.stale
    assert offer.usd_per_hour == 1.0


def test_price_at_keeps_microsecond_precision(store: PriceStore) -> None:
    t = h(1) + timedelta(microseconds=123_457)
    store.write([pt(0, 1.0), pt(t, 2.0)])

    assert price_of(store, t - timedelta(microseconds=1)) == 1.0
    assert price_of(store, t) == 2.0
    offer = store.price_at(KEY, t)
    assert offer is not None
    assert offer.valid_from == t


# ------------------------------------------------------------------------------------------------
# snapshot: ordering, filters, catalog join
# ------------------------------------------------------------------------------------------------


def test_snapshot_is_ordered_cheapest_first(market: PriceStore) -> None:
    prices = [o.usd_per_hour for o in market.snapshot(h(1), include_stale=True)]
    assert prices == sorted(prices)
    assert prices == [1.10, 2.00, 3.06, 3.67, 8.80]


def test_snapshot_breaks_price_ties_by_key(store: PriceStore) -> None:
    keys = [
        key(Cloud.GCP, "us-west1", "", "g2-standard-4", Market.SPOT),
        key(Cloud.AWS, "us-west-2", "us-west-2b", "g5.xlarge", Market.SPOT),
        key(Cloud.AWS, "us-west-2", "", "g5.xlarge", Market.SPOT),
        key(Cloud.AWS, "us-west-2", "", "g5.xlarge", Market.ON_DEMAND),
        key(Cloud.AWS, "eu-west-1", "", "g5.xlarge", Market.SPOT),
        key(Cloud.AZURE, "eastus", "", "Standard_NV6", Market.SPOT),
    ]
    store.write([pt(0, 0.5, k=k) for k in keys] + [pt(0, 0.25, k=key(Cloud.SIM, "sim-1", "", "sim.gpu"))])

    got = [o.key for o in store.snapshot(h(1), include_stale=True)]
    expected_ties = sorted(keys, key=lambda k: (k.cloud.value, k.region, k.zone, k.instance_type, k.market.value))
    assert got == [key(Cloud.SIM, "sim-1", "", "sim.gpu"), *expected_ties]


def test_snapshot_joins_accelerator_and_gpu_count_from_the_catalog(market: PriceStore) -> None:
    by_key = {o.key: o for o in market.snapshot(h(1), include_stale=True)}

    assert (by_key[A100_8].accelerator, by_key[A100_8].gpu_count) == ("a100", 8.0)
    assert by_key[A100_8].usd_per_gpu_hour == pytest.approx(1.10)
    assert (by_key[V100].accelerator, by_key[V100].gpu_count) == ("v100", 1.0)
    assert by_key[UNCATALOGED].accelerator is None
    assert by_key[UNCATALOGED].gpu_count is None
    assert by_key[UNCATALOGED].usd_per_gpu_hour is None


def test_filtering_by_accelerator_requires_a_catalog_entry(market: PriceStore) -> None:
    a100 = market.snapshot(h(1), accelerator="a100", include_stale=True)
    assert [o.key for o in a100] == [A100, A100_OD, A100_8]
    assert market.snapshot(h(1), accelerator="unknown-gpu", include_stale=True) == []
    all_keys = {o.key for o in market.snapshot(h(1), include_stale=True)}
    assert UNCATALOGED in all_keys


def test_a_catalog_update_is_seen_by_the_next_snapshot(market: PriceStore) -> None:
    assert market.snapshot(h(1), accelerator="a100", instance_type=UNCATALOGED.instance_type, include_stale=True) == []
    market.upsert_instance_types([InstanceType(Cloud.AZURE, UNCATALOGED.instance_type, "a100", 8)], now=T0)
    market.upsert_instance_types([InstanceType(Cloud.AWS, "p3.2xlarge", "v100", 2)], now=T0)

    a100 = market.snapshot(h(1), accelerator="a100", include_stale=True)
    assert UNCATALOGED in [o.key for o in a100]
    v100 = market.snapshot(include_stale=True, accelerator="v100")
    assert [(o.key, o.gpu_count) for o in v100] == [(V100, 2.0)]


def test_instance_types_are_listed_by_cloud_and_name(store: PriceStore) -> None:
    assert store.upsert_instance_types([*CATALOG, CATALOG[0]], now=T0) == 3
    assert store.instance_types() == sorted(CATALOG, key=lambda t: (t.cloud.value, t.name))
    assert store.instance_types(Cloud.AWS) == [CATALOG[0]]
    assert store.upsert_instance_types([]) == 0


@pytest.mark.parametrize(
    ("filters", "expected"),
    [
        ({"cloud": Cloud.GCP}, [A100, A100_OD, A100_8]),
        ({"cloud": [Cloud.AWS, Cloud.AZURE]}, [UNCATALOGED, V100]),
        ({"region": "us-central1"}, [A100, A100_OD, A100_8]),
        ({"zone": ""}, [A100, UNCATALOGED, V100, A100_OD]),
        ({"zone": "us-central1-a"}, [A100_8]),
        ({"market": Market.ON_DEMAND}, [A100_OD]),
        ({"instance_type": "a2-highgpu-1g"}, [A100, A100_OD]),
        ({"cloud": Cloud.GCP, "market": Market.SPOT, "accelerator": "a100"}, [A100, A100_8]),
        ({"limit": 2}, [A100, UNCATALOGED]),
        ({"cloud": Cloud.SIM}, []),
    ],
    ids=["cloud", "clouds", "region", "regional", "zone", "market", "type", "combined", "limit", "none"],
)
def test_snapshot_filters_keep_only_matching_offers(market: PriceStore, filters, expected) -> None:
    assert [o.key for o in market.snapshot(h(1), include_stale=True, **filters)] == expected


def test_snapshot_before_any_point_is_empty(market: PriceStore) -> None:
    assert market.snapshot(h(-1), include_stale=True) == []


def test_snapshot_of_an_empty_store_is_empty(store: PriceStore) -> None:
    assert store.snapshot() == []
    assert store.snapshot(h(0), include_stale=True) == []
    assert list(store.snapshot_frame(h(0)).columns) == SNAPSHOT_COLUMNS
    assert len(store.snapshot_frame(h(0), use_mirror=False)) == 0


def test_snapshot_as_of_a_time_uses_each_offers_price_in_effect(store: PriceStore) -> None:
    store.write([pt(0, 1.0, k=KEY), pt(4, 5.0, k=KEY), pt(2, 3.0, k=ZONAL), pt(6, 0.5, k=ZONAL)])

    assert [(o.key, o.usd_per_hour) for o in store.snapshot(h(1), include_stale=True)] == [(KEY, 1.0)]
    assert [(o.key, o.usd_per_hour) for o in store.snapshot(h(5), include_stale=True)] == [(ZONAL, 3.0), (KEY, 5.0)]
    assert [(o.key, o.usd_per_hour) for o in store.snapshot(h(7), include_stale=True)] == [(ZONAL, 0.5), (KEY, 5.0)]


def test_snapshot_frame_has_the_documented_columns_and_utc_times(market: PriceStore) -> None:
    f = market.snapshot_frame(h(1), include_stale=True)
    assert list(f.columns) == SNAPSHOT_COLUMNS
    assert str(f["valid_from"].dt.tz) == "UTC"
    assert str(f["last_confirmed_at"].dt.tz) == "UTC"
    assert f["usd_per_hour"].is_monotonic_increasing


def test_the_sql_snapshot_equals_the_mirrored_snapshot(
    market: PriceStore, engine: Engine, request: pytest.FixtureRequest
) -> None:
    market.write([pt(3, 1.5, k=A100), pt(2, 9.0, k=A100_8), pt(7, 0.9, k=V100)])
    for at in (None, h(-1), h(0), h(2.5), h(5), h(10)):
        for kw in ({}, {"include_stale": True}, {"accelerator": "a100", "include_stale": True}):
            mirrored = market.snapshot_frame(at, **kw)
            reference = market.snapshot_frame(at, use_mirror=False, **kw)
            assert comparable(mirrored) == comparable(reference), (at, kw)


def test_a_store_without_mirror_answers_like_one_with_it(
    market: PriceStore, engine: Engine, request: pytest.FixtureRequest
) -> None:
    plain = PriceStore(engine, mirror_max_points=0)
    for at in (None, h(1)):
        assert [offer_tuple(o) for o in plain.snapshot(at, include_stale=True)] == [
            offer_tuple(o) for o in market.snapshot(at, include_stale=True)
        ]


def test_as_of_snapshots_above_the_mirror_point_limit_fall_back_to_sql(
    engine: Engine, request: pytest.FixtureRequest
) -> None:
    small = PriceStore(engine, mirror_max_points=2)
    small.write([pt(0, 1.0), pt(1, 2.0), pt(2, 3.0)])
    assert price_of(small, h(1.5)) == 2.0
    small.write([pt(1.7, 4.0)])
    assert price_of(small, h(1.8)) == 4.0


def test_snapshot_now_and_snapshot_at_the_wall_clock_agree(store: PriceStore) -> None:
    now = datetime.now(UTC)
    store.write([pt(now - timedelta(hours=2), 1.0, source="live", observed_at=now - timedelta(hours=1))])
    store.write([pt(now - timedelta(days=30), 3.0, source="history-import")])
    store.write([pt(now - timedelta(minutes=30), 1.0, source="other-feed", observed_at=now - timedelta(minutes=20))])

    current = store.snapshot()
    at_wall = store.snapshot(at=datetime.now(UTC))
    assert [offer_tuple(o) for o in current] == [offer_tuple(o) for o in at_wall]
    assert current[0].source == "live"


def test_a_naive_time_is_refused_by_the_sql_snapshot(store: PriceStore) -> None:
    store.write([pt(0, 1.0)])
    with pytest.raises((ValueError, StatementError)):
        store.snapshot_frame(datetime(2025, 3, 1, 1), use_mirror=False)


def test_a_naive_time_is_refused_by_the_mirrored_snapshot(store: PriceStore) -> None:
    store.write([pt(0, 1.0)])
    with pytest.raises((ValueError, StatementError)):
        store.snapshot(datetime(2025, 3, 1, 1))


# ------------------------------------------------------------------------------------------------
# Staleness
# ------------------------------------------------------------------------------------------------


def test_an_offer_not_confirmed_within_stale_after_is_left_out_of_snapshots(store: PriceStore) -> None:
    store.write([pt(0, 1.0, k=KEY, observed_at=10), pt(0, 2.0, k=ZONAL, observed_at=100)])
    week = timedelta(days=7)

    at_edge = store.snapshot(h(10) + week)
    assert [o.key for o in at_edge] == [KEY, ZONAL]
    just_after = store.snapshot(h(10) + week + timedelta(microseconds=1))
    assert [o.key for o in just_after] == [ZONAL]
    with_stale = store.snapshot(h(10) + week + timedelta(microseconds=1), include_stale=True)
    assert [(o.key, o.stale) for o in with_stale] == [(KEY, True), (ZONAL, False)]


def test_stale_after_is_configurable(engine: Engine) -> None:
    strict = PriceStore(engine, stale_after=timedelta(hours=1))
    strict.write([pt(0, 1.0)])
    assert len(strict.snapshot(h(1))) == 1
    assert strict.snapshot(h(1.01)) == []
    assert len(PriceStore(engine).snapshot(h(1.01))) == 1


def test_a_reconfirmation_makes_a_stale_offer_fresh_again(store: PriceStore) -> None:
    store.write([pt(0, 1.0)])
    assert store.snapshot(h(24 * 10)) == []
    store.write([pt(0, 1.0, observed_at=24 * 9)])
    assert [o.usd_per_hour for o in store.snapshot(h(24 * 10))] == [1.0]


def test_snapshot_without_a_time_judges_staleness_at_the_wall_clock(store: PriceStore) -> None:
    now = datetime.now(UTC)
    store.write(
        [
            pt(now - timedelta(days=20), 1.0, k=KEY, observed_at=now - timedelta(minutes=5)),
            pt(now - timedelta(days=20), 2.0, k=ZONAL, observed_at=now - timedelta(days=8)),
        ]
    )
    assert [o.key for o in store.snapshot()] == [KEY]
    assert [(o.key, o.stale) for o in store.snapshot(include_stale=True)] == [(KEY, False), (ZONAL, True)]


def test_history_of_stale_offers_stays_queryable(store: PriceStore) -> None:
    store.write([pt(0, 1.0), pt(5, 2.0)])
    assert store.snapshot() == []
    assert len(store.history(h(0), h(10))) == 2
    assert price_of(store, h(6)) == 2.0


# ------------------------------------------------------------------------------------------------
# The clock of plans
# ------------------------------------------------------------------------------------------------


def test_replay_time_is_the_newest_confirmation_in_the_store(store: PriceStore) -> None:
    store.write([pt(0, 1.0, k=KEY, observed_at=30), pt(2, 2.0, k=ZONAL)])
    now = store.resolve_now("replay", wall=h(1000))
    assert (now.at, now.mode) == (h(30), "replay")


def test_live_time_is_the_wall_clock(store: PriceStore) -> None:
    store.write([pt(0, 1.0)])
    assert store.resolve_now("live", wall=h(1000)).at == h(1000)
    before = datetime.now(UTC)
    live = store.resolve_now()
    assert live.mode == "live"
    assert before <= live.at <= datetime.now(UTC)


def test_auto_time_is_live_when_something_is_fresh_and_replay_otherwise(store: PriceStore) -> None:
    store.write([pt(0, 1.0, observed_at=30)])
    fresh_wall = h(30) + timedelta(days=7)
    assert store.resolve_now("auto", wall=fresh_wall).mode == "live"
    assert store.resolve_now("auto", wall=fresh_wall).at == fresh_wall
    stale_wall = fresh_wall + timedelta(seconds=1)
    assert (store.resolve_now("auto", wall=stale_wall).mode, store.resolve_now("auto", wall=stale_wall).at) == (
        "replay",
        h(30),
    )


def test_every_clock_of_an_empty_store_is_the_wall_clock(store: PriceStore) -> None:
    for clock in ("live", "replay", "auto"):
        assert store.resolve_now(clock, wall=h(5)).at == h(5)


def test_replay_snapshot_shows_the_data_as_it_was_when_last_confirmed(store: PriceStore) -> None:
    store.write([pt(0, 1.0, observed_at=1), pt(1, 2.0, k=ZONAL, observed_at=2)])
    now = store.resolve_now("replay")
    assert now.mode == "replay"
    assert [o.usd_per_hour for o in store.snapshot(now.at)] == [1.0, 2.0]


# ------------------------------------------------------------------------------------------------
# history and last_change
# ------------------------------------------------------------------------------------------------

HISTORY_COLUMNS = ["cloud", "region", "zone", "instance_type", "market", "valid_from", "usd_per_hour", "source"]


def test_history_returns_the_change_points_in_range_with_the_one_in_effect_at_start(store: PriceStore) -> None:
    store.write([pt(0, 1.0), pt(5, 2.0), pt(10, 3.0), pt(15, 4.0)])

    f = store.history(h(7), h(12))
    assert list(f.columns) == HISTORY_COLUMNS
    assert str(f["valid_from"].dt.tz) == "UTC"
    assert list(zip(f["valid_from"], f["usd_per_hour"], strict=True)) == [(h(5), 2.0), (h(10), 3.0)]


def test_history_without_prior_returns_only_points_in_range(store: PriceStore) -> None:
    store.write([pt(0, 1.0), pt(5, 2.0), pt(10, 3.0), pt(15, 4.0)])

    f = store.history(h(7), h(15), include_prior=False)
    assert list(zip(f["valid_from"], f["usd_per_hour"], strict=True)) == [(h(10), 3.0), (h(15), 4.0)]


def test_history_bounds_are_inclusive_and_the_prior_is_not_repeated(store: PriceStore) -> None:
    store.write([pt(0, 1.0), pt(5, 2.0), pt(10, 3.0)])

    f = store.history(h(5), h(10))
    assert list(f["valid_from"]) == [h(5), h(10)]


def test_history_is_ordered_by_key_then_time_and_filters_by_key(store: PriceStore) -> None:
    other = key(Cloud.AWS, "eu-west-1", "", "p3.2xlarge", Market.SPOT)
    store.write([pt(3, 1.0, k=ZONAL), pt(1, 2.0, k=KEY), pt(2, 3.0, k=other), pt(4, 4.0, k=KEY)])

    f = store.history(h(0), h(10))
    assert list(zip(f["region"], f["zone"], f["valid_from"], strict=True)) == [
        ("eu-west-1", "", h(2)),
        ("us-east-1", "", h(1)),
        ("us-east-1", "", h(4)),
        ("us-east-1", "us-east-1a", h(3)),
    ]
    assert list(store.history(h(0), h(10), zone="us-east-1a")["usd_per_hour"]) == [1.0]
    assert list(store.history(h(0), h(10), region="eu-west-1")["usd_per_hour"]) == [3.0]
    assert len(store.history(h(0), h(10), cloud=Cloud.GCP)) == 0
    assert len(store.history(h(0), h(10), market=Market.ON_DEMAND)) == 0
    assert list(store.history(h(0), h(10), instance_type="p3.2xlarge", zone="")["usd_per_hour"]) == [3.0, 2.0, 4.0]


def test_history_before_any_point_is_empty(store: PriceStore) -> None:
    store.write([pt(5, 1.0)])
    f = store.history(h(0), h(1))
    assert len(f) == 0
    assert list(f.columns) == HISTORY_COLUMNS


def test_history_frame_describes_the_step_function_over_the_range(store: PriceStore) -> None:
    store.write([pt(0, 1.0), pt(3, 1.5), pt(8, 0.7), pt(20, 2.0)])
    f = store.history(h(5), h(15))
    for t in (5, 6, 8, 12, 15):
        in_effect = f[f["valid_from"] <= pd.Timestamp(h(t))].iloc[-1]["usd_per_hour"]
        assert in_effect == price_of(store, h(t))


def test_last_change_is_the_newest_valid_from_of_the_matching_offers(store: PriceStore) -> None:
    od = key(market=Market.ON_DEMAND)
    west = key(region="us-west-2")
    store.write([pt(0, 1.0), pt(5, 2.0), pt(9, 3.0, k=od), pt(7, 1.0, k=west), pt(1, 1.0, k=A100)])

    assert store.last_change(Cloud.AWS) == h(9)
    assert store.last_change(Cloud.AWS, market=Market.SPOT) == h(7)
    assert store.last_change(Cloud.AWS, region="us-east-1", market=Market.SPOT) == h(5)
    assert store.last_change(Cloud.AWS, instance_types=["p3.2xlarge"], region="us-west-2") == h(7)
    assert store.last_change(Cloud.GCP) == h(1)
    assert store.last_change(Cloud.AZURE) is None


def test_an_unchanged_price_does_not_move_last_change(store: PriceStore) -> None:
    store.write([pt(0, 1.0)])
    store.write([pt(5, 1.0)])
    assert store.last_change(Cloud.AWS) == h(0)


# ------------------------------------------------------------------------------------------------
# Source health
# ------------------------------------------------------------------------------------------------


def test_a_successful_fetch_records_its_time_and_points(store: PriceStore) -> None:
    store.record_fetch("aws-spot", ok=True, at=h(1), points=10, bad_records=2, skipped=1, partial=True)

    [status] = store.sources(now=h(2))
    assert status.name == "aws-spot"
    assert (status.last_attempt_at, status.last_success_at) == (h(1), h(1))
    assert (status.last_points, status.last_bad_records, status.last_skipped, status.last_partial) == (10, 2, 1, True)
    assert (status.consecutive_failures, status.total_points, status.stale) == (0, 10, False)
    assert status.last_error is None


def test_failures_are_counted_until_the_next_success(store: PriceStore) -> None:
    store.record_fetch("gcp", ok=True, at=h(1), points=5)
    store.record_fetch("gcp", ok=False, at=h(2), error="503 Service Unavailable")
    store.record_fetch("gcp", ok=False, at=h(3))

    [status] = store.sources(now=h(4))
    assert status.consecutive_failures == 2
    assert (status.last_attempt_at, status.last_success_at, status.last_error_at) == (h(3), h(1), h(3))
    assert status.last_error == "unknown error"
    assert status.total_points == 5

    store.record_fetch("gcp", ok=True, at=h(5), points=7)
    [status] = store.sources(now=h(6))
    assert (status.consecutive_failures, status.total_points, status.last_success_at) == (0, 12, h(5))


def test_a_source_is_stale_when_its_last_success_is_older_than_stale_after(store: PriceStore) -> None:
    store.record_fetch("azure", ok=True, at=h(0))
    store.record_fetch("never-worked", ok=False, at=h(0), error="401")

    week = timedelta(days=7)
    by_name = {s.name: s for s in store.sources(now=h(0) + week)}
    assert (by_name["azure"].stale, by_name["never-worked"].stale) == (False, True)
    by_name = {s.name: s for s in store.sources(now=h(0) + week + timedelta(seconds=1))}
    assert by_name["azure"].stale


def test_sources_are_listed_by_name(store: PriceStore) -> None:
    for name in ("gcp", "aws", "azure"):
        store.record_fetch(name, ok=True, at=h(0))
    assert [s.name for s in store.sources(now=h(0))] == ["aws", "azure", "gcp"]
    assert PriceStore(store.engine).sources(now=h(0))[0].name == "aws"
