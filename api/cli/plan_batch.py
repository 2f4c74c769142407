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
from datetime import datetime
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

import typer
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from api.cli.common import Exit, failures, settings_with
from api.cli.output import OutputFormat, emit, note
from api.cli.plan import parse_duration_hours
from costopt.domain import Cloud

if TYPE_CHECKING:
    # pandas/scipy-backed core: imported where used so that `costopt --help` stays light.
    from costopt.planning.collection import CollectionPlan, CollectionSpec


class _Objective(BaseModel):
    model_config = ConfigDict(extra="forbid")
    kind: str = Field(min_length=1)  # a name of costopt.planning.objectives.COLLECTION_OBJECTIVES
    deadline: str | None = None
    confidence: float = Field(default=0.95, ge=0.5, lt=1)
    budget: Decimal | None = Field(default=None, gt=0)


class _Quota(BaseModel):
    model_config = ConfigDict(extra="forbid")
    cloud: Cloud
    region: str | None = None
    gpus: int = Field(ge=0)


class _Job(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: str = Field(min_length=1)
    steps: float = Field(gt=0)
    count: int = Field(default=1, ge=1)
    gpus: Literal[1, 2, 4, 8] = 1
    name: str | None = None
    precision: Literal["fp32", "tf32", "amp"] = "fp32"


class BatchFile(BaseModel):
    """The plan-batch file (see the module docstring)."""

    model_config = ConfigDict(extra="forbid")
    objective: _Objective
    at: datetime | None = None
    clouds: list[Cloud] | None = None
    quotas: list[_Quota] = []
    jobs: list[_Job] = Field(min_length=1)


def load_batch(path: Path) -> BatchFile:
    """Parse and validate a plan-batch file; a clear usage error naming the field otherwise."""
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise typer.BadParameter(f"{path}: not readable YAML: {exc}", param_hint="FILE") from exc
    try:
        batch = BatchFile.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise typer.BadParameter(f"{path}: {where}: {first['msg']}", param_hint="FILE") from exc
    if batch.at is not None and batch.at.tzinfo is None:
        raise typer.BadParameter(f"{path}: at: needs a UTC offset, e.g. 2020-03-01T00:00:00Z", param_hint="FILE")
    return batch


_FIELDS = {
    "deadline_hours (a number of hours > 0)": "objective.deadline (e.g. 48h)",
    "deadline_hours": "objective.deadline",
    "budget_usd": "objective.budget",
}
"""The collection objective parameters' fields in the file (for error messages)."""


def build_spec(batch: BatchFile) -> CollectionSpec:
    from costopt.planning.collection import CollectionSpec, JobGroup, Quota
    from costopt.planning.model import InvalidJob, JobSpec
    from costopt.planning.objectives import build_collection_objective
    from costopt.throughput.model import JobType

    o = batch.objective
    params: dict[str, object] = {
        "deadline_hours": None if o.deadline is None else parse_duration_hours(o.deadline, "objective.deadline"),
        "budget_usd": o.budget,
        "confidence": o.confidence,
    }
    try:
        objective = build_collection_objective(o.kind, params)
    except InvalidJob as exc:  # an unknown kind too (UnknownObjective), listing the known ones
        msg = str(exc)
        for key, field in _FIELDS.items():
            msg = msg.replace(key, field)
        raise typer.BadParameter(f"objective: {msg}", param_hint="FILE") from exc
    groups = tuple(
        JobGroup(
            JobSpec(JobType.parse(j.type), j.steps, j.gpus, precision=j.precision),
            j.count,
            j.name or f"{j.type} x{j.count}",
        )
        for j in batch.jobs
    )
    quotas = tuple(Quota(q.cloud.value, q.region, q.gpus) for q in batch.quotas)
    return CollectionSpec(groups, objective, quotas)


def plan_record(plan: CollectionPlan) -> dict[str, Any]:
    """The plan as plain JSON values (money rounded to the cent)."""
    from costopt.planning.model import to_cents

    return {
        "status": plan.status,
        "total_expected_cost_usd": float(to_cents(plan.total_expected_cost_usd)),
        "makespan_hours": round(plan.makespan_hours, 4),
        "mip_gap": plan.mip_gap,
        "solve_seconds": round(plan.solve_seconds, 3),
        "offers_considered": plan.offers_considered,
        "reason": plan.reason,
        "quotas": [
            {"quota": u.quota.name, "gpus_used": u.gpus_used, "max_gpus": u.quota.max_gpus} for u in plan.quota_use
        ],
        "groups": [
            {
                "name": g.group,
                "count": g.count,
                "cost_usd": float(to_cents(g.cost_usd)),
                "allocations": [
                    {
                        "cloud": a.cloud,
                        "region": a.region,
                        "zone": a.zone,
                        "instance_type": a.instance_type,
                        "market": a.market,
                        "accelerator": a.accelerator,
                        "count": a.count,
                        "job_usd_per_hour": a.job_usd_per_hour,
                        "expected_hours": round(a.expected_hours, 4),
                        "cost_usd": float(to_cents(a.cost_usd)),
                    }
                    for a in g.allocations
                ],
            }
            for g in plan.assignments
        ],
    }


def plan_batch(
    file: Annotated[Path, typer.Argument(help="The collection, as YAML (schema: docs/planning.md).", exists=True)],
    data_dir: Annotated[Path | None, typer.Option("--data-dir", help="Seed an empty store from this folder.")] = None,
    time_limit: Annotated[float | None, typer.Option(help="Stop the solver after this many seconds.")] = None,
    fmt: Annotated[OutputFormat, typer.Option("--format", "-f")] = OutputFormat.table,
) -> None:
    """Plan a collection of jobs together: a sweep by a shared deadline at minimum cost, or the
    shortest makespan within a budget, under GPU quotas per cloud/region."""
    from api.planning import catalog_at, offers_at, planner_inputs
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
    record = {"as_of": now.at.isoformat().replace("+00:00", "Z"), **plan_record(plan)}
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
