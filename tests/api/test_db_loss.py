"""Database loss mid-run (issue 14): the service runs jobs on the simulated cloud against a private
PostgreSQL server of the test's own (:mod:`tests.pg_server`, never the machine's shared one), and that
server is stopped (``pg_ctl stop -m immediate``, as a crash) or has every connection cut
(``pg_terminate_backend``) while the jobs run.

Checked: while the database is away ``/readyz`` answers 503, the REST routes answer 503 ``unavailable``
in the project's error shape with ``Retry-After`` (never 500, never a hang), the scheduled jobs (engine
tick, watcher, reconciler, rebalancer, fleet rounds) log the outage once and keep running; once it is back
every job submitted before finishes with exactly its steps (the agent's audit), a submission refused with
503 and retried with its Idempotency-Key gives exactly one job, and no instance is left running.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from api.app import create_app
from api.planning import reset
from api.ticks import OUTAGE
from api.wiring import seed_catalog
from bench.kill_drill import AWS_SPOT_FILE, BODY, START, TERMINAL  # the drill's jobs and prices
from costopt.agent import control
from costopt.cloud import InstanceState
from costopt.db.engine import CONNECT_TIMEOUT_S, make_engine, migrate
from costopt.jobs.teams import Role
from costopt.settings import Settings
from pricing.importer import import_paths
from pricing.store import PriceStore
from providers.sim import SimCloud
from tests.pg_server import PrivateServer, private_server

STEPS = 12_000  # ~1.3 simulated hours of ResNet-50: ~1.3 s of wall time at 3600x, plus the boot
JOBS = 5


@pytest.fixture(scope="module")
def pg() -> Iterator[PrivateServer]:
    """One private PostgreSQL server for the module (initdb ~1 s); each test has a database of its own."""
    with private_server() as server:
        yield server


def _database(pg: PrivateServer, data: Path) -> str:
    """A new database on ``pg``, migrated, with the instance catalog and the replayed AWS spot prices."""
    url = pg.new_database()
    eng = make_engine(url)
    try:
        migrate(eng)
        store = PriceStore(eng)
        seed_catalog(store, Settings(data_dir=data))
        reports = import_paths(store, [data / "prices" / AWS_SPOT_FILE])
        assert all(r.status not in ("failed", "refused") for r in reports), reports
    finally:
        eng.dispose()
    return url


class Recorder:
    """A TestClient's calls, each answer's status counted and timed."""

    def __init__(self, client: TestClient) -> None:
        self.client = client
        self.statuses: Counter[int] = Counter()
        self.slowest = 0.0

    def call(self, method: str, path: str, **kwargs: Any) -> Any:
        t0 = time.monotonic()
        r = self.client.request(method, path, **kwargs)
        self.slowest = max(self.slowest, time.monotonic() - t0)
        self.statuses[r.status_code] += 1
        assert r.status_code != 500, (method, path, r.text)
        return r


def _assert_unavailable(r: Any) -> None:
    """A 503 in the project's error shape, saying when to retry."""
    assert r.status_code == 503, r.text
    err = r.json()["error"]
    assert err["code"] == "unavailable" and "retry" in err["message"], err
    assert int(r.headers["Retry-After"]) > 0


@pytest.fixture
def service(pg: PrivateServer, shared_data: Path, tmp_path: Path) -> Iterator[tuple[Recorder, Any, str]]:
    if not pg.running():  # a test that failed while its server was down
        pg.start()
    url = _database(pg, shared_data)
    settings = Settings(
        database_url=url,
        data_dir=shared_data,
        availability_logs_dir=tmp_path / "no-logs",
        seed_on_start=False,
        collectors_enabled=False,
        provider="sim",  # the engine, watcher, reconciler, rebalancer and fleet rounds run in the service
        sim_start=START,
        sim_time_scale=3600.0,  # a simulated hour per second
        sim_tick=timedelta(milliseconds=100),
        rebalance_cron="*/15 * * * *",  # a rebalancer pass every 15 simulated minutes: ~4 per wall second
        checkpoint_root=f"file://{tmp_path / 'checkpoints'}",
        db_pool_size=5,
    )
    reset()
    app = create_app(settings)
    with TestClient(app) as client:
        yield Recorder(client), app, url.rsplit("/", 1)[1]
    reset()


