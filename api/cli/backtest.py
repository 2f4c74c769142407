"""``costopt backtest ...``: what jobs would have cost under each placement policy, on real prices."""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import Annotated

import typer

from api.cli.common import failures, settings_with
from api.cli.output import OutputFormat, emit, note

app = typer.Typer(help="Backtests on recorded prices.", no_args_is_help=True)


@app.command("paper")
def paper(
    region: Annotated[
        list[str] | None, typer.Option(help="AWS region(s): us-east-1, us-west-2 (default both).")
    ] = None,
    job_days: Annotated[
        list[float] | None, typer.Option("--job-days", help="Job size(s) in V100-days (default 0.125 .. 8).")
    ] = None,
    data: Annotated[Path | None, typer.Option("--data", help="Real data folder (default ../shared/data).")] = None,
    fmt: Annotated[OutputFormat, typer.Option("--format", "-f")] = OutputFormat.table,
) -> None:
    """The dynamic-pricing paper's table: cost reduction of each policy over the static p3.2xlarge
    spot baseline, per model, region and job length (mean over 30 start days)."""
    from api.wiring import build_store
    from costopt.backtest.paper import (
        PAPER_JOB_DAYS,
        PAPER_REGIONS,
        load_paper_inputs,
        paper_price_files,
        run_paper_backtest,
    )
    from costopt.throughput.loaders import GAVEL_ORACLE_FILE
    from pricing.importer import import_paths

    settings = settings_with(data)
    if settings.data_dir is None:
        raise typer.BadParameter("the real data folder is needed", param_hint="--data")
    regions = tuple(region) if region else PAPER_REGIONS
    lengths = tuple(job_days) if job_days else PAPER_JOB_DAYS
    with failures():
        scratch = Path(tempfile.mkdtemp(prefix="costopt-backtest-"))
        store = build_store(settings.model_copy(update={"database_url": f"sqlite:///{scratch / 'prices.db'}"}))
        reports = import_paths(store, paper_price_files(settings.data_dir, settings.catalog_dir))
        bad = [r for r in reports if r.status in ("failed", "refused")]
        if bad:
            raise typer.BadParameter(f"{bad[0].path}: {bad[0].error}", param_hint="--data")
        inputs = load_paper_inputs(store, settings.data_dir / GAVEL_ORACLE_FILE, regions=regions)
        rows = [r.as_dict() for r in run_paper_backtest(inputs, regions=regions, job_days=lengths)]
    if fmt is OutputFormat.json:
        sys.stdout.write(json.dumps(rows, indent=2) + "\n")
        return
    for r in rows:
        r["cost_reduction"] = round(float(r["cost_reduction"]), 3)
    emit(
        rows,
        [
            ("region", "region", None),
            ("model", "model", None),
            ("job_days", "job", "V100-days"),
            ("policy", "policy", None),
            ("cost_reduction", "cost reduction", "x"),
        ],
        fmt,
        title="Cost reduction vs the static p3.2xlarge spot baseline",
    )
    if fmt is OutputFormat.table:
        note("method and caveats: docs/backtest.md")


@app.command("job")
def job(
    job_type: Annotated[str, typer.Option("--job-type", help='e.g. "ResNet-50 (batch size 128)".')],
    steps: Annotated[float, typer.Option(min=1, help="Training steps to run.")],
    start: Annotated[str, typer.Option("--from", help="Start (ISO 8601, UTC).")],
    end: Annotated[str, typer.Option("--to", help="Stop billing at this time if not done (ISO 8601).")],
    objective: Annotated[str, typer.Option(help="min-cost, min-time, weighted (as for `costopt plan`).")] = "min-cost",
    policy: Annotated[str, typer.Option(help="static, dynamic or dynamic_migration_cost.")] = "dynamic_migration_cost",
    gpus: Annotated[int, typer.Option(help="GPUs the job trains on.")] = 1,
    region: Annotated[list[str] | None, typer.Option(help="Only these regions (repeatable).")] = None,
    rebalance_hours: Annotated[float, typer.Option(help="Re-plan every this many hours.")] = 24.0,
    seed: Annotated[int, typer.Option(help="Seed of the simulated preemptions.")] = 0,
    data: Annotated[Path | None, typer.Option("--data", help="Real data folder (default ../shared/data).")] = None,
    fmt: Annotated[OutputFormat, typer.Option("--format", "-f")] = OutputFormat.table,
) -> None:
    """Backtest one job on recorded prices through the job service's path (engine, rebalancer, migrator,
    watcher, ledger) over the simulated cloud (preemptions from the hazards): what it would have cost,
    with every billed interval and decision."""
    from api.cli.common import parse_time
    from api.cli.plan import build_objective
    from api.wiring import build_catalog, build_hazards, build_store
    from costopt.backtest.job import run_job_backtest
    from costopt.backtest.paper import paper_price_files
    from costopt.ledger.prices import StepPrices
    from pricing.importer import import_paths
    from providers.sim import sim_factory

    t0 = parse_time(start, "--from")
    t1 = parse_time(end, "--to")
    if t0 is None or t1 is None or t1 <= t0:
        raise typer.BadParameter("--to must be after --from", param_hint="--to")
    settings = settings_with(data)
    if settings.data_dir is None:
        raise typer.BadParameter("the real data folder is needed", param_hint="--data")
    obj = build_objective(objective, None, None, settings.deadline_confidence, 0.5)
    with failures():
        scratch = Path(tempfile.mkdtemp(prefix="costopt-backtest-"))
        store = build_store(settings.model_copy(update={"database_url": f"sqlite:///{scratch / 'prices.db'}"}))
        import_paths(store, paper_price_files(settings.data_dir, settings.catalog_dir))
        prices = StepPrices.load(store, t0, t1, regions=region or None)
        result = run_job_backtest(
            prices,
            build_catalog(settings, store.engine),
            sim_factory(),
            job_type=job_type,
            steps=steps,
            start=t0,
            end=t1,
            objective=obj,
            policy=policy,
            hazards=build_hazards(settings),
            gpus=gpus,
            rebalance_hours=rebalance_hours,
            regions=region or None,
            seed=seed,
        )
    record = result.as_dict()
    if fmt is OutputFormat.json:
        sys.stdout.write(json.dumps(record, indent=2, default=str) + "\n")
        return
    summary = {k: v for k, v in record.items() if not isinstance(v, list | dict)}
    emit(
        [{"field": k, "value": v} for k, v in summary.items()],
        [("field", "field", None), ("value", "value", None)],
        fmt,
        title=f"Backtest of {job_type}: {policy}",
    )
