"""Keyset-pagination cursors of the store's lists (jobs, fleets): ``"<created_at ISO>|<id>"``, ordered by
creation time then id (a stable order under inserts). Times are tz-aware UTC."""

from __future__ import annotations

from datetime import UTC, datetime

__all__ = ["make_cursor", "parse_cursor"]


def make_cursor(created_at: datetime, row_id: str) -> str:
    """The cursor that resumes a list after the row created at ``created_at`` with id ``row_id``."""
    return f"{created_at.isoformat()}|{row_id}"


def parse_cursor(cursor: str) -> tuple[datetime, str]:
    """``(created_at, id)`` of a cursor made by :func:`make_cursor`; ValueError that says what to pass
    when it is not one."""
    try:
        at, _, row_id = cursor.partition("|")
        when = datetime.fromisoformat(at)
    except ValueError as exc:
        raise ValueError(f"invalid cursor {cursor!r}: pass the next_cursor of the previous page") from exc
    if when.tzinfo is None or not row_id:
        raise ValueError(f"invalid cursor {cursor!r}: pass the next_cursor of the previous page")
    return when.astimezone(UTC), row_id
