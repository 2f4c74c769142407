"""Engines and migrations for the two supported backends (SQLite embedded default, PostgreSQL)."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine, create_engine, event

from costopt.errors import StoreError

MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"
CONNECT_TIMEOUT_S = 5
"""Seconds a new PostgreSQL connection may take before it fails (libpq's ``connect_timeout``)."""


def make_engine(url: str, **kwargs: Any) -> Engine:
    """Create an engine for ``url``. SQLite gets WAL, foreign keys and a busy timeout; its parent
    folder is created. ``postgresql://`` URLs are routed to psycopg 3."""
    if url.startswith("postgresql://") or url.startswith("postgres://"):
        url = "postgresql+psycopg://" + url.split("://", 1)[1]
    if url.startswith("sqlite"):
        path = url.split("///", 1)[1] if "///" in url else ""
        if path and path != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(url, connect_args={"timeout": 30}, **kwargs)

        @event.listens_for(engine, "connect")
        def _pragmas(dbapi_conn: Any, _record: Any) -> None:
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.close()

        return engine
    # pool_pre_ping: a pooled connection the server dropped (a restart, pg_terminate_backend) is replaced on
    # checkout instead of failing the request that drew it; connect_timeout: an unreachable server fails a
    # connection attempt within CONNECT_TIMEOUT_S instead of the TCP default (minutes). A URL's own
    # ``?connect_timeout=`` wins.
    connect_args = dict(kwargs.pop("connect_args", None) or {})
    if "connect_timeout=" not in url:
        connect_args.setdefault("connect_timeout", CONNECT_TIMEOUT_S)
    return create_engine(url, pool_pre_ping=True, connect_args=connect_args, **kwargs)


def db_unavailable(exc: BaseException) -> bool:
    """True when ``exc`` (or an exception it was raised from) says the database cannot serve right now:
    the server is down or restarting, the connection was cut or timed out, the pool is exhausted, a lock
    or serialization conflict (SQLAlchemy's ``OperationalError`` and ``InterfaceError``, a DBAPI error that
    invalidated its connection, ``DisconnectionError``, the pool's ``TimeoutError``, psycopg's operational
    and interface errors; on SQLite only a locked, busy or unopenable file or an I/O error: SQLite reports
    a missing table or a syntax error as an operational error too). Such a failure is worth retrying; an
    integrity or programming error is not."""
    import psycopg
    from sqlalchemy import exc as sa_exc

    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if isinstance(cur, sa_exc.DBAPIError):
            if cur.connection_invalidated:
                return True
            if isinstance(cur.orig, sqlite3.Error):
                return _sqlite_transient(cur.orig)
            if isinstance(cur, sa_exc.OperationalError | sa_exc.InterfaceError):
                return True
        elif isinstance(cur, sqlite3.Error):
            return _sqlite_transient(cur)
        elif isinstance(
            cur, sa_exc.DisconnectionError | sa_exc.TimeoutError | psycopg.OperationalError | psycopg.InterfaceError
        ):
            return True
        cur = cur.__cause__ or cur.__context__
    return False


_SQLITE_TRANSIENT = ("locked", "busy", "unable to open", "disk i/o")


def _sqlite_transient(exc: BaseException) -> bool:
    return isinstance(exc, sqlite3.OperationalError) and any(m in str(exc).lower() for m in _SQLITE_TRANSIENT)


def _alembic_config() -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    return cfg


def migrate(engine: Engine, revision: str = "head") -> None:
    """Bring the database schema up to ``revision`` (idempotent)."""
    cfg = _alembic_config()
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, revision)


def head_revision() -> str | None:
    """The newest migration shipped with this code."""
    return ScriptDirectory.from_config(_alembic_config()).get_current_head()


def current_revision(engine: Engine) -> str | None:
    """The schema revision the database is at (None: never migrated). Raises StoreError when
    the database cannot be reached."""
    try:
        with engine.connect() as conn:
            return MigrationContext.configure(conn).get_current_revision()
    except Exception as exc:  # any driver error means "not reachable"
        raise StoreError(f"database unreachable at {engine.url.render_as_string()}: {exc}") from exc


def is_migrated(engine: Engine) -> bool:
    """True when the database is reachable and at the head revision."""
    return current_revision(engine) == head_revision()
