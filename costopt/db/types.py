"""Column types shared by every table."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

from sqlalchemy import BigInteger, DateTime, Numeric, String
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


class ExactDecimal(TypeDecorator[Decimal]):
    """An exact decimal: ``NUMERIC`` (unconstrained) on PostgreSQL, its text on SQLite.

    Only :class:`~decimal.Decimal` and ``int`` are accepted on the way in: a float is refused (money
    through a float is a bug); non-finite values are refused too.
    """

    impl = Numeric()
    cache_ok = True

    def load_dialect_impl(self, dialect: Dialect) -> Any:
        if dialect.name == "sqlite":
            return dialect.type_descriptor(String(64))
        return dialect.type_descriptor(Numeric(asdecimal=True))

    def process_bind_param(self, value: Decimal | int | None, dialect: Dialect) -> Any:
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, Decimal | int):
            raise TypeError(f"ExactDecimal takes Decimal or int, got {type(value).__name__} {value!r}")
        dec = Decimal(value)
        if not dec.is_finite():
            raise ValueError(f"ExactDecimal must be finite, got {dec}")
        if dialect.name == "sqlite":
            return str(dec)
        return dec

    def process_result_value(self, value: Any, dialect: Dialect) -> Decimal | None:
        if value is None:
            return None
        if isinstance(value, Decimal):
            return value
        if isinstance(value, float):  # a driver that hands back floats would lose digits: refuse
            raise TypeError(f"ExactDecimal read a float ({value!r}); the column must hold text or NUMERIC")
        return Decimal(str(value))
