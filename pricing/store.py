"""The price store: change points of every offer, on SQLite (embedded default) or PostgreSQL.

Contract
- A price is a step function per offer: a point ``(offer, valid_from, usd_per_hour)`` holds until the
  next point of the same offer. Queries read change points only; a point whose price equals the price
  already in effect at its time confirms it and is kept apart (``price_repeats``), so a late, older
  point is placed against every observation after it: the step function is that of all observations
  (the last write of each key winning) whatever order writes arrive in (see :mod:`pricing.ingest`).
- The key of a point is ``(cloud, region, zone, instance_type, market, valid_from)``. Writing is an
  idempotent, set-based upsert: re-writing the same points changes nothing. A point already stored
  with another price at the same key is corrected (the newer write wins) and counted.
- ``last_confirmed_at`` of an offer is the newest time a source vouched for its price: the fetch time
  for live collectors (``PricePoint.observed_at``), the record's own time for imported history.
- An offer not confirmed within ``stale_after`` of a time t is stale at t: it is left out of
  snapshots (plans) at t unless asked for. History is always queryable.
- Times are tz-aware UTC; prices are USD per instance-hour (float).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Literal, TypedDict, Unpack

import numpy as np
import pandas as pd
from sqlalchemy import Engine, func, literal, select, text

from costopt.db.schema import instance_types as t_instance_types
from costopt.db.schema import offers as t_offers
from costopt.db.schema import price_points as t_points
from costopt.db.schema import source_status as t_status
from costopt.db.types import db_value_to_ns, to_epoch_us
from costopt.db.upserts import CONFLICT_INSERTS
from costopt.domain import (
    Cloud,
    InstanceType,
    Market,
    OfferKey,
    PricePoint,
    utc,
)
from costopt.errors import StoreError
from pricing.ingest import KEY_COLUMNS, PG_WRITE_LOCK, Ingestor, WriteResult, prepare
from pricing.mirror import SNAPSHOT_COLUMNS, PriceMirror, snapshot_columns_from, with_key_rank
from pricing.screen import ScreenRules

REFERENCE_SOURCES = frozenset({"list-price"})
"""Sources of curated reference facts (published list prices), not observations of the market."""
IMPORT_SOURCE_PREFIX = "import:"
"""``source_status`` rows of imported files are named ``import:<kind>``; imports are not scheduled, so
such a row is never stale."""
BUMP_VERSION_SQL = "UPDATE store_meta SET value = value + 1 WHERE name = 'price_version'"
_NAT = np.iinfo(np.int64).min

log = logging.getLogger("costopt.store")


ClockMode = Literal["live", "replay", "auto"]


@dataclass(frozen=True, slots=True)
class Offer:
    """One offer's price in effect at a time (a snapshot row).

    ``accelerator``/``gpu_count`` are None when the instance type is not in the catalog.
    ``usd_per_gpu_hour`` is None when the GPU count is unknown.
    """

    key: OfferKey
    usd_per_hour: float
    valid_from: datetime
    source: str
    last_confirmed_at: datetime | None
    stale: bool
    accelerator: str | None
    gpu_count: float | None

    @property
    def usd_per_gpu_hour(self) -> float | None:
        if not self.gpu_count:
            return None
        return self.usd_per_hour / self.gpu_count


@dataclass(frozen=True, slots=True)
class HistoryPoint:
    """A stored change point: ``usd_per_hour`` from ``valid_from`` until the key's next point."""

    key: OfferKey
    valid_from: datetime
    usd_per_hour: float
    source: str


@dataclass(frozen=True, slots=True)
class SourceStatus:
    """Health of one price source (a live collector, or ``import:<kind>`` for imported files). ``stale``
    when its last success is older than the store's limit (an ``import:`` row never is: imports are not
    scheduled). Rejections: ``last_bad_records`` records of
    the last run refused (``total_bad_records`` ever), ``last_refused_pages`` pages or files refused whole
    (``total_refused_pages`` ever), ``last_rejection`` the newest reason (source, where, why)."""

    name: str
    last_attempt_at: datetime | None
    last_success_at: datetime | None
    last_error: str | None
    last_error_at: datetime | None
    consecutive_failures: int
    last_points: int
    last_bad_records: int
    last_skipped: int
    last_partial: bool
    total_points: int
    stale: bool
    total_bad_records: int = 0
    last_refused_pages: int = 0
    total_refused_pages: int = 0
    last_rejection: str | None = None
    last_rejection_at: datetime | None = None


