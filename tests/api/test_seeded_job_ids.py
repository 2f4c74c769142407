"""COSTOPT_JOB_ID_SEED (drills): a submission with an Idempotency-Key gets an id derived from the seed, the
team's name and the key, the same in every run; without the setting or the key, ids stay random."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from sqlalchemy import Engine

from costopt.jobs.records import seeded_job_id
from tests.api.jobs_helpers import BODY, service

pytestmark = pytest.mark.one_backend_each

ID = re.compile(r"job-[0-9a-f]{16}")


def test_a_seeded_service_derives_ids_from_the_seed_team_and_key(engine: Engine, tmp_path: Path) -> None:
    for svc in service(engine, tmp_path, job_id_seed="drill-2"):
        first = svc.client.post("/v1/jobs", json=BODY, headers={**svc.alpha, "Idempotency-Key": "k1"})
        assert first.status_code == 201, first.text
        assert first.json()["id"] == seeded_job_id("drill-2", "alpha", "k1")
        again = svc.client.post("/v1/jobs", json=BODY, headers={**svc.alpha, "Idempotency-Key": "k1"})
        assert again.status_code == 200 and again.json()["id"] == first.json()["id"]
        other = svc.client.post("/v1/jobs", json=BODY, headers={**svc.beta, "Idempotency-Key": "k1"})
        assert other.status_code == 201, other.text
        assert other.json()["id"] == seeded_job_id("drill-2", "beta", "k1") != first.json()["id"]
        unkeyed = svc.client.post("/v1/jobs", json=BODY, headers=svc.alpha)
        assert unkeyed.status_code == 201 and ID.fullmatch(unkeyed.json()["id"])
        assert unkeyed.json()["id"] not in {first.json()["id"], other.json()["id"]}


def test_a_service_without_the_seed_draws_random_ids(engine: Engine, tmp_path: Path) -> None:
    for svc in service(engine, tmp_path):
        resp = svc.client.post("/v1/jobs", json=BODY, headers={**svc.alpha, "Idempotency-Key": "k1"})
        assert resp.status_code == 201, resp.text
        assert ID.fullmatch(resp.json()["id"]) and resp.json()["id"] != seeded_job_id("drill-2", "alpha", "k1")


def test_seeded_ids_differ_by_seed_team_and_key() -> None:
    ids = {seeded_job_id(s, t, k) for s in ("a", "b") for t in ("alpha", "beta") for k in ("k1", "k2")}
    assert len(ids) == 8 and all(ID.fullmatch(i) for i in ids)
    assert seeded_job_id("a", "alpha", "k1") == seeded_job_id("a", "alpha", "k1")
