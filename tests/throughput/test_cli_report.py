"""``costopt throughput report``: measured (users, jobs) vs the catalog's prior, per job type and GPU."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from api.cli.main import app
from api.wiring import build_store
from costopt.settings import get_settings
from costopt.throughput.model import JobType
from costopt.throughput.registry import Measurement, MeasurementRegistry, job_source, source_precision

runner = CliRunner()
JT = JobType("Transformer", 64)


@pytest.fixture
def env(shared_data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[MeasurementRegistry]:
    monkeypatch.setenv("COSTOPT_DATA_DIR", str(shared_data))
    monkeypatch.setenv("COSTOPT_DATABASE_URL", f"sqlite:///{tmp_path / 'cli.db'}")
    get_settings.cache_clear()
    yield MeasurementRegistry(build_store(get_settings()).engine)
    get_settings.cache_clear()


def test_report_shows_measured_against_the_prior_and_how_far_off(env: MeasurementRegistry) -> None:
    assert runner.invoke(app, ["throughput", "report", "-f", "json"]).exit_code == 4  # nothing measured yet
    env.add(Measurement(JT, "a100", 1, 6.0, source=job_source("j1", "fp32")))
    env.add(Measurement(JT, "a100", 1, 7.0, n_measurements=2, source=job_source("j2", "fp32")))
    env.add(Measurement(JT, "v100", 1, 9.0, source="user"))
    env.add(Measurement(JobType("MyNet", 32), "l4", 1, 3.0, source=job_source("j3", "amp")))
    result = runner.invoke(app, ["throughput", "report", "-f", "json"])
    assert result.exit_code == 0, result.output
    rows = {(r["job_type"], r["accelerator"], r["precision"]): r for r in json.loads(result.stdout)}
    a100 = rows[(JT.name, "a100", "fp32")]
    assert a100["measured_steps_per_s"] == pytest.approx((6.0 + 2 * 7.0) / 3) and a100["windows"] == 3
    assert a100["prior"] == "family-calibrated" and a100["prior_low"] < a100["prior_steps_per_s"] < a100["prior_high"]
    assert a100["measured_over_prior"] == pytest.approx(a100["measured_steps_per_s"] / a100["prior_steps_per_s"], 1e-3)
    v100 = rows[(JT.name, "v100", "fp32")]
    assert v100["prior"] == "measured" and v100["prior_steps_per_s"] == pytest.approx(8.618, rel=1e-3)
    mynet = rows[("MyNet (batch size 32)", "l4", "amp")]  # a model measured nowhere else: no prior
    assert mynet["prior"] == "none" and mynet["measured_over_prior"] is None


def test_report_holdout_prints_the_older_markdown_report(env: MeasurementRegistry) -> None:
    result = runner.invoke(app, ["throughput", "report", "--holdout"])
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("# Throughput estimator error")


def test_a_registration_names_its_precision(env: MeasurementRegistry) -> None:
    args = ["throughput", "register", "--job-type", JT.name, "--gpu", "a100", "--steps-per-s", "20"]
    assert runner.invoke(app, [*args, "--precision", "amp", "--source", "lab"]).exit_code == 0
    (m,) = env.all()
    assert m.source == "lab:amp"
    assert source_precision("lab:amp") == "amp" and source_precision("lab") == "fp32"
    assert source_precision("lab:x") == "fp32"  # not a precision: PyTorch's default
    assert runner.invoke(app, [*args, "--precision", "fp8"]).exit_code == 2
