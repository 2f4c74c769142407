"""POST /v1/batches: the collection planner places the jobs together; each is queued with its planned
offer as its quote, sharing the batch id; retries are idempotent (both backends)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, func, select

from costopt.db.jobs_schema import batches, jobs
from costopt.domain import OfferKey
from costopt.throughput.model import Precision
from tests.api.jobs_helpers import BODY, Service, error_of, service


@pytest.fixture
def svc(engine: Engine, tmp_path: Path) -> Iterator[Service]:
    yield from service(engine, tmp_path)


def _count(svc: Service, table: Any) -> int:
    with svc.store.engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(table)).scalar_one())


THROUGHPUT_JOB = {
    **{k: v for k, v in BODY.items() if k != "job_type"},
    "throughput": {"k80": 3.0},
    "name": "own",
}
BATCH = {
    "jobs": [{**BODY, "name": "a"}, {**BODY, "name": "b", "gpus": 4}, THROUGHPUT_JOB],
    "objective": {"name": "deadline", "deadline_hours": 72},
}


def test_a_batch_is_planned_together_and_queued(svc: Service) -> None:
    r = svc.client.post("/v1/batches", json=BATCH, headers=svc.alpha)
    assert r.status_code == 201, r.text
    doc = r.json()
    assert doc["id"].startswith("batch-") and [j["name"] for j in doc["jobs"]] == ["a", "b", "own"]
    assert {j["batch_id"] for j in doc["jobs"]} == {doc["id"]} and {j["state"] for j in doc["jobs"]} == {"queued"}
    placed = [(a["instance_type"], a["count"]) for g in doc["plan"]["groups"] for a in g["allocations"]]
    assert len(placed) == 3 and all(n == 1 for _, n in placed)
    quotes = [j["quote"] for j in doc["jobs"]]
    assert [q["offer"]["instance_type"] for q in quotes] == [t for t, _ in placed]
    assert quotes[1]["offer"]["instance_type"] == "p3.8xlarge"  # the only 4-GPU offer
    assert quotes[2]["offer"]["accelerator"] == "k80" and quotes[2]["steps_per_s"] == pytest.approx(3.0)
    for q in quotes:  # whole-instance: the offer's own price from the store, times the expected hours
        price = svc.store.price_at(OfferKey.from_doc(q["offer"]), datetime.fromisoformat(q["as_of"]))
        assert price is not None and q["usd_per_hour"] == price.usd_per_hour
        assert float(Decimal(q["expected_cost_usd"])) == pytest.approx(
            price.usd_per_hour * q["expected_hours"], rel=1e-6
        )
        stored = svc.jobs.get(next(j["id"] for j in doc["jobs"] if j["quote"] == q)).quote
        assert stored is not None and stored["candidates"][0]["offer"] == q["offer"]  # planned offer first
    total = sum(Decimal(q["expected_cost_usd"]) for q in quotes)
    assert float(total) == pytest.approx(doc["plan"]["total_expected_cost_usd"], abs=0.01)
    listed = svc.client.get("/v1/jobs", params={"batch": doc["id"]}, headers=svc.alpha).json()
    assert sorted(j["id"] for j in listed["items"]) == sorted(j["id"] for j in doc["jobs"]) and listed["total"] == 3


def test_a_retried_batch_returns_the_first_one(svc: Service) -> None:
    headers = {**svc.alpha, "Idempotency-Key": "sweep-1"}
    first = svc.client.post("/v1/batches", json=BATCH, headers=headers)
    again = svc.client.post("/v1/batches", json=BATCH, headers=headers)
    assert first.status_code == 201 and again.status_code == 200
    assert again.json()["id"] == first.json()["id"]
    assert [j["id"] for j in again.json()["jobs"]] == [j["id"] for j in first.json()["jobs"]]
    assert _count(svc, batches) == 1 and _count(svc, jobs) == 3
    other = svc.client.post("/v1/batches", json=BATCH, headers={**svc.beta, "Idempotency-Key": "sweep-1"})
    assert other.status_code == 201 and _count(svc, jobs) == 6


def test_a_makespan_batch_within_a_budget(svc: Service) -> None:
    body = {"jobs": [BODY, BODY], "objective": {"name": "makespan", "budget_usd": "500"}}
    r = svc.client.post("/v1/batches", json=body, headers=svc.alpha)
    assert r.status_code == 201, r.text
    assert sum(Decimal(j["quote"]["expected_cost_usd"]) for j in r.json()["jobs"]) <= 500


def test_quotas_that_cannot_hold_the_batch_are_infeasible(svc: Service) -> None:
    body = {**BATCH, "quotas": [{"cloud": "aws", "gpus": 0}, {"cloud": "azure", "gpus": 0}]}
    err = error_of(svc.client.post("/v1/batches", json=body, headers=svc.alpha), 422, "infeasible")
    assert err["details"][0]["binding"] in ("quota", "throughput")
    assert _count(svc, jobs) == 0 and _count(svc, batches) == 0


def test_a_batch_with_an_unknown_job_type_names_the_closest(svc: Service) -> None:
    body = {**BATCH, "jobs": [{**BODY, "job_type": "ResNet-50 (batch size 127)"}]}
    err = error_of(svc.client.post("/v1/batches", json=body, headers=svc.alpha), 422, "unknown_job_type")
    assert "ResNet-50 (batch size 128)" in err["details"][0]["did_you_mean"]
    assert _count(svc, jobs) == 0


def test_jobs_of_a_batch_share_their_constraints(svc: Service) -> None:
    body = {**BATCH, "jobs": [{**BODY, "constraints": {"clouds": ["aws"]}}, BODY]}
    err = error_of(svc.client.post("/v1/batches", json=body, headers=svc.alpha), 422, "invalid_request")
    assert "same constraints" in err["message"]
    same = {**BATCH, "jobs": [{**BODY, "constraints": {"clouds": ["azure"]}}] * 2}
    r = svc.client.post("/v1/batches", json=same, headers=svc.alpha)
    assert r.status_code == 201 and {j["quote"]["offer"]["cloud"] for j in r.json()["jobs"]} == {"azure"}


def test_a_batch_plans_each_job_at_its_precision(svc: Service) -> None:
    from api.planning import catalog_at

    body = {
        "jobs": [{**BODY, "name": "fp32"}, {**BODY, "name": "amp", "precision": "amp"}],
        "objective": {"name": "deadline", "deadline_hours": 72},
    }
    r = svc.client.post("/v1/batches", json=body, headers=svc.alpha)
    assert r.status_code == 201, r.text
    fp32, amp = r.json()["jobs"]
    assert [svc.jobs.get(j["id"]).spec["precision"] for j in (fp32, amp)] == ["fp32", "amp"]
    settings = svc.app.state.settings
    planned: tuple[tuple[Any, Precision], ...] = ((fp32, "fp32"), (amp, "amp"))
    for job, precision in planned:
        q = job["quote"]
        cell = catalog_at(settings, svc.store, precision).get(BODY["job_type"], q["offer"]["accelerator"])
        assert cell is not None and q["steps_per_s"] == pytest.approx(cell.steps_per_s), precision
    # on a V100 ResNet-50 at amp runs on its FP16 tensor cores: faster than the fp32 measurement
    v100 = [catalog_at(settings, svc.store, p).get(BODY["job_type"], "v100") for p in ("fp32", "amp")]
    assert v100[0] is not None and v100[1] is not None and v100[1].steps_per_s > v100[0].steps_per_s
    if fp32["quote"]["offer"] == amp["quote"]["offer"]:
        assert amp["quote"]["expected_hours"] < fp32["quote"]["expected_hours"]
    bad = svc.client.post("/v1/batches", json={**body, "jobs": [{**BODY, "precision": "fp16"}]}, headers=svc.alpha)
    assert error_of(bad, 422)["details"][0]["field"].endswith("precision")
