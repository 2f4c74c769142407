"""Engines and migrations for the two supported backends (SQLite embedded default, PostgreSQL)."""

from __future__ import annotations

import contextlib
import functools
import math
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, Engine, create_engine, event, make_url
from sqlalchemy.exc import DisconnectionError

from costopt.errors import StoreError

MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"
CONNECT_TIMEOUT_S = 5
"""Seconds a new PostgreSQL connection may take before it fails (libpq's ``connect_timeout``)."""
SQLITE_BUSY_TIMEOUT_S = 30.0
"""Seconds a SQLite statement waits for another connection's write lock when no bound is given."""
ANSWER_GRACE_S = 5.0
"""Seconds past the statement bound a PostgreSQL connection waits for the server's answer before it gives
up on its own (the client-side bound of :mod:`costopt.db.answers`: a frozen server never cancels)."""
_SQLITE_BUSY_MAX_S = 2_000_000.0
"""The longest busy timeout SQLite takes (a C int of milliseconds): "no bound" (``statement_timeout_s=0``)."""


def make_engine(
    url: str, *, statement_timeout_s: float | None = None, answer_timeout_s: float | None = None, **kwargs: Any
) -> Engine:
    """Create an engine for ``url``. SQLite gets WAL, foreign keys and a busy timeout; its parent
    folder is created. ``postgresql://`` URLs are routed to psycopg 3.

    ``statement_timeout_s`` bounds how long one statement may wait for the database (None: the defaults
    below; 0: no bound): on PostgreSQL the session's ``statement_timeout`` (the server cancels a statement
    running longer: a stalled server, a query stuck behind another session's lock) and ``lock_timeout``
    at half of it (a wait for a lock fails first, with a message naming the lock), through libpq's startup
    ``options`` (merged with the URL's or ``connect_args``'s own; a ``statement_timeout`` given there
    wins); on SQLite the busy timeout (how long a statement waits for another connection's write lock;
    None: :data:`SQLITE_BUSY_TIMEOUT_S`). Either way the failure is an operational error, which
    :func:`db_unavailable` counts as the database being unavailable (503, retried at the next tick).

    ``answer_timeout_s`` (PostgreSQL only) bounds, on the client, how long a connection waits for the
    server's answer to anything (a query, a commit, the pool's ping; :mod:`costopt.db.answers`): a frozen
    server or a network path that drops packets never cancels a statement. None: the statement bound plus
    :data:`ANSWER_GRACE_S` (no bound without a statement bound); 0: no bound. With a bound, libpq's TCP
    keepalives and ``tcp_user_timeout`` are derived from it too (a URL's own parameters win)."""
    for name, value in (("statement", statement_timeout_s), ("answer", answer_timeout_s)):
        if value is not None and not (value >= 0 and math.isfinite(value)):
            raise ValueError(f"a {name} timeout is a finite number of seconds >= 0 (0: none), got {value}")
    if url.startswith("postgresql://") or url.startswith("postgres://"):
        url = "postgresql+psycopg://" + url.split("://", 1)[1]
    if url.startswith("sqlite"):
        path = url.split("///", 1)[1] if "///" in url else ""
        if path and path != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        busy = SQLITE_BUSY_TIMEOUT_S if statement_timeout_s is None else statement_timeout_s or _SQLITE_BUSY_MAX_S
        engine = create_engine(url, connect_args={"timeout": min(busy, _SQLITE_BUSY_MAX_S)}, **kwargs)

        @event.listens_for(engine, "connect")
        def _pragmas(dbapi_conn: Any, _record: Any) -> None:
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.close()

        return engine
    # _ping_when_idle: a pooled connection the server dropped while it was idle (a restart,
    # pg_terminate_backend) is replaced on checkout instead of failing the request that drew it;
    # connect_timeout: an unreachable server fails a connection attempt within CONNECT_TIMEOUT_S instead of
    # the TCP default (minutes). A URL's own ``?connect_timeout=`` wins.
    connect_args = dict(kwargs.pop("connect_args", None) or {})
    if "connect_timeout=" not in url:
        connect_args.setdefault("connect_timeout", CONNECT_TIMEOUT_S)
    if statement_timeout_s:
        options = str(connect_args.get("options", make_url(url).query.get("options", "")) or "")
        if "statement_timeout" not in options:
            connect_args["options"] = f"{options} {pg_timeout_options(statement_timeout_s)}".strip()
    answer = answer_bound_s(statement_timeout_s, answer_timeout_s)
    if not answer:
        return _ping_when_idle(create_engine(url, connect_args=connect_args, **kwargs))
    from costopt.db.answers import connect_bounded, keepalive_params

    own = make_url(url).query
    for key, value in keepalive_params(answer).items():
        if key not in own:
            connect_args.setdefault(key, value)
    engine = _ping_when_idle(create_engine(url, connect_args=connect_args, **kwargs))

    @event.listens_for(engine, "do_connect")
    def _bounded(_dialect: Any, _record: Any, cargs: Any, cparams: Any) -> Any:
        return connect_bounded(answer, *cargs, **cparams)

    return engine


