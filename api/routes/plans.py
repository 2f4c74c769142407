"""``/v1/plans``: plan one job under an objective (same planner as ``costopt plan``)."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal
from typing import Annotated, Any, Literal

from fastapi import APIRouter, HTTPException
from pydantic import BaseModel, Field

from api.cli.plan import plan_record, sensitivity_record
from api.deps import SettingsDep, StoreDep
from api.errors import ApiError
from api.job_planning import UnknownJobType, close_matches
from api.planning import plan_single_checked, planner_inputs
from api.routes.jobs import planning_error
from api.wiring import build_unavailable
from costopt.domain import Cloud
from costopt.errors import CostoptError
from costopt.planning.model import Infeasible, InvalidJob, JobSpec, Location, Objective
from costopt.planning.objectives import OBJECTIVES, build_objective
from costopt.throughput.model import JobType

router = APIRouter(prefix="/v1/plans", tags=["plans"])


class LocationIn(BaseModel):
    cloud: Cloud
    region: str = Field(min_length=1)


class PlanRequest(BaseModel):
    """A job and its objective. ``deadline_hours`` / ``budget_usd`` are required by the constrained
    objectives; ``at`` (with offset) plans with the prices then; default now."""

    job_type: str = Field(min_length=1, examples=["ResNet-50 (batch size 128)"])
    steps: Annotated[float, Field(gt=0)]
    gpus: Literal[1, 2, 4, 8] = 1
    objective: str = Field(
        default="min-cost",
        min_length=1,
        description=f"An objective name (any case): {', '.join(OBJECTIVES.names())}; aliases "
        + ", ".join(f"{a} ({n})" for a, n in OBJECTIVES.aliases().items())
        + ". An unknown name is a 422 listing the known ones.",
        examples=["min-cost"],
    )
    deadline_hours: Annotated[float | None, Field(gt=0)] = None
    budget_usd: Annotated[Decimal | None, Field(gt=0)] = None
    confidence: Annotated[float, Field(ge=0.5, lt=1)] = 0.95
    cost_weight: Annotated[float, Field(ge=0, le=1)] = 0.5
    clouds: list[Cloud] | None = None
    checkpoint_gb: Annotated[float, Field(ge=0)] = 0.0
    location: LocationIn | None = None
    at: datetime | None = None
    top: Annotated[int, Field(ge=1, le=1000)] = 10
    prefer_measured_margin: Annotated[float | None, Field(ge=0, le=10)] = Field(
        default=None,
        description="Prefer an offer whose throughput is measured unless an estimated one beats it by more "
        "than this fraction on the objective's figure (0.1 = 10%). Default: no preference.",
    )
    precision: Literal["fp32", "tf32", "amp"] = Field(
        default="fp32",
        description="fp32 (default, PyTorch's: matmuls strict FP32, cuDNN convolutions TF32), tf32 (TF32 matmuls "
        "too) or amp (mixed precision). Picks the throughput estimates the plan uses.",
    )
    per_gpu_packing: bool = Field(
        default=False,
        description="False (default): a job on part of a larger instance pays the whole instance, as the ledger "
        "bills it. True: it pays its GPU share (the dynamic-pricing paper's assumption).",
    )

    def build_objective(self) -> Objective:
        """The objective from the registry (:func:`costopt.planning.objectives.build_objective`, as the
        CLI and the job service); raises :class:`InvalidJob` for an unknown name or a missing, extra or
        invalid parameter."""
        return build_objective(
            self.objective,
            {
                "deadline_hours": self.deadline_hours,
                "budget_usd": self.budget_usd,
                "confidence": self.confidence,
                "cost_weight": self.cost_weight,
            },
        )


@router.post("", responses={404: {"description": "infeasible: the detail names the binding constraint"}})
def create_plan(body: PlanRequest, store: StoreDep, settings: SettingsDep) -> dict[str, Any]:
    """The winner, ranked alternatives and the reason; money in USD (floats, rounded to the cent)."""
    if body.at is not None and body.at.tzinfo is None:
        raise HTTPException(status_code=422, detail="at must carry a UTC offset, e.g. 2020-03-01T00:00:00Z")
    try:
        objective = body.build_objective()
        loc = Location(body.location.cloud, body.location.region) if body.location else None
        job = JobSpec(JobType.parse(body.job_type), body.steps, body.gpus, body.checkpoint_gb, loc, body.precision)
        at = body.at.astimezone(UTC) if body.at else None
        unavailable = build_unavailable(settings, store.engine)
        now, plan, sensitivity = plan_single_checked(
            store,
            settings,
            job,
            objective,
            at=at,
            clouds=body.clouds,
            top=body.top,
            unavailable=unavailable,
            per_gpu_packing=body.per_gpu_packing,
            prefer_measured_margin=body.prefer_measured_margin,
        )
    except Infeasible as exc:
        names = [jt.name for jt in planner_inputs(settings, store).catalog.job_types()]
        if exc.binding == "throughput" and body.job_type not in names:
            raise planning_error(UnknownJobType(body.job_type, close_matches(body.job_type, names))) from exc
        raise ApiError(404, "infeasible", str(exc), [{"binding": exc.binding}]) from exc
    except (InvalidJob, CostoptError) as exc:
        raise HTTPException(status_code=422, detail=str(exc)) from exc
    record = plan_record(plan, now.at.isoformat().replace("+00:00", "Z"), "explicit" if at else now.mode)
    if sensitivity is not None:
        record["throughput_uncertainty"] = sensitivity_record(sensitivity)
    return record
