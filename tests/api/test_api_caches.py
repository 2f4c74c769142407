"""The request path's caches and reads (issue 10's load work): verified keys (api/auth.py), the planner's
offer table (api/job_planning.py: per price epoch, not per clock tick), a page's events in one query
(JobRepository.events_of), a job read in one connection checkout (the ledger only for a job that
launched), a submission written in one transaction."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, event

import api.auth
from costopt.domain import PricePoint
from costopt.jobs.costs import job_cost
from costopt.jobs.model import JobState
from costopt.ledger.model import IntervalRecord
from pricing.mirror import read_version
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
    monkeypatch.setattr("api.auth.time.monotonic", lambda: now[0])
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


def test_the_table_outlives_clock_ticks_until_a_price_takes_effect(
    svc: Service, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Over the simulated clock every tick is a new plan time: the cached table serves every time at
    which the same price points are in effect (its price epoch) and is built again once the clock passes
    a price change (p3.2xlarge spot: 0.95 USD/h until T0 + 5 h, then 1.05)."""
    reads: list[object] = []
    snapshot = PriceStore.snapshot_frame

    def counted(self: PriceStore, *args: Any, **kwargs: Any) -> Any:
        reads.append(args)
        return snapshot(self, *args, **kwargs)

    monkeypatch.setattr(PriceStore, "snapshot_frame", counted)
    v100 = {"constraints": {"clouds": ["aws"], "accelerators": ["v100"], "max_usd_per_hour": 2.0}}
    clock = svc.app.state.providers["sim"].clock
    quotes = []
    for _ in range(3):  # three ticks of the clock, no price change: one table
        quotes.append(svc.submit(svc.alpha, **v100)["quote"])
        svc.advance(timedelta(minutes=20))
    assert len(reads) == 1
    assert len({q["as_of"] for q in quotes}) == 3  # each quote at its own time
    assert [q["usd_per_hour"] for q in quotes] == [pytest.approx(0.95)] * 3
    clock.advance_to(T0 + timedelta(hours=5))
    later = svc.submit(svc.alpha, **v100)["quote"]
    assert len(reads) == 2
    assert later["offer"]["instance_type"] == P3_2X_SPOT.instance_type
    assert later["usd_per_hour"] == pytest.approx(1.05)


def test_the_price_epoch_moves_with_points_and_staleness(svc: Service) -> None:
    """The epoch of a plan time counts the points in effect and the offers stale by then: the same
    between two price changes, different across one, and across an offer turning stale."""
    planner = svc.app.state.job_planner
    store = svc.store
    version = read_version(store.engine)
    epoch = planner.price_epoch
    assert epoch(version, T0 + timedelta(hours=1)) == epoch(version, T0 + timedelta(hours=4, minutes=59))
    assert epoch(version, T0 + timedelta(hours=4, minutes=59)) != epoch(version, T0 + timedelta(hours=5))
    late = T0 + timedelta(hours=5) + store.stale_after + timedelta(days=30)  # every offer stale by then
    assert epoch(version, T0 + timedelta(hours=5)) != epoch(version, late)
    assert epoch(version, None) is None  # live: judged at the wall clock (the TTL bounds it)