def _key(app: Any) -> dict[str, str]:
    teams = app.state.job_service.teams
    team = teams.create_team("drill")
    return {"Authorization": f"Bearer {teams.create_key(team.id, Role.MEMBER).secret}"}


def _submit(rec: Recorder, headers: dict[str, str], n: int) -> list[str]:
    ids = []
    for i in range(n):
        r = rec.call("POST", "/v1/jobs", json={**BODY, "name": f"j{i}", "steps": STEPS}, headers=headers)
        assert r.status_code == 201, r.text
        ids.append(r.json()["id"])
    return ids


def _wait_running(rec: Recorder, headers: dict[str, str], ids: list[str]) -> None:
    """Until a job runs (its instance booted): the outage then cuts a run in the middle."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if any(rec.call("GET", f"/v1/jobs/{i}", headers=headers).json()["state"] == "running" for i in ids):
            return
        time.sleep(0.05)
    pytest.fail("no job started running within 30 s")


def _stacks() -> dict[str, list[str]]:
    """Each live thread's innermost frames (file:line function), for a failure's message: a worker that hangs."""
    import sys
    import threading
    import traceback

    names = {t.ident: t.name for t in threading.enumerate()}
    out = {}
    for ident, frame in sys._current_frames().items():
        frames = traceback.extract_stack(frame)[-8:]
        out[names.get(ident, str(ident))] = [f"{Path(f.filename).name}:{f.lineno} {f.name}" for f in frames]
    return out


def _finish(
    rec: Recorder,
    headers: dict[str, str],
    ids: list[str],
    app: Any,
    activity: Callable[[], list[tuple[Any, ...]]] | None = None,
) -> list[dict[str, Any]]:
    """Wait until every job is terminal; check each succeeded with exactly its steps, and no instance runs.
    ``activity``: the database's connections, named with the threads' stacks if the jobs never finish."""
    deadline = time.monotonic() + 90
    while True:
        docs = [rec.call("GET", f"/v1/jobs/{i}", headers=headers).json() for i in ids]
        if all(d["state"] in TERMINAL for d in docs):
            break
        if time.monotonic() > deadline:
            stuck = {  # the events of the jobs not done: what the engine did with them (a failure to read)
                d["id"]: [
                    (e.get("kind"), e.get("to_state"), (e.get("reason") or "")[:160])
                    for e in rec.call("GET", f"/v1/jobs/{d['id']}/events", headers=headers).json().get("items", [])
                ]
                for d in docs
                if d["state"] not in TERMINAL
            }
            waits = activity() if activity is not None else []
            pytest.fail(
                f"the jobs did not finish after the outage: {[(d['id'], d['state']) for d in docs]}; {stuck}; "
                f"database connections {waits}; threads {_stacks()}"
            )
        time.sleep(0.1)
    for d in docs:
        assert d["state"] == "succeeded", (d["id"], d["reason"])
        assert d["steps_done"] == d["steps_total"] == STEPS
        audit = control.audit_job(d["checkpoint_uri"], STEPS)
        assert audit.ok and audit.steps_done == STEPS, (d["id"], audit.problems)
    # nothing lost, nothing doubled: the team's jobs are exactly those submitted
    listed = rec.call("GET", "/v1/jobs", params={"limit": 500}, headers=headers).json()
    assert sorted(j["id"] for j in listed["items"]) == sorted(ids) and listed["total"] == len(ids)
    sim = app.state.providers["sim"]
    assert isinstance(sim, SimCloud)
    alive = [i for i in sim.list({}) if i.state in (InstanceState.PENDING, InstanceState.RUNNING)]
    assert alive == [], alive  # zero orphaned instances
    return docs


def _ready_within(rec: Recorder, seconds: float) -> float:
    t0 = time.monotonic()
    while rec.call("GET", "/readyz").status_code != 200:
        if time.monotonic() - t0 > seconds:
            pytest.fail(f"/readyz not ready {seconds} s after the database came back")
        time.sleep(0.02)
    return time.monotonic() - t0


@pytest.mark.slow  # two runs of the service on the simulated cloud: ~10 s each on a quiet machine
def test_a_database_stopped_mid_run_answers_503_and_the_run_finishes_with_nothing_lost(
    service: tuple[Recorder, Any, str], pg: PrivateServer, caplog: pytest.LogCaptureFixture
) -> None:
    rec, app, _ = service
    headers = _key(app)
    ids = _submit(rec, headers, JOBS)
    _wait_running(rec, headers, ids)
    outages = OUTAGE.outages
    caplog.set_level(logging.WARNING, logger="costopt.scheduler")

    pg.stop("immediate")  # as a crash: no shutdown checkpoint, every connection dropped
    rec.slowest = 0.0  # from here: the answers while the database is away
    r = rec.call("GET", "/readyz")
    assert r.status_code == 503 and r.json()["status"] == "unavailable", r.text
    _assert_unavailable(rec.call("GET", f"/v1/jobs/{ids[0]}", headers=headers))
    _assert_unavailable(rec.call("GET", "/v1/jobs", headers=headers))
    late = {**BODY, "name": "late", "steps": STEPS}
    retry = {**headers, "Idempotency-Key": "late-submission"}
    _assert_unavailable(rec.call("POST", "/v1/jobs", json=late, headers=retry))
    time.sleep(1.0)  # the scheduled jobs fail against the missing database for a while (~10 polls each)
    scheduler = app.state.scheduler
    assert scheduler.running and {j.id for j in scheduler.get_jobs()} >= {"engine", "migration:watch", "fleets"}
    assert OUTAGE.outages > outages and OUTAGE.failed_runs >= 5, (OUTAGE.outages, OUTAGE.failed_runs)
    down = [m.getMessage() for m in caplog.records if m.name == "costopt.scheduler" and "unavailable" in m.getMessage()]
    assert len(down) == 1, down  # one line for the outage, not one traceback per run
    outage_slowest = rec.slowest
    assert outage_slowest < CONNECT_TIMEOUT_S + 5.0  # no request hung on the missing server

    failed_runs = OUTAGE.failed_runs
    pg.start()
    ready_after = _ready_within(rec, 10.0)
    first = rec.call("POST", "/v1/jobs", json=late, headers=retry)
    assert first.status_code == 201, first.text
    again = rec.call("POST", "/v1/jobs", json=late, headers=retry)
    assert again.status_code == 200 and again.json()["id"] == first.json()["id"]
    _finish(rec, headers, [*ids, first.json()["id"]], app)
    deadline = time.monotonic() + 5
    while not any("database reachable again" in m.getMessage() for m in caplog.records):
        assert time.monotonic() < deadline, "the scheduled jobs never said the database was back"
        time.sleep(0.05)
    assert rec.statuses[500] == 0 and rec.statuses[503] >= 4, rec.statuses
    print(  # noqa: T201  # the figures of docs/reliability.md (pytest -s)
        f"\ndb-loss stop: /readyz 200 {ready_after:.3f} s after pg_ctl start returned; scheduled runs failed "
        f"during the 1 s outage {failed_runs}; answers {dict(sorted(rec.statuses.items()))}; "
        f"slowest answer while it was down {outage_slowest:.3f} s"
    )


@pytest.mark.slow
def test_connections_cut_mid_run_answer_503_at_worst_and_the_run_finishes_with_nothing_lost(
    service: tuple[Recorder, Any, str], pg: PrivateServer
) -> None:
    rec, app, database = service
    headers = _key(app)
    ids = _submit(rec, headers, JOBS)
    _wait_running(rec, headers, ids)
    cut = 0
    retried: dict[str, str] = {}
    rec.slowest = 0.0  # from here: the answers while connections are cut
    for round_ in range(6):  # every connection of the service cut six times, with traffic in between
        cut += pg.terminate_backends(database)
        key = {**headers, "Idempotency-Key": f"cut-{round_}"}
        late = {**BODY, "name": f"cut-{round_}", "steps": STEPS}
        for _ in range(3):  # a submission answered 503 is retried with its key; it never makes two jobs
            r = rec.call("POST", "/v1/jobs", json=late, headers=key)
            if r.status_code in (200, 201):
                retried[f"cut-{round_}"] = r.json()["id"]
                break
            _assert_unavailable(r)
        for i in ids[:2]:
            r = rec.call("GET", f"/v1/jobs/{i}", headers=headers)
            if r.status_code != 200:
                _assert_unavailable(r)
        time.sleep(0.2)
    assert cut >= 6  # the service's pooled connections, each round
    assert len(retried) == 6, retried
    cut_slowest = rec.slowest
    assert cut_slowest < CONNECT_TIMEOUT_S + 5.0
    assert _ready_within(rec, 10.0) < 10.0
    _finish(rec, headers, [*ids, *retried.values()], app, lambda: pg.activity(database))
    assert rec.statuses[500] == 0, rec.statuses
    print(  # noqa: T201
        f"\ndb-loss cut: {cut} connections cut in 6 rounds; answers {dict(sorted(rec.statuses.items()))}; "
        f"slowest answer while cutting {cut_slowest:.3f} s"
    )


# -- the pieces, without a server -------------------------------------------------------------------


def _operational() -> Exception:
    import psycopg
    from sqlalchemy.exc import OperationalError

    return OperationalError("SELECT 1", {}, psycopg.OperationalError("connection refused"))


def test_only_errors_worth_retrying_count_as_the_database_being_unavailable() -> None:
    import sqlite3

    from sqlalchemy.exc import IntegrityError, OperationalError, ProgrammingError

    from costopt.db.engine import db_unavailable
    from costopt.errors import StoreError

    assert db_unavailable(_operational())
    try:
        raise StoreError("database unreachable") from _operational()
    except StoreError as exc:
        assert db_unavailable(exc)
    assert not db_unavailable(IntegrityError("INSERT", {}, Exception("duplicate key")))
    assert not db_unavailable(ProgrammingError("SELECT", {}, Exception("syntax error")))
    assert not db_unavailable(StoreError("unsupported database 'mysql'"))
    assert not db_unavailable(ValueError("no"))
    # SQLite names a missing table an operational error too: only a locked or unopenable file is transient
    locked = OperationalError("UPDATE jobs", {}, sqlite3.OperationalError("database is locked"))
    assert db_unavailable(locked)
    assert not db_unavailable(OperationalError("SELECT", {}, sqlite3.OperationalError("no such table: jobs")))


def test_a_route_whose_database_is_unavailable_answers_503_and_any_other_database_error_500() -> None:
    from fastapi import FastAPI
    from sqlalchemy.exc import IntegrityError

    from api.errors import install_error_handlers

    app = FastAPI()
    install_error_handlers(app)

    @app.get("/down")
    def down() -> None:
        raise _operational()

    @app.get("/bug")
    def bug() -> None:
        raise IntegrityError("INSERT", {}, Exception("duplicate key"))

    with TestClient(app, raise_server_exceptions=False) as client:
        _assert_unavailable(client.get("/down"))
        r = client.get("/bug")
        assert r.status_code == 500 and r.json()["error"]["code"] == "internal_error"


def test_an_outage_is_logged_once_and_ends_at_the_first_run_started_after_its_last_failure(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from api.ticks import DatabaseOutage

    now = [100.0]
    outage = DatabaseOutage(clock=lambda: now[0])
    caplog.set_level(logging.DEBUG, logger="costopt.scheduler")
    outage.succeeded("engine", started=99.0)  # no outage: nothing to say
    for name in ("engine", "migration:watch", "engine"):
        outage.failed(name, _operational())
        now[0] += 1.0
    outage.succeeded("fleets", started=101.5)  # began before the latest failure (at 102): proves nothing
    assert outage.since == 100.0 and outage.failed_runs == 3
    outage.succeeded("engine", started=102.5)
    assert outage.since is None and outage.outages == 1
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2, warnings
    assert "engine: database unavailable" in warnings[0] and "connection refused" in warnings[0]
    assert "reachable again after 3.0 s (3 scheduled runs failed" in warnings[1]


def test_a_run_on_the_service_clock_that_failed_is_retried_at_the_next_poll() -> None:
    from api.scheduler import OnServiceClock
    from api.ticks import Every

    now = [datetime(2020, 3, 1, 0, 0, 1, tzinfo=UTC)]
    calls: list[datetime] = []

    def work() -> None:
        calls.append(now[0])
        if len(calls) == 1:
            raise _operational()

    on_clock = OnServiceClock(Every(timedelta(hours=1)), lambda: now[0], work)
    with pytest.raises(Exception, match="connection refused"):
        on_clock()
    now[0] += timedelta(seconds=1)  # the same hour: its tick was not run, so it runs now
    assert on_clock() and not on_clock()
    assert len(calls) == 2
