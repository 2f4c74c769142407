"""The migration decision rule: should a running job stay where it is or move to another offer?

One rule, used unchanged by the live rebalancer and by the backtest (:mod:`costopt.backtest`): the
scalar functions :func:`decide` and :func:`choose` build one-row arrays and call the vectorized core
:func:`decide_many`, so both paths run the same arithmetic.

The rule
--------
For a job with ``R`` steps left, running on an offer where it pays ``p_here`` USD/h (its share of the
instance under per-GPU packing) at ``v_here`` steps/s, and a candidate offer at ``p`` USD/h and ``v``
steps/s (``c = p / (3600 v)`` USD per step):

- **saving** over the remaining work, at the prices in effect now: ``R * (c_here - c)`` USD;
- **move cost**: the checkpoint moved between the two places, ``checkpoint_gb * egress`` (USD/GB from
  :meth:`costopt.planning.model.EgressRates.rate`; 0 within a region), plus the restart (boot and
  restore) on the new offer, ``restart_hours * p``, plus the overlap of writing the checkpoint on the
  old instance, ``checkpoint_overlap_hours * p_here`` (none after a preemption: that instance is gone);
- **margin**: ``max(margin_fraction * R * c_here, margin_min_usd)``, i.e. by default 5% of what the
  remaining work costs where the job is, and at least $1;
- **move** when ``saving - move cost > margin`` and the job has not moved within ``dwell_hours``
  (default 24 h; a job that never moved has no dwell). Among several candidates the one with the
  largest ``saving - move cost`` is taken (ties: the first in the given order).
- **preemption**: the job recovers at once (no dwell, no margin) on the candidate where finishing is
  cheapest, ``R * c + move cost``; relaunching the same offer is a candidate (no egress).

Defaults and their sources: egress is :data:`costopt.planning.model.DEFAULT_EGRESS` (2020 list prices:
AWS $0.02/GB between regions and $0.09/GB to the internet, Azure $0.02 and $0.087, GCP $0.01 and
$0.12); the restart time is the planner's 10 minutes (:class:`costopt.planning.model.Assumptions`);
the checkpoint overlap of 5 minutes is an assumption (writing a few GB to object storage at
~100 MB/s takes well under a minute; the rest is the handshake of stopping the old instance), as are
the 5%/$1 margin and the 24 h dwell (hysteresis against flapping on small price differences).

Units: steps, hours, USD per hour (job's share), USD per GB; reported sums are :class:`~decimal.Decimal`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from enum import IntEnum, StrEnum

import numpy as np
import numpy.typing as npt

from costopt.domain import Cloud, OfferKey, utc
from costopt.errors import CostoptError
from costopt.planning.model import DEFAULT_EGRESS, EgressRates, Location, money

__all__ = [
    "Action",
    "Decision",
    "InvalidDecisionInput",
    "MigrationRule",
    "MoveArrays",
    "OfferQuote",
    "Reason",
    "RunningJob",
    "choose",
    "decide",
    "decide_many",
    "egress_matrix",
]

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]

SECONDS_PER_HOUR = 3600.0


class InvalidDecisionInput(CostoptError, ValueError):
    """The decision's inputs are not usable (negative steps, NaN price, mismatched shapes)."""


@dataclass(frozen=True, slots=True)
class MigrationRule:
    """How a move is costed and when it is worth it (documented defaults, see the module docstring).

    ``margin_fraction``: share of the remaining cost (at the current price) a move must save beyond
    its cost; ``margin_min_usd``: the smallest such margin (USD). ``dwell_hours``: no move within this
    many hours of the previous move. ``restart_hours``: boot and restore on the new offer, billed
    there, no progress. ``checkpoint_overlap_hours``: the old instance billed while the checkpoint is
    written and shipped. ``egress``: USD per GB between places.
    """

    margin_fraction: float = 0.05
    margin_min_usd: float = 1.0
    dwell_hours: float = 24.0
    restart_hours: float = 10.0 / 60.0
    checkpoint_overlap_hours: float = 5.0 / 60.0
    egress: EgressRates = field(default_factory=lambda: DEFAULT_EGRESS)

    def __post_init__(self) -> None:
        for name in ("margin_fraction", "margin_min_usd", "dwell_hours", "restart_hours", "checkpoint_overlap_hours"):
            value = getattr(self, name)
            if not (isinstance(value, int | float) and math.isfinite(value) and value >= 0):
                raise InvalidDecisionInput(f"MigrationRule.{name} must be a finite number >= 0, got {value!r}")


