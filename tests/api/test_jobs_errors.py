"""The one JSON error shape on every kind of bad input, never a 5xx for the caller's mistake, and
nothing written (both backends)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, func, select

from costopt.db.jobs_schema import jobs
from tests.api.jobs_helpers import BODY, Service, error_of, service

pytestmark = pytest.mark.one_backend_each  # the database is not the subject here: tests/conftest.py


@pytest.fixture
def svc(engine: Engine, tmp_path: Path) -> Iterator[Service]:
    yield from service(engine, tmp_path)


def _rows(svc: Service) -> int:
    with svc.store.engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(jobs)).scalar_one())


BAD_BODIES: list[tuple[str, dict[str, Any], set[str]]] = [
    ("wrong types", {**BODY, "steps": "many", "gpus": 3, "command": "python train.py"}, {"steps", "gpus", "command"}),
    ("negative steps", {**BODY, "steps": -5}, {"steps"}),
    ("zero steps", {**BODY, "steps": 0}, {"steps"}),
    ("huge steps", {**BODY, "steps": 10**30}, {"steps"}),
    ("huge float", {**BODY, "checkpoint_gb": 1e308}, {"checkpoint_gb"}),
    ("fractional steps", {**BODY, "steps": 10.5}, {"steps"}),
    ("missing fields", {"job_type": "x"}, {"steps", "command"}),
    ("unknown field", {**BODY, "priority": "high"}, {"priority"}),
    ("unknown nested fields", {**BODY, "objective": {"name": "min-cost", "deadline": 3}}, {"objective.deadline"}),
    ("misspelt constraint", {**BODY, "constraints": {"cloud": ["aws"]}}, {"constraints.cloud"}),
    ("unknown cloud", {**BODY, "constraints": {"clouds": ["ibm"]}}, {"constraints.clouds.0"}),
    ("unknown market", {**BODY, "constraints": {"markets": ["reserved"]}}, {"constraints.markets.0"}),
    ("unknown objective", {**BODY, "objective": {"name": "cheap-and-fast"}}, {"objective.name"}),
    ("deadline objective without deadline", {**BODY, "objective": {"name": "min-cost-deadline"}}, {"objective"}),
    (
        "confidence out of range",
        {**BODY, "objective": {"name": "min-cost", "confidence": 1.5}},
        {"objective.confidence"},
    ),
    ("negative budget", {**BODY, "objective": {"name": "min-time", "budget_usd": "-3"}}, {"objective.budget_usd"}),
    ("budget on min-cost", {**BODY, "objective": {"name": "min-cost", "budget_usd": "30"}}, {"objective"}),
    ("deadline on weighted", {**BODY, "objective": {"name": "weighted", "deadline_hours": 3}}, {"objective"}),
    (
        "budget not a number",
        {**BODY, "objective": {"name": "min-time", "budget_usd": "lots"}},
        {"objective.budget_usd"},
    ),
    ("over-long name", {**BODY, "name": "n" * 201}, {"name"}),
    ("over-long argument", {**BODY, "command": ["x" * 4097]}, {"command.0"}),
    ("too many arguments", {**BODY, "command": ["x"] * 257}, {"command"}),
    ("empty command", {**BODY, "command": []}, {"command"}),
    ("too many regions", {**BODY, "constraints": {"regions": [f"r{i}" for i in range(201)]}}, {"constraints.regions"}),
    ("both job type and throughput", {**BODY, "throughput": {"v100": 3.0}}, {"body"}),
    ("neither job type nor throughput", {k: v for k, v in BODY.items() if k != "job_type"}, {"body"}),
    (
        "zero throughput",
        {**{k: v for k, v in BODY.items() if k != "job_type"}, "throughput": {"v100": 0}},
        {"throughput.v100"},
    ),
    ("not an object", [BODY], {"body"}),  # type: ignore[list-item]
]


@pytest.mark.parametrize(("case", "body", "fields"), BAD_BODIES, ids=[c[0] for c in BAD_BODIES])
def test_bad_bodies_get_422_naming_each_field(svc: Service, case: str, body: Any, fields: set[str]) -> None:
    r = svc.client.post("/v1/jobs", json=body, headers=svc.alpha)
    err = error_of(r, 422, "invalid_request")
    named = {d["field"] for d in err["details"]}
    assert fields <= named, (case, err)
    assert all(d["problem"] for d in err["details"])
    assert _rows(svc) == 0


@pytest.mark.parametrize(
    "raw",
    [
        b'{"job_type": "ResNet-50 (batch size 128)", "steps": 5, "command": ["x"]',  # cut short
        b"{not json",
        b"",
        b'{"job_type": "x", "steps": 5, "command": ["x"],}',
    ],
    ids=["truncated", "garbage", "empty", "trailing comma"],
)
def test_malformed_json_is_a_422_saying_so(svc: Service, raw: bytes) -> None:
    r = svc.client.post("/v1/jobs", content=raw, headers={**svc.alpha, "Content-Type": "application/json"})
    err = error_of(r, 422, "invalid_request")
    assert err["details"][0]["field"] == "body"
    assert _rows(svc) == 0


@pytest.mark.parametrize(
    ("field", "literal"),
    [("checkpoint_gb", "NaN"), ("checkpoint_gb", "Infinity"), ("steps", "NaN"), ("steps", "1e400")],
)
def test_nan_and_infinity_are_refused(svc: Service, field: str, literal: str) -> None:
    text = json.dumps({**BODY, field: 1}).replace(f'"{field}": 1', f'"{field}": {literal}')
    r = svc.client.post("/v1/jobs", content=text, headers={**svc.alpha, "Content-Type": "application/json"})
    err = error_of(r, 422, "invalid_request")
    assert field in {d["field"] for d in err["details"]}
    assert _rows(svc) == 0


def test_an_integer_of_thousands_of_digits_is_a_4xx(svc: Service) -> None:
    text = json.dumps(BODY).replace('"steps": 50000', '"steps": 1' + "0" * 5000)
    r = svc.client.post("/v1/jobs", content=text, headers={**svc.alpha, "Content-Type": "application/json"})
    assert 400 <= r.status_code < 500
    error_of(r, r.status_code)
    assert _rows(svc) == 0


def test_a_body_over_the_limit_gets_413_before_any_route(svc: Service) -> None:
    big = {**BODY, "command": ["x" * 4000] * 20}  # 80 KB > 64 KiB
    err = error_of(svc.client.post("/v1/jobs", json=big, headers=svc.alpha), 413, "body_too_large")
    assert "65536" in err["message"]

    def chunks() -> Iterator[bytes]:  # no Content-Length: the limit is counted while reading
        yield json.dumps(big).encode()

    error_of(svc.client.post("/v1/jobs", content=chunks(), headers=svc.alpha), 413, "body_too_large")
    assert _rows(svc) == 0
    # under the limit is fine
    assert (
        svc.client.post("/v1/jobs", json={**BODY, "command": ["x" * 4000] * 10}, headers=svc.alpha).status_code == 201
    )


def test_query_and_header_errors(svc: Service) -> None:
    long_key = {**svc.alpha, "Idempotency-Key": "k" * 201}
    err = error_of(svc.client.post("/v1/jobs", json=BODY, headers=long_key), 422, "invalid_request")
    assert err["details"][0]["field"] == "header.Idempotency-Key"
    for params in ({"limit": 0}, {"limit": "ten"}, {"cursor": "x" * 201}, {"state": "lost"}):
        error_of(svc.client.get("/v1/jobs", params=params, headers=svc.alpha), 422, "invalid_request")
    job = svc.submit(svc.alpha)
    for params in ({"tail": 0}, {"tail": 10**9}):
        error_of(svc.client.get(f"/v1/jobs/{job['id']}/logs", params=params, headers=svc.alpha), 422)
    error_of(svc.client.get(f"/v1/jobs/{job['id']}/events", params={"after": -1}, headers=svc.alpha), 422)
    error_of(svc.client.get("/v1/jobs/" + "j" * 65, headers=svc.alpha), 422)
    assert _rows(svc) == 1


def test_unknown_routes_and_methods(svc: Service) -> None:
    assert "no route" in error_of(svc.client.get("/v1/nothing-here"), 404, "not_found")["message"]
    error_of(svc.client.delete("/v1/jobs", headers=svc.alpha), 405, "method_not_allowed")
    error_of(svc.client.put("/v1/admin/teams", headers=svc.admin), 405, "method_not_allowed")


def test_an_unexpected_failure_is_a_500_that_leaks_nothing(svc: Service) -> None:
    def boom() -> None:
        raise RuntimeError("secret internal detail: postgresql://user:pw@db")

    svc.app.add_api_route("/v1/boom", boom)
    with TestClient(svc.app, raise_server_exceptions=False) as client:
        r = client.get("/v1/boom")
    err = error_of(r, 500, "internal_error")
    assert "secret" not in r.text and "postgresql" not in r.text and "Traceback" not in r.text
    assert err["message"]


def test_batches_refuse_bad_input_alike(svc: Service) -> None:
    ok_job = {**BODY}
    for body, field in (
        ({"jobs": [], "objective": {"name": "deadline"}}, "jobs"),
        ({"jobs": [ok_job] * 501, "objective": {"name": "deadline"}}, "jobs"),
        ({"jobs": [ok_job], "objective": {"name": "makespan"}}, "objective"),
        ({"jobs": [ok_job], "objective": {"name": "deadline", "budget_usd": 5}}, "objective"),
        ({"jobs": [ok_job], "objective": {"name": "soonest"}}, "objective.name"),
        ({"jobs": [{**ok_job, "steps": -1}], "objective": {"name": "deadline"}}, "jobs.0.steps"),
        (
            {"jobs": [ok_job], "objective": {"name": "deadline"}, "quotas": [{"cloud": "aws", "gpus": -1}]},
            "quotas.0.gpus",
        ),
        ({"jobs": [ok_job], "objective": {"name": "deadline"}, "extra": 1}, "extra"),
    ):
        r = svc.client.post("/v1/batches", json=body, headers=svc.alpha)
        err = error_of(r, 422, "invalid_request")
        assert field in {d["field"] for d in err["details"]}, (field, err)
    assert _rows(svc) == 0
