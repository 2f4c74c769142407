"""The costopt command line: formats, exit codes, import all-or-nothing, seeding."""

from __future__ import annotations

import csv
import io
import json
import shutil
import sqlite3
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path

import pytest
from typer.testing import CliRunner

from api.cli.main import app
from costopt.settings import get_settings

runner = CliRunner()


@pytest.fixture
def db(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    url = f"sqlite:///{tmp_path / 'cli.db'}"
    monkeypatch.setenv("COSTOPT_DATABASE_URL", url)
    get_settings.cache_clear()
    yield url
    get_settings.cache_clear()


def _invoke(*args: str) -> tuple[int, str, str]:
    result = runner.invoke(app, list(args))
    return result.exit_code, result.stdout, result.stderr


@pytest.fixture(scope="session")
def seeded_template(tmp_path_factory: pytest.TempPathFactory, shared_data: Path) -> Path:
    """A SQLite store seeded from the real data folder by ``costopt prices seed``, once per test process
    (seeding imports every price file: seconds); tests read copies of it (:func:`seeded_db`).
    ``test_latest_at_a_2020_time_lists_real_v100_prices_as_json`` seeds an empty store itself."""
    path = tmp_path_factory.mktemp("seeded") / "seeded.db"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("COSTOPT_DATABASE_URL", f"sqlite:///{path}")
        get_settings.cache_clear()
        code, _, err = _invoke("prices", "seed", "--data-dir", str(shared_data))
        get_settings.cache_clear()
    assert code == 0, err
    with closing(sqlite3.connect(path)) as conn:  # WAL: fold the log into the file the tests copy
        busy, _, _ = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
    assert busy == 0
    return path


@pytest.fixture
def seeded_db(seeded_template: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A copy of :func:`seeded_template` as the CLI's database."""
    target = tmp_path / "cli.db"
    shutil.copyfile(seeded_template, target)
    url = f"sqlite:///{target}"
    monkeypatch.setenv("COSTOPT_DATABASE_URL", url)
    get_settings.cache_clear()
    yield url
    get_settings.cache_clear()


def test_latest_at_a_2020_time_lists_real_v100_prices_as_json(db: str, shared_data: Path) -> None:
    code, out, _ = _invoke(
        "prices",
        "latest",
        "--gpu",
        "v100",
        "--market",
        "spot",
        "--at",
        "2020-03-01T00:00:00Z",
        "--data-dir",
        str(shared_data),
        "--format",
        "json",
    )
    assert code == 0
    rows = json.loads(out)
    assert isinstance(rows, list) and rows
    required = {
        "cloud",
        "region",
        "zone",
        "instance_type",
        "market",
        "accelerator",
        "gpu_count",
        "usd_per_hour",
        "valid_from",
    }
    assert required <= set(rows[0])
    prices = [r["usd_per_hour"] for r in rows]
    assert prices == sorted(prices)
    assert {r["accelerator"] for r in rows} == {"v100"}
    assert {r["cloud"] for r in rows} == {"aws", "azure"}  # Azure's sheet starts 2020-02-24
    p3 = [r for r in rows if r["instance_type"] == "p3.2xlarge" and r["zone"] == "us-east-1f"]
    assert p3 and 0.9 < p3[0]["usd_per_hour"] < 1.3


def test_latest_as_csv_has_a_header_row(seeded_db: str, shared_data: Path) -> None:
    code, out, _ = _invoke(
        "prices",
        "latest",
        "--cloud",
        "azure",
        "--at",
        "2020-03-10",
        "--limit",
        "3",
        "--data-dir",
        str(shared_data),
        "-f",
        "csv",
    )
    assert code == 0
    rows = list(csv.DictReader(io.StringIO(out)))
    assert len(rows) == 3 and rows[0]["cloud"] == "azure"


def test_latest_with_no_match_exits_4(seeded_db: str, shared_data: Path) -> None:
    code, _, _ = _invoke("prices", "latest", "--gpu", "h100", "--at", "2020-03-01", "--data-dir", str(shared_data))
    assert code == 4


def test_a_malformed_time_is_a_usage_error(db: str) -> None:
    code, _, err = _invoke("prices", "latest", "--at", "yesterday-ish")
    assert code == 2
    assert "Invalid value" in err


def test_import_of_a_bad_file_exits_1_names_the_line_and_stores_nothing(db: str, tmp_path: Path) -> None:
    bad = tmp_path / "aws.csv"
    bad.write_text(
        "timestamp_utc,region,availability_zone,instance_type,gpu_type,gpu_count,product_description,spot_usd_per_hour\n"
        "2020-01-01T00:00:00Z,us-east-1,us-east-1a,p3.2xlarge,v100,1,Linux/UNIX,0.9\n"
        "2020-01-02T00:00:00Z,us-east-1,us-east-1a,p3.2xlarge,v100,1,Linux/UNIX,cheap\n"
    )
    code, _, err = _invoke("prices", "import", str(bad))
    assert code == 1
    assert "line 3" in err and "cheap" in err
    code, out, _ = _invoke("db", "status", "-f", "json")
    assert code == 0 and json.loads(out)["price_points"] == 0


def test_import_of_a_readme_is_refused(db: str, shared_data: Path) -> None:
    code, _, err = _invoke("prices", "import", str(shared_data / "prices" / "README.md"))
    assert code == 1
    assert "not price data" in err.lower() or "README" in err


def test_import_reports_each_file_and_is_idempotent(db: str, shared_data: Path) -> None:
    path = str(shared_data / "prices" / "azure_spot_price_daily_2020-02_2020-03.csv")
    code, out, _ = _invoke("prices", "import", path, "-f", "json")
    assert code == 0
    first = json.loads(out)[0]
    assert first["status"] == "imported" and first["inserted"] > 0 and first["skipped_records"] == 232
    code, out, _ = _invoke("prices", "import", path, "-f", "json")
    assert code == 0 and json.loads(out)[0]["inserted"] == 0


def test_sources_lists_nothing_before_any_collection(db: str) -> None:
    code, out, _ = _invoke("prices", "sources", "-f", "json")
    assert code == 0 and json.loads(out) == []


def test_catalog_lists_instance_types_with_units(db: str) -> None:
    code, out, _ = _invoke("catalog", "list", "--gpu", "a100", "--cloud", "aws", "-f", "json")
    assert code == 0
    rows = json.loads(out)
    assert rows and all(r["accelerator"] in ("a100", "a100-80gb") or r["accelerator"] == "a100" for r in rows)
    assert all(r["cloud"] == "aws" for r in rows)


def test_history_lists_the_price_changes_of_an_offer(seeded_db: str, shared_data: Path) -> None:
    code, out, _ = _invoke(
        "prices",
        "history",
        "--cloud",
        "aws",
        "--region",
        "us-east-1",
        "--instance-type",
        "p3.2xlarge",
        "--market",
        "spot",
        "--from",
        "2020-03-01",
        "--to",
        "2020-03-08",
        "--data-dir",
        str(shared_data),
        "-f",
        "json",
    )
    assert code == 0
    rows = json.loads(out)
    assert rows and {r["instance_type"] for r in rows} == {"p3.2xlarge"}
    assert all(r["valid_from"] <= "2020-03-08" for r in rows)


def test_backtest_paper_prints_the_papers_rows_as_json(db: str, shared_data: Path) -> None:
    code, out, _ = _invoke("backtest", "paper", "--region", "us-east-1", "--job-days", "1", "-f", "json")
    assert code == 0
    rows = json.loads(out)
    assert {r["policy"] for r in rows} == {
        "baseline",
        "gpu_type",
        "multi_gpu",
        "multi_cloud",
        "dynamic",
        "dynamic_migration_cost",
    }
    assert {tuple(sorted(r)) for r in rows} == {("cost_reduction", "job_days", "model", "policy", "region")}
    base = [r for r in rows if r["policy"] == "baseline"]
    assert all(r["cost_reduction"] == 1.0 for r in base)
    dyn = {r["model"]: r["cost_reduction"] for r in rows if r["policy"] == "dynamic"}
    static = {r["model"]: r["cost_reduction"] for r in rows if r["policy"] == "multi_cloud"}
    assert sum(dyn.values()) >= sum(static.values())  # re-choosing daily with free moves helps on average


def test_plan_batch_plans_a_sweep_within_quotas(seeded_db: str, shared_data: Path) -> None:
    from costopt.settings import PROJECT_ROOT

    code, out, _ = _invoke(
        "plan-batch", str(PROJECT_ROOT / "examples" / "sweep.yaml"), "--data-dir", str(shared_data), "-f", "json"
    )
    assert code == 0
    plan = json.loads(out)
    assert plan["status"] == "optimal"
    assert sum(a["count"] for g in plan["groups"] for a in g["allocations"]) == 30
    assert all(q["gpus_used"] <= q["max_gpus"] for q in plan["quotas"])
    total = sum(a["cost_usd"] for g in plan["groups"] for a in g["allocations"])
    assert abs(total - plan["total_expected_cost_usd"]) < 0.05
    assert all(a["expected_hours"] <= 48 for g in plan["groups"] for a in g["allocations"])


def test_plan_batch_names_a_bad_field(db: str, tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("objective: {kind: sweep-min-cost, deadline: 48h}\njobs:\n  - {type: A3C, steps: -3}\n")
    code, _, err = _invoke("plan-batch", str(bad))
    assert code == 2
    assert "jobs.0.steps" in err


def test_plan_batch_reports_the_binding_constraint(seeded_db: str, shared_data: Path, tmp_path: Path) -> None:
    f = tmp_path / "tight.yaml"
    f.write_text(
        "objective: {kind: sweep-min-cost, deadline: 1h}\nat: 2020-03-01T00:00:00Z\n"
        "jobs:\n  - {type: 'ResNet-50 (batch size 128)', steps: 1000000, count: 3}\n"
    )
    code, _, err = _invoke("plan-batch", str(f), "--data-dir", str(shared_data))
    assert code == 4
    assert "deadline" in err


def test_plan_batch_plans_each_group_at_its_precision(seeded_db: str, shared_data: Path, tmp_path: Path) -> None:
    totals = {}
    for precision in ("fp32", "amp"):
        f = tmp_path / f"{precision}.yaml"
        f.write_text(
            "objective: {kind: min-total-cost}\nat: 2020-03-01T00:00:00Z\n"
            f"jobs:\n  - {{type: 'ResNet-50 (batch size 128)', steps: 100000, count: 2, precision: {precision}}}\n"
        )
        code, out, _ = _invoke("plan-batch", str(f), "--data-dir", str(shared_data), "-f", "json")
        assert code == 0
        totals[precision] = json.loads(out)["total_expected_cost_usd"]
    assert totals["amp"] < totals["fp32"]  # FP16 tensor cores: cheaper per step where the GPU has them
    bad = tmp_path / "bad.yaml"
    bad.write_text("objective: {kind: min-total-cost}\njobs:\n  - {type: A3C, steps: 3, precision: fp16}\n")
    code, _, err = _invoke("plan-batch", str(bad))
    assert code == 2 and "jobs.0.precision" in err


def test_backtest_job_runs_one_job_through_the_sim_and_the_ledger(db: str, shared_data: Path) -> None:
    code, out, _ = _invoke(
        "backtest",
        "job",
        "--job-type",
        "ResNet-50 (batch size 128)",
        "--steps",
        "200000",
        "--from",
        "2020-03-02",
        "--to",
        "2020-03-09",
        "--region",
        "us-east-1",
        "-f",
        "json",
    )
    assert code == 0
    result = json.loads(out)
    assert result["finished"] is True
    assert result["steps_done"] == 200000
    assert result["total_cost_usd"] > 0