class Action(StrEnum):
    STAY = "stay"
    MOVE = "move"


class Reason(IntEnum):
    """Why the rule decided as it did (stored as small ints in the vectorized form)."""

    SAVES_ENOUGH = 0  # move: the saving beats the move cost by the margin
    PREEMPTED = 1  # move: recover at once on the cheapest place to finish
    NO_CANDIDATE = 2  # stay: no candidate can run the job
    NO_SAVING = 3  # stay: no candidate saves more than its move costs
    BELOW_MARGIN = 4  # stay: the best net saving does not clear the margin
    DWELL = 5  # stay: it would pay, but the job moved less than dwell_hours ago

    @property
    def text(self) -> str:
        return _REASON_TEXT[self]


_REASON_TEXT = {
    Reason.SAVES_ENOUGH: "the saving over the remaining work beats the move cost by the margin",
    Reason.PREEMPTED: "preempted: recover at once where finishing is cheapest",
    Reason.NO_CANDIDATE: "no candidate offer can run the job",
    Reason.NO_SAVING: "no candidate saves more than moving there costs",
    Reason.BELOW_MARGIN: "the net saving does not clear the margin",
    Reason.DWELL: "the move would pay, but the job moved within the dwell time",
}


@dataclass(frozen=True, slots=True)
class MoveArrays:
    """The rule's verdict for ``J`` jobs (arrays of length ``J``).

    ``move``: move (or, when preempted, recover) now. ``target``: the chosen candidate's column
    (-1: none). ``saving``: ``R * (c_here - c_target)`` USD (NaN without a target). ``move_cost``:
    USD of the move to the target. ``margin``: USD the net saving had to clear. ``reason``:
    :class:`Reason` codes.
    """

    move: BoolArray
    target: IntArray
    saving: FloatArray
    move_cost: FloatArray
    margin: FloatArray
    reason: npt.NDArray[np.int8]


def _as_2d(name: str, value: npt.ArrayLike, shape: tuple[int, int]) -> FloatArray:
    arr: FloatArray = np.asarray(value, dtype=np.float64)
    try:
        return np.broadcast_to(arr, shape)
    except ValueError as exc:
        raise InvalidDecisionInput(f"{name} has shape {arr.shape}, not broadcastable to {shape}") from exc


def _broadcast_1d(name: str, arr: npt.NDArray[np.generic], n: int) -> None:
    if arr.ndim > 1 or (arr.ndim == 1 and arr.shape[0] not in (1, n)):
        raise InvalidDecisionInput(f"{name} has shape {arr.shape}, not broadcastable to ({n},)")


def _floats(name: str, value: npt.ArrayLike, n: int) -> FloatArray:
    arr: FloatArray = np.asarray(value, dtype=np.float64)
    _broadcast_1d(name, arr, n)
    out: FloatArray = np.broadcast_to(arr, (n,)).astype(np.float64)
    return out


def _bools(name: str, value: npt.ArrayLike, n: int) -> BoolArray:
    arr: BoolArray = np.asarray(value, dtype=np.bool_)
    _broadcast_1d(name, arr, n)
    out: BoolArray = np.broadcast_to(arr, (n,)).astype(np.bool_)
    return out


def _ints(name: str, value: npt.ArrayLike, n: int) -> IntArray:
    arr: IntArray = np.asarray(value, dtype=np.int64)
    _broadcast_1d(name, arr, n)
    out: IntArray = np.broadcast_to(arr, (n,)).astype(np.int64)
    return out


