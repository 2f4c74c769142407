"""Prices on a grid of periods: one row per period (a UTC day, or an hour), one column per offer.

The price of an offer for a period is the price **in effect at the end of that period**: its last change
point strictly before the period's end (a change at 23:59:59 counts for that day; a change at 00:00 of
the next day does not), else the point before. An offer has no price (NaN) in the periods before its
first known point: nothing is back-filled. After the last known point, the last price holds (a job
that outlives the data keeps the last known prices; :attr:`PriceGrid.data_end` says where the data
stops).

Input frames have the columns of ``PriceStore.history``: ``cloud, region, zone, instance_type, market,
valid_from, usd_per_hour`` (``valid_from`` tz-aware UTC). Units: USD per instance-hour, hours.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta

import numpy as np
import numpy.typing as npt
import pandas as pd

from costopt.errors import CostoptError
from costopt.ledger.prices import KEY_COLUMNS

__all__ = [
    "KEY_COLUMNS",
    "BacktestError",
    "OfferSet",
    "PriceGrid",
    "build_price_grid",
    "change_days",
]

log = logging.getLogger(__name__)

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]

OFFER_COLUMNS = (*KEY_COLUMNS, "accelerator", "gpu_count")
_NS_PER_HOUR = 3_600_000_000_000


class BacktestError(CostoptError, ValueError):
    """A backtest cannot run as asked (missing prices or throughputs, too few start days, bad grid)."""


def _ns(values: pd.Series | pd.DatetimeIndex) -> IntArray:
    idx = pd.DatetimeIndex(pd.to_datetime(values, utc=True)).as_unit("ns")
    out: IntArray = idx.asi8.astype(np.int64)
    return out


def _utc_ns(at: datetime) -> int:
    if at.tzinfo is None:
        raise BacktestError(f"times must be tz-aware UTC, got naive {at}")
    return int(pd.Timestamp(at).tz_convert(UTC).as_unit("ns").value)


@dataclass(frozen=True, eq=False)
class OfferSet:
    """Offers in a fixed, sorted order (cloud, region, zone, instance type, market), with the
    accelerator and GPU count of each (``gpu_count`` GPUs of ``accelerator`` per instance)."""

    frame: pd.DataFrame

    @classmethod
    def from_frame(cls, offers: pd.DataFrame) -> OfferSet:
        missing = [c for c in OFFER_COLUMNS if c not in offers.columns]
        if missing:
            raise BacktestError(f"offers frame lacks columns {missing}")
        frame = offers.loc[:, list(OFFER_COLUMNS)].drop_duplicates(list(KEY_COLUMNS))
        frame = frame.astype({c: str for c in (*KEY_COLUMNS, "accelerator")}).astype({"gpu_count": float})
        if (frame["gpu_count"] <= 0).any() or frame["gpu_count"].isna().any():
            raise BacktestError("every offer needs a GPU count > 0")
        frame = frame.sort_values(list(KEY_COLUMNS), kind="stable").reset_index(drop=True)
        return cls(frame)

    def __len__(self) -> int:
        return len(self.frame)

    def column(self, name: str) -> npt.NDArray[np.object_]:
        out: npt.NDArray[np.object_] = self.frame[name].to_numpy(dtype=object)
        return out

    @property
    def gpus(self) -> FloatArray:
        out: FloatArray = self.frame["gpu_count"].to_numpy(dtype=np.float64)
        return out

    def mask(
        self,
        *,
        clouds: tuple[str, ...] | None = None,
        markets: tuple[str, ...] | None = None,
        instance_types: tuple[str, ...] | None = None,
        regions: tuple[str, ...] | None = None,
    ) -> BoolArray:
        """Offers matching every given filter (None: any)."""
        m = np.ones(len(self), dtype=bool)
        for name, allowed in (
            ("cloud", clouds),
            ("market", markets),
            ("instance_type", instance_types),
            ("region", regions),
        ):
            if allowed is not None:
                m &= self.frame[name].isin(allowed).to_numpy(dtype=bool)
        return m

    def label(self, i: int) -> str:
        row = self.frame.iloc[i]
        zone = f"/{row['zone']}" if row["zone"] else ""
        return f"{row['cloud']} {row['region']}{zone} {row['instance_type']} ({row['market']})"


@dataclass(frozen=True, eq=False)
class PriceGrid:
    """USD per instance-hour of every offer in every period (``usd_per_hour[t, o]``, NaN before the
    offer's first known price). Period ``t`` covers ``[start + t * period_hours, start + (t + 1) *
    period_hours)``. ``data_end``: the end of the last period that holds a known change point; later
    periods repeat the last known prices."""

    offers: OfferSet
    start: datetime
    period_hours: float
    usd_per_hour: FloatArray
    data_end: datetime

    @property
    def periods(self) -> int:
        return int(self.usd_per_hour.shape[0])

    @property
    def data_end_hours(self) -> float:
        """Hours from ``start`` to ``data_end``."""
        return (self.data_end - self.start).total_seconds() / 3600.0

    def period_of(self, at: datetime) -> int:
        """Index of the period holding ``at``."""
        hours = (at - self.start).total_seconds() / 3600.0
        return int(np.floor(hours / self.period_hours + 1e-9))

    def time_of(self, period: int) -> datetime:
        return self.start + timedelta(hours=period * self.period_hours)


def build_price_grid(
    history: pd.DataFrame,
    offers: OfferSet,
    start: datetime,
    periods: int,
    period_hours: float = 24.0,
    *,
    constant: pd.DataFrame | None = None,
) -> PriceGrid:
    """The grid of :class:`PriceGrid` from change points (see the module docstring).

    ``history``: change points (columns of ``PriceStore.history``); points of offers not in ``offers``
    are ignored. ``constant``: offers priced the same in every period regardless of their dates
    (columns ``KEY_COLUMNS`` + ``usd_per_hour``; e.g. list prices), one row per offer.
    """
    if periods < 1 or not period_hours > 0:
        raise BacktestError(f"a grid needs >= 1 period of > 0 hours, got {periods} x {period_hours}")
    if start.tzinfo is None:
        raise BacktestError(f"the grid's start must be tz-aware UTC, got {start}")
    n_off = len(offers)
    prices = np.full((periods, n_off), np.nan)
    step_ns = round(period_hours * _NS_PER_HOUR)
    start_ns = _utc_ns(start)
    ends = start_ns + step_ns * np.arange(1, periods + 1, dtype=np.int64)
    index = {tuple(r): i for i, r in enumerate(offers.frame.loc[:, list(KEY_COLUMNS)].itertuples(index=False))}
    last_point_ns = None
    if len(history):
        missing = [c for c in (*KEY_COLUMNS, "valid_from", "usd_per_hour") if c not in history.columns]
        if missing:
            raise BacktestError(f"price history lacks columns {missing}")
        keys = history.loc[:, list(KEY_COLUMNS)].astype(str)
        col = np.array([index.get(tuple(k), -1) for k in keys.itertuples(index=False)], dtype=np.int64)
        keep = col >= 0
        vf = _ns(history["valid_from"])[keep]
        usd = history["usd_per_hour"].to_numpy(dtype=np.float64)[keep]
        col = col[keep]
        if len(col):
            order = np.lexsort((vf, col))
            col, vf, usd = col[order], vf[order], usd[order]
            bounds = np.searchsorted(col, np.arange(n_off + 1))
            for o in range(n_off):
                lo, hi = int(bounds[o]), int(bounds[o + 1])
                if lo == hi:
                    continue
                # last point strictly before each period's end
                pos = np.searchsorted(vf[lo:hi], ends, side="left") - 1
                prices[:, o] = np.where(pos >= 0, usd[lo:hi][np.maximum(pos, 0)], np.nan)
            last_point_ns = int(vf.max())
    if constant is not None and len(constant):
        keys_c = constant.loc[:, list(KEY_COLUMNS)].astype(str).itertuples(index=False)
        usd_c = constant["usd_per_hour"].to_numpy(dtype=np.float64)
        for key_c, value in zip(keys_c, usd_c, strict=True):
            if tuple(key_c) in index:
                prices[:, index[tuple(key_c)]] = float(value)
    if last_point_ns is None:
        data_end = start
    else:
        last_period = (last_point_ns - start_ns) // step_ns
        data_end = start + timedelta(hours=float(period_hours * (last_period + 1)))
    return PriceGrid(
        offers=offers, start=start, period_hours=float(period_hours), usd_per_hour=prices, data_end=data_end
    )


def change_days(history: pd.DataFrame, filters: Mapping[str, str]) -> list[date]:
    """Distinct UTC days on which the price of an offer matching ``filters`` (column -> value, e.g.
    ``{"cloud": "aws", "region": "us-east-1", "instance_type": "p3.2xlarge"}``) changed, sorted.

    A change is a point whose price differs from the offer's previous point; an offer's first known
    point is where its record starts, not a change."""
    m = np.ones(len(history), dtype=bool)
    for name, value in filters.items():
        m &= history[name].astype(str).to_numpy() == value
    sub = history.loc[m, [*KEY_COLUMNS, "valid_from", "usd_per_hour"]].copy()
    if sub.empty:
        return []
    sub["_ns"] = _ns(sub["valid_from"])
    sub = sub.sort_values([*KEY_COLUMNS, "_ns"], kind="stable")
    same_offer = (sub.loc[:, list(KEY_COLUMNS)].shift(1) == sub.loc[:, list(KEY_COLUMNS)]).all(axis=1).to_numpy()
    prev = sub["usd_per_hour"].shift(1).to_numpy(dtype=np.float64)
    changed = same_offer & (sub["usd_per_hour"].to_numpy(dtype=np.float64) != prev)
    days = pd.to_datetime(sub.loc[changed, "_ns"].to_numpy(), utc=True).normalize()
    return sorted({d.date() for d in days})