@dataclass(frozen=True, slots=True)
class Now:
    """The time plans are made at, and why. ``mode`` is "live" (wall clock) or "replay" (the
    data's own time: the newest confirmation in the store)."""

    at: datetime
    mode: Literal["live", "replay"]


def _utcnow() -> datetime:
    return datetime.now(UTC)


def points_frame(points: Iterable[PricePoint]) -> pd.DataFrame:
    """Turn price points into the frame :meth:`PriceStore.write` takes."""
    rows = [
        (
            p.key.cloud.value,
            p.key.region,
            p.key.zone,
            p.key.instance_type,
            p.key.market.value,
            p.valid_from,
            p.usd_per_hour,
            p.source,
            p.observed_at,
        )
        for p in points
    ]
    frame = pd.DataFrame(
        rows,
        columns=[*KEY_COLUMNS, "valid_from", "usd_per_hour", "source", "observed_at"],
    )
    return frame


class SnapshotFilters(TypedDict, total=False):
    """The filters of :meth:`PriceStore.snapshot` and :meth:`PriceStore.snapshot_frame`; an absent one (or
    None) means "any"."""

    cloud: Cloud | Sequence[Cloud] | None
    region: str | None
    zone: str | None
    accelerator: str | None
    market: Market | None
    instance_type: str | None
    include_stale: bool
    """Keep offers not confirmed within ``stale_after`` of the snapshot's time (default False)."""
    limit: int | None
    """At most this many offers, the cheapest (None: all)."""


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_RAW_TIME_COLUMNS = {"valid_from": "vf", "last_confirmed_at": "confirmed"}
"""The two time columns of :data:`SNAPSHOT_COLUMNS` under their names in the mirror's raw snapshot (int64 ns)."""
_OFFER_FIELDS = tuple(_RAW_TIME_COLUMNS.get(c, c) for c in SNAPSHOT_COLUMNS if c != "offer_id")
"""The snapshot columns :meth:`PriceStore.snapshot` turns into :class:`Offer` objects."""


