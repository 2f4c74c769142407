"""REST jobs: submission and quotes, idempotency, listing, team isolation, cancel, events, logs (both
backends)."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from decimal import Decimal
from pathlib import Path

import pytest
from sqlalchemy import Engine, func, select

from costopt.db.jobs_schema import api_keys, jobs
from costopt.domain import OfferKey
from costopt.jobs.model import JobState
from costopt.planning.model import money
from tests.api.jobs_helpers import BODY, JOB_TYPE, P3_2X_SPOT, P3_8X_SPOT, Service, bearer, error_of, service

pytestmark = pytest.mark.one_backend_each  # the database is not the subject here: tests/conftest.py


@pytest.fixture
def svc(engine: Engine, tmp_path: Path) -> Iterator[Service]:
    yield from service(engine, tmp_path)


def _rows(svc: Service) -> int:
    with svc.store.engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(jobs)).scalar_one())


# -- submit and quote --------------------------------------------------------------------------------------


def test_submit_plans_and_queues_the_job(svc: Service, tmp_path: Path) -> None:
    job = svc.submit(svc.alpha, name="r50")
    assert job["state"] == "queued" and job["reason"] == "submitted"
    assert job["team_id"] == svc.alpha_team and job["name"] == "r50" and job["job_type"] == JOB_TYPE
    assert job["steps_total"] == 50_000 and job["steps_done"] == 0 and job["command"] == ["python", "train.py"]
    assert job["checkpoint_uri"] == f"file://{tmp_path / 'checkpoints'}/{job['id']}"
    assert Decimal(job["cost_so_far_usd"]) == 0 and job["moves"] == [] and job["placement"] is None
    assert job["created_at"].endswith("Z")
    stored = svc.jobs.get(job["id"])
    assert stored.state is JobState.QUEUED and stored.spec["job_type"] == JOB_TYPE
    assert stored.quote is not None and stored.quote["candidates"][0]["offer"] == job["quote"]["offer"]
    assert [e.reason for e in svc.jobs.events(job["id"])] == ["submitted"]
    assert job["precision"] == "fp32"  # PyTorch's default
    amp = svc.submit(svc.alpha, precision="amp")
    assert svc.client.get(f"/v1/jobs/{amp['id']}", headers=svc.alpha).json()["precision"] == "amp"


def test_quote_is_the_whole_instance_price_times_expected_hours(svc: Service) -> None:
    """A 1-GPU job is not quoted a quarter of a 4-GPU instance (0.90/GPU-h looks cheaper than the 1-GPU
    instance): it would be billed the whole instance. A 4-GPU job pays the whole 4-GPU instance."""
    where = {"regions": ["us-east-1"], "markets": ["spot"], "accelerators": ["v100"]}
    for gpus, key in ((1, P3_2X_SPOT), (4, P3_8X_SPOT)):
        q = svc.submit(svc.alpha, gpus=gpus, constraints=where)["quote"]
        assert OfferKey.from_doc(q["offer"]) == key
        assert q["offer"]["gpu_count"] == {1: 1.0, 4: 4.0}[gpus]
        as_of = datetime.fromisoformat(q["as_of"])
        price = svc.store.price_at(key, as_of)
        assert price is not None and q["usd_per_hour"] == price.usd_per_hour
        expected = money(price.usd_per_hour) * money(q["expected_hours"])
        assert abs(Decimal(q["expected_cost_usd"]) - expected) <= Decimal("0.000001")
        assert q["expected_hours"] > 50_000 / 3600 / 100  # the job's real hours, not a stub


def test_plans_are_whole_instance_unless_packing_is_asked(svc: Service) -> None:
    body = {"job_type": JOB_TYPE, "steps": 50_000, "clouds": ["aws"]}
    whole = svc.client.post("/v1/plans", json=body).json()["winner"]
    packed = svc.client.post("/v1/plans", json={**body, "per_gpu_packing": True}).json()["winner"]
    assert whole["instance_type"] == "p3.2xlarge" and whole["job_usd_per_hour"] == whole["usd_per_hour"]
    assert packed["instance_type"] == "p3.8xlarge" and packed["job_usd_per_hour"] == pytest.approx(0.90)


def test_a_plan_of_an_unknown_job_type_is_a_422_with_close_matches(svc: Service) -> None:
    r = svc.client.post("/v1/plans", json={"job_type": "resnet-50 (batch size 12)", "steps": 50_000})
    err = error_of(r, 422, "unknown_job_type")
    assert err["details"][0]["field"] == "job_type" and JOB_TYPE in err["details"][0]["did_you_mean"]
    assert JOB_TYPE in err["message"]


def test_a_job_given_by_its_own_throughput_is_planned_on_it(svc: Service) -> None:
    body = {**{k: v for k, v in BODY.items() if k != "job_type"}, "throughput": {"k80": 2.0}}
    r = svc.client.post("/v1/jobs", json=body, headers=svc.alpha)
    assert r.status_code == 201, r.text
    job = r.json()
    assert job["job_type"] is None and job["throughput"] == {"k80": 2.0}
    q = job["quote"]
    assert q["offer"]["accelerator"] == "k80" and q["steps_per_s"] == pytest.approx(2.0)


def test_unknown_job_type_is_a_422_with_close_matches(svc: Service) -> None:
    r = svc.client.post("/v1/jobs", json={**BODY, "job_type": "resnet-50 (batch size 12)"}, headers=svc.alpha)
    err = error_of(r, 422, "unknown_job_type")
    assert JOB_TYPE in err["details"][0]["did_you_mean"] and JOB_TYPE in err["message"]
    assert _rows(svc) == 0


@pytest.mark.parametrize(
    ("constraints", "binding"),
    [
        ({"clouds": ["gcp"]}, "constraints.clouds"),
        ({"max_usd_per_hour": 0.05}, "constraints.max_usd_per_hour"),
        ({"accelerators": ["h100"]}, "constraints.accelerators"),
    ],
)
def test_infeasible_names_the_binding_constraint(svc: Service, constraints: dict[str, object], binding: str) -> None:
    r = svc.client.post("/v1/jobs", json={**BODY, "constraints": constraints}, headers=svc.alpha)
    err = error_of(r, 422, "infeasible")
    assert err["details"] == [{"binding": binding}] and binding in err["message"]
    assert _rows(svc) == 0


def test_infeasible_deadline_is_named(svc: Service) -> None:
    r = svc.client.post(
        "/v1/jobs", json={**BODY, "objective": {"name": "min-cost-deadline", "deadline_hours": 0.01}}, headers=svc.alpha
    )
    assert error_of(r, 422, "infeasible")["details"] == [{"binding": "deadline"}]


# -- idempotency -------------------------------------------------------------------------------------------


def test_a_retry_with_the_same_key_returns_the_first_job(svc: Service) -> None:
    key = {"Idempotency-Key": "submit-1"}
    first = svc.client.post("/v1/jobs", json=BODY, headers={**svc.alpha, **key})
    again = svc.client.post("/v1/jobs", json={**BODY, "steps": 7}, headers={**svc.alpha, **key})
    assert first.status_code == 201 and again.status_code == 200
    assert again.json()["id"] == first.json()["id"] and again.json()["steps_total"] == 50_000
    other_team = svc.client.post("/v1/jobs", json=BODY, headers={**svc.beta, **key})
    assert other_team.status_code == 201 and other_team.json()["id"] != first.json()["id"]
    assert _rows(svc) == 2


def test_concurrent_retries_make_one_job(svc: Service) -> None:
    headers = {**svc.alpha, "Idempotency-Key": "race"}
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda _: svc.client.post("/v1/jobs", json=BODY, headers=headers), range(8)))
    assert sorted(r.status_code for r in answers).count(201) == 1
    assert {r.status_code for r in answers} <= {200, 201}
    assert len({r.json()["id"] for r in answers}) == 1
    assert _rows(svc) == 1


# -- listing -------------------------------------------------------------------------------------------------


def test_paging_is_stable_under_inserts(svc: Service) -> None:
    first = [svc.submit(svc.alpha, name=f"a{i}")["id"] for i in range(5)]
    seen: list[str] = []
    cursor = None
    pages = 0
    while True:
        params: dict[str, object] = {"limit": 2, **({"cursor": cursor} if cursor else {})}
        page = svc.client.get("/v1/jobs", params=params, headers=svc.alpha).json()
        seen += [j["id"] for j in page["items"]]
        pages += 1
        if pages == 1:
            svc.submit(svc.alpha, name="late")  # lands after every listed job: on a later page, never twice
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen[:5] == first and len(seen) == len(set(seen)) == 6 and pages == 3


def test_filters_and_scope(svc: Service) -> None:
    a1 = svc.submit(svc.alpha)["id"]
    a2 = svc.submit(svc.alpha)["id"]
    b1 = svc.submit(svc.beta)["id"]
    svc.client.post(f"/v1/jobs/{a2}/cancel", headers=svc.alpha)

    def ids(headers: dict[str, str], **params: object) -> list[str]:
        r = svc.client.get("/v1/jobs", params=params, headers=headers)
        assert r.status_code == 200, r.text
        doc = r.json()
        assert doc["total"] == len(doc["items"])
        return [j["id"] for j in doc["items"]]

    assert ids(svc.alpha) == [a1, a2] and ids(svc.beta) == [b1]
    assert ids(svc.admin) == [a1, a2, b1] and ids(svc.admin, team=svc.beta_team) == [b1]
    assert ids(svc.alpha, state="cancelled") == [a2] and ids(svc.alpha, state="queued,running") == [a1]
    assert ids(svc.alpha, team=svc.alpha_team) == [a1, a2]
    error_of(svc.client.get("/v1/jobs", params={"team": svc.beta_team}, headers=svc.alpha), 403, "forbidden")
    error_of(svc.client.get("/v1/jobs", params={"state": "sleeping"}, headers=svc.alpha), 422, "invalid_request")
    error_of(svc.client.get("/v1/jobs", params={"cursor": "garbage"}, headers=svc.alpha), 422, "invalid_request")
    error_of(svc.client.get("/v1/jobs", params={"limit": 501}, headers=svc.alpha), 422, "invalid_request")


# -- one job: show, cancel, events, logs -------------------------------------------------------------------------


def test_show_cancel_and_events(svc: Service) -> None:
    job = svc.submit(svc.alpha)
    assert svc.client.get(f"/v1/jobs/{job['id']}", headers=svc.alpha).json()["id"] == job["id"]
    r = svc.client.post(f"/v1/jobs/{job['id']}/cancel", headers=svc.alpha)
    assert r.status_code == 202 and r.json()["state"] == "cancelled" and r.json()["finished_at"] is not None
    assert svc.client.post(f"/v1/jobs/{job['id']}/cancel", headers=svc.alpha).status_code == 202  # idempotent
    events = svc.client.get(f"/v1/jobs/{job['id']}/events", headers=svc.alpha).json()["items"]
    assert [(e["from_state"], e["to_state"]) for e in events] == [(None, "queued"), ("queued", "cancelled")]
    after = svc.client.get(f"/v1/jobs/{job['id']}/events", params={"after": events[0]["id"]}, headers=svc.alpha)
    assert [e["id"] for e in after.json()["items"]] == [events[1]["id"]]


def test_logs_list_each_copy_oldest_first_with_its_own_output(svc: Service) -> None:
    """Two copies of the job run on the simulated cloud (recorded as the migrator records them): each
    copy's own console comes back, oldest first, cut to ``tail`` lines."""
    from datetime import timedelta

    from costopt.agent.contract import contract_env
    from costopt.cloud import LaunchSpec
    from costopt.migration.ledger_sync import write_copy_start
    from costopt.migration.records import CopyStart, job_tags

    job = svc.submit(svc.alpha, steps=2_000)
    assert svc.client.get(f"/v1/jobs/{job['id']}/logs", headers=svc.alpha).json() == {"copies": []}
    sim = svc.app.state.providers["sim"]
    ids = []
    for epoch in (2, 1):  # recorded newest first: the answer is ordered by epoch
        env = {
            **contract_env(job["id"], job["checkpoint_uri"], epoch),
            "COSTOPT_STEPS_PER_SECOND": "5",
            "COSTOPT_JOB_STEPS": "2000",
        }
        inst = sim.launch(LaunchSpec(P3_2X_SPOT, ["train"], env, job_tags(job["id"], epoch)), f"{job['id']}-e{epoch}")
        ids.append(inst.instance_id)
        with svc.store.engine.begin() as conn:
            start = CopyStart(job["id"], epoch, inst.instance_id, P3_2X_SPOT, sim.now())
            write_copy_start(conn, "sim", start, sim.now())
        sim.clock.advance(timedelta(minutes=5))
    logs = svc.client.get(f"/v1/jobs/{job['id']}/logs", params={"tail": 50}, headers=svc.alpha).json()["copies"]
    assert [(c["epoch"], c["instance_id"], c["provider"]) for c in logs] == [(1, ids[1], "sim"), (2, ids[0], "sim")]
    assert all(c["output"] == sim.output(c["instance_id"], tail=50) and c["error"] is None for c in logs)
    assert logs[0]["output"] != logs[1]["output"] and all(len(c["output"].splitlines()) >= 2 for c in logs)
    one = svc.client.get(f"/v1/jobs/{job['id']}/logs", params={"tail": 1}, headers=svc.alpha).json()["copies"]
    assert [len(c["output"].splitlines()) for c in one] == [1, 1]
    assert one[1]["output"] == sim.output(ids[0], tail=1)


