"""The CLI's job and admin commands as clients: the job body from a YAML file and flags, clear errors
when the service is unreachable or the input is bad, and admin keys made on the database directly."""

from __future__ import annotations

import socket

import pytest
import typer
from typer.testing import CliRunner

from api.cli.jobs import build_body, parse_hours
from api.cli.main import app
from costopt.db.engine import make_engine
from costopt.jobs.teams import TeamRepository
from costopt.settings import get_settings

runner = CliRunner()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def env(monkeypatch, tmp_path):
    monkeypatch.setenv("COSTOPT_DATABASE_URL", f"sqlite:///{tmp_path / 'c.db'}")
    monkeypatch.setenv("COSTOPT_API_URL", f"http://127.0.0.1:{_free_port()}")
    get_settings.cache_clear()
    yield tmp_path
    get_settings.cache_clear()


def test_flags_override_the_file_and_build_the_rest_body():
    doc = {
        "name": "sweep-1",
        "job_type": "ResNet-50 (batch size 128)",
        "steps": 1000,
        "command": "python train.py --lr 0.1",
        "objective": {"name": "min-cost", "deadline_hours": 10},
        "constraints": {"clouds": ["aws"]},
    }
    body = build_body(
        doc,
        name=None,
        job_type=None,
        steps=2000,
        gpus=None,
        command=None,
        image=None,
        checkpoint_uri=None,
        checkpoint_gb=None,
        objective=None,
        deadline="2d",
        budget=None,
        cost_weight=None,
        clouds="aws,gcp",
        regions=None,
        markets="spot",
        accelerators=None,
        max_price=3.5,
    )
    assert body["steps"] == 2000 and body["name"] == "sweep-1"
    assert body["command"] == ["python", "train.py", "--lr", "0.1"]
    assert body["objective"] == {"name": "min-cost", "deadline_hours": 48.0}
    assert body["constraints"] == {"clouds": ["aws", "gcp"], "markets": ["spot"], "max_usd_per_hour": 3.5}


@pytest.mark.parametrize(("text", "hours"), [("48h", 48.0), ("2d", 48.0), ("90min", 1.5), ("1w", 168.0), ("12", 12.0)])
def test_durations(text, hours):
    assert parse_hours(text, "--deadline") == pytest.approx(hours)


def test_a_bad_duration_is_a_usage_error():
    with pytest.raises(typer.BadParameter, match="not a duration"):
        parse_hours("soon", "--deadline")


def test_submit_without_a_command_is_a_usage_error(env):
    result = runner.invoke(app, ["jobs", "submit", "--steps", "10", "--job-type", "A3C"])
    assert result.exit_code == 2
    assert "needs a command" in result.output


def test_a_file_that_is_not_yaml_is_a_usage_error(env):
    bad = env / "job.yaml"
    bad.write_text("steps: [1, 2\n")
    result = runner.invoke(app, ["jobs", "submit", str(bad)])
    assert result.exit_code == 2
    assert "not valid YAML" in result.output


def test_an_unreachable_service_says_how_to_start_it(env):
    result = runner.invoke(app, ["jobs", "list"])
    assert result.exit_code == 1
    assert "cannot reach the costopt service" in result.output and "make run" in result.output


def test_admin_local_makes_a_team_whose_key_authenticates(env):
    result = runner.invoke(app, ["admin", "create-team", "vision", "--local"])
    assert result.exit_code == 0, result.output
    key = result.stdout.strip().splitlines()[-1]
    teams = TeamRepository(make_engine(f"sqlite:///{env / 'c.db'}"))
    found = teams.authenticate(key)
    assert found is not None
    team = teams.team(found.team_id)
    assert team is not None and team.name == "vision"
    again = runner.invoke(app, ["admin", "create-team", "vision", "--local"])
    assert again.exit_code == 1 and "exists already" in again.output
    listed = runner.invoke(app, ["admin", "teams", "--local", "-f", "json"])
    assert '"vision"' in listed.stdout


@pytest.mark.parametrize(("value", "shown"), [("0.423828", "0.42"), ("0.125", "0.12"), ("0.135", "0.14"), (None, None)])
def test_tables_show_money_to_the_cent(value, shown):
    from api.cli.jobs import _cents

    assert _cents(value) == shown


def test_following_finds_what_is_new_in_a_moving_window():
    from api.cli.jobs import new_lines

    out = [f"step {i}" for i in range(30)]
    assert new_lines([], out[:5]) == out[:5]
    assert new_lines(out[:5], out[:8]) == out[5:8]  # the window still starts at the beginning
    assert new_lines(out[:12], out[10:20]) == out[12:20]  # the window moved past the first lines
    assert new_lines(out[:12], out[12:20]) == out[12:20]  # every line printed has left the window
    assert new_lines(out[:12], out[2:12]) == []  # nothing new
    repeated = ["x", "x", "y", "x", "x"]
    assert new_lines(["y", "x", "x"], [*repeated, "z"]) == ["z"]  # the anchor's latest place wins
