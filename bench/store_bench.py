"""Price-store benchmark: ingest speed (vs plain COPY) and snapshot latency, on both backends.

Run: ``.venv/bin/python bench/store_bench.py [--points 1000000] [--keys 10000] [--backend both]``
Prints figures; nothing here is asserted (see docs/benchmarks.md for the goals and results).
"""

from __future__ import annotations

import argparse
import io
import json
import statistics
import tempfile
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pandas as pd
from sqlalchemy import Engine, text

from costopt.db.engine import make_engine, migrate
from pricing.store import PriceStore

PG_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"


def synthetic_points(n_points: int, n_keys: int, seed: int = 0) -> pd.DataFrame:
    """n_points change points over n_keys offers, every price a real change (random walk)."""
    rng = np.random.default_rng(seed)
    per_key = n_points // n_keys
    key_idx = np.repeat(np.arange(n_keys), per_key)
    regions = np.array([f"region-{i % 40}" for i in range(n_keys)])
    zones = np.array([f"region-{i % 40}{'abcdef'[(i // 40) % 6]}" for i in range(n_keys)])
    types = np.array([f"gpu{(i // 240) % 64}.{(i // 240) // 64}xlarge" for i in range(n_keys)])
    start = np.datetime64("2020-01-01T00:00:00", "ns").astype("int64")
    steps = rng.integers(60, 7200, size=(n_keys, per_key)).cumsum(axis=1) * 1_000_000_000
    vf = (start + steps).ravel()
    base = rng.uniform(0.2, 30.0, size=n_keys)
    walk = np.round(base[:, None] * (1 + 0.001 * rng.integers(1, 50, size=(n_keys, per_key)).cumsum(axis=1)), 4)
    return pd.DataFrame(
        {
            "cloud": "aws",
            "region": regions[key_idx],
            "zone": zones[key_idx],
            "instance_type": types[key_idx],
            "market": "spot",
            "valid_from": pd.to_datetime(vf, utc=True),
            "usd_per_hour": walk.ravel(),
            "source": "bench",
        }
    )


def fresh_engine(backend: str, tmp: Path) -> tuple[Engine, str | None]:
    if backend == "sqlite":
        eng = make_engine(f"sqlite:///{tmp / f'bench-{uuid.uuid4().hex[:6]}.db'}")
        migrate(eng)
        return eng, None
    schema = f"bench_{uuid.uuid4().hex[:8]}"
    admin = make_engine(PG_URL)
    with admin.begin() as conn:
        conn.execute(text(f'CREATE SCHEMA "{schema}"'))
    admin.dispose()
    eng = make_engine(PG_URL, connect_args={"options": f"-csearch_path={schema}"})
    migrate(eng)
    return eng, schema


def drop_schema(schema: str | None) -> None:
    if schema:
        admin = make_engine(PG_URL)
        with admin.begin() as conn:
            conn.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
        admin.dispose()


def plain_copy_rate(backend: str, tmp: Path, frame: pd.DataFrame) -> float:
    """Points/s of a plain bulk load of the same rows into the same table (with its indexes):
    COPY on PostgreSQL, executemany INSERT on SQLite. Offers are created first (not timed)."""
    eng, schema = fresh_engine(backend, tmp)
    store = PriceStore(eng)
    keys = frame.drop_duplicates(["cloud", "region", "zone", "instance_type", "market"]).copy()
    store.write(keys)  # creates the offers (one point each), then clear the points
    with eng.begin() as conn:
        conn.execute(text("DELETE FROM price_points"))
        ids = pd.DataFrame(
            conn.execute(text("SELECT id, region, zone, instance_type FROM offers")).fetchall(),
            columns=["id", "region", "zone", "instance_type"],
        )
    merged = frame.merge(ids, on=["region", "zone", "instance_type"])
    ts = np.datetime_as_string(merged["valid_from"].to_numpy(dtype="datetime64[us]"), unit="us")
    rows = pd.DataFrame({"o": merged["id"], "v": ts, "p": merged["usd_per_hour"], "s": "bench"})
    t0 = time.perf_counter()
    if backend == "postgresql":
        buf = io.StringIO()
        rows.to_csv(buf, index=False, header=False, sep="\t")
        data = buf.getvalue()
        t0 = time.perf_counter()  # time the COPY itself only: the fairest (fastest) baseline
        with eng.begin() as conn:
            conn.exec_driver_sql("SET LOCAL TIME ZONE 'UTC'")
            raw = conn.connection.driver_connection
            assert raw is not None  # the open psycopg connection under the pool's wrapper
            with (
                raw.cursor() as cur,
                cur.copy("COPY price_points (offer_id, valid_from, usd_per_hour, source) FROM STDIN") as cp,
            ):
                cp.write(data)
    else:
        data_rows = list(rows.itertuples(index=False, name=None))
        t0 = time.perf_counter()
        with eng.begin() as conn:
            conn.exec_driver_sql("INSERT INTO price_points VALUES (?, ?, ?, ?)", data_rows)
    dt = time.perf_counter() - t0
    eng.dispose()
    drop_schema(schema)
    return len(rows) / dt


