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
