"""A client-side bound on how long a PostgreSQL connection waits for the server's answer.

The server-side ``statement_timeout`` cannot fire when the server process itself is frozen (``SIGSTOP``,
a stalled VM) or the network path drops packets: the server's timers do not run, or its answer never
arrives, and a plain libpq connection waits for ever. :class:`BoundedConnection` is psycopg's connection
with every wait for the server (a query and its results, a commit, a rollback, the pool's ping) bounded
by its ``answer_timeout_s``: past it the connection is closed (its protocol state is unknown, so it is
never reused: SQLAlchemy sees it closed and invalidates it) and :class:`NoAnswer`, an operational error,
is raised, which :func:`costopt.db.engine.db_unavailable` counts as the database being unavailable (503,
a scheduled job retried at its next tick). TCP keepalives and ``tcp_user_timeout``
(:func:`keepalive_params`) make the kernel notice a peer that stopped acknowledging (a dropped network
path) on idle pooled connections too; they cannot notice a frozen server process, whose kernel still
acknowledges: the wait bound does.

Imported only for PostgreSQL engines (it imports psycopg).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import psycopg
from psycopg.abc import PQGen

RV = TypeVar("RV")

KEEPALIVE_PROBES = 3
"""Unanswered TCP keepalive probes after which the kernel drops a connection (libpq's ``keepalives_count``)."""


class NoAnswer(psycopg.OperationalError):
    """The server did not answer within the connection's ``answer_timeout_s``; the connection was closed."""


class BoundedConnection(psycopg.Connection[Any]):
    """psycopg's connection whose every wait for the server is bounded by :attr:`answer_timeout_s`
    (None: unbounded, psycopg's behaviour); see the module doc."""

    answer_timeout_s: float | None = None

    def wait(self, gen: PQGen[RV], interval: float = 0.1, timeout: float | None = None) -> RV:
        bound = self.answer_timeout_s
        if timeout is not None or not bound:  # a caller's own bound (psycopg's cancel) wins
            return super().wait(gen, interval=interval, timeout=timeout)
        try:
            return super().wait(gen, interval=interval, timeout=bound)
        except psycopg.errors._WaitTimeout:
            self.close()  # mid-protocol: never reused
            raise NoAnswer(
                f"the database server did not answer within {bound:g} s (the client-side bound: the server "
                "is frozen or the network path drops packets); the connection was closed"
            ) from None


def connect_bounded(answer_timeout_s: float, *cargs: Any, **cparams: Any) -> BoundedConnection:
    """A new :class:`BoundedConnection` (SQLAlchemy's ``do_connect`` hook: psycopg's ``connect`` arguments)."""
    conn = BoundedConnection.connect(*cargs, **cparams)
    conn.answer_timeout_s = answer_timeout_s
    return conn


def keepalive_params(answer_timeout_s: float) -> dict[str, int]:
    """libpq's TCP parameters for a connection whose answers are bounded by ``answer_timeout_s``: data
    sent and not acknowledged for that long drops the connection (``tcp_user_timeout``, ms), and an idle
    connection whose peer stops answering keepalive probes is dropped within about the same time
    (``keepalives_idle`` half of it, then :data:`KEEPALIVE_PROBES` probes a sixth of it apart)."""
    return {
        "keepalives": 1,
        "keepalives_idle": max(1, math.ceil(answer_timeout_s / 2)),
        "keepalives_interval": max(1, math.ceil(answer_timeout_s / 6)),
        "keepalives_count": KEEPALIVE_PROBES,
        "tcp_user_timeout": max(1, round(answer_timeout_s * 1000)),
    }


@contextmanager
def unbounded(dbapi_connection: Any) -> Iterator[None]:
    """Lift the answer bound of ``dbapi_connection`` (a :class:`BoundedConnection`; anything else is left
    alone) while the block runs, e.g. for a migration that may rewrite a large table."""
    if not isinstance(dbapi_connection, BoundedConnection):
        yield
        return
    saved = dbapi_connection.answer_timeout_s
    dbapi_connection.answer_timeout_s = None
    try:
        yield
    finally:
        dbapi_connection.answer_timeout_s = saved