# -- isolation and auth --------------------------------------------------------------------------------------------


def test_every_route_taking_a_job_id_hides_other_teams_jobs(svc: Service) -> None:
    job = svc.submit(svc.alpha)
    before = svc.jobs.get(job["id"])
    events_before = svc.jobs.events(job["id"])
    routes = [(m, p) for m, p in svc.routes("/v1/") if "{job_id}" in p]
    assert {p for _, p in routes} >= {"/v1/jobs/{job_id}", "/v1/jobs/{job_id}/cancel", "/v1/jobs/{job_id}/logs"}
    for method, path in routes:
        url = path.replace("{job_id}", job["id"])
        err = error_of(svc.client.request(method, url, headers=svc.beta), 404, "not_found")
        missing = error_of(svc.client.request(method, path.replace("{job_id}", "job-0000"), headers=svc.beta), 404)
        assert err["message"].replace(job["id"], "X") == missing["message"].replace("job-0000", "X")
    assert svc.jobs.get(job["id"]) == before and svc.jobs.events(job["id"]) == events_before
    for method, path in routes:  # the owner, then an admin, reach every one of them
        for who in (svc.alpha, svc.admin):
            r = svc.client.request(method, path.replace("{job_id}", job["id"]), headers=who)
            assert r.status_code in (200, 202), (method, path, r.text)


