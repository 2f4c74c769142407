"""Fleets, their instances, jobs and rounds as the core sees them (frozen records), and admission.

A **fleet** is a set of instances a team leases (by offer, or as the planner's cheapest offers for a
number of GPUs per accelerator), shared among the jobs submitted into it by one Gavel policy
(:data:`costopt.gavel.policies.POLICIES`), round by round (:mod:`costopt.gavel.mechanism`). Each instance
runs a worker (:mod:`costopt.agent.worker`) that starts and stops the jobs its round assigns it.

Worker types are accelerator names (``v100``, ``k80``...): the policy sees one column per accelerator the
fleet's live instances carry, with their GPUs summed.

**Admission** (:func:`admission`): a job can run on a worker type when its throughput there is known
(> 0 steps/s) and one instance of that type has at least the job's GPUs (a job runs within one instance:
its GPUs are that instance's). A job no instance of the fleet can run is refused at submission, with the
reason for each type.
"""

from __future__ import annotations

import json
import math
import secrets
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from enum import StrEnum
from typing import Any

from costopt.domain import OfferKey, normalize_accelerator
from costopt.errors import CostoptError
from costopt.seeded_ids import seeded_id

__all__ = [
    "DEFAULT_RESOLVE_ROUNDS",
    "DEFAULT_ROUND_S",
    "FLEET_PROVIDER",
    "Admission",
    "Assigned",
    "FleetError",
    "FleetInstance",
    "FleetJob",
    "FleetJobStatus",
    "FleetNotFound",
    "FleetRecord",
    "FleetState",
    "FleetStateError",
    "InstanceState",
    "JobRefused",
    "NewFleet",
    "NewInstance",
    "RoundRecord",
    "admission",
    "new_fleet_id",
    "new_instance_id",
    "seeded_fleet_id",
    "seeded_id",
]

FLEET_PROVIDER = "fleet"
"""The ``jobs.provider`` of a job submitted into a fleet: the fleet's round executor runs it (the job
engine and the rebalancer leave it alone)."""

DEFAULT_ROUND_S = 360.0
"""Gavel's round length (6 minutes)."""

DEFAULT_RESOLVE_ROUNDS = 10
"""Re-solve the policy at least every this many rounds, even without an arrival or a departure."""


class FleetError(CostoptError):
    """A fleet request that cannot be done as asked (the message says why)."""


class FleetNotFound(FleetError, LookupError):
    """No such fleet (or it belongs to another team)."""


class FleetStateError(FleetError):
    """The fleet cannot do that in its state (e.g. scale a released fleet)."""


class JobRefused(FleetError, ValueError):
    """The fleet cannot run the job: ``reasons`` says why for each worker type (or for the fleet)."""

    def __init__(self, message: str, reasons: Mapping[str, str]) -> None:
        super().__init__(message)
        self.reasons = dict(reasons)


class FleetState(StrEnum):
    ACTIVE = "active"
    RELEASED = "released"


class InstanceState(StrEnum):
    """``pending``: to launch; ``launching``: launched, its worker not heard from yet; ``running``: its
    worker syncs (its GPUs count); ``draining``: scaled down or released (its jobs stop at the next round,
    then it is terminated: ``ended_at`` set, it stays draining until its bill reaches its end); ``lost``: its
    worker stopped syncing or the cloud ended it (a replacement is launched); ``released``: terminated and
    billed to its end."""

    PENDING = "pending"
    LAUNCHING = "launching"
    RUNNING = "running"
    DRAINING = "draining"
    LOST = "lost"
    RELEASED = "released"

    @property
    def member(self) -> bool:
        """Part of the fleet's intended size (admission counts it)."""
        return self in (InstanceState.PENDING, InstanceState.LAUNCHING, InstanceState.RUNNING)


class FleetJobStatus(StrEnum):
    """``waiting``: not running (never started, or between leases); ``running``: a copy holds GPUs;
    ``done``: finished its steps; ``failed``; ``cancelled``."""

    WAITING = "waiting"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def finished(self) -> bool:
        return self in (FleetJobStatus.DONE, FleetJobStatus.FAILED, FleetJobStatus.CANCELLED)


def new_fleet_id() -> str:
    return f"fleet-{secrets.token_hex(8)}"


def new_instance_id() -> str:
    """A fleet instance's id, also its worker's id."""
    return f"fi-{secrets.token_hex(8)}"


