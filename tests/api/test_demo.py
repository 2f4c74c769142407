"""``costopt demo`` (api/demo.py) on both backends, a few teams over a few days: every team's jobs are
submitted over REST and run to the end by the service's engine on the simulated cloud over the real 2020
AWS spot prices, and the savings report's totals equal a direct SQL sum of the ledger, whole and per team, in
JSON, both FOCUS exports (CSV, Parquet: to the micro-dollar) and the HTML report (to the cent).
A database with jobs already is refused, and a period past the data is refused before anything runs."""

from __future__ import annotations

import csv
import io
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, text

from api.app import create_app
from api.demo import DatabaseNotEmpty, DemoError, demo_jobs, fill_demo
from api.planning import reset
from api.wiring import seed_catalog
from costopt.jobs.teams import Role
from costopt.reports.charts import report_html
from costopt.settings import Settings
from pricing.importer import import_paths
from pricing.store import PriceStore

pytestmark = pytest.mark.one_backend_each  # the database is not the subject here: tests/conftest.py

AWS_SPOT_FILE = "aws_spot_price_history_2019-12_2020-03_p2_p3.csv"
START = datetime(2020, 1, 6, tzinfo=UTC)

_LEDGER_SUM = (
    "SELECT (SELECT COALESCE(SUM(amount_micro_usd), 0) FROM ledger_intervals {w})"
    " + (SELECT COALESCE(SUM(amount_micro_usd), 0) FROM ledger_charges {w2})"
)


def _url(engine: Engine) -> str:
    """The fixture's database as a URL the demo's own service opens (PostgreSQL: the test's schema)."""
    url = engine.url
    if url.get_backend_name() == "postgresql":
        with engine.connect() as conn:
            schema = conn.execute(text("SELECT current_schema()")).scalar_one()
        url = url.update_query_dict({"options": f"-csearch_path={schema}"})
    return url.render_as_string(hide_password=False)


def _settings(engine: Engine, shared_data: Path, tmp_path: Path) -> Settings:
    return Settings(
        database_url=_url(engine),
        data_dir=shared_data,
        seed_on_start=False,
        collectors_enabled=False,
        checkpoint_root=f"file://{tmp_path / 'checkpoints'}",
    )


def _billed_csv(data: bytes) -> Decimal:
    rows = list(csv.DictReader(io.StringIO(data.decode("utf-8"))))
    assert rows and all(r["BillingCurrency"] == "USD" for r in rows)
    return sum((Decimal(r["BilledCost"]) for r in rows), Decimal(0))


def _billed_parquet(data: bytes) -> Decimal:
    import pyarrow.parquet as pq

    column = pq.read_table(io.BytesIO(data), columns=["BilledCost"]).column("BilledCost").to_pylist()
    assert column and all(isinstance(v, Decimal) for v in column)  # decimal128, never float
    return sum(column, Decimal(0))


def _micro_sum(engine: Engine, team: str | None = None) -> Decimal:
    if team is None:
        sql = _LEDGER_SUM.format(w="", w2="WHERE additive")
    else:
        sql = _LEDGER_SUM.format(w="WHERE team = :t", w2="WHERE team = :t AND additive")
    with engine.connect() as conn:
        micro = conn.execute(text(sql), {"t": team}).scalar_one()
    return Decimal(int(micro)).scaleb(-6)


