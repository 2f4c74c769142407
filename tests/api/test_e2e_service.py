"""End to end through HTTP: two teams submit jobs over REST to the real app; the simulated cloud runs them on
the replayed 2020 AWS spot prices (the real data folder); the service's own engine tick, interruption
watcher, reconciler and rebalancer move them, driven here on the simulated clock (no wall-clock waits).

Checked: every job finishes with exactly its steps (the agent's audit); a spot preemption is recovered; the
rebalancer moves a job; each job's ``cost_so_far_usd`` equals the ledger's bill of its copies (intervals x
the store's prices, exact Decimal); team B never sees nor changes team A's jobs.

The data picks the move: a1 (us-east-1 spot only) starts in the zone cheapest for it on 2020-02-29, and
the rebalancer (every six simulated hours, moves taken as free) moves it when another zone becomes cheaper
per step. The preemption is forced (``SimCloud.preempt``, through the same notice and preemption path as a
drawn one) on the copy that move launched, so a recovery is always exercised whatever the sim's seed;
the replayed market's own hazards may reclaim a copy too.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine

from api.app import create_app, install_job_service
from api.planning import reset
from api.service import JobService
from api.wiring import seed_catalog
from costopt.agent import control
from costopt.cloud import Interruption
from costopt.jobs.model import JobState
from costopt.jobs.offline import ALWAYS_MOVE
from costopt.jobs.rebalance import Rebalancer
from costopt.jobs.teams import Role
from costopt.ledger.model import micro_to_usd, usd_to_micro
from costopt.settings import Settings
from pricing.importer import import_paths
from pricing.store import PriceStore
from providers.sim import SimCloud

pytestmark = pytest.mark.one_backend_each  # the database is not the subject here: tests/conftest.py

START = datetime(2020, 2, 29, tzinfo=UTC)
AWS_SPOT_FILE = "aws_spot_price_history_2019-12_2020-03_p2_p3.csv"
JOB_TYPE = "ResNet-50 (batch size 128)"
STEP = timedelta(minutes=20)  # simulated time between two engine ticks and watcher passes
REBALANCE_EVERY = timedelta(hours=6)  # a rebalancer pass (and a reconciler pass) every six simulated hours


def _bearer(secret: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}"}


@pytest.fixture
def app_client(engine: Engine, tmp_path: Path, shared_data: Path) -> Iterator[tuple[TestClient, JobService]]:
    settings = Settings(
        database_url=engine.url.render_as_string(hide_password=False),
        data_dir=shared_data,
        seed_on_start=False,
        collectors_enabled=False,
        migration_jobs_enabled=False,  # the test runs the engine, watcher, reconciler and rebalancer itself
        provider="sim",
        sim_start=START,
        checkpoint_root=f"file://{tmp_path / 'checkpoints'}",
        engine_workers=0,
        rebalance_margin_fraction=0.0,
        rebalance_margin_min_usd=0.0,
        rebalance_dwell=timedelta(0),
    )
    reset()
    app = create_app(settings)
    with TestClient(app) as client:
        if app.state.sim_clock is not None:
            app.state.sim_clock.stop()  # time moves only when the test moves it
        store = PriceStore(engine)  # the fixture's database (PostgreSQL: a schema of its own)
        seed_catalog(store, settings)
        reports = import_paths(store, [shared_data / "prices" / AWS_SPOT_FILE])
        assert all(r.status not in ("failed", "refused") for r in reports), reports
        app.state.store = store
        install_job_service(app, store, settings)
        yield client, app.state.job_service
    reset()


def _advance(service: JobService, until: datetime) -> None:
    sim = service.providers["sim"]
    assert isinstance(sim, SimCloud)
    sim.run_to(until)


@pytest.mark.slow
def test_two_teams_jobs_run_move_recover_and_finish_through_http(
    app_client: tuple[TestClient, JobService],
) -> None:
    client, service = app_client
    teams = service.teams
    ops = teams.create_team("ops")
    admin = _bearer(teams.create_key(ops.id, Role.ADMIN).secret)
    keys = {}
    for name in ("a", "b"):
        r = client.post("/v1/admin/teams", json={"name": f"team-{name}"}, headers=admin)
        assert r.status_code == 201, r.text
        keys[name] = _bearer(r.json()["key"])

    body: dict[str, Any] = {
        "job_type": JOB_TYPE,
        "command": ["python", "train.py"],
        "constraints": {"clouds": ["aws"], "markets": ["spot"]},
    }
    submitted = {
        "a1": client.post(
            "/v1/jobs",
            json={
                **body,
                "name": "a1",
                "steps": 200_000,  # ~22 simulated hours: past two rebalancer passes after the first move
                "constraints": {"regions": ["us-east-1"], "markets": ["spot"]},
            },
            headers=keys["a"],
        ),
        "a2": client.post("/v1/jobs", json={**body, "name": "a2", "steps": 60_000}, headers=keys["a"]),
        "b1": client.post("/v1/jobs", json={**body, "name": "b1", "steps": 80_000}, headers=keys["b"]),
    }
    for r in submitted.values():
        assert r.status_code == 201, r.text
    ids = {k: r.json()["id"] for k, r in submitted.items()}
    team_of = {"a1": "a", "a2": "a", "b1": "b"}

    # the service's rebalancer (its repository, placements, engine moves and clock) with moves taken as
    # free (no margin, dwell, restart or egress): it moves a job as soon as another zone is cheaper per step
    rebalancer = Rebalancer(
        service.repo, service.placements, service.engine.move, ALWAYS_MOVE, service.clock, top=service.engine.rank_top
    )
    sim = service.providers["sim"]
    assert isinstance(sim, SimCloud)
    next_rebalance = START + REBALANCE_EVERY
    reports: list[Any] = []
    forced: Interruption | None = None
    for _ in range(24 * 6 * 14):  # at most two simulated weeks
        service.engine.tick()
        service.migration.watch()
        now = sim.now()
        if now >= next_rebalance:
            service.migration.reconcile()
            reports.append(rebalancer.run_once(dry_run=False))
            next_rebalance += REBALANCE_EVERY
        docs = {k: client.get(f"/v1/jobs/{i}", headers=keys[team_of[k]]).json() for k, i in ids.items()}
        if all(d["state"] in ("succeeded", "failed", "cancelled") for d in docs.values()):
            break
        if (
            forced is None
            and docs["a1"]["state"] == "running"
            and any(m["kind"] == "move" for m in docs["a1"]["moves"])
        ):
            # the spot market reclaims a1's new copy (as a drawn preemption would: a notice, then taken)
            forced = sim.preempt(service.migrators["sim"].job(ids["a1"]).instance_id or "")
        _advance(service, sim.now() + STEP)  # a move may have moved the clock
    else:
        pytest.fail(f"the jobs did not finish: {docs}")

    moves = {k: d["moves"] for k, d in docs.items()}
    for k, d in docs.items():
        assert d["state"] == "succeeded", (
            k,
            d["reason"],
            client.get(f"/v1/jobs/{ids[k]}/events", headers=keys[team_of[k]]).json(),
        )
        assert d["steps_done"] == d["steps_total"]
        audit = control.audit_job(d["checkpoint_uri"], d["steps_total"])
        assert audit.ok and audit.steps_done == d["steps_total"], (k, audit.problems)
        # the cost in the API is the ledger's bill of the job's copies, to the micro-dollar
        assert Decimal(d["cost_so_far_usd"]) == service.cost(ids[k]) > 0
        assert Decimal(d["cost_so_far_usd"]) == _bill(service, ids[k])
    # a1 (us-east-1 only) starts in one zone, moves when another zone becomes cheaper per step, is preempted
    # there (forced) and recovered from its checkpoint
    a1 = [m["kind"] for m in moves["a1"]]
    assert "move" in a1 and a1.count("recovery") == a1.count("preemption") >= 1, moves["a1"]
    assert forced is not None and forced.deadline is not None
    # the forced one: the first preemption after the first move (forced at the next look, one STEP on)
    first_move = a1.index("move")
    i = a1.index("preemption", first_move)
    assert moves["a1"][i]["from"] == moves["a1"][first_move]["to"], moves["a1"]  # the copy the move launched
    assert datetime.fromisoformat(moves["a1"][i]["at"]) >= forced.noticed_at
    assert a1[i + 1] == "recovery", moves["a1"]
    for m in moves["a1"]:
        if m["kind"] == "move":
            assert m["from"] != m["to"] and Decimal(m["cost_usd"]) >= 0, m
    assert any(item.outcome.value == "moved" for r in reports for item in r.items)

    # the listing prices its page in one ledger read: the same figures as each job's own page
    listed_a = {j["id"]: j for j in client.get("/v1/jobs", headers=keys["a"]).json()["items"]}
    for k in ("a1", "a2"):
        assert Decimal(listed_a[ids[k]]["cost_so_far_usd"]) == Decimal(docs[k]["cost_so_far_usd"])
    # team B never sees nor changes team A's jobs
    listed_b = client.get("/v1/jobs", headers=keys["b"]).json()
    assert {j["id"] for j in listed_b["items"]} == {ids["b1"]} and listed_b["total"] == 1
    for k in ("a1", "a2"):
        for path in ("", "/events", "/logs"):
            assert client.get(f"/v1/jobs/{ids[k]}{path}", headers=keys["b"]).status_code == 404
        assert client.post(f"/v1/jobs/{ids[k]}/cancel", headers=keys["b"]).status_code == 404
        assert client.get(f"/v1/jobs/{ids[k]}", headers=keys["a"]).json()["state"] == "succeeded"
    assert service.repo.get(ids["a1"]).state is JobState.SUCCEEDED


def _bill(service: JobService, job_id: str) -> Decimal:
    """The job's bill recomputed from the ledger's lines: every interval closed, its segments covering it
    end to end, each segment's hours x its instance price (micro-dollars), plus the additive charges; the
    intervals are the migrator's copies of the job."""
    lines = service.ledger.intervals(job_id=job_id)  # type: ignore[attr-defined]
    copies = {c.instance_id: c for m in service.migrators.values() for c in m.copies(job_id)}
    assert {line.record.instance_id for line in lines} == set(copies)
    micro = 0
    for line in lines:
        rec = line.record
        assert rec.ended_at is not None and rec.ended_at == copies[rec.instance_id].ended_at
        assert rec.started_at == copies[rec.instance_id].started_at
        segs = line.segments
        assert segs[0].starts_at == rec.started_at and segs[-1].ends_at == rec.ended_at
        assert all(x.ends_at == y.starts_at for x, y in itertools.pairwise(segs))
        for seg in segs:
            seconds = Decimal((seg.ends_at - seg.starts_at) // timedelta(microseconds=1)).scaleb(-6)
            assert seg.amount_micro_usd == usd_to_micro(seconds * seg.usd_per_hour * rec.share / 3600)
            micro += seg.amount_micro_usd
    charges = service.ledger.charges(job_id=job_id)  # type: ignore[attr-defined]
    micro += sum(c.amount_micro_usd for c in charges if c.additive)
    return micro_to_usd(micro)


def test_job_side_schedules_count_the_service_clock() -> None:
    """Over the simulated cloud an hourly crontab fires once per simulated hour, however often it is
    polled, and skipped hours coalesce into one run."""
    from api.scheduler import OnServiceClock
    from api.ticks import Cron

    now = [datetime(2020, 3, 1, 0, 30, tzinfo=UTC)]
    runs: list[datetime] = []
    on_clock = OnServiceClock(Cron("0 * * * *"), lambda: now[0], lambda: runs.append(now[0]), first_run_now=False)
    assert not on_clock()  # the hour current at start is skipped
    for minutes in (10, 15, 20, 30):  # 00:40, 00:55, 01:15, 01:45
        now[0] += timedelta(minutes=minutes)
        on_clock()
    assert runs == [datetime(2020, 3, 1, 1, 15, tzinfo=UTC)]
    now[0] += timedelta(hours=3)  # three hours at once: one run
    assert on_clock() and not on_clock()
    assert len(runs) == 2


def test_the_service_runs_its_job_side_schedules_on_the_simulated_clock_by_default(tmp_path: Path) -> None:
    """``make run``'s defaults: the engine, rebalancer, watcher and reconciler scheduled (no setting needed),
    counted on the simulated clock's driver, polled every ``COSTOPT_SIM_TICK``."""
    from api.scheduler import ENGINE_JOB_ID, REBALANCE_JOB_ID, RECONCILE_JOB_ID, WATCH_JOB_ID, OnServiceClock, Poll
    from api.ticks import Cron

    settings = Settings(database_url=f"sqlite:///{tmp_path / 'svc.db'}", seed_on_start=False, collectors_enabled=False)
    assert settings.provider == "sim" and settings.migration_jobs_enabled
    with TestClient(create_app(settings)) as client:
        app = client.app
        scheduler = app.state.scheduler  # type: ignore[attr-defined]
        driver = app.state.sim_clock  # type: ignore[attr-defined]
        assert driver is not None and driver.running
        jobs = {j.id: j for j in scheduler.get_jobs()}
        assert {ENGINE_JOB_ID, REBALANCE_JOB_ID, RECONCILE_JOB_ID, WATCH_JOB_ID} <= set(jobs)
        for job_id in (ENGINE_JOB_ID, REBALANCE_JOB_ID, RECONCILE_JOB_ID, WATCH_JOB_ID):
            poll = jobs[job_id].func.work  # the leased run's work: a poll of the service-clock wrapper
            assert isinstance(poll, Poll) and jobs[job_id].max_instances == 2, job_id  # a busy poll returns at once
            work = poll.work
            assert isinstance(work, OnServiceClock) and work.now == driver.now, job_id
            assert jobs[job_id].trigger.interval == settings.sim_tick
        assert jobs[REBALANCE_JOB_ID].func.work.work.schedule == Cron(settings.rebalance_cron)
        service = app.state.job_service  # type: ignore[attr-defined]
        assert service.service_clock is driver
        for migrator in service.migrators.values():
            assert migrator.now == driver.now and migrator.sleep == driver.sleep
