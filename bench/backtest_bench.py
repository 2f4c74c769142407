"""Backtest benchmark: the paper's full table, the hourly interval sweep, and the decision rule.

Run: ``.venv/bin/python bench/backtest_bench.py [--repeats 3] [--skip-sweep]``. Prints timings
(targets on a 2-core machine: full paper table <= 120 s, hourly sweep <= 10 min).
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import TypeVar

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from api.wiring import build_store
from costopt.backtest.intervals import interval_sweep
from costopt.backtest.paper import PAPER_POLICIES, load_paper_inputs, paper_backtest, paper_price_files
from costopt.domain import Cloud, Market, OfferKey
from costopt.migration.decision import MigrationRule, OfferQuote, RunningJob, choose, decide_many
from costopt.planning.model import Location
from costopt.settings import Settings
from costopt.throughput.loaders import GAVEL_ORACLE_FILE
from pricing.importer import import_paths

T = TypeVar("T")


def timed(fn: Callable[[], T], repeats: int) -> tuple[float, float, T]:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), min(times), out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--skip-sweep", action="store_true", help="leave out the hourly sweep (~20 s)")
    ap.add_argument("--json", action="store_true", help="print the figures as one JSON object instead")
    args = ap.parse_args()
    emit: Callable[..., None] = (lambda *a, **k: None) if args.json else print
    figures: dict[str, float] = {}
    logging.basicConfig(level=logging.ERROR)
    settings = Settings(database_url=f"sqlite:///{Path(tempfile.mkdtemp()) / 'store.db'}")
    data = settings.data_dir
    if data is None:
        raise SystemExit("needs ../shared/data")

    t0 = time.perf_counter()
    store = build_store(settings)
    import_paths(store, paper_price_files(data, settings.catalog_dir))
    t_import = time.perf_counter() - t0
    t0 = time.perf_counter()
    inputs = load_paper_inputs(store, data / GAVEL_ORACLE_FILE)
    t_load = time.perf_counter() - t0
    figures.update(import_s=t_import, load_inputs_s=t_load)
    emit(f"import the paper's prices into a scratch SQLite store: {t_import:.2f} s; load inputs: {t_load:.2f} s")

    med, best, result = timed(lambda: paper_backtest(inputs, policies=PAPER_POLICIES), args.repeats)
    n_jobs = sum(len(f) for f in result.jobs.values())
    figures.update(paper_table_median_s=med, paper_table_best_s=best)
    emit(
        f"paper table, 2 regions x 6 models x 7 lengths x 30 start days x 6 policies "
        f"({n_jobs * len(PAPER_POLICIES)} simulated jobs): median {med:.2f} s, best {best:.2f} s (target 120 s)"
    )
    med, best, _ = timed(lambda: paper_backtest(inputs), args.repeats)
    figures["paper_table_9_policies_median_s"] = med
    emit(f"paper table with the 3 extra policies (9 in all): median {med:.2f} s, best {best:.2f} s")

    if not args.skip_sweep:
        med, best, sweep = timed(lambda: interval_sweep(inputs), 1)
        figures["hourly_sweep_s"] = med
        emit(
            f"hourly sweep, 2 regions x 2 offer sets x (4 intervals x 3 modes + static) x 1,260 jobs "
            f"({len(sweep.cells)} cells): {med:.1f} s (target 600 s)"
        )

    rng = np.random.default_rng(0)
    n_jobs, n_cand = 10_000, 100
    arrays = {
        "remaining_steps": rng.uniform(1e3, 1e7, n_jobs),
        "here_usd_per_hour": rng.uniform(0.2, 3.0, n_jobs),
        "here_steps_per_s": rng.uniform(0.5, 10.0, n_jobs),
        "cand_usd_per_hour": rng.uniform(0.2, 3.0, n_cand),
        "cand_steps_per_s": rng.uniform(0.5, 10.0, (n_jobs, n_cand)),
        "egress_usd_per_gb": rng.choice([0.0, 0.02, 0.09], (n_jobs, n_cand)),
        "checkpoint_gb": rng.uniform(0.0, 5.0, n_jobs),
        "hours_since_move": rng.choice([np.inf, 3.0, 30.0], n_jobs),
    }
    rule = MigrationRule()
    med, best, _ = timed(lambda: decide_many(rule=rule, **arrays), max(args.repeats, 5))
    figures["decide_many_median_ms"] = med * 1000
    emit(f"decide_many, {n_jobs:,} jobs x {n_cand} candidates: median {med * 1000:.0f} ms, best {best * 1000:.0f} ms")

    here = OfferQuote(OfferKey(Cloud.AWS, "us-east-1", "us-east-1a", "p3.2xlarge", Market.SPOT), 0.918, 2.85)
    cands = [
        OfferQuote(OfferKey(Cloud.AZURE, "eastus", "", f"size{i}", Market.SPOT), float(p), 2.85)
        for i, p in enumerate(rng.uniform(0.5, 1.0, 60))
    ]
    job = RunningJob(5e5, here, Location(Cloud.AWS, "us-east-1"), 0.2)
    now = datetime(2020, 3, 1, tzinfo=UTC)
    reps = 2000
    t0 = time.perf_counter()
    for _ in range(reps):
        choose(job, cands, now, rule)
    figures["choose_us"] = (time.perf_counter() - t0) / reps * 1e6
    emit(f"choose (scalar, 60 candidates): {figures['choose_us']:.0f} us per decision")
    if args.json:
        print(json.dumps(figures))


if __name__ == "__main__":
    main()
