"""PostgreSQL engines ping a pooled connection on checkout only when it sat idle (costopt/db/engine.py,
``PING_IDLE_S``): a busy pool pays no round trip per checkout, and a connection the server dropped
while idle is replaced without failing its request. Each test terminates only its own engine's backend."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from sqlalchemy import Engine, exc, text

from costopt.db import engine as engine_module
from costopt.db.engine import make_engine
from tests.conftest import PG_ADMIN_URL, _pg_available


@pytest.fixture
def pg() -> Iterator[Engine]:
    if not _pg_available():
        pytest.skip(f"PostgreSQL not reachable at {PG_ADMIN_URL}")
    eng = make_engine(PG_ADMIN_URL, pool_size=1, max_overflow=0)
    try:
        yield eng
    finally:
        eng.dispose()


@pytest.fixture
def pings(pg: Engine, monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Every ping the engine's dialect makes, recorded (and still made)."""
    made: list[Any] = []
    real = pg.dialect.do_ping

    def counted(dbapi_conn: Any) -> bool:
        made.append(dbapi_conn)
        return real(dbapi_conn)

    monkeypatch.setattr(pg.dialect, "do_ping", counted)
    return made


def _backend(eng: Engine) -> int:
    with eng.connect() as conn:
        return int(conn.execute(text("SELECT pg_backend_pid()")).scalar_one())


def _terminate(pid: int) -> None:
    admin = make_engine(PG_ADMIN_URL)
    try:
        with admin.connect() as conn:
            assert conn.execute(text("SELECT pg_terminate_backend(:p)"), {"p": pid}).scalar_one()
    finally:
        admin.dispose()


def test_a_connection_back_from_a_recent_use_is_handed_out_without_a_ping(pg: Engine, pings: list[Any]) -> None:
    pid = _backend(pg)  # a new connection: no ping
    for _ in range(20):
        assert _backend(pg) == pid
    assert pings == []


def test_a_connection_idle_past_the_bound_is_pinged_once_then_reused(
    pg: Engine, pings: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    pid = _backend(pg)
    monkeypatch.setattr(engine_module, "PING_IDLE_S", 0.0)  # every connection counts as idle
    assert _backend(pg) == pid
    assert len(pings) == 1
    raw = pg.raw_connection()  # pinged on this checkout too: it leaves no transaction open
    try:
        assert len(pings) == 2
        driver = raw.driver_connection
        assert driver is not None
        assert driver.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
        assert driver.autocommit is False  # as SQLAlchemy gave it
    finally:
        raw.close()


def test_a_connection_dropped_while_idle_is_replaced_without_failing_its_user(
    pg: Engine, pings: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    pid = _backend(pg)
    _terminate(pid)
    monkeypatch.setattr(engine_module, "PING_IDLE_S", 0.0)
    assert _backend(pg) != pid  # the ping found it gone: a new connection, no error
    assert len(pings) == 1


def test_a_connection_dropped_within_the_bound_fails_once_then_the_pool_recovers(pg: Engine, pings: list[Any]) -> None:
    pid = _backend(pg)
    _terminate(pid)
    with pytest.raises(exc.OperationalError):  # used again at once: not pinged, its statement fails
        _backend(pg)
    assert _backend(pg) != pid  # then a new connection serves
    assert pings == []
