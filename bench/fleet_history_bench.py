"""Cost per round boundary of a live fleet's decayed shares, recomputed from the stored rounds' leases.

An aware fleet's boundary reads the leases of the rounds that started in the last ``HISTORY_MEMORIES``
memories (:func:`costopt.fleets.rounds.history_since`) and sums them (:func:`decayed_received`). This fills
``fleet_rounds`` with that many rounds (``--leases`` each) and times the read and the sum (best of 3).

Run: ``.venv/bin/python bench/fleet_history_bench.py [--round-s 360 60] [--leases 8] [--backend both]``
Prints figures; nothing is asserted (docs/fleets.md quotes them).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta

from sqlalchemy import Engine, insert, text

from costopt.db.engine import make_engine, migrate
from costopt.db.fleets_schema import fleet_rounds
from costopt.fleets.rounds import HISTORY_MEMORIES, decayed_received, history_since
from costopt.fleets.store import FleetRepository

MEMORY_S = 7200.0
"""The memory (s) of a rule that forgets (the aware rule's default until 2026-12-04; the allocation integral
keeps none): how far back a boundary reads the fleet's leases."""

PG_ADMIN_URL = os.environ.get("COSTOPT_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
T0 = datetime(2026, 1, 1, tzinfo=UTC)


@contextmanager
def database(backend: str) -> Iterator[Engine]:
    """A migrated, empty database (sqlite: a temp file; postgres: a schema of its own, dropped after)."""
    if backend == "sqlite":
        with tempfile.TemporaryDirectory(prefix="costopt-bench-") as tmp:
            eng = make_engine(f"sqlite:///{tmp}/bench.db")
            migrate(eng)
            yield eng
            eng.dispose()
        return
    schema = f"bench_{uuid.uuid4().hex[:12]}"
    admin = make_engine(PG_ADMIN_URL)
    with admin.begin() as conn:
        conn.execute(text(f'CREATE SCHEMA "{schema}"'))
    eng = make_engine(f"{PG_ADMIN_URL}?options=-csearch_path%3D{schema}")
    try:
        migrate(eng)
        yield eng
    finally:
        eng.dispose()
        with admin.begin() as conn:
            conn.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
        admin.dispose()


def run(backend: str, round_s: float, leases: int) -> dict[str, float]:
    n = int(HISTORY_MEMORIES * MEMORY_S / round_s) + 1
    with database(backend) as eng:
        rows = []
        for r in range(1, n + 1):
            start = T0 + timedelta(seconds=(r - 1) * round_s)
            doc = [
                {"job_id": f"job-{k}", "instance": f"fi-{k}", "gpus": [0], "type": ("v100", "k80")[k % 2], "epoch": r}
                for k in range(leases)
            ]
            rows.append(
                {
                    "fleet_id": "f",
                    "round": r,
                    "started_at": start,
                    "ends_at": start + timedelta(seconds=round_s),
                    "ended_at": start + timedelta(seconds=round_s) if r < n else None,
                    "capacity": json.dumps({"v100": leases, "k80": leases}),
                    "assignment": json.dumps(doc),
                    "solved": False,
                    "billed": False,
                }
            )
        with eng.begin() as conn:
            for i in range(0, len(rows), 5000):
                conn.execute(insert(fleet_rounds), rows[i : i + 5000])
        repo = FleetRepository(eng)
        now = T0 + timedelta(seconds=n * round_s)
        ids = [f"job-{k}" for k in range(leases)]
        best: tuple[float, float, int] | None = None
        for _ in range(3):
            t0 = time.perf_counter()
            history = repo.leases_since("f", history_since([T0], now, MEMORY_S))
            t1 = time.perf_counter()
            decayed_received(history, ids, now, MEMORY_S)
            t2 = time.perf_counter()
            if best is None or t2 - t0 < best[0] + best[1]:
                best = (t1 - t0, t2 - t1, len(history))
        assert best is not None
        return {"read_ms": best[0] * 1e3, "sum_ms": best[1] * 1e3, "rounds": best[2]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--round-s", type=float, nargs="+", default=[360.0, 60.0])
    ap.add_argument("--leases", type=int, default=8)
    ap.add_argument("--backend", choices=["sqlite", "postgres", "both"], default="both")
    args = ap.parse_args()
    backends = ["sqlite", "postgres"] if args.backend == "both" else [args.backend]
    for backend in backends:
        for round_s in args.round_s:
            got = run(backend, round_s, args.leases)
            print(
                f"{backend:8s} round_s={round_s:g}: {got['rounds']:.0f} rounds x {args.leases} leases: "
                f"{got['read_ms'] + got['sum_ms']:.1f} ms per boundary "
                f"(read {got['read_ms']:.1f} ms, sum {got['sum_ms']:.1f} ms)"
            )


if __name__ == "__main__":
    main()
