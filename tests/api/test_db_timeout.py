"""A hung database is bounded: ``COSTOPT_DB_STATEMENT_TIMEOUT_S`` sets PostgreSQL's ``statement_timeout``
and ``lock_timeout`` (and SQLite's busy timeout) on the service's connections; a request whose query the
database cancels answers 503 in the one error shape, saying what happened, and a scheduled job logs one
line and runs again at its next tick. The PostgreSQL test holds ``LOCK TABLE jobs`` from a second
connection; its own waits are bounded (a thread joined with a timeout), so without the bound it fails
instead of hanging."""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.exc import OperationalError

from api.scheduler import engine_job
from api.ticks import OUTAGE, Every, LeasedRun
from api.wiring import build_store
from costopt.db.answers import keepalive_params
from costopt.db.engine import (
    ANSWER_GRACE_S,
    _no_answer_bound,
    answer_bound_s,
    db_timeout,
    db_unavailable,
    make_engine,
)
from costopt.settings import Settings
from tests.api.jobs_helpers import error_of, service
from tests.conftest import PG_ADMIN_URL, migrated_engine

BOUND_S = 1.0
"""The statement bound of the PostgreSQL test (its lock timeout: half of it)."""
HANG_GUARD_S = 60.0
"""How long the test waits for an answer before calling the request hung (far above the bound)."""


def _show(engine: Engine, name: str) -> str:
    with engine.connect() as conn:
        return str(conn.exec_driver_sql(f"SHOW {name}").scalar())


@pytest.mark.postgres
def test_the_setting_bounds_every_postgresql_statement_and_keeps_the_urls_own_options() -> None:
    try:
        store = build_store(Settings(database_url=PG_ADMIN_URL, db_statement_timeout_s=2.5), migrate_schema=False)
        store.engine.connect().close()
    except Exception as exc:  # no server: skipped like the conftest's fixtures
        pytest.skip(f"PostgreSQL not reachable at {PG_ADMIN_URL}: {exc}")
    try:
        assert _show(store.engine, "statement_timeout") == "2500ms"
        assert _show(store.engine, "lock_timeout") == "1250ms"
    finally:
        store.engine.dispose()
    unbounded = make_engine(PG_ADMIN_URL, statement_timeout_s=0)
    assert _show(unbounded, "statement_timeout") == "0" and _show(unbounded, "lock_timeout") == "0"
    unbounded.dispose()
    schema = make_engine(PG_ADMIN_URL, connect_args={"options": "-csearch_path=elsewhere"}, statement_timeout_s=3)
    assert _show(schema, "search_path") == "elsewhere" and _show(schema, "statement_timeout") == "3s"
    schema.dispose()


def test_the_setting_is_sqlites_busy_timeout(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'costopt.db'}"
    store = build_store(Settings(database_url=url, db_statement_timeout_s=2.5), migrate_schema=False)
    with store.engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() == 2500
    store.engine.dispose()
    with make_engine(url, statement_timeout_s=0).connect() as conn:  # no bound: SQLite's longest wait
        assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() == 2_000_000_000
    with pytest.raises(ValueError, match="statement timeout"):
        make_engine(url, statement_timeout_s=float("nan"))


@pytest.fixture
def timed(tmp_path: Path) -> Iterator[tuple[Engine, Engine]]:
    """A migrated PostgreSQL schema: an engine bounded at :data:`BOUND_S` (the service's) and one without
    a bound (the other session, holding the lock)."""
    for plain in migrated_engine("postgres", tmp_path, replay=True):
        with plain.connect() as conn:
            schema = conn.exec_driver_sql("SELECT current_schema()").scalar()
        bounded = make_engine(
            PG_ADMIN_URL, connect_args={"options": f"-csearch_path={schema}"}, statement_timeout_s=BOUND_S
        )
        try:
            yield bounded, plain
        finally:
            bounded.dispose()


