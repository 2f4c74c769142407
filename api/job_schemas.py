"""Pydantic models of the job, batch and admin routes (layered: ``*Create`` in, ``*Public`` out,
``*ListPublic`` pages).

Every request model forbids unknown fields (a misspelt field is an error, not silently ignored),
rejects NaN and infinity, and bounds numbers, strings and lists, so bad input is a 422 naming the field.
Money in answers is a decimal string of USD (exact); prices are float USD per instance-hour; times are
ISO 8601 UTC ("Z").
"""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, model_validator

from costopt.domain import Cloud
from costopt.jobs.model import JobState

Name = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=200)]
ShortName = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=100)]
Arg = Annotated[str, StringConstraints(max_length=4096)]
StepsPerS = Annotated[float, Field(gt=0, le=1e9)]
Usd = Annotated[Decimal, Field(gt=0, le=Decimal(10) ** 9, max_digits=20, decimal_places=6)]

JOB_OBJECTIVES = ("min-cost", "min-time", "min-cost-deadline", "min-time-budget", "weighted")
BATCH_OBJECTIVES = ("deadline", "makespan")


class _In(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class ObjectiveIn(_In):
    """What the planner optimizes for the job. ``min-cost-deadline`` needs ``deadline_hours`` (hours from
    submission) and ``min-time-budget`` ``budget_usd``; a deadline given to ``min-cost`` (a budget to
    ``min-time``) turns it into its constrained form."""

    name: Literal["min-cost", "min-time", "min-cost-deadline", "min-time-budget", "weighted"] = "min-cost"
    deadline_hours: Annotated[float | None, Field(gt=0, le=100_000)] = None
    budget_usd: Usd | None = None
    confidence: Annotated[float, Field(ge=0.5, lt=1)] = 0.95
    cost_weight: Annotated[float, Field(ge=0, le=1)] = 0.5
    prefer_measured_margin: Annotated[float | None, Field(ge=0, le=10)] = Field(
        default=None,
        description="Prefer a placement whose throughput is measured unless an estimated one wins by more than "
        "this fraction on the objective's figure (0.1 = 10%); quotes, placements and the rebalancer follow it.",
    )

    @model_validator(mode="after")
    def _needs(self) -> ObjectiveIn:
        if self.name == "min-cost-deadline" and self.deadline_hours is None:
            raise ValueError("min-cost-deadline needs deadline_hours")
        if self.name == "min-time-budget" and self.budget_usd is None:
            raise ValueError("min-time-budget needs budget_usd")
        return self


class ConstraintsIn(_In):
    """Where the job may run (None: anywhere). ``max_usd_per_hour``: the whole instance's price."""

    clouds: Annotated[list[Cloud] | None, Field(min_length=1, max_length=10)] = None
    regions: Annotated[list[ShortName] | None, Field(min_length=1, max_length=200)] = None
    markets: Annotated[list[Literal["spot", "on_demand"]] | None, Field(min_length=1, max_length=2)] = None
    accelerators: Annotated[list[ShortName] | None, Field(min_length=1, max_length=50)] = None
    max_usd_per_hour: Annotated[float | None, Field(gt=0, le=10_000)] = None


class JobCreate(_In):
    """A job to run (``POST /v1/jobs``): exactly one of ``job_type`` (a catalog name) or ``throughput``
    (your own steps/s of the whole job per accelerator, on ``gpus`` GPUs)."""

    name: Annotated[str, StringConstraints(strip_whitespace=True, max_length=200)] = ""
    job_type: Name | None = Field(default=None, examples=["ResNet-50 (batch size 128)"])
    throughput: Annotated[dict[ShortName, StepsPerS] | None, Field(min_length=1, max_length=64)] = Field(
        default=None, examples=[{"v100": 12.5, "a100": 30.0}]
    )
    steps: Annotated[int, Field(gt=0, le=10**15)]
    gpus: Literal[1, 2, 4, 8] = 1
    precision: Literal["fp32", "tf32", "amp"] = Field(
        default="fp32",
        description="fp32 (default, PyTorch's: matmuls strict FP32, cuDNN convolutions TF32), tf32 or amp: "
        "which throughput estimates plan a catalog job_type, and extend a job given by throughput to other "
        "GPUs once its progress is measured (docs/throughput.md).",
    )
    objective: ObjectiveIn = Field(default_factory=ObjectiveIn)
    constraints: ConstraintsIn = Field(default_factory=ConstraintsIn)
    command: Annotated[list[Arg], Field(min_length=1, max_length=256)]
    image: Annotated[str | None, StringConstraints(min_length=1, max_length=500)] = None
    checkpoint_uri: Annotated[str | None, StringConstraints(min_length=1, max_length=1000)] = None
    checkpoint_gb: Annotated[float, Field(ge=0, le=100_000)] = 1.0
    fleet_id: Annotated[str | None, StringConstraints(strip_whitespace=True, min_length=1, max_length=64)] = Field(
        default=None, description="Run the job in this fleet (its policy shares the fleet's GPUs; docs/fleets.md)."
    )
    weight: Annotated[float, Field(gt=0, le=1_000_000)] = Field(
        default=1.0, description="Fleet jobs: the job's priority weight under the fleet's policy."
    )
    slo_s: Annotated[float | None, Field(gt=0, le=10**9)] = Field(
        default=None, description="Fleet jobs: seconds allowed from submission to completion (None: no SLO)."
    )

    @model_validator(mode="after")
    def _one_throughput(self) -> JobCreate:
        if (self.job_type is None) == (self.throughput is None):
            raise ValueError("give exactly one of job_type (a catalog name) or throughput ({accelerator: steps/s})")
        if self.fleet_id is None and (self.weight != 1.0 or self.slo_s is not None):
            raise ValueError("weight and slo_s are for jobs run in a fleet: give fleet_id, or drop them")
        return self


class OfferPublic(BaseModel):
    """An offer: where, and what the instance carries (accelerator, GPUs: None when unknown)."""

    cloud: str
    region: str
    zone: str
    instance_type: str
    market: str
    accelerator: str | None = None
    gpu_count: float | None = None


class PlacementPublic(OfferPublic):
    """Where the job runs now and the instance's price (USD per instance-hour) when it was placed."""

    usd_per_hour: float | None


class QuotePublic(BaseModel):
    """The planner's expectation at submission, priced whole-instance (what the ledger will bill):
    ``expected_cost_usd = usd_per_hour x expected_hours`` (+ moving the checkpoint, if any)."""

    offer: OfferPublic
    usd_per_hour: float
    expected_hours: float
    expected_cost_usd: str
    steps_per_s: float | None = None
    as_of: datetime | None = None
    reason: str | None = None


class MovePublic(BaseModel):
    """A move, preemption or recovery of the job, why, and what it cost (None: not known yet)."""

    model_config = ConfigDict(populate_by_name=True)

    at: datetime
    kind: Literal["move", "preemption", "recovery"]
    reason: str
    cost_usd: str | None
    from_: OfferPublic | None = Field(default=None, alias="from", serialization_alias="from")
    to: OfferPublic | None = None


class JobPublic(BaseModel):
    """A job as the service sees it now (see docs/api.md for every field)."""

    id: str
    team_id: str
    batch_id: str | None
    name: str
    state: JobState
    reason: str
    job_type: str | None
    throughput: dict[str, float] | None
    steps_total: int
    steps_done: int
    gpus: int
    precision: str = Field(default="fp32", description="fp32, tf32 or amp: what the job was planned at")
    objective: dict[str, Any]
    constraints: dict[str, Any]
    command: list[str]
    image: str | None
    checkpoint_uri: str
    provider: str
    placement: PlacementPublic | None
    quote: QuotePublic | None
    eta: datetime | None
    cost_so_far_usd: str | None = Field(
        description="USD spent so far, from the ledger (decimal string); None: not priced now (an open "
        "interval's offer has no price in effect)"
    )
    moves: list[MovePublic]
    exit_code: int | None
    cancel_requested_at: datetime | None
    created_at: datetime
    updated_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    fleet_id: str | None = Field(default=None, description="The fleet the job runs in (None: placed on its own).")


class JobsListPublic(BaseModel):
    """A page of jobs, oldest first; ``next_cursor`` None: the last page. ``total``: every match."""

    total: int
    items: list[JobPublic]
    next_cursor: str | None


class EventPublic(BaseModel):
    id: int
    at: datetime
    kind: str
    from_state: str | None
    to_state: str | None
    reason: str
    cost_usd: str | None
    detail: dict[str, Any] | None


class EventsListPublic(BaseModel):
    """The job's events after ``after`` in order; pass the last ``id`` as ``after`` to read on."""

    items: list[EventPublic]


class LogCopyPublic(BaseModel):
    """One copy of the job (a launch at an epoch) and the tail of its own output."""

    epoch: int
    instance_id: str
    provider: str
    started_at: datetime | None = None
    ended_at: datetime | None = None
    output: str
    error: str | None = None


class LogsPublic(BaseModel):
    """Every copy of the job, oldest first."""

    copies: list[LogCopyPublic]


class QuotaIn(_In):
    """At most ``gpus`` GPUs in use at once on a cloud (``region`` None) or one of its regions."""

    cloud: Cloud
    region: ShortName | None = None
    gpus: Annotated[int, Field(ge=0, le=1_000_000)]


class BatchObjectiveIn(_In):
    """``deadline``: every job finishes within ``deadline_hours`` (at ``confidence``) at the least total
    expected cost; without a deadline, the least total cost. ``makespan``: the shortest makespan with
    the total expected cost within ``budget_usd``."""

    name: Literal["deadline", "makespan"]
    deadline_hours: Annotated[float | None, Field(gt=0, le=100_000)] = None
    budget_usd: Usd | None = None
    confidence: Annotated[float, Field(ge=0.5, lt=1)] = 0.95

    @model_validator(mode="after")
    def _needs(self) -> BatchObjectiveIn:
        if self.name == "makespan" and self.budget_usd is None:
            raise ValueError("the makespan objective needs budget_usd")
        if self.name == "makespan" and self.deadline_hours is not None:
            raise ValueError("the makespan objective takes no deadline_hours (use the deadline objective)")
        if self.name == "deadline" and self.budget_usd is not None:
            raise ValueError("the deadline objective takes no budget_usd (use the makespan objective)")
        return self


class BatchCreate(_In):
    """Jobs planned together (``POST /v1/batches``). Each job's own ``objective`` is ignored for the
    placement (the batch's objective decides) and kept for later moves."""

    jobs: Annotated[list[JobCreate], Field(min_length=1, max_length=500)]
    objective: BatchObjectiveIn
    quotas: Annotated[list[QuotaIn], Field(max_length=100)] = []


class BatchPublic(BaseModel):
    id: str
    plan: dict[str, Any]
    jobs: list[JobPublic]


class TeamCreate(_In):
    name: Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=100)]


