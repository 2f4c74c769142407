"""Reads served from memory on a database that only this process writes (an offline run's in-memory SQLite).

A :class:`WriteTracker` watches the statements of one SQLite connection (:meth:`WriteTracker.sqlite_factory`,
given to ``sqlite3.connect`` as its ``factory``): an ``INSERT`` or ``UPDATE`` bumps its table's write
generation; a ``DELETE``, any other statement but a ``SELECT``, and a rollback after a write bump every
table's. :func:`track` registers the tracker for its engine; :func:`cached` then answers a read from the
value it last read while none of the tables it depends on was written since; on any other engine it
simply reads.

Only for an engine no other connection writes (``costopt.jobs.offline.memory_database``: one in-memory
SQLite connection for the whole process). The tracking is done on the driver's connection, not with
SQLAlchemy events: an engine with execution events takes SQLAlchemy's slower path for every statement
(measured: 20-40 µs more per statement, more than the reads saved). The values cached must be immutable
(tuples of frozen records or rows): every caller gets the same object. Meant for one thread at a time
(the offline loop, ``workers=0``): threads sharing the one connection share its transaction anyway.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Hashable, Sequence
from typing import Any, TypeVar
from weakref import WeakKeyDictionary

from sqlalchemy import Engine

__all__ = ["WriteTracker", "cached", "is_tracked", "track"]

T = TypeVar("T")


class WriteTracker:
    """Write generations per table of one SQLite connection (module docstring)."""

    def __init__(self) -> None:
        self.every = 0
        """Bumped by writes that may touch any table."""
        self.tables: dict[str, int] = {}
        self.dirty = False
        """A write since the last commit or rollback (a rollback then undoes it)."""
        self.values: dict[Hashable, tuple[tuple[int, ...], Any]] = {}

    def note(self, sql: str) -> None:
        """Count the statement ``sql`` about to run."""
        head = sql[:7]
        if head == "SELECT ":
            return
        self.dirty = True
        if head == "INSERT ":  # INSERT INTO <table> ...
            parts = sql.split(None, 3)
            if len(parts) > 2 and parts[1] == "INTO":
                self._bump(parts[2])
                return
        elif head == "UPDATE ":  # UPDATE <table> SET ...
            parts = sql.split(None, 2)
            if len(parts) > 1:
                self._bump(parts[1])
                return
        self.every += 1

    def _bump(self, table: str) -> None:
        name = table.strip('"')
        self.tables[name] = self.tables.get(name, 0) + 1

    def committed(self) -> None:
        self.dirty = False

    def rolled_back(self) -> None:
        if self.dirty:  # the writes since the last commit are undone: what was read since is stale
            self.every += 1
            self.dirty = False

    def stamp(self, tables: Sequence[str]) -> tuple[int, ...]:
        return (self.every, *(self.tables.get(t, 0) for t in tables))

    def sqlite_factory(self) -> type[sqlite3.Connection]:
        """A ``sqlite3.Connection`` class whose statements, commits and rollbacks this tracker counts."""
        tracker = self

        class _Cursor(sqlite3.Cursor):
            # counted once the statement ran (or failed): a read between the two sees the new state, and
            # its value is stored under the old generation, so it is not served again
            def execute(self, sql: str, parameters: Any = (), /) -> Any:
                try:
                    return super().execute(sql, parameters)
                finally:
                    tracker.note(sql)

            def executemany(self, sql: str, parameters: Any, /) -> Any:
                try:
                    return super().executemany(sql, parameters)
                finally:
                    tracker.note(sql)

            def executescript(self, script: str, /) -> Any:
                try:
                    return super().executescript(script)
                finally:
                    tracker.dirty = True
                    tracker.every += 1

        class _Connection(sqlite3.Connection):
            def cursor(self, factory: Any = _Cursor) -> Any:
                return super().cursor(factory)

            def execute(self, sql: str, parameters: Any = (), /) -> Any:
                return self.cursor().execute(sql, parameters)

            def executemany(self, sql: str, parameters: Any, /) -> Any:
                return self.cursor().executemany(sql, parameters)

            def executescript(self, script: str, /) -> Any:
                return self.cursor().executescript(script)

            def commit(self) -> None:
                super().commit()
                tracker.committed()

            def rollback(self) -> None:
                try:
                    super().rollback()
                finally:
                    tracker.rolled_back()

        return _Connection


_TRACKERS: WeakKeyDictionary[Engine, WriteTracker] = WeakKeyDictionary()


def track(engine: Engine, tracker: WriteTracker) -> None:
    """Serve :func:`cached` reads of ``engine`` by ``tracker``, which must see every statement of every
    connection of the engine (its only connection was opened with :meth:`WriteTracker.sqlite_factory`)."""
    _TRACKERS[engine] = tracker


def is_tracked(engine: Engine) -> bool:
    """True when ``engine`` was registered by :func:`track`."""
    return engine in _TRACKERS


def cached(engine: Engine, key: Hashable, tables: Sequence[str], read: Callable[[], T]) -> T:
    """``read()``, or the value it gave last time for ``key`` when ``engine`` is tracked and none of
    ``tables`` (the tables the read depends on) was written since."""
    tracker = _TRACKERS.get(engine)
    if tracker is None:
        return read()
    stamp = tracker.stamp(tables)
    hit = tracker.values.get(key)
    if hit is not None and hit[0] == stamp:
        return hit[1]  # type: ignore[no-any-return]
    value = read()
    tracker.values[key] = (stamp, value)
    return value
