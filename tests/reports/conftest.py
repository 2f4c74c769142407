"""Fixtures of the report tests: one migrated database per backend per session (ids ``[sqlite]`` /
``[postgres]``), emptied before each test (migrating a PostgreSQL schema per test would cost most of this
suite's time), as tests/ledger does."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy import Engine, text

from tests.conftest import BACKENDS, migrated_engine
from tests.store.helpers import reset

_TABLES = (
    "ledger_segments",
    "ledger_charges",
    "ledger_intervals",
    "migration_copies",
    "migrations",
    "migration_jobs",
    "job_events",
    "jobs",
    "api_keys",
    "teams",
)


@pytest.fixture(scope="session", params=BACKENDS)
def reports_database(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    yield from migrated_engine(request.param, tmp_path_factory.mktemp("reports"))


@pytest.fixture
def engine(reports_database: Engine) -> Engine:
    """A migrated database on each backend, emptied of ledger, migrator, job, team and price rows."""
    with reports_database.begin() as conn:
        for table in _TABLES:
            conn.execute(text(f"DELETE FROM {table}"))
    reset(reports_database)
    return reports_database
