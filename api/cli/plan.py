"""``costopt plan``: the best placement of one job under an objective."""

from __future__ import annotations

import json
import sys
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from api.cli.common import Exit, failures, parse_time, settings_with
from api.cli.output import OutputFormat, emit, note
from api.cli.throughput import PrecisionChoice
from costopt.domain import Cloud

if TYPE_CHECKING:
    # numpy-backed core types: imported where used so that `costopt --help` stays light.
    from costopt.planning.model import Candidate, Objective, Plan
    from costopt.throughput.uncertainty import WinnerSensitivity

OBJECTIVE_HELP = (
    "min-cost (alias cheapest), min-time (fastest), min-cost-deadline (deadline), min-time-budget (budget) "
    "or weighted; any case."
)
"""The objectives of :data:`costopt.planning.objectives.OBJECTIVES` (not imported here: it loads numpy;
a test keeps the two equal)."""


def parse_duration_hours(text: str, option: str) -> float:
    """'48h', '2d', '90min', '1.5h' or ISO 8601 'PT48H' -> hours."""
    import pandas as pd

    try:
        td = pd.Timedelta(text)
    except (ValueError, TypeError) as exc:
        raise typer.BadParameter(f"{text!r} is not a duration (e.g. 48h, 2d, 90min, PT48H)", param_hint=option) from exc
    hours = td.total_seconds() / 3600
    if hours <= 0:
        raise typer.BadParameter("must be positive", param_hint=option)
    return hours


def parse_money(text: str, option: str) -> Decimal:
    try:
        value = Decimal(text.replace("$", "").replace(",", ""))
    except InvalidOperation as exc:
        raise typer.BadParameter(f"{text!r} is not an amount of USD", param_hint=option) from exc
    if not value > 0:
        raise typer.BadParameter("must be positive", param_hint=option)
    return value


def build_objective(
    name: str, deadline: str | None, budget: str | None, confidence: float, cost_weight: float
) -> Objective:
    """The objective named on the command line, from the registry
    (:func:`costopt.planning.objectives.build_objective`, as REST and the job service): ``deadline`` is a
    duration (``48h``), ``budget`` an amount of USD; a deadline or budget turns min-cost / min-time into
    their constrained forms. A usage error names the known objectives or the option at fault."""
    from costopt.planning.model import InvalidJob
    from costopt.planning.objectives import UnknownObjective
    from costopt.planning.objectives import build_objective as build_registered

    params: dict[str, object] = {
        "deadline_hours": None if deadline is None else parse_duration_hours(deadline, "--deadline"),
        "budget_usd": None if budget is None else parse_money(budget, "--budget"),
        "confidence": confidence,
        "cost_weight": cost_weight,
    }
    try:
        return build_registered(name, params)
    except UnknownObjective as exc:
        raise typer.BadParameter(str(exc), param_hint="--objective") from exc
    except InvalidJob as exc:
        msg = str(exc)
        for key, option in _OPTIONS.items():
            msg = msg.replace(key, option)
        raise typer.BadParameter(msg, param_hint="--objective") from exc


_OPTIONS = {
    "deadline_hours (a number of hours > 0)": "--deadline (e.g. 48h)",
    "deadline_hours": "--deadline",
    "budget_usd": "--budget",
    "cost_weight": "--cost-weight",
}
"""The objective parameters' command-line options (for error messages)."""


def candidate_record(c: Candidate) -> dict[str, Any]:
    """A candidate as plain JSON values (its offer as a quote has it; floats; money rounded to the cent)."""
    from api.job_planning import offer_doc
    from costopt.planning.model import to_cents

    return {
        **offer_doc(c),
        "usd_per_hour": c.usd_per_hour,
        "job_usd_per_hour": c.job_usd_per_hour,
        "steps_per_s": c.steps_per_s,
        "throughput_estimated": c.throughput_estimated,
        "expected_hours": round(c.expected_hours, 4),
        "expected_cost_usd": float(to_cents(c.expected_cost_usd)),
        "move_cost_usd": float(to_cents(c.move_cost_usd)),
        "usd_per_million_steps": round(c.usd_per_million_steps, 4),
        "preemptions_per_hour": c.preemptions_per_hour,
        "risk": round(c.risk, 4),
    }