def seeded_fleet_id(seed: str, team_name: str, idempotency_key: str) -> str:
    """The id of the fleet a team leases with ``idempotency_key`` under a drill's ``seed`` (as
    :func:`costopt.jobs.records.seeded_job_id` for jobs)."""
    return seeded_id("fleet-", seed, "fleet", team_name, idempotency_key)


def _loads(text: str | None, default: Any) -> Any:
    return json.loads(text) if text else default


@dataclass(frozen=True, slots=True)
class NewInstance:
    """An instance to add to a fleet: ``offer``, its accelerator and GPUs (from the instance catalog),
    the provider that launches it and the offer's price when chosen (USD/h, informative)."""

    offer: OfferKey
    accelerator: str
    gpus: int
    provider: str
    usd_per_hour: Decimal | None = None
    replaces: str | None = None
    instance_id: str = field(default_factory=new_instance_id)

    def __post_init__(self) -> None:
        if self.gpus < 1:
            raise FleetError(f"a fleet instance needs at least one GPU; {self.offer.instance_type} has {self.gpus}")
        object.__setattr__(self, "accelerator", normalize_accelerator(self.accelerator))


@dataclass(frozen=True, slots=True)
class NewFleet:
    """A fleet to create (state ``active``) with its first instances (``pending``)."""

    team_id: str
    policy: str
    instances: tuple[NewInstance, ...]
    round_s: float = DEFAULT_ROUND_S
    resolve_rounds: int = DEFAULT_RESOLVE_ROUNDS
    name: str = ""
    spec: Mapping[str, Any] = field(default_factory=dict)
    idempotency_key: str | None = None
    fleet_id: str = field(default_factory=new_fleet_id)

    def __post_init__(self) -> None:
        if not (math.isfinite(self.round_s) and self.round_s > 0):
            raise FleetError(f"round_s must be a positive number of seconds, got {self.round_s!r}")
        if self.resolve_rounds < 1:
            raise FleetError(f"resolve_rounds must be >= 1, got {self.resolve_rounds}")
        if not self.instances:
            raise FleetError("a fleet needs at least one instance")


@dataclass(frozen=True, slots=True)
class FleetRecord:
    """One row of ``fleets``. ``allocation``: the allocation in force (JSON document, see
    :mod:`costopt.fleets.store`), None before the first solve."""

    id: str
    team_id: str
    name: str
    policy: str
    round_s: float
    resolve_rounds: int
    state: FleetState
    spec: Mapping[str, Any]
    round: int
    round_started_at: datetime | None
    round_ends_at: datetime | None
    allocation: Mapping[str, Any] | None
    solved_round: int | None
    dirty: bool
    idempotency_key: str | None
    version: int
    created_at: datetime
    updated_at: datetime
    released_at: datetime | None

    @classmethod
    def of(cls, row: Any) -> FleetRecord:
        return cls(
            id=row.id,
            team_id=row.team_id,
            name=row.name or "",
            policy=row.policy,
            round_s=float(row.round_s),
            resolve_rounds=int(row.resolve_rounds),
            state=FleetState(row.state),
            spec=_loads(row.spec, {}),
            round=int(row.round),
            round_started_at=row.round_started_at,
            round_ends_at=row.round_ends_at,
            allocation=_loads(row.allocation, None),
            solved_round=row.solved_round,
            dirty=bool(row.dirty),
            idempotency_key=row.idempotency_key,
            version=int(row.version),
            created_at=row.created_at,
            updated_at=row.updated_at,
            released_at=row.released_at,
        )


