"""How often a quote rebuilds the planner's offer table over the simulated clock (``make run``).

The service's ``JobPlanner`` caches the offer table per price version and *price epoch* of the plan time
(how many price points have taken effect by then, how many offers have turned stale), so over the
simulated clock a table serves every tick until a price point takes effect. This measures, on a fresh
SQLite store seeded as ``make run`` seeds it, from ``COSTOPT_SIM_START``: how many times the epoch
changes over ``--hours`` simulated hours of ticks (``COSTOPT_SIM_TICK`` x ``COSTOPT_SIM_TIME_SCALE``
apart), and ``--quotes`` quotes of distinct jobs one tick apart: table hits and rebuilds, with their
median wall time.

Run: ``.venv/bin/python bench/quote_cache_bench.py [--hours 60] [--quotes 200]``. Figures: docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import itertools
import logging
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hours", type=float, default=60.0, help="simulated hours of ticks for the epoch count")
    p.add_argument("--quotes", type=int, default=200, help="quotes one tick apart")
    args = p.parse_args()
    logging.disable(logging.WARNING)

    from api.job_planning import JobPlanner
    from api.wiring import build_store, seed_if_empty
    from costopt.settings import Settings
    from pricing.mirror import read_version

    base = Settings()
    folder = Path(tempfile.mkdtemp(prefix="costopt-quote-cache-"))
    settings = base.model_copy(update={"database_url": f"sqlite:///{folder / 'store.db'}"})
    store = build_store(settings)
    t = time.perf_counter()
    seed_if_empty(store, settings)
    print(f"seeded {store.count_points():,} price points in {time.perf_counter() - t:.1f} s")
    tick = settings.sim_tick * settings.sim_time_scale
    now = [settings.sim_start]
    planner = JobPlanner(store, settings, unavailable=None, now=lambda: now[0])
    with store.engine.connect() as conn:
        version = read_version(conn)
    n = int(args.hours * 3600 / tick.total_seconds())
    epochs = [planner.price_epoch(version, settings.sim_start + k * tick) for k in range(n + 1)]
    changes = sum(1 for a, b in itertools.pairwise(epochs) if a != b)
    print(
        f"{n} ticks of {tick} ({args.hours:g} simulated hours from {settings.sim_start:%Y-%m-%d}): the price "
        f"epoch changed {changes} times (one table per {n / max(changes, 1):.1f} ticks)"
    )
    hits: list[float] = []
    rebuilds: list[float] = []
    for k in range(args.quotes):
        now[0] = settings.sim_start + k * tick
        before = len(planner._tables)  # a rebuild adds a table (or empties a full cache first)
        spec = {"job_type": "ResNet-50 (batch size 128)", "steps": 20_000 + k, "gpus": 1, "command": ["train"]}
        t = time.perf_counter()
        planner.plan(spec, at=now[0])
        (hits if len(planner._tables) == before else rebuilds).append(time.perf_counter() - t)
    print(
        f"{args.quotes} quotes one tick apart: {len(hits)} on a cached table (median "
        f"{statistics.median(hits) * 1000:.1f} ms), {len(rebuilds)} rebuilt it (median "
        f"{statistics.median(rebuilds) * 1000:.1f} ms)"
    )


if __name__ == "__main__":
    main()
