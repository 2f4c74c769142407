"""``costopt throughput calibrate``: the cross-validation table in every format."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from api.cli.main import app
from costopt.settings import get_settings

runner = CliRunner()


@pytest.fixture
def data_dir(shared_data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.setenv("COSTOPT_DATA_DIR", str(shared_data))
    monkeypatch.setenv("COSTOPT_DATABASE_URL", f"sqlite:///{tmp_path / 'cli.db'}")
    get_settings.cache_clear()
    yield shared_data
    get_settings.cache_clear()


def test_calibrate_prints_one_row_per_family_with_both_estimators_as_json(data_dir: Path) -> None:
    result = runner.invoke(app, ["throughput", "calibrate", "--by-family", "--format", "json"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    assert {r["family"] for r in rows} == {"convolutional", "recommendation", "recurrent", "transformer"}
    for r in rows:
        assert r["gpu"] == "all" and r["cells"] > 0
        assert 1.0 <= r["calibrated_median"] <= r["calibrated_max"] <= 2.0
        assert 1.0 <= r["baseline_median"] <= r["baseline_max"]
        assert r["meets_target"] is True
    assert "targets" in result.stderr and ": met" in result.stderr
