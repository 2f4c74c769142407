"""``GET /metrics``: answered at the path itself (no redirect), Prometheus text format, the price
sources' health from the store, and the collectors' state per cloud."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import Engine

from api.app import create_app
from api.metrics import CONTENT_TYPE, PRICE_COLLECTORS_ENABLED, render
from costopt.settings import Settings
from pricing.store import PriceStore


@pytest.fixture
def client(engine: Engine) -> Iterator[TestClient]:
    settings = Settings(
        database_url=engine.url.render_as_string(hide_password=False), seed_on_start=False, collectors_enabled=False
    )
    app = create_app(settings)
    with TestClient(app) as c:
        app.state.store = PriceStore(engine)  # the fixture's engine (PostgreSQL tests use their own schema)
        yield c


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of a text-format body, by (name, sorted labels); parsing fails on a malformed body."""
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_metrics_answers_at_its_path_in_the_prometheus_text_format(client: TestClient) -> None:
    r = client.get("/metrics", follow_redirects=False)
    assert r.status_code == 200
    assert r.headers["content-type"] == CONTENT_TYPE
    samples = _samples(r.text)
    assert any(name == "python_info" for name, _ in samples)
    assert samples[("costopt_store_up", ())] == 1.0


def test_metrics_report_each_price_sources_health(client: TestClient) -> None:
    store: PriceStore = client.app.state.store  # type: ignore[attr-defined]
    at = datetime(2026, 11, 30, 12, tzinfo=UTC)
    store.record_fetch("aws-spot", ok=True, points=3, at=at)
    store.record_fetch("gcp", ok=False, error="HTTP 503", at=at)
    store.record_fetch("gcp", ok=False, error="HTTP 503", at=at)
    samples = _samples(client.get("/metrics").text)
    aws = (("source", "aws-spot"),)
    gcp = (("source", "gcp"),)
    assert samples[("costopt_price_source_last_success_timestamp_seconds", aws)] == at.timestamp()
    assert samples[("costopt_price_source_consecutive_failures", aws)] == 0.0
    assert samples[("costopt_price_source_consecutive_failures", gcp)] == 2.0
    assert ("costopt_price_source_last_success_timestamp_seconds", gcp) not in samples  # never succeeded
    assert samples[("costopt_price_source_last_attempt_timestamp_seconds", gcp)] == at.timestamp()


def test_an_unreachable_store_is_reported_not_a_failed_scrape(tmp_path: Path) -> None:
    from costopt.db.engine import make_engine

    missing = tmp_path / "no-such-folder" / "costopt.db"
    store = PriceStore(make_engine(f"sqlite:///{missing}"))
    samples = _samples(render(store).decode())
    assert samples[("costopt_store_up", ())] == 0.0
    assert not any(name.startswith("costopt_price_source_") for name, _ in samples)


def test_metrics_declared_in_api_metrics_are_exposed(client: TestClient) -> None:
    PRICE_COLLECTORS_ENABLED.labels(cloud="gcp").set(0)
    samples = _samples(client.get("/metrics").text)
    assert samples[("costopt_price_collectors_enabled", (("cloud", "gcp"),))] == 0.0


@pytest.fixture
def quiet_client(engine: Engine) -> Iterator[TestClient]:
    """The app without its scheduled jobs (no round executor launching the test's instances)."""
    settings = Settings(
        database_url=engine.url.render_as_string(hide_password=False),
        seed_on_start=False,
        collectors_enabled=False,
        migration_jobs_enabled=False,
        fleet_executor_enabled=False,
    )
    app = create_app(settings)
    with TestClient(app) as c:
        app.state.store = PriceStore(engine)
        yield c


def test_metrics_report_fleets_their_gpus_busy_and_idle_and_the_rounds_run(quiet_client: TestClient) -> None:
    client = quiet_client
    from decimal import Decimal

    from costopt.domain import Cloud, Market, OfferKey
    from costopt.fleets.model import InstanceState, NewFleet, NewInstance
    from costopt.fleets.store import FleetRepository

    store: PriceStore = client.app.state.store  # type: ignore[attr-defined]
    repo = FleetRepository(store.engine)
    v100 = OfferKey(Cloud.AWS, "us-east-1", "us-east-1a", "p3.8xlarge", Market.SPOT)
    k80 = OfferKey(Cloud.AWS, "us-east-1", "us-east-1b", "p2.xlarge", Market.SPOT)

    def lease(team: str, *instances: NewInstance) -> str:
        fleet, _ = repo.create(NewFleet(team_id=team, policy="fifo", instances=instances))
        return fleet.id

    a = lease("t1", NewInstance(v100, "v100", 4, "sim", Decimal("3.6")), NewInstance(k80, "k80", 1, "sim"))
    b = lease("t2", NewInstance(k80, "k80", 1, "sim"), NewInstance(k80, "k80", 1, "sim"))
    gone = lease("t3", NewInstance(v100, "v100", 4, "sim"))
    running = [i for f in (a, b) for i in repo.instances(f)][:3]  # a's V100 (4 GPUs) and K80, one of b's K80s
    for inst in running:
        assert repo.update_instance(inst.id, state=InstanceState.RUNNING)
    v100_inst, _, b_k80 = running
    at = datetime(2026, 11, 30, 12, tzinfo=UTC)
    for fleet_id, leases in ((a, [(v100_inst.id, [0, 1, 2], "v100")]), (b, [(b_k80.id, [0], "k80")])):
        for rnd in (1, 3):  # a later round in force (1 GPU, then 3): only its leases count
            fleet = repo.get(fleet_id)
            docs = [
                {
                    "job_id": f"job-{n}",
                    "instance": inst,
                    "gpus": gpus[:rnd] if rnd == 1 else gpus,
                    "type": t,
                    "epoch": 1,
                }
                for n, (inst, gpus, t) in enumerate(leases)
            ]
            started = repo.begin_round(
                fleet,
                started_at=at,
                ends_at=at,
                capacity={},
                assignment=docs,
                allocation=None,
                received={},
                active=[],
                previous_ended_at=at if rnd > 1 else None,
            )
            assert started
    repo.release(gone)
    samples = _samples(client.get("/metrics").text)
    assert samples[("costopt_fleets", (("state", "active"),))] == 2.0
    assert samples[("costopt_fleets", (("state", "released"),))] == 1.0
    assert samples[("costopt_fleet_instances", (("state", "running"),))] == 3.0
    assert samples[("costopt_fleet_instances", (("state", "pending"),))] == 1.0  # b's other K80
    assert samples[("costopt_fleet_instances", (("state", "draining"),))] == 1.0  # the released fleet's
    gpus = {labels: v for (name, labels), v in samples.items() if name == "costopt_fleet_gpus"}
    assert gpus == {
        (("state", "busy"), ("worker_type", "v100")): 3.0,
        (("state", "idle"), ("worker_type", "v100")): 1.0,
        (("state", "busy"), ("worker_type", "k80")): 1.0,
        (("state", "idle"), ("worker_type", "k80")): 1.0,
    }
    assert samples[("costopt_fleet_rounds_total", ())] == 4.0
