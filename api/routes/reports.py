"""``/v1/reports/savings``: what the jobs cost against their baselines (an API key is required).

Scope: a member sees its own team's report only (``?team=`` naming another team: 403); a job id in
``?job=`` that the caller may not see answers 404, the same as an unknown id. An admin sees every team
(``?team=`` by id or name filters). The period is ``[from, to)`` in UTC (a bare date is its 00:00);
default: from the first day of the service's current month to now (the service's clock: simulated time
over the simulated cloud). ``format``: ``json`` (default), ``csv`` or ``parquet`` (FinOps FOCUS columns and
``x_`` columns, one line per price segment and UTC day; ``BilledCost`` sums to ``totals.actual_cost``).
How every figure is made: docs/ledger.md, "Reports".
"""

from __future__ import annotations

import logging
from dataclasses import replace
from datetime import UTC, datetime
from enum import StrEnum
from typing import Annotated, Any, cast

from fastapi import APIRouter, Query, Request, Response

from api.auth import Caller, CallerDep, TeamsDep
from api.deps import JobPlannerDep, JobsDep, SettingsDep
from api.errors import ApiError
from api.routes.jobs import get_job
from costopt.domain import parse_utc
from costopt.errors import BadRecord
from costopt.jobs.records import JobRepository
from costopt.jobs.teams import TeamRepository
from costopt.ledger.prices import PriceView
from costopt.reports.model import JOB_SORTS, JobPage
from costopt.settings import Settings

log = logging.getLogger("costopt.api")

router = APIRouter(prefix="/v1/reports", tags=["reports"])

DEFAULT_JOBS_PAGE = 100
MAX_JOBS_PAGE = 1000
"""The JSON report lists a page of its jobs (default and largest): its memory and size follow the page."""


class ReportFormat(StrEnum):
    json = "json"
    csv = "csv"
    parquet = "parquet"


def _time(value: str | None, name: str) -> datetime | None:
    if value is None or not value.strip():
        return None
    try:
        return parse_utc(value)
    except BadRecord as exc:
        raise ApiError(
            422,
            "invalid_request",
            f"{name}={value!r} is not a time: use ISO 8601, e.g. 2020-03-01 or 2020-03-01T12:00:00Z",
            [{"field": f"query.{name}", "problem": str(exc)}],
        ) from exc


def _scope(caller: Caller, teams: TeamRepository, team: str | None) -> str | None:
    """The team the report is limited to: the member's own; an admin's ``team`` (id or name; None: all)."""
    if team is None or not team.strip():
        return caller.scope
    found = teams.team(team) or teams.team_by_name(team)
    if not caller.is_admin:
        if found is None or found.id != caller.team_id:
            raise ApiError(403, "forbidden", "a member key sees its own team's report only: drop ?team=")
        return caller.team_id
    if found is None:
        raise ApiError(404, "not_found", f"no team {team!r}: `costopt admin teams` lists them")
    return found.id


def _job_ids(values: list[str] | None) -> tuple[str, ...] | None:
    if not values:
        return None
    ids = [p.strip() for v in values for p in v.split(",") if p.strip()]
    return tuple(dict.fromkeys(ids)) or None


def _baselines(request: Request, planner: Any, settings: Settings, teams: TeamRepository, jobs: JobRepository) -> Any:
    from api.report_baselines import PlannerBaselines
    from costopt.reports.references import ReferenceRules

    names = {t.id: t.name for t in teams.teams()}
    current = getattr(request.app.state, "report_baselines", None)
    if current is None or current.planner is not planner:
        current = PlannerBaselines(
            planner, ReferenceRules(settings.report_baselines), names, quote_of=lambda job_id: jobs.get(job_id).quote
        )
        request.app.state.report_baselines = current
    current.team_names = names
    return current


