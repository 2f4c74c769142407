"""Price store at scale on PostgreSQL: ingest, snapshots, one offer's month, mirror memory, disk size.

Run: ``.venv/bin/python bench/store_scale.py --points 1000000,10000000 [--keys 15000] [--json]``

For each size a private database (``costopt_scale_<hex>``, created and dropped by this script, never
the shared ``test`` database) is migrated, then the points are written in time order through
``PriceStore.write`` (the store's real bulk path: change-point detection + binary COPY), ``--batch``
points per write, as collectors and imports append. Measured: ingest wall and CPU time (this process
and the database backends), current and as-of snapshot medians on the mirror and on SQL, one offer's
month of history, the mirror's load time and memory, and the tables' size on disk. Figures only;
nothing is asserted (see docs/benchmarks.md "Scale").

Shape (``realistic``, the default): ``--keys`` offers of three clouds (AWS zones, GCP and Azure regions,
spot and on-demand), each with the same number of change points spread over one year, with gaps drawn
log-normally like the real AWS spot history (median gap about 7 h, long tail to days: see
/work/shared/data/prices). ``--shape uniform`` uses bench/store_bench.py's generator instead.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from sqlalchemy import Engine, text

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.store_bench import PG_URL, synthetic_points
from costopt.db.engine import make_engine, migrate
from pricing.store import PriceStore

YEAR_START = datetime(2025, 1, 1, tzinfo=UTC)
YEAR = timedelta(days=365)
GAP_SIGMA = 1.0
"""Log-normal sigma of the gaps between change points (the real AWS p2/p3 history: median 7.1 h,
quartiles 5.7 h and 24 h; sigma 1 gives a quartile ratio of about 3.8)."""

_AWS_REGIONS = [
    "us-east-1",
    "us-east-2",
    "us-west-1",
    "us-west-2",
    "eu-west-1",
    "eu-west-2",
    "eu-central-1",
    "eu-north-1",
    "ap-northeast-1",
    "ap-northeast-2",
    "ap-southeast-1",
    "ap-southeast-2",
    "ap-south-1",
    "ca-central-1",
    "sa-east-1",
    "me-south-1",
]
_GCP_REGIONS = [
    f"{a}-{b}{n}" for a in ("us", "europe", "asia") for b in ("central", "east", "west") for n in (1, 2, 3, 4)
]
_AZURE_REGIONS = [
    f"{a}{b}" for a in ("east", "west", "north", "south", "central") for b in ("us", "europe", "asia", "japan", "uk")
]


@dataclass(frozen=True, slots=True)
class Keys:
    """Offer keys as parallel arrays (one entry per offer)."""

    cloud: np.ndarray
    region: np.ndarray
    zone: np.ndarray
    instance_type: np.ndarray
    market: np.ndarray


def offer_keys(n_keys: int) -> Keys:
    """``n_keys`` distinct offers over three clouds (AWS half, GCP and Azure a quarter each): AWS per
    zone, GCP/Azure per region (zone empty), spot and on-demand alternating."""
    cloud, region, zone, itype, market = [], [], [], [], []
    for i in range(n_keys):
        c = ("aws", "aws", "gcp", "azure")[i % 4]
        j = i // 4 * 2 + i % 4 if c == "aws" else i // 4  # the two AWS slots of each 4 differ
        mkt = ("spot", "on_demand")[j % 2]
        j //= 2
        if c == "aws":
            r = _AWS_REGIONS[j % len(_AWS_REGIONS)]
            j //= len(_AWS_REGIONS)
            z = f"{r}{'abcdef'[j % 6]}"
            j //= 6
            t = f"{('p3', 'p4d', 'p5', 'g5', 'g6', 'g4dn', 'trn1', 'inf2')[j % 8]}.{j // 8}xlarge"
        elif c == "gcp":
            r = _GCP_REGIONS[j % len(_GCP_REGIONS)]
            j //= len(_GCP_REGIONS)
            z = ""
            t = f"{('a2-highgpu', 'a3-highgpu', 'g2-standard', 'n1-standard')[j % 4]}-{j // 4 + 1}g"
        else:
            r = _AZURE_REGIONS[j % len(_AZURE_REGIONS)]
            j //= len(_AZURE_REGIONS)
            z = ""
            t = f"Standard_{('NC', 'ND', 'NV', 'NCads')[j % 4]}{j // 4 + 1}s_v3"
        cloud.append(c)
        region.append(r)
        zone.append(z)
        itype.append(t)
        market.append(mkt)
    return Keys(*(np.asarray(v, dtype=object) for v in (cloud, region, zone, itype, market)))


def realistic_arrays(n_points: int, n_keys: int, seed: int = 0) -> tuple[Keys, np.ndarray, np.ndarray, np.ndarray]:
    """(keys, key index, valid_from ns, price) of ``n_points`` change points over ``n_keys`` offers,
    sorted by time. Every point changes its offer's price; each offer's points fill the year."""
    if n_keys < 1 or n_points < n_keys:
        raise ValueError(f"need 1 <= keys <= points, got {n_keys:,} keys for {n_points:,} points")
    rng = np.random.default_rng(seed)
    per_key = n_points // n_keys
    extra = n_points - per_key * n_keys  # the first `extra` offers get one point more
    counts = np.full(n_keys, per_key, dtype=np.int64)
    counts[:extra] += 1
    key_idx = np.repeat(np.arange(n_keys, dtype=np.int64), counts)
    starts = np.r_[0, np.cumsum(counts)[:-1]]
    gaps = rng.lognormal(0.0, GAP_SIGMA, size=n_points)
    gaps[starts] = rng.uniform(0.0, 1.0, size=n_keys) * gaps[starts]  # first point: early in the year
    cum = np.cumsum(gaps)
    base = cum[starts] - gaps[starts]
    within = cum - np.repeat(base, counts)
    total = np.add.reduceat(gaps, starts)
    span_ns = int(YEAR.total_seconds() * 1e9) - 1
    vf = int(YEAR_START.timestamp() * 1e9) + (within / np.repeat(total, counts) * span_ns).astype(np.int64)
    vf = vf - np.mod(vf, 1000)  # the store keeps microseconds
    # The stored key is (offer, valid_from): keep times strictly increasing within each offer.
    same = np.r_[False, (key_idx[1:] == key_idx[:-1]) & (vf[1:] <= vf[:-1])]
    while same.any():
        vf[same] = vf[np.flatnonzero(same) - 1] + 1000
        same = np.r_[False, (key_idx[1:] == key_idx[:-1]) & (vf[1:] <= vf[:-1])]
    level = rng.uniform(0.3, 40.0, size=n_keys)
    steps = rng.normal(0.0, 0.03, size=n_points)
    steps[starts] = 0.0
    walk = np.exp(np.cumsum(steps) - np.repeat(np.cumsum(steps)[starts], counts))
    price = np.round(np.repeat(level, counts) * np.clip(walk, 0.2, 5.0), 4)
    # Every point a real change: nudge a price equal to its predecessor's.
    for _ in range(50):
        eq = np.r_[False, (key_idx[1:] == key_idx[:-1]) & (price[1:] == price[:-1])]
        if not eq.any():
            break
        price[eq] = np.round(price[eq] + 0.0001, 4)
    order = np.argsort(vf, kind="stable")
    return offer_keys(n_keys), key_idx[order], vf[order], price[order]


def realistic_batches(
    n_points: int, n_keys: int, batch: int, seed: int = 0
) -> tuple[Iterator[pd.DataFrame], datetime, datetime, Keys]:
    """Frames of at most ``batch`` points for :meth:`PriceStore.write`, in time order, and the time
    range covered."""
    keys, kidx, vf, price = realistic_arrays(n_points, n_keys, seed)

    def frames() -> Iterator[pd.DataFrame]:
        for lo in range(0, n_points, batch):
            k = kidx[lo : lo + batch]
            yield pd.DataFrame(
                {
                    "cloud": keys.cloud[k],
                    "region": keys.region[k],
                    "zone": keys.zone[k],
                    "instance_type": keys.instance_type[k],
                    "market": keys.market[k],
                    "valid_from": pd.to_datetime(vf[lo : lo + batch], utc=True),
                    "usd_per_hour": price[lo : lo + batch],
                    "source": "bench-scale",
                }
            )

    lo_t = datetime.fromtimestamp(int(vf[0]) / 1e9, UTC)
    hi_t = datetime.fromtimestamp(int(vf[-1]) / 1e9, UTC)
    return frames(), lo_t, hi_t, keys


def uniform_batches(n_points: int, n_keys: int, batch: int) -> tuple[Iterator[pd.DataFrame], datetime, datetime]:
    frame = synthetic_points(n_points, n_keys).sort_values("valid_from", kind="stable").reset_index(drop=True)
    lo_t = frame["valid_from"].min().to_pydatetime()
    hi_t = frame["valid_from"].max().to_pydatetime()
    return (frame.iloc[i : i + batch] for i in range(0, len(frame), batch)), lo_t, hi_t


# ---------------------------------------------------------------- measuring helpers
def _url(database: str) -> str:
    return PG_URL.rsplit("/", 1)[0] + "/" + database


def create_database() -> str:
    name = f"costopt_scale_{uuid.uuid4().hex[:8]}"
    admin = make_engine(PG_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    admin.dispose()
    return name


def drop_database(name: str) -> None:
    admin = make_engine(PG_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


def backend_cpu_s(engine: Engine, database: str) -> float:
    """CPU seconds (user + system) used so far by this database's backend processes, read from /proc
    (PostgreSQL runs on this machine); 0 for a backend that cannot be read."""
    with engine.connect() as conn:
        pids = [
            r[0] for r in conn.execute(text("SELECT pid FROM pg_stat_activity WHERE datname = :d"), {"d": database})
        ]
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / tick
        except (OSError, IndexError, ValueError):
            continue
    return total


def rss_mib() -> tuple[float, float]:
    """(current RSS, peak RSS) of this process in MiB."""
    cur = peak = 0.0
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                cur = int(line.split()[1]) / 1024
            elif line.startswith("VmHWM:"):
                peak = int(line.split()[1]) / 1024
    return cur, peak


def load_avg() -> str:
    return " ".join(f"{v:.1f}" for v in os.getloadavg())


def median_ms(fn: Any, repeats: int) -> tuple[float, Any]:
    times, out = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1000, out


def mirror_bytes(store: PriceStore) -> int:
    """Bytes held by the mirror's arrays and offers frame (deep)."""
    m = store.mirror
    if m is None:
        return 0
    total = 0
    if m._offers is not None:
        total += int(m._offers.frame.memory_usage(deep=True).sum())
    if m._points is not None:
        p = m._points
        total += sum(a.nbytes for a in (p.offer_id, p.vf, p.price, p.source_code, p.starts, p.run_offer))
    return total


