"""bench/store_scale.py at a tiny size: argument handling and the generator's shape (no database)."""

from __future__ import annotations

import argparse

import numpy as np
import pandas as pd
import pytest

from bench.store_scale import (
    YEAR,
    YEAR_START,
    build_parser,
    offer_keys,
    parse_points,
    realistic_arrays,
    realistic_batches,
)


def test_points_parse_suffixes_and_lists() -> None:
    assert parse_points("1000000,10M") == [1_000_000, 10_000_000]
    assert parse_points("3e6, 500k") == [3_000_000, 500_000]
    for bad in ("0", "-1M", ","):
        with pytest.raises(argparse.ArgumentTypeError):
            parse_points(bad)


def test_parser_defaults_are_the_issue_sizes() -> None:
    args = build_parser().parse_args([])
    assert args.points == [1_000_000, 10_000_000]
    assert args.keys == 15_000 and not args.json
    args = build_parser().parse_args(["--points", "2k", "--keys", "7", "--json"])
    assert args.points == [2_000] and args.keys == 7 and args.json


def test_offer_keys_are_distinct_over_three_clouds() -> None:
    keys = offer_keys(1_000)
    tuples = set(zip(keys.cloud, keys.region, keys.zone, keys.instance_type, keys.market, strict=True))
    assert len(tuples) == 1_000
    assert set(keys.cloud) == {"aws", "gcp", "azure"}
    assert set(keys.market) == {"spot", "on_demand"}
    aws = keys.cloud == "aws"
    assert all(z.startswith(r) and len(z) == len(r) + 1 for z, r in zip(keys.zone[aws], keys.region[aws], strict=True))
    assert set(keys.zone[~aws]) == {""}


def test_realistic_points_fill_a_year_and_every_point_is_a_change() -> None:
    n, k = 20_003, 50
    _, kidx, vf, price = realistic_arrays(n, k, seed=3)
    assert len(kidx) == len(vf) == len(price) == n
    assert np.all(np.diff(vf) >= 0)  # time order (how the benchmark writes)
    assert np.bincount(kidx, minlength=k).tolist() == [401] * 3 + [400] * 47
    frame = pd.DataFrame({"k": kidx, "vf": vf, "p": price}).sort_values(["k", "vf"], kind="stable")
    same = frame["k"].diff().eq(0)
    assert (frame["vf"].diff()[same] > 0).all()  # (offer, valid_from) unique
    assert (frame["p"].diff()[same] != 0).all()  # every point changes the price
    assert (price > 0).all() and (vf % 1000 == 0).all()
    lo, hi = pd.to_datetime(vf.min(), utc=True), pd.to_datetime(vf.max(), utc=True)
    assert lo >= pd.Timestamp(YEAR_START) and hi <= pd.Timestamp(YEAR_START + YEAR) + pd.Timedelta(seconds=1)
    assert hi - lo > pd.Timedelta(days=300)
    gaps_h = frame["vf"].diff()[same] / 3.6e12
    assert 3 < gaps_h.median() < 30  # like the real spot history (median gap ~7 h at 400 points/offer-year)


def test_batches_are_store_frames_in_time_order() -> None:
    frames, lo, hi, _ = realistic_batches(2_500, 20, 1_000)
    sizes, last = [], None
    for frame in frames:
        assert list(frame.columns) == [
            "cloud",
            "region",
            "zone",
            "instance_type",
            "market",
            "valid_from",
            "usd_per_hour",
            "source",
        ]
        assert isinstance(frame["valid_from"].dtype, pd.DatetimeTZDtype)
        if last is not None:
            assert frame["valid_from"].min() >= last
        last = frame["valid_from"].max()
        sizes.append(len(frame))
    assert sizes == [1_000, 1_000, 500]
    assert lo < hi


def test_more_keys_than_points_is_refused() -> None:
    with pytest.raises(ValueError, match="keys"):
        realistic_arrays(10, 11)
