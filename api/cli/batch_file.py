"""The ``costopt plan-batch`` file: its schema (pydantic), reading it, and the collection spec it gives.

Imported by the command when it runs (pydantic and YAML stay out of the CLI's start-up). The file's
schema is in :mod:`api.cli.plan_batch`'s docstring and docs/planning.md ("Collections").
"""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import typer
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from api.cli.plan import parse_duration_hours
from costopt.domain import Cloud

if TYPE_CHECKING:
    from costopt.planning.collection import CollectionSpec


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