def explain(engine: Engine, sql: str, params: dict[str, Any]) -> str:
    with engine.connect() as conn:
        rows = conn.execute(text("EXPLAIN (ANALYZE, BUFFERS) " + sql), params).fetchall()
    return "\n".join(r[0] for r in rows)


LEGACY_ASOF_SQL = (
    "SELECT o.id, p.usd_per_hour, p.valid_from, p.source FROM offers o"
    " JOIN price_points p ON p.offer_id = o.id AND p.valid_from = ("
    " SELECT max(p2.valid_from) FROM price_points p2 WHERE p2.offer_id = o.id AND p2.valid_from <= :at)"
)
LATERAL_ASOF_SQL = (
    "SELECT o.id, p.usd_per_hour, p.valid_from, p.source FROM offers o"
    " CROSS JOIN LATERAL (SELECT p2.usd_per_hour, p2.valid_from, p2.source FROM price_points p2"
    " WHERE p2.offer_id = o.id AND p2.valid_from <= :at ORDER BY p2.valid_from DESC LIMIT 1) p"
)


def _fetch(engine: Engine, sql: str, at: datetime) -> list[Any]:
    with engine.connect() as conn:
        return list(conn.execute(text(sql), {"at": at}).fetchall())


# ---------------------------------------------------------------- one size
def run_size(
    n_points: int, n_keys: int, *, batch: int, repeats: int, shape: str, keep: bool = False, explain_plans: bool = False
) -> dict[str, Any]:
    database = create_database()
    out: dict[str, Any] = {"points": n_points, "keys": n_keys, "batch": batch, "shape": shape, "database": database}
    try:
        engine = make_engine(_url(database))
        migrate(engine)
        if shape == "realistic":
            frames, lo_t, hi_t, _ = realistic_batches(n_points, n_keys, batch)
        else:
            frames, lo_t, hi_t = uniform_batches(n_points, n_keys, batch)
        # The mirror may hold every point here (the default store stops at 5 M and sends as-of to SQL).
        store = PriceStore(engine, stale_after=timedelta(days=36500), mirror_max_points=n_points + 1)
        out["load_before"] = load_avg()
        wall = cpu = 0.0
        written = inserted = 0
        server0 = backend_cpu_s(engine, database)
        for frame in frames:
            c0, t0 = time.process_time(), time.perf_counter()
            res = store.write(frame)
            wall += time.perf_counter() - t0
            cpu += time.process_time() - c0
            written += res.received
            inserted += res.inserted
        out.update(
            ingest_wall_s=wall,
            ingest_cpu_s=cpu,
            ingest_server_cpu_s=backend_cpu_s(engine, database) - server0,
            ingest_points_per_s=written / wall,
            inserted=inserted,
            load_after_ingest=load_avg(),
        )
        with engine.begin() as conn:
            conn.execute(text("ANALYZE"))
            sizes = conn.execute(
                text(
                    "SELECT pg_total_relation_size('price_points'), pg_relation_size('price_points'),"
                    " pg_indexes_size('price_points'), pg_total_relation_size('offers'),"
                    " pg_total_relation_size('price_repeats'), pg_database_size(current_database())"
                )
            ).one()
        out.update(
            disk_price_points_bytes=sizes[0],
            disk_price_points_heap_bytes=sizes[1],
            disk_price_points_index_bytes=sizes[2],
            disk_offers_bytes=sizes[3],
            disk_repeats_bytes=sizes[4],
            disk_database_bytes=sizes[5],
            disk_bytes_per_point=sizes[0] / max(inserted, 1),
        )
        # Mirror: first snapshot after a write loads offers, an as-of loads every point.
        gc.collect()
        rss0, _ = rss_mib()
        t0 = time.perf_counter()
        store.snapshot_frame()
        out["mirror_offers_load_s"] = time.perf_counter() - t0
        at_mid = lo_t + (hi_t - lo_t) / 2
        c0, t0 = time.process_time(), time.perf_counter()
        store.snapshot_frame(at_mid)
        out["mirror_points_load_s"] = time.perf_counter() - t0
        out["mirror_points_load_cpu_s"] = time.process_time() - c0
        gc.collect()
        rss1, peak = rss_mib()
        out.update(
            mirror_array_mib=mirror_bytes(store) / 2**20,
            mirror_rss_delta_mib=rss1 - rss0,
            process_peak_rss_mib=peak,
            process_maxrss_mib=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        )
        rng = np.random.default_rng(1)
        ats = [lo_t + (hi_t - lo_t) * float(rng.uniform(0.05, 0.95)) for _ in range(repeats)]
        it = iter(ats * 2)
        out["snapshot_now_mirror_ms"], snap = median_ms(lambda: store.snapshot_frame(), repeats)
        out["snapshot_now_rows"] = len(snap)
        out["snapshot_now_sql_ms"], _ = median_ms(lambda: store.snapshot_frame(use_mirror=False), repeats)
        out["snapshot_asof_mirror_ms"], snap_at = median_ms(lambda: store.snapshot_frame(next(it)), repeats)
        out["snapshot_asof_rows"] = len(snap_at)
        it = iter(ats)
        sql_repeats = max(3, repeats // 3)
        out["snapshot_asof_sql_ms"], _ = median_ms(
            lambda: store.snapshot_frame(next(it), use_mirror=False), sql_repeats
        )
        # The as-of statement alone, before (correlated max(), what the store ran until this benchmark)
        # and after (LATERAL, what PriceStore._snapshot_sql runs on PostgreSQL now).
        for name, sql in (("legacy", LEGACY_ASOF_SQL), ("lateral", LATERAL_ASOF_SQL)):
            times = iter(ats)
            out[f"asof_query_{name}_ms"], rows = median_ms(
                lambda sql=sql, times=times: _fetch(engine, sql, next(times)), sql_repeats
            )
            out[f"asof_query_{name}_rows"] = len(rows)
        # One offer's month of history (with the point in effect at its start).
        with engine.connect() as conn:
            key = conn.execute(
                text("SELECT cloud, region, zone, instance_type, market FROM offers ORDER BY id LIMIT 1 OFFSET :k"),
                {"k": n_keys // 3},
            ).one()
        start = lo_t + (hi_t - lo_t) * 0.5
        end = start + timedelta(days=30)
        from costopt.domain import Cloud, Market

        def month() -> pd.DataFrame:
            return store.history(
                start,
                end,
                cloud=Cloud(key[0]),
                region=key[1],
                zone=key[2],
                instance_type=key[3],
                market=Market(key[4]),
            )

        out["history_month_ms"], hist = median_ms(month, repeats)
        out["history_month_rows"] = len(hist)
        if explain_plans:
            out["explain_history"] = _explain_history(engine, key, start, end, legacy=False)
            out["explain_history_legacy"] = _explain_history(engine, key, start, end, legacy=True)
            out["explain_asof_legacy"] = explain(engine, LEGACY_ASOF_SQL, {"at": at_mid})
            out["explain_asof_lateral"] = explain(engine, LATERAL_ASOF_SQL, {"at": at_mid})
        out["load_after"] = load_avg()
        engine.dispose()
        if store.mirror is not None:
            store.mirror.invalidate()
    finally:
        if not keep:
            drop_database(database)
    return out


def _explain_history(engine: Engine, key: Any, start: datetime, end: datetime, *, legacy: bool) -> str:
    """EXPLAIN ANALYZE of one offer's history statement: what :meth:`PriceStore.history` runs now
    (range from the prior point, correlated on the offer) or, with ``legacy``, the earlier
    ``valid_from >= start OR valid_from = (prior)`` form."""
    from sqlalchemy import func, select
    from sqlalchemy.dialects import postgresql

    from costopt.db.schema import offers as t_offers
    from costopt.db.schema import price_points as t_points
    from pricing.ingest import KEY_COLUMNS

    p2 = t_points.alias("p2")
    owner = t_points.c.offer_id if legacy else t_offers.c.id
    prior = select(func.max(p2.c.valid_from)).where(p2.c.offer_id == owner, p2.c.valid_from <= start).scalar_subquery()
    lower: Any
    if legacy:
        lower = (t_points.c.valid_from >= start) | (t_points.c.valid_from == prior)
    else:
        lower = t_points.c.valid_from >= func.coalesce(prior, start)
    stmt = (
        select(t_points.c.valid_from, t_points.c.usd_per_hour)
        .select_from(t_points.join(t_offers, t_offers.c.id == t_points.c.offer_id))
        .where(
            lower, t_points.c.valid_from <= end, *[t_offers.c[c] == v for c, v in zip(KEY_COLUMNS, key, strict=True)]
        )
        .order_by(t_points.c.valid_from)
    )
    compiled = stmt.compile(dialect=postgresql.dialect(), compile_kwargs={"literal_binds": True})  # type: ignore[no-untyped-call]
    with engine.connect() as conn:
        rows = conn.exec_driver_sql("EXPLAIN (ANALYZE, BUFFERS) " + str(compiled)).fetchall()
    return "\n".join(r[0] for r in rows)


def parse_points(value: str) -> list[int]:
    """``1000000,10M,3e6`` -> [1000000, 10000000, 3000000]."""
    out = []
    for part in value.split(","):
        p = part.strip().lower().replace("_", "")
        if not p:
            continue
        mult = 1
        if p.endswith("m"):
            p, mult = p[:-1], 1_000_000
        elif p.endswith("k"):
            p, mult = p[:-1], 1_000
        n = int(float(p) * mult)
        if n <= 0:
            raise argparse.ArgumentTypeError(f"points must be positive, got {part!r}")
        out.append(n)
    if not out:
        raise argparse.ArgumentTypeError("no sizes given")
    return out


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--points", type=parse_points, default=[1_000_000, 10_000_000], help="sizes, e.g. 1M,10M")
    ap.add_argument(
        "--keys",
        type=int,
        default=15_000,
        help="offers (default 15,000: 10 M points is then ~1.8 changes/offer/day, the real AWS rate)",
    )
    ap.add_argument("--batch", type=int, default=1_000_000, help="points per PriceStore.write")
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--shape", choices=["realistic", "uniform"], default="realistic")
    ap.add_argument("--explain", action="store_true", help="add EXPLAIN ANALYZE of the history and as-of queries")
    ap.add_argument("--keep", action="store_true", help="keep the private database (its name is printed)")
    ap.add_argument("--json", action="store_true", help="print one JSON object per size")
    return ap


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    if args.keys < 1 or args.batch < 1 or args.repeats < 1:
        raise SystemExit("--keys, --batch and --repeats must be at least 1")
    uptime = subprocess.run(["uptime"], capture_output=True, text=True, check=False).stdout.strip()
    if not args.json:
        print(f"store scale: {datetime.now(UTC):%Y-%m-%d %H:%M} UTC; {uptime}")
    for n in args.points:
        r = run_size(
            n,
            args.keys,
            batch=args.batch,
            repeats=args.repeats,
            shape=args.shape,
            keep=args.keep,
            explain_plans=args.explain,
        )
        if args.json:
            print(json.dumps(r), flush=True)
            continue
        print(
            f"{n:>12,} points / {args.keys:,} keys: ingest {r['ingest_points_per_s']:,.0f} points/s "
            f"({r['ingest_wall_s']:.1f} s wall, {r['ingest_cpu_s']:.1f} s CPU here, "
            f"{r['ingest_server_cpu_s']:.1f} s CPU in PostgreSQL; "
            f"load {r['load_before']} -> {r['load_after_ingest']})\n"
            f"    disk: price_points {r['disk_price_points_bytes'] / 2**20:,.0f} MiB "
            f"(heap {r['disk_price_points_heap_bytes'] / 2**20:,.0f}, "
            f"index {r['disk_price_points_index_bytes'] / 2**20:,.0f}; "
            f"{r['disk_bytes_per_point']:.0f} B/point), offers {r['disk_offers_bytes'] / 2**20:,.1f} MiB\n"
            f"    mirror: offers load {r['mirror_offers_load_s']:.2f} s, "
            f"points load {r['mirror_points_load_s']:.1f} s; "
            f"arrays {r['mirror_array_mib']:,.0f} MiB, RSS +{r['mirror_rss_delta_mib']:,.0f} MiB "
            f"(peak RSS {r['process_peak_rss_mib']:,.0f} MiB)\n"
            f"    snapshot now: mirror {r['snapshot_now_mirror_ms']:.1f} ms, SQL {r['snapshot_now_sql_ms']:.1f} ms "
            f"({r['snapshot_now_rows']:,} rows); as-of: mirror {r['snapshot_asof_mirror_ms']:.1f} ms, "
            f"SQL {r['snapshot_asof_sql_ms']:.1f} ms ({r['snapshot_asof_rows']:,} rows)\n"
            f"    one offer's month: {r['history_month_ms']:.1f} ms ({r['history_month_rows']} rows); "
            f"load {r['load_after']}",
            flush=True,
        )
        print(
            f"    as-of statement alone: correlated max() {r['asof_query_legacy_ms']:.1f} ms, "
            f"LATERAL {r['asof_query_lateral_ms']:.1f} ms ({r['asof_query_lateral_rows']:,} rows)",
            flush=True,
        )
        for k in ("explain_history", "explain_history_legacy", "explain_asof_legacy", "explain_asof_lateral"):
            if k in r:
                print(f"--- {k}\n{r[k]}")


if __name__ == "__main__":
    main()