def _bounded_call(work: Any) -> tuple[Any, float]:
    """``work()`` in a thread, waited for at most :data:`HANG_GUARD_S`: its result and wall seconds; fails
    the test (instead of hanging it) when it does not return."""
    out: list[Any] = []
    thread = threading.Thread(target=lambda: out.append(work()), daemon=True)
    began = time.monotonic()
    thread.start()
    thread.join(HANG_GUARD_S)
    assert not thread.is_alive() and out, f"no answer within {HANG_GUARD_S} s: the query hung behind the lock"
    return out[0], time.monotonic() - began


@pytest.mark.postgres
def test_a_request_stuck_behind_a_lock_answers_503_saying_so_then_200_once_released(
    timed: tuple[Engine, Engine], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    bounded, plain = timed
    for svc in service(bounded, tmp_path, db_statement_timeout_s=BOUND_S):
        job = svc.submit(svc.alpha)
        caplog.set_level(logging.WARNING)
        with plain.connect() as holder:
            holder.begin()
            holder.execute(text("LOCK TABLE jobs IN ACCESS EXCLUSIVE MODE"))  # held until the rollback
            resp, _took = _bounded_call(functools.partial(svc.client.get, "/v1/jobs", headers=svc.alpha))
            err = error_of(resp, 503, "unavailable")
            assert resp.headers["Retry-After"] == "5"
            assert "lock held by another session" in err["message"], err
            assert "COSTOPT_DB_STATEMENT_TIMEOUT_S" in err["message"], err
            holder.rollback()
        resp = svc.client.get("/v1/jobs", headers=svc.alpha)
        assert resp.status_code == 200, resp.text
        assert [j["id"] for j in resp.json()["items"]] == [job["id"]]
        timed_out = [r.getMessage() for r in caplog.records if "timed out" in r.getMessage()]
        assert len(timed_out) == 1 and "lock timeout" in timed_out[0], timed_out


@pytest.mark.postgres
def test_a_scheduled_run_stuck_behind_a_lock_logs_one_line_and_runs_at_its_next_tick(
    timed: tuple[Engine, Engine], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    bounded, plain = timed
    for svc in service(bounded, tmp_path, db_statement_timeout_s=BOUND_S):
        svc.submit(svc.alpha)
        run = LeasedRun("engine", Every(timedelta(seconds=5)), engine_job, (svc.app.state.job_service.engine.tick,))
        caplog.set_level(logging.DEBUG, logger="costopt.scheduler")
        outages = OUTAGE.outages
        with plain.connect() as holder:
            holder.begin()
            holder.execute(text("LOCK TABLE jobs IN ACCESS EXCLUSIVE MODE"))
            for _ in range(2):
                ran, _took = _bounded_call(run)
                assert ran is False  # failed: the next tick retries
            holder.rollback()
        ran, _took = _bounded_call(run)
        assert ran is True and OUTAGE.since is None and OUTAGE.outages == outages + 1
        lines = [r for r in caplog.records if r.name == "costopt.scheduler" and r.levelno >= logging.WARNING]
        assert len(lines) == 2, [r.getMessage() for r in lines]
        assert "engine: database unavailable" in lines[0].getMessage()
        assert "lock timeout" in lines[0].getMessage() and not lines[0].exc_info
        assert "reachable again" in lines[1].getMessage()


def test_what_timed_out_is_told_from_the_drivers_errors() -> None:
    import sqlite3

    import psycopg
    from sqlalchemy.exc import OperationalError

    def wrapped(err: Exception) -> OperationalError:
        return OperationalError("SELECT", {}, err)

    lock = wrapped(psycopg.errors.LockNotAvailable("canceling statement due to lock timeout"))
    statement = wrapped(psycopg.errors.QueryCanceled("canceling statement due to statement timeout"))
    operator = wrapped(psycopg.errors.QueryCanceled("canceling statement due to user request"))
    busy = wrapped(sqlite3.OperationalError("database is locked"))
    for exc, what in [(lock, "lock timeout"), (statement, "statement timeout"), (operator, "cancelled")]:
        assert db_unavailable(exc) and db_timeout(exc) == what
    assert db_timeout(busy) == "busy timeout"
    assert db_timeout(wrapped(psycopg.OperationalError("connection refused"))) is None


def test_the_answer_bound_is_the_statement_bound_plus_a_grace_unless_set() -> None:
    assert answer_bound_s(30.0) == 30.0 + ANSWER_GRACE_S
    assert answer_bound_s(30.0, 2.0) == 2.0
    assert answer_bound_s(0.0) is None and answer_bound_s(None) is None  # no statement bound: none
    assert answer_bound_s(30.0, 0.0) is None  # 0: no bound
    assert keepalive_params(7.5) == {
        "keepalives": 1,
        "keepalives_idle": 4,
        "keepalives_interval": 2,
        "keepalives_count": 3,
        "tcp_user_timeout": 7500,
    }
    with pytest.raises(ValueError, match="answer timeout"):
        make_engine(PG_ADMIN_URL, answer_timeout_s=-1)


@pytest.mark.postgres
def test_a_migration_lifts_the_answer_bound_for_its_own_transaction() -> None:
    engine = make_engine(PG_ADMIN_URL, answer_timeout_s=0.3)
    try:
        with engine.connect() as conn:
            conn.exec_driver_sql("SELECT 1")
    except Exception as exc:
        engine.dispose()
        pytest.skip(f"PostgreSQL not reachable at {PG_ADMIN_URL}: {exc}")
    try:
        with engine.connect() as conn, _no_answer_bound(conn):  # as migrate() runs its upgrade
            conn.exec_driver_sql("SELECT pg_sleep(0.6)")
        with engine.connect() as conn, pytest.raises(OperationalError) as raised:
            conn.exec_driver_sql("SELECT pg_sleep(0.6)")  # the bound is back once the block is left
        assert db_timeout(raised.value) == "no answer" and "0.3 s" in str(raised.value)
    finally:
        engine.dispose()


def _built_engines(monkeypatch: pytest.MonkeyPatch) -> list[Engine]:
    """Every engine api.wiring builds from now on (the CLI's one-shot commands go through it)."""
    import api.wiring

    built: list[Engine] = []

    def spy(*args: Any, **kwargs: Any) -> Engine:
        built.append(make_engine(*args, **kwargs))
        return built[-1]

    monkeypatch.setattr(api.wiring, "make_engine", spy)
    return built


def test_the_clis_db_and_local_admin_engines_have_the_statement_bound(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from typer.testing import CliRunner

    from api.cli.main import app
    from costopt.settings import get_settings

    monkeypatch.setenv("COSTOPT_DATABASE_URL", f"sqlite:///{tmp_path / 'c.db'}")
    monkeypatch.setenv("COSTOPT_DB_STATEMENT_TIMEOUT_S", "2.5")
    get_settings.cache_clear()
    built = _built_engines(monkeypatch)
    try:
        for args in (["db", "migrate"], ["db", "status"], ["admin", "create-team", "vision", "--local"]):
            result = CliRunner().invoke(app, args)
            assert result.exit_code == 0, (args, result.output)
            assert len(built) == 1, args
            with built.pop().connect() as conn:  # SQLite's busy timeout is the statement bound
                assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() == 2500, args
    finally:
        get_settings.cache_clear()


@pytest.mark.postgres
def test_the_clis_db_status_engine_has_both_bounds_on_postgresql(monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from api.cli.main import app
    from costopt.db.answers import BoundedConnection
    from costopt.settings import get_settings

    monkeypatch.setenv("COSTOPT_DATABASE_URL", PG_ADMIN_URL)
    monkeypatch.setenv("COSTOPT_DB_STATEMENT_TIMEOUT_S", "2.5")
    get_settings.cache_clear()
    built = _built_engines(monkeypatch)
    try:
        CliRunner().invoke(app, ["db", "status"])  # read only; its exit code says whether public is migrated
        assert len(built) == 1
        try:
            with built[0].connect() as conn:
                dbapi = conn.connection.dbapi_connection
                assert isinstance(dbapi, BoundedConnection) and dbapi.answer_timeout_s == 2.5 + ANSWER_GRACE_S
                assert conn.exec_driver_sql("SHOW statement_timeout").scalar() == "2500ms"
        except OperationalError as exc:
            pytest.skip(f"PostgreSQL not reachable at {PG_ADMIN_URL}: {exc}")
        finally:
            built[0].dispose()
    finally:
        get_settings.cache_clear()
