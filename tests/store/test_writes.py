"""Writing prices: idempotent upsert of change points, collapse, corrections, confirmations, validation."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import numpy as np
import pandas as pd
import pytest
from sqlalchemy import Engine

from costopt.domain import Cloud, Market, PricePoint
from costopt.errors import BadRecord
from pricing.store import PriceStore
from tests.store.helpers import KEY, T0, ZONAL, frame, h, key, price_of, pt, steps

# ------------------------------------------------------------------------------------------------
# Idempotent upsert
# ------------------------------------------------------------------------------------------------


def test_writing_new_points_reports_them_inserted_and_creates_the_offer(store: PriceStore) -> None:
    result = store.write([pt(0, 1.0), pt(1, 2.0), pt(2, 3.0)])

    assert (result.received, result.inserted, result.unchanged, result.corrected) == (3, 3, 0, 0)
    assert result.offers_created == 1
    assert store.count_points() == 3
    assert store.count_offers() == 1
    assert steps(store) == [(h(0), 1.0), (h(1), 2.0), (h(2), 3.0)]


def test_rewriting_the_same_page_changes_nothing(store: PriceStore) -> None:
    page = [pt(0, 1.0), pt(1, 2.0), pt(2, 2.0), pt(3, 1.5), pt(1, 2.0, k=ZONAL), pt(5, 0.5, k=ZONAL)]
    store.write(page)
    before_points = store.count_points()
    before_history = steps(store), steps(store, ZONAL)
    before_offers = [o.last_confirmed_at for o in store.snapshot(h(10), include_stale=True)]

    again = store.write(page)

    assert again.inserted == 0
    assert again.corrected == 0
    assert again.offers_created == 0
    assert again.unchanged == again.received == len(page)
    assert store.count_points() == before_points
    assert (steps(store), steps(store, ZONAL)) == before_history
    assert [o.last_confirmed_at for o in store.snapshot(h(10), include_stale=True)] == before_offers


def test_rewriting_the_same_frame_in_another_row_order_changes_nothing(store: PriceStore) -> None:
    page = frame([pt(0, 1.0), pt(1, 2.0), pt(2, 1.0), pt(3, 3.0)])
    store.write(page)
    before = steps(store)

    again = store.write(page.iloc[::-1])

    assert again.inserted == 0
    assert steps(store) == before


def test_a_frame_and_the_same_points_as_objects_store_the_same_thing(engine: Engine) -> None:
    points = [pt(0, 1.0), pt(1, 2.0, k=ZONAL), pt(2, 2.5)]
    store = PriceStore(engine)
    r1 = store.write(points)
    r2 = store.write(frame(points))
    assert r1.inserted == 3
    assert r2.inserted == 0


def test_an_empty_write_does_nothing(store: PriceStore) -> None:
    for empty in (store.write([]), store.write(frame([]))):
        assert (empty.received, empty.inserted, empty.unchanged, empty.corrected, empty.offers_created) == (0,) * 5
    assert store.count_points() == 0
    assert store.count_offers() == 0


def test_the_same_price_from_two_sources_is_one_point(store: PriceStore) -> None:
    store.write([pt(0, 1.25, source="aws-api")])
    result = store.write([pt(0, 1.25, source="aws-history-file")])

    assert result.inserted == 0
    assert result.corrected == 0
    assert result.unchanged == 1
    assert store.count_points() == 1


def test_a_regional_price_has_an_empty_zone_and_is_another_offer_than_a_zonal_one(store: PriceStore) -> None:
    store.write([pt(0, 1.0, k=KEY), pt(0, 2.0, k=ZONAL)])

    assert store.count_offers() == 2
    assert price_of(store, h(1), KEY) == 1.0
    assert price_of(store, h(1), ZONAL) == 2.0
    assert store.history(h(-1), h(1), zone="")["zone"].tolist() == [""]


def test_a_missing_zone_in_a_frame_means_a_regional_price(store: PriceStore) -> None:
    f = frame([pt(0, 1.0)])
    f["zone"] = None
    store.write(f)

    assert price_of(store, h(1), KEY) == 1.0
    assert store.write(frame([pt(0, 1.0)])).inserted == 0


# ------------------------------------------------------------------------------------------------
# Only change points are stored
# ------------------------------------------------------------------------------------------------


def test_consecutive_equal_prices_in_one_write_collapse_to_one_change_point(store: PriceStore) -> None:
    result = store.write([pt(0, 1.0), pt(1, 1.0), pt(2, 1.0), pt(3, 2.0), pt(4, 2.0), pt(5, 1.0)])

    assert result.inserted == 3
    assert result.unchanged == 3
    assert steps(store) == [(h(0), 1.0), (h(3), 2.0), (h(5), 1.0)]


def test_an_unchanged_price_in_a_later_write_stores_no_point(store: PriceStore) -> None:
    store.write([pt(0, 1.0)])
    result = store.write([pt(6, 1.0)])

    assert result.inserted == 0
    assert result.unchanged == 1
    assert steps(store) == [(h(0), 1.0)]


def test_an_out_of_order_point_equal_to_its_predecessor_stores_nothing(store: PriceStore) -> None:
    store.write([pt(0, 1.0), pt(10, 2.0)])
    result = store.write([pt(5, 1.0)])

    assert result.inserted == 0
    assert steps(store) == [(h(0), 1.0), (h(10), 2.0)]


def test_an_out_of_order_point_with_another_price_is_inserted_before_its_successor(store: PriceStore) -> None:
    store.write([pt(0, 1.0), pt(10, 2.0)])
    result = store.write([pt(5, 3.0)])

    assert result.inserted == 1
    assert steps(store) == [(h(0), 1.0), (h(5), 3.0), (h(10), 2.0)]
    assert price_of(store, h(7)) == 3.0
    assert price_of(store, h(12)) == 2.0


def test_an_out_of_order_older_point_with_the_price_of_its_successor_starts_that_price_earlier(
    store: PriceStore,
) -> None:
    store.write([pt(0, 1.0), pt(10, 2.0)])
    result = store.write([pt(5, 2.0)])

    assert result.inserted == 1
    assert [price_of(store, h(t)) for t in (4, 5, 7, 10, 12)] == [1.0, 2.0, 2.0, 2.0, 2.0]


def test_a_late_older_point_with_its_successors_price_turns_the_successor_into_a_kept_repeat(
    store: PriceStore,
) -> None:
    store.write([pt(0, 1.0), pt(10, 2.0)])
    result = store.write([pt(5, 2.0)])

    assert (result.inserted, result.superseded, result.restored) == (1, 1, 0)
    assert steps(store) == [(h(0), 1.0), (h(5), 2.0)]  # no two consecutive equal prices
    assert [price_of(store, h(t)) for t in (4, 5, 9, 10, 11)] == [1.0, 2.0, 2.0, 2.0, 2.0]
    # The observation at 10h is kept: a later write landing between 5h and 10h does not lose it.
    result = store.write([pt(7, 3.0)])
    assert (result.inserted, result.restored) == (1, 1)
    assert [price_of(store, h(t)) for t in (6, 7, 9, 10)] == [2.0, 3.0, 3.0, 2.0]
    assert steps(store) == [(h(0), 1.0), (h(5), 2.0), (h(7), 3.0), (h(10), 2.0)]


def test_a_repeat_absorbed_in_time_order_is_restored_when_an_older_change_lands_before_it(
    store: PriceStore,
) -> None:
    first = store.write([pt(0, 3.0), pt(5, 3.0), pt(8, 3.0)])
    assert (first.inserted, first.unchanged) == (1, 2)
    assert steps(store) == [(h(0), 3.0)]

    late = store.write([pt(6, 1.0)])

    assert (late.inserted, late.restored, late.unchanged) == (1, 1, 0)
    assert [price_of(store, h(t)) for t in (5, 6, 7, 8, 9)] == [3.0, 1.0, 1.0, 3.0, 3.0]
    assert steps(store) == [(h(0), 3.0), (h(6), 1.0), (h(8), 3.0)]
    assert [(o.valid_from, o.usd_per_hour) for o in store.snapshot(include_stale=True)] == [(h(8), 3.0)]
    assert store.last_change(Cloud.AWS) == h(8)
    # The repeat at 5h is still known: a change landing before it is bounded by it.
    store.write([pt(2, 2.0)])
    assert [price_of(store, h(t)) for t in (1, 2, 4, 5, 6)] == [3.0, 2.0, 2.0, 3.0, 1.0]


def test_a_late_point_after_the_newest_change_point_but_before_a_repeat_is_resolved_against_it(
    store: PriceStore,
) -> None:
    store.write([pt(0, 1.0), pt(10, 1.0)])
    store.write([pt(4, 2.0)])

    assert [price_of(store, h(t)) for t in (3, 4, 9, 10, 20)] == [1.0, 2.0, 2.0, 1.0, 1.0]
    assert [o.usd_per_hour for o in store.snapshot(include_stale=True)] == [1.0]


def test_a_correction_of_a_repeat_makes_it_a_change_point_and_another_turns_it_back(store: PriceStore) -> None:
    store.write([pt(0, 1.0), pt(4, 1.0), pt(8, 2.0)])

    fix = store.write([pt(4, 3.0, source="fix")])
    assert (fix.corrected, fix.restored, fix.inserted) == (1, 1, 0)
    assert steps(store) == [(h(0), 1.0), (h(4), 3.0), (h(8), 2.0)]
    offer = store.price_at(KEY, h(5))
    assert offer is not None and (offer.usd_per_hour, offer.source) == (3.0, "fix")

    back = store.write([pt(4, 1.0)])
    assert (back.corrected, back.superseded) == (1, 1)
    assert steps(store) == [(h(0), 1.0), (h(8), 2.0)]
    assert price_of(store, h(5)) == 1.0


def test_a_point_before_the_first_one_with_the_same_price_moves_the_start_back(store: PriceStore) -> None:
    store.write([pt(5, 1.0), pt(10, 2.0)])
    store.write([pt(0, 1.0)])

    assert store.price_at(KEY, h(-1)) is None
    assert [price_of(store, h(t)) for t in (0, 1, 5, 9, 10)] == [1.0, 1.0, 1.0, 1.0, 2.0]
    assert steps(store)[0] == (h(0), 1.0)


def test_the_current_snapshot_reports_the_newest_stored_change_point(store: PriceStore) -> None:
    store.write([pt(0, 1.0), pt(10, 2.0)])
    store.write([pt(5, 2.0)])
    store.write([pt(3, 4.0)])

    newest_vf, newest_price = steps(store)[-1]
    assert [(o.valid_from, o.usd_per_hour) for o in store.snapshot(include_stale=True)] == [(newest_vf, newest_price)]
    assert store.last_change(Cloud.AWS) == newest_vf


# ------------------------------------------------------------------------------------------------
# Corrections
# ------------------------------------------------------------------------------------------------


def test_a_different_price_at_a_stored_key_is_a_correction_and_the_newer_write_wins(store: PriceStore) -> None:
    store.write([pt(0, 1.0), pt(5, 2.0), pt(10, 3.0)])
    result = store.write([pt(5, 2.5, source="fix")])

    assert result.corrected == 1
    assert result.inserted == 0
    assert result.unchanged == 0
    assert steps(store) == [(h(0), 1.0), (h(5), 2.5), (h(10), 3.0)]
    offer = store.price_at(KEY, h(6))
    assert offer is not None
    assert (offer.usd_per_hour, offer.source) == (2.5, "fix")


def test_a_correction_of_the_newest_point_changes_the_current_price(store: PriceStore) -> None:
    store.write([pt(0, 1.0), pt(5, 2.0)])
    result = store.write([pt(5, 4.0)])

    assert result.corrected == 1
    assert [o.usd_per_hour for o in store.snapshot(include_stale=True)] == [4.0]
    assert price_of(store, h(100)) == 4.0


def test_a_correction_that_equals_the_next_price_keeps_the_step_function(store: PriceStore) -> None:
    store.write([pt(0, 1.0), pt(5, 2.0), pt(10, 3.0)])
    result = store.write([pt(5, 3.0)])

    assert result.corrected == 1
    assert [price_of(store, h(t)) for t in (0, 4, 5, 9, 10, 11)] == [1.0, 1.0, 3.0, 3.0, 3.0, 3.0]


def test_a_correction_of_the_newest_point_to_the_previous_price_changes_the_current_price(store: PriceStore) -> None:
    store.write([pt(0, 1.0), pt(5, 2.0)])
    result = store.write([pt(5, 1.0)])

    assert result.corrected == 1
    assert [o.usd_per_hour for o in store.snapshot(include_stale=True)] == [1.0]
    assert price_of(store, h(6)) == 1.0


def test_a_change_after_a_correction_to_the_previous_price_is_not_lost(store: PriceStore) -> None:
    store.write([pt(0, 1.0), pt(5, 2.0)])
    store.write([pt(5, 1.0)])
    result = store.write([pt(8, 2.0)])

    assert result.inserted == 1
    assert price_of(store, h(6)) == 1.0
    assert price_of(store, h(9)) == 2.0
    assert [o.usd_per_hour for o in store.snapshot(include_stale=True)] == [2.0]


def test_duplicates_in_one_write_keep_the_last_row(store: PriceStore) -> None:
    result = store.write([pt(0, 1.0), pt(0, 9.0), pt(0, 2.0), pt(3, 5.0)])

    assert result.received == 4
    assert result.inserted == 2
    assert steps(store) == [(h(0), 2.0), (h(3), 5.0)]


def test_duplicates_in_one_write_correct_a_stored_point_with_the_last_row(store: PriceStore) -> None:
    store.write([pt(0, 1.0)])
    result = store.write([pt(0, 7.0), pt(0, 1.5)])

    assert result.corrected == 1
    assert steps(store) == [(h(0), 1.5)]


def test_a_correction_reaches_every_reader(store: PriceStore) -> None:
    store.write([pt(0, 1.0), pt(5, 2.0)])
    store.snapshot(h(6), include_stale=True)  # warm the mirror
    store.write([pt(5, 2.75)])
    assert store.snapshot(h(6), include_stale=True)[0].usd_per_hour == 2.75
    assert store.snapshot(include_stale=True)[0].usd_per_hour == 2.75


# ------------------------------------------------------------------------------------------------
# Confirmation times
# ------------------------------------------------------------------------------------------------


def _confirmed(store: PriceStore) -> datetime | None:
    offers = store.snapshot(h(0), include_stale=True, instance_type=KEY.instance_type, zone=KEY.zone)
    assert len(offers) == 1
    return offers[0].last_confirmed_at


def test_imported_history_is_confirmed_at_the_time_of_its_newest_record(store: PriceStore) -> None:
    store.write([pt(0, 1.0), pt(4, 2.0), pt(9, 2.0)])
    assert _confirmed(store) == h(9)


def test_an_unchanged_live_price_only_refreshes_the_confirmation_time(store: PriceStore) -> None:
    store.write([pt(0, 1.0, observed_at=1)])
    result = store.write([pt(0, 1.0, observed_at=30)])

    assert result.inserted == 0
    assert store.count_points() == 1
    assert _confirmed(store) == h(30)


def test_a_live_observation_of_an_unchanged_price_confirms_at_its_observed_time(store: PriceStore) -> None:
    store.write([pt(0, 1.0)])
    store.write([pt(20, 1.0, observed_at=26)])

    assert steps(store) == [(h(0), 1.0)]
    assert _confirmed(store) == h(26)


def test_an_older_confirmation_never_moves_the_confirmation_time_back(store: PriceStore) -> None:
    store.write([pt(0, 1.0, observed_at=50)])
    store.write([pt(0, 1.0, observed_at=10)])
    store.write([pt(-5, 3.0)])

    assert _confirmed(store) == h(50)


def test_a_frame_without_observed_at_is_confirmed_at_each_records_own_time(store: PriceStore) -> None:
    f = frame([pt(0, 1.0), pt(2, 1.0)]).drop(columns=["observed_at"])
    store.write(f)
    assert _confirmed(store) == h(2)


# ------------------------------------------------------------------------------------------------
# All or nothing: one invalid row refuses the whole write
# ------------------------------------------------------------------------------------------------


def _set(col: str, value: Any):
    def mutate(f: pd.DataFrame) -> pd.DataFrame:
        f = f.astype({col: object}) if col in ("valid_from", "observed_at", "usd_per_hour") else f
        f.loc[1, col] = value
        return f

    return mutate


def _drop(col: str):
    def mutate(f: pd.DataFrame) -> pd.DataFrame:
        return f.drop(columns=[col])

    return mutate


INVALID_ROWS = {
    "nan price": _set("usd_per_hour", float("nan")),
    "negative price": _set("usd_per_hour", -0.01),
    "price above 1000": _set("usd_per_hour", 1000.5),
    "infinite price": _set("usd_per_hour", float("inf")),
    "non numeric price": _set("usd_per_hour", "cheap"),
    "naive valid_from": _set("valid_from", datetime(2025, 3, 1, 5)),
    "naive observed_at": _set("observed_at", datetime(2025, 3, 1, 5)),
    "unparseable valid_from": _set("valid_from", "yesterday"),
    "unknown cloud": _set("cloud", "oracle"),
    "upper case cloud": _set("cloud", "AWS"),
    "unknown market": _set("market", "reserved"),
    "empty region": _set("region", ""),
    "missing region": _set("region", None),
    "empty instance type": _set("instance_type", ""),
    "missing cloud column": _drop("cloud"),
    "missing region column": _drop("region"),
    "missing zone column": _drop("zone"),
    "missing instance_type column": _drop("instance_type"),
    "missing market column": _drop("market"),
    "missing valid_from column": _drop("valid_from"),
    "missing usd_per_hour column": _drop("usd_per_hour"),
    "missing source column": _drop("source"),
}


@pytest.mark.parametrize("mutate", INVALID_ROWS.values(), ids=INVALID_ROWS.keys())
def test_a_write_with_one_invalid_row_raises_bad_record_and_stores_nothing(store: PriceStore, mutate) -> None:
    store.write([pt(0, 1.0), pt(0, 5.0, k=ZONAL)])
    before = steps(store), steps(store, ZONAL), store.count_offers(), store.snapshot(h(0), include_stale=True)
    other = key(Cloud.GCP, "us-central1", "", "a2-highgpu-1g", Market.ON_DEMAND)
    page = frame([pt(1, 2.0), pt(1, 3.0, k=other), pt(2, 6.0, k=ZONAL, observed_at=3)])

    with pytest.raises(BadRecord):
        store.write(mutate(page))

    assert (steps(store), steps(store, ZONAL), store.count_offers(), store.snapshot(h(0), include_stale=True)) == before
    assert store.count_points() == 2


def test_a_point_object_with_an_invalid_price_cannot_even_be_built() -> None:
    for bad in (float("nan"), -1.0, 1000.01, float("inf")):
        with pytest.raises(BadRecord):
            PricePoint(KEY, T0, bad, "src")
    with pytest.raises(BadRecord):
        PricePoint(KEY, datetime(2025, 1, 1), 1.0, "src")


def test_a_missing_valid_from_raises_bad_record_and_stores_nothing(store: PriceStore) -> None:
    page = frame([pt(0, 1.0), pt(1, 2.0)])
    page.loc[1, "valid_from"] = pd.NaT

    with pytest.raises(BadRecord):
        store.write(page)
    assert store.count_points() == 0


def test_a_missing_source_raises_bad_record_and_stores_nothing(store: PriceStore) -> None:
    page = frame([pt(0, 1.0), pt(1, 2.0)])
    page.loc[1, "source"] = None

    with pytest.raises(BadRecord):
        store.write(page)
    assert store.count_points() == 0


def test_times_in_another_time_zone_are_stored_as_the_same_utc_instant(store: PriceStore) -> None:
    plus2 = timezone(timedelta(hours=2))
    store.write([pt(datetime(2025, 3, 1, 2, 0, tzinfo=plus2), 1.0), pt(datetime(2025, 3, 1, 7, 0, tzinfo=plus2), 2.0)])

    assert steps(store) == [(h(0), 1.0), (h(5), 2.0)]
    assert store.write([pt(0, 1.0), pt(5, 2.0)]).inserted == 0


def test_points_in_different_time_zones_can_be_written_together(store: PriceStore) -> None:
    plus2 = timezone(timedelta(hours=2))
    store.write([pt(datetime(2025, 3, 1, 0, 0, tzinfo=UTC), 1.0), pt(datetime(2025, 3, 1, 7, 0, tzinfo=plus2), 2.0)])

    assert steps(store) == [(h(0), 1.0), (h(5), 2.0)]


def test_correcting_a_point_with_a_nanosecond_timestamp_is_a_correction(store: PriceStore) -> None:
    page = frame([pt(0, 1.0)])
    page["valid_from"] = pd.to_datetime(["2025-03-01T00:00:00.000000500Z"], utc=True).as_unit("ns")
    store.write(page)
    page["usd_per_hour"] = 2.0

    result = store.write(page)

    assert result.corrected == 1
    assert store.count_points() == 1
    assert price_of(store, h(1)) == 2.0


def test_a_write_result_accounts_for_every_received_row(store: PriceStore) -> None:
    store.write([pt(0, 1.0), pt(10, 2.0)])
    page = [pt(0, 1.0), pt(2, 1.0), pt(4, 3.0), pt(10, 2.5), pt(12, 2.5), pt(14, 4.0)]
    result = store.write(page)

    assert result.received == len(page)
    assert result.inserted + result.unchanged + result.corrected == result.received
    assert (result.inserted, result.corrected) == (2, 1)
    assert steps(store) == [(h(0), 1.0), (h(4), 3.0), (h(10), 2.5), (h(14), 4.0)]


def test_offers_created_counts_only_new_offers(store: PriceStore) -> None:
    store.write([pt(0, 1.0)])
    other = key(Cloud.AZURE, "eastus", "", "Standard_NC6s_v3", Market.SPOT)
    result = store.write([pt(1, 1.0), pt(1, 2.0, k=other), pt(2, 2.5, k=other)])
    assert result.offers_created == 1
    assert store.count_offers() == 2


def test_a_large_batch_over_many_offers_round_trips(store: PriceStore) -> None:
    rng = np.random.default_rng(7)
    rows = []
    for i in range(40):
        k = key(region=f"r{i % 5}", instance_type=f"t{i // 5}")
        for j in range(25):
            rows.append(pt(j, float(rng.choice([1.0, 2.0, 3.0])), k=k))
    store.write(rows)
    assert store.write(rows).inserted == 0
    for i in (0, 17, 39):
        k = key(region=f"r{i % 5}", instance_type=f"t{i // 5}")
        expected = [p.usd_per_hour for p in rows if p.key == k]
        assert [price_of(store, h(j), k) for j in range(25)] == expected