def decide_many(
    *,
    remaining_steps: npt.ArrayLike,
    here_usd_per_hour: npt.ArrayLike,
    here_steps_per_s: npt.ArrayLike,
    cand_usd_per_hour: npt.ArrayLike,
    cand_steps_per_s: npt.ArrayLike,
    egress_usd_per_gb: npt.ArrayLike,
    checkpoint_gb: npt.ArrayLike,
    hours_since_move: npt.ArrayLike,
    rule: MigrationRule,
    valid: npt.ArrayLike | None = None,
    current: npt.ArrayLike | None = None,
    preempted: npt.ArrayLike | None = None,
) -> MoveArrays:
    """The rule for ``J`` jobs against ``O`` candidate columns at once (see the module docstring).

    Per job (length ``J``, scalars broadcast): ``remaining_steps``; ``here_usd_per_hour`` and
    ``here_steps_per_s`` where it runs (ignored when preempted); ``checkpoint_gb``;
    ``hours_since_move`` (``inf``: never moved); ``current``: the column of the offer it runs on (-1:
    none among the candidates; that column is never a move target unless preempted); ``preempted``.
    Per (job, candidate) (``J x O``, or ``O`` broadcast over jobs): ``cand_usd_per_hour`` (the job's
    price there), ``cand_steps_per_s``, ``egress_usd_per_gb`` from the checkpoint's place, ``valid``
    (False: not a candidate). Candidates with NaN price or throughput <= 0 are not candidates.

    Raises :class:`InvalidDecisionInput` on negative remaining steps or checkpoint sizes, a
    non-finite current price or throughput of a job that is not preempted, or shapes that disagree.
    """
    cand_p = np.asarray(cand_usd_per_hour, dtype=np.float64)
    if cand_p.ndim == 1:
        cand_p = cand_p[None, :]
    rem = np.atleast_1d(np.asarray(remaining_steps, dtype=np.float64))
    n_jobs = max(rem.shape[0], cand_p.shape[0])
    n_cand = cand_p.shape[1]
    shape = (n_jobs, n_cand)
    rem = _floats("remaining_steps", rem, n_jobs)
    gb = _floats("checkpoint_gb", checkpoint_gb, n_jobs)
    since = _floats("hours_since_move", hours_since_move, n_jobs)
    pre = np.zeros(n_jobs, dtype=np.bool_) if preempted is None else _bools("preempted", preempted, n_jobs)
    cur = np.full(n_jobs, -1, dtype=np.int64) if current is None else _ints("current", current, n_jobs)
    here_p = _floats("here_usd_per_hour", here_usd_per_hour, n_jobs)
    here_v = _floats("here_steps_per_s", here_steps_per_s, n_jobs)
    p = _as_2d("cand_usd_per_hour", cand_p, shape)
    v = _as_2d("cand_steps_per_s", cand_steps_per_s, shape)
    egress = _as_2d("egress_usd_per_gb", egress_usd_per_gb, shape)
    ok = np.ones(shape, dtype=bool) if valid is None else np.broadcast_to(np.asarray(valid, dtype=bool), shape)

    if np.any(~(rem >= 0)) or np.any(~(gb >= 0)):
        raise InvalidDecisionInput("remaining steps and checkpoint sizes must be numbers >= 0")
    running = ~pre
    if np.any(running & ~(np.isfinite(here_p) & (here_p >= 0) & np.isfinite(here_v) & (here_v > 0))):
        raise InvalidDecisionInput("a running job needs a finite price >= 0 and a throughput > 0 where it runs")

    with np.errstate(divide="ignore", invalid="ignore"):
        here_cps = np.where(running, here_p / (here_v * SECONDS_PER_HOUR), np.nan)
        cand_cps = p / (v * SECONDS_PER_HOUR)
    usable = ok & np.isfinite(cand_cps) & (v > 0) & np.isfinite(p) & (p >= 0) & np.isfinite(egress)
    cols = np.arange(n_cand)
    is_current = cols[None, :] == cur[:, None]
    usable &= ~(is_current & running[:, None])  # staying is not a move; relaunching after preemption is

    overlap = np.where(running, rule.checkpoint_overlap_hours * here_p, 0.0)
    move_cost_all = gb[:, None] * egress + rule.restart_hours * p + overlap[:, None]
    remaining_here = rem * here_cps
    saving_all = rem[:, None] * (here_cps[:, None] - cand_cps)
    # Preempted: cheapest place to finish (remaining cost there + move); running: largest net saving.
    score = np.where(pre[:, None], -(rem[:, None] * cand_cps + move_cost_all), saving_all - move_cost_all)
    score = np.where(usable, score, -np.inf)
    has = usable.any(axis=1)
    if n_cand == 0:  # no candidate at all: one unusable column (argmax and the picks need one); every job stays
        score = np.full((n_jobs, 1), -np.inf)
        saving_all = move_cost_all = np.full((n_jobs, 1), np.nan)
    target = np.where(has, np.argmax(score, axis=1), -1).astype(np.int64)
    rows = np.arange(n_jobs)
    pick = np.maximum(target, 0)
    saving = np.where(has, saving_all[rows, pick], np.nan)
    move_cost = np.where(has, move_cost_all[rows, pick], np.nan)
    net = saving - move_cost
    margin = np.where(running, np.maximum(rule.margin_fraction * remaining_here, rule.margin_min_usd), 0.0)
    pays = has & running & (net > margin)
    dwelling = since < rule.dwell_hours
    move = (has & pre) | (pays & ~dwelling)
    reason = np.full(n_jobs, Reason.BELOW_MARGIN, dtype=np.int8)
    reason[has & running & ~(net > 0)] = Reason.NO_SAVING
    reason[pays & dwelling] = Reason.DWELL
    reason[pays & ~dwelling] = Reason.SAVES_ENOUGH
    reason[~has] = Reason.NO_CANDIDATE
    reason[has & pre] = Reason.PREEMPTED
    return MoveArrays(
        move=move,
        target=target,
        saving=saving,
        move_cost=move_cost,
        margin=margin,
        reason=reason,
    )


