"""REST savings reports: the service's own baselines (the planner's on-demand pick in the home region, the
quote's static spot), team scoping (another team's job id: 404), bad input (422), and one total across
JSON, the FOCUS CSV, the FOCUS Parquet and a direct SQL sum of the ledger (both backends)."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from sqlalchemy import Engine, text

from costopt.reports.focus import FOCUS_COLUMNS, X_COLUMNS
from tests.api.jobs_helpers import Service, error_of, service
from tests.api.report_helpers import bill

pytestmark = pytest.mark.one_backend_each  # the database is not the subject here: tests/conftest.py

D = Decimal


@pytest.fixture
def svc(engine: Engine, tmp_path: Path) -> Iterator[Service]:
    yield from service(engine, tmp_path)


@pytest.fixture
def billed(svc: Service) -> dict[str, Any]:
    return bill(svc)


def _get(svc: Service, headers: dict[str, str], **params: Any) -> Any:
    return svc.client.get("/v1/reports/savings", params=params, headers=headers)


def test_a_team_sees_its_jobs_against_the_planners_on_demand_pick_and_its_quotes_spot(
    svc: Service, billed: dict[str, Any]
) -> None:
    r = _get(svc, svc.alpha, **{"from": billed["from"]})
    assert r.status_code == 200, r.text
    doc = r.json()
    assert [j["job_id"] for j in doc["jobs"]] == [billed["a"]["id"]] and doc["team"] == svc.alpha_team
    job = doc["jobs"][0]
    od = job["baselines"]["on_demand"]
    assert od["available"] and od["offer"] == {
        "cloud": "aws", "region": "us-east-1", "zone": "", "instance_type": "p3.2xlarge", "market": "on_demand",
    }  # fmt: skip
    assert od["hours"] == pytest.approx(50_000 / od["steps_per_s"] / 3600, abs=1e-6)
    assert abs(D(od["cost"]) - D("3.06") * D(repr(od["hours"]))) < D("0.00001")
    st = job["baselines"]["static_spot"]
    quoted = billed["a"]["quote"]
    assert (
        st["available"]
        and st["offer"]["market"] == "spot"
        and st["steps_per_s"] == pytest.approx(quoted["steps_per_s"])
    )
    # actual: 4 h at 0.95 + 2 h at 1.05 (the price change at T0+5h inside the interval)
    assert D(job["run"]["actual_cost"]) == D("5.9") == D(doc["totals"]["actual_cost"])
    assert D(doc["totals"]["savings"]) == D(od["cost"]) - D("5.9")
    assert job["link"] == f"/v1/jobs/{billed['a']['id']}"


def test_scoping_another_teams_job_is_404_and_its_team_403(svc: Service, billed: dict[str, Any]) -> None:
    a, b = billed["a"]["id"], billed["b"]["id"]
    err = error_of(_get(svc, svc.alpha, job=b), 404, "not_found")
    assert b in err["message"]
    assert _get(svc, svc.alpha, job="job-0000000000000000").status_code == 404
    error_of(_get(svc, svc.alpha, team=svc.beta_team), 403, "forbidden")
    mine = _get(svc, svc.alpha, job=a, **{"from": billed["from"]}).json()
    assert [j["job_id"] for j in mine["jobs"]] == [a]
    every = _get(svc, svc.admin, group_by="team", **{"from": billed["from"]}).json()
    assert sorted(j["job_id"] for j in every["jobs"]) == sorted([a, b])
    assert {g["key"]["team"] for g in every["groups"]} == {svc.alpha_team, svc.beta_team}
    beta = _get(svc, svc.admin, team="beta", **{"from": billed["from"]}).json()  # by name
    assert [j["job_id"] for j in beta["jobs"]] == [b] and beta["jobs"][0]["state"] == "running"
    error_of(_get(svc, svc.admin, team="nobody"), 404, "not_found")


def test_bad_input_is_a_422_that_says_what_to_fix(svc: Service, billed: dict[str, Any]) -> None:
    assert "ISO 8601" in error_of(_get(svc, svc.alpha, **{"from": "last tuesday"}), 422)["message"]
    assert "choose from" in error_of(_get(svc, svc.alpha, group_by="colour"), 422)["message"]
    assert (
        "give to > from" in error_of(_get(svc, svc.alpha, **{"from": "2020-03-02", "to": "2020-03-01"}), 422)["message"]
    )
    error_of(_get(svc, svc.alpha, format="xlsx"), 422)
    assert svc.client.get("/v1/reports/savings").status_code == 401


def test_the_jobs_are_listed_a_page_at_a_time_in_the_order_asked_and_every_job_counts(
    svc: Service, billed: dict[str, Any]
) -> None:
    a, b = billed["a"]["id"], billed["b"]["id"]
    since = {"from": billed["from"]}
    every = _get(svc, svc.admin, **since).json()
    assert every["jobs_page"] == {"sort": "job_id", "offset": 0, "limit": 100, "total": 2, "next_offset": None}
    first = _get(svc, svc.admin, limit=1, **since).json()
    assert [j["job_id"] for j in first["jobs"]] == [min(a, b)] and first["jobs_page"]["next_offset"] == 1
    assert first["totals"] == every["totals"] and first["groups"] == every["groups"] and first["by"] == every["by"]
    assert first["teams"] == every["teams"]  # the scope's teams, not the page's
    second = _get(svc, svc.admin, limit=1, offset=1, **since).json()
    assert [j["job_id"] for j in second["jobs"]] == [max(a, b)] and second["jobs_page"]["next_offset"] is None
    assert second["jobs"][0] == next(j for j in every["jobs"] if j["job_id"] == max(a, b))
    assert _get(svc, svc.admin, offset=5, **since).json()["jobs"] == []
    costs = {j["job_id"]: D(j["period"]["actual_cost"]) for j in every["jobs"]}
    assert costs[a] != costs[b]
    cheapest_first = sorted(costs, key=costs.__getitem__)

    def order(sort: str) -> list[str]:
        return [j["job_id"] for j in _get(svc, svc.admin, sort=sort, **since).json()["jobs"]]

    assert order("actual_cost") == cheapest_first and order("-actual_cost") == cheapest_first[::-1]
    # the top savers carry their own figures: the CLI's table needs no job of the page
    saver = every["top_savers"][0]
    assert saver["period"] == next(j["period"] for j in every["jobs"] if j["job_id"] == saver["job_id"])
    err = error_of(_get(svc, svc.admin, sort="cost"), 422, "invalid_request")
    assert "choose from job_id, name, team" in err["message"] and err["details"][0]["field"] == "query.sort"
    error_of(_get(svc, svc.admin, limit=0), 422)
    error_of(_get(svc, svc.admin, limit=1001), 422)
    error_of(_get(svc, svc.admin, offset=-1), 422)
    lines = _get(svc, svc.admin, format="csv", limit=1, **since).text  # an export holds every job's lines
    assert {a, b} <= {r["x_JobId"] for r in csv.DictReader(io.StringIO(lines))}


def test_totals_agree_across_json_csv_parquet_and_the_ledgers_sql_sum(svc: Service, billed: dict[str, Any]) -> None:
    params = {"from": billed["from"], "group_by": "day,cloud"}
    doc = _get(svc, svc.admin, **params).json()
    totals = doc["totals"]
    rows = list(csv.DictReader(io.StringIO(_get(svc, svc.admin, format="csv", **params).text)))
    assert list(rows[0]) == [*FOCUS_COLUMNS, *X_COLUMNS]
    assert sum(D(r["BilledCost"]) for r in rows) == D(totals["actual_cost"])
    assert sum(D(r["x_BaselineOnDemandCost"]) for r in rows) == D(totals["baseline_on_demand_cost"])
    assert sum(D(r["x_BaselineStaticSpotCost"]) for r in rows) == D(totals["baseline_static_spot_cost"])
    assert sum(D(r["x_Savings"]) for r in rows) == D(totals["savings"])
    assert {r["PricingCategory"] for r in rows} == {"Dynamic"} and {r["ServiceCategory"] for r in rows} == {"Compute"}
    assert {r["ServiceProviderName"] for r in rows} == {"Amazon Web Services"}
    resp = _get(svc, svc.admin, format="parquet", **params)
    assert resp.headers["content-type"] == "application/vnd.apache.parquet"
    table = pq.read_table(io.BytesIO(resp.content))
    assert table.num_rows == len(rows)
    assert sum(table.column("BilledCost").to_pylist()) == D(totals["actual_cost"])
    assert sum(g["actual_cost"] and D(g["actual_cost"]) for g in doc["days"]) == D(totals["actual_cost"])
    # alpha's job is closed: its total is the ledger's stored amounts, summed in SQL
    alpha = _get(svc, svc.admin, team=svc.alpha_team, **{"from": billed["from"]}).json()["totals"]
    with svc.store.engine.connect() as conn:
        micro = conn.execute(
            text(
                "SELECT (SELECT SUM(amount_micro_usd) FROM ledger_intervals WHERE team = :t)"
                " + (SELECT COALESCE(SUM(amount_micro_usd), 0) FROM ledger_charges WHERE team = :t AND additive)"
            ),
            {"t": svc.alpha_team},
        ).scalar_one()
    assert D(alpha["actual_cost"]) == D(int(micro)).scaleb(-6)


def test_the_cli_prints_and_writes_every_format(
    svc: Service, billed: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from typer.testing import CliRunner

    import api.cli.jobs as cli_jobs
    from api.cli.main import app
    from api.client import ApiClient

    key = svc.admin["Authorization"].removeprefix("Bearer ")
    monkeypatch.setattr(
        cli_jobs, "_client", lambda: ApiClient("http://testserver", key, transport=svc.client._transport)
    )
    runner = CliRunner()
    base = ["report", "savings", "--from", billed["from"], "--group-by", "team,month"]
    doc = json.loads(runner.invoke(app, [*base, "--format", "json"]).stdout)
    assert D(doc["totals"]["actual_cost"]) > 0 and doc["group_by"] == ["team", "month"]
    table = runner.invoke(app, [*base, "--format", "table"])
    assert table.exit_code == 0 and "Savings" in table.stdout and "Top savers" in table.stdout
    out = runner.invoke(app, [*base, "--format", "csv"]).stdout
    assert sum(D(r["BilledCost"]) for r in csv.DictReader(io.StringIO(out))) == D(doc["totals"]["actual_cost"])
    for fmt, magic in (("parquet", b"PAR1"), ("png", b"\x89PNG"), ("html", b"<!doctype html>")):
        path = tmp_path / f"r.{fmt}"
        result = runner.invoke(app, [*base, "--format", fmt, "--output", str(path)])
        assert result.exit_code == 0, result.output
        assert path.read_bytes().startswith(magic)
    assert runner.invoke(app, [*base, "--format", "png"]).exit_code == 2  # binary without --output
    assert runner.invoke(app, [*base, "--job", "job-0000000000000000"]).exit_code == 4
    assert runner.invoke(app, [*base, "--group-by", "colour"]).exit_code == 2


def test_a_job_whose_baseline_is_kept_is_read_without_its_quote_and_reports_the_same(
    svc: Service, billed: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The static-spot choice depends only on the quote at submission: kept per job after the first report,
    so the next reports read the job without its quote (~2 KB of JSON a job, every request); they say the
    same. A choice dropped from the cache meanwhile is made again from the quote read then."""
    import costopt.reports.data as data_mod

    first = _get(svc, svc.alpha, **{"from": billed["from"]}).json()
    job_id = billed["a"]["id"]
    baselines = svc.app.state.report_baselines
    assert baselines.needs_quote(job_id) is False
    read: list[Any] = []
    load = data_mod.load_report_data
    evict = False

    def spy(*args: Any, **kw: Any) -> Any:
        got = load(*args, **kw)
        if job_id in got.jobs:  # the report reads a batch of jobs at a time
            read.append(got.jobs[job_id].quote)
        if evict:  # dropped from the cache between the read and the report
            baselines._spot.clear()
        return got

    monkeypatch.setattr(data_mod, "load_report_data", spy)
    again = _get(svc, svc.alpha, **{"from": billed["from"]}).json()
    assert read == [None]  # read without it
    assert again["jobs"] == first["jobs"] and again["totals"] == first["totals"]
    evict = True  # then the quote is read for that job alone and the choice is the same
    evicted = _get(svc, svc.alpha, **{"from": billed["from"]}).json()
    assert read[-1] is None and evicted["jobs"] == first["jobs"]
    assert first["jobs"][0]["baselines"]["static_spot"]["available"]
    baselines.quote_of = None  # without a way to read it, the baseline would be lost: the test can fail
    baselines._spot.clear()
    evict = False
    _get(svc, svc.alpha, **{"from": billed["from"]})  # reads the quote (not cached), caches the choice
    evict = True
    lost = _get(svc, svc.alpha, **{"from": billed["from"]}).json()
    assert not lost["jobs"][0]["baselines"]["static_spot"]["available"]
