"""Precision as a job attribute: plans (REST and CLI), the job body, and ``costopt throughput list``."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from pydantic import ValidationError
from sqlalchemy import Engine
from typer.testing import CliRunner

from api.app import create_app
from api.cli.main import app as cli
from api.job_schemas import JobCreate
from costopt.domain import Cloud, InstanceType, Market, OfferKey, PricePoint
from costopt.planning.model import InvalidJob, JobSpec
from costopt.settings import Settings, get_settings
from costopt.throughput.model import JobType
from pricing.store import PriceStore

T0 = datetime(2020, 3, 1, tzinfo=UTC)
TRANSFORMER = "Transformer (batch size 64)"


@pytest.fixture
def client(engine: Engine, shared_data: Path) -> Iterator[TestClient]:
    settings = Settings(
        database_url=engine.url.render_as_string(hide_password=False),
        data_dir=shared_data,
        seed_on_start=False,
        collectors_enabled=False,
        clock="auto",
    )
    app = create_app(settings)
    with TestClient(app) as c:
        store = PriceStore(engine)
        app.state.store = store
        store.upsert_instance_types([InstanceType(Cloud.AWS, "p3.2xlarge", "v100", 1, 8, 61)])
        key = OfferKey(Cloud.AWS, "us-east-1", "us-east-1a", "p3.2xlarge", Market.SPOT)
        store.write([PricePoint(key, T0, 0.95, "t")])
        yield c


def _plan(client: TestClient, **extra: object) -> dict[str, object]:
    body = {"job_type": TRANSFORMER, "steps": 100000, "at": "2020-03-01T06:00:00Z", **extra}
    r = client.post("/v1/plans", json=body)
    assert r.status_code == 200, r.text
    plan: dict[str, object] = r.json()
    return plan


def test_a_plan_at_amp_uses_the_mixed_precision_estimate_and_says_so(client: TestClient) -> None:
    default = _plan(client)
    amp = _plan(client, precision="amp")
    tf32 = _plan(client, precision="tf32")
    assert (default["precision"], amp["precision"], tf32["precision"]) == ("fp32", "amp", "tf32")
    w_default, w_amp, w_tf32 = (p["winner"] for p in (default, amp, tf32))
    assert isinstance(w_default, dict) and isinstance(w_amp, dict) and isinstance(w_tf32, dict)
    # fp32 and tf32 on a V100 compute alike: Gavel's FP32 measurement; amp: estimated, faster
    assert w_default["steps_per_s"] == pytest.approx(8.618, rel=1e-3)
    assert w_default["throughput_estimated"] is False
    assert w_tf32["steps_per_s"] == w_default["steps_per_s"]
    assert w_amp["throughput_estimated"] is True
    assert w_amp["steps_per_s"] > 1.5 * w_default["steps_per_s"]


def test_an_unknown_precision_is_a_422_naming_the_field(client: TestClient) -> None:
    r = client.post("/v1/plans", json={"job_type": TRANSFORMER, "steps": 5, "precision": "int8"})
    assert r.status_code == 422
    assert "precision" in r.text


def test_the_job_body_and_the_job_spec_take_a_precision() -> None:
    body = {"job_type": TRANSFORMER, "steps": 10, "command": ["python", "train.py"]}
    assert JobCreate.model_validate(body).precision == "fp32"
    assert JobCreate.model_validate({**body, "precision": "amp"}).precision == "amp"
    with pytest.raises(ValidationError, match="precision"):
        JobCreate.model_validate({**body, "precision": "fp8"})
    assert JobSpec(JobType("Transformer", 64), 10).precision == "fp32"
    with pytest.raises(InvalidJob, match="precision"):
        JobSpec(JobType("Transformer", 64), 10, precision="fp8")  # type: ignore[arg-type]


def test_throughput_list_at_a_precision(shared_data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COSTOPT_DATA_DIR", str(shared_data))
    monkeypatch.setenv("COSTOPT_DATABASE_URL", f"sqlite:///{tmp_path / 'cli.db'}")
    get_settings.cache_clear()
    try:
        runner = CliRunner()
        rows = {}
        for precision in ("fp32", "amp"):
            args = ["throughput", "list", "--job-type", TRANSFORMER, "--gpu", "v100", "--gpus", "1", "-f", "json"]
            result = runner.invoke(cli, [*args, "--precision", precision])
            assert result.exit_code == 0, result.output
            (rows[precision],) = json.loads(result.stdout)
        assert rows["fp32"]["provenance"] == "measured" and rows["fp32"]["precision"] == "fp32"
        assert rows["amp"]["provenance"] == "estimated" and rows["amp"]["estimator"] == "family-calibrated"
        assert rows["amp"]["steps_per_s"] > rows["fp32"]["steps_per_s"]
        bad = runner.invoke(cli, ["throughput", "list", "--precision", "int4"])
        assert bad.exit_code == 2
    finally:
        get_settings.cache_clear()
