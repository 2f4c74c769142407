"""Job engine benchmark: the wall time of one engine tick over many running jobs.

Run: ``.venv/bin/python bench/engine_tick_bench.py [--jobs 200] [--ticks 10] [--database-url URL]``.
Submits ``--jobs`` jobs (given by throughput, on-demand, long enough to run through the benchmark) on the
simulated cloud with simulated agents, lets the engine launch them all (inline, the migrator sleeping on
the simulated clock), then times ``--ticks`` ticks with every job running, advancing the simulated clock
by one minute between ticks (new progress to record each time). The database is a fresh SQLite file by
default; give ``--database-url`` (e.g. a PostgreSQL schema of its own) to time another backend.
Target: a tick over 200 running jobs well under the default engine interval (5 s) on a 2-core machine.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Collection, Sequence
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from costopt.db.engine import make_engine, migrate
from costopt.domain import Cloud, Market, OfferKey
from costopt.jobs.engine import JobEngine
from costopt.jobs.model import JobState
from costopt.jobs.placement import Placement
from costopt.jobs.records import JobRecord, JobRepository, NewJob
from costopt.ledger import StepPrices
from costopt.ledger.sql import SqlLedger
from costopt.migration.machine import Migrator
from costopt.risk.hazard import HazardModel
from providers.sim import SimCloud

START = datetime(2020, 3, 1, tzinfo=UTC)
OFFER = OfferKey(Cloud.AWS, "us-east-1", "us-east-1a", "p3.2xlarge", Market.ON_DEMAND)
PRICE = 3.06
RATE = 2.0


class OnePlacement:
    def rank(
        self,
        job: JobRecord,
        *,
        remaining_steps: float,
        at: datetime,
        exclude: Collection[OfferKey] = (),
        top: int = 10,
    ) -> Sequence[Placement]:
        hours = remaining_steps / RATE / 3600
        return [Placement(OFFER, PRICE, RATE, hours, Decimal(repr(round(hours * PRICE, 6))))]

    def at_offer(self, job: JobRecord, offer: OfferKey, *, remaining_steps: float, at: datetime) -> Placement | None:
        return self.rank(job, remaining_steps=remaining_steps, at=at)[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=200)
    parser.add_argument("--ticks", type=int, default=10)
    parser.add_argument("--database-url", default=None)
    parser.add_argument("--profile", action="store_true", help="print a profile of one more tick")
    args = parser.parse_args()
    frame = pd.DataFrame(
        [
            {
                "cloud": "aws",
                "region": OFFER.region,
                "zone": OFFER.zone,
                "instance_type": OFFER.instance_type,
                "market": "on_demand",
                "valid_from": START - timedelta(days=1),
                "usd_per_hour": PRICE,
            }
        ]
    )
    prices = StepPrices.from_history(frame, {("aws", "p3.2xlarge"): ("v100", 1.0)})
    cloud = SimCloud(prices, HazardModel(defaults=dict.fromkeys(Cloud, 0.0)), start=START)
    with tempfile.TemporaryDirectory() as tmp:
        db = make_engine(args.database_url or f"sqlite:///{tmp}/bench.db")
        migrate(db)
        repo = JobRepository(db, now=cloud.now)
        migrator = Migrator(
            db,
            cloud,
            sleep=cloud.sleeper(),
            now=cloud.now,
            hook=lambda point: None,
            ledger=SqlLedger(db, prices),
            **cloud.migrator_timeouts(),  # type: ignore[arg-type]
        )
        engine = JobEngine(repo, {"sim": migrator}, OnePlacement(), cloud.now, f"{tmp}/ckpt", workers=0)
        steps = int(RATE * 86400 * 30)
        for i in range(args.jobs):
            spec = {"command": ["train"], "throughput": {"v100": RATE}}
            repo.create(NewJob(team_id="bench", spec=spec, steps_total=steps, provider="sim", name=f"j{i}"))
        t0 = time.perf_counter()
        while repo.count_by_state()[JobState.RUNNING] < args.jobs:
            report = engine.tick()
            if report.errors:
                raise SystemExit(f"engine errors: {report.errors[:3]}")
        launch = time.perf_counter() - t0
        walls = []
        for _ in range(args.ticks):
            cloud.run_to(cloud.now() + timedelta(minutes=1))
            t = time.perf_counter()
            report = engine.tick()
            walls.append(time.perf_counter() - t)
            assert report.jobs == args.jobs and not report.errors, report
        backend = db.dialect.name
        print(f"backend={backend} jobs={args.jobs}: launched all in {launch:.1f} s (inline starts)")
        median = statistics.median(walls)
        print(
            f"tick over {args.jobs} running jobs: median {median * 1000:.0f} ms, max {max(walls) * 1000:.0f} ms "
            f"({args.ticks} ticks); per job {median / args.jobs * 1e3:.2f} ms"
        )
        if args.profile:
            import cProfile
            import pstats

            cloud.run_to(cloud.now() + timedelta(minutes=1))
            prof = cProfile.Profile()
            prof.runcall(engine.tick)
            pstats.Stats(prof).sort_stats("cumulative").print_stats(25)
        db.dispose()


if __name__ == "__main__":
    main()
