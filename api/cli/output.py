"""Rendering for every command: ``--format table|json|csv``.

Tables go to stdout through rich with units in the headers; JSON is a list (or object) of plain
values; CSV has a header row. Notes for people (as-of time, partial results) go to stderr so that
json/csv output stays machine-readable.
"""

from __future__ import annotations

import csv
import json
import sys
from collections.abc import Mapping, Sequence
from enum import StrEnum
from typing import Any

from rich.console import Console
from rich.table import Table


class OutputFormat(StrEnum):
    table = "table"
    json = "json"
    csv = "csv"


# Not a terminal (a pipe, a file): use a wide page so names are never cut.
stdout = Console(width=None if sys.stdout.isatty() else 220)
stderr = Console(stderr=True, width=None if sys.stderr.isatty() else 220)


def _cell(value: Any, unit: str | None = None) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if unit == "USD/h":
            return f"{value:,.4f}"
        if unit == "USD":
            return f"{value:,.2f}"
        if unit == "%":
            return f"{100 * value:.0f}"
        if unit in ("h", "steps/s"):
            return f"{value:,.2f}"
        return f"{value:g}"
    return str(value)


def emit(
    rows: Sequence[Mapping[str, Any]],
    columns: Sequence[tuple[str, str, str | None]],
    fmt: OutputFormat,
    *,
    title: str | None = None,
) -> None:
    """Print ``rows``. ``columns`` are (key, header, unit); the unit is shown in table headers."""
    if fmt is OutputFormat.json:
        sys.stdout.write(json.dumps(list(rows), indent=2, default=str) + "\n")
        return
    if fmt is OutputFormat.csv:
        keys = [c[0] for c in columns]
        extra = [k for r in rows[:1] for k in r if k not in keys]
        writer = csv.DictWriter(sys.stdout, fieldnames=keys + extra, extrasaction="ignore", lineterminator="\n")
        writer.writeheader()
        for r in rows:
            writer.writerow({k: ("" if r.get(k) is None else r.get(k)) for k in keys + extra})
        return
    table = Table(title=title, header_style="bold")
    for _key, header, unit in columns:
        table.add_column(f"{header} ({unit})" if unit else header, justify="right" if unit else "left", overflow="fold")
    for r in rows:
        table.add_row(*[_cell(r.get(key), unit) for key, _h, unit in columns])
    stdout.print(table)


def emit_object(obj: Mapping[str, Any], fmt: OutputFormat, *, title: str | None = None) -> None:
    """Print one record (json: an object; table/csv: key/value rows)."""
    if fmt is OutputFormat.json:
        sys.stdout.write(json.dumps(obj, indent=2, default=str) + "\n")
        return
    emit(
        [{"field": k, "value": v} for k, v in obj.items()],
        [("field", "field", None), ("value", "value", None)],
        fmt,
        title=title,
    )


def note(message: str) -> None:
    """A line for people, on stderr."""
    stderr.print(message, highlight=False)
