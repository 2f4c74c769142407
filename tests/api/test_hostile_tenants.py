"""Hostile tenants (issue 14), both backends: for every route of the app's route table that takes an id,
another team's key gets 404 (or the route's own refusal) and changes nothing in the database; a job runs
on the service's own host only when an admin enabled the local provider for its team; checkpoint URIs and
images are checked against the team's prefixes; keys are stored as hashes only, compared in constant
time and never logged; each key is rate-limited with 429 and Retry-After."""

from __future__ import annotations

import hashlib
import hmac
import logging
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.routing import iter_route_contexts
from sqlalchemy import Engine, select

import costopt.db.schema  # noqa: F401  (registers every table on the shared metadata)
from api.auth import current_caller, require_admin
from api.tenancy import RateLimiter
from costopt.db.metadata import metadata
from costopt.jobs.teams import TeamPolicy
from tests.api.jobs_helpers import BODY, Service, bearer, error_of, service

pytestmark = pytest.mark.one_backend_each  # the database is not the subject here: tests/conftest.py

OFFER = {"cloud": "aws", "region": "us-east-1", "zone": "us-east-1a", "instance_type": "p3.2xlarge", "market": "spot"}
FLEET = {"name": "lab", "policy": "max_min_fairness_perf", "instances": [{"offer": OFFER, "count": 1}]}


@pytest.fixture
def svc(engine: Engine, tmp_path: Path) -> Iterator[Service]:
    yield from service(engine, tmp_path)


def _snapshot(engine: Engine) -> dict[str, list[str]]:
    """Every row of every table of the schema, as sorted text (the database's whole state)."""
    out: dict[str, list[str]] = {}
    with engine.connect() as conn:
        for table in metadata.sorted_tables:
            out[table.name] = sorted(repr(tuple(row)) for row in conn.execute(select(table)).all())
    return out


def _calls(dependant: Any) -> set[Any]:
    found = {dependant.call}
    for sub in dependant.dependencies:
        found |= _calls(sub)
    return found


def _id_routes(app: Any) -> list[tuple[str, str, list[str], str]]:
    """(method, path, its path parameters, how it authenticates) of every route of the app's route table
    with a path parameter; ``auth``: ``admin`` (an admin key), ``member`` (any team key) or ``other``
    (not a team key, e.g. a fleet worker's token)."""
    out: list[tuple[str, str, list[str], str]] = []
    for route in iter_route_contexts(app.routes):
        path = route.path or ""
        params: list[str] = re.findall(r"{(\w+)(?::[^}]*)?}", path)
        dependant = getattr(route, "dependant", None)
        if not params or dependant is None:
            continue
        calls = _calls(dependant)
        auth = "admin" if require_admin in calls else "member" if current_caller in calls else "other"
        out.extend((m, path, params, auth) for m in sorted((route.methods or set()) - {"HEAD"}))
    return out


# A valid body for each id route that takes one: an invalid body would be refused (422) before the
# ownership check runs, proving nothing. A new route that needs a body fails the test until it is added.
BODIES: dict[tuple[str, str], Any] = {
    ("POST", "/v1/fleets/{fleet_id}/scale"): {"add": [{"offer": OFFER}]},
    ("POST", "/v1/fleet-workers/{worker_id}/sync"): {"copies": []},
    ("POST", "/v1/admin/teams/{team_id}/keys"): {"name": "x"},
    ("PATCH", "/v1/admin/teams/{team_id}"): {"allow_local_provider": True},
}
EXPECTED = {"member": 404, "admin": 403, "other": 401}
"""What another team's member key gets: 404 exactly as for an id that does not exist (a team route), 403
(an admin route: a member key never reaches it), 401 (a route whose caller is not a team key)."""


def _alpha_ids(svc: Service) -> dict[str, str]:
    """An id of team alpha's for each kind of path parameter."""
    job = svc.submit(svc.alpha)
    r = svc.client.post("/v1/fleets", json=FLEET, headers=svc.alpha)
    assert r.status_code == 201, r.text
    fleet = r.json()
    key = svc.teams.keys(svc.alpha_team)[0]
    return {
        "job_id": job["id"],
        "fleet_id": fleet["id"],
        "worker_id": fleet["instances"][0]["id"],
        "team_id": svc.alpha_team,
        "key_id": key.id,
    }


