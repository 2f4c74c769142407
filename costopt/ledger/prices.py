"""Prices as step functions, as the ledger and the simulated cloud read them.

The core states what it needs as protocols (it never imports the pricing package):

- :class:`PriceSteps` (the ledger): the change points that define one offer's price over a range;
- :class:`PriceView` (the simulated cloud and the job backtest): also the offers in effect at a time
  and each offer's GPU shape.

Implementations: :class:`StepPrices` holds change points in memory (built from a ``PriceStore.history``
frame, or from a backtest's price grid); :class:`StorePriceView` reads any object with the price
store's ``history``/``snapshot_frame``/``instance_types`` methods (``pricing.store.PriceStore``).

Semantics (those of the price store): a point holds from its ``valid_from`` until the offer's next point;
after the last known point the last price holds; before the first there is no price (nothing is
back-filled). Times tz-aware UTC; prices USD per instance-hour.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt
import pandas as pd

from costopt.domain import Cloud, InstanceType, Market, OfferKey
from costopt.ledger.model import NoPriceInEffect, Segment, segment_micro_usd
from costopt.planning.evaluate import OFFER_COLUMNS
from costopt.planning.model import money

__all__ = [
    "OFFER_COLUMNS",
    "PriceHistorySource",
    "PriceStep",
    "PriceSteps",
    "PriceView",
    "StepPrices",
    "StorePriceView",
    "offer_label",
    "price_segments",
]

KEY_COLUMNS = ("cloud", "region", "zone", "instance_type", "market")
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_US = timedelta(microseconds=1)


@dataclass(frozen=True, slots=True)
class PriceStep:
    """A change point: ``usd_per_hour`` from ``valid_from`` until the next step of the same offer."""

    valid_from: datetime
    usd_per_hour: float


class PriceSteps(Protocol):
    """What the ledger needs: the steps defining ``key``'s price over ``[start, end)``."""

    def steps(self, key: OfferKey, start: datetime, end: datetime) -> Sequence[PriceStep]:
        """The step in effect at ``start`` (its own ``valid_from``, at or before ``start``) followed by
        every step with ``start < valid_from < end``, in time order. Empty, or starting after
        ``start``, when no price is in effect at ``start``."""
        ...


class PriceView(PriceSteps, Protocol):
    """What the simulated cloud and the job backtest need: steps, offers in effect, GPU shapes."""

    def offers_at(self, at: datetime) -> pd.DataFrame:
        """Every offer with a price in effect at ``at`` (columns :data:`OFFER_COLUMNS`, those the
        planner's ``OfferTable`` reads; accelerator and gpu_count None/NaN when the instance type is
        unknown)."""
        ...

    def shape(self, key: OfferKey) -> tuple[str, float] | None:
        """(accelerator, GPUs per instance) of the offer's instance type, None when unknown."""
        ...


class WrappedView:
    """A :class:`PriceView` over another, ``view``: its offers, shapes and other attributes (e.g. a store)
    are the wrapped view's; a subclass changes what it needs (``steps``)."""

    def __init__(self, view: PriceView) -> None:
        self.view = view

    def steps(self, key: OfferKey, start: datetime, end: datetime) -> Sequence[PriceStep]:
        return self.view.steps(key, start, end)

    def offers_at(self, at: datetime) -> pd.DataFrame:
        return self.view.offers_at(at)

    def shape(self, key: OfferKey) -> tuple[str, float] | None:
        return self.view.shape(key)

    def __getattr__(self, name: str) -> Any:  # the wrapped view's other attributes
        if name == "view":  # not set yet (copying, unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.view, name)


class PriceHistorySource(Protocol):
    """A price store as :class:`StepPrices.load` and :class:`StorePriceView` read it
    (``pricing.store.PriceStore`` has these methods)."""

    def history(
        self,
        start: datetime,
        end: datetime,
        *,
        cloud: Cloud | None = None,
        region: str | None = None,
        zone: str | None = None,
        instance_type: str | None = None,
        market: Market | None = None,
    ) -> pd.DataFrame: ...

    def instance_types(self, cloud: Cloud | None = None) -> list[InstanceType]: ...


