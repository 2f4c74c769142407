"""Planning objectives by name, built from a plain parameter mapping: one builder for every face (the CLI's
``plan`` and ``plan-batch``, REST ``/v1/plans``, the job service).

Single-job objectives (:data:`OBJECTIVES`, :func:`build_objective`):

================== ============ ======================================================================
name               aliases      builds
================== ============ ======================================================================
min-cost           cheapest     :class:`MinCost`; with ``deadline_hours``: :class:`MinCostByDeadline`
min-time           fastest      :class:`MinTime`; with ``budget_usd``: :class:`MinTimeWithinBudget`
min-cost-deadline  deadline     :class:`MinCostByDeadline` (``deadline_hours`` required)
min-time-budget    budget       :class:`MinTimeWithinBudget` (``budget_usd`` required)
weighted                        :class:`Weighted` (``cost_weight``, default 0.5)
================== ============ ======================================================================

Collection objectives (:data:`COLLECTION_OBJECTIVES`, :func:`build_collection_objective`):
``sweep-min-cost`` (alias ``deadline``; ``deadline_hours`` required, ``confidence``, ``joint``),
``min-total-cost`` (alias ``min-cost``), ``min-makespan-budget`` (aliases ``makespan``, ``budget``;
``budget_usd`` required).

Parameters (a value of None counts as not given): ``deadline_hours`` (number of hours > 0),
``budget_usd`` (USD: a Decimal, an int, a decimal string, or a float taken at its shortest repr),
``confidence`` (in [0.5, 1), default 0.95: the deadline is met with this probability), ``cost_weight``
(in [0, 1], default 0.5), ``joint`` (bool, collections only). A parameter the objective does not take
(a budget for min-cost, a deadline for min-time, a key not listed here) is an error rather than
silently ignored; ``confidence`` is accepted by every objective and ``cost_weight`` by every single-job
one (they are defaults that a form or a REST body always carries).

Errors: an unknown name raises :class:`UnknownObjective` (an :class:`InvalidJob`) listing the known
names and the close matches; a missing, extra or invalid parameter raises :class:`InvalidJob` naming it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from decimal import Decimal, InvalidOperation
from typing import TYPE_CHECKING

from costopt.planning.model import (
    InvalidJob,
    MinCost,
    MinCostByDeadline,
    MinTime,
    MinTimeWithinBudget,
    Objective,
    Weighted,
    money,
)
from costopt.registry import Registry, UnknownName

if TYPE_CHECKING:
    from costopt.planning.collection import CollectionObjective

__all__ = [
    "COLLECTION_OBJECTIVES",
    "DEFAULT_CONFIDENCE",
    "DEFAULT_COST_WEIGHT",
    "OBJECTIVES",
    "PARAMETERS",
    "ObjectiveParams",
    "UnknownObjective",
    "build_collection_objective",
    "build_objective",
]

DEFAULT_CONFIDENCE = 0.95
DEFAULT_COST_WEIGHT = 0.5

PARAMETERS: tuple[str, ...] = ("deadline_hours", "budget_usd", "confidence", "cost_weight", "joint")
"""Every parameter name an objective builder reads."""


class UnknownObjective(InvalidJob, UnknownName):
    """An objective name that is not registered; the message lists the known names."""


class ObjectiveParams:
    """A parameter mapping read strictly: each read checks the value's type and range and records the
    key; :meth:`refuse_unread` then refuses every key given but not read (None values count as absent)."""

    def __init__(self, objective: str, params: Mapping[str, object] | None) -> None:
        self.objective = objective
        self.given = {str(k): v for k, v in (params or {}).items() if v is not None}
        self.read: set[str] = set()

    def _take(self, key: str) -> object | None:
        self.read.add(key)
        return self.given.get(key)

    def _number(self, key: str, value: object) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float | Decimal | str):
            raise InvalidJob(f"{self.objective}: {key} must be a number, got {value!r}")
        try:
            number = float(value)
        except ValueError:
            raise InvalidJob(f"{self.objective}: {key} must be a number, got {value!r}") from None
        if not math.isfinite(number):
            raise InvalidJob(f"{self.objective}: {key} must be a finite number, got {value!r}")
        return number

    def number(self, key: str, default: float) -> float:
        value = self._take(key)
        return default if value is None else self._number(key, value)

    def deadline_hours(self) -> float | None:
        """``deadline_hours`` as a number (None: not given)."""
        value = self._take("deadline_hours")
        return None if value is None else self._number("deadline_hours", value)

    def required_deadline_hours(self) -> float:
        deadline = self.deadline_hours()
        if deadline is None:
            raise InvalidJob(f"{self.objective} needs deadline_hours (a number of hours > 0)")
        return deadline

    def budget_usd(self) -> Decimal | None:
        """``budget_usd`` as a Decimal (None: not given)."""
        value = self._take("budget_usd")
        if value is None:
            return None
        bad = InvalidJob(f"{self.objective}: budget_usd must be a finite amount of USD, got {value!r}")
        if isinstance(value, bool):
            raise bad
        if isinstance(value, float):
            if not math.isfinite(value):
                raise bad
            amount = money(value)
        elif isinstance(value, Decimal | int):
            amount = Decimal(value)
        elif isinstance(value, str):
            try:
                amount = Decimal(value.strip())
            except InvalidOperation:
                raise bad from None
        else:
            raise bad
        if not amount.is_finite():
            raise bad
        return amount

    def required_budget_usd(self) -> Decimal:
        budget = self.budget_usd()
        if budget is None:
            raise InvalidJob(f"{self.objective} needs budget_usd (USD > 0)")
        return budget

    def flag(self, key: str) -> bool:
        value = self._take(key)
        if value is None:
            return False
        if not isinstance(value, bool):
            raise InvalidJob(f"{self.objective}: {key} must be true or false, got {value!r}")
        return value

    def ignore(self, *keys: str) -> None:
        """Accept ``keys`` without using them (defaults that every request carries)."""
        self.read.update(keys)

    def refuse_unread(self) -> None:
        extra = sorted(set(self.given) - self.read)
        if not extra:
            return
        unknown = [k for k in extra if k not in PARAMETERS]
        if unknown:
            raise InvalidJob(
                f"{self.objective}: unknown parameter(s) {', '.join(unknown)}; parameters are {', '.join(PARAMETERS)}"
            )
        hints = {
            "deadline_hours": "a deadline needs min-cost or min-cost-deadline",
            "budget_usd": "a budget needs min-time or min-time-budget",
            "cost_weight": "cost_weight is for weighted",
            "joint": "joint is for collection deadlines",
        }
        why = "; ".join(hints.get(k, k) for k in extra)
        raise InvalidJob(f"{self.objective} takes no {', '.join(extra)} ({why})")


ObjectiveBuilder = Callable[[ObjectiveParams], Objective]
CollectionObjectiveBuilder = Callable[[ObjectiveParams], "CollectionObjective"]

OBJECTIVES: Registry[ObjectiveBuilder] = Registry("objective", error=UnknownObjective)
"""Single-job objectives by name (case-insensitive, with aliases)."""

COLLECTION_OBJECTIVES: Registry[CollectionObjectiveBuilder] = Registry("collection objective", error=UnknownObjective)
"""Collection objectives (``plan-batch``) by name (case-insensitive, with aliases)."""


def _confidence(p: ObjectiveParams) -> float:
    return p.number("confidence", DEFAULT_CONFIDENCE)


@OBJECTIVES.register("min-cost", aliases=("cheapest",))
def _min_cost(p: ObjectiveParams) -> Objective:
    p.ignore("cost_weight")
    deadline = p.deadline_hours()
    if deadline is not None:
        return MinCostByDeadline(deadline, _confidence(p))
    p.ignore("confidence")
    return MinCost()


@OBJECTIVES.register("min-time", aliases=("fastest",))
def _min_time(p: ObjectiveParams) -> Objective:
    p.ignore("confidence", "cost_weight")
    budget = p.budget_usd()
    return MinTime() if budget is None else MinTimeWithinBudget(budget)


@OBJECTIVES.register("min-cost-deadline", aliases=("deadline",))
def _min_cost_deadline(p: ObjectiveParams) -> Objective:
    p.ignore("cost_weight")
    return MinCostByDeadline(p.required_deadline_hours(), _confidence(p))


@OBJECTIVES.register("min-time-budget", aliases=("budget",))
def _min_time_budget(p: ObjectiveParams) -> Objective:
    p.ignore("confidence", "cost_weight")
    return MinTimeWithinBudget(p.required_budget_usd())


@OBJECTIVES.register("weighted")
def _weighted(p: ObjectiveParams) -> Objective:
    p.ignore("confidence")
    return Weighted(p.number("cost_weight", DEFAULT_COST_WEIGHT))


@COLLECTION_OBJECTIVES.register("sweep-min-cost", aliases=("deadline",))
def _sweep_min_cost(p: ObjectiveParams) -> CollectionObjective:
    from costopt.planning.collection import SweepMinCost

    return SweepMinCost(p.required_deadline_hours(), _confidence(p), joint=p.flag("joint"))


@COLLECTION_OBJECTIVES.register("min-total-cost", aliases=("min-cost",))
def _min_total_cost(p: ObjectiveParams) -> CollectionObjective:
    from costopt.planning.collection import MinTotalCost

    p.ignore("confidence")
    return MinTotalCost()


@COLLECTION_OBJECTIVES.register("min-makespan-budget", aliases=("makespan", "budget"))
def _min_makespan_budget(p: ObjectiveParams) -> CollectionObjective:
    from costopt.planning.collection import MinMakespanWithinBudget

    p.ignore("confidence")
    return MinMakespanWithinBudget(p.required_budget_usd())


def build_objective(name: str, params: Mapping[str, object] | None = None) -> Objective:
    """The single-job objective ``name`` (any case, or an alias) built from ``params`` (see the module
    docstring for the names and parameters).

    Raises :class:`UnknownObjective` for an unknown name (listing the known ones) and
    :class:`InvalidJob` for a missing, extra or invalid parameter (the message names it).
    """
    canonical = OBJECTIVES.canonical(name)
    reader = ObjectiveParams(canonical, params)
    objective = OBJECTIVES.get(canonical)(reader)
    reader.refuse_unread()
    return objective


def build_collection_objective(name: str, params: Mapping[str, object] | None = None) -> CollectionObjective:
    """The collection objective ``name`` (any case, or an alias) built from ``params``; errors as
    :func:`build_objective`."""
    canonical = COLLECTION_OBJECTIVES.canonical(name)
    reader = ObjectiveParams(canonical, params)
    objective = COLLECTION_OBJECTIVES.get(canonical)(reader)
    reader.refuse_unread()
    return objective
