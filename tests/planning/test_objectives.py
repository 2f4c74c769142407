"""The objective registry: one builder from a plain parameter mapping for every face."""

from __future__ import annotations

from decimal import Decimal

import pytest

from costopt.domain import Cloud
from costopt.planning.collection import MinMakespanWithinBudget, MinTotalCost, SweepMinCost
from costopt.planning.model import (
    Assumptions,
    EgressRates,
    InvalidJob,
    JobSpec,
    MinCost,
    MinCostByDeadline,
    MinTime,
    MinTimeWithinBudget,
    Weighted,
)
from costopt.planning.objectives import (
    COLLECTION_OBJECTIVES,
    OBJECTIVES,
    UnknownObjective,
    build_collection_objective,
    build_objective,
)
from costopt.registry import UnknownName
from costopt.throughput.model import JobType


@pytest.mark.parametrize(
    ("name", "params", "expected"),
    [
        ("min-cost", {}, MinCost()),
        ("cheapest", {"confidence": 0.9, "cost_weight": 0.3}, MinCost()),
        ("min-cost", {"deadline_hours": 48, "confidence": 0.9}, MinCostByDeadline(48.0, 0.9)),
        ("MIN-COST-DEADLINE", {"deadline_hours": "12.5"}, MinCostByDeadline(12.5, 0.95)),
        ("deadline", {"deadline_hours": 6, "budget_usd": None}, MinCostByDeadline(6.0)),
        ("min-time", {}, MinTime()),
        ("fastest", {"budget_usd": 100}, MinTimeWithinBudget(Decimal(100))),
        ("min-time-budget", {"budget_usd": 0.1}, MinTimeWithinBudget(Decimal("0.1"))),  # float: its repr
        ("budget", {"budget_usd": "250.50"}, MinTimeWithinBudget(Decimal("250.50"))),
        ("budget", {"budget_usd": Decimal("7")}, MinTimeWithinBudget(Decimal("7"))),
        ("weighted", {}, Weighted(0.5)),
        ("weighted", {"cost_weight": 0.8, "confidence": 0.99}, Weighted(0.8)),
    ],
)
def test_each_name_and_alias_builds_its_objective(name: str, params: dict[str, object], expected: object) -> None:
    assert build_objective(name, params) == expected


def test_the_registries_name_every_objective() -> None:
    assert OBJECTIVES.names() == ("min-cost", "min-time", "min-cost-deadline", "min-time-budget", "weighted")
    assert OBJECTIVES.aliases() == {
        "cheapest": "min-cost",
        "fastest": "min-time",
        "deadline": "min-cost-deadline",
        "budget": "min-time-budget",
    }
    assert COLLECTION_OBJECTIVES.names() == ("sweep-min-cost", "min-total-cost", "min-makespan-budget")
    assert COLLECTION_OBJECTIVES.aliases() == {
        "deadline": "sweep-min-cost",
        "min-cost": "min-total-cost",
        "makespan": "min-makespan-budget",
        "budget": "min-makespan-budget",
    }
    # every objective names itself as registered, so plans echo the canonical name
    built = {
        "min-cost": build_objective("min-cost"),
        "min-time": build_objective("min-time"),
        "min-cost-deadline": build_objective("min-cost-deadline", {"deadline_hours": 1}),
        "min-time-budget": build_objective("min-time-budget", {"budget_usd": 1}),
        "weighted": build_objective("weighted"),
    }
    assert {name: obj.name for name, obj in built.items()} == {n: n for n in OBJECTIVES.names()}


def test_an_unknown_objective_lists_the_known_ones_and_close_matches() -> None:
    with pytest.raises(UnknownObjective) as info:
        build_objective("min-cots")
    err = info.value
    assert isinstance(err, InvalidJob) and isinstance(err, UnknownName)
    assert err.close[0] == "min-cost"
    assert all(name in str(err) for name in OBJECTIVES.names())
    with pytest.raises(UnknownObjective, match="known: sweep-min-cost, min-total-cost, min-makespan-budget"):
        build_collection_objective("sweep")


@pytest.mark.parametrize(
    ("name", "params", "message"),
    [
        ("min-cost-deadline", {}, "min-cost-deadline needs deadline_hours"),
        ("deadline", {"confidence": 0.9}, "min-cost-deadline needs deadline_hours"),
        ("min-time-budget", {"budget_usd": None}, "min-time-budget needs budget_usd"),
        ("min-cost", {"budget_usd": 10}, "min-cost takes no budget_usd"),
        ("min-time", {"deadline_hours": 10}, "min-time takes no deadline_hours"),
        ("weighted", {"deadline_hours": 1, "budget_usd": 1}, "weighted takes no budget_usd, deadline_hours"),
        ("min-cost", {"deadlne_hours": 5}, "unknown parameter\\(s\\) deadlne_hours; parameters are"),
        ("min-cost", {"deadline_hours": float("nan")}, "deadline_hours must be a finite number"),
        ("min-cost", {"deadline_hours": True}, "deadline_hours must be a number"),
        ("min-cost", {"deadline_hours": "soon"}, "deadline_hours must be a number"),
        ("min-cost", {"deadline_hours": -1}, "the deadline must be in the future"),
        ("deadline", {"deadline_hours": 5, "confidence": 1.0}, "confidence must be in"),
        ("budget", {"budget_usd": "lots"}, "budget_usd must be a finite amount of USD"),
        ("budget", {"budget_usd": float("inf")}, "budget_usd must be a finite amount of USD"),
        ("budget", {"budget_usd": 0}, "the budget must be positive"),
        ("weighted", {"cost_weight": 2}, "cost_weight must be in"),
    ],
)
def test_a_missing_extra_or_invalid_parameter_is_named(name: str, params: dict[str, object], message: str) -> None:
    with pytest.raises(InvalidJob, match=message):
        build_objective(name, params)