class _SnapshotSource(PriceHistorySource, Protocol):
    def snapshot_frame(self, at: datetime | None = None) -> pd.DataFrame: ...


def _ns(at: datetime) -> int:
    if at.tzinfo is None:
        raise NoPriceInEffect(f"times must be tz-aware UTC, got naive {at}")
    return (at - _EPOCH) // _US * 1000


def _dt(ns: int) -> datetime:
    return _EPOCH + timedelta(microseconds=int(ns) // 1000)


def price_segments(
    prices: PriceSteps, key: OfferKey, start: datetime, end: datetime, share: Decimal = Decimal(1)
) -> tuple[Segment, ...]:
    """``[start, end)`` cut at each price change of ``key``, each piece with its price (Decimal of the
    float's shortest repr) and its amount for ``share`` of the instance (micro-dollars, rounded once).

    Raises :class:`NoPriceInEffect` when no price is in effect at ``start`` (so at some moment of the
    range): a price from another time is never used."""
    if end < start:
        raise NoPriceInEffect(f"{key}: range ends {end} before it starts {start}")
    if end == start:
        return ()
    steps = list(prices.steps(key, start, end))
    if not steps or steps[0].valid_from > start:
        first = f"; its first price is from {steps[0].valid_from}" if steps else ""
        raise NoPriceInEffect(f"no price of {offer_label(key)} is in effect at {start.isoformat()}{first}")
    out: list[Segment] = []
    for i, step in enumerate(steps):
        s = max(step.valid_from, start)
        e = min(steps[i + 1].valid_from, end) if i + 1 < len(steps) else end
        if e > s:
            price = money(step.usd_per_hour)
            out.append(Segment(s, e, price, segment_micro_usd(s, e, price, share)))
    return tuple(out)


def offer_label(key: OfferKey) -> str:
    """``aws us-east-1/us-east-1a p3.2xlarge (spot)``: an offer for messages and decision logs."""
    zone = f"/{key.zone}" if key.zone else ""
    return f"{key.cloud.value} {key.region}{zone} {key.instance_type} ({key.market.value})"


class StepPrices:
    """Change points of many offers, in memory and immutable (a :class:`PriceView`).

    Build it with :meth:`from_history` (a ``PriceStore.history`` frame), :meth:`load` (from a store,
    over a range) or :meth:`from_grid` (a backtest's price grid: one step per period).
    """

    def __init__(
        self,
        keys: Sequence[OfferKey],
        valid_from_ns: Sequence[npt.NDArray[np.int64]],
        usd_per_hour: Sequence[npt.NDArray[np.float64]],
        shapes: Mapping[tuple[str, str], tuple[str, float]],
    ) -> None:
        if not (len(keys) == len(valid_from_ns) == len(usd_per_hour)):
            raise ValueError("one array of times and prices per offer")
        self._keys = tuple(keys)
        self._index = {k: i for i, k in enumerate(self._keys)}
        self._vf = tuple(np.asarray(v, dtype=np.int64) for v in valid_from_ns)
        self._usd = tuple(np.asarray(u, dtype=np.float64) for u in usd_per_hour)
        for v in self._vf:
            if len(v) > 1 and np.any(np.diff(v) <= 0):
                raise ValueError("change points of an offer must be strictly increasing in time")
        self._shapes = dict(shapes)
        self._first = np.array([v[0] if len(v) else np.iinfo(np.int64).max for v in self._vf], dtype=np.int64)
        acc_gpu = [self._shapes.get((k.cloud.value, k.instance_type)) for k in self._keys]
        self._frame = pd.DataFrame(
            {
                "cloud": [k.cloud.value for k in self._keys],
                "region": [k.region for k in self._keys],
                "zone": [k.zone for k in self._keys],
                "instance_type": [k.instance_type for k in self._keys],
                "market": [k.market.value for k in self._keys],
                "accelerator": pd.Series([s[0] if s else None for s in acc_gpu], dtype=object),
                "gpu_count": np.array([s[1] if s else np.nan for s in acc_gpu], dtype=np.float64),
            }
        )

    # --- construction -------------------------------------------------------------------------------

    @classmethod
    def from_history(
        cls, frame: pd.DataFrame, shapes: Mapping[tuple[str, str], tuple[str, float]] | Iterable[InstanceType]
    ) -> StepPrices:
        """From change points (columns of ``PriceStore.history``: cloud, region, zone, instance_type,
        market, valid_from, usd_per_hour). ``shapes``: (cloud, instance type) -> (accelerator, GPUs), or
        the catalog's instance types. Repeated points of one offer at one time keep the last."""
        shape_map = _shape_map(shapes)
        if frame.empty:
            return cls([], [], [], shape_map)
        f = frame.loc[:, [*KEY_COLUMNS, "valid_from", "usd_per_hour"]].copy()
        f["_ns"] = pd.DatetimeIndex(pd.to_datetime(f["valid_from"], utc=True)).as_unit("ns").asi8
        f = f.sort_values([*KEY_COLUMNS, "_ns"], kind="stable").drop_duplicates([*KEY_COLUMNS, "_ns"], keep="last")
        keys: list[OfferKey] = []
        vfs: list[npt.NDArray[np.int64]] = []
        usds: list[npt.NDArray[np.float64]] = []
        for key_values, group in f.groupby(list(KEY_COLUMNS), sort=True):
            cloud, region, zone, itype, market = (str(v) for v in key_values)
            keys.append(OfferKey(Cloud(cloud), region, zone, itype, Market(market)))
            vfs.append(group["_ns"].to_numpy(dtype=np.int64))
            usds.append(group["usd_per_hour"].to_numpy(dtype=np.float64))
        return cls(keys, vfs, usds, shape_map)

    @classmethod
    def load(
        cls,
        source: PriceHistorySource,
        start: datetime,
        end: datetime,
        *,
        clouds: Sequence[Cloud] | None = None,
        regions: Sequence[str] | None = None,
        markets: Sequence[Market] | None = None,
    ) -> StepPrices:
        """Every offer's steps over ``[start, end]`` (with the step in effect at ``start``) from a store,
        optionally only some clouds, regions and markets."""
        frames: list[pd.DataFrame] = []
        cloud_list: list[Cloud | None] = list(clouds) if clouds else [None]
        market_list: list[Market | None] = list(markets) if markets else [None]
        region_list: list[str | None] = list(regions) if regions else [None]
        for cloud in cloud_list:
            for market in market_list:
                for region in region_list:
                    frames.append(source.history(start, end, cloud=cloud, region=region, market=market))
        frames = [f for f in frames if not f.empty]
        frame = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=[*KEY_COLUMNS, "valid_from"])
        return cls.from_history(frame, source.instance_types())

    @classmethod
    def from_grid(
        cls, offers: pd.DataFrame, start: datetime, period_hours: float, usd_per_hour: npt.NDArray[np.float64]
    ) -> StepPrices:
        """One step per period of a backtest grid: offer ``o`` costs ``usd_per_hour[t, o]`` over period
        ``t`` (from ``start + t * period_hours``); NaN periods before an offer's first price are left out
        (no price), repeats are merged. ``offers``: the grid's offers (key columns, accelerator,
        gpu_count), one row per column of ``usd_per_hour``."""
        n_periods, n_off = usd_per_hour.shape
        if len(offers) != n_off:
            raise ValueError("one offer row per grid column")
        step = round(period_hours * 3_600_000_000_000)
        t_ns = _ns(start) + step * np.arange(n_periods, dtype=np.int64)
        keys: list[OfferKey] = []
        vfs: list[npt.NDArray[np.int64]] = []
        usds: list[npt.NDArray[np.float64]] = []
        shapes: dict[tuple[str, str], tuple[str, float]] = {}
        rows = offers.reset_index(drop=True)
        for o in range(n_off):
            col = usd_per_hour[:, o]
            ok = np.isfinite(col)
            if not ok.any():
                continue
            first = int(np.argmax(ok))
            if not ok[first:].all():
                raise ValueError("a grid column must be priced in every period after its first price")
            vals = col[first:]
            change = np.ones(len(vals), dtype=bool)
            change[1:] = vals[1:] != vals[:-1]
            row = rows.iloc[o]
            key = OfferKey(
                Cloud(str(row["cloud"])),
                str(row["region"]),
                str(row["zone"]),
                str(row["instance_type"]),
                Market(str(row["market"])),
            )
            keys.append(key)
            vfs.append(t_ns[first:][change])
            usds.append(vals[change])
            shapes[(key.cloud.value, key.instance_type)] = (str(row["accelerator"]), float(row["gpu_count"]))
        return cls(keys, vfs, usds, shapes)

    # --- reads --------------------------------------------------------------------------------------

    @property
    def keys(self) -> tuple[OfferKey, ...]:
        return self._keys

    def steps(self, key: OfferKey, start: datetime, end: datetime) -> list[PriceStep]:
        """See :meth:`PriceSteps.steps`."""
        i = self._index.get(key)
        if i is None:
            return []
        vf, usd = self._vf[i], self._usd[i]
        lo = int(np.searchsorted(vf, _ns(start), side="right")) - 1
        hi = int(np.searchsorted(vf, _ns(end), side="left"))
        return [PriceStep(_dt(int(vf[j])), float(usd[j])) for j in range(max(lo, 0), hi)]

    def price_at(self, key: OfferKey, at: datetime) -> float | None:
        """USD/h of ``key`` in effect at ``at`` (None: no price yet, or unknown offer)."""
        i = self._index.get(key)
        if i is None:
            return None
        pos = int(np.searchsorted(self._vf[i], _ns(at), side="right")) - 1
        return None if pos < 0 else float(self._usd[i][pos])

    def offers_at(self, at: datetime) -> pd.DataFrame:
        """See :meth:`PriceView.offers_at` (offers in key order)."""
        at_ns = _ns(at)
        live = np.flatnonzero(self._first <= at_ns)
        prices = np.empty(len(live))
        for n, i in enumerate(live):
            pos = int(np.searchsorted(self._vf[i], at_ns, side="right")) - 1
            prices[n] = self._usd[i][pos]
        frame = self._frame.iloc[live].reset_index(drop=True).copy()
        frame["usd_per_hour"] = prices
        return frame

    def shape(self, key: OfferKey) -> tuple[str, float] | None:
        """See :meth:`PriceView.shape`."""
        return self._shapes.get((key.cloud.value, key.instance_type))