class _Counter:
    """Pool checkouts and SQL statements on ``engine`` while :meth:`counting`."""

    def __init__(self, engine: Engine) -> None:
        self.checkouts = 0
        self.statements: list[str] = []
        self.on = False

        @event.listens_for(engine, "checkout")
        def _checkout(*_: Any) -> None:
            if self.on:
                self.checkouts += 1

        @event.listens_for(engine, "before_cursor_execute")
        def _statement(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
            if self.on:
                self.statements.append(" ".join(statement.split()))

        self._listeners = [(engine, "checkout", _checkout), (engine, "before_cursor_execute", _statement)]

    @contextmanager
    def counting(self) -> Iterator[_Counter]:
        self.checkouts, self.statements, self.on = 0, [], True
        try:
            yield self
        finally:
            self.on = False

    def remove(self) -> None:
        for target, name, fn in self._listeners:
            event.remove(target, name, fn)


@pytest.fixture
def counter(svc: Service, monkeypatch: pytest.MonkeyPatch) -> Iterator[_Counter]:
    """Counts on the service's engine; a verified key stays cached for the whole test (a slow machine
    would otherwise see the key read again within the counted requests)."""
    monkeypatch.setattr(api.auth, "KEY_CACHE_TTL_S", 3600.0)
    c = _Counter(svc.store.engine)
    yield c
    c.remove()


def test_a_queued_job_is_read_in_one_checkout_without_the_ledger(svc: Service, counter: _Counter) -> None:
    """GET /v1/jobs/{id} of a job that never launched: one pool checkout, the job and its events (two
    statements), no ledger read; its cost is 0 as the ledger's would be."""
    job = svc.submit(svc.alpha)
    assert svc.client.get(f"/v1/jobs/{job['id']}", headers=svc.alpha).status_code == 200  # the key cached
    with counter.counting():
        r = svc.client.get(f"/v1/jobs/{job['id']}", headers=svc.alpha)
    assert r.status_code == 200 and r.json()["cost_so_far_usd"] == "0.000000"
    assert counter.checkouts == 1
    assert len(counter.statements) == 2, counter.statements
    assert "FROM jobs" in counter.statements[0] and "FROM job_events" in counter.statements[1]
    assert not any("ledger_" in s for s in counter.statements)
    assert Decimal(r.json()["cost_so_far_usd"]) == job_cost(svc.app.state.ledger, job["id"], svc.jobs.now())


def test_a_launched_job_reads_the_ledger_on_the_same_connection(svc: Service, counter: _Counter) -> None:
    """A job that launched: the job, its events and the ledger (intervals, their segments, charges) on
    one checkout; the cost is the ledger's. (The copy here has ended: its price was integrated when it
    closed. An open copy's price steps are the price store's own read.)"""
    job_id = svc.submit(svc.alpha)["id"]
    start = svc.jobs.now()
    svc.jobs.transition(job_id, JobState.LAUNCHING, "launching (test)")
    ledger = svc.app.state.ledger
    end = start + timedelta(hours=2)
    ledger.record_interval(IntervalRecord(f"sim:{job_id}", job_id, "i-1", P3_2X_SPOT, start, end))
    svc.advance(timedelta(hours=3))
    svc.client.get(f"/v1/jobs/{job_id}", headers=svc.alpha)  # the key cached
    with counter.counting():
        r = svc.client.get(f"/v1/jobs/{job_id}", headers=svc.alpha)
    assert r.status_code == 200
    assert counter.checkouts == 1, counter.statements
    names = ("job_events", "ledger_intervals", "ledger_segments", "ledger_charges", "jobs")
    tables = [next(t for t in names if f"FROM {t}" in s) for s in counter.statements]
    assert tables == ["jobs", "job_events", "ledger_intervals", "ledger_segments", "ledger_charges"], tables
    cost = Decimal(r.json()["cost_so_far_usd"])
    assert cost == job_cost(ledger, job_id, svc.jobs.now()) == Decimal("1.900000")  # 2 h x 0.95 USD/h


def test_a_submission_writes_once_and_reads_nothing_back(svc: Service, counter: _Counter) -> None:
    """POST /v1/jobs with an Idempotency-Key: two connection checkouts (the quote's two small reads, then
    one transaction inserting the job, which is the idempotency check: nothing inserted when the key is
    taken, and its event), no read of the job tables; a retry inserts nothing and reads the first job."""
    headers = {**svc.alpha, "Idempotency-Key": "once"}
    svc.submit(svc.alpha)  # the key, the offer table and the plan cached
    with counter.counting():
        first = svc.client.post("/v1/jobs", json=BODY, headers=headers)
    assert first.status_code == 201
    # two checkouts: the quote's reads (the price version, the unavailable offers), the write
    assert counter.checkouts == 2, counter.statements
    job_sql = [s for s in counter.statements if " jobs" in s or "job_events" in s]
    assert [(s.split()[0], "job_events" in s) for s in job_sql] == [("INSERT", False), ("INSERT", True)], job_sql
    with counter.counting():
        again = svc.client.post("/v1/jobs", json=BODY, headers=headers)
    assert again.status_code == 200 and again.json() == first.json()
    job_sql = [s for s in counter.statements if " jobs" in s or "job_events" in s]
    assert [(s.split()[0], "job_events" in s) for s in job_sql] == [
        ("INSERT", False),  # did nothing: the key is taken
        ("SELECT", False),  # the first job
        ("SELECT", True),  # its events, to render it
    ], job_sql
    assert len(svc.jobs.events(first.json()["id"])) == 1


def test_a_retry_answers_the_first_job_even_when_it_cannot_be_planned_now(svc: Service) -> None:
    """The idempotency check is the insert, after the quote: a retry whose quote fails now (every offer
    marked unavailable since) still answers the job accepted first, not a 422."""
    headers = {**svc.alpha, "Idempotency-Key": "before-the-drought"}
    first = svc.client.post("/v1/jobs", json=BODY, headers=headers)
    assert first.status_code == 201
    gone = svc.app.state.job_service.unavailable
    for offer in svc.store.snapshot(svc.jobs.now(), include_stale=True):
        gone.mark(offer.key, "capacity", at=svc.jobs.now())
    fresh = svc.client.post("/v1/jobs", json=BODY, headers=svc.alpha)
    assert fresh.status_code == 422  # nothing can be planned now
    again = svc.client.post("/v1/jobs", json=BODY, headers=headers)
    assert again.status_code == 200 and again.json()["id"] == first.json()["id"]


def test_identical_submissions_share_one_plan_until_prices_change(
    svc: Service, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A quote is a function of the cached table and the job's planning fields: identical submissions (a
    sweep's) are planned once; another step count, a user-throughput job or a new price plans again."""
    import costopt.planning.single as single

    calls: list[object] = []
    plan_job = single.plan_job

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(args[0])
        return plan_job(*args, **kwargs)

    monkeypatch.setattr(single, "plan_job", counted)
    quotes = [svc.submit(svc.alpha, command=["python", f"train_{i}.py"])["quote"] for i in range(3)]
    assert len(calls) == 1
    assert all(
        q["offer"] == quotes[0]["offer"] and q["expected_cost_usd"] == quotes[0]["expected_cost_usd"] for q in quotes
    )
    assert len({q["as_of"] for q in quotes}) == 3  # each at its own time: the clock moved, the prices did not
    svc.submit(svc.alpha, steps=10_000)
    assert len(calls) == 2
    for _ in range(2):
        svc.submit(svc.alpha, job_type=None, throughput={"v100": 10.0})
    assert len(calls) == 4
    sim_now = svc.app.state.providers["sim"].clock.now()
    svc.store.write([PricePoint(P3_2X_SPOT, sim_now, 0.01, "t")])
    cheap = svc.submit(svc.alpha)["quote"]
    assert len(calls) == 5 and cheap["usd_per_hour"] == pytest.approx(0.01)


def test_a_running_jobs_eta_is_priced_on_a_cached_one_offer_table(
    svc: Service, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every read of a running job prices its offer for the ETA: the one-offer table is read from the store
    once per price epoch, not at every read (p3.2xlarge spot changes price at T0 + 5 h)."""
    job_id = svc.submit(svc.alpha)["id"]
    svc.jobs.transition(job_id, JobState.LAUNCHING, "launching (test)")
    svc.jobs.transition(job_id, JobState.RUNNING, "started (test)", offer=P3_2X_SPOT, usd_per_hour=Decimal("0.95"))
    reads: list[object] = []
    snapshot = PriceStore.snapshot_frame

    def counted(self: PriceStore, *args: Any, **kwargs: Any) -> Any:
        reads.append(kwargs.get("instance_type"))
        return snapshot(self, *args, **kwargs)

    monkeypatch.setattr(PriceStore, "snapshot_frame", counted)
    etas = []
    for _ in range(3):
        doc = svc.client.get(f"/v1/jobs/{job_id}", headers=svc.alpha).json()
        assert doc["state"] == "running" and doc["eta"] is not None
        etas.append(doc["eta"])
        svc.advance(timedelta(minutes=10))
    assert reads == [P3_2X_SPOT.instance_type]  # one read of the offer for three reads of the job
    assert len(set(etas)) == 3  # each ETA counted from its own now
    svc.app.state.providers["sim"].clock.advance_to(T0 + timedelta(hours=5))
    assert svc.client.get(f"/v1/jobs/{job_id}", headers=svc.alpha).json()["eta"] is not None
    assert reads == [P3_2X_SPOT.instance_type] * 2  # a new price in effect: read again


def test_the_planners_caches_drop_expired_entries_as_they_grow(svc: Service, monkeypatch: pytest.MonkeyPatch) -> None:
    """An offer table (and its quotes) past its TTL is never served again, so it is dropped at the next
    insertion instead of being kept until the cache is full: after a new price and the TTL, the planner
    holds the new version's table only (the soak's memory growth, issue 14)."""
    import api.job_planning as jp

    now = [1000.0]
    monkeypatch.setattr("api.job_planning.time.monotonic", lambda: now[0])
    planner = svc.app.state.job_planner
    svc.submit(svc.alpha)
    assert len(planner._tables) == 1 and len(planner._plans) == 1
    for i in range(3):  # a new price version each time, then the TTL
        sim_now = svc.app.state.providers["sim"].clock.now()
        svc.store.write([PricePoint(P3_2X_SPOT, sim_now, 0.5 + i / 100, "t")])
        now[0] += jp.TABLE_TTL_S + 1
        svc.submit(svc.alpha)
    assert len(planner._tables) == 1 and len(planner._plans) == 1
    assert next(iter(planner._tables))[0] == read_version(svc.store.engine)
