"""The simulated cloud runs a catalog job at the catalog's throughput for the job's precision (its "true"
speed): an amp Transformer on an A100 runs at its amp estimate, as its plan expects, not at fp32 speed."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import Engine

from api.job_planning import JobPlanner
from api.planning import catalog_at, reset
from api.wiring import build_sim_throughput
from costopt.domain import Cloud, InstanceType, Market, OfferKey, PricePoint
from costopt.jobs.engine import JobEngine
from costopt.jobs.model import JobState
from costopt.jobs.records import JobRepository, NewJob
from costopt.ledger.sql import SqlLedger
from costopt.migration.machine import Migrator
from costopt.migration.unavailable import UnavailableOffers
from costopt.risk.hazard import HazardModel
from costopt.settings import Settings
from costopt.simulated import WorkloadTiming
from costopt.throughput.learning import ThroughputLearner, engine_observer
from costopt.throughput.registry import Measurement
from pricing.store import PriceStore
from providers.sim import SimCloud, SimConfig
from tests.price_support import step_prices

START = datetime(2020, 3, 1, tzinfo=UTC)
A100 = OfferKey(Cloud.AWS, "us-east-1", "us-east-1a", "x.a100", Market.ON_DEMAND)
SHAPES = {("aws", "x.a100"): ("a100", 1.0)}
JT = "Transformer (batch size 64)"


@pytest.fixture
def fresh_planner() -> Iterator[None]:
    reset()
    yield
    reset()


def test_jobs_run_on_the_sim_at_the_throughput_of_their_precision(
    engine: Engine, tmp_path: Path, shared_data: Path, fresh_planner: None
) -> None:
    settings = Settings(
        database_url=engine.url.render_as_string(hide_password=False),
        data_dir=shared_data,
        seed_on_start=False,
        collectors_enabled=False,
    )
    store = PriceStore(engine)
    store.upsert_instance_types([InstanceType(Cloud.AWS, "x.a100", "a100", 1, 8, 61)])
    store.write([PricePoint(A100, START - timedelta(days=1), 4.1, "test")])
    prices = step_prices([(A100, START - timedelta(days=1), 4.1)], SHAPES)
    cloud = SimCloud(
        prices,
        HazardModel(defaults=dict.fromkeys(Cloud, 0.0)),
        start=START,
        config=SimConfig(timing=WorkloadTiming(checkpoint_interval=timedelta(minutes=30))),
        rate=build_sim_throughput(settings, prices, engine),  # the service's: the catalog at each precision
    )
    migrator = Migrator(
        engine,
        cloud,
        sleep=cloud.sleeper(),
        now=cloud.now,
        poll_seconds=2.0,
        hook=lambda point: None,
        ledger=SqlLedger(engine, prices),
        unavailable=UnavailableOffers(engine, clock=cloud.now),
        **cloud.migrator_timeouts(),  # type: ignore[arg-type]
    )
    planner = JobPlanner(store, settings, now=cloud.now)
    learnt: dict[str, Measurement] = {}
    learner = ThroughputLearner(None, window_s=1800, on_measurement=lambda m: learnt.setdefault(m.source, m))
    repo = JobRepository(engine, now=cloud.now)
    jobs = JobEngine(
        repo,
        {"sim": migrator},
        planner,
        cloud.now,
        tmp_path / "ckpt",
        workers=0,
        retry_base=0,
        progress_observer=engine_observer(learner, prices.shape),
    )
    ids = {}
    for precision in ("fp32", "amp"):
        spec = {"command": ["python", "train.py"], "job_type": JT, "precision": precision, "checkpoint_gb": 1}
        job, _ = repo.create(NewJob(team_id="t", spec=spec, steps_total=10_000_000, provider="sim"))
        ids[precision] = job.id
    for _ in range(30):
        jobs.tick()
        if len(learnt) == 2:
            break
        cloud.run_to(cloud.now() + timedelta(minutes=10))
    assert {repo.get(i).state for i in ids.values()} == {JobState.RUNNING}, learnt
    speeds = {}
    for precision, job_id in ids.items():
        assert migrator.job(job_id).env["COSTOPT_PRECISION"] == precision
        cell = catalog_at(settings, store, precision).get(JT, "a100")
        assert cell is not None and cell.is_estimate
        [placed] = planner.rank(repo.get(job_id), remaining_steps=1e6, at=cloud.now())
        assert placed.offer == A100 and placed.steps_per_s == pytest.approx(cell.steps_per_s)  # what plans expect
        seen = learnt[f"job:{job_id}:{precision}"].steps_per_s  # what the simulated job did
        assert seen == pytest.approx(cell.steps_per_s, rel=0.05), precision
        speeds[precision] = seen
    assert speeds["amp"] > 1.5 * speeds["fp32"]  # a matmul-bound model on an A100's FP16 tensor cores
