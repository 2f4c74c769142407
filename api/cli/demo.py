"""``costopt demo``: fill the configured database with a month of several teams' jobs on the simulated cloud."""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import Annotated

import typer

from api.cli.common import Exit, failures, settings_with
from api.cli.output import OutputFormat, emit_object, note

QUIET_LOGGERS = ("costopt", "providers", "api", "pricing")


def demo(
    teams: Annotated[int, typer.Option(min=1, max=8, help="How many teams submit jobs.")] = 3,
    days: Annotated[int, typer.Option(min=1, max=80, help="Days over which the teams submit.")] = 30,
    seed: Annotated[int, typer.Option(help="Seed of the job mix (submission times, lengths, constraints).")] = 0,
    start: Annotated[
        datetime | None,
        typer.Option(help="Start of the period, UTC (default 2020-01-01, inside the seeded AWS spot history)."),
    ] = None,
    jobs_per_day: Annotated[float, typer.Option(min=0.01, help="Jobs each team submits per day, on average.")] = 1.0,
    database_url: Annotated[str | None, typer.Option(help="Database to fill (default: COSTOPT_DATABASE_URL).")] = None,
    fmt: Annotated[OutputFormat, typer.Option("--format", "-f")] = OutputFormat.table,
) -> None:
    """Submit each team's jobs over the REST API and run them with the service's own engine, watcher,
    reconciler, rebalancer and ledger on the simulated cloud (real 2020 AWS spot prices, preemptions drawn
    from the availability logs' hazards), on a clock moved as fast as the machine goes. Then open the
    reports: ``costopt report savings``, GET /v1/reports/savings, /reports/savings. Exit 1 when a job is
    left unfinished, 2 on bad arguments or a database that has jobs already."""
    from api.demo import DEMO_START, DemoError, fill_demo

    settings = settings_with(database_url=database_url)
    begin = DEMO_START if start is None else (start if start.tzinfo else start.replace(tzinfo=UTC))
    saved = {name: logging.getLogger(name).level for name in QUIET_LOGGERS}
    if logging.getLogger().getEffectiveLevel() > logging.INFO:
        for name in QUIET_LOGGERS:  # each preemption and move is in the jobs' events: keep the terminal calm
            logging.getLogger(name).setLevel(logging.ERROR)
    try:
        with failures():
            from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

            with Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                TextColumn("{task.fields[status]}"),
                TimeElapsedColumn(),
                transient=True,
                console=None,
                disable=not sys.stderr.isatty(),
            ) as bar:
                task = bar.add_task("demo", total=days * 86400, status="")

                def progress(now: datetime, ended: int, submitted: int) -> None:
                    done = (now - begin).total_seconds()
                    bar.update(
                        task,
                        completed=min(done, days * 86400),
                        status=f"{now:%Y-%m-%d %H:%M} {ended}/{submitted} jobs ended",
                    )

                try:
                    result = fill_demo(
                        settings,
                        teams=teams,
                        days=days,
                        seed=seed,
                        start=begin,
                        jobs_per_day=jobs_per_day,
                        progress=progress,
                    )
                except DemoError as exc:
                    raise typer.BadParameter(str(exc)) from exc
    finally:
        for name, level in saved.items():
            logging.getLogger(name).setLevel(level)
    record = {
        "teams": result.teams,
        "jobs_submitted": result.submitted,
        "states": result.states,
        "period_start": result.started_at.isoformat(),
        "simulated_until": result.ended_at.isoformat(),
        "rebalancing_passes": result.rebalances,
        "wall_seconds": round(result.wall_seconds, 1),
    }
    if fmt is OutputFormat.json:
        sys.stdout.write(json.dumps(record, indent=2) + "\n")
    else:
        emit_object(record, fmt, title="Demo")
        if fmt is OutputFormat.table:
            note(
                f"see it: costopt report savings --from {result.started_at.date()} (or GET /v1/reports/savings, "
                "the /reports/savings page with the admin key)"
            )
    if not result.finished:
        raise typer.Exit(Exit.FAILED)