class TeamPublic(BaseModel):
    id: str
    name: str
    created_at: datetime
    allow_local_provider: bool = False
    checkpoint_prefixes: list[str] | None = None
    image_prefixes: list[str] | None = None


Prefix = Annotated[str, StringConstraints(min_length=1, max_length=500)]


class TeamPolicyUpdate(_In):
    """A team's policy (``PATCH /v1/admin/teams/{id}``); a field left out keeps its value.
    ``allow_local_provider``: its jobs may run on the service's own host. ``checkpoint_prefixes``,
    ``image_prefixes``: what its jobs' ``checkpoint_uri`` and ``image`` may start with (null: the
    service's defaults; []: none)."""

    allow_local_provider: bool | None = None
    checkpoint_prefixes: Annotated[list[Prefix] | None, Field(max_length=50)] = None
    image_prefixes: Annotated[list[Prefix] | None, Field(max_length=50)] = None


class TeamsListPublic(BaseModel):
    count: int
    items: list[TeamPublic]


class KeyCreate(_In):
    role: Literal["member", "admin"] = "member"
    name: Annotated[str, StringConstraints(strip_whitespace=True, max_length=200)] = ""


class KeyPublic(BaseModel):
    """A key's public part (never its secret)."""

    id: str
    team_id: str
    role: str
    name: str
    created_at: datetime
    revoked_at: datetime | None


class KeyCreated(BaseModel):
    """A new key: ``key`` is the whole secret, shown this once (only its hash is stored)."""

    key: str
    key_info: KeyPublic


class TeamCreated(BaseModel):
    """A new team and its first member key (shown this once)."""

    team: TeamPublic
    key: str
    key_info: KeyPublic
