"""The simulated cloud runs a catalog job at the catalog's throughput for the job's precision (its "true"
speed): an amp Transformer on an A100 runs at its amp estimate, as its plan expects, not at fp32 speed."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import Engine

from api.planning import catalog_at
from api.wiring import build_sim_throughput
from costopt.jobs.model import JobState
from costopt.jobs.records import NewJob
from costopt.throughput.learning import ThroughputLearner
from costopt.throughput.model import Precision
from costopt.throughput.registry import Measurement
from pricing.store import PriceStore
from tests.throughput.sim_support import A100, planner_settings, priced, sim_rig

SHAPES = {("aws", "x.a100"): ("a100", 1.0)}
JT = "Transformer (batch size 64)"


def test_jobs_run_on_the_sim_at_the_throughput_of_their_precision(
    engine: Engine, tmp_path: Path, shared_data: Path, fresh_planner: None
) -> None:
    settings = planner_settings(engine, shared_data)
    store = PriceStore(engine)
    prices = priced(store, {A100: 4.1}, SHAPES)
    learnt: dict[str, Measurement] = {}

    def learn(m: Measurement) -> None:
        learnt.setdefault(m.source, m)

    learner = ThroughputLearner(None, window_s=1800, on_measurement=learn)
    # the service's true speeds: the catalog at each precision
    rate = build_sim_throughput(settings, prices, engine)
    rig = sim_rig(engine, store, settings, prices, learner, tmp_path / "ckpt", rate=rate)
    migrator, planner, repo = rig.migrator, rig.planner, rig.repo
    ids: dict[Precision, str] = {}
    precisions: tuple[Precision, ...] = ("fp32", "amp")
    for precision in precisions:
        spec = {"command": ["python", "train.py"], "job_type": JT, "precision": precision, "checkpoint_gb": 1}
        job, _ = repo.create(NewJob(team_id="t", spec=spec, steps_total=10_000_000, provider="sim"))
        ids[precision] = job.id
    rig.run(lambda: len(learnt) == 2, lambda: learnt, ticks=30)
    assert {repo.get(i).state for i in ids.values()} == {JobState.RUNNING}, learnt
    speeds = {}
    for precision, job_id in ids.items():
        assert migrator.job(job_id).env["COSTOPT_PRECISION"] == precision
        cell = catalog_at(settings, store, precision).get(JT, "a100")
        assert cell is not None and cell.is_estimate
        [placed] = planner.rank(repo.get(job_id), remaining_steps=1e6, at=rig.cloud.now())
        assert placed.offer == A100 and placed.steps_per_s == pytest.approx(cell.steps_per_s)  # what plans expect
        seen = learnt[f"job:{job_id}:{precision}"].steps_per_s  # what the simulated job did
        assert seen == pytest.approx(cell.steps_per_s, rel=0.05), precision
        speeds[precision] = seen
    assert speeds["amp"] > 1.5 * speeds["fp32"]  # a matmul-bound model on an A100's FP16 tensor cores