def plan_record(plan: Plan, as_of: str, clock: str) -> dict[str, Any]:
    return {
        "job_type": plan.job.job_type.name,
        "steps": plan.job.steps,
        "gpus": plan.job.gpu_count,
        "precision": plan.job.precision,
        "objective": plan.objective.name,
        "as_of": as_of,
        "clock": clock,
        "offers_considered": plan.offers_considered,
        "offers_feasible": plan.offers_feasible,
        "winner": candidate_record(plan.winner),
        "alternatives": [candidate_record(c) for c in plan.alternatives],
        "reason": plan.reason,
    }


def sensitivity_record(s: WinnerSensitivity) -> dict[str, Any]:
    """Whether a plan's winner rests on an estimate and holds at the ends of the estimates' intervals."""
    return {
        "winner_rests_on_estimate": s.rests_on_estimate,
        "winner_steps_per_s_interval": list(s.interval) if s.interval is not None else None,
        "winner_at_low_estimates": s.winner_at_low,
        "winner_at_high_estimates": s.winner_at_high,
        "winner_adverse": s.winner_adverse,
        "winner_changes_within_intervals": s.changes,
    }


PLAN_COLUMNS: list[tuple[str, str, str | None]] = [
    ("rank", "#", None),
    ("cloud", "cloud", None),
    ("region", "region", None),
    ("zone", "zone", None),
    ("instance_type", "instance type", None),
    ("market", "market", None),
    ("accelerator", "GPU", None),
    ("job_usd_per_hour", "job price", "USD/h"),
    ("steps_per_s", "speed", "steps/s"),
    ("expected_hours", "time", "h"),
    ("expected_cost_usd", "cost", "USD"),
    ("risk", "P(preempted)", "%"),
]


