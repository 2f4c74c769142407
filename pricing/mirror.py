"""An in-process mirror of the price store for fast snapshots (current and as-of).

The database stays the source of truth. Every price write bumps ``store_meta.price_version`` in
its own transaction; before answering, the mirror reads that counter (one tiny query) and reloads
what it holds when it changed, so a reader never sees prices older than the last committed write,
whichever process wrote them. Offers are mirrored always; all change points only while there are
at most ``max_points`` of them (above that, as-of snapshots go to SQL).

Snapshots are computed column-wise: for each offer, the last point at or before t is found with
one pass over the points sorted by (offer, time) (no per-offer query).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import numpy as np
import pandas as pd
from sqlalchemy import Connection, Engine

from costopt.db.schema import store_meta
from costopt.db.types import db_value_to_ns
from pricing.ingest import dt_to_ns, micros_sql

SNAPSHOT_COLUMNS = [
    "offer_id",
    "cloud",
    "region",
    "zone",
    "instance_type",
    "market",
    "usd_per_hour",
    "valid_from",
    "source",
    "last_confirmed_at",
    "accelerator",
    "gpu_count",
    "stale",
]


_VERSION = store_meta.select().with_only_columns(store_meta.c.value).where(store_meta.c.name == "price_version")
"""Built once: read on every plan (SQLAlchemy then reuses its cache key)."""


def read_version(bind: Engine | Connection) -> int:
    """The store's price version (bumped by every write of prices), on ``bind``: an engine (a connection
    of its own) or a caller's connection."""
    if isinstance(bind, Connection):
        return int(bind.execute(_VERSION).scalar_one_or_none() or 0)
    with bind.connect() as conn:
        value = conn.execute(_VERSION).scalar_one_or_none()
    return int(value or 0)


def _ns_col(values: list[object], dialect: str) -> np.ndarray:
    """Timestamps as returned by the driver (int µs on SQLite, datetime on PostgreSQL) -> int64 ns
    (int64 min for None)."""
    missing = np.iinfo(np.int64).min
    return np.array([missing if v is None else db_value_to_ns(v) for v in values], dtype=np.int64)


@dataclass
class _Offers:
    version: int
    frame: pd.DataFrame  # indexed by offer id; key columns, current point, confirmation, catalog


@dataclass
class _Points:
    version: int
    offer_id: np.ndarray  # int64, sorted by (offer, time)
    vf: np.ndarray  # int64 ns
    price: np.ndarray  # float64
    source_code: np.ndarray  # int32 into sources
    sources: np.ndarray  # object
    starts: np.ndarray  # first index of each offer's run
    run_offer: np.ndarray  # offer id of each run


