"""Pydantic models of the fleet routes (``*Create`` in, ``*Public`` out), in the style of
:mod:`api.job_schemas`: unknown fields are refused, numbers and lists are bounded, NaN and infinity are
refused; money in answers is a decimal string of USD, times ISO 8601 UTC."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, model_validator

from api.job_schemas import OfferPublic
from costopt.domain import Cloud
from costopt.jobs.model import JobState

ShortName = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=100)]
InstanceRef = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=64)]


class _In(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class OfferIn(_In):
    """An offer of the price store (``zone`` "": a regional price)."""

    cloud: Cloud
    region: ShortName
    zone: Annotated[str, StringConstraints(strip_whitespace=True, max_length=100)] = ""
    instance_type: ShortName
    market: Literal["spot", "on_demand"]


class FleetInstancesIn(_In):
    """``count`` instances of ``offer``."""

    offer: OfferIn
    count: Annotated[int, Field(ge=1, le=1000)] = 1


class FleetPlanIn(_In):
    """GPUs per accelerator (e.g. ``{"v100": 4, "k80": 8}``) the planner turns into the cheapest instances
    under the constraints; ``max_usd_per_hour``: the whole fleet's budget (USD per hour), refused when the
    cheapest mix costs more."""

    accelerators: Annotated[dict[ShortName, Annotated[int, Field(ge=1, le=10_000)]], Field(min_length=1, max_length=20)]
    clouds: Annotated[list[Cloud] | None, Field(min_length=1, max_length=10)] = None
    regions: Annotated[list[ShortName] | None, Field(min_length=1, max_length=200)] = None
    markets: Annotated[list[Literal["spot", "on_demand"]] | None, Field(min_length=1, max_length=2)] = None
    max_usd_per_hour: Annotated[float | None, Field(gt=0, le=1_000_000)] = None


class FleetCreate(_In):
    """A fleet to lease (``POST /v1/fleets``): exactly one of ``instances`` (offers and counts) or
    ``plan`` (GPUs per accelerator, chosen by the planner); the Gavel policy that shares it
    (``costopt gavel policies``) and the round length."""

    name: Annotated[str, StringConstraints(strip_whitespace=True, max_length=200)] = ""
    policy: ShortName = Field(examples=["max_min_fairness_perf"])
    round_s: Annotated[float, Field(ge=1, le=86_400)] = 360.0
    resolve_every_rounds: Annotated[int, Field(ge=1, le=100_000)] = 10
    instances: Annotated[list[FleetInstancesIn] | None, Field(min_length=1, max_length=100)] = None
    plan: FleetPlanIn | None = None

    @model_validator(mode="after")
    def _one_source(self) -> FleetCreate:
        if (self.instances is None) == (self.plan is None):
            raise ValueError("give exactly one of instances (offers and counts) or plan (GPUs per accelerator)")
        return self


class FleetScale(_In):
    """Scale a fleet: ``add`` instances (by offer, or ``add_plan`` by GPUs per accelerator) and ``remove``
    instances by id (their jobs checkpoint and move at the next round, then they are terminated)."""

    add: Annotated[list[FleetInstancesIn], Field(max_length=100)] = []
    add_plan: FleetPlanIn | None = None
    remove: Annotated[list[InstanceRef], Field(max_length=1000)] = []

    @model_validator(mode="after")
    def _something(self) -> FleetScale:
        if not self.add and self.add_plan is None and not self.remove:
            raise ValueError("give instances to add (add, add_plan) or to remove (remove)")
        return self


class FleetInstancePublic(BaseModel):
    """One instance of the fleet (``id``: also its worker's id)."""

    id: str
    state: str
    provider: str
    instance_id: str | None
    offer: OfferPublic
    accelerator: str
    gpus: int
    usd_per_hour: float | None
    replaces: str | None
    created_at: datetime
    launched_at: datetime | None
    last_seen_at: datetime | None
    ended_at: datetime | None
    end_reason: str | None
    billed_to: datetime | None = None
    """The instance's end once the ledger has its life to it (its money is final); null before."""


class AllocationPublic(BaseModel):
    """The policy's allocation in force: each job's time fraction on each worker type, the round it was
    solved at and the policy's objective value."""

    policy: str
    solved_round: int | None
    solved_at: datetime | None
    worker_types: list[str]
    objective: float | None
    fractions: dict[str, dict[str, float]]


class LeasePublic(BaseModel):
    job_id: str
    instance: str
    gpus: list[int]
    worker_type: str
    epoch: int


class RoundPublic(BaseModel):
    """The current round: when it started and ends, the GPUs per worker type, and who holds which."""

    number: int
    started_at: datetime
    ends_at: datetime
    capacity: dict[str, int]
    assignment: list[LeasePublic]


class FleetJobPublic(BaseModel):
    """A job of the fleet: its state, weight and SLO, throughput on each worker type (steps/s), progress,
    the allocation's time fractions and the throughput they give (``expected_steps_per_s``), and the rate
    it made since it arrived (``observed_steps_per_s``). ``received_s``: seconds of leases it held on each
    type; ``owed_s``: seconds of allocation the policy gave it on each type since it arrived (time fraction x
    round length, summed: the allocation integral the aware policies' mechanism ranks by), as of ``owed_at``,
    the last round boundary that folded it in (None: no round yet). Both are folded in when a round ends,
    for each job leased in it, up to the round's end or the job's finish (or cancel) if that came first."""

    job_id: str
    name: str
    state: JobState
    status: str
    reason: str
    weight: float
    slo_s: float | None
    gpus: int
    throughput: dict[str, float]
    steps_total: int
    steps_done: int
    progress: float
    checkpoint_step: int
    epoch: int
    holder: str | None
    received_s: dict[str, float]
    owed_s: dict[str, float]
    owed_at: datetime | None
    fractions: dict[str, float]
    expected_steps_per_s: float | None
    observed_steps_per_s: float | None
    arrived_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    cost_so_far_usd: str | None


class FleetPublic(BaseModel):
    """A fleet as the service sees it now (docs/api.md)."""

    id: str
    team_id: str
    name: str
    policy: str
    round_s: float
    resolve_every_rounds: int
    state: str
    gpus: dict[str, int] = Field(description="GPUs per worker type of the instances whose workers run now")
    gpus_planned: dict[str, int] = Field(description="GPUs per worker type of every member instance")
    instances: list[FleetInstancePublic]
    allocation: AllocationPublic | None
    round: RoundPublic | None
    jobs: list[FleetJobPublic]
    cost_so_far_usd: str | None = Field(
        description="USD billed so far for the fleet's instances (its jobs' shares and its idle GPUs)"
    )
    idle_cost_usd: str | None
    created_at: datetime
    updated_at: datetime
    released_at: datetime | None


class FleetsListPublic(BaseModel):
    total: int
    items: list[FleetPublic]
    next_cursor: str | None


def offer_public(doc: dict[str, Any], accelerator: str | None, gpus: float | None) -> OfferPublic:
    return OfferPublic(**doc, accelerator=accelerator, gpu_count=gpus)