@pytest.mark.slow  # ~25 s a backend (the app's start-up twice, 9k spot points imported): run first
def test_the_demo_fills_each_teams_finished_jobs_and_the_report_sums_the_ledger(
    engine: Engine, shared_data: Path, tmp_path: Path
) -> None:
    settings = _settings(engine, shared_data, tmp_path)
    store = PriceStore(engine)  # the store the demo's service reads
    seed_catalog(store, settings)
    # the 2020 AWS spot history and the curated list prices (part of what `make run` seeds an empty store with)
    reports = import_paths(store, [shared_data / "prices" / AWS_SPOT_FILE, settings.catalog_dir / "list_prices.csv"])
    assert all(r.status not in ("failed", "refused") for r in reports), reports
    reset()
    try:
        result = fill_demo(settings, teams=2, days=2, seed=3, start=START, grace=timedelta(days=4))
        plan = demo_jobs(2, 2, 3, START)
        assert result.submitted == len(plan) and result.finished, result
        assert result.states == {"succeeded": len(plan)}
        assert result.started_at == START < result.ended_at <= START + timedelta(days=6)
        with engine.connect() as conn:
            by_team: dict[str, int] = dict(
                conn.execute(text("SELECT team_id, COUNT(*) FROM jobs GROUP BY team_id")).all()
            )
            states = {r[0] for r in conn.execute(text("SELECT DISTINCT state FROM jobs"))}
            quoted = conn.execute(text("SELECT COUNT(quote) FROM jobs")).scalar_one()  # planned by POST /v1/jobs
        assert (
            by_team == {result.teams[name]: sum(1 for j in plan if j.team == name) for name in result.teams}
            and len(by_team) == 2
        )
        assert states == {"succeeded"} and quoted == len(plan)
        assert _micro_sum(engine) > 0

        with pytest.raises(DatabaseNotEmpty):  # a second fill would mix two demos
            fill_demo(settings, teams=1, days=1, seed=0, start=START)

        # the reports, read over REST by an admin key
        reset()
        with TestClient(create_app(settings)) as client:
            app = client.app
            if app.state.sim_clock is not None:  # type: ignore[attr-defined]
                app.state.sim_clock.stop()  # type: ignore[attr-defined]
            teams = app.state.teams  # type: ignore[attr-defined]
            ops = teams.create_team("ops")
            admin = {"Authorization": f"Bearer {teams.create_key(ops.id, Role.ADMIN).secret}"}
            params = {"from": "2019-12-01", "to": "2020-03-01", "group_by": "team"}
            r = client.get("/v1/reports/savings", params=params, headers=admin)
            assert r.status_code == 200, r.text
            doc = r.json()
            exports = {}
            for fmt in ("csv", "parquet"):
                got = client.get("/v1/reports/savings", params={**params, "format": fmt}, headers=admin)
                assert got.status_code == 200, got.text
                exports[fmt] = got.content
        spent = _micro_sum(engine)
        assert Decimal(doc["totals"]["actual_cost"]) == spent
        # the same total, to the micro-dollar, in each FOCUS export, and to the cent on the HTML page for mail
        assert _billed_csv(exports["csv"]) == spent
        assert _billed_parquet(exports["parquet"]) == spent
        assert f"Spent <b>${spent:,.2f}</b>" in report_html(doc)
        # 2020 jobs get an on-demand baseline: the 2020-05-06 list prices taken as standing (docs/ledger.md)
        assert Decimal(doc["totals"]["baseline_on_demand_cost"]) > 0
        assert Decimal(doc["totals"]["actual_cost_without_baseline"]) == 0
        groups = {g["key"]["team"]: g for g in doc["groups"]}
        for team_id in result.teams.values():
            assert Decimal(groups[team_id]["actual_cost"]) == _micro_sum(engine, team_id) > 0
    finally:
        reset()


def test_the_demo_refuses_a_period_past_the_data_and_bad_counts(tmp_path: Path) -> None:
    settings = Settings(database_url=f"sqlite:///{tmp_path / 'x.db'}", seed_on_start=False)
    with pytest.raises(DemoError, match="after the seeded AWS spot history"):
        fill_demo(settings, days=30, start=datetime(2020, 3, 1, tzinfo=UTC))
    with pytest.raises(DemoError, match="--teams"):
        demo_jobs(0, 3, 0)
    assert not (tmp_path / "x.db").exists()  # refused before the service started


def test_the_cli_says_what_to_fix_on_a_period_past_the_data(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from api.cli.main import app

    url = f"sqlite:///{tmp_path / 'y.db'}"
    out = CliRunner().invoke(app, ["demo", "--start", "2020-03-10", "--days", "10", "--database-url", url])
    assert out.exit_code == 2, out.output
    assert "after the seeded AWS spot history" in out.output
    assert not (tmp_path / "y.db").exists()
