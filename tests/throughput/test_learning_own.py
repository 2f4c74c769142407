"""A job without any catalog entry (given by its own ``throughput``) learns its speed from its progress and is
extended to the other GPUs by the estimator; a registered job type's learnt measurement refits its estimates."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import Engine

from api.planning import catalog_at, learn, own_job_catalog, reset
from costopt.jobs.model import JobState
from costopt.jobs.rebalance import Outcome, Rebalancer
from costopt.jobs.records import NewJob
from costopt.migration.decision import MigrationRule
from costopt.throughput.estimate import AcceleratorSpec
from costopt.throughput.learning import ThroughputLearner, own_catalog
from costopt.throughput.model import JobType
from costopt.throughput.registry import Measurement, MeasurementRegistry, own_job_type
from pricing.store import PriceStore
from tests.throughput.sim_support import A100, SHAPES, V100, planner_settings, priced, sim_rig


def test_own_catalog_replaces_the_users_figure_and_extends_only_what_was_learnt(
    specs: dict[str, AcceleratorSpec],
) -> None:
    jt = own_job_type("j1")
    given = {"v100": 10.0, "l4": 4.0}
    before = own_catalog(jt, given, [], gpus=2, precision="fp32", specs=specs)
    assert {k.accelerator for k in before.cells} == {"v100", "l4"}  # nothing learnt: the figures as given
    learnt = [
        Measurement(jt, "v100", 2, 4.0, source="job:j1:fp32"),
        Measurement(jt, "v100", 2, 6.0, n_measurements=3, source="job:j1:fp32"),
        Measurement(jt, "v100", 1, 99.0, source="job:j1:fp32"),  # another GPU count: not this job's
    ]
    after = own_catalog(jt, given, learnt, gpus=2, precision="fp32", specs=specs)
    v100, l4, a100 = after.get(jt, "v100", 2), after.get(jt, "l4", 2), after.get(jt, "a100", 2)
    assert v100 is not None and v100.provenance == "user" and v100.steps_per_s == pytest.approx(5.5)  # (4 + 18) / 4
    assert l4 is not None and l4.steps_per_s == 4.0  # the user's figure where nothing was learnt
    assert a100 is not None and a100.is_estimate and a100.estimator == "family-calibrated"
    assert a100.interval is not None and a100.interval[0] < a100.steps_per_s < a100.interval[1]
    # the estimate scales with what was learnt, not with the user's figures
    ratio = a100.steps_per_s / v100.steps_per_s
    doubled = own_catalog(jt, {"l4": 1.0}, [Measurement(jt, "v100", 2, 11.0)], gpus=2, precision="fp32", specs=specs)
    assert doubled.get(jt, "a100", 2).steps_per_s == pytest.approx(11.0 * ratio)  # type: ignore[union-attr]
    amp = own_catalog(jt, {}, [Measurement(jt, "v100", 2, 11.0)], gpus=2, precision="amp", specs=specs)
    assert amp.get(jt, "a100", 2).steps_per_s != pytest.approx(11.0 * ratio)  # type: ignore[union-attr]
    assert own_catalog(jt, given, learnt, gpus=2, precision="fp32", specs=None).get(jt, "a100", 2) is None


def test_a_job_given_by_its_own_throughput_is_learnt_extended_and_moved(
    engine: Engine, tmp_path: Path, shared_data: Path, fresh_planner: None, specs: dict[str, AcceleratorSpec]
) -> None:
    """The user gives a V100 figure only (the simulated agent runs the job at it: its
    ``COSTOPT_STEPS_PER_SECOND``). The job runs there; after its first hour of progress the V100 cell is its
    measured speed and the A100 (30% cheaper per step under the estimate) has an estimate with an interval:
    the planner ranks it first and the rebalancer moves the job."""
    settings = planner_settings(engine, shared_data)
    store = PriceStore(engine)
    probe = own_job_type("probe")
    ratio = own_catalog(probe, {}, [Measurement(probe, "v100", 1, 1.0)], gpus=1, precision="fp32", specs=specs)
    a100_per_v100 = ratio.get(probe, "a100").steps_per_s  # type: ignore[union-attr]
    prices = priced(store, {V100: 3.06, A100: round(3.06 * a100_per_v100 * 0.7, 4)}, SHAPES)
    learnt: list[Measurement] = []

    def on_measurement(m: Measurement) -> None:
        learnt.append(m)
        learn(m)  # as the service does

    learner = ThroughputLearner(MeasurementRegistry(engine), window_s=3600, on_measurement=on_measurement)
    rig = sim_rig(engine, store, settings, prices, learner, tmp_path / "ckpt")
    cloud, planner, repo, jobs = rig.cloud, rig.planner, rig.repo, rig.jobs
    spec = {"command": ["python", "train.py"], "throughput": {"v100": 4.0}, "gpus": 1, "checkpoint_gb": 10}
    job, _ = repo.create(NewJob(team_id="t", spec=spec, steps_total=200_000, provider="sim"))

    def run(until: Callable[[], bool]) -> None:
        rig.run(until, lambda: repo.events(job.id))

    run(lambda: repo.get(job.id).state is JobState.RUNNING)
    assert repo.get(job.id).offer == V100  # the only GPU it has a figure for
    assert [p.offer for p in planner.rank(repo.get(job.id), remaining_steps=100_000, at=cloud.now())] == [V100]
    rebalancer = Rebalancer(repo, planner, jobs.move, MigrationRule(), cloud.now)
    [stay] = rebalancer.run_once(dry_run=True).items
    assert stay.outcome is Outcome.STAYED

    started = cloud.now()
    run(lambda: bool(learnt))
    assert cloud.now() - started <= timedelta(hours=1, minutes=30)  # its first hour of progress
    (m,) = learnt
    jt = own_job_type(job.id)
    assert (m.job_type, m.accelerator, m.gpu_count, m.source) == (jt, "v100", 1, f"job:{job.id}:fp32")
    assert m.steps_per_s == pytest.approx(4.0, rel=0.05)  # boot and restore left out
    assert catalog_at(settings, store).get(jt, "v100") is None  # the shared catalog does not carry it
    _, own = own_job_catalog(settings, store, job.id, spec["throughput"], 1, "fp32")  # type: ignore[arg-type]
    v100, a100 = own.get(jt, "v100"), own.get(jt, "a100")
    assert v100 is not None and v100.steps_per_s == m.steps_per_s and v100.n_measurements == 1  # replaced the 4.0
    assert a100 is not None and a100.is_estimate and a100.interval is not None
    assert a100.steps_per_s == pytest.approx(m.steps_per_s * a100_per_v100)
    ranked = planner.rank(repo.get(job.id), remaining_steps=100_000, at=cloud.now())
    assert [p.offer for p in ranked] == [A100, V100]  # the planner reads it at once
    assert ranked[0].steps_per_s == pytest.approx(a100.steps_per_s)

    [moved] = rebalancer.run_once(dry_run=False).items
    assert moved.outcome is Outcome.MOVED, moved.reason
    assert (moved.from_offer, moved.to_offer) == (V100, A100)
    assert repo.get(job.id).offer == A100


def test_a_registered_job_types_learnt_measurement_moves_its_estimates(
    engine: Engine, shared_data: Path, fresh_planner: None
) -> None:
    """A job type registered on one GPU only (no file cell): a job's measurement there moves the estimates
    of the other GPUs with it at once, as a rebuild would; a measurement on a second GPU refits them (the
    catalog is rebuilt at its next use). A file job type's estimates wait for the next rebuild."""
    settings = planner_settings(engine, shared_data)
    store = PriceStore(engine)
    mynet = JobType("MyNet", 32)
    registry = MeasurementRegistry(engine)
    registry.add(Measurement(mynet, "v100", 1, 8.0, source="user"))  # the user's claim, twice the truth
    before = catalog_at(settings, store)
    a100_before = before.get(mynet, "a100")
    assert a100_before is not None and a100_before.is_estimate and a100_before.interval is not None
    measured = Measurement(mynet, "v100", 1, 4.0, source="job:j9:fp32")
    registry.add(measured)
    learn(measured)
    after = catalog_at(settings, store)
    assert after is not before
    v100, a100 = after.get(mynet, "v100"), after.get(mynet, "a100")
    assert v100 is not None and v100.steps_per_s == pytest.approx(6.0) and v100.n_measurements == 2
    assert a100 is not None and a100.is_estimate and a100.interval is not None
    assert a100.steps_per_s == pytest.approx(a100_before.steps_per_s * 6.0 / 8.0, rel=1e-9)
    assert a100.interval[0] == pytest.approx(a100_before.interval[0] * 0.75, rel=1e-9)
    resnet = "ResNet-50 (batch size 64)"
    assert after.get(resnet, "a100") == before.get(resnet, "a100")  # other job types untouched
    reset()
    rebuilt = catalog_at(settings, store).get(mynet, "a100")  # what a rebuild gives it: the same
    assert rebuilt is not None and rebuilt.steps_per_s == pytest.approx(a100.steps_per_s, rel=1e-6)
    h100_one_gpu = catalog_at(settings, store).get(mynet, "h100")
    on_a100 = Measurement(mynet, "a100", 1, 20.0, source="job:j9:fp32")  # its next copy, on an A100
    registry.add(on_a100)
    learn(on_a100)
    two = catalog_at(settings, store)
    cell, h100 = two.get(mynet, "a100"), two.get(mynet, "h100")
    assert cell is not None and cell.steps_per_s == 20.0 and not cell.is_estimate
    assert h100 is not None and h100.is_estimate and h100_one_gpu is not None
    assert h100.steps_per_s > h100_one_gpu.steps_per_s  # refitted on the faster A100 too