def test_another_teams_key_gets_404_and_changes_nothing_on_every_id_route(svc: Service) -> None:
    ids = _alpha_ids(svc)
    routes = _id_routes(svc.app)
    # the route table is what is tested: every id route the OpenAPI document shows is among them
    documented = {(m.upper(), p) for p, ops in svc.app.openapi()["paths"].items() if "{" in p for m in ops}
    assert documented <= {(m, p) for m, p, *_ in routes} and len(documented) >= 11, routes
    tried = 0
    for method, path, params, auth in routes:
        missing = [p for p in params if p not in ids]
        assert not missing, f"{method} {path}: add a team-alpha id for {missing} to _alpha_ids (a new id route)"
        url = path
        for p in params:
            url = url.replace("{" + p + "}", ids[p])
        body = BODIES.get((method, path))
        before = _snapshot(svc.store.engine)
        r = svc.client.request(method, url, headers=svc.beta, json=body)
        assert r.status_code == EXPECTED[auth], (
            f"{method} {path} ({auth}) answered {r.status_code} to another team's key: {r.text}; "
            "if it is a 422, add a valid body for it to BODIES"
        )
        error_of(r, EXPECTED[auth])
        assert _snapshot(svc.store.engine) == before, f"{method} {path}: another team's request changed the database"
        if auth == "member":  # the same answer as for an id that does not exist: nothing leaks
            ghost = path
            for p in params:
                ghost = ghost.replace("{" + p + "}", "does-not-exist")
            assert (
                svc.client.request(method, ghost, headers=svc.beta, json=body).json()["error"]["code"]
                == (r.json()["error"]["code"])
            )
        tried += 1
    assert tried == len(routes)
    # and the owner still reaches its job (the 404s above are about the team, not a broken route)
    assert svc.client.get(f"/v1/jobs/{ids['job_id']}", headers=svc.alpha).status_code == 200


# -- the service's own host ----------------------------------------------------------------------------------


@pytest.fixture
def local_svc(engine: Engine, tmp_path: Path) -> Iterator[Service]:
    yield from service(engine, tmp_path, provider="local", local_provider_dir=tmp_path / "local")


def _jobs_in_db(svc: Service) -> int:
    return len(_snapshot(svc.store.engine)["jobs"])


def test_a_job_runs_on_the_services_host_only_when_an_admin_enabled_it(local_svc: Service) -> None:
    svc = local_svc
    err = error_of(svc.client.post("/v1/jobs", json=BODY, headers=svc.alpha), 403, "local_provider_not_allowed")
    assert "allow_local_provider" in err["message"] and "PATCH /v1/admin/teams/" in err["message"]
    batch = {"jobs": [BODY], "objective": {"name": "makespan", "budget_usd": "500"}}
    error_of(svc.client.post("/v1/batches", json=batch, headers=svc.alpha), 403, "local_provider_not_allowed")
    error_of(svc.client.post("/v1/fleets", json=FLEET, headers=svc.alpha), 403, "local_provider_not_allowed")
    assert _jobs_in_db(svc) == 0 and not _snapshot(svc.store.engine)["batches"]
    # a member cannot enable it for itself
    patch = {"allow_local_provider": True}
    error_of(svc.client.patch(f"/v1/admin/teams/{svc.alpha_team}", json=patch, headers=svc.alpha), 403)
    r = svc.client.patch(f"/v1/admin/teams/{svc.alpha_team}", json=patch, headers=svc.admin)
    assert r.status_code == 200 and r.json()["allow_local_provider"] is True, r.text
    job = svc.client.post("/v1/jobs", json=BODY, headers=svc.alpha)
    assert job.status_code == 201 and job.json()["provider"] == "local", job.text
    # only for that team
    error_of(svc.client.post("/v1/jobs", json=BODY, headers=svc.beta), 403, "local_provider_not_allowed")
    assert _jobs_in_db(svc) == 1


def test_the_default_sim_provider_needs_no_permission(svc: Service) -> None:
    assert svc.submit(svc.beta)["provider"] == "sim"


# -- checkpoint URIs and images ------------------------------------------------------------------------------