def _shape_map(
    shapes: Mapping[tuple[str, str], tuple[str, float]] | Iterable[InstanceType],
) -> dict[tuple[str, str], tuple[str, float]]:
    if isinstance(shapes, Mapping):
        return {(str(c), str(t)): (str(a), float(g)) for (c, t), (a, g) in shapes.items()}
    return {(it.cloud.value, it.name): (it.accelerator, float(it.gpu_count)) for it in shapes}


class StorePriceView:
    """A :class:`PriceView` over a live price store (each call reads it; shapes are read once).

    ``offers_at`` uses the store's snapshot (stale offers left out, as plans do)."""

    def __init__(self, store: _SnapshotSource) -> None:
        self._store = store
        self._shapes: dict[tuple[str, str], tuple[str, float]] | None = None

    def steps(self, key: OfferKey, start: datetime, end: datetime) -> list[PriceStep]:
        frame = self._store.history(
            start,
            end,
            cloud=key.cloud,
            region=key.region,
            zone=key.zone,
            instance_type=key.instance_type,
            market=key.market,
        )
        if frame.empty:
            return []
        end_ts = pd.Timestamp(end).tz_convert(UTC)
        vf = pd.to_datetime(frame["valid_from"], utc=True)
        keep = (vf < end_ts).to_numpy()
        return [
            PriceStep(ts.to_pydatetime(), float(p))
            for ts, p in zip(vf[keep], frame["usd_per_hour"].to_numpy(dtype=np.float64)[keep], strict=True)
        ]

    def offers_at(self, at: datetime) -> pd.DataFrame:
        frame = self._store.snapshot_frame(at)
        return frame.loc[:, list(OFFER_COLUMNS)].reset_index(drop=True)

    def shape(self, key: OfferKey) -> tuple[str, float] | None:
        if self._shapes is None:
            self._shapes = _shape_map(self._store.instance_types())
        return self._shapes.get((key.cloud.value, key.instance_type))
