"""The request path's caches (issue 10's load work): verified keys (api/auth.py), the planner's offer
table (api/job_planning.py), a page's events in one query (JobRepository.events_of)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine

import api.auth
from costopt.domain import PricePoint
from pricing.store import PriceStore
from tests.api.jobs_helpers import BODY, P3_2X_SPOT, P3_8X_SPOT, T0, Service, bearer, service


@pytest.fixture
def svc(engine: Engine, tmp_path: Path) -> Iterator[Service]:
    yield from service(engine, tmp_path)


def _key(svc: Service) -> tuple[str, dict[str, str]]:
    issued = svc.teams.create_key(svc.alpha_team)
    return issued.key.id, bearer(issued.secret)


def test_revoked_through_the_api_stops_at_once(svc: Service) -> None:
    key_id, headers = _key(svc)
    assert svc.client.get("/v1/jobs", headers=headers).status_code == 200  # verified: cached now
    assert svc.client.delete(f"/v1/admin/keys/{key_id}", headers=svc.admin).status_code == 204
    assert svc.client.get("/v1/jobs", headers=headers).status_code == 401


def test_revoked_elsewhere_stops_within_the_ttl(svc: Service, monkeypatch: pytest.MonkeyPatch) -> None:
    """Revoked by another process (here: the repository, behind the service's back): the cached key is
    trusted until its TTL runs out, then refused."""
    now = [1000.0]
    monkeypatch.setattr(api.auth.time, "monotonic", lambda: now[0])
    key_id, headers = _key(svc)
    assert svc.client.get("/v1/jobs", headers=headers).status_code == 200
    assert svc.teams.revoke(key_id)
    now[0] += api.auth.KEY_CACHE_TTL_S / 2
    assert svc.client.get("/v1/jobs", headers=headers).status_code == 200
    now[0] += api.auth.KEY_CACHE_TTL_S
    assert svc.client.get("/v1/jobs", headers=headers).status_code == 401


def test_the_cache_holds_hashes_only_and_no_bad_key(svc: Service) -> None:
    _, headers = _key(svc)
    secret = headers["Authorization"].removeprefix("Bearer ")
    assert svc.client.get("/v1/jobs", headers=headers).status_code == 200
    bad = secret[:-1] + ("A" if secret[-1] != "A" else "B")
    assert svc.client.get("/v1/jobs", headers=bearer(bad)).status_code == 401
    cache = svc.app.state.key_cache
    assert secret not in cache and bad not in cache
    assert len(cache) == 1 and all(len(d) == 64 for d in cache)


def test_a_new_price_is_quoted_at_once(svc: Service, monkeypatch: pytest.MonkeyPatch) -> None:
    """The offer table is cached per price version: a price written after a quote changes the next.
    The quotes are made at one time of the service's (simulated) clock, so the table is reused."""
    reads: list[object] = []
    snapshot = PriceStore.snapshot_frame

    def counted(self: PriceStore, *args: Any, **kwargs: Any) -> Any:
        reads.append(args)
        return snapshot(self, *args, **kwargs)

    monkeypatch.setattr(PriceStore, "snapshot_frame", counted)

    def submit() -> dict[str, Any]:
        r = svc.client.post("/v1/jobs", json=BODY, headers=svc.alpha)
        assert r.status_code == 201, r.text
        return dict(r.json()["quote"])

    first = submit()
    assert first["usd_per_hour"] > 0.01 and len(reads) == 1
    again = submit()  # the cached table: the same winner, no snapshot read
    assert again["offer"] == first["offer"] and len(reads) == 1
    # the cheapest offer's price drops far below every other (now, on the service's simulated clock,
    # which is when quotes are made): the next quote must take it
    sim_now = svc.app.state.providers["sim"].clock.now()
    assert first["as_of"] == again["as_of"] == sim_now.isoformat().replace("+00:00", "Z")
    svc.store.write([PricePoint(P3_2X_SPOT, sim_now, 0.01, "t")])
    after = submit()  # a new price version: the table is built again
    assert len(reads) == 2
    assert after["offer"]["instance_type"] == P3_2X_SPOT.instance_type
    assert after["usd_per_hour"] == pytest.approx(0.01)


def test_a_page_renders_each_jobs_own_events(svc: Service) -> None:
    ids = [svc.submit(svc.alpha)["id"] for _ in range(3)]
    svc.client.post(f"/v1/jobs/{ids[1]}/cancel", headers=svc.alpha)
    for i, job_id in enumerate(ids):  # each job its own number of moves (0, 1, 2), each with its reason
        for n in range(i):
            detail = {"from": P3_2X_SPOT.to_doc(), "to": P3_8X_SPOT.to_doc()}
            svc.jobs.add_event(job_id, "move", f"{job_id} move {n}", detail=detail)
    page = svc.client.get("/v1/jobs", params={"limit": 50}, headers=svc.alpha).json()["items"]
    assert [item["id"] for item in page] == ids
    assert [[m["reason"] for m in item["moves"]] for item in page] == [
        [f"{job_id} move {n}" for n in range(i)] for i, job_id in enumerate(ids)
    ]
    for item in page:
        alone = svc.client.get(f"/v1/jobs/{item['id']}", headers=svc.alpha).json()
        assert item["moves"] == alone["moves"] and item["state"] == alone["state"]
    events = svc.jobs.events_of([*ids, "job-none"])
    assert events["job-none"] == []
    for job_id in ids:
        assert events[job_id] == svc.jobs.events(job_id)
    assert len(events[ids[1]]) > len(events[ids[0]])  # the cancelled one has more


def test_quotes_are_made_at_the_service_clock_over_the_simulated_cloud(svc: Service) -> None:
    """Over the simulated cloud the job launches at the sim's time, so its quote is priced then, not at
    the data's newest time (p3.2xlarge spot is 0.95 USD/h at T0 and 1.05 from T0 + 5 h)."""
    sim_now = svc.app.state.providers["sim"].clock.now()
    assert sim_now < T0 + timedelta(hours=5)
    doc = svc.submit(svc.alpha, constraints={"clouds": ["aws"], "accelerators": ["v100"], "max_usd_per_hour": 2.0})
    assert doc["quote"]["as_of"] == sim_now.isoformat().replace("+00:00", "Z")
    assert doc["quote"]["offer"]["instance_type"] == P3_2X_SPOT.instance_type
    assert doc["quote"]["usd_per_hour"] == pytest.approx(0.95)
