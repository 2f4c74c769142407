"""Column types shared by every table."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import BigInteger, DateTime
from sqlalchemy.engine import Dialect
from sqlalchemy.types import TypeDecorator

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_US = timedelta(microseconds=1)


def to_epoch_us(value: datetime) -> int:
    """A tz-aware instant as integer microseconds since 1970-01-01T00:00:00Z."""
    return (value - EPOCH) // _US


def from_epoch_us(value: int) -> datetime:
    return EPOCH + timedelta(microseconds=int(value))


class UtcDateTime(TypeDecorator[datetime]):
    """A tz-aware UTC instant: ``timestamptz`` on PostgreSQL; on SQLite an integer of microseconds
    since the Unix epoch (exact, sorts in time order, and bulk paths write numpy int64 as is).

    Naive datetimes are refused on the way in (a naive time is a bug, not UTC by luck).
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def load_dialect_impl(self, dialect: Dialect) -> Any:
        if dialect.name == "sqlite":
            return dialect.type_descriptor(BigInteger())
        return dialect.type_descriptor(DateTime(timezone=True))

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> Any:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError(f"naive datetime {value!r}: pass a tz-aware UTC time")
        if dialect.name == "sqlite":
            return to_epoch_us(value)
        return value.astimezone(UTC)

    def process_result_value(self, value: Any, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if isinstance(value, int):
            return from_epoch_us(value)
        if isinstance(value, str):
            value = datetime.fromisoformat(value)
        result: datetime = value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
        return result


def db_value_to_ns(value: Any) -> int:
    """A raw timestamp as a driver returns it (int µs on SQLite, datetime on PostgreSQL) -> ns."""
    if isinstance(value, int):
        return value * 1000
    if isinstance(value, datetime):
        return to_epoch_us(value) * 1000
    raise TypeError(f"not a stored timestamp: {value!r}")
