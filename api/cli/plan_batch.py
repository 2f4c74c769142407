"""``costopt plan-batch FILE.yaml``: plan a collection of jobs together (shared objective, quotas).

The file's schema (docs/planning.md, "Collections"):

    objective:            # one of:
      kind: sweep-min-cost          # all jobs finish by the deadline, minimum total expected cost
      deadline: 48h
      confidence: 0.95              # optional
      # kind: min-total-cost        # no deadline
      # kind: min-makespan-budget   # shortest makespan, expected total cost within the budget
      # budget: 5000                # USD
    at: 2020-03-01T00:00:00Z        # optional: plan with the prices then (default now)
    clouds: [aws, azure]            # optional
    quotas:                         # optional; GPUs in use at once per cloud or cloud/region
      - {cloud: aws, region: us-east-1, gpus: 64}
      - {cloud: azure, gpus: 32}
    jobs:
      - {type: "ResNet-50 (batch size 128)", steps: 500000, count: 20, gpus: 1, name: r50}
      - {type: "Transformer (batch size 64)", steps: 200000, precision: amp}  # fp32 (default), tf32, amp
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer

from api.cli.common import Exit, failures, settings_with
from api.cli.output import OutputFormat, emit, note


def plan_batch(
    file: Annotated[Path, typer.Argument(help="The collection, as YAML (schema: docs/planning.md).", exists=True)],
    data_dir: Annotated[Path | None, typer.Option("--data-dir", help="Seed an empty store from this folder.")] = None,
    time_limit: Annotated[float | None, typer.Option(help="Stop the solver after this many seconds.")] = None,
    fmt: Annotated[OutputFormat, typer.Option("--format", "-f")] = OutputFormat.table,
) -> None:
    """Plan a collection of jobs together: a sweep by a shared deadline at minimum cost, or the
    shortest makespan within a budget, under GPU quotas per cloud/region."""
    from api.cli.batch_file import build_spec, load_batch
    from api.planning import catalog_at, collection_plan_record, offers_at, planner_inputs
    from api.wiring import build_store, build_unavailable, seed_if_empty
    from costopt.planning.collection import CollectionInfeasible, SolverOptions, plan_collection
    from costopt.planning.collection_solve import new_highs
    from costopt.planning.evaluate import OfferTable

    batch = load_batch(file)
    spec = build_spec(batch)
    settings = settings_with(data_dir)
    new_highs()  # HiGHS prints a banner on its first use in a process: keep it out of the output
    with failures():
        store = build_store(settings)
        if data_dir is not None:
            seed_if_empty(store, settings)
        inputs = planner_inputs(settings, store)
        now, frame = offers_at(
            store, settings, batch.at, batch.clouds, unavailable=build_unavailable(settings, store.engine)
        )
        table = OfferTable.from_frame(frame, inputs.hazards)
        try:
            catalogs = {p: catalog_at(settings, store, p) for p in sorted({g.job.precision for g in spec.groups})}
            plan = plan_collection(
                spec,
                table,
                inputs.catalog,
                inputs.assumptions,
                options=SolverOptions(time_limit_s=time_limit),
                catalogs=catalogs,
            )
        except CollectionInfeasible as exc:
            note(f"[red]infeasible[/red] ({exc.binding}): {exc}")
            raise typer.Exit(Exit.NOT_FOUND) from exc
    record = {"as_of": now.at.isoformat().replace("+00:00", "Z"), **collection_plan_record(plan)}
    if fmt is OutputFormat.json:
        sys.stdout.write(json.dumps(record, indent=2) + "\n")
        return
    rows = [{"group": g["name"], **a} for g in record["groups"] for a in g["allocations"]]
    emit(
        rows,
        [
            ("group", "group", None),
            ("count", "jobs", "count"),
            ("cloud", "cloud", None),
            ("region", "region", None),
            ("instance_type", "instance type", None),
            ("market", "market", None),
            ("accelerator", "GPU", None),
            ("job_usd_per_hour", "job price", "USD/h"),
            ("expected_hours", "time", "h"),
            ("cost_usd", "cost", "USD"),
        ],
        fmt,
        title=f"Collection of {spec.total_jobs} jobs: {spec.objective.__class__.__name__}",
    )
    if fmt is OutputFormat.table:
        note(
            f"total ${record['total_expected_cost_usd']:,.2f} expected, makespan {record['makespan_hours']:.1f} h, "
            f"{plan.status} (gap {plan.mip_gap:.1e}); prices at {record['as_of']}"
        )
        note(f"[bold]why:[/bold] {plan.reason}")
