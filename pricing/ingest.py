"""Set-based ingestion of price points: validation, offer resolution, change-point detection, bulk load.

Every observation is kept: change points (the first of an offer, or another price than the observation
before it) in ``price_points``, which queries read, the rest in ``price_repeats``. A write merges the
batch with the stored observations it reaches back to and moves stored rows between the two tables
when what precedes them changed, so the change points are always those of all observations.

The whole batch is processed column-wise with numpy/pandas (no Python loop per point). On
PostgreSQL new points go in by binary COPY through a background writer thread, chunk after chunk,
so detecting change points in one chunk overlaps loading the previous one; on SQLite by one
``executemany`` per chunk. Everything happens in the caller's transaction: all or nothing.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
import pandas as pd
from sqlalchemy import select
from sqlalchemy.engine import Connection

from costopt.db.schema import offers as t_offers
from costopt.db.schema import price_points as t_points
from costopt.db.schema import price_repeats as t_repeats
from costopt.domain import MAX_SANE_USD_PER_HOUR, Cloud, Market
from costopt.errors import BadRecord, StoreError
from pricing.pgcopy import encode_binary_copy
from pricing.screen import price_faults

log = logging.getLogger("costopt.store")

KEY_COLUMNS = ("cloud", "region", "zone", "instance_type", "market")
PG_WRITE_LOCK = 0x636F7374  # advisory lock id serializing writers on PostgreSQL ("cost")
CHUNK_ROWS = 100_000
_SQLITE_MAX_VARS = 30_000
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_CLOUDS = frozenset(c.value for c in Cloud)
_MARKETS = frozenset(m.value for m in Market)
CHANGE, REPEAT, INCOMING = 0, 1, 2
"""Where a row of a write's merge comes from: price_points, price_repeats, or the batch."""


@dataclass(frozen=True, slots=True)
class WriteResult:
    """What one write did. ``inserted`` counts incoming points stored as new change points;
    ``unchanged`` counts incoming points that repeated the price in effect (they only confirmed it,
    and are kept as repeats); ``corrected`` counts stored observations whose price a newer write
    replaced. A late older point can turn stored observations around it: ``restored`` counts
    repeats that became change points again (another price now precedes them), ``superseded``
    change points that became repeats (their price now starts earlier). No observation is ever
    deleted by a write."""

    received: int
    inserted: int
    unchanged: int
    corrected: int
    offers_created: int
    restored: int = 0
    superseded: int = 0


def dt_to_ns(dt: datetime) -> int:
    return (dt - _EPOCH) // timedelta(microseconds=1) * 1000


