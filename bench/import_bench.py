"""Replay-import benchmark: all of ``<data>/prices/`` plus the raw AWS spot pages, on both backends.

Run: ``.venv/bin/python bench/import_bench.py [--data ../shared/data] [--backend both]``
Prints the seconds of a first import into an empty store and of a re-import (which must insert
nothing), and the change points per source. Goal: first import <= 10 s on each backend.
"""

from __future__ import annotations

import argparse
import json
import logging
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path

from sqlalchemy import Engine, text

from costopt.db.engine import make_engine, migrate
from costopt.settings import Settings
from pricing.importer import import_paths
from pricing.store import PriceStore

PG_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"


def fresh_engine(backend: str, tmp: Path) -> tuple[Engine, str | None]:
    """A migrated empty store: a SQLite file in ``tmp``, or a fresh PostgreSQL schema (returned)."""
    if backend == "sqlite":
        eng = make_engine(f"sqlite:///{tmp / 'import-bench.db'}")
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


def run(backend: str, paths: list[Path], quiet: bool = False) -> dict[str, object]:
    """Import ``paths`` twice into a fresh store; print a summary unless ``quiet``; return the figures."""
    tmp = Path(tempfile.mkdtemp(prefix="costopt-import-bench-"))
    eng, schema = fresh_engine(backend, tmp)
    try:
        store = PriceStore(eng)
        t0 = time.perf_counter()
        reports = import_paths(store, paths)
        first_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        again = import_paths(store, paths)
        second_s = time.perf_counter() - t0
        with eng.connect() as conn:
            per_source: dict[str, int] = dict(
                conn.execute(text("SELECT source, count(*) FROM price_points GROUP BY source ORDER BY source")).all()
            )
        statuses = Counter(r.status for r in reports)
        read = sum(r.points_read for r in reports)
        inserted = sum(r.inserted for r in reports)
        figures: dict[str, object] = {
            "first_import_s": first_s,
            "reimport_s": second_s,
            "files": len(reports),
            "statuses": dict(statuses),
            "points_read": read,
            "change_points": inserted,
            "reimport_new": sum(r.inserted for r in again),
            "per_source": per_source,
        }
        if quiet:
            return figures
        print(
            f"{backend:10s} import {first_s:5.2f} s: {len(reports)} files {dict(statuses)}, {read:,} points read, "
            f"{inserted:,} change points stored; re-import {second_s:5.2f} s, "
            f"{sum(r.inserted for r in again)} new"
        )
        print(f"{'':10s} change points per source: {per_source}")
        for r in reports:
            if r.status in ("failed", "refused"):
                print(f"{'':10s} {r.status}: {r.error}")
        return figures
    finally:
        eng.dispose()
        drop_schema(schema)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--data", type=Path, default=Settings().data_dir)
    ap.add_argument("--backend", choices=["sqlite", "postgresql", "both"], default="both")
    ap.add_argument("--json", action="store_true", help="print the figures as one JSON object per backend instead")
    args = ap.parse_args()
    logging.basicConfig(level=logging.ERROR)  # the data's known quirks are logged as warnings on every run
    if args.data is None:
        raise SystemExit("no data folder: pass --data ../shared/data")
    paths = [args.data / "prices", args.data / "raw" / "training_on_a_dime" / "logs" / "aws" / "cost"]
    backends = ["sqlite", "postgresql"] if args.backend == "both" else [args.backend]
    if args.json:
        print(json.dumps({b: run(b, paths, quiet=True) for b in backends}))
        return
    print(f"import benchmark: {', '.join(str(p) for p in paths)}")
    for backend in backends:
        run(backend, paths)


if __name__ == "__main__":
    main()