def test_missing_or_bad_keys_get_401(svc: Service) -> None:
    key = svc.teams.create_key(svc.alpha_team)
    svc.teams.revoke(key.key.id)
    good = svc.alpha["Authorization"].removeprefix("Bearer ")
    mistyped = good[:-1] + ("A" if good[-1] != "A" else "B")
    for headers in (
        {},
        {"Authorization": "Basic dXNlcjpwdw=="},
        {"Authorization": "Bearer"},
        {"Authorization": "Bearer not-a-key"},
        bearer("co_000000000000_" + "x" * 43),
        bearer(key.secret),
        bearer(mistyped),
    ):
        for method, path in (("GET", "/v1/jobs"), ("POST", "/v1/jobs"), ("GET", "/v1/admin/teams")):
            r = svc.client.request(method, path, headers=headers, json=BODY if method == "POST" else None)
            error_of(r, 401, "unauthorized")
            assert r.headers["www-authenticate"] == "Bearer"
    assert _rows(svc) == 0
    assert svc.client.get("/v1/prices/latest").status_code == 200  # prices stay open


def test_members_get_403_on_every_admin_route(svc: Service) -> None:
    routes = svc.routes("/v1/admin")
    assert len(routes) >= 4
    for method, path in routes:
        url = path.replace("{team_id}", svc.alpha_team).replace("{key_id}", "abc")
        r = svc.client.request(method, url, headers=svc.alpha, json={"name": "x", "role": "admin"})
        error_of(r, 403, "forbidden")
    assert not {"x", "gamma"} & {t.name for t in svc.teams.teams()}
    assert len(svc.teams.keys(svc.alpha_team)) == 1


