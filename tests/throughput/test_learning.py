"""Learning throughput from jobs' own progress: windows of a copy's log (boots and restores left out),
measurements per precision, and a job on the simulated cloud whose true speed is half the estimate."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from sqlalchemy import Engine

from api.planning import catalog_at, learn
from costopt.domain import Cloud, Market, OfferKey
from costopt.jobs.model import JobState
from costopt.jobs.rebalance import Outcome, Rebalancer
from costopt.jobs.records import NewJob
from costopt.migration.decision import MigrationRule
from costopt.throughput import ThroughputCatalog, estimate_catalog
from costopt.throughput.estimate import AcceleratorSpec
from costopt.throughput.learning import CopyLook, ThroughputLearner, engine_observer
from costopt.throughput.model import JobType, Precision
from costopt.throughput.registry import Measurement, MeasurementRegistry, own_job_type, source_precision
from pricing.store import PriceStore
from tests.throughput.sim_support import A100, SHAPES, V100, planner_settings, priced, sim_rig

JT = JobType("Transformer", 64)


class _Copy:
    """A copy's progress log as it grows, and the engine's looks at it (its last step and report)."""

    def __init__(self, job_id: str = "job-1", precision: Precision = "fp32") -> None:
        self.job_id, self.precision = job_id, precision
        self.records: list[dict[str, Any]] = []
        self.reads = 0

    def start(self, t: float, epoch: int = 1, run: str = "r1") -> None:
        self.records.append({"event": "start", "epoch": epoch, "run": run, "t": t})

    def step(self, step: int, t: float, epoch: int = 1, run: str = "r1") -> CopyLook:
        self.records.append({"event": "step", "epoch": epoch, "run": run, "step": step, "t": t})
        return self.look(epoch)

    def look(self, epoch: int = 1) -> CopyLook:
        seen = [r for r in self.records if r["epoch"] == epoch]
        steps = [r["step"] for r in seen if r["event"] == "step"]

        def reports() -> list[dict[str, Any]]:
            self.reads += 1
            return list(seen)

        return CopyLook(
            self.job_id,
            JT,
            "a100",
            1,
            self.precision,
            epoch,
            steps[-1] if steps else 0,
            seen[-1]["t"],
            reports,
        )


def test_a_window_is_measured_between_reports_of_one_epoch_never_across_a_restart() -> None:
    seen: list[Measurement] = []
    learner = ThroughputLearner(None, window_s=100, on_measurement=seen.append)
    copy = _Copy()
    copy.start(900.0)
    assert learner.observe(copy.step(500, 1000.0)) is None  # baseline: boot and restore came before it
    assert learner.observe(copy.step(800, 1060.0)) is None  # 60 s so far
    assert learner.observe(copy.look()) is None  # nothing new
    m = learner.observe(copy.step(1100, 1120.0))  # 120 s, 600 steps
    assert m is not None and m.steps_per_s == pytest.approx(5.0) and seen == [m]
    assert (m.accelerator, m.gpu_count, m.provenance, m.source) == ("a100", 1, "user", "job:job-1:fp32")
    # a new epoch (a move or a recovery): its first report is a baseline again, whatever its step
    copy.start(4900.0, epoch=2, run="r2")
    assert learner.observe(copy.step(900, 5000.0, epoch=2, run="r2")) is None
    m2 = learner.observe(copy.step(1900, 5100.0, epoch=2, run="r2"))
    assert m2 is not None and m2.steps_per_s == pytest.approx(10.0)
    assert learner.observe(copy.step(100, 5200.0, epoch=2, run="r2")) is None  # steps going back: a new baseline
    reads = copy.reads
    assert learner.observe(copy.look(epoch=2)) is None and copy.reads == reads  # its window cannot have ended
    m3 = learner.observe(copy.step(400, 5300.0, epoch=2, run="r2"))
    assert m3 is not None and m3.steps_per_s == pytest.approx(3.0) and seen == [m, m2, m3]
    with pytest.raises(ValueError):
        ThroughputLearner(None, window_s=0)


def test_the_learner_keeps_a_bounded_number_of_windows_dropping_the_stalest() -> None:
    learner = ThroughputLearner(None, window_s=100, max_windows=3)
    copies = {f"job-{i}": _Copy(f"job-{i}") for i in range(5)}
    for i, t in enumerate((10.0, 30.0, 20.0)):
        learner.observe(copies[f"job-{i}"].step(0, t))
    learner.observe(copies["job-3"].step(0, 40.0))  # job-0's window opened first, at 10 s
    assert sorted(learner._logged) == ["job-1", "job-2", "job-3"]
    # job-2's window ends (its next one opens at 120 s), then a fifth job drops the stalest: job-1 (30 s)
    assert learner.observe(copies["job-2"].step(1000, 120.0)) is not None
    learner.observe(copies["job-4"].step(0, 50.0))
    assert sorted(learner._logged) == ["job-2", "job-3", "job-4"]
    with pytest.raises(ValueError, match="max_windows"):
        ThroughputLearner(None, max_windows=0)


def test_a_jobs_measurement_is_folded_only_into_a_catalog_of_its_precision(engine: Engine) -> None:
    registry = MeasurementRegistry(engine)
    learner = ThroughputLearner(registry, window_s=10)
    copy = _Copy(precision="amp")
    learner.observe(copy.step(0, 0.0))
    learner.observe(copy.step(400, 20.0))
    (m,) = registry.all()
    assert source_precision(m.source) == "amp" and source_precision("user") == "fp32"
    base = ThroughputCatalog()
    assert registry.apply(base).get(JT, "a100") is None
    cell = registry.apply(base, "amp").get(JT, "a100")
    assert cell is not None and cell.steps_per_s == pytest.approx(20.0) and cell.provenance == "user"


def test_the_engine_observer_skips_what_it_cannot_attribute() -> None:
    looks: list[CopyLook] = []
    learner = SimpleNamespace(observe=looks.append)
    offer = OfferKey(Cloud.AWS, "us-east-1", "us-east-1a", "x.a100", Market.SPOT)
    observe = engine_observer(learner, {offer: ("A100", 1.0)}.get)  # type: ignore[arg-type]
    prog = SimpleNamespace(epoch=1, last_step=10, last_report_at=5.0)
    mj = SimpleNamespace(offer=offer, checkpoint_uri="memory://ckpt/j")
    observe(SimpleNamespace(id="j", spec={"steps": 10}), mj, prog)  # neither a job type nor its own throughput
    observe(SimpleNamespace(id="j", spec={"job_type": JT.name}), SimpleNamespace(offer=None), prog)
    observe(
        SimpleNamespace(id="j", spec={"job_type": JT.name}),
        mj,
        SimpleNamespace(**{**vars(prog), "last_report_at": None}),
    )
    observe(SimpleNamespace(id="j", spec={"job_type": JT.name, "precision": "bogus"}), mj, prog)  # logged, not raised
    assert looks == []
    observe(SimpleNamespace(id="j", spec={"job_type": JT.name, "gpus": 1, "precision": "tf32"}), mj, prog)
    assert looks == [CopyLook("j", JT, "a100", 1, "tf32", 1, 10, 5.0, list)]  # its log: not compared
    # a job given by its own throughput is learnt as its own job type
    observe(SimpleNamespace(id="k", spec={"throughput": {"a100": 3.0}, "gpus": 2, "precision": "amp"}), mj, prog)
    assert looks[1:] == [CopyLook("k", own_job_type("k"), "a100", 2, "amp", 1, 10, 5.0, list)]


# --- a job whose true speed on the A100 is half the estimate, on the simulated cloud -------------------------


def test_a_job_slower_than_its_estimate_is_measured_and_moved(
    engine: Engine, tmp_path: Path, shared_data: Path, fresh_planner: None
) -> None:
    settings = planner_settings(engine, shared_data)
    store = PriceStore(engine)
    estimated = catalog_at(settings, store)
    v100_rate = estimated.get(JT, "v100").steps_per_s  # type: ignore[union-attr]  # measured (Gavel)
    a100_cell = estimated.get(JT, "a100")
    assert a100_cell is not None and a100_cell.is_estimate
    # the A100 looks 10% cheaper per step than the V100 under the estimate; it truly runs at half the estimate
    price = {V100: 3.06, A100: round(3.06 * a100_cell.steps_per_s / v100_rate * 0.9, 4)}
    truth = {"v100": v100_rate, "a100": a100_cell.steps_per_s / 2}
    prices = priced(store, price, SHAPES)

    def true_rate(job_type: str, gpus: int, offer: OfferKey, precision: str) -> float | None:
        shape = prices.shape(offer)
        return truth[shape[0]] if shape is not None else None

    learnt: list[Measurement] = []

    def on_measurement(m: Measurement) -> None:
        learnt.append(m)
        learn(m)  # as the service does: the next plan, placement or rebalance reads the measurement

    learner = ThroughputLearner(MeasurementRegistry(engine), window_s=1800, on_measurement=on_measurement)
    rig = sim_rig(engine, store, settings, prices, learner, tmp_path / "ckpt", rate=true_rate)
    cloud, planner, repo, jobs = rig.cloud, rig.planner, rig.repo, rig.jobs
    spec = {"command": ["python", "train.py"], "job_type": JT.name, "gpus": 1, "checkpoint_gb": 10}
    job, _ = repo.create(NewJob(team_id="t", spec=spec, steps_total=400_000, provider="sim"))

    def run(until: Callable[[], bool]) -> None:
        rig.run(until, lambda: repo.events(job.id))

    run(lambda: repo.get(job.id).state is JobState.RUNNING)
    assert repo.get(job.id).offer == A100  # right only under the wrong estimate
    rebalancer = Rebalancer(repo, planner, jobs.move, MigrationRule(), cloud.now)
    [stay] = rebalancer.run_once(dry_run=True).items
    assert stay.outcome is Outcome.STAYED  # the estimate says it is where it should be

    run(lambda: bool(learnt))
    (m,) = learnt
    assert (m.job_type, m.accelerator, m.gpu_count) == (JT, "a100", 1)
    assert m.window is not None and m.window.startswith(f"job:{job.id}:fp32|e")  # a window of the copy's log
    assert m.steps_per_s == pytest.approx(truth["a100"], rel=0.05)  # boot and restore left out
    cell = catalog_at(settings, store).get(JT, "a100")
    assert cell is not None and cell.provenance == "user" and cell.steps_per_s == pytest.approx(m.steps_per_s)
    ranked = planner.rank(repo.get(job.id), remaining_steps=300_000, at=cloud.now())
    assert ranked[0].offer == V100  # the planner reads the measurement at once

    [moved] = rebalancer.run_once(dry_run=False).items
    assert moved.outcome is Outcome.MOVED, moved.reason
    assert (moved.from_offer, moved.to_offer) == (A100, V100)
    assert repo.get(job.id).offer == V100


def test_a_model_measured_on_one_gpu_only_is_extended_to_the_others(specs: dict[str, AcceleratorSpec]) -> None:
    mynet = JobType("MyNet", 32)
    catalog = ThroughputCatalog().with_measurement(mynet, "l4", 1, 3.0)  # e.g. its first window on an L4
    out = estimate_catalog(catalog, specs)
    for acc in ("a10", "a100", "h100"):
        cell = out.get(mynet, acc)
        assert cell is not None and cell.estimator == "family-calibrated" and cell.interval is not None, acc
    a100, h100 = out.get(mynet, "a100"), out.get(mynet, "h100")
    assert a100 is not None and h100 is not None
    assert 3.0 < a100.steps_per_s < h100.steps_per_s  # faster than the L4 in every feature
    assert out.get(mynet, "t4") is None  # 16 GB, less than the 24 GB it was measured on: it might not fit


def test_learn_folds_into_the_cached_catalog_or_drops_it_for_a_new_job_type(
    engine: Engine, shared_data: Path, fresh_planner: None
) -> None:
    settings = planner_settings(engine, shared_data)
    store = PriceStore(engine)
    registry = MeasurementRegistry(engine)
    before = catalog_at(settings, store)
    known = Measurement(JT, "a100", 1, 5.0, source="job:j1:fp32")
    registry.add(known)
    learn(known)
    after = catalog_at(settings, store)
    cell = after.get(JT, "a100")
    assert cell is not None and cell.provenance == "user" and cell.steps_per_s == 5.0
    assert after.get("CycleGAN", "a100") == before.get("CycleGAN", "a100")  # folded in, nothing refitted
    amp = Measurement(JT, "a100", 1, 9.0, source="job:j2:amp")
    learn(amp)  # no amp catalog is cached: nothing to do, nothing built
    assert catalog_at(settings, store).get(JT, "a100") == cell
    new = Measurement(JobType("MyNet", 32), "l4", 1, 3.0, source="job:j3:fp32")
    registry.add(new)
    learn(new)  # a job type the catalog does not know: rebuilt with estimates for it at the next use
    rebuilt = catalog_at(settings, store)
    assert rebuilt is not after
    l4, a100 = rebuilt.get("MyNet (batch size 32)", "l4"), rebuilt.get("MyNet (batch size 32)", "a100")
    assert l4 is not None and l4.provenance == "user"
    assert a100 is not None and a100.is_estimate


def test_an_amp_measurement_is_kept_at_amp_never_averaged_with_the_fp32_file(
    engine: Engine, shared_data: Path, fresh_planner: None
) -> None:
    settings = planner_settings(engine, shared_data)
    store = PriceStore(engine)
    MeasurementRegistry(engine).add(Measurement(JT, "v100", 1, 20.0, source="job:j1:amp"))
    amp = catalog_at(settings, store, "amp").get(JT, "v100")
    assert amp is not None and amp.provenance == "user" and amp.steps_per_s == 20.0 and amp.n_measurements == 1
    fp32 = catalog_at(settings, store).get(JT, "v100")
    assert fp32 is not None and fp32.provenance == "measured" and fp32.steps_per_s == pytest.approx(8.618, rel=1e-3)
    h100 = catalog_at(settings, store, "amp").get(JT, "h100")  # the job's own amp level carries to the H100
    assert h100 is not None and h100.is_estimate and h100.steps_per_s > 20.0