def run(backend: str, n_points: int, n_keys: int, repeats: int) -> dict[str, float]:
    tmp = Path(tempfile.mkdtemp(prefix="costopt-bench-"))
    frame = synthetic_points(n_points, n_keys)
    eng, schema = fresh_engine(backend, tmp)
    store = PriceStore(eng, stale_after=timedelta(days=36500))
    t0 = time.perf_counter()
    res = store.write(frame)
    ingest_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    res2 = store.write(frame)
    reingest_s = time.perf_counter() - t0
    assert res2.inserted == 0, res2
    cur_times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        snap = store.snapshot_frame()
        cur_times.append(time.perf_counter() - t0)
    lo = frame["valid_from"].min()
    hi = frame["valid_from"].max()
    rng = np.random.default_rng(1)
    asof_times = []
    for _ in range(repeats):
        at = (lo + (hi - lo) * float(rng.uniform(0.05, 0.95))).to_pydatetime()
        t0 = time.perf_counter()
        snap_at = store.snapshot_frame(at)
        asof_times.append(time.perf_counter() - t0)
    eng.dispose()
    drop_schema(schema)
    copy_rate = plain_copy_rate(backend, tmp, frame)
    out = {
        "points": float(res.received),
        "inserted": float(res.inserted),
        "ingest_points_per_s": res.received / ingest_s,
        "plain_bulk_points_per_s": copy_rate,
        "ratio_to_plain": (res.received / ingest_s) / copy_rate,
        "reingest_s": reingest_s,
        "snapshot_now_median_ms": statistics.median(cur_times) * 1000,
        "snapshot_asof_median_ms": statistics.median(asof_times) * 1000,
        "snapshot_rows": float(len(snap)),
        "snapshot_asof_rows": float(len(snap_at)),
    }
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--points", type=int, default=1_000_000)
    ap.add_argument("--keys", type=int, default=10_000)
    ap.add_argument("--backend", choices=["sqlite", "postgresql", "both"], default="both")
    ap.add_argument("--repeats", type=int, default=21)
    ap.add_argument("--json", action="store_true", help="print the figures as one JSON object per backend instead")
    args = ap.parse_args()
    backends = ["sqlite", "postgresql"] if args.backend == "both" else [args.backend]
    if args.json:
        print(json.dumps({b: run(b, args.points, args.keys, args.repeats) for b in backends}))
        return
    print(f"store benchmark: {args.points:,} points over {args.keys:,} keys ({datetime.now(UTC):%Y-%m-%d %H:%M} UTC)")
    for b in backends:
        r = run(b, args.points, args.keys, args.repeats)
        print(
            f"{b:10s} ingest {r['ingest_points_per_s']:>10,.0f} points/s "
            f"(plain bulk load {r['plain_bulk_points_per_s']:,.0f}/s, ratio {r['ratio_to_plain']:.2f}); "
            f"re-ingest {r['reingest_s']:.2f} s; snapshot now {r['snapshot_now_median_ms']:.1f} ms "
            f"({r['snapshot_rows']:.0f} rows), as-of {r['snapshot_asof_median_ms']:.1f} ms median"
        )


if __name__ == "__main__":
    main()