class PriceMirror:
    """Thread-safe, version-checked mirror of offers and (bounded) price points."""

    def __init__(self, engine: Engine, *, max_points: int = 5_000_000) -> None:
        self.engine = engine
        self.dialect = engine.dialect.name
        self.max_points = max_points
        self._lock = threading.Lock()
        self._offers: _Offers | None = None
        self._points: _Points | None = None
        self._too_many_points_at: int | None = None

    # ---------------------------------------------------------------- loading
    def offers(self, version: int | None = None) -> pd.DataFrame:
        """Current offers frame (reloaded when the store changed). ``version``: the store's price version the
        caller just read (None: read it here)."""
        if version is None:
            version = read_version(self.engine)
        with self._lock:
            if self._offers is None or self._offers.version != version:
                self._offers = _Offers(version, self._load_offers())
            return self._offers.frame

    def _load_offers(self) -> pd.DataFrame:
        sql = (
            "SELECT o.id, o.cloud, o.region, o.zone, o.instance_type, o.market, o.current_usd_per_hour,"
            " o.current_valid_from, o.current_source, o.last_confirmed_at, it.accelerator, it.gpu_count"
            " FROM offers o LEFT JOIN instance_types it ON it.cloud = o.cloud AND it.name = o.instance_type"
            " WHERE o.current_valid_from IS NOT NULL ORDER BY o.id"
        )
        with self.engine.connect() as conn:
            rows = conn.exec_driver_sql(sql).fetchall()
        cols: list[tuple[Any, ...]] = list(zip(*rows, strict=True)) if rows else [() for _ in range(12)]
        frame = pd.DataFrame(
            {
                "offer_id": np.asarray(cols[0], dtype=np.int64),
                "cloud": np.asarray(cols[1], dtype=object),
                "region": np.asarray(cols[2], dtype=object),
                "zone": np.asarray(cols[3], dtype=object),
                "instance_type": np.asarray(cols[4], dtype=object),
                "market": np.asarray(cols[5], dtype=object),
                "cur_price": np.asarray(cols[6], dtype=np.float64),
                "cur_vf": _ns_col(list(cols[7]), self.dialect),
                "cur_source": np.asarray(cols[8], dtype=object),
                "confirmed": _ns_col(list(cols[9]), self.dialect),
                "accelerator": np.asarray(cols[10], dtype=object),
                "gpu_count": np.asarray([np.nan if v is None else v for v in cols[11]], dtype=np.float64),
            }
        )
        return with_key_rank(frame.set_index("offer_id", drop=False))

    def points(self, version: int | None = None) -> _Points | None:
        """All change points (None when there are more than ``max_points``). ``version``: as for :meth:`offers`."""
        if version is None:
            version = read_version(self.engine)
        with self._lock:
            if self._points is not None and self._points.version == version:
                return self._points
            if self._too_many_points_at == version:
                return None
            with self.engine.connect() as conn:
                n = int(conn.exec_driver_sql("SELECT count(*) FROM price_points").scalar_one())
                if n > self.max_points:
                    self._too_many_points_at = version
                    self._points = None
                    return None
                sql = (
                    f"SELECT offer_id, {micros_sql('valid_from', self.dialect)}, usd_per_hour, source"
                    " FROM price_points ORDER BY offer_id, valid_from"
                )
                rows = conn.exec_driver_sql(sql).fetchall()
            if rows:
                oid, vfs, price, src = zip(*rows, strict=True)
            else:
                oid, vfs, price, src = (), (), (), ()
            vf = np.asarray(vfs, dtype=np.int64) * 1000  # integer µs on both backends
            offer_id = np.asarray(oid, dtype=np.int64)
            codes, uniq = pd.factorize(np.asarray(src, dtype=object))
            starts = (
                np.flatnonzero(np.r_[True, offer_id[1:] != offer_id[:-1]])
                if len(offer_id)
                else np.array([], dtype=np.int64)
            )
            self._points = _Points(
                version,
                offer_id,
                vf,
                np.asarray(price, dtype=np.float64),
                codes.astype(np.int32),
                np.asarray(uniq, dtype=object),
                starts,
                offer_id[starts] if len(offer_id) else offer_id,
            )
            return self._points

    # ---------------------------------------------------------------- snapshots
    def snapshot(self, at: datetime | None, judge_at: datetime, stale_after_ns: int) -> dict[str, np.ndarray] | None:
        """Unfiltered snapshot columns (see PriceStore.snapshot_frame) or None when the points are
        not mirrored (too many): the caller then asks SQL."""
        if (at is not None and at.tzinfo is None) or judge_at.tzinfo is None:
            raise ValueError("naive datetime: pass a tz-aware UTC time")
        version = read_version(self.engine)  # once for both: one round trip, and offers and points of one version
        offers = self.offers(version)
        if at is None:
            rows = np.arange(len(offers))
            price = offers["cur_price"].to_numpy()
            vf = offers["cur_vf"].to_numpy()
            source = offers["cur_source"].to_numpy()
        else:
            pts = self.points(version)
            if pts is None:
                return None
            t = dt_to_ns(at.astimezone(UTC))
            if len(pts.offer_id) == 0:
                return snapshot_columns_from(
                    offers.iloc[:0],
                    np.array([]),
                    np.array([], dtype=np.int64),
                    np.array([], dtype=object),
                    judge_at,
                    stale_after_ns,
                )
            le = pts.vf <= t
            counts = np.add.reduceat(le.astype(np.int64), pts.starts)
            ok = counts > 0
            idx = pts.starts[ok] + counts[ok] - 1
            rows = offers.index.get_indexer(pd.Index(pts.run_offer[ok]))
            keep = rows >= 0
            rows, idx = rows[keep], idx[keep]
            price, vf, source = pts.price[idx], pts.vf[idx], pts.sources[pts.source_code[idx]]
        return snapshot_columns_from(offers.iloc[rows], price, vf, source, judge_at, stale_after_ns)

    def invalidate(self) -> None:
        with self._lock:
            self._offers = None
            self._points = None
            self._too_many_points_at = None


def with_key_rank(frame: pd.DataFrame) -> pd.DataFrame:
    """Add ``key_rank``: each offer's position in (cloud, region, zone, instance_type, market) order,
    the tie-breaker of snapshots (so sorting needs no string comparison per query)."""
    n = len(frame)
    if n <= _SMALL_SORT:  # numpy's stable lexsort on the strings: ~0.3 ms where pandas' sort costs ~7 ms
        order = np.lexsort([frame[c].to_numpy() for c in reversed(_KEY_ORDER)])
        rank = np.empty(n, dtype=np.int64)
        rank[order] = np.arange(n, dtype=np.int64)
        frame["key_rank"] = rank
        return frame
    by_key = frame.sort_values(list(_KEY_ORDER), kind="stable").index
    frame["key_rank"] = pd.Series(np.arange(n, dtype=np.int64), index=by_key).reindex(frame.index).to_numpy()
    return frame


_KEY_ORDER = ("cloud", "region", "zone", "instance_type", "market")
_SMALL_SORT = 256
"""Up to this many offers :func:`with_key_rank` sorts with numpy (comparing Python strings per pair: slower
than pandas' sort on thousands of offers, much faster on a few)."""


def snapshot_columns_from(
    meta: pd.DataFrame, price: np.ndarray, vf: np.ndarray, source: np.ndarray, judge_at: datetime, stale_after_ns: int
) -> dict[str, np.ndarray]:
    """Assemble snapshot columns: offer metadata rows aligned with their prices in effect."""
    confirmed = meta["confirmed"].to_numpy(dtype=np.int64)
    threshold = dt_to_ns(judge_at.astimezone(UTC)) - stale_after_ns
    return {
        "offer_id": meta["offer_id"].to_numpy(dtype=np.int64),
        "cloud": meta["cloud"].to_numpy(),
        "region": meta["region"].to_numpy(),
        "zone": meta["zone"].to_numpy(),
        "instance_type": meta["instance_type"].to_numpy(),
        "market": meta["market"].to_numpy(),
        "usd_per_hour": np.asarray(price, dtype=np.float64),
        "vf": np.asarray(vf, dtype=np.int64),
        "source": np.asarray(source, dtype=object),
        "confirmed": confirmed,
        "accelerator": meta["accelerator"].to_numpy(),
        "gpu_count": meta["gpu_count"].to_numpy(dtype=np.float64),
        "key_rank": meta["key_rank"].to_numpy(dtype=np.int64),
        "stale": confirmed < threshold,
    }