def test_collection_objectives_by_name_and_alias() -> None:
    assert build_collection_objective("sweep-min-cost", {"deadline_hours": 48, "confidence": 0.9}) == SweepMinCost(
        48.0, 0.9
    )
    assert build_collection_objective("deadline", {"deadline_hours": 2, "joint": True}) == SweepMinCost(2.0, joint=True)
    assert build_collection_objective("MIN-COST", {"confidence": 0.95}) == MinTotalCost()
    assert build_collection_objective("budget", {"budget_usd": "5000"}) == MinMakespanWithinBudget(Decimal(5000))
    with pytest.raises(InvalidJob, match="sweep-min-cost needs deadline_hours"):
        build_collection_objective("sweep-min-cost", {"budget_usd": 1})
    with pytest.raises(InvalidJob, match="min-total-cost takes no budget_usd"):
        build_collection_objective("min-total-cost", {"budget_usd": 1})
    with pytest.raises(InvalidJob, match="joint must be true or false"):
        build_collection_objective("sweep-min-cost", {"deadline_hours": 1, "joint": "yes"})


@pytest.mark.parametrize(
    ("collection", "name", "params", "message"),
    [
        (
            False,
            "min-cost",
            {"budget_usd": 10},
            "min-cost takes no budget_usd (a budget needs min-time or min-time-budget)",
        ),
        (
            False,
            "min-time",
            {"deadline_hours": 10},
            "min-time takes no deadline_hours (a deadline needs min-cost or min-cost-deadline)",
        ),
        (
            False,
            "min-cost-deadline",
            {"deadline_hours": 1, "joint": True},
            "min-cost-deadline takes no joint (joint is for collection deadlines)",
        ),
        (
            True,
            "min-total-cost",
            {"deadline_hours": 3, "budget_usd": 3, "cost_weight": 0.5},
            "min-total-cost takes no budget_usd, cost_weight, deadline_hours (a budget needs min-time or "
            "min-time-budget; cost_weight is for weighted; a deadline needs min-cost or min-cost-deadline)",
        ),
        (
            False,
            "deadline",
            {"deadline_hours": 5, "confidence": "high"},
            "min-cost-deadline: confidence must be a number, got 'high'",
        ),
        (
            False,
            "min-cost",
            {"deadlne_hours": 5, "x": 1},
            "min-cost: unknown parameter(s) deadlne_hours, x; parameters are deadline_hours, budget_usd, confidence, "
            "cost_weight, joint",
        ),
    ],
)
def test_a_refused_parameter_names_the_objective_that_takes_it(
    collection: bool, name: str, params: dict[str, object], message: str
) -> None:
    build = build_collection_objective if collection else build_objective
    with pytest.raises(InvalidJob) as info:
        build(name, params)
    assert str(info.value) == message  # the whole hint, word for word: it tells the user what to do


def test_the_model_bounds_are_inclusive_where_documented_and_egress_has_defaults() -> None:
    job_type = JobType.parse("A3C")
    with pytest.raises(InvalidJob, match="steps must be > 0"):
        JobSpec(job_type, 0.0)
    with pytest.raises(InvalidJob):
        MinCostByDeadline(0.0)
    assert MinCostByDeadline(1.0, 0.5).confidence == 0.5  # 0.5 is allowed, 1.0 is not
    with pytest.raises(InvalidJob):
        MinCostByDeadline(1.0, 1.0)
    assert Assumptions(restart_hours=0.0).restart_hours == 0.0
    with pytest.raises(InvalidJob, match="checkpoint interval must be > 0"):
        Assumptions(checkpoint_interval_hours=0.0)
    with pytest.raises(InvalidJob, match="restart time >= 0"):
        Assumptions(restart_hours=-0.1)
    bare = EgressRates()  # a cloud without a listed rate: $0.02/GB between regions, $0.09/GB out
    assert bare.rate(Cloud.AWS, "us-east-1", Cloud.AWS, "us-west-2") == 0.02
    assert bare.rate(Cloud.AWS, "us-east-1", Cloud.GCP, "us-east1") == 0.09
    assert bare.rate(Cloud.AWS, "us-east-1", Cloud.AWS, "us-east-1") == 0.0
    own = EgressRates(inter_region={Cloud.GCP: 0.01}, internet={Cloud.GCP: 0.12})
    assert own.rate(Cloud.GCP, "a", Cloud.GCP, "b") == 0.01 and own.rate(Cloud.GCP, "a", Cloud.AWS, "b") == 0.12
