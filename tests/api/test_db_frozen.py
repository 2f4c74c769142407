"""A frozen database server is bounded on the client (issue 14): a PostgreSQL server whose processes are
stopped (``SIGSTOP``: its kernel still accepts connections and acknowledges what it is sent, its own
timers never fire, so ``statement_timeout`` cannot cancel anything) must not hang requests or scheduled
jobs. ``COSTOPT_DB_ANSWER_TIMEOUT_S`` bounds each wait for the server's answer (:mod:`costopt.db.answers`)
and libpq's ``connect_timeout`` bounds a new connection.

The server is a private one the test starts itself (:mod:`tests.pg_server`), never the machine's shared
server. Every call that could hang runs in a thread joined with a guard far above the bound, so without
the bound the test fails ("no answer within ...") instead of hanging; checked with
``db_answer_timeout_s=0``.
"""

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
from sqlalchemy import text

from api.scheduler import engine_job
from api.ticks import OUTAGE, Every, LeasedRun
from api.wiring import build_engine
from costopt.db.answers import BoundedConnection
from costopt.db.engine import db_timeout, db_unavailable, make_engine, migrate
from costopt.settings import Settings
from tests.api.jobs_helpers import error_of, service
from tests.pg_server import PrivateServer, private_server

STATEMENT_S = 1.0
ANSWER_S = 2.0
"""The client-side answer bound of the test's service (the default would be STATEMENT_S + 5)."""
CONNECT_S = 1
"""libpq's connect_timeout in the test's URL (the service's default is 5 s)."""
WITHIN_S = ANSWER_S + CONNECT_S + 4.0
"""The slowest answer accepted while frozen: a pooled connection's ping (ANSWER_S), a new connection
(CONNECT_S), and slack for a loaded machine."""
HANG_GUARD_S = 45.0


@pytest.fixture(scope="module")
def pg() -> Iterator[PrivateServer]:
    with private_server() as server:
        yield server


_CALLS: list[threading.Thread] = []
"""The threads of :func:`_bounded_call`: a call the guard gave up on is joined once the server is thawed
(:func:`_thaw`), so that the service shuts down cleanly after the test failed."""


def _thaw(pg: PrivateServer) -> None:
    pg.thaw()
    for thread in _CALLS:
        thread.join(HANG_GUARD_S)
    _CALLS.clear()


def _bounded_call(work: Any) -> tuple[Any, float]:
    """``work()`` in a thread, waited for at most :data:`HANG_GUARD_S`: its result and wall seconds."""
    out: list[Any] = []

    def run() -> None:
        try:
            out.append(work())
        except Exception as exc:  # handed to the test
            out.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    _CALLS.append(thread)
    began = time.monotonic()
    thread.start()
    thread.join(HANG_GUARD_S)
    assert not thread.is_alive() and out, f"no answer within {HANG_GUARD_S} s: the call hung on the frozen server"
    return out[0], time.monotonic() - began


def _settings(url: str, **kw: Any) -> Settings:
    return Settings(
        database_url=f"{url}?connect_timeout={CONNECT_S}",
        db_statement_timeout_s=STATEMENT_S,
        db_answer_timeout_s=ANSWER_S,
        db_pool_size=3,
        **kw,
    )


@pytest.mark.postgres
def test_a_query_in_flight_on_a_frozen_server_fails_within_the_bound_and_closes_its_connection(
    pg: PrivateServer,
) -> None:
    engine = build_engine(_settings(pg.url()))
    try:
        with engine.connect() as conn:
            dbapi = conn.connection.dbapi_connection
            assert isinstance(dbapi, BoundedConnection) and dbapi.answer_timeout_s == ANSWER_S
            params = dbapi.info.get_parameters()
            assert params["tcp_user_timeout"] == "2000" and params["keepalives_idle"] == "1", params
            conn.execute(text("SELECT 1"))
            pg.freeze()
            try:
                err, took = _bounded_call(lambda: conn.execute(text("SELECT 1")))
            finally:
                _thaw(pg)
            assert isinstance(err, Exception), err
            assert db_unavailable(err) and db_timeout(err) == "no answer", repr(err)
            assert ANSWER_S - 0.1 <= took < ANSWER_S + 4.0, took
            assert dbapi.closed  # its protocol state is unknown: never reused
        with engine.connect() as conn:  # the pool replaced it
            assert conn.execute(text("SELECT 1")).scalar() == 1
    finally:
        engine.dispose()


@pytest.mark.postgres
@pytest.mark.slow  # 14-15 s, mostly waiting on the bounds (load 1 and 15); kept in `make test`
def test_a_frozen_server_answers_503_within_the_bound_readyz_unready_then_recovers(
    pg: PrivateServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    url = pg.new_database()
    plain = make_engine(url)
    migrate(plain)
    plain.dispose()
    engine = build_engine(_settings(url))
    bounds = {"db_statement_timeout_s": STATEMENT_S, "db_answer_timeout_s": ANSWER_S, "db_pool_size": 3}
    try:
        for svc in service(engine, tmp_path, **bounds):
            job = svc.submit(svc.alpha)
            run = LeasedRun("engine", Every(timedelta(seconds=5)), engine_job, (svc.app.state.job_service.engine.tick,))
            assert _bounded_call(run)[0] is True
            get_jobs = functools.partial(svc.client.get, "/v1/jobs", headers=svc.alpha)
            assert get_jobs().status_code == 200
            caplog.set_level(logging.WARNING)
            outages = OUTAGE.outages
            pg.freeze()
            try:
                resp, took = _bounded_call(get_jobs)
                error_of(resp, 503, "unavailable")
                assert resp.headers["Retry-After"] == "5" and took < WITHIN_S, took
                ready, took_ready = _bounded_call(functools.partial(svc.client.get, "/readyz"))
                assert ready.status_code == 503 and ready.json()["status"] == "unavailable", ready.text
                assert took_ready < WITHIN_S, took_ready
                ran, took_run = _bounded_call(run)  # a scheduled job: fails within the bound, retried next tick
                assert ran is False and took_run < WITHIN_S, (ran, took_run)
            finally:
                _thaw(pg)
            ready, _ = _bounded_call(functools.partial(svc.client.get, "/readyz"))
            assert ready.status_code == 200, ready.text
            resp, _ = _bounded_call(get_jobs)
            assert resp.status_code == 200 and [j["id"] for j in resp.json()["items"]] == [job["id"]], resp.text
            assert _bounded_call(run)[0] is True and OUTAGE.since is None and OUTAGE.outages == outages + 1
            logged = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
            # "unavailable" when a ping on checkout met the frozen server, "query timed out" when the query did
            # (a connection back from a use within the last second is handed out without a ping)
            assert any(
                m.startswith(("database unavailable on GET /v1/jobs", "database query timed out on GET /v1/jobs"))
                and "did not answer within" in m
                for m in logged
            ), logged
    finally:
        engine.dispose()
