"""``costopt fleets create|list|show|scale|release`` as clients of the REST API: offers, plans and files
turned into bodies, usage errors before any request, and every command against the real app (both
backends) in each format, with the exit codes of ``costopt jobs`` (2 refused input, 4 no such fleet)."""

from __future__ import annotations

import csv
import io
import json
import socket
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import typer
from sqlalchemy import Engine
from typer.testing import CliRunner

from api.cli.fleets import build_create_body, build_scale_body, parse_gpus, parse_offer
from api.cli.main import app
from costopt.settings import get_settings
from tests.api.jobs_helpers import JOB_TYPE, Service, service

runner = CliRunner()
V100 = "aws/us-east-1/us-east-1a/p3.2xlarge/spot"
K80 = "aws/us-east-1/us-east-1b/p2.xlarge/spot"


def test_an_offer_is_cloud_region_zone_type_market_with_an_optional_count() -> None:
    assert parse_offer(V100 + "*2", "--instance") == {
        "offer": {
            "cloud": "aws",
            "region": "us-east-1",
            "zone": "us-east-1a",
            "instance_type": "p3.2xlarge",
            "market": "spot",
        },
        "count": 2,
    }
    regional = parse_offer("Azure/eastus//Standard_NC6s_v3/on-demand", "--instance")
    assert regional["offer"]["zone"] == "" and regional["offer"]["market"] == "on_demand"
    assert regional["offer"]["cloud"] == "azure" and regional["count"] == 1
    for bad in ("aws/us-east-1/p3.2xlarge/spot", "aws/us-east-1/a/p3.2xlarge/cheap", V100 + "*0", V100 + "*two"):
        with pytest.raises(typer.BadParameter):
            parse_offer(bad, "--instance")


def test_gpus_per_accelerator() -> None:
    assert parse_gpus("V100=4, k80=8", "--gpus") == {"v100": 4, "k80": 8}
    for bad in ("v100", "v100=0", "=3", "v100=x", ""):
        with pytest.raises(typer.BadParameter):
            parse_gpus(bad, "--gpus")


def test_flags_override_the_file_and_one_source_of_instances_remains() -> None:
    doc = {"name": "lab", "policy": "fifo", "plan": {"accelerators": {"v100": 2}}, "round_s": 120}
    body = build_create_body(doc, policy="max_min_fairness", instances=[V100 + "*2", K80], round_s=None)
    assert body["policy"] == "max_min_fairness" and body["round_s"] == 120 and "plan" not in body
    assert [i["count"] for i in body["instances"]] == [2, 1]
    planned = build_create_body(
        {"policy": "fifo", "instances": [{"offer": {}}]}, gpus="v100=4", markets="spot", max_price=5.0
    )
    assert planned["plan"] == {"accelerators": {"v100": 4}, "markets": ["spot"], "max_usd_per_hour": 5.0}
    assert "instances" not in planned
    with pytest.raises(typer.BadParameter, match="not both"):
        build_create_body({}, policy="fifo", instances=[V100], gpus="v100=1")
    with pytest.raises(typer.BadParameter, match="needs a policy"):
        build_create_body({}, instances=[V100])
    with pytest.raises(typer.BadParameter, match="needs instances"):
        build_create_body({}, policy="fifo")
    with pytest.raises(typer.BadParameter, match="shape a plan"):
        build_create_body({}, policy="fifo", instances=[V100], markets="spot")
    assert build_scale_body([K80], "v100=1", [" fi-1 "], regions="us-east-1") == {
        "add": [parse_offer(K80, "--add")],
        "add_plan": {"accelerators": {"v100": 1}, "regions": ["us-east-1"]},
        "remove": ["fi-1"],
    }
    with pytest.raises(typer.BadParameter, match="to add"):
        build_scale_body([], None, [])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def nowhere(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Path]:
    """Settings whose service URL answers nothing."""
    monkeypatch.setenv("COSTOPT_DATABASE_URL", f"sqlite:///{tmp_path / 'c.db'}")
    monkeypatch.setenv("COSTOPT_API_URL", f"http://127.0.0.1:{_free_port()}")
    get_settings.cache_clear()
    yield tmp_path
    get_settings.cache_clear()


def test_usage_errors_exit_2_before_any_request_and_an_unreachable_service_exits_1(nowhere: Path) -> None:
    result = runner.invoke(app, ["fleets", "create", "--policy", "fifo"])
    assert result.exit_code == 2 and "needs instances" in result.output
    result = runner.invoke(app, ["fleets", "create", "--policy", "fifo", "--instance", "aws/p3.2xlarge"])
    assert result.exit_code == 2 and "is not an offer" in result.output
    bad = nowhere / "fleet.yaml"
    bad.write_text("policy: [fifo\n")
    assert runner.invoke(app, ["fleets", "create", str(bad)]).exit_code == 2
    assert runner.invoke(app, ["fleets", "scale", "fleet-x"]).exit_code == 2
    result = runner.invoke(app, ["fleets", "list"])
    assert result.exit_code == 1 and "cannot reach the costopt service" in result.output


@pytest.fixture
def svc(engine: Engine, tmp_path: Path) -> Iterator[Service]:
    yield from service(engine, tmp_path)


