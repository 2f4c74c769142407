"""``costopt report savings``: the savings report from the service's REST API (``GET /v1/reports/savings``).

``--format``: ``table`` (totals, the groups, top savers, jobs over a baseline), ``json`` (the API's
document), ``csv`` and ``parquet`` (the FinOps FOCUS export, one line per price segment and UTC day),
``html`` (a self-contained page with the charts) and ``png`` (the charts, for mail). Binary formats
(``parquet``, ``png``) need ``--output``; the others print to stdout unless given one. Exit codes: 0 done,
1 the service failed or cannot be reached, 2 bad arguments (also input the service rejected), 4 no such
job or team.
"""

from __future__ import annotations

import json
import sys
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer

from api.cli.jobs import _api
from api.cli.output import OutputFormat, emit, emit_object, note

app = typer.Typer(
    help="Reports for finance: savings against on-demand and static-spot baselines.", no_args_is_help=True
)


class ReportFormat(StrEnum):
    table = "table"
    json = "json"
    csv = "csv"
    parquet = "parquet"
    html = "html"
    png = "png"


_GROUP_COLUMNS: list[tuple[str, str, str | None]] = [
    ("actual_cost", "actual", "USD"),
    ("baseline_on_demand_cost", "on-demand baseline", "USD"),
    ("baseline_static_spot_cost", "static spot baseline", "USD"),
    ("savings", "savings", "USD"),
    ("savings_rate", "rate", "%"),
    ("savings_vs_static_spot", "vs static spot", "USD"),
]


def _money_rows(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Decimal strings as floats for the table (the exact strings are in json/csv)."""
    out = []
    for item in items:
        row = dict(item)
        for key, _h, unit in _GROUP_COLUMNS:
            if unit in ("USD", "%") and row.get(key) is not None:
                row[key] = float(row[key])
        out.append(row)
    return out


def _table(doc: dict[str, Any]) -> None:
    totals = doc["totals"]
    emit_object(
        {
            "period (UTC)": f"{doc['from']} to {doc['to']}",
            "as of": doc["as_of"],
            "jobs": totals["jobs"],
            "actual cost (USD)": totals["actual_cost"],
            "on-demand baseline (USD)": totals["baseline_on_demand_cost"],
            "static spot baseline (USD)": totals["baseline_static_spot_cost"],
            "savings vs on-demand (USD)": totals["savings"],
            "savings rate vs on-demand": totals["savings_rate"],
            "savings vs static spot (USD)": totals["savings_vs_static_spot"],
            "moves cost (USD, included)": totals["move_cost"],
            "preemptions cost (USD, included)": totals["preemption_cost"],
            "cost without a baseline (USD)": totals["actual_cost_without_baseline"],
        },
        OutputFormat.table,
        title="Savings",
    )
    dims = doc["group_by"]
    names = doc.get("teams", {})
    rows = [
        {**{d: names.get(g["key"][d], g["key"][d]) if d == "team" else g["key"][d] for d in dims}, **g}
        for g in doc["groups"]
    ]
    emit(
        _money_rows(rows),
        [(d, d, None) for d in dims] + _GROUP_COLUMNS,
        OutputFormat.table,
        title="By " + ", ".join(dims),
    )
    top = [{"job": t["job_id"], "name": t["name"], **t["period"]} for t in doc["top_savers"]]
    if top:
        emit(
            _money_rows(top),
            [("job", "job", None), ("name", "name", None), *_GROUP_COLUMNS],
            OutputFormat.table,
            title="Top savers",
        )
    over = [
        {
            "job": o["job_id"],
            "baselines": ", ".join(o["baselines"]),
            "excess": float(o["excess"]),
            "reason": o["reason"],
        }
        for o in doc["over_baseline"]
    ]
    if over:
        emit(
            over,
            [("job", "job", None), ("baselines", "over", None), ("excess", "by", "USD"), ("reason", "mostly", None)],
            OutputFormat.table,
            title="Jobs that cost more than a baseline",
        )
    for w in doc.get("warnings", []):
        note(f"[yellow]warning:[/yellow] {w}")


def _write(data: bytes | str, output: Path | None) -> None:
    if output is None:
        if isinstance(data, bytes):
            sys.stdout.buffer.write(data)
        else:
            sys.stdout.write(data)
        return
    try:
        if isinstance(data, bytes):
            output.write_bytes(data)
        else:
            output.write_text(data)
    except OSError as exc:
        raise typer.BadParameter(f"cannot write {output}: {exc.strerror}", param_hint="--output") from exc
    note(f"wrote {output}")


@app.command("savings")
def savings(
    team: Annotated[str | None, typer.Option(help="One team (id or name; admin keys).")] = None,
    start: Annotated[
        str | None, typer.Option("--from", help="Period start, inclusive (UTC; default: 1st of the month).")
    ] = None,
    end: Annotated[str | None, typer.Option("--to", help="Period end, exclusive (UTC; default: now).")] = None,
    group_by: Annotated[
        str,
        typer.Option("--group-by", help="Comma-separated: team, job, cloud, region, accelerator, market, day, month."),
    ] = "team",
    job: Annotated[list[str] | None, typer.Option("--job", help="Only this job (repeat for several).")] = None,
    top: Annotated[int, typer.Option(help="How many top savers to list.")] = 10,
    sort: Annotated[
        str,
        typer.Option(help="json, html: the jobs' order (job_id, savings, actual_cost, ...; '-' first: descending)."),
    ] = "job_id",
    offset: Annotated[int, typer.Option(help="json, html: jobs skipped before the page.")] = 0,
    limit: Annotated[int, typer.Option(help="json, html: jobs listed (1-1000; the totals count every job).")] = 100,
    fmt: Annotated[ReportFormat, typer.Option("--format", "-f")] = ReportFormat.table,
    output: Annotated[
        Path | None, typer.Option("--output", "-o", help="Write to this file (needed for parquet, png).")
    ] = None,
) -> None:
    """What the jobs cost, against on-demand and static-spot baselines priced over each job's run."""
    if fmt in (ReportFormat.parquet, ReportFormat.png) and output is None:
        raise typer.BadParameter(f"--format {fmt.value} is binary: give --output FILE", param_hint="--output")
    params: dict[str, Any] = {"team": team, "from": start, "to": end, "group_by": group_by, "top": top, "job": job}
    if fmt not in (ReportFormat.csv, ReportFormat.parquet):  # the exports hold every line
        params.update(sort=sort, offset=offset, limit=limit)
    with _api() as api:
        if fmt in (ReportFormat.csv, ReportFormat.parquet):
            data = api.download("/v1/reports/savings", params={**params, "format": fmt.value})
            _write(data if fmt is ReportFormat.parquet else data.decode("utf-8"), output)
            return
        doc = api.request("GET", "/v1/reports/savings", params=params)
    if fmt is ReportFormat.json:
        _write(json.dumps(doc, indent=2) + "\n", output)
    elif fmt is ReportFormat.table:
        _table(doc)
    else:
        from costopt.reports.charts import charts_png, report_html

        _write(charts_png(doc) if fmt is ReportFormat.png else report_html(doc), output)