# -- admin ---------------------------------------------------------------------------------------------------------


def test_admin_creates_teams_and_keys_shown_once_and_stored_hashed(svc: Service) -> None:
    r = svc.client.post("/v1/admin/teams", json={"name": "gamma"}, headers=svc.admin)
    assert r.status_code == 201
    doc = r.json()
    secret = doc["key"]
    assert secret.startswith("co_") and doc["team"]["name"] == "gamma" and doc["key_info"]["role"] == "member"
    with svc.store.engine.connect() as conn:
        rows = conn.execute(select(api_keys).where(api_keys.c.team_id == doc["team"]["id"])).all()
    assert len(rows) == 1 and rows[0].key_hash == hashlib.sha256(secret.encode()).hexdigest()
    assert all(secret not in str(v) for v in rows[0])
    listing = svc.client.get("/v1/admin/teams", headers=svc.admin)
    assert "gamma" in [t["name"] for t in listing.json()["items"]] and secret not in listing.text
    job = svc.submit(bearer(secret))  # the key works
    assert job["team_id"] == doc["team"]["id"]
    error_of(svc.client.post("/v1/admin/teams", json={"name": "gamma"}, headers=svc.admin), 409, "conflict")
    error_of(svc.client.post("/v1/admin/teams", json={"name": "$$$"}, headers=svc.admin), 422)

    k = svc.client.post(f"/v1/admin/teams/{doc['team']['id']}/keys", json={"role": "admin"}, headers=svc.admin)
    assert k.status_code == 201 and k.json()["key_info"]["role"] == "admin"
    second = bearer(k.json()["key"])
    assert svc.client.get("/v1/admin/teams", headers=second).status_code == 200
    error_of(svc.client.post("/v1/admin/teams/team-nope/keys", json={}, headers=svc.admin), 404, "not_found")

    gone = svc.client.delete(f"/v1/admin/keys/{k.json()['key_info']['id']}", headers=svc.admin)
    assert gone.status_code == 204 and gone.content == b""
    error_of(svc.client.get("/v1/admin/teams", headers=second), 401)
    error_of(svc.client.delete("/v1/admin/keys/nope", headers=svc.admin), 404, "not_found")