def egress_matrix(
    src_cloud: Sequence[str] | npt.NDArray[np.object_],
    src_region: Sequence[str] | npt.NDArray[np.object_],
    dst_cloud: Sequence[str] | npt.NDArray[np.object_],
    dst_region: Sequence[str] | npt.NDArray[np.object_],
    rates: EgressRates = DEFAULT_EGRESS,
) -> FloatArray:
    """USD/GB from each source place (rows) to each destination place (columns), through
    :meth:`EgressRates.rate` once per distinct (source, destination) pair of places."""
    src = list(zip((str(c) for c in src_cloud), (str(r) for r in src_region), strict=True))
    dst = list(zip((str(c) for c in dst_cloud), (str(r) for r in dst_region), strict=True))
    places = sorted(set(src) | set(dst))
    index = {pl: i for i, pl in enumerate(places)}
    table = np.array(
        [[rates.rate(Cloud(a[0]), a[1], Cloud(b[0]), b[1]) for b in places] for a in places], dtype=np.float64
    ).reshape(len(places), len(places))
    si = np.array([index[pl] for pl in src], dtype=np.int64)
    di = np.array([index[pl] for pl in dst], dtype=np.int64)
    out: FloatArray = table[si[:, None], di[None, :]]
    return out


# --- the scalar form (the live rebalancer) --------------------------------------------------------


@dataclass(frozen=True, slots=True)
class OfferQuote:
    """An offer as the rule sees it now: ``job_usd_per_hour`` is what the job would pay there (its GPU
    share under per-GPU packing), ``steps_per_s`` its throughput there (0: cannot run)."""

    key: OfferKey
    job_usd_per_hour: float
    steps_per_s: float


@dataclass(frozen=True, slots=True)
class RunningJob:
    """A running (or just preempted) job: ``remaining_steps`` to run, the offer it runs on, where its
    checkpoint lives, the checkpoint's size (GB) and when it last moved (None: never)."""

    remaining_steps: float
    current: OfferQuote
    checkpoint_at: Location
    checkpoint_gb: float = 0.0
    last_moved_at: datetime | None = None


