"""REST fleets: lease by offer or by plan, policies from the Gavel registry, team scope, jobs submitted
into a fleet (admission with reasons), scaling and release (both backends)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine

from costopt.fleets.model import FLEET_PROVIDER, FleetJobStatus, InstanceState
from costopt.fleets.store import FleetRepository
from costopt.gavel.policies import POLICY_NAMES
from costopt.jobs.model import JobState
from tests.api.jobs_helpers import JOB_TYPE, Service, error_of, service

pytestmark = pytest.mark.one_backend_each  # the database is not the subject here: tests/conftest.py

V100 = {"cloud": "aws", "region": "us-east-1", "zone": "us-east-1a", "instance_type": "p3.2xlarge", "market": "spot"}
K80 = {"cloud": "aws", "region": "us-east-1", "zone": "us-east-1b", "instance_type": "p2.xlarge", "market": "spot"}
FLEET: dict[str, Any] = {
    "name": "lab",
    "policy": "max_min_fairness_perf",
    "instances": [{"offer": V100, "count": 2}, {"offer": K80, "count": 1}],
}
JOB: dict[str, Any] = {"job_type": JOB_TYPE, "steps": 1000, "command": ["python", "train.py"]}


@pytest.fixture
def svc(engine: Engine, tmp_path: Path) -> Iterator[Service]:
    yield from service(engine, tmp_path)


def _fleet(svc: Service, headers: dict[str, str], **changes: Any) -> dict[str, Any]:
    body = {**FLEET, **changes}
    if "plan" in changes:
        del body["instances"]
    r = svc.client.post("/v1/fleets", json=body, headers=headers)
    assert r.status_code == 201, r.text
    doc: dict[str, Any] = r.json()
    return doc


def _repo(svc: Service) -> FleetRepository:
    return FleetRepository(svc.store.engine, now=svc.jobs.now)


# -- lease ------------------------------------------------------------------------------------------------


def test_a_fleet_by_offer_has_its_instances_pending_with_their_gpus(svc: Service) -> None:
    fleet = _fleet(svc, svc.alpha)
    assert fleet["id"].startswith("fleet-") and fleet["team_id"] == svc.alpha_team and fleet["state"] == "active"
    assert fleet["policy"] == "max_min_fairness_perf" and fleet["round_s"] == 360.0
    assert fleet["resolve_every_rounds"] == 10
    insts = fleet["instances"]
    assert [(i["accelerator"], i["gpus"], i["state"]) for i in insts] == [
        ("v100", 1, "pending"),
        ("v100", 1, "pending"),
        ("k80", 1, "pending"),
    ]
    assert insts[0]["offer"]["instance_type"] == "p3.2xlarge" and insts[0]["usd_per_hour"] == 0.95
    assert insts[2]["usd_per_hour"] == 0.35 and insts[0]["provider"] == "sim"
    assert len({i["id"] for i in insts}) == 3 and all(i["id"].startswith("fi-") for i in insts)
    assert fleet["gpus_planned"] == {"v100": 2, "k80": 1} and fleet["gpus"] == {}  # no worker runs yet
    assert fleet["allocation"] is None and fleet["round"] is None and fleet["jobs"] == []
    assert fleet["cost_so_far_usd"] == "0" and fleet["idle_cost_usd"] == "0"
    shown = svc.client.get(f"/v1/fleets/{fleet['id']}", headers=svc.alpha).json()
    assert shown["instances"] == insts and shown["name"] == "lab"


def test_policy_names_are_any_case_and_an_unknown_one_is_a_422_listing_the_known(svc: Service) -> None:
    assert _fleet(svc, svc.alpha, policy="Max_Min_Fairness")["policy"] == "max_min_fairness"
    # the aware LAS's former name is an alias: the fleet stores the policy's own name
    assert _fleet(svc, svc.alpha, policy="max_min_fairness_pareto_perf")["policy"] == "max_min_fairness_perf"
    r = svc.client.post("/v1/fleets", json={**FLEET, "policy": "max_min_fairnes_perf"}, headers=svc.alpha)
    err = error_of(r, 422, "unknown_policy")
    assert "max_min_fairness_perf" in err["message"] and err["details"][0]["known"] == list(POLICY_NAMES)
    assert "max_min_fairness_perf" in err["details"][0]["did_you_mean"]
    assert svc.client.get("/v1/fleets", headers=svc.alpha).json()["total"] == 2  # nothing written


def test_bad_offers_and_bodies_are_422s_that_say_what_to_fix(svc: Service) -> None:
    bad_type = {**V100, "instance_type": "p3.2xlarg"}
    err = error_of(
        svc.client.post("/v1/fleets", json={**FLEET, "instances": [{"offer": bad_type}]}, headers=svc.alpha),
        422,
        "unknown_instance_type",
    )
    assert "p3.2xlarge" in err["details"][0]["did_you_mean"] and err["details"][0]["field"].startswith("instances[0]")
    no_price = {**V100, "zone": "us-east-1f"}
    error_of(
        svc.client.post("/v1/fleets", json={**FLEET, "instances": [{"offer": no_price}]}, headers=svc.alpha),
        422,
        "no_price",
    )
    both = {**FLEET, "plan": {"accelerators": {"v100": 1}}}
    error_of(svc.client.post("/v1/fleets", json=both, headers=svc.alpha), 422)
    error_of(svc.client.post("/v1/fleets", json={**FLEET, "round_s": 0}, headers=svc.alpha), 422)
    assert svc.client.get("/v1/fleets", headers=svc.alpha).json()["total"] == 0


def test_a_fleet_by_plan_is_the_cheapest_mix_and_a_budget_bounds_it(svc: Service) -> None:
    """Five V100s: five Azure NC6s_v3 at 0.60313 (3.01565 USD/h) beat a 4-GPU p3.8xlarge (3.60) plus one;
    on-demand only, five p3.2xlarge at 3.06."""
    body: dict[str, Any] = {"name": "planned", "policy": "fifo", "plan": {"accelerators": {"v100": 5, "K80": 1}}}
    fleet = _fleet(svc, svc.alpha, **body)
    got = sorted((i["offer"]["instance_type"], i["gpus"]) for i in fleet["instances"])
    assert got == [("Standard_NC6s_v3", 1)] * 5 + [("p2.xlarge", 1)]
    assert fleet["gpus_planned"] == {"v100": 5, "k80": 1}
    od = _fleet(svc, svc.alpha, plan={"accelerators": {"v100": 5}, "markets": ["on_demand"]}, policy="fifo")
    assert {(i["offer"]["instance_type"], i["offer"]["market"]) for i in od["instances"]} == {
        ("p3.2xlarge", "on_demand")
    }
    err = error_of(
        svc.client.post(
            "/v1/fleets",
            json={**body, "plan": {"accelerators": {"v100": 5}, "max_usd_per_hour": 3.0}},
            headers=svc.alpha,
        ),
        422,
        "over_budget",
    )
    assert err["details"][0]["cheapest_usd_per_hour"] == pytest.approx(5 * 0.60313)
    error_of(
        svc.client.post("/v1/fleets", json={**body, "plan": {"accelerators": {"h100": 1}}}, headers=svc.alpha),
        422,
        "infeasible",
    )


def test_other_teams_get_404_and_admins_see_every_fleet(svc: Service) -> None:
    fleet = _fleet(svc, svc.alpha)
    path = f"/v1/fleets/{fleet['id']}"
    for method, url, body in (
        ("get", path, None),
        ("post", f"{path}/scale", {"add": [{"offer": K80}]}),
        ("post", f"{path}/release", None),
    ):
        r = svc.client.request(method, url, json=body, headers=svc.beta)
        error_of(r, 404, "not_found")
    assert svc.client.get(path, headers=svc.alpha).json()["state"] == "active"  # beta changed nothing
    assert len(svc.client.get(path, headers=svc.alpha).json()["instances"]) == 3
    assert svc.client.get("/v1/fleets", headers=svc.beta).json() == {"total": 0, "items": [], "next_cursor": None}
    assert svc.client.get(path, headers=svc.admin).status_code == 200
    listed = svc.client.get(f"/v1/fleets?team={svc.alpha_team}", headers=svc.admin).json()
    assert [f["id"] for f in listed["items"]] == [fleet["id"]]
    error_of(svc.client.get(f"/v1/fleets?team={svc.alpha_team}", headers=svc.beta), 403, "forbidden")
    error_of(svc.client.get(path), 401)


def test_idempotency_key_returns_the_first_fleet(svc: Service) -> None:
    h = {**svc.alpha, "Idempotency-Key": "k1"}
    first = svc.client.post("/v1/fleets", json=FLEET, headers=h)
    again = svc.client.post("/v1/fleets", json={**FLEET, "name": "other"}, headers=h)
    assert first.status_code == 201 and again.status_code == 200
    assert again.json()["id"] == first.json()["id"] and again.json()["name"] == "lab"
    assert svc.client.get("/v1/fleets", headers=svc.alpha).json()["total"] == 1


def test_a_seeded_service_derives_the_fleets_and_its_instances_ids_from_the_seed(
    engine: Engine, tmp_path: Path
) -> None:
    """COSTOPT_JOB_ID_SEED (drills): a fleet leased with an Idempotency-Key gets an id from the seed, the team's
    name and the key, its instances ids from the fleet's and their index (the service orders a fleet's
    instances by id): the same in every run; without the key, random ones."""
    from costopt.fleets.model import seeded_fleet_id, seeded_id

    for svc in service(engine, tmp_path, job_id_seed="drill-2"):
        doc = svc.client.post("/v1/fleets", json=FLEET, headers={**svc.alpha, "Idempotency-Key": "fleet"}).json()
        fleet_id = seeded_fleet_id("drill-2", "alpha", "fleet")
        assert doc["id"] == fleet_id
        assert [i["id"] for i in doc["instances"]] == [seeded_id("fi-", "drill-2", fleet_id, str(n)) for n in range(3)]
        assert [i["accelerator"] for i in doc["instances"]] == ["v100", "v100", "k80"]
        unkeyed = svc.client.post("/v1/fleets", json=FLEET, headers=svc.alpha).json()
        assert unkeyed["id"] != fleet_id and unkeyed["id"].startswith("fleet-")
        assert not {i["id"] for i in unkeyed["instances"]} & {i["id"] for i in doc["instances"]}


# -- jobs into a fleet ------------------------------------------------------------------------------------


def test_a_job_submitted_into_a_fleet_waits_for_its_policy_not_the_engine(svc: Service) -> None:
    fleet = _fleet(svc, svc.alpha)
    r = svc.client.post(
        "/v1/jobs", json={**JOB, "fleet_id": fleet["id"], "weight": 2.0, "slo_s": 7200}, headers=svc.alpha
    )
    assert r.status_code == 201, r.text
    job = r.json()
    assert job["fleet_id"] == fleet["id"] and job["provider"] == FLEET_PROVIDER and job["quote"] is None
    assert job["state"] == "queued"
    shown = svc.client.get(f"/v1/fleets/{fleet['id']}", headers=svc.alpha).json()
    (fj,) = shown["jobs"]
    assert fj["job_id"] == job["id"] and fj["status"] == "waiting" and fj["weight"] == 2.0 and fj["slo_s"] == 7200
    assert fj["steps_total"] == 1000 and fj["steps_done"] == 0 and fj["progress"] == 0.0
    # Gavel's measured ResNet-50 throughputs on the fleet's types (and the others the catalog knows)
    assert fj["throughput"]["v100"] > fj["throughput"]["k80"] > 0
    assert fj["fractions"] == {} and fj["expected_steps_per_s"] is None
    # the engine leaves it to the fleet: no launch, no error
    report = svc.app.state.job_service.engine.tick()
    assert report.errors == () and svc.jobs.get(job["id"]).state is JobState.QUEUED
    stored = _repo(svc).job(job["id"])
    assert stored is not None and stored.status is FleetJobStatus.WAITING and stored.team_id == svc.alpha_team


def test_a_job_the_fleet_cannot_run_is_refused_with_the_reason_per_type(svc: Service) -> None:
    fleet = _fleet(svc, svc.alpha)
    err = error_of(
        svc.client.post("/v1/jobs", json={**JOB, "fleet_id": fleet["id"], "gpus": 4}, headers=svc.alpha),
        422,
        "fleet_cannot_run",
    )
    by_type = {d["worker_type"]: d["problem"] for d in err["details"]}
    assert set(by_type) == {"v100", "k80"} and "needs 4 GPUs in one instance" in by_type["v100"]
    own = {"throughput": {"a100": 10.0}, "steps": 100, "command": ["x"], "fleet_id": fleet["id"]}
    err = error_of(svc.client.post("/v1/jobs", json=own, headers=svc.alpha), 422, "fleet_cannot_run")
    assert all("no throughput known" in d["problem"] for d in err["details"])
    ok = svc.client.post("/v1/jobs", json={**own, "throughput": {"a100": 10.0, "k80": 1.5}}, headers=svc.alpha)
    assert ok.status_code == 201, ok.text
    fj = _repo(svc).job(ok.json()["id"])
    assert fj is not None and fj.throughput == {"a100": 10.0, "k80": 1.5}
    error_of(
        svc.client.post("/v1/jobs", json={**JOB, "fleet_id": fleet["id"], "job_type": "ResNet-5"}, headers=svc.alpha),
        422,
        "unknown_job_type",
    )
    assert [j["job_id"] for j in svc.client.get(f"/v1/fleets/{fleet['id']}", headers=svc.alpha).json()["jobs"]] == [
        ok.json()["id"]
    ]


def test_fleet_fields_of_a_job_are_checked(svc: Service) -> None:
    fleet = _fleet(svc, svc.alpha)
    error_of(svc.client.post("/v1/jobs", json={**JOB, "weight": 2}, headers=svc.alpha), 422)
    error_of(svc.client.post("/v1/jobs", json={**JOB, "fleet_id": fleet["id"], "weight": 0}, headers=svc.alpha), 422)
    for fid in ("fleet-nope", fleet["id"]):  # unknown, and another team's: the same answer
        err = error_of(
            svc.client.post("/v1/jobs", json={**JOB, "fleet_id": fid}, headers=svc.beta), 422, "unknown_fleet"
        )
        assert err["details"][0]["field"] == "fleet_id"
    h = {**svc.alpha, "Idempotency-Key": "j1"}
    first = svc.client.post("/v1/jobs", json={**JOB, "fleet_id": fleet["id"]}, headers=h)
    again = svc.client.post("/v1/jobs", json={**JOB, "fleet_id": fleet["id"]}, headers=h)
    assert (first.status_code, again.status_code) == (201, 200) and again.json()["id"] == first.json()["id"]
    assert len(_repo(svc).jobs(fleet["id"])) == 1


# -- scale and release --------------------------------------------------------------------------------------


def test_scale_adds_and_drains_instances_and_release_ends_the_fleet(svc: Service) -> None:
    fleet = _fleet(svc, svc.alpha)
    path = f"/v1/fleets/{fleet['id']}"
    first = fleet["instances"][0]["id"]
    r = svc.client.post(
        f"{path}/scale", json={"add": [{"offer": K80, "count": 2}], "remove": [first]}, headers=svc.alpha
    )
    assert r.status_code == 200, r.text
    states = {i["id"]: i["state"] for i in r.json()["instances"]}
    assert states[first] == "draining" and len(states) == 5
    assert r.json()["gpus_planned"] == {"v100": 1, "k80": 3}
    err = error_of(svc.client.post(f"{path}/scale", json={"remove": ["fi-nope"]}, headers=svc.alpha), 404)
    assert "fi-nope" in err["message"]
    error_of(svc.client.post(f"{path}/scale", json={}, headers=svc.alpha), 422)
    released = svc.client.post(f"{path}/release", headers=svc.alpha)
    assert released.status_code == 202 and released.json()["state"] == "released"
    assert released.json()["released_at"] is not None
    assert {i["state"] for i in released.json()["instances"]} == {"draining"}
    assert svc.client.post(f"{path}/release", headers=svc.alpha).json()["released_at"] == released.json()["released_at"]
    error_of(svc.client.post(f"{path}/scale", json={"add": [{"offer": K80}]}, headers=svc.alpha), 409, "fleet_released")
    error_of(
        svc.client.post("/v1/jobs", json={**JOB, "fleet_id": fleet["id"]}, headers=svc.alpha), 409, "fleet_released"
    )
    assert {i.state for i in _repo(svc).instances(fleet["id"])} == {InstanceState.DRAINING}