@dataclass(frozen=True, slots=True)
class FleetInstance:
    """One row of ``fleet_instances`` (``id``: also its worker's id)."""

    id: str
    fleet_id: str
    provider: str
    offer: OfferKey
    accelerator: str
    gpus: int
    usd_per_hour: Decimal | None
    state: InstanceState
    instance_id: str | None
    launch_token: str | None
    token_hash: str | None
    replaces: str | None
    created_at: datetime
    launched_at: datetime | None
    first_seen_at: datetime | None
    last_seen_at: datetime | None
    ended_at: datetime | None
    end_reason: str | None
    billed_to: datetime | None = None
    """Set to ``ended_at`` once the ledger has the instance's life to its end (persisted: a restart does
    not look for it again, and a bill cut short by a crash is finished by the next pass)."""

    @property
    def billed_to_end(self) -> bool:
        """Ended and in the ledger to its end."""
        return self.ended_at is not None and self.billed_to is not None and self.billed_to >= self.ended_at

    @property
    def launch_unresolved(self) -> bool:
        """A launch of it was sent (``launch_token`` written first) but no cloud instance id was recorded:
        cut short (the service died in the call, or the call failed, possibly after the cloud created the
        instance). A cloud instance tagged with its id may exist that nobody tracks: the round executor
        finds it by its tags, terminates and bills it, then clears ``launch_token``."""
        return self.launch_token is not None and self.instance_id is None

    @classmethod
    def of(cls, row: Any) -> FleetInstance:
        return cls(
            id=row.id,
            fleet_id=row.fleet_id,
            provider=row.provider,
            offer=OfferKey.from_doc(json.loads(row.offer)),
            accelerator=row.accelerator,
            gpus=int(row.gpus),
            usd_per_hour=row.usd_per_hour,
            state=InstanceState(row.state),
            instance_id=row.instance_id,
            launch_token=row.launch_token,
            token_hash=row.token_hash,
            replaces=row.replaces,
            created_at=row.created_at,
            launched_at=row.launched_at,
            first_seen_at=row.first_seen_at,
            last_seen_at=row.last_seen_at,
            ended_at=row.ended_at,
            end_reason=row.end_reason,
            billed_to=row.billed_to,
        )


@dataclass(frozen=True, slots=True)
class FleetJob:
    """One row of ``fleet_jobs``: the job's fleet-side state (the ``jobs`` row holds the rest).

    ``throughput``: steps/s on each worker type of the fleet where it is known (resolved at submission);
    ``received``: seconds of leases it received on each type; ``owed``: seconds of allocation it had in
    force on each type over the same rounds (the allocation integral of
    :class:`~costopt.gavel.mechanism.RoundMechanism`), decayed to ``owed_at`` when the fleet's mechanism
    rule forgets (None: nothing owed yet); ``epoch``: the fencing epoch of its latest
    copy (0: never started); ``holder``: the instance whose worker may run a copy now (None: no copy
    runs), at ``holder_epoch``; ``target``/``target_gpus``: where round ``target_round`` puts it."""

    job_id: str
    fleet_id: str
    team_id: str
    weight: float
    slo_s: float | None
    gpus: int
    throughput: Mapping[str, float]
    steps_total: int
    steps_done: int
    checkpoint_step: int
    arrived_at: datetime
    status: FleetJobStatus
    epoch: int
    holder: str | None
    holder_epoch: int | None
    target: str | None
    target_gpus: tuple[int, ...]
    target_round: int | None
    received: Mapping[str, float]
    owed: Mapping[str, float]
    owed_at: datetime | None
    ever_ran: bool
    failures: int
    reason: str
    started_at: datetime | None
    finished_at: datetime | None
    updated_at: datetime

    @classmethod
    def of(cls, row: Any) -> FleetJob:
        return cls(
            job_id=row.job_id,
            fleet_id=row.fleet_id,
            team_id=row.team_id,
            weight=float(row.weight),
            slo_s=None if row.slo_s is None else float(row.slo_s),
            gpus=int(row.gpus),
            throughput={str(k): float(v) for k, v in _loads(row.throughput, {}).items()},
            steps_total=int(row.steps_total),
            steps_done=int(row.steps_done),
            checkpoint_step=int(row.checkpoint_step),
            arrived_at=row.arrived_at,
            status=FleetJobStatus(row.status),
            epoch=int(row.epoch),
            holder=row.holder,
            holder_epoch=row.holder_epoch,
            target=row.target,
            target_gpus=tuple(int(g) for g in _loads(row.target_gpus, [])),
            target_round=row.target_round,
            received={str(k): float(v) for k, v in _loads(row.received, {}).items()},
            owed={str(k): float(v) for k, v in _loads(row.owed, {}).items()},
            owed_at=row.owed_at,
            ever_ran=bool(row.ever_ran),
            failures=int(row.failures),
            reason=row.reason or "",
            started_at=row.started_at,
            finished_at=row.finished_at,
            updated_at=row.updated_at,
        )