def build_savings(
    request: Request,
    caller: Caller,
    *,
    jobs: JobRepository,
    teams: TeamRepository,
    planner: Any,
    settings: Settings,
    team: str | None,
    start: str | None,
    end: str | None,
    group_by: str | None,
    job: list[str] | None,
    top: int,
    page: JobPage | None = None,
) -> tuple[Any, dict[str, str]]:
    """The report the caller asked for, and the team names (id -> name) of its scope. ``page``: the
    :class:`~costopt.reports.model.JobPage` of jobs to list, folded without keeping the rows (the JSON
    answer); None: every job and every row (the exports)."""
    from costopt.reports import ReportError, ReportQuery, build_report
    from costopt.reports.data import iter_report_data, report_scope

    ledger = getattr(request.app.state, "ledger", None)
    if ledger is None:
        raise ApiError(503, "unavailable", "the ledger is not ready yet; retry shortly")
    scope = _scope(caller, teams, team)
    ids = _job_ids(job)
    for job_id in ids or ():
        get_job(jobs, caller, job_id)  # 404 for a job the caller may not see
    now = jobs.now().astimezone(UTC)
    t_end = _time(end, "to") or now
    t_start = _time(start, "from") or datetime(t_end.year, t_end.month, 1, tzinfo=UTC)
    dims = tuple(d.strip().lower() for d in (group_by or "team").split(",") if d.strip())
    try:
        query = ReportQuery(start=t_start, end=t_end, team=scope, group_by=dims, job_ids=ids, top=top)
    except ReportError as exc:
        raise ApiError(422, "invalid_request", str(exc)) from exc
    baselines = _baselines(request, planner, settings, teams, jobs)
    covered = report_scope(ledger, team=scope)
    if ids is not None:  # only the jobs asked for are read
        wanted = set(ids)
        covered = replace(covered, job_ids=tuple(j for j in covered.job_ids if j in wanted))
    # read and folded a batch of jobs at a time; a job whose static-spot baseline is cached is read
    # without its quote (~2 KB of JSON a job)
    batches = iter_report_data(ledger.engine, ledger, covered, team=scope, needs_quote=baselines.needs_quote)
    from costopt.reports.standing import StandingOnDemand

    # the on-demand baseline reads an on-demand list price as standing back in time (docs/ledger.md)
    prices = StandingOnDemand(cast(PriceView, ledger.prices))
    window = None
    if covered.first_start is not None and covered.last_start is not None:
        window = (covered.first_start, covered.last_start)
    report = build_report(
        batches, query, prices=prices, baselines=baselines, now=now, window=window, keep_rows=page is None, page=page
    )
    names = baselines.team_names  # every team's, read once for this request by _baselines
    return report, {t: names.get(t, t) for t in report.teams}


@router.get(
    "/savings",
    summary="Savings against on-demand and static-spot baselines",
    responses={
        200: {
            "description": "the report (format=json), or its FOCUS export (csv, parquet)",
            "content": {
                "application/json": {"schema": {"type": "object"}},
                "text/csv": {"schema": {"type": "string"}},
                "application/vnd.apache.parquet": {"schema": {"type": "string", "format": "binary"}},
            },
        }
    },
)
def savings(
    request: Request,
    caller: CallerDep,
    jobs: JobsDep,
    teams: TeamsDep,
    planner: JobPlannerDep,
    settings: SettingsDep,
    team: Annotated[str | None, Query(max_length=200, description="Admins: one team (id or name).")] = None,
    start: Annotated[
        str | None,
        Query(alias="from", max_length=64, description="Period start, inclusive (UTC; default: 1st of the month)."),
    ] = None,
    end: Annotated[
        str | None, Query(alias="to", max_length=64, description="Period end, exclusive (UTC; default: now).")
    ] = None,
    group_by: Annotated[
        str | None,
        Query(
            max_length=200, description="Comma-separated: team, job, cloud, region, accelerator, market, day, month."
        ),
    ] = None,
    job: Annotated[list[str] | None, Query(description="Only these job ids (repeat, or comma-separated).")] = None,
    top: Annotated[int, Query(ge=1, le=1000, description="How many top savers to list.")] = 10,
    sort: Annotated[
        str,
        Query(
            max_length=64,
            description="JSON: the jobs' order, one of " + ", ".join(JOB_SORTS) + "; '-' first for descending.",
        ),
    ] = "job_id",
    offset: Annotated[int, Query(ge=0, le=10_000_000, description="JSON: jobs skipped before the page.")] = 0,
    limit: Annotated[int, Query(ge=1, le=MAX_JOBS_PAGE, description="JSON: jobs listed (the totals count all).")] = (
        DEFAULT_JOBS_PAGE
    ),
    fmt: Annotated[ReportFormat, Query(alias="format", description="json, or a FOCUS export: csv, parquet.")] = (
        ReportFormat.json
    ),
) -> Any:
    """Actual cost from the ledger, the on-demand and static-spot baselines priced over each job's run,
    savings and rates, grouped as asked, with a page of the jobs (``sort``, ``offset``, ``limit``; the
    answer's ``jobs_page`` says how many there are); or every line as a FOCUS export."""
    from costopt.reports import ReportError, report_doc
    from costopt.reports.focus import focus_records, to_csv, to_parquet

    page = None
    if fmt is ReportFormat.json:
        try:
            page = JobPage.parse(sort, offset=offset, limit=limit)
        except ReportError as exc:
            raise ApiError(422, "invalid_request", str(exc), [{"field": "query.sort", "problem": str(exc)}]) from exc
    report, names = build_savings(
        request, caller, jobs=jobs, teams=teams, planner=planner, settings=settings, team=team, start=start,
        end=end, group_by=group_by, job=job, top=top, page=page,
    )  # fmt: skip
    if fmt is ReportFormat.json:
        return report_doc(report, team_names=names)
    stem = f"costopt-savings-{report.query.start:%Y%m%d}-{report.query.end:%Y%m%d}"
    records = focus_records(report, names)
    if fmt is ReportFormat.csv:
        return Response(
            to_csv(records),
            media_type="text/csv; charset=utf-8",
            headers={"Content-Disposition": f'attachment; filename="{stem}.csv"'},
        )
    return Response(
        to_parquet(records),
        media_type="application/vnd.apache.parquet",
        headers={"Content-Disposition": f'attachment; filename="{stem}.parquet"'},
    )
