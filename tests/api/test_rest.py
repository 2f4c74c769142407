"""The REST API: health, readiness, prices (filters, JSON shape, bad input)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine

from api.app import create_app
from costopt.db.engine import make_engine
from costopt.domain import Cloud, InstanceType, Market, OfferKey, PricePoint
from costopt.settings import Settings
from pricing.store import PriceStore

T0 = datetime(2020, 3, 1, tzinfo=UTC)


def _seed(store: PriceStore) -> None:
    store.upsert_instance_types(
        [
            InstanceType(Cloud.AWS, "p3.2xlarge", "v100", 1, 8, 61),
            InstanceType(Cloud.AWS, "p2.xlarge", "k80", 1, 4, 61),
            InstanceType(Cloud.AZURE, "Standard_NC6s_v3", "v100", 1, 6, 112),
        ]
    )
    pts = [
        PricePoint(OfferKey(Cloud.AWS, "us-east-1", "us-east-1a", "p3.2xlarge", Market.SPOT), T0, 0.95, "t"),
        PricePoint(
            OfferKey(Cloud.AWS, "us-east-1", "us-east-1a", "p3.2xlarge", Market.SPOT),
            T0 + timedelta(hours=5),
            1.05,
            "t",
        ),
        PricePoint(OfferKey(Cloud.AWS, "us-east-1", "us-east-1b", "p2.xlarge", Market.SPOT), T0, 0.35, "t"),
        PricePoint(OfferKey(Cloud.AWS, "us-east-1", "", "p3.2xlarge", Market.ON_DEMAND), T0, 3.06, "t"),
        PricePoint(OfferKey(Cloud.AZURE, "eastus", "", "Standard_NC6s_v3", Market.SPOT), T0, 0.60313, "t"),
    ]
    store.write(pts)


@pytest.fixture
def client(engine: Engine, tmp_path: Path) -> Iterator[TestClient]:
    settings = Settings(
        database_url=engine.url.render_as_string(hide_password=False),
        seed_on_start=False,
        collectors_enabled=False,
        clock="auto",
    )
    app = create_app(settings)
    with TestClient(app) as c:
        # use the fixture's engine (PostgreSQL tests live in a schema of their own)
        app.state.store = PriceStore(engine)
        _seed(app.state.store)
        yield c


def test_livez_says_the_process_is_up(client: TestClient) -> None:
    assert client.get("/livez").json() == {"status": "ok", "detail": None}


def test_readyz_is_ok_on_a_migrated_database(client: TestClient) -> None:
    assert client.get("/readyz").status_code == 200


def test_readyz_is_unavailable_when_the_schema_is_not_migrated(client: TestClient, tmp_path: Path) -> None:
    app = client.app
    app.state.store = PriceStore(make_engine(f"sqlite:///{tmp_path / 'empty.db'}"))  # type: ignore[attr-defined]
    r = client.get("/readyz")
    assert r.status_code == 503 and "costopt db migrate" in r.json()["detail"]


def test_readyz_is_unavailable_when_the_database_is_unreachable(client: TestClient) -> None:
    app = client.app
    app.state.store = PriceStore(make_engine("postgresql+psycopg://postgres@127.0.0.1:9/none"))  # type: ignore[attr-defined]
    r = client.get("/readyz")
    assert r.status_code == 503 and "unreachable" in r.json()["detail"]


def test_latest_at_a_time_lists_offers_cheapest_first_with_units(client: TestClient) -> None:
    r = client.get("/v1/prices/latest", params={"at": "2020-03-01T03:00:00Z"})
    assert r.status_code == 200
    body = r.json()
    assert body["clock"] == "explicit" and body["count"] == 4  # 5 points over 4 offers
    prices = [i["usd_per_hour"] for i in body["items"]]
    assert prices == sorted(prices) and prices[0] == 0.35
    first = body["items"][0]
    assert {
        "cloud",
        "region",
        "zone",
        "instance_type",
        "market",
        "accelerator",
        "gpu_count",
        "usd_per_hour",
        "valid_from",
    } <= set(first)
    assert first["accelerator"] == "k80" and isinstance(first["usd_per_hour"], float)


def test_latest_filters_by_gpu_cloud_and_market(client: TestClient) -> None:
    body = client.get(
        "/v1/prices/latest", params={"at": "2020-03-01T06:00:00Z", "gpu": "V100", "market": "spot"}
    ).json()
    assert [(i["cloud"], i["usd_per_hour"]) for i in body["items"]] == [("azure", 0.60313), ("aws", 1.05)]
    body = client.get("/v1/prices/latest", params={"at": "2020-03-01T06:00:00Z", "cloud": "aws", "gpu": "v100"}).json()
    assert {i["market"] for i in body["items"]} == {"spot", "on_demand"}


def test_latest_without_a_time_replays_at_the_datas_own_time_when_nothing_is_fresh(client: TestClient) -> None:
    body = client.get("/v1/prices/latest").json()
    assert body["clock"] == "replay"
    assert body["as_of"].startswith("2020-03-01T05:00:00")
    assert body["count"] == 4  # every offer was confirmed within 7 days of 05:00
    by_type = {(i["instance_type"], i["market"]): i["usd_per_hour"] for i in body["items"]}
    assert by_type[("p3.2xlarge", "spot")] == 1.05


def test_latest_rejects_a_time_without_offset_and_an_unknown_market(client: TestClient) -> None:
    r = client.get("/v1/prices/latest", params={"at": "2020-03-01T00:00:00"})
    assert r.status_code == 422 and "offset" in r.json()["error"]["message"]
    assert client.get("/v1/prices/latest", params={"market": "cheap"}).status_code == 422
    assert client.get("/v1/prices/latest", params={"limit": 0}).status_code == 422


def test_history_returns_the_step_function_over_a_range(client: TestClient) -> None:
    body = client.get(
        "/v1/prices/history",
        params={
            "cloud": "aws",
            "instance_type": "p3.2xlarge",
            "market": "spot",
            "start": "2020-03-01T01:00:00Z",
            "end": "2020-03-02T00:00:00Z",
        },
    ).json()
    assert [i["usd_per_hour"] for i in body["items"]] == [0.95, 1.05]


def test_sources_lists_recorded_collection_runs(client: TestClient) -> None:
    client.app.state.store.record_fetch("azure", ok=False, error="HTTP 503 after 4 tries")  # type: ignore[attr-defined]
    body = client.get("/v1/prices/sources").json()
    assert body["count"] == 1 and body["items"][0]["consecutive_failures"] == 1


def test_metrics_are_exposed_for_prometheus(client: TestClient) -> None:
    r = client.get("/metrics", follow_redirects=False)
    assert r.status_code == 200 and "python_info" in r.text


def test_a_plan_request_returns_winner_alternatives_and_reason(client: TestClient) -> None:
    body = {
        "job_type": "ResNet-50 (batch size 128)",
        "steps": 100000,
        "objective": "min-cost",
        "at": "2020-03-01T06:00:00Z",
        "top": 3,
    }
    r = client.post("/v1/plans", json=body)
    assert r.status_code == 200, r.text
    plan = r.json()
    assert plan["winner"] == plan["alternatives"][0]
    assert plan["winner"]["accelerator"] in ("k80", "v100") and plan["reason"]
    assert isinstance(plan["winner"]["expected_cost_usd"], float)


def test_an_infeasible_plan_names_the_binding_constraint(client: TestClient) -> None:
    body = {
        "job_type": "ResNet-50 (batch size 128)",
        "steps": 1e9,
        "objective": "min-cost-deadline",
        "deadline_hours": 1,
        "at": "2020-03-01T06:00:00Z",
    }
    r = client.post("/v1/plans", json=body)
    assert r.status_code == 404
    assert r.json()["error"]["details"] == [{"binding": "deadline"}]


def test_a_malformed_plan_request_is_rejected_with_the_field(client: TestClient) -> None:
    r = client.post("/v1/plans", json={"job_type": "ResNet-50 (batch size 128)", "steps": -5})
    assert r.status_code == 422
    assert "steps" in r.text
    r = client.post("/v1/plans", json={"job_type": "X", "steps": 5, "objective": "min-time-budget"})
    assert r.status_code == 422
    assert "budget" in r.text
    assert client.post("/v1/plans", content=b"{not json").status_code == 422


def test_an_offer_recently_preempted_is_kept_out_of_plans(client: TestClient, engine: Engine) -> None:
    from datetime import UTC, datetime

    from costopt.domain import Cloud, Market, OfferKey
    from costopt.migration.unavailable import REASON_PREEMPTED, UnavailableOffers

    body = {"job_type": "ResNet-50 (batch size 128)", "steps": 100000, "objective": "min-cost"}
    body["at"] = "2020-03-01T06:00:00Z"
    first = client.post("/v1/plans", json=body).json()["winner"]
    offer = OfferKey(
        Cloud(first["cloud"]), first["region"], first["zone"], first["instance_type"], Market(first["market"])
    )
    UnavailableOffers(engine).mark(offer, REASON_PREEMPTED, at=datetime(2020, 3, 1, 5, 30, tzinfo=UTC))
    second = client.post("/v1/plans", json=body).json()
    keys = [(a["cloud"], a["region"], a["zone"], a["instance_type"], a["market"]) for a in second["alternatives"]]
    assert (offer.cloud.value, offer.region, offer.zone, offer.instance_type, offer.market.value) not in keys
    assert second["winner"] != first