def test_checkpoint_uri_and_image_are_checked_against_the_teams_prefixes(svc: Service) -> None:
    def post(**changes: Any) -> Any:
        return svc.client.post("/v1/jobs", json={**BODY, **changes}, headers=svc.alpha)

    # no prefixes set: the service chooses where the job checkpoints; a given URI or image is refused
    err = error_of(post(checkpoint_uri="file:///etc/costopt"), 422, "checkpoint_not_allowed")
    assert "omit checkpoint_uri" in err["message"] and err["details"][0]["allowed"] == []
    error_of(post(image="docker.io/evil/miner:latest"), 422, "image_not_allowed")
    policy = {"checkpoint_prefixes": ["s3://alpha-ckpt/"], "image_prefixes": ["ghcr.io/alpha/"]}
    r = svc.client.patch(f"/v1/admin/teams/{svc.alpha_team}", json=policy, headers=svc.admin)
    assert r.status_code == 200 and r.json()["checkpoint_prefixes"] == ["s3://alpha-ckpt/"], r.text
    ok = post(checkpoint_uri="s3://alpha-ckpt/run-1", image="ghcr.io/alpha/train:2.1")
    assert ok.status_code == 201, ok.text
    assert ok.json()["checkpoint_uri"] == "s3://alpha-ckpt/run-1" and ok.json()["image"] == "ghcr.io/alpha/train:2.1"
    jobs_after_ok = _jobs_in_db(svc)
    for bad in (
        "s3://beta-ckpt/run-1",  # another team's bucket
        "s3://alpha-ckpt-other/x",  # a bucket whose name only starts the same
        "s3://alpha-ckpt/../beta-ckpt/x",  # stepping out of the prefix
        "s3://alpha-ckpt/%2e%2e/beta-ckpt/x",
        "file:///var/lib/costopt/",  # the server's own disk
    ):
        err = error_of(post(checkpoint_uri=bad), 422, "checkpoint_not_allowed")
        assert "s3://alpha-ckpt/" in err["message"], err  # says what is allowed
    err = error_of(post(image="ghcr.io/beta/train:1"), 422, "image_not_allowed")
    assert "ghcr.io/alpha/" in err["message"]
    # a batch is checked the same way, before anything is stored
    bad_job = {**BODY, "checkpoint_uri": "s3://beta-ckpt/x"}
    batch = {"jobs": [BODY, bad_job], "objective": {"name": "makespan", "budget_usd": "500"}}
    error_of(svc.client.post("/v1/batches", json=batch, headers=svc.alpha), 422, "checkpoint_not_allowed")
    assert _jobs_in_db(svc) == jobs_after_ok and not _snapshot(svc.store.engine)["batches"]
    # team beta has alpha's prefixes? no: its own policy is the default (nothing)
    r = svc.client.post("/v1/jobs", json={**BODY, "checkpoint_uri": "s3://alpha-ckpt/steal"}, headers=svc.beta)
    error_of(r, 422, "checkpoint_not_allowed")


def test_an_admins_prefix_must_stop_at_a_boundary(svc: Service) -> None:
    url = f"/v1/admin/teams/{svc.alpha_team}"
    for bad in (["s3://alpha"], ["alpha-bucket/"], ["s3://a/../b/"]):
        error_of(svc.client.patch(url, json={"checkpoint_prefixes": bad}, headers=svc.admin), 422)
    error_of(svc.client.patch(url, json={"image_prefixes": ["ghcr.io/alpha"]}, headers=svc.admin), 422)
    # a field left out keeps its value; null returns to the service's defaults
    svc.client.patch(url, json={"image_prefixes": ["ghcr.io/alpha/"]}, headers=svc.admin)
    r = svc.client.patch(url, json={"allow_local_provider": False}, headers=svc.admin)
    assert r.json()["image_prefixes"] == ["ghcr.io/alpha/"]
    r = svc.client.patch(url, json={"image_prefixes": None}, headers=svc.admin)
    assert r.json()["image_prefixes"] is None
    error_of(svc.client.patch("/v1/admin/teams/team-nope", json={}, headers=svc.admin), 404)


# -- keys -------------------------------------------------------------------------------------------------------


def _secret_part(key: str) -> str:
    """The secret of ``co_<key_id>_<secret>``; the secret is URL-safe base64 and may itself hold ``_``."""
    prefix, key_id, secret = key.split("_", 2)
    assert prefix == "co" and len(key_id) == 12 and len(secret) >= 20, key
    return secret