PING_IDLE_S = 1.0
"""Seconds a pooled PostgreSQL connection may sit in the pool and still be handed out without a ping."""
_RETURNED = "costopt_returned_at"


def _ping_when_idle(engine: Engine) -> Engine:
    """Ping (the dialect's own ``SELECT 1``) a pooled connection on checkout only when it sat in the pool
    longer than :data:`PING_IDLE_S`, instead of SQLAlchemy's ``pool_pre_ping`` on every checkout: a busy service reuses
    its connections within milliseconds and would pay one more round trip per request (every REST read and
    submission) for a check that only an idle connection needs. A ping that finds the connection dropped
    (a restart, a terminated backend) makes the pool discard it and draw another; any other failure (the
    client-side answer bound of a frozen server) propagates as the request's error. A connection dropped
    within the last second fails the statement that uses it: an operational error, answered 503 (retried
    by a scheduled job at its next tick), after which SQLAlchemy replaces the pool's older connections."""

    import psycopg

    from costopt.db.answers import NoAnswer

    @event.listens_for(engine, "checkin")
    def _returned(_dbapi_conn: Any, record: Any) -> None:
        if record is not None:
            record.info[_RETURNED] = time.monotonic()

    @event.listens_for(engine, "checkout")
    def _checkout(dbapi_conn: Any, record: Any, _proxy: Any) -> None:
        returned = record.info.get(_RETURNED)  # none for a connection just made (a reconnect clears info)
        if returned is None or time.monotonic() - returned < PING_IDLE_S:
            return
        try:
            engine.dialect.do_ping(dbapi_conn)  # SELECT 1 outside a transaction (autocommit for its length)
        except NoAnswer:  # a frozen server: this request's error (503), no other connection tried
            raise
        except psycopg.OperationalError as exc:  # the connection is gone: the pool draws another
            raise DisconnectionError(f"a pooled connection was dropped while idle: {exc}") from exc

    return engine


def answer_bound_s(statement_timeout_s: float | None, answer_timeout_s: float | None = None) -> float | None:
    """The client-side answer bound :func:`make_engine` gives a PostgreSQL connection (None: none):
    ``answer_timeout_s`` when given (0: none), else the statement bound plus :data:`ANSWER_GRACE_S`."""
    if answer_timeout_s is not None:
        return answer_timeout_s or None
    return statement_timeout_s + ANSWER_GRACE_S if statement_timeout_s else None


def pg_timeout_options(statement_timeout_s: float) -> str:
    """libpq startup ``options`` setting a session's ``statement_timeout`` to ``statement_timeout_s`` and
    its ``lock_timeout`` to half of it (whole milliseconds, at least 1 each; see :func:`make_engine`)."""
    ms = max(1, round(statement_timeout_s * 1000))
    return f"-c statement_timeout={ms} -c lock_timeout={max(1, ms // 2)}"


def db_timeout(exc: BaseException) -> str | None:
    """What timed out, when ``exc`` (or an exception it was raised from) is a statement the database
    cancelled on a time bound: ``"statement timeout"`` or ``"lock timeout"`` (PostgreSQL's
    ``statement_timeout`` / ``lock_timeout``, or a cancel from outside: ``"cancelled"``), ``"busy
    timeout"`` (SQLite: the file stayed locked by another connection), ``"no answer"`` (the client-side
    answer bound: the server never answered, :mod:`costopt.db.answers`); None otherwise."""
    import psycopg

    from costopt.db.answers import NoAnswer

    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        orig = getattr(cur, "orig", None)
        for err in (cur, orig):
            if isinstance(err, NoAnswer):
                return "no answer"
            if isinstance(err, psycopg.errors.LockNotAvailable):
                return "lock timeout"
            if isinstance(err, psycopg.errors.QueryCanceled):
                return "statement timeout" if "statement timeout" in str(err) else "cancelled"
            if isinstance(err, sqlite3.OperationalError) and any(m in str(err).lower() for m in ("locked", "busy")):
                return "busy timeout"
        cur = cur.__cause__ or cur.__context__
    return None


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
    """Bring the database schema up to ``revision`` (idempotent). A database already at the head revision is
    left as it is without running Alembic (whose upgrade loads its environment and every revision script:
    most of a service's start on a migrated database)."""
    cfg = _alembic_config()
    with engine.connect() as conn, _no_answer_bound(conn), conn.begin():
        if revision == "head" and MigrationContext.configure(conn).get_current_revision() == head_revision():
            return
        if conn.dialect.name == "postgresql":  # a migration may rewrite a large table: no statement bound
            conn.exec_driver_sql("SET LOCAL statement_timeout = 0")
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, revision)


@contextlib.contextmanager
def _no_answer_bound(conn: Connection) -> Iterator[None]:
    """Lift the client-side answer bound (:mod:`costopt.db.answers`) of ``conn`` while the block runs
    (nothing to lift on SQLite or an engine without one)."""
    if conn.dialect.name != "postgresql":
        yield
        return
    from costopt.db.answers import unbounded

    with unbounded(conn.connection.dbapi_connection):
        yield


@functools.cache
def head_revision() -> str | None:
    """The newest migration shipped with this code (read once per process: the scripts ship with it)."""
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