def ns_to_dt(ns: int) -> datetime:
    return _EPOCH + timedelta(microseconds=int(ns) // 1000)


def sqlite_us(ns: np.ndarray) -> np.ndarray:
    """int64 ns since the epoch -> int64 µs (how SQLite holds instants, see costopt.db.types)."""
    return np.asarray(ns, dtype=np.int64) // 1000


def to_utc_ns(col: pd.Series, name: str = "valid_from") -> np.ndarray:
    """A column of tz-aware datetimes (any UTC offsets, mixed allowed) -> int64 ns since the epoch,
    truncated to microseconds (what the store keeps). Naive or missing times raise BadRecord."""
    if col.isna().any():
        raise BadRecord(f"missing {name} at row {int(np.flatnonzero(col.isna().to_numpy())[0])}")
    if not isinstance(col.dtype, pd.DatetimeTZDtype):
        if col.dtype == object:
            naive = col.map(lambda v: getattr(v, "tzinfo", None) is None and not isinstance(v, str)).to_numpy()
            if naive.any():
                raise BadRecord(f"naive {name} at row {int(np.flatnonzero(naive)[0])}: pass tz-aware UTC times")
        try:
            col = pd.to_datetime(col, utc=col.dtype == object)
        except (TypeError, ValueError) as exc:
            raise BadRecord(f"{name} must be tz-aware UTC datetimes: {exc}") from exc
        if not isinstance(col.dtype, pd.DatetimeTZDtype):
            raise BadRecord(f"naive {name} given to the price store: pass tz-aware UTC times")
    ns = np.asarray(col.dt.tz_convert("UTC").dt.as_unit("ns").to_numpy(dtype="datetime64[ns]").view("int64"))
    # The store keeps microseconds (both backends): truncate here, so keys compare as stored.
    truncated: np.ndarray = ns - np.mod(ns, 1000)
    return truncated


def micros_sql(column: str, dialect: str) -> str:
    """SQL giving a timestamp column as integer microseconds since the epoch (SQLite stores them so)."""
    if dialect == "postgresql":
        return f"(extract(epoch FROM {column}) * 1000000)::int8"
    return column


@dataclass
class _Batch:
    keys: list[tuple[str, str, str, str, str]]  # distinct offer keys
    key_code: np.ndarray  # per row: index into keys
    vf: np.ndarray  # int64 ns
    obs: np.ndarray  # int64 ns (confirmation time; >= vf)
    price: np.ndarray  # float64 USD/h
    source: np.ndarray  # object (str)


def prepare(frame: pd.DataFrame) -> _Batch:
    """Validate a points frame and factorize its keys. Raises BadRecord naming the first bad row."""
    missing = [c for c in (*KEY_COLUMNS, "valid_from", "usd_per_hour", "source") if c not in frame]
    if missing:
        raise BadRecord(f"price frame lacks columns {missing}")
    frame = frame.reset_index(drop=True)
    price = pd.to_numeric(frame["usd_per_hour"], errors="coerce").to_numpy(dtype="float64")
    bad = price_faults(price) != ""
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise BadRecord(
            f"{int(bad.sum())} invalid price(s), first at row {i}: {frame['usd_per_hour'].iloc[i]!r} "
            f"(prices must be finite, above 0 and at most {MAX_SANE_USD_PER_HOUR:g} USD/h)"
        )
    codes: list[np.ndarray] = []
    uniques: list[list[str]] = []
    for c in KEY_COLUMNS:
        col = frame[c]
        if c == "zone":
            col = col.fillna("")
        cc, uu = pd.factorize(col.to_numpy(dtype=object))
        if (cc < 0).any():
            raise BadRecord(f"missing {c} at row {int(np.flatnonzero(cc < 0)[0])}")
        values = [str(u) for u in uu]
        if c != "zone" and any(v in ("", "nan", "None") for v in values):
            raise BadRecord(f"empty {c} in price frame")
        if c == "cloud" and not set(values) <= _CLOUDS:
            raise BadRecord(f"unknown cloud(s) {sorted(set(values) - _CLOUDS)}")
        if c == "market" and not set(values) <= _MARKETS:
            raise BadRecord(f"unknown market(s) {sorted(set(values) - _MARKETS)}")
        codes.append(cc.astype(np.int64))
        uniques.append(values)
    dims = tuple(max(len(u), 1) for u in uniques)
    combined = np.ravel_multi_index(tuple(codes), dims)
    key_code, uniq_combined = pd.factorize(combined)
    parts = np.unravel_index(np.asarray(uniq_combined, dtype=np.int64), dims)
    keys: list[tuple[str, str, str, str, str]] = [
        (uniques[0][a], uniques[1][b], uniques[2][c_], uniques[3][d], uniques[4][e])
        for a, b, c_, d, e in zip(*(p.tolist() for p in parts), strict=True)
    ]
    vf = to_utc_ns(frame["valid_from"])
    if "observed_at" in frame and frame["observed_at"].notna().any():
        obs_col = frame["observed_at"]
        present = obs_col.notna().to_numpy()
        obs = vf.copy()
        obs[present] = to_utc_ns(obs_col[present], "observed_at")
        obs = np.maximum(obs, vf)
    else:
        obs = vf
    source = frame["source"].to_numpy(dtype=object)
    bad_source = frame["source"].isna().to_numpy() | (frame["source"].astype(str).str.strip() == "").to_numpy()
    if bad_source.any():
        raise BadRecord(f"missing source at row {int(np.flatnonzero(bad_source)[0])}")
    return _Batch(keys, np.asarray(key_code, dtype=np.int64), vf, obs, price, source)


class Ingestor:
    """Writes one prepared batch inside an open transaction (see module docstring)."""

    def __init__(self, conn: Connection, dialect: str) -> None:
        self.conn = conn
        self.dialect = dialect

    # -------------------------------------------------------------- offers
    def ensure_offers(self, keys: list[tuple[str, str, str, str, str]]) -> tuple[np.ndarray, np.ndarray, int]:
        """Offer id and newest stored observation time (ns, -1 if none) per key, creating missing offers."""
        known = self._lookup(keys)
        missing = [k for k in keys if k not in known]
        if missing:
            if self.dialect == "postgresql":
                cols = list(zip(*missing, strict=True))
                self.conn.exec_driver_sql(
                    "INSERT INTO offers (cloud, region, zone, instance_type, market) "
                    "SELECT * FROM unnest(%s::text[], %s::text[], %s::text[], %s::text[], %s::text[]) "
                    "ON CONFLICT DO NOTHING",
                    tuple(list(c) for c in cols),
                )
            else:
                self.conn.exec_driver_sql(
                    "INSERT OR IGNORE INTO offers (cloud, region, zone, instance_type, market) VALUES (?, ?, ?, ?, ?)",
                    missing,
                )
            known.update(self._lookup(missing))
        ids = np.array([known[k][0] for k in keys], dtype=np.int64)
        newest = np.array([known[k][1] for k in keys], dtype=np.int64)
        return ids, newest, len(missing)

    def _lookup(self, keys: list[tuple[str, str, str, str, str]]) -> dict[tuple[str, ...], tuple[int, int]]:
        if not keys:
            return {}
        clouds = sorted({k[0] for k in keys})
        regions = sorted({k[1] for k in keys})
        # newest_valid_from is set with current_valid_from by every write (and by migration 0007 for
        # stores written before it): NULL only for an offer with no point yet.
        stmt = select(t_offers.c.id, *[t_offers.c[c] for c in KEY_COLUMNS], t_offers.c.newest_valid_from)
        stmt = stmt.where(t_offers.c.cloud.in_(clouds))
        if len(regions) < 500:
            stmt = stmt.where(t_offers.c.region.in_(regions))
        wanted = set(keys)
        out: dict[tuple[str, ...], tuple[int, int]] = {}
        for row in self.conn.execute(stmt):
            key = tuple(row[1:6])
            if key in wanted:
                out[key] = (row[0], dt_to_ns(row[6]) if row[6] is not None else -1)
        return out

    # -------------------------------------------------------------- stored context
    def stored_context(self, offer_ids: np.ndarray, min_vf: np.ndarray, newest: np.ndarray) -> pd.DataFrame:
        """Stored observations needed to place a batch (columns offer_id, vf, price, source, kind).

        For offers the batch only appends to (every point after the newest stored observation):
        their current point. For offers whose batch reaches back into stored observations: the
        change point in effect before the batch's start, then every change point and repeat from
        there on (``kind`` :data:`CHANGE` or :data:`REPEAT`)."""
        has = newest >= 0
        append_ids = offer_ids[has & (min_vf > newest)]
        overlap = has & (min_vf <= newest)
        frames = []
        if len(append_ids):
            frames.append(self._read_current(append_ids.tolist()))
        if overlap.any():
            frames.append(self._read_points(offer_ids[overlap].tolist(), int(min_vf[overlap].min())))
        if not frames:
            return _empty_points()
        return pd.concat(frames, ignore_index=True).drop_duplicates(["offer_id", "vf"])

    def _chunks(self, ids: list[int]) -> list[list[int]]:
        step = _SQLITE_MAX_VARS if self.dialect == "sqlite" else 200_000
        return [ids[i : i + step] for i in range(0, len(ids), step)]

    def _ts_sql(self, column: str) -> str:
        return micros_sql(column, self.dialect)

    def _id_filter(self, column: str, chunk: list[int]) -> tuple[str, list[Any]]:
        if self.dialect == "postgresql":
            return f"{column} = ANY(%s)", [chunk]
        return f"{column} IN ({', '.join('?' * len(chunk))})", list(chunk)

    def _raw(self, sql: str, params: list[Any]) -> list[tuple[Any, ...]]:
        return [tuple(r) for r in self.conn.exec_driver_sql(sql, tuple(params)).fetchall()]

    def _read_current(self, ids: list[int]) -> pd.DataFrame:
        rows: list[tuple[Any, ...]] = []
        for chunk in self._chunks(ids):
            cond, params = self._id_filter("id", chunk)
            rows.extend(
                self._raw(
                    f"SELECT id, {self._ts_sql('current_valid_from')}, current_usd_per_hour, current_source"
                    f" FROM offers WHERE {cond} AND current_valid_from IS NOT NULL",
                    params,
                )
            )
        return _rows_frame(rows, CHANGE)

    def _read_points(self, ids: list[int], lo_ns: int) -> pd.DataFrame:
        """Change points of ``ids`` from the one in effect at ``lo_ns`` on (the prior point, then all
        later), and their repeats from ``lo_ns`` on."""
        lo: Any = ns_to_dt(lo_ns) if self.dialect == "postgresql" else lo_ns // 1000
        ph = "%s" if self.dialect == "postgresql" else "?"
        ts = self._ts_sql("p.valid_from")
        changes: list[tuple[Any, ...]] = []
        repeats: list[tuple[Any, ...]] = []
        for chunk in self._chunks(ids):
            cond, params = self._id_filter("offer_id", chunk)
            changes.extend(
                self._raw(
                    f"SELECT p.offer_id, {ts}, p.usd_per_hour, p.source FROM price_points p"
                    f" JOIN (SELECT offer_id AS oid, max(valid_from) AS vf FROM price_points"
                    f"       WHERE {cond} AND valid_from < {ph} GROUP BY offer_id) prior"
                    f" ON p.offer_id = prior.oid AND p.valid_from = prior.vf",
                    [*params, lo],
                )
            )
            p_cond = cond.replace("offer_id", "p.offer_id")
            changes.extend(
                self._raw(
                    f"SELECT p.offer_id, {ts}, p.usd_per_hour, p.source FROM price_points p"
                    f" WHERE {p_cond} AND p.valid_from >= {ph}",
                    [*params, lo],
                )
            )
            repeats.extend(
                self._raw(
                    f"SELECT p.offer_id, {ts}, p.usd_per_hour, p.source FROM price_repeats p"
                    f" WHERE {p_cond} AND p.valid_from >= {ph}",
                    [*params, lo],
                )
            )
        return pd.concat([_rows_frame(changes, CHANGE), _rows_frame(repeats, REPEAT)], ignore_index=True)

    # -------------------------------------------------------------- the write
    def write(self, batch: _Batch) -> WriteResult:
        received = len(batch.vf)
        key_offer, key_newest, created = self.ensure_offers(batch.keys)
        offer_id = key_offer[batch.key_code]
        # Confirmation and last source per offer (over every incoming row, duplicates included).
        order = np.lexsort((batch.vf, offer_id))
        oid = offer_id[order]
        vf = batch.vf[order]
        price = batch.price[order]
        source = batch.source[order]
        obs = batch.obs[order]
        starts = np.flatnonzero(np.r_[True, oid[1:] != oid[:-1]])
        ends = np.r_[starts[1:], len(oid)]
        offers_in_batch = oid[starts]
        conf_obs = np.maximum.reduceat(obs, starts)
        last_source = source[ends - 1]
        # One point per (offer, valid_from): the last one written wins (stable sort keeps input order).
        dup_next = np.r_[(oid[1:] == oid[:-1]) & (vf[1:] == vf[:-1]), False]
        keep = ~dup_next
        oid, vf, price, source = oid[keep], vf[keep], price[keep], source[keep]
        min_vf = vf[np.flatnonzero(np.r_[True, oid[1:] != oid[:-1]])]
        newest = _lookup_for(key_offer, key_newest, offers_in_batch)
        stored = self.stored_context(offers_in_batch, min_vf, newest)
        # Merge stored and incoming rows; at equal (offer, time) the stored row comes first.
        s_oid = stored["offer_id"].to_numpy(dtype=np.int64)
        all_oid = np.concatenate([s_oid, oid])
        all_vf = np.concatenate([stored["vf"].to_numpy(dtype=np.int64), vf])
        all_price = np.concatenate([stored["price"].to_numpy(dtype=np.float64), price])
        all_source = np.concatenate([stored["source"].to_numpy(dtype=object), source])
        kind = np.concatenate([stored["kind"].to_numpy(dtype=np.int8), np.full(len(oid), INCOMING, dtype=np.int8)])
        if len(s_oid):
            order = np.lexsort((kind == INCOMING, all_vf, all_oid))
            all_oid, all_vf, all_price, all_source, kind = (
                all_oid[order],
                all_vf[order],
                all_price[order],
                all_source[order],
                kind[order],
            )
        # An incoming row at a stored key: same price -> nothing to do; another price -> correction
        # (the stored twin takes the incoming price and source).
        collide = np.r_[False, (all_oid[1:] == all_oid[:-1]) & (all_vf[1:] == all_vf[:-1])] & (kind == INCOMING)
        corr_idx = np.flatnonzero(collide & (all_price != np.r_[np.nan, all_price[:-1]]))
        corrected = np.zeros(len(all_oid), dtype=bool)
        if len(corr_idx):
            all_price[corr_idx - 1] = all_price[corr_idx]
            all_source[corr_idx - 1] = all_source[corr_idx]
            corrected[corr_idx - 1] = True
        m = ~collide
        all_oid, all_vf, all_price, all_source, kind, corrected = (
            all_oid[m],
            all_vf[m],
            all_price[m],
            all_source[m],
            kind[m],
            corrected[m],
        )
        # Every observation is kept: a change point (the first of its offer, or another price than
        # the observation before it) goes to price_points, any other to price_repeats. Stored rows
        # move between the two when a late point or a correction changes what precedes them, so a
        # late older point is resolved against every later observation (whatever the write order,
        # the change points are those of all observations, the last write of each key winning).
        first = np.r_[True, all_oid[1:] != all_oid[:-1]]
        change = first | (all_price != np.r_[np.nan, all_price[:-1]])
        target = np.where(change, CHANGE, REPEAT)  # the table each row belongs in after this write
        moved = kind != target  # the incoming rows, and stored rows whose table changes
        for table, code in ((t_points.name, CHANGE), (t_repeats.name, REPEAT)):
            leave, enter = moved & (kind == code), moved & (target == code)
            fix = corrected & ~moved & (kind == code)  # corrected where it is
            self._delete(table, all_oid[leave], all_vf[leave])
            self._insert(table, all_oid[enter], all_vf[enter], all_price[enter], all_source[enter])
            self._update(table, all_oid[fix], all_vf[fix], all_price[fix], all_source[fix])
        restored, superseded = int((moved & (kind == REPEAT)).sum()), int((moved & (kind == CHANGE)).sum())
        if len(corr_idx):
            log.info("price store: %d stored price(s) corrected by a newer write", len(corr_idx))
        if restored or superseded:
            log.info(
                "price store: %d observation(s) became change points again, %d change point(s) became repeats",
                restored,
                superseded,
            )
        # Per offer of the batch after this write: the latest change point (current) and the newest
        # observation. Complete: for appended offers the merge holds the stored current point and the
        # new rows (all after every stored observation), for overlapping offers every stored
        # observation from the batch's start on (writers serialize).
        last_idx = np.r_[np.flatnonzero(all_oid[1:] != all_oid[:-1]), len(all_oid) - 1]
        k_oid, k_vf, k_price, k_src = all_oid[change], all_vf[change], all_price[change], all_source[change]
        last_change = np.r_[np.flatnonzero(k_oid[1:] != k_oid[:-1]), len(k_oid) - 1]
        latest = pd.DataFrame(
            {"vf": k_vf[last_change], "price": k_price[last_change], "src": k_src[last_change]},
            index=k_oid[last_change],
        ).reindex(offers_in_batch)
        newest_after = pd.Series(all_vf[last_idx], index=all_oid[last_idx]).reindex(offers_in_batch)
        self._update_offers(
            offers_in_batch,
            latest["vf"].to_numpy(dtype=np.int64),
            latest["price"].to_numpy(dtype=np.float64),
            latest["src"].to_numpy(dtype=object),
            newest_after.to_numpy(dtype=np.int64),
            conf_obs,
            last_source,
        )
        inserted = int(((kind == INCOMING) & change).sum())
        return WriteResult(
            received=received,
            inserted=inserted,
            unchanged=received - inserted - len(corr_idx),
            corrected=len(corr_idx),
            offers_created=created,
            restored=restored,
            superseded=superseded,
        )

    def _keyed(self, oid: np.ndarray, vf: np.ndarray) -> tuple[list[int], list[Any]]:
        """Offer ids and valid_from bind values (datetime on PostgreSQL, µs on SQLite) of some rows."""
        if self.dialect == "postgresql":
            return oid.tolist(), [ns_to_dt(v) for v in vf.tolist()]
        return oid.tolist(), sqlite_us(vf).tolist()

    def _delete(self, table: str, oid: np.ndarray, vf: np.ndarray) -> None:
        """Delete rows of ``table`` (price_points or price_repeats) by key, in one statement."""
        if not len(oid):
            return
        ids, vfs = self._keyed(oid, vf)
        if self.dialect == "postgresql":
            self.conn.exec_driver_sql(
                f"DELETE FROM {table} t USING unnest(%s::int4[], %s::timestamptz[]) AS d(o, v)"
                " WHERE t.offer_id = d.o AND t.valid_from = d.v",
                (ids, vfs),
            )
        else:
            self.conn.exec_driver_sql(
                f"DELETE FROM {table} WHERE offer_id = ? AND valid_from = ?", list(zip(ids, vfs, strict=True))
            )

    def _update(self, table: str, oid: np.ndarray, vf: np.ndarray, price: np.ndarray, source: np.ndarray) -> None:
        """Set price and source of rows of ``table`` by key (corrections), in one statement."""
        if not len(oid):
            return
        ids, vfs = self._keyed(oid, vf)
        prices, sources = price.tolist(), [str(s) for s in source.tolist()]
        if self.dialect == "postgresql":
            self.conn.exec_driver_sql(
                f"UPDATE {table} t SET usd_per_hour = d.p, source = d.s"
                " FROM unnest(%s::int4[], %s::timestamptz[], %s::float8[], %s::text[]) AS d(o, v, p, s)"
                " WHERE t.offer_id = d.o AND t.valid_from = d.v",
                (ids, vfs, prices, sources),
            )
        else:
            self.conn.exec_driver_sql(
                f"UPDATE {table} SET usd_per_hour = ?, source = ? WHERE offer_id = ? AND valid_from = ?",
                list(zip(prices, sources, ids, vfs, strict=True)),
            )

    def _insert(self, table: str, oid: np.ndarray, vf: np.ndarray, price: np.ndarray, source: np.ndarray) -> None:
        """Bulk-load rows into ``table`` (price_points or price_repeats: the same columns)."""
        if not len(oid):
            return
        if self.dialect == "postgresql":
            raw = self.conn.connection.driver_connection
            if raw is None:
                raise StoreError("no live database connection for COPY")
            from psycopg.copy import QueuedLibpqWriter

            with (
                raw.cursor() as cur,
                cur.copy(
                    f"COPY {table} (offer_id, valid_from, usd_per_hour, source) FROM STDIN (FORMAT binary)",
                    writer=QueuedLibpqWriter(cur),
                ) as copy,
            ):
                for lo in range(0, len(oid), CHUNK_ROWS):
                    hi = lo + CHUNK_ROWS
                    payload = encode_binary_copy(
                        [
                            ("int4", oid[lo:hi]),
                            ("timestamptz", vf[lo:hi]),
                            ("float8", price[lo:hi]),
                            ("text", source[lo:hi]),
                        ],
                        header=lo == 0,
                        trailer=hi >= len(oid),
                    )
                    copy.write(payload)
        else:
            text_ts = sqlite_us(vf)
            for lo in range(0, len(oid), CHUNK_ROWS):
                hi = lo + CHUNK_ROWS
                rows = list(
                    zip(
                        oid[lo:hi].tolist(),
                        text_ts[lo:hi].tolist(),
                        price[lo:hi].tolist(),
                        source[lo:hi].tolist(),
                        strict=True,
                    )
                )
                self.conn.exec_driver_sql(
                    f"INSERT INTO {table} (offer_id, valid_from, usd_per_hour, source) VALUES (?, ?, ?, ?)",
                    rows,
                )

    def _update_offers(
        self,
        ids: np.ndarray,
        vf: np.ndarray,
        price: np.ndarray,
        current_src: np.ndarray,
        newest: np.ndarray,
        obs: np.ndarray,
        src: np.ndarray,
    ) -> None:
        """Set each offer's current point (its latest change point after this write), its newest
        observation, its newest confirmation, and which source confirmed it last (only when this
        batch's confirmation is the newest)."""
        if self.dialect == "postgresql":
            self.conn.exec_driver_sql(
                "CREATE TEMP TABLE IF NOT EXISTS _offer_upd (id integer, vf timestamptz, price double precision,"
                " csrc text, newest timestamptz, obs timestamptz, src text) ON COMMIT DROP"
            )
            raw = self.conn.connection.driver_connection
            if raw is None:
                raise StoreError("no live database connection for COPY")
            payload = encode_binary_copy(
                [
                    ("int4", ids),
                    ("timestamptz", vf),
                    ("float8", price),
                    ("text", current_src),
                    ("timestamptz", newest),
                    ("timestamptz", obs),
                    ("text", src),
                ]
            )
            with raw.cursor() as cur, cur.copy("COPY _offer_upd FROM STDIN (FORMAT binary)") as copy:
                copy.write(payload)
            self.conn.exec_driver_sql(
                "UPDATE offers o SET current_valid_from = u.vf, current_usd_per_hour = u.price,"
                " current_source = u.csrc, newest_valid_from = u.newest,"
                " last_source = CASE WHEN o.last_confirmed_at IS NULL OR u.obs >= o.last_confirmed_at"
                "   THEN u.src ELSE o.last_source END,"
                " last_confirmed_at = GREATEST(COALESCE(o.last_confirmed_at, u.obs), u.obs)"
                " FROM _offer_upd u WHERE o.id = u.id"
            )
            self.conn.exec_driver_sql("DROP TABLE _offer_upd")
        else:
            rows = list(
                zip(
                    sqlite_us(vf).tolist(),
                    price.tolist(),
                    current_src.tolist(),
                    sqlite_us(obs).tolist(),
                    src.tolist(),
                    ids.tolist(),
                    sqlite_us(newest).tolist(),
                    strict=True,
                )
            )
            self.conn.exec_driver_sql(
                "UPDATE offers SET current_valid_from = ?1, current_usd_per_hour = ?2, current_source = ?3,"
                " newest_valid_from = ?7,"
                " last_source = CASE WHEN last_confirmed_at IS NULL OR ?4 >= last_confirmed_at"
                "   THEN ?5 ELSE last_source END,"
                " last_confirmed_at = MAX(COALESCE(last_confirmed_at, ?4), ?4) WHERE id = ?6",
                rows,
            )


def _lookup_for(key_offer: np.ndarray, key_values: np.ndarray, offer_ids: np.ndarray) -> np.ndarray:
    lookup = pd.Series(key_values, index=key_offer)
    lookup = lookup[~lookup.index.duplicated()]
    return lookup.reindex(offer_ids).to_numpy(dtype=np.int64)


def _empty_points() -> pd.DataFrame:
    return _rows_frame([], CHANGE)


def _rows_frame(rows: list[tuple[Any, ...]], kind: int) -> pd.DataFrame:
    """Stored rows (offer id, valid_from in integer µs, price, source) of one ``kind``."""
    oid, vfs, prices, sources = zip(*rows, strict=True) if rows else ((), (), (), ())
    return pd.DataFrame(
        {
            "offer_id": np.asarray(oid, dtype=np.int64),
            "vf": np.asarray(vfs, dtype=np.int64) * 1000,  # rows carry integer microseconds
            "price": np.asarray(prices, dtype=np.float64),
            "source": np.asarray(sources, dtype=object),
            "kind": np.full(len(oid), kind, dtype=np.int8),
        }
    )