def _ns_to_datetime(ns: int) -> datetime:
    """int64 ns since the epoch -> a tz-aware UTC datetime, truncated to the microsecond (as pandas'
    ``Timestamp.to_pydatetime`` gives it)."""
    return _EPOCH + timedelta(microseconds=ns // 1000)


def _utc_series(ns: np.ndarray) -> pd.Series:
    """int64 ns (int64 min = missing) -> a datetime64[ns, UTC] series."""
    series: pd.Series = pd.Series(np.asarray(ns, dtype=np.int64).view("datetime64[ns]"), copy=False)
    localized: pd.Series = series.dt.tz_localize("UTC")
    return localized


class PriceStore:
    """Change-point price store over one SQLAlchemy engine (schema migrated by costopt.db.engine)."""

    def __init__(
        self,
        engine: Engine,
        *,
        stale_after: timedelta = timedelta(days=7),
        mirror_max_points: int = 5_000_000,
        screen_rules: ScreenRules | None = None,
    ) -> None:
        """``mirror_max_points``: mirror offers and up to that many change points in this process
        for fast snapshots (0 disables the mirror; every snapshot then goes to SQL). ``screen_rules``:
        the sanity bounds collectors and imports apply before writing (:mod:`pricing.screen`)."""
        self.engine = engine
        self.stale_after = stale_after
        self.screen_rules = screen_rules or ScreenRules()
        self.mirror = PriceMirror(engine, max_points=mirror_max_points) if mirror_max_points > 0 else None
        self.dialect = engine.dialect.name
        if self.dialect not in ("sqlite", "postgresql"):
            raise StoreError(f"unsupported database {self.dialect!r}: use SQLite or PostgreSQL")

    # ------------------------------------------------------------------ time helpers
    def _ts(self, dt: datetime) -> Any:
        """A bind value for a raw-SQL timestamp parameter on this backend."""
        if dt.tzinfo is None:
            raise ValueError(f"naive datetime {dt!r}: pass a tz-aware UTC time")
        dt = dt.astimezone(UTC)
        if self.dialect == "sqlite":
            return to_epoch_us(dt)
        return dt

    @staticmethod
    def _parse_ts_col(values: pd.Series) -> pd.Series:
        if isinstance(values.dtype, pd.DatetimeTZDtype):
            converted: pd.Series = values.dt.tz_convert("UTC")
            return converted
        parsed: pd.Series = pd.to_datetime(values, utc=True, format="ISO8601")
        return parsed

    # ------------------------------------------------------------------ writing
    def write(self, points: Iterable[PricePoint] | pd.DataFrame) -> WriteResult:
        """Upsert change points (idempotent); refresh confirmations. One transaction: all or nothing.

        A frame needs columns ``cloud, region, zone, instance_type, market, valid_from (tz-aware),
        usd_per_hour, source`` and optionally ``observed_at`` (tz-aware or NaT: the record's time).
        Raises :class:`BadRecord` when a row is invalid (nothing is written then).
        """
        frame = points if isinstance(points, pd.DataFrame) else points_frame(points)
        if len(frame) == 0:
            return WriteResult(0, 0, 0, 0, 0)
        batch = prepare(frame)
        with self.engine.begin() as conn:
            if self.dialect == "postgresql":
                conn.exec_driver_sql(f"SELECT pg_advisory_xact_lock({PG_WRITE_LOCK})")
                conn.exec_driver_sql("SET LOCAL TIME ZONE 'UTC'")
            # First statement: a write. On SQLite it takes the database's write lock before the
            # stored context is read, so concurrent writers serialize (as the advisory lock does on
            # PostgreSQL) and never decide on prices another writer is changing.
            conn.exec_driver_sql(BUMP_VERSION_SQL)
            return Ingestor(conn, self.dialect).write(batch)

    # ------------------------------------------------------------------ catalog
    def upsert_instance_types(self, types: Iterable[InstanceType], *, now: datetime | None = None) -> int:
        """Insert or update instance types (an API's answer overrides the curated seed). Returns count."""
        now = now or _utcnow()
        rows = {
            (t.cloud.value, t.name): {
                "cloud": t.cloud.value,
                "name": t.name,
                "accelerator": t.accelerator,
                "gpu_count": float(t.gpu_count),
                "vcpus": t.vcpus,
                "memory_gib": t.memory_gib,
                "source": t.source,
                "updated_at": now,
            }
            for t in types
        }
        if not rows:
            return 0
        values = list(rows.values())
        ins = CONFLICT_INSERTS[self.dialect](t_instance_types)  # SQLite or PostgreSQL (checked at __init__)
        updated = ("accelerator", "gpu_count", "vcpus", "memory_gib", "source", "updated_at")
        stmt = ins.on_conflict_do_update(index_elements=["cloud", "name"], set_={c: ins.excluded[c] for c in updated})
        with self.engine.begin() as conn:
            conn.execute(stmt, values)
            conn.exec_driver_sql(BUMP_VERSION_SQL)
        return len(values)

    def instance_types(self, cloud: Cloud | None = None) -> list[InstanceType]:
        """Every known instance type (optionally of one cloud), sorted by cloud and name."""
        stmt = select(t_instance_types).order_by(t_instance_types.c.cloud, t_instance_types.c.name)
        if cloud is not None:
            stmt = stmt.where(t_instance_types.c.cloud == cloud.value)
        with self.engine.connect() as conn:
            return [
                InstanceType(Cloud(r.cloud), r.name, r.accelerator, r.gpu_count, r.vcpus, r.memory_gib, r.source)
                for r in conn.execute(stmt)
            ]

    # ------------------------------------------------------------------ reading
    def resolve_now(self, clock: ClockMode = "live", *, wall: datetime | None = None) -> Now:
        """What "now" is for plans. ``live``: the wall clock. ``replay``: the data's own time, the
        newest confirmation by a market observation (curated reference prices, see
        :data:`REFERENCE_SOURCES`, do not move it; the wall clock when the store is empty).
        ``auto``: live when some observed offer is fresh at the wall clock, else replay."""
        wall = wall or _utcnow()
        if clock == "live":
            return Now(wall, "live")
        observed = select(func.max(t_offers.c.last_confirmed_at)).where(
            t_offers.c.last_source.not_in(list(REFERENCE_SOURCES))
        )
        with self.engine.connect() as conn:
            newest = conn.execute(observed).scalar_one_or_none()
            if newest is None:
                newest = conn.execute(select(func.max(t_offers.c.last_confirmed_at))).scalar_one_or_none()
        if newest is None:
            return Now(wall, "live")
        if clock == "auto" and newest >= wall - self.stale_after:
            return Now(wall, "live")
        return Now(min(newest, wall), "replay")

    def last_change(
        self,
        cloud: Cloud,
        *,
        region: str | None = None,
        market: Market | None = None,
        instance_types: Sequence[str] | None = None,
    ) -> datetime | None:
        """The newest ``valid_from`` stored for the matching offers (None: nothing stored)."""
        stmt = select(func.max(t_offers.c.current_valid_from)).where(t_offers.c.cloud == cloud.value)
        if region is not None:
            stmt = stmt.where(t_offers.c.region == region)
        if market is not None:
            stmt = stmt.where(t_offers.c.market == market.value)
        if instance_types is not None:
            stmt = stmt.where(t_offers.c.instance_type.in_(list(instance_types)))
        with self.engine.connect() as conn:
            value = conn.execute(stmt).scalar_one_or_none()
        return None if value is None else utc(value)

    def price_at(self, key: OfferKey, at: datetime) -> Offer | None:
        """The price of ``key`` in effect at ``at`` (None: no point at or before ``at``)."""
        rows = self.snapshot(
            at,
            cloud=key.cloud,
            region=key.region,
            market=key.market,
            include_stale=True,
            instance_type=key.instance_type,
            zone=key.zone,
        )
        return rows[0] if rows else None

    def snapshot(self, at: datetime | None = None, **filters: Unpack[SnapshotFilters]) -> list[Offer]:
        """Every offer's price in effect at ``at``, cheapest first (USD/h, then key).

        ``at`` None means the latest point of each offer, with staleness judged at the wall clock.
        ``filters``: :class:`SnapshotFilters` (an absent filter means "any"; stale offers, not confirmed
        within ``stale_after`` of ``at``, are left out unless ``include_stale``).
        """
        raw, sel = self._select(at, filters)
        out: list[Offer] = []
        cols = {c: raw[c][sel].tolist() for c in _OFFER_FIELDS}  # plain Python values, no DataFrame
        for i in range(len(sel)):
            confirmed = cols["confirmed"][i]
            acc = cols["accelerator"][i]
            gpus = cols["gpu_count"][i]
            out.append(
                Offer(
                    key=OfferKey(
                        Cloud(cols["cloud"][i]),
                        cols["region"][i],
                        cols["zone"][i],
                        cols["instance_type"][i],
                        Market(cols["market"][i]),
                    ),
                    usd_per_hour=float(cols["usd_per_hour"][i]),
                    valid_from=_ns_to_datetime(cols["vf"][i]),
                    source=cols["source"][i],
                    last_confirmed_at=None if confirmed == _NAT else _ns_to_datetime(confirmed),
                    stale=bool(cols["stale"][i]),
                    accelerator=None if acc is None or pd.isna(acc) else str(acc),
                    gpu_count=None if gpus is None or pd.isna(gpus) else float(gpus),
                )
            )
        return out

    def snapshot_frame(
        self, at: datetime | None = None, *, use_mirror: bool = True, **filters: Unpack[SnapshotFilters]
    ) -> pd.DataFrame:
        """:meth:`snapshot` as a DataFrame with columns :data:`SNAPSHOT_COLUMNS` (times as
        ``datetime64[ns, UTC]``). ``use_mirror=False`` forces the SQL path (the reference)."""
        raw, sel = self._select(at, filters, use_mirror=use_mirror)
        cols: dict[str, Any] = {c: raw[c][sel] for c in SNAPSHOT_COLUMNS if c in raw}
        for column, raw_column in _RAW_TIME_COLUMNS.items():
            cols[column] = _utc_series(raw[raw_column][sel])
        return pd.DataFrame({c: cols[c] for c in SNAPSHOT_COLUMNS})

    def _select(
        self, at: datetime | None, filters: SnapshotFilters, *, use_mirror: bool = True
    ) -> tuple[dict[str, np.ndarray], np.ndarray]:
        """The snapshot's columns (unfiltered, as :meth:`PriceMirror.snapshot` gives them) and the indices
        of the rows that pass the filters, cheapest first (USD/h, then key), at most ``limit``."""
        judge_at = at if at is not None else _utcnow()
        stale_ns = self.stale_after // timedelta(microseconds=1) * 1000
        raw = self.mirror.snapshot(at, judge_at, stale_ns) if (use_mirror and self.mirror is not None) else None
        if raw is None:
            raw = self._snapshot_sql(at, judge_at, stale_ns)
        mask = np.ones(len(raw["offer_id"]), dtype=bool)
        cloud, market, limit = filters.get("cloud"), filters.get("market"), filters.get("limit")
        if cloud is not None:
            clouds = [cloud.value] if isinstance(cloud, Cloud) else [c.value for c in cloud]
            mask &= np.isin(raw["cloud"], clouds)
        for col in ("region", "zone", "instance_type", "accelerator"):
            val = filters.get(col)
            if val is not None:
                mask &= raw[col] == val
        if market is not None:
            mask &= raw["market"] == market.value
        if not filters.get("include_stale", False):
            mask &= ~raw["stale"]
        sel = np.flatnonzero(mask)
        sel = sel[np.lexsort((raw["key_rank"][sel], raw["usd_per_hour"][sel]))]
        if limit is not None:
            sel = sel[:limit]
        return raw, sel

    def _snapshot_sql(self, at: datetime | None, judge_at: datetime, stale_ns: int) -> dict[str, np.ndarray]:
        """The reference snapshot, computed by SQL (one index probe per offer)."""
        params: dict[str, Any] = {}
        if at is None:
            sql = (
                "SELECT o.id, o.cloud, o.region, o.zone, o.instance_type, o.market,"
                " o.current_usd_per_hour, o.current_valid_from, o.current_source, o.last_confirmed_at,"
                " it.accelerator, it.gpu_count"
                " FROM offers o LEFT JOIN instance_types it ON it.cloud = o.cloud AND it.name = o.instance_type"
                " WHERE o.current_valid_from IS NOT NULL"
            )
        elif self.dialect == "postgresql":
            # LATERAL: one backward probe of the (offer_id, valid_from) key per offer, whatever the
            # table's size. The correlated max() below made PostgreSQL hash-join a sequential scan of
            # every point (O(points) per snapshot: see docs/benchmarks.md "Scale").
            params["at"] = self._ts(at)
            sql = (
                "SELECT o.id, o.cloud, o.region, o.zone, o.instance_type, o.market,"
                " p.usd_per_hour, p.valid_from, p.source, o.last_confirmed_at, it.accelerator, it.gpu_count"
                " FROM offers o"
                " CROSS JOIN LATERAL (SELECT p2.usd_per_hour, p2.valid_from, p2.source FROM price_points p2"
                "   WHERE p2.offer_id = o.id AND p2.valid_from <= :at"
                "   ORDER BY p2.valid_from DESC LIMIT 1) p"
                " LEFT JOIN instance_types it ON it.cloud = o.cloud AND it.name = o.instance_type"
            )
        else:
            params["at"] = self._ts(at)
            sql = (
                "SELECT o.id, o.cloud, o.region, o.zone, o.instance_type, o.market,"
                " p.usd_per_hour, p.valid_from, p.source, o.last_confirmed_at, it.accelerator, it.gpu_count"
                " FROM offers o"
                " JOIN price_points p ON p.offer_id = o.id AND p.valid_from = ("
                "   SELECT max(p2.valid_from) FROM price_points p2"
                "   WHERE p2.offer_id = o.id AND p2.valid_from <= :at)"
                " LEFT JOIN instance_types it ON it.cloud = o.cloud AND it.name = o.instance_type"
            )
        with self.engine.connect() as conn:
            rows = conn.execute(text(sql), params).fetchall()
        cols: list[tuple[Any, ...]] = list(zip(*rows, strict=True)) if rows else [() for _ in range(12)]
        meta = pd.DataFrame(
            {
                "offer_id": np.asarray(cols[0], dtype=np.int64),
                "cloud": np.asarray(cols[1], dtype=object),
                "region": np.asarray(cols[2], dtype=object),
                "zone": np.asarray(cols[3], dtype=object),
                "instance_type": np.asarray(cols[4], dtype=object),
                "market": np.asarray(cols[5], dtype=object),
                "confirmed": np.array([_NAT if v is None else db_value_to_ns(v) for v in cols[9]], dtype=np.int64),
                "accelerator": np.asarray(cols[10], dtype=object),
                "gpu_count": np.asarray([np.nan if v is None else v for v in cols[11]], dtype=np.float64),
            }
        )
        meta = with_key_rank(meta)
        return snapshot_columns_from(
            meta,
            np.asarray(cols[6], dtype=np.float64),
            np.array([db_value_to_ns(v) for v in cols[7]], dtype=np.int64),
            np.asarray(cols[8], dtype=object),
            judge_at,
            stale_ns,
        )

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
        include_prior: bool = True,
    ) -> pd.DataFrame:
        """Change points of the matching offers in ``[start, end]`` as a frame, ordered by key and
        time (columns: cloud, region, zone, instance_type, market, valid_from, usd_per_hour, source).

        With ``include_prior`` each offer's point in effect at ``start`` is included too, so the
        frame fully describes the step function over the range.
        """
        conds = []
        if cloud is not None:
            conds.append(t_offers.c.cloud == cloud.value)
        if region is not None:
            conds.append(t_offers.c.region == region)
        if zone is not None:
            conds.append(t_offers.c.zone == zone)
        if instance_type is not None:
            conds.append(t_offers.c.instance_type == instance_type)
        if market is not None:
            conds.append(t_offers.c.market == market.value)
        cols = [
            *[t_offers.c[c] for c in KEY_COLUMNS],
            t_points.c.valid_from,
            t_points.c.usd_per_hour,
            t_points.c.source,
        ]
        joined = t_points.join(t_offers, t_offers.c.id == t_points.c.offer_id)
        lower = t_points.c.valid_from >= start
        if include_prior:
            # The range starts at the point in effect at ``start`` (found by one backward probe per
            # offer, correlated on the offer so it bounds the index scan): the earlier form
            # ``valid_from >= start OR valid_from = (prior)`` read, and probed for, every point of the
            # offer before ``start`` (see docs/benchmarks.md "Scale").
            p2 = t_points.alias("p2")
            prior = (
                select(func.max(p2.c.valid_from))
                .where(p2.c.offer_id == t_offers.c.id, p2.c.valid_from <= start)
                .scalar_subquery()
            )
            lower = t_points.c.valid_from >= func.coalesce(prior, literal(start, t_points.c.valid_from.type))
        stmt = (
            select(*cols)
            .select_from(joined)
            .where(lower, t_points.c.valid_from <= end, *conds)
            .order_by(*[t_offers.c[c] for c in KEY_COLUMNS], t_points.c.valid_from)
        )
        with self.engine.connect() as conn:
            rows = conn.execute(stmt).fetchall()
        frame = pd.DataFrame(rows, columns=[*KEY_COLUMNS, "valid_from", "usd_per_hour", "source"])
        if not frame.empty:
            frame["valid_from"] = self._parse_ts_col(frame["valid_from"])
        return frame

    def history_points(
        self,
        start: datetime,
        end: datetime,
        *,
        cloud: Cloud | None = None,
        region: str | None = None,
        zone: str | None = None,
        instance_type: str | None = None,
        market: Market | None = None,
        include_prior: bool = True,
    ) -> list[HistoryPoint]:
        """:meth:`history` as typed records."""
        frame = self.history(
            start,
            end,
            cloud=cloud,
            region=region,
            zone=zone,
            instance_type=instance_type,
            market=market,
            include_prior=include_prior,
        )
        cols = {c: frame[c].tolist() for c in frame.columns}
        return [
            HistoryPoint(
                OfferKey(
                    Cloud(cols["cloud"][i]),
                    cols["region"][i],
                    cols["zone"][i],
                    cols["instance_type"][i],
                    Market(cols["market"][i]),
                ),
                cols["valid_from"][i].to_pydatetime(),
                float(cols["usd_per_hour"][i]),
                str(cols["source"][i]),
            )
            for i in range(len(frame))
        ]

    def count_points(self) -> int:
        with self.engine.connect() as conn:
            return int(conn.execute(select(func.count()).select_from(t_points)).scalar_one())

    def count_offers(self) -> int:
        with self.engine.connect() as conn:
            return int(conn.execute(select(func.count()).select_from(t_offers)).scalar_one())

    # ------------------------------------------------------------------ source health
    def record_fetch(
        self,
        name: str,
        *,
        ok: bool,
        at: datetime | None = None,
        points: int = 0,
        bad_records: int = 0,
        skipped: int = 0,
        partial: bool = False,
        error: str | None = None,
        refused_pages: int = 0,
        rejection: str | None = None,
    ) -> None:
        """Record one collection attempt of a source (success, partial success, or failure).

        ``bad_records`` (records refused) and ``refused_pages`` (pages refused whole) add to the source's
        totals; ``rejection`` is the first reason of this attempt's rejections (None: keep the last one)."""
        at = at or _utcnow()
        with self.engine.begin() as conn:
            row = conn.execute(select(t_status).where(t_status.c.name == name)).first()
            values: dict[str, Any] = {
                "last_attempt_at": at,
                "last_bad_records": bad_records,
                "last_refused_pages": refused_pages,
                "total_refused_pages": (row.total_refused_pages if row else 0) + refused_pages,
                "total_bad_records": (row.total_bad_records if row else 0) + bad_records,
            }
            if rejection:
                values.update(last_rejection=rejection, last_rejection_at=at)
            if ok:
                values.update(
                    last_success_at=at,
                    consecutive_failures=0,
                    last_points=points,
                    last_skipped=skipped,
                    last_partial=partial,
                    total_points=(row.total_points if row else 0) + points,
                )
                if error:
                    values.update(last_error=error, last_error_at=at)
            else:
                values.update(
                    last_error=error or "unknown error",
                    last_error_at=at,
                    consecutive_failures=(row.consecutive_failures if row else 0) + 1,
                )
            if row is None:
                conn.execute(t_status.insert().values(name=name, **values))
            else:
                conn.execute(t_status.update().where(t_status.c.name == name).values(**values))

    def sources(self, *, now: datetime | None = None) -> list[SourceStatus]:
        """Health of every source that ever ran, by name."""
        now = now or _utcnow()
        with self.engine.connect() as conn:
            rows = conn.execute(select(t_status).order_by(t_status.c.name)).fetchall()
        return [
            SourceStatus(
                name=r.name,
                last_attempt_at=r.last_attempt_at,
                last_success_at=r.last_success_at,
                last_error=r.last_error,
                last_error_at=r.last_error_at,
                consecutive_failures=r.consecutive_failures,
                last_points=r.last_points,
                last_bad_records=r.last_bad_records,
                last_skipped=r.last_skipped,
                last_partial=bool(r.last_partial),
                total_points=r.total_points,
                stale=not r.name.startswith(IMPORT_SOURCE_PREFIX)
                and (r.last_success_at is None or r.last_success_at < now - self.stale_after),
                total_bad_records=r.total_bad_records,
                last_refused_pages=r.last_refused_pages,
                total_refused_pages=r.total_refused_pages,
                last_rejection=r.last_rejection,
                last_rejection_at=r.last_rejection_at,
            )
            for r in rows
        ]
