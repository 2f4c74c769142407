"""The CLI (`plan`, `plan-batch`) and REST (`/v1/plans`) build objectives through the one registry: the
same inputs give the same objective, and an unknown name lists the known ones on every face."""

from __future__ import annotations

import re
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path

import pytest
import typer
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from api.app import create_app
from api.cli import plan as plan_cli
from api.cli.batch_file import BatchFile, build_spec
from api.cli.main import app as cli_app
from api.routes.plans import PlanRequest
from costopt.planning.objectives import COLLECTION_OBJECTIVES, OBJECTIVES, build_collection_objective, build_objective
from costopt.settings import Settings, get_settings


def _plain(text: str) -> str:
    """Rich's usage box wraps lines: the text without the box and line breaks."""
    return " ".join(re.sub("[│╭╮╰╯─]", " ", text).split())


@pytest.mark.parametrize(
    ("name", "deadline_hours", "budget", "confidence", "cost_weight"),
    [
        ("min-cost", None, None, 0.95, 0.5),
        ("min-cost", 48.0, None, 0.9, 0.5),
        ("min-cost-deadline", 1.5, None, 0.99, 0.5),
        ("deadline", 72.0, None, 0.95, 0.5),
        ("min-time", None, None, 0.95, 0.5),
        ("min-time", None, "1200.50", 0.95, 0.5),
        ("Min-Time-Budget", None, "99", 0.95, 0.5),
        ("weighted", None, None, 0.95, 0.25),
    ],
)
def test_cli_and_rest_build_the_same_objective(
    name: str, deadline_hours: float | None, budget: str | None, confidence: float, cost_weight: float
) -> None:
    from_cli = plan_cli.build_objective(
        name, None if deadline_hours is None else f"{deadline_hours}h", budget, confidence, cost_weight
    )
    from_rest = PlanRequest(
        job_type="A3C",
        steps=1,
        objective=name,
        deadline_hours=deadline_hours,
        budget_usd=None if budget is None else Decimal(budget),
        confidence=confidence,
        cost_weight=cost_weight,
    ).build_objective()
    core = build_objective(
        name,
        {
            "deadline_hours": deadline_hours,
            "budget_usd": budget,
            "confidence": confidence,
            "cost_weight": cost_weight,
        },
    )
    assert from_cli == from_rest == core


def test_plan_batch_builds_the_collection_objective_of_the_registry() -> None:
    cases: list[tuple[str, dict[str, object], dict[str, object]]] = [
        ("sweep-min-cost", {"deadline": "48h", "confidence": 0.9}, {"deadline_hours": 48, "confidence": 0.9}),
        ("deadline", {"deadline": "PT6H"}, {"deadline_hours": 6}),
        ("min-total-cost", {}, {}),
        ("min-makespan-budget", {"budget": "5000"}, {"budget_usd": 5000}),
    ]
    for kind, fields, params in cases:
        batch = BatchFile.model_validate({"objective": {"kind": kind, **fields}, "jobs": [{"type": "A3C", "steps": 1}]})
        assert build_spec(batch).objective == build_collection_objective(kind, params)


def test_plan_batch_names_the_known_kinds_and_the_missing_field() -> None:
    jobs = [{"type": "A3C", "steps": 1}]
    with pytest.raises(typer.BadParameter) as info:
        build_spec(BatchFile.model_validate({"objective": {"kind": "sweep-min-cots"}, "jobs": jobs}))
    assert "did you mean 'sweep-min-cost'" in str(info.value)
    assert all(name in str(info.value) for name in COLLECTION_OBJECTIVES.names())
    with pytest.raises(typer.BadParameter, match=re.escape("sweep-min-cost needs objective.deadline (e.g. 48h)")):
        build_spec(BatchFile.model_validate({"objective": {"kind": "sweep-min-cost"}, "jobs": jobs}))


def test_the_cli_help_names_every_objective_and_alias() -> None:
    named = set(re.findall(r"[a-z]+(?:-[a-z]+)*", plan_cli.OBJECTIVE_HELP)) - {"alias", "or", "any", "case"}
    assert named == set(OBJECTIVES.names()) | set(OBJECTIVES.aliases())


@pytest.fixture
def cli_db(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("COSTOPT_DATABASE_URL", f"sqlite:///{tmp_path / 'cli.db'}")
    get_settings.cache_clear()
    yield
    get_settings.cache_clear()


def test_the_cli_names_the_known_objectives_for_an_unknown_one(cli_db: None) -> None:
    result = CliRunner().invoke(cli_app, ["plan", "--job-type", "A3C", "--steps", "10", "--objective", "min-cots"])
    assert result.exit_code == 2
    text = _plain(result.stderr)
    assert "unknown objective 'min-cots' (did you mean 'min-cost'" in text
    assert "known: min-cost, min-time, min-cost-deadline, min-time-budget, weighted" in text


def test_the_cli_names_its_own_option_for_a_missing_parameter(cli_db: None) -> None:
    args = ["plan", "--job-type", "A3C", "--steps", "10", "--objective", "deadline"]
    result = CliRunner().invoke(cli_app, args)
    assert result.exit_code == 2
    assert "min-cost-deadline needs --deadline (e.g. 48h)" in _plain(result.stderr)
    result = CliRunner().invoke(cli_app, [*args[:-1], "min-time", "--deadline", "4h"])
    assert result.exit_code == 2
    assert "min-time takes no --deadline" in _plain(result.stderr)


def test_rest_names_the_known_objectives_for_an_unknown_one(tmp_path: Path) -> None:
    settings = Settings(database_url=f"sqlite:///{tmp_path / 'rest.db'}", seed_on_start=False, collectors_enabled=False)
    with TestClient(create_app(settings)) as client:
        r = client.post("/v1/plans", json={"job_type": "A3C", "steps": 10, "objective": "fastst"})
    assert r.status_code == 422
    assert "unknown objective 'fastst' (did you mean 'fastest'?)" in r.text
    assert all(name in r.text for name in OBJECTIVES.names())
