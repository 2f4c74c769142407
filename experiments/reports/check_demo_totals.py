"""A filled database's savings totals in JSON, both FOCUS exports (CSV, Parquet), the HTML report and a direct
SQL sum of the ledger, compared (issue 13: they agree to the cent for the demo month; tests/api/test_demo.py
checks the same on a smaller demo).

Run: ``.venv/bin/costopt demo --teams 3 --days 30 --seed 0 --database-url sqlite:///var/demo.db`` then
``PYTHONPATH=. .venv/bin/python experiments/reports/check_demo_totals.py sqlite:///var/demo.db``.
Exit 0 when all agree, 1 otherwise.
"""

from __future__ import annotations

import csv
import io
import os
import sys
from decimal import Decimal

LEDGER_SUM = (
    "SELECT (SELECT COALESCE(SUM(amount_micro_usd), 0) FROM ledger_intervals)"
    " + (SELECT COALESCE(SUM(amount_micro_usd), 0) FROM ledger_charges WHERE additive)"
)
PERIOD = {"from": "2019-12-01", "to": "2020-03-01", "group_by": "team"}


def main(url: str) -> bool:
    import pyarrow.parquet as pq
    from fastapi.testclient import TestClient
    from sqlalchemy import text

    from api.app import create_app
    from api.planning import reset
    from costopt.jobs.teams import Role
    from costopt.reports.charts import report_html
    from costopt.settings import Settings

    settings = Settings(database_url=url, seed_on_start=False, collectors_enabled=False, migration_jobs_enabled=False)
    reset()
    with TestClient(create_app(settings)) as client:
        app = client.app
        if app.state.sim_clock is not None:  # type: ignore[attr-defined]
            app.state.sim_clock.stop()  # type: ignore[attr-defined]
        teams = app.state.teams  # type: ignore[attr-defined]
        admin = {"Authorization": f"Bearer {teams.create_key(teams.create_team('totals-check').id, Role.ADMIN).secret}"}
        doc = client.get("/v1/reports/savings", params=PERIOD, headers=admin).json()
        csv_body = client.get("/v1/reports/savings", params={**PERIOD, "format": "csv"}, headers=admin).content
        parquet_body = client.get("/v1/reports/savings", params={**PERIOD, "format": "parquet"}, headers=admin).content
        with app.state.store.engine.connect() as conn:  # type: ignore[attr-defined]
            sql = Decimal(int(conn.execute(text(LEDGER_SUM)).scalar_one())).scaleb(-6)
    as_json = Decimal(doc["totals"]["actual_cost"])
    as_csv = sum((Decimal(r["BilledCost"]) for r in csv.DictReader(io.StringIO(csv_body.decode()))), Decimal(0))
    column = pq.read_table(io.BytesIO(parquet_body), columns=["BilledCost"]).column("BilledCost").to_pylist()
    as_parquet = sum(column, Decimal(0))
    html_ok = f"Spent <b>${sql:,.2f}</b>" in report_html(doc)
    ok = sql == as_json == as_csv == as_parquet and html_ok
    print(f"SQL {sql} JSON {as_json} CSV {as_csv} Parquet {as_parquet} HTML to the cent {html_ok}; all equal: {ok}")
    return ok


if __name__ == "__main__":
    agree = main(sys.argv[1])
    sys.stdout.flush()
    os._exit(0 if agree else 1)  # the app's scheduler threads are not waited for