@dataclass(frozen=True, slots=True)
class Assigned:
    """One job's lease in a round: its GPUs (indices on ``instance``), the worker type and the copy's
    fencing epoch."""

    job_id: str
    instance: str
    gpus: tuple[int, ...]
    wtype: str
    epoch: int

    def to_doc(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id,
            "instance": self.instance,
            "gpus": list(self.gpus),
            "type": self.wtype,
            "epoch": self.epoch,
        }

    @classmethod
    def from_doc(cls, doc: Mapping[str, Any]) -> Assigned:
        return cls(
            str(doc["job_id"]),
            str(doc["instance"]),
            tuple(int(g) for g in doc["gpus"]),
            str(doc["type"]),
            int(doc["epoch"]),
        )


@dataclass(frozen=True, slots=True)
class RoundCredits:
    """What a round that ends credits to the jobs leased in it that the next round does not plan (finished,
    being cancelled, or no round follows): each job's ``received`` and ``owed`` seconds per worker type with
    the round folded in, up to the round's end or the job's finish, whichever came first; ``owed`` None:
    the fleet's rule keeps no allocation integral (left as stored); ``at``: the boundary the ``owed``
    counts are as of (their ``owed_at``)."""

    received: Mapping[str, Mapping[str, float]]
    owed: Mapping[str, Mapping[str, float]] | None
    at: datetime


@dataclass(frozen=True, slots=True)
class RoundRecord:
    """One row of ``fleet_rounds``: round ``round`` of a fleet, ``[started_at, ended_at)`` (``ends_at``:
    when it was planned to end), the GPUs per worker type and the leases."""

    fleet_id: str
    round: int
    started_at: datetime
    ends_at: datetime
    ended_at: datetime | None
    capacity: Mapping[str, int]
    assignment: tuple[Assigned, ...]
    solved: bool
    billed: bool

    @classmethod
    def of(cls, row: Any) -> RoundRecord:
        return cls(
            fleet_id=row.fleet_id,
            round=int(row.round),
            started_at=row.started_at,
            ends_at=row.ends_at,
            ended_at=row.ended_at,
            capacity={str(k): int(v) for k, v in _loads(row.capacity, {}).items()},
            assignment=tuple(Assigned.from_doc(d) for d in _loads(row.assignment, [])),
            solved=bool(row.solved),
            billed=bool(row.billed),
        )


@dataclass(frozen=True, slots=True)
class RoundLeases:
    """What the decayed shares need of a stored round (:meth:`costopt.fleets.store.FleetRepository.
    leases_since`): its number, start, end (None: still open) and leases as ``(job id, worker type)``."""

    number: int
    started_at: datetime
    ended_at: datetime | None
    leases: tuple[tuple[str, str], ...]


@dataclass(frozen=True, slots=True)
class Admission:
    """Where a job can run: ``types`` (worker type -> steps/s) and, for each type it cannot run on (or for
    the fleet), why."""

    types: Mapping[str, float]
    reasons: Mapping[str, str]

    @property
    def ok(self) -> bool:
        return bool(self.types)


def admission(gpus: int, throughput: Mapping[str, float | None], instances: Iterable[tuple[str, int]]) -> Admission:
    """Can a job of ``gpus`` GPUs with ``throughput`` (worker type -> steps/s of the whole job, None or
    missing: unknown) run on a fleet whose member instances are ``(accelerator, GPUs)``? See the module
    docstring for the rule."""
    largest: dict[str, int] = {}
    for acc, n in instances:
        largest[acc] = max(largest.get(acc, 0), int(n))
    types: dict[str, float] = {}
    reasons: dict[str, str] = {}
    if not largest:
        return Admission({}, {"fleet": "the fleet has no instance (scale it up first)"})
    for acc in sorted(largest):
        rate = throughput.get(acc)
        if rate is None or not math.isfinite(rate) or rate <= 0:
            reasons[acc] = f"no throughput known for the job on {acc} at {gpus} GPU(s)"
        elif largest[acc] < gpus:
            reasons[acc] = f"the job needs {gpus} GPUs in one instance; the fleet's {acc} instances have {largest[acc]}"
        else:
            types[acc] = float(rate)
    return Admission(types, reasons)


def capacity_of(instances: Sequence[FleetInstance]) -> dict[str, int]:
    """GPUs per worker type over the instances whose workers run (state ``running``)."""
    out: dict[str, int] = {}
    for inst in instances:
        if inst.state is InstanceState.RUNNING:
            out[inst.accelerator] = out.get(inst.accelerator, 0) + inst.gpus
    return out
