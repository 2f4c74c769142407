"""Planner benchmark: one job over >= 10,000 offers, and re-planning 10,000 running jobs at once.

Run: ``.venv/bin/python bench/plan_bench.py [--offers 10000] [--jobs 10000]``. Prints figures.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from costopt.planning.batch import replan
from costopt.planning.evaluate import OfferTable
from costopt.planning.model import JobSpec, MinCost, MinTime
from costopt.planning.single import plan_job
from costopt.settings import Settings
from costopt.throughput.catalog import ThroughputCatalog
from costopt.throughput.loaders import GAVEL_SIMULATION_FILE, load_throughput_file
from tests.planning.conftest import synthetic_offers


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--offers", type=int, default=10_000)
    ap.add_argument("--jobs", type=int, default=10_000)
    ap.add_argument("--repeats", type=int, default=51)
    ap.add_argument("--json", action="store_true", help="print the figures as one JSON object instead")
    args = ap.parse_args()
    emit: Callable[..., None] = (lambda *a, **k: None) if args.json else print
    figures: dict[str, float] = {"jobs": float(args.jobs)}
    data = Settings().data_dir
    if data is None:
        raise SystemExit("needs ../shared/data")
    catalog = ThroughputCatalog.from_measurements(load_throughput_file(data / GAVEL_SIMULATION_FILE))
    t0 = time.perf_counter()
    table = OfferTable.from_frame(synthetic_offers(args.offers, seed=1))
    build_ms = (time.perf_counter() - t0) * 1000
    types = list(catalog.job_types())
    job = JobSpec(types[4], 2e6)
    times = []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        plan_job(job, MinCost(), table, catalog)
        times.append(time.perf_counter() - t0)
    figures["offers"] = float(len(table))
    figures["table_build_ms"] = build_ms
    figures["one_job_median_ms"] = statistics.median(times) * 1000
    emit(f"offers table of {len(table):,} offers built in {build_ms:.1f} ms (once per price snapshot)")
    emit(f"one job over {len(table):,} offers (min-cost, top 10): {statistics.median(times) * 1000:.2f} ms median")
    rng = np.random.default_rng(0)
    multi = [jt for jt in types if catalog.get(jt, "v100", 2) is not None]
    jobs = []
    for _ in range(args.jobs):
        gpus = int(rng.choice([1, 1, 1, 2, 4, 8]))
        pool = types if gpus == 1 else multi
        jobs.append(JobSpec(pool[int(rng.integers(len(pool)))], float(rng.uniform(1e4, 1e7)), gpus))
    for objective in (MinCost(), MinTime()):
        runs = []
        for _ in range(5):
            t0 = time.perf_counter()
            choices = replan(jobs, objective, table, catalog)
            runs.append(time.perf_counter() - t0)
        placed = sum(c.offer_index >= 0 for c in choices)
        figures[f"replan_{objective.name}_median_ms"] = statistics.median(runs) * 1000
        emit(
            f"re-plan {len(jobs):,} running jobs ({len({(j.job_type, j.gpu_count) for j in jobs})} distinct type x "
            f"GPUs) over {len(table):,} offers, {objective.name}: {statistics.median(runs) * 1000:.0f} ms median "
            f"({placed:,} placed)"
        )
    if args.json:
        print(json.dumps(figures))


if __name__ == "__main__":
    main()
