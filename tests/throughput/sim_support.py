"""The simulated cloud the learning tests run jobs on: prices for a few offers, the migrator, the job engine
with a throughput learner as its progress observer, and the planner the service would use."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from sqlalchemy import Engine

from api.job_planning import JobPlanner
from costopt.domain import Cloud, InstanceType, Market, OfferKey, PricePoint
from costopt.jobs.engine import JobEngine
from costopt.jobs.records import JobRepository
from costopt.ledger.prices import StepPrices
from costopt.ledger.sql import SqlLedger
from costopt.migration.machine import Migrator
from costopt.migration.unavailable import UnavailableOffers
from costopt.risk.hazard import HazardModel
from costopt.settings import Settings
from costopt.simulated import WorkloadTiming
from costopt.throughput.learning import ThroughputLearner, engine_observer
from pricing.store import PriceStore
from providers.sim import SimCloud, SimConfig
from providers.sim_agent import ThroughputFn
from tests.price_support import step_prices

START = datetime(2020, 3, 1, tzinfo=UTC)
V100 = OfferKey(Cloud.AWS, "us-east-1", "us-east-1a", "p3.2xlarge", Market.ON_DEMAND)
A100 = OfferKey(Cloud.AWS, "us-east-1", "us-east-1a", "x.a100", Market.ON_DEMAND)
SHAPES = {("aws", "p3.2xlarge"): ("v100", 1.0), ("aws", "x.a100"): ("a100", 1.0)}


def planner_settings(engine: Engine, data_dir: Path) -> Settings:
    """The service's settings over ``engine`` and the data in ``data_dir`` (no seeding, no collectors)."""
    return Settings(
        database_url=engine.url.render_as_string(hide_password=False),
        data_dir=data_dir,
        seed_on_start=False,
        collectors_enabled=False,
    )


def priced(
    store: PriceStore, price: Mapping[OfferKey, float], shapes: Mapping[tuple[str, str], tuple[str, float]]
) -> StepPrices:
    """``price`` (USD per instance-hour, in effect from a day before :data:`START`) written to ``store`` with
    the instance types of ``shapes``, and the same prices as the simulated cloud's step prices."""
    store.upsert_instance_types([InstanceType(Cloud.AWS, t, acc, int(g), 8, 61) for (_, t), (acc, g) in shapes.items()])
    since = START - timedelta(days=1)
    store.write([PricePoint(k, since, p, "test") for k, p in price.items()])
    return step_prices(((k, since, p) for k, p in price.items()), shapes)


@dataclass(frozen=True)
class SimRig:
    """The simulated cloud and the service's job side over it."""

    cloud: SimCloud
    migrator: Migrator
    planner: JobPlanner
    repo: JobRepository
    jobs: JobEngine

    def run(self, until: Callable[[], bool], why: Callable[[], object], ticks: int = 100) -> None:
        """Tick the engine, 10 simulated minutes apart, until ``until()``; after ``ticks`` ticks without it
        fail with ``why()``."""
        for _ in range(ticks):
            self.jobs.tick()
            if until():
                return
            self.cloud.run_to(self.cloud.now() + timedelta(minutes=10))
        raise AssertionError(why())


def sim_rig(
    engine: Engine,
    store: PriceStore,
    settings: Settings,
    prices: StepPrices,
    learner: ThroughputLearner,
    ckpt: Path,
    *,
    rate: ThroughputFn | None = None,
) -> SimRig:
    """A simulated cloud at :data:`START` (no preemptions, a checkpoint every 30 minutes; jobs' true speed
    from ``rate``, None: the simulated cloud's default), its migrator and ledger, the planner, and the job
    engine whose progress observer feeds ``learner`` (checkpoints under ``ckpt``)."""
    cloud = SimCloud(
        prices,
        HazardModel(defaults=dict.fromkeys(Cloud, 0.0)),
        start=START,
        config=SimConfig(timing=WorkloadTiming(checkpoint_interval=timedelta(minutes=30))),
        rate=rate,
    )
    unavailable = UnavailableOffers(engine, clock=cloud.now)
    migrator = Migrator(
        engine,
        cloud,
        sleep=cloud.sleeper(),
        now=cloud.now,
        poll_seconds=2.0,
        hook=lambda point: None,
        ledger=SqlLedger(engine, prices),
        unavailable=unavailable,
        **cloud.migrator_timeouts(),  # type: ignore[arg-type]
    )
    planner = JobPlanner(store, settings, unavailable=unavailable, now=cloud.now)
    repo = JobRepository(engine, now=cloud.now)
    jobs = JobEngine(
        repo,
        {"sim": migrator},
        planner,
        cloud.now,
        ckpt,
        workers=0,
        retry_base=0,
        progress_observer=engine_observer(learner, prices.shape),
    )
    return SimRig(cloud, migrator, planner, repo, jobs)