def test_startup_prints_the_bootstrap_admin_key_once(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from fastapi.testclient import TestClient

    from api.app import create_app
    from costopt.settings import Settings

    settings = Settings(
        database_url=f"sqlite:///{tmp_path / 'fresh.db'}",
        seed_on_start=False,
        collectors_enabled=False,
        migration_jobs_enabled=False,
        engine_workers=0,
    )
    with TestClient(create_app(settings)) as client:
        lines = [ln for ln in capsys.readouterr().out.splitlines() if "admin key" in ln]
        assert len(lines) == 1 and lines[0].startswith("costopt: admin key (shown once): co_")
        key = lines[0].rsplit(" ", 1)[1]
        assert client.get("/v1/admin/teams", headers=bearer(key)).json()["items"][0]["name"] == "admin"
    with TestClient(create_app(settings)):
        assert "admin key" not in capsys.readouterr().out


def test_metrics_count_jobs_by_state_and_their_events(svc: Service) -> None:
    svc.submit(svc.alpha)
    gone = svc.submit(svc.beta)
    svc.client.post(f"/v1/jobs/{gone['id']}/cancel", headers=svc.beta)
    text = svc.client.get("/metrics").text
    assert 'costopt_jobs{state="queued"} 1.0' in text and 'costopt_jobs{state="cancelled"} 1.0' in text
    assert 'costopt_jobs{state="running"} 0.0' in text
    assert 'costopt_job_events_total{kind="move"} 0.0' in text and "costopt_jobs_spend_usd_total 0.0" in text


def test_a_running_job_shows_its_placement_eta_and_the_planner_ranks_it(svc: Service) -> None:
    """The live fields of a placed job, and the service's Placements (what the engine and the rebalancer
    use): whole-instance prices, ``exclude`` honoured, the current offer priced by ``at_offer``."""
    from datetime import timedelta

    job = svc.submit(svc.alpha, gpus=1)
    svc.jobs.transition(job["id"], JobState.LAUNCHING, "launching")
    record = svc.jobs.transition(job["id"], JobState.RUNNING, "running", offer=P3_8X_SPOT, usd_per_hour=Decimal("3.6"))
    svc.jobs.set_progress(job["id"], 10_000)
    shown = svc.client.get(f"/v1/jobs/{job['id']}", headers=svc.alpha).json()
    assert shown["placement"] == {**P3_8X_SPOT.to_doc(), "accelerator": "v100", "gpu_count": 4.0, "usd_per_hour": 3.6}
    assert shown["steps_done"] == 10_000 and shown["started_at"] is not None
    now = svc.jobs.now()
    planner = svc.app.state.job_planner
    here = planner.at_offer(record, P3_8X_SPOT, remaining_steps=40_000, at=now)
    assert here is not None and here.usd_per_hour == 3.6  # the whole instance, not 0.90 per GPU
    eta = datetime.fromisoformat(shown["eta"])
    assert eta == now + timedelta(seconds=40_000 / here.steps_per_s)
    ranked = planner.rank(record, remaining_steps=40_000, at=now, exclude=[P3_2X_SPOT])
    assert ranked and P3_2X_SPOT not in [p.offer for p in ranked]
    for p in ranked:
        price = svc.store.price_at(p.offer, now)
        assert price is not None and p.usd_per_hour == price.usd_per_hour
    assert planner.rank(record, remaining_steps=0, at=now) == []
