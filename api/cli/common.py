"""Shared CLI plumbing: exit codes, settings overrides, time parsing, error reporting."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from enum import IntEnum
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import typer

from api.cli.output import note
from costopt.domain import parse_utc
from costopt.errors import BadRecord, CostoptError

if TYPE_CHECKING:
    from costopt.settings import Settings

T = TypeVar("T")


class Exit(IntEnum):
    """Exit codes of every ``costopt`` command (documented in docs/cli.md)."""

    OK = 0
    FAILED = 1  # the operation failed (bad input file, store unreachable, source down)
    USAGE = 2  # bad arguments (typer/click's own code)
    PARTIAL = 3  # part of the work failed (some files refused, some sources failed)
    NOT_FOUND = 4  # the query matched nothing (no offer, no price at that time)


def settings_with(data_dir: Path | None = None, database_url: str | None = None) -> Settings:
    """The settings, with command-line overrides applied."""
    from costopt.settings import get_settings  # pydantic-settings: loaded by commands, not by --help

    base = get_settings()
    updates: dict[str, object] = {}
    if data_dir is not None:
        if not data_dir.is_dir():
            raise typer.BadParameter(f"{data_dir} is not a folder", param_hint="--data-dir")
        updates["data_dir"] = data_dir.resolve()
    if database_url is not None:
        updates["database_url"] = database_url
    return base.model_copy(update=updates) if updates else base


def parse_time(value: str | None, option: str) -> datetime | None:
    """ISO 8601 -> tz-aware UTC (a bare date is 00:00 UTC); a clear usage error otherwise."""
    if value is None:
        return None
    try:
        return parse_utc(value)
    except BadRecord as exc:
        raise typer.BadParameter(f"{exc}; use ISO 8601, e.g. 2020-03-01T12:00:00Z", param_hint=option) from exc


@contextmanager
def failures() -> Iterator[None]:
    """Turn the project's errors into a message on stderr and exit code 1 (no traceback)."""
    try:
        yield
    except CostoptError as exc:
        note(f"[red]error:[/red] {exc}")
        raise typer.Exit(Exit.FAILED) from exc


def configure_logging(verbose: bool) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )


def run_guarded(fn: Callable[[], T]) -> T:
    with failures():
        return fn()