def plan(
    job_type: Annotated[str, typer.Option("--job-type", help='e.g. "ResNet-50 (batch size 128)".')],
    steps: Annotated[float, typer.Option(min=1, help="Training steps still to run.")],
    objective: Annotated[str, typer.Option(help=OBJECTIVE_HELP)] = "min-cost",
    deadline: Annotated[str | None, typer.Option(help="Finish within this long, e.g. 48h, 3d.")] = None,
    budget: Annotated[str | None, typer.Option(help="Spend at most this many USD.")] = None,
    gpus: Annotated[int, typer.Option(help="GPUs the job trains on (1, 2, 4, 8).")] = 1,
    clouds: Annotated[str | None, typer.Option(help="Only these clouds, comma-separated.")] = None,
    at: Annotated[str | None, typer.Option(help="Plan at this time (ISO 8601) with the prices then.")] = None,
    top: Annotated[int, typer.Option(min=1, max=1000, help="How many alternatives to list.")] = 10,
    confidence: Annotated[float | None, typer.Option(help="Deadline confidence (default 0.95).")] = None,
    cost_weight: Annotated[float, typer.Option(help="Weight of cost for --objective weighted.")] = 0.5,
    checkpoint_gb: Annotated[float, typer.Option(help="Checkpoint size, GB (moved across regions).")] = 0.0,
    precision: Annotated[
        PrecisionChoice, typer.Option(help="fp32 (PyTorch's default), tf32 or amp: picks the throughput estimates.")
    ] = PrecisionChoice.fp32,
    from_location: Annotated[
        str | None, typer.Option("--from", help="Where the checkpoint is now: CLOUD:REGION, e.g. aws:us-east-1.")
    ] = None,
    prefer_measured: Annotated[
        float | None,
        typer.Option(
            "--prefer-measured",
            min=0,
            help="Prefer a measured throughput unless an estimate wins by more than this fraction (0.1 = 10%).",
        ),
    ] = None,
    data_dir: Annotated[Path | None, typer.Option("--data-dir", help="Seed an empty store from this folder.")] = None,
    fmt: Annotated[OutputFormat, typer.Option("--format", "-f")] = OutputFormat.table,
) -> None:
    """The cheapest or fastest placement of one job over every offer in effect, with alternatives."""
    from api.planning import plan_single_checked
    from api.wiring import build_store, build_unavailable, seed_if_empty
    from costopt.planning.model import Infeasible, JobSpec, Location
    from costopt.throughput.model import JobType

    settings = settings_with(data_dir)
    when = parse_time(at, "--at")
    obj = build_objective(objective, deadline, budget, confidence or settings.deadline_confidence, cost_weight)
    try:
        cloud_list = [Cloud(c.strip()) for c in clouds.split(",")] if clouds else None
    except ValueError as exc:
        raise typer.BadParameter(f"{exc}; clouds are aws, gcp, azure", param_hint="--clouds") from exc
    location = None
    if from_location:
        cloud_s, _, region = from_location.partition(":")
        try:
            location = Location(Cloud(cloud_s), region)
        except ValueError as exc:
            raise typer.BadParameter("use CLOUD:REGION, e.g. aws:us-east-1", param_hint="--from") from exc
    with failures():
        job = JobSpec(JobType.parse(job_type), steps, gpus, checkpoint_gb, location, precision.value)
        store = build_store(settings)
        if data_dir is not None:
            seed_if_empty(store, settings)
        try:
            unavailable = build_unavailable(settings, store.engine)
            now, result, sensitivity = plan_single_checked(
                store,
                settings,
                job,
                obj,
                at=when,
                clouds=cloud_list,
                top=top,
                unavailable=unavailable,
                prefer_measured_margin=prefer_measured,
            )
        except Infeasible as exc:
            note(f"[red]infeasible[/red] ({exc.binding}): {exc}")
            raise typer.Exit(Exit.NOT_FOUND) from exc
    record = plan_record(result, now.at.isoformat().replace("+00:00", "Z"), "explicit" if when else now.mode)
    if sensitivity is not None:
        record["throughput_uncertainty"] = sensitivity_record(sensitivity)
    if fmt is OutputFormat.json:
        sys.stdout.write(json.dumps(record, indent=2) + "\n")
        return
    rows = [{"rank": i + 1, **r} for i, r in enumerate(record["alternatives"])]
    emit(rows, PLAN_COLUMNS, fmt, title=f"{job.job_type.name}, {steps:,.0f} steps on {gpus} GPU(s): {obj.name}")
    if fmt is OutputFormat.table:
        note(
            f"{result.offers_considered} offers considered ({result.offers_feasible} admissible) at "
            f"{record['as_of']} ({record['clock']})"
        )
        note(f"[bold]why:[/bold] {result.reason}")
        if sensitivity is not None and sensitivity.rests_on_estimate:
            iv = sensitivity.interval
            span = "no interval" if iv is None else f"{iv[0]:.3g}-{iv[1]:.3g} steps/s"
            verdict = (
                f"[yellow]the winner changes[/yellow] (low ends: {sensitivity.winner_at_low}; high ends: "
                f"{sensitivity.winner_at_high}; adverse: {sensitivity.winner_adverse})"
                if sensitivity.changes
                else "the winner holds at both ends and adversarially"
            )
            note(f"[bold]estimate:[/bold] the winner's speed is estimated ({span}): {verdict}")
        kept_out = unavailable.active(at=when)
        if kept_out:
            note(
                f"{len(kept_out)} offer(s) kept out as recently unavailable: "
                + ", ".join(f"{e.offer} ({e.reason} until {e.until:%Y-%m-%d %H:%M}Z)" for e in kept_out[:5])
            )