def _as(svc: Service, monkeypatch: pytest.MonkeyPatch, headers: dict[str, str]) -> None:
    """The CLI's client talks to the app under test with the key of ``headers``."""
    import api.cli.jobs as cli_jobs
    from api.client import ApiClient

    key = headers["Authorization"].removeprefix("Bearer ")
    monkeypatch.setattr(
        cli_jobs, "_client", lambda: ApiClient("http://testserver", key, transport=svc.client._transport)
    )


def _json(args: list[str]) -> Any:
    result = runner.invoke(app, [*args, "--format", "json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_every_command_against_the_service(svc: Service, monkeypatch: pytest.MonkeyPatch) -> None:
    _as(svc, monkeypatch, svc.alpha)
    offers = ["--instance", V100 + "*2", "--instance", K80]
    named = ["--name", "lab", "--round-s", "120", "--idempotency-key", "k-1"]
    fleet = _json(["fleets", "create", "--policy", "max_min_fairness_perf", *offers, *named])
    fid = fleet["id"]
    assert fleet["name"] == "lab" and fleet["round_s"] == 120.0 and fleet["team_id"] == svc.alpha_team
    assert [(i["accelerator"], i["state"]) for i in fleet["instances"]] == [
        ("v100", "pending"),
        ("v100", "pending"),
        ("k80", "pending"),
    ]
    again = _json(["fleets", "create", "--policy", "fifo", "--gpus", "v100=1", "--idempotency-key", "k-1"])
    assert again["id"] == fid  # the key was used: the first fleet
    table = runner.invoke(app, ["fleets", "show", fid])
    assert table.exit_code == 0, table.output
    assert f"Fleet {fid}" in table.stdout and "Instances" in table.stdout and "p3.2xlarge" in table.stdout
    svc.advance(timedelta(seconds=1))  # listed oldest first
    planned = _json(["fleets", "create", "--policy", "fifo", "--gpus", "v100=2", "--markets", "spot"])
    assert planned["gpus_planned"] == {"v100": 2}
    # list: every format carries the same fleets
    listed = _json(["fleets", "list"])
    assert [f["id"] for f in listed] == [fid, planned["id"]]
    rows = list(csv.DictReader(io.StringIO(runner.invoke(app, ["fleets", "list", "--format", "csv"]).stdout)))
    assert [r["id"] for r in rows] == [fid, planned["id"]] and rows[0]["policy"] == "max_min_fairness_perf"
    assert rows[0]["instances"] == "3" and rows[0]["jobs"] == "0/0"
    assert [f["id"] for f in _json(["fleets", "list", "--limit", "1"])] == [fid]  # one page of one
    # a job into the fleet with `costopt jobs submit --fleet`: queued there, its weight and SLO kept
    body = ["--job-type", JOB_TYPE, "--steps", "500", "--command", "python t.py", "--weight", "2", "--slo-s", "3600"]
    job = _json(["jobs", "submit", "--fleet", fid, *body])
    assert job["fleet_id"] == fid and job["provider"] == "fleet" and job["state"] == "queued"
    (fj,) = _json(["fleets", "show", fid])["jobs"]
    assert (fj["job_id"], fj["weight"], fj["slo_s"], fj["steps_total"]) == (job["id"], 2.0, 3600.0, 500)
    assert "0/500" in runner.invoke(app, ["fleets", "show", fid]).stdout  # the jobs table
    # scale: add one by offer, drain one
    drained = fleet["instances"][1]["id"]
    scaled = _json(["fleets", "scale", fid, "--add", K80, "--remove", drained])
    states = {i["id"]: i["state"] for i in scaled["instances"]}
    assert len(states) == 4 and states[drained] == "draining"
    assert _json(["fleets", "show", fid])["instances"] == scaled["instances"]
    # refused input exits 2 with the service's reason; a fleet not found (or another team's) exits 4
    result = runner.invoke(app, ["fleets", "create", "--policy", "max_min_fairnes", "--instance", V100])
    assert result.exit_code == 2 and "max_min_fairness" in result.output
    result = runner.invoke(app, ["fleets", "create", "--policy", "fifo", "--instance", V100.replace("1a", "1f")])
    assert result.exit_code == 2
    assert runner.invoke(app, ["fleets", "show", "fleet-0000000000000000"]).exit_code == 4
    _as(svc, monkeypatch, svc.beta)
    assert runner.invoke(app, ["fleets", "show", fid]).exit_code == 4
    assert runner.invoke(app, ["fleets", "release", fid]).exit_code == 4
    assert _json(["fleets", "list"]) == []
    _as(svc, monkeypatch, svc.alpha)
    released = _json(["fleets", "release", fid])
    assert released["state"] == "released" and released["released_at"]
    assert _json(["fleets", "release", fid])["state"] == "released"  # idempotent
    result = runner.invoke(app, ["fleets", "scale", fid, "--add", K80])
    assert result.exit_code == 2 and "released" in result.output  # 409
    _as(svc, monkeypatch, svc.admin)
    assert {f["id"] for f in _json(["fleets", "list", "--team", svc.alpha_team])} == {fid, planned["id"]}
