"""Statements with an ``IN`` list of bound values, built once per list length.

An expanding bind parameter (``column.in_(bindparam(name, expanding=True))``) is rendered anew at every
execution: SQLAlchemy rewrites the cached SQL string for the list's length and maps each value to a
parameter of its own (on a hot read of a few values that is about as much work as the rest of the
execution). The lists the service's hot reads pass are short (a recorded migration's two copies, its
three or four charge keys, a tick's few active jobs), so :class:`InList` builds the statement once per
length up to ``most`` with plain bound parameters (``IN (?, ?)``: compiled once and cached like any
other statement) and only a longer list takes the expanding form. The same rows either way, on every
backend.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

from sqlalchemy import ColumnElement, bindparam

__all__ = ["InList"]

S = TypeVar("S")


class InList(Generic[S]):
    """``make(condition)`` with ``condition = column IN (values)``, prebuilt for 1..``most`` values.

    :meth:`bind` gives the statement and its parameters for a list of values (``name_0``, ``name_1``, ...
    for a prebuilt length; ``name`` as an expanding list beyond ``most``); add the statement's other
    parameters to the dict it returns. An empty list has no statement: the caller answers it (no rows)."""

    def __init__(self, make: Callable[[ColumnElement[bool]], S], column: Any, name: str, *, most: int = 8) -> None:
        self.name = name
        self._names = [f"{name}_{i}" for i in range(most)]
        self._by_length: dict[int, S] = {
            n: make(column.in_([bindparam(k) for k in self._names[:n]])) for n in range(1, most + 1)
        }
        self._expanding = make(column.in_(bindparam(name, expanding=True)))

    def bind(self, values: Sequence[Any]) -> tuple[S, dict[str, Any]]:
        """The statement for ``values`` (at least one) and the parameters that carry them."""
        if not values:
            raise ValueError("an IN list needs at least one value (an empty list matches no row)")
        stmt = self._by_length.get(len(values))
        if stmt is None:
            return self._expanding, {self.name: list(values)}
        return stmt, dict(zip(self._names, values, strict=False))