@dataclass(frozen=True, slots=True)
class Decision:
    """The verdict for one job. ``target`` is the offer to move to (None when staying). Money in USD:
    ``saving_usd`` over the remaining work at today's prices, ``move_cost_usd`` of the move, and the
    ``margin_usd`` the difference had to clear (0 after a preemption)."""

    action: Action
    reason: Reason
    target: OfferQuote | None
    saving_usd: Decimal
    move_cost_usd: Decimal
    margin_usd: Decimal
    explanation: str


def _hours_since(job: RunningJob, now: datetime) -> float:
    if job.last_moved_at is None:
        return math.inf
    return (utc(now) - utc(job.last_moved_at)).total_seconds() / SECONDS_PER_HOUR


def _decimal(value: float) -> Decimal:
    return money(value) if math.isfinite(value) else Decimal(0)


def choose(
    job: RunningJob,
    candidates: Sequence[OfferQuote],
    now: datetime,
    rule: MigrationRule | None = None,
    *,
    preempted: bool = False,
) -> Decision:
    """Stay, or move to the best of ``candidates`` (the rule of the module docstring). When
    ``preempted``, ``candidates`` should include the job's own offer if it can be relaunched."""
    r = rule or MigrationRule()
    if job.remaining_steps < 0 or job.checkpoint_gb < 0:
        raise InvalidDecisionInput("remaining steps and checkpoint size must be >= 0")
    cur = -1
    for i, c in enumerate(candidates):
        if c.key == job.current.key:
            cur = i
            break
    if candidates:
        egress = egress_matrix(
            [job.checkpoint_at.cloud.value],
            [job.checkpoint_at.region],
            [c.key.cloud.value for c in candidates],
            [c.key.region for c in candidates],
            r.egress,
        )
    else:
        egress = np.zeros((1, 0))
    out = decide_many(
        remaining_steps=[job.remaining_steps],
        here_usd_per_hour=[job.current.job_usd_per_hour],
        here_steps_per_s=[job.current.steps_per_s],
        cand_usd_per_hour=np.array([[c.job_usd_per_hour for c in candidates]], dtype=np.float64).reshape(1, -1),
        cand_steps_per_s=np.array([[c.steps_per_s for c in candidates]], dtype=np.float64).reshape(1, -1),
        egress_usd_per_gb=egress,
        checkpoint_gb=[job.checkpoint_gb],
        hours_since_move=[_hours_since(job, now)],
        rule=r,
        current=[cur],
        preempted=[preempted],
    )
    reason = Reason(int(out.reason[0]))
    t = int(out.target[0])
    target = candidates[t] if t >= 0 else None
    saving, cost, margin = (float(out.saving[0]), float(out.move_cost[0]), float(out.margin[0]))
    moving = bool(out.move[0])
    where = f" to {_name(target.key)}" if target is not None else ""
    figures = (
        f"saving ${saving:,.2f}, move ${cost:,.2f}, margin ${margin:,.2f}" if target is not None else "no candidate"
    )
    verb = "move" if moving else "stay"
    explanation = f"{verb}{where if moving else ''}: {reason.text} ({figures})"
    return Decision(
        action=Action.MOVE if moving else Action.STAY,
        reason=reason,
        target=target if moving else None,
        saving_usd=_decimal(saving),
        move_cost_usd=_decimal(cost),
        margin_usd=_decimal(margin),
        explanation=explanation,
    )


def decide(
    job: RunningJob, candidate: OfferQuote, now: datetime, rule: MigrationRule | None = None, *, preempted: bool = False
) -> Decision:
    """Stay, or move to ``candidate`` (see :func:`choose`)."""
    return choose(job, [candidate], now, rule, preempted=preempted)


def _name(key: OfferKey) -> str:
    zone = f"/{key.zone}" if key.zone else ""
    return f"{key.cloud.value} {key.region}{zone} {key.instance_type} ({key.market.value})"