def test_keys_are_stored_as_hashes_compared_in_constant_time_and_never_logged(
    svc: Service, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    capsys.readouterr()  # the bootstrap admin key printed at start-up (shown once, by design)
    caplog.set_level(logging.DEBUG)
    compared: list[tuple[str, str]] = []
    real = hmac.compare_digest  # the module costopt.jobs.teams compares with

    def spy(a: Any, b: Any) -> bool:
        compared.append((a, b))
        return bool(real(a, b))

    monkeypatch.setattr("costopt.jobs.teams.hmac.compare_digest", spy)
    made = svc.client.post(f"/v1/admin/teams/{svc.alpha_team}/keys", json={"name": "ci"}, headers=svc.admin)
    assert made.status_code == 201, made.text
    secret = made.json()["key"]
    key_id = made.json()["key_info"]["id"]
    wrong = secret[:-4] + ("AAAA" if not secret.endswith("AAAA") else "BBBB")  # the right id, a wrong secret
    secrets = [secret, wrong, svc.alpha["Authorization"].split()[1], svc.admin["Authorization"].split()[1]]
    assert svc.client.get("/v1/jobs", headers=bearer(secret)).status_code == 200
    svc.client.post("/v1/jobs", json=BODY, headers=bearer(secret))
    error_of(svc.client.get("/v1/jobs", headers=bearer(wrong)), 401)
    error_of(svc.client.get("/v1/jobs", headers=bearer("co_ffffffffffff_" + "x" * 43)), 401)  # unknown id
    assert svc.client.delete(f"/v1/admin/keys/{key_id}", headers=svc.admin).status_code == 204
    error_of(svc.client.get("/v1/jobs", headers=bearer(secret)), 401)
    # compared in constant time: a wrong secret and an unknown id both go through hmac.compare_digest
    assert len(compared) >= 2 and all(len(a) == len(b) == 64 for a, b in compared)
    # stored only as hashes
    rows = _snapshot(svc.store.engine)
    text = repr(rows)
    for s in secrets:
        assert s not in text and _secret_part(s) not in text
    assert hashlib.sha256(secret.encode()).hexdigest() in text
    # never logged, not even the mistyped one
    out = capsys.readouterr()
    logged = caplog.text + out.out + out.err
    assert "job " in caplog.text or caplog.records  # the service did log these requests
    for s in secrets:
        assert s not in logged and _secret_part(s) not in logged


# -- rate limits ------------------------------------------------------------------------------------------------


@pytest.fixture
def limited(engine: Engine, tmp_path: Path) -> Iterator[Service]:
    yield from service(engine, tmp_path, rate_limit_per_s=0.5, rate_limit_burst=3)


def test_each_key_is_rate_limited_with_429_and_retry_after(limited: Service) -> None:
    svc = limited
    for _ in range(3):
        assert svc.client.get("/v1/jobs", headers=svc.alpha).status_code == 200
    r = svc.client.get("/v1/jobs", headers=svc.alpha)
    err = error_of(r, 429, "too_many_requests")
    assert int(r.headers["Retry-After"]) >= 1 and "retry in" in err["message"]
    jobs_before = _jobs_in_db(svc)
    error_of(svc.client.post("/v1/jobs", json=BODY, headers=svc.alpha), 429)
    assert _jobs_in_db(svc) == jobs_before  # refused before anything is done
    # per key: another key (another team's, or the admin's) is not slowed by alpha's
    assert svc.client.get("/v1/jobs", headers=svc.beta).status_code == 200
    assert svc.client.get("/v1/admin/teams", headers=svc.admin).status_code == 200
    # routes without a key (health, prices) are not limited per key
    assert all(svc.client.get("/livez").status_code == 200 for _ in range(5))


def test_the_token_bucket_refills_at_its_rate() -> None:
    bucket = RateLimiter(rate=2.0, burst=2)
    assert bucket.take("k", now=0.0) == 0.0 and bucket.take("k", now=0.0) == 0.0
    assert bucket.take("k", now=0.0) == pytest.approx(0.5)  # one token in half a second
    assert bucket.take("k", now=0.5) == 0.0
    assert bucket.take("k", now=0.5) > 0
    assert bucket.take("other", now=0.5) == 0.0
    assert bucket.take("k", now=100.0) == 0.0 and bucket.take("k", now=100.0) == 0.0  # capped at the burst
    assert bucket.take("k", now=100.0) > 0
    assert RateLimiter(rate=0.0, burst=1).take("k", now=0.0) == 0.0  # 0: no limit


def test_costopt_admin_team_policy_sets_the_policy_on_the_database(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from typer.testing import CliRunner

    from api.cli.main import app
    from costopt.db.engine import make_engine, migrate
    from costopt.jobs.teams import TeamRepository
    from costopt.settings import get_settings

    url = f"sqlite:///{tmp_path / 'c.db'}"
    monkeypatch.setenv("COSTOPT_DATABASE_URL", url)
    get_settings.cache_clear()
    engine = make_engine(url)
    migrate(engine)
    team = TeamRepository(engine).create_team("vision")
    runner = CliRunner()
    try:
        args = ["admin", "team-policy", team.id, "--local", "--allow-local", "--checkpoint-prefix", "s3://vision/"]
        done = runner.invoke(app, [*args, "-f", "json"])
        assert done.exit_code == 0, done.output
        policy = TeamRepository(engine).policy(team.id)
        assert policy.allow_local_provider and policy.checkpoint_prefixes == ("s3://vision/",)
        assert policy.image_prefixes is None  # left out: unchanged
        bad = runner.invoke(app, ["admin", "team-policy", team.id, "--local", "--checkpoint-prefix", "s3://vis"])
        assert bad.exit_code != 0 and TeamRepository(engine).policy(team.id) == policy
        back = runner.invoke(app, ["admin", "team-policy", team.id, "--local", "--no-allow-local", "--defaults"])
        assert back.exit_code == 0, back.output
        assert TeamRepository(engine).policy(team.id) == TeamPolicy()
    finally:
        engine.dispose()
        get_settings.cache_clear()
