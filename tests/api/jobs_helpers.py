"""Shared set-up of the job API tests: a service over a seeded store on each backend, three teams and keys."""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import Engine

from api.app import create_app, install_job_service
from api.planning import reset
from costopt.domain import Cloud, InstanceType, Market, OfferKey, PricePoint
from costopt.jobs.records import JobRepository
from costopt.jobs.teams import Role, TeamRepository
from costopt.settings import Settings
from pricing.store import PriceStore

T0 = datetime(2020, 3, 1, tzinfo=UTC)
JOB_TYPE = "ResNet-50 (batch size 128)"
P3_2X_SPOT = OfferKey(Cloud.AWS, "us-east-1", "us-east-1a", "p3.2xlarge", Market.SPOT)
P3_8X_SPOT = OfferKey(Cloud.AWS, "us-east-1", "us-east-1a", "p3.8xlarge", Market.SPOT)
BODY: dict[str, Any] = {"job_type": JOB_TYPE, "steps": 50_000, "command": ["python", "train.py"]}


def seed(store: PriceStore) -> None:
    """V100s on AWS (one GPU at 0.95 then 1.05 USD/h; four at 3.60: 0.90 per GPU) and Azure, a K80."""
    store.upsert_instance_types(
        [
            InstanceType(Cloud.AWS, "p3.2xlarge", "v100", 1, 8, 61),
            InstanceType(Cloud.AWS, "p3.8xlarge", "v100", 4, 32, 244),
            InstanceType(Cloud.AWS, "p2.xlarge", "k80", 1, 4, 61),
            InstanceType(Cloud.AZURE, "Standard_NC6s_v3", "v100", 1, 6, 112),
        ]
    )
    store.write(
        [
            PricePoint(P3_2X_SPOT, T0, 0.95, "t"),
            PricePoint(P3_2X_SPOT, T0 + timedelta(hours=5), 1.05, "t"),
            PricePoint(P3_8X_SPOT, T0, 3.60, "t"),
            PricePoint(OfferKey(Cloud.AWS, "us-east-1", "us-east-1b", "p2.xlarge", Market.SPOT), T0, 0.35, "t"),
            PricePoint(OfferKey(Cloud.AWS, "us-east-1", "", "p3.2xlarge", Market.ON_DEMAND), T0, 3.06, "t"),
            PricePoint(OfferKey(Cloud.AZURE, "eastus", "", "Standard_NC6s_v3", Market.SPOT), T0, 0.60313, "t"),
        ]
    )


@dataclass
class Service:
    """The app under test, its client, its repositories and one key per role and team."""

    app: FastAPI
    client: TestClient
    store: PriceStore
    jobs: JobRepository
    teams: TeamRepository
    admin: dict[str, str]
    alpha: dict[str, str]
    beta: dict[str, str]
    alpha_team: str
    beta_team: str

    def submit(self, headers: dict[str, str], **changes: Any) -> dict[str, Any]:
        """Submit ``BODY`` with ``changes``, then move the service's (simulated) clock on a second, so
        that jobs are created in order."""
        r = self.client.post("/v1/jobs", json={**BODY, **changes}, headers=headers)
        assert r.status_code == 201, r.text
        doc: dict[str, Any] = r.json()
        self.advance(timedelta(seconds=1))
        return doc

    def advance(self, delta: timedelta) -> None:
        """Move the service's clock (the simulated cloud's) on by ``delta``."""
        self.app.state.providers["sim"].clock.advance(delta)

    def routes(self, prefix: str) -> list[tuple[str, str]]:
        """(method, path) of every route of the app under ``prefix``, from its OpenAPI document."""
        paths = self.app.openapi()["paths"]
        return [(m.upper(), p) for p, ops in paths.items() if p.startswith(prefix) for m in sorted(ops)]


def bearer(secret: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}"}


def service(engine: Engine, tmp_path: Path, **settings: Any) -> Generator[Service, None, None]:
    """The service over ``engine`` (seeded), with an admin key and member keys of teams alpha and beta."""
    s = Settings(
        **{
            "database_url": engine.url.render_as_string(hide_password=False),
            "seed_on_start": False,
            "collectors_enabled": False,
            "migration_jobs_enabled": False,
            "clock": "auto",
            "provider": "sim",
            "checkpoint_root": f"file://{tmp_path / 'checkpoints'}",
            "engine_workers": 0,
            **settings,  # the test's own (may override the defaults above, e.g. provider)
        }
    )
    reset()
    app = create_app(s)
    with TestClient(app) as client:
        # the fixture's engine (PostgreSQL tests live in a schema of their own)
        store = PriceStore(engine)
        seed(store)
        app.state.store = store
        install_job_service(app, store, s)
        teams: TeamRepository = app.state.teams
        ops, alpha, beta = teams.create_team("ops"), teams.create_team("alpha"), teams.create_team("beta")
        yield Service(
            app=app,
            client=client,
            store=store,
            jobs=app.state.jobs,
            teams=teams,
            admin=bearer(teams.create_key(ops.id, Role.ADMIN).secret),
            alpha=bearer(teams.create_key(alpha.id).secret),
            beta=bearer(teams.create_key(beta.id).secret),
            alpha_team=alpha.id,
            beta_team=beta.id,
        )
    reset()


def error_of(resp: Any, status: int, code: str | None = None) -> dict[str, Any]:
    """The error document of ``resp``, checked: the status, the one shape, the code."""
    assert resp.status_code == status, resp.text
    doc = resp.json()
    assert set(doc) == {"error"}, doc
    err: dict[str, Any] = doc["error"]
    assert isinstance(err["code"], str) and err["code"] and err["code"] == err["code"].lower()
    assert isinstance(err["message"], str) and err["message"]
    assert set(err) <= {"code", "message", "details"}
    if code is not None:
        assert err["code"] == code, err
    return err
