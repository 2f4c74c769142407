"""Column types shared by every table."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import DateTime
from sqlalchemy.dialects import sqlite
from sqlalchemy.engine import Dialect
from sqlalchemy.types import TypeDecorator

SQLITE_TS_FORMAT = "%Y-%m-%dT%H:%M:%S.%f"
"""How SQLite holds a UTC instant: ISO 8601 text with microseconds (sorts in time order, and is what
``numpy.datetime_as_string(..., unit="us")`` prints, so bulk paths need no per-row formatting).
PostgreSQL uses timestamptz."""

_SQLITE_DT = sqlite.DATETIME(  # type: ignore[no-untyped-call]
    storage_format="%(year)04d-%(month)02d-%(day)02dT%(hour)02d:%(minute)02d:%(second)02d.%(microsecond)06d",
    regexp=r"(\d+)-(\d+)-(\d+)T(\d+):(\d+):(\d+)(?:\.(\d+))?",
)


class UtcDateTime(TypeDecorator[datetime]):
    """A tz-aware UTC instant: ``timestamptz`` on PostgreSQL, sortable UTC text on SQLite.

    Naive datetimes are refused on the way in (a naive time is a bug, not UTC by luck).
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def load_dialect_impl(self, dialect: Dialect) -> Any:
        if dialect.name == "sqlite":
            return dialect.type_descriptor(_SQLITE_DT)
        return dialect.type_descriptor(DateTime(timezone=True))

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> Any:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError(f"naive datetime {value!r}: pass a tz-aware UTC time")
        value = value.astimezone(UTC)
        if dialect.name == "sqlite":
            return value.replace(tzinfo=None)
        return value

    def process_result_value(self, value: Any, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if isinstance(value, str):
            value = datetime.fromisoformat(value)
        result: datetime = value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
        return result


def sqlite_ts(value: datetime) -> str:
    """Format a tz-aware instant the way :class:`UtcDateTime` stores it on SQLite."""
    return value.astimezone(UTC).strftime(SQLITE_TS_FORMAT)
