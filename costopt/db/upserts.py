"""``INSERT ... ON CONFLICT`` on the dialects that have it (SQLite and PostgreSQL, the store's two).

SQLAlchemy builds these per dialect (``sqlalchemy.dialects.<name>.insert``); :data:`CONFLICT_INSERTS` names
each dialect's ``insert`` and :func:`per_dialect` builds a statement once for each, so a hot write picks
its statement by ``conn.dialect.name`` instead of building it per call. A dialect without one is absent:
its caller reads first and inserts or updates.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

__all__ = ["CONFLICT_INSERTS", "per_dialect"]

S = TypeVar("S")

CONFLICT_INSERTS: dict[str, Callable[[Any], Any]] = {"postgresql": pg_insert, "sqlite": sqlite_insert}
"""Each dialect's ``insert`` with ``on_conflict_do_nothing`` / ``on_conflict_do_update``, by dialect name."""


def per_dialect(make: Callable[[Callable[[Any], Any]], S]) -> dict[str, S]:
    """``make(insert)`` for each dialect of :data:`CONFLICT_INSERTS`, by dialect name (built once)."""
    return {name: make(insert_of) for name, insert_of in CONFLICT_INSERTS.items()}
