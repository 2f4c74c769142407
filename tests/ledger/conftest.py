"""Fixtures of the ledger tests.

``engine`` overrides the one of tests/conftest.py with the same contract (a migrated, empty database on
each backend, ids ``[sqlite]``/``[postgres]``), as tests/store does: one database per backend per session,
emptied before each test, because creating and migrating a PostgreSQL schema per test would cost most of
this suite's time.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine, text

from costopt.db.engine import make_engine, migrate
from tests.conftest import _postgres_engine

_TABLES = ("ledger_segments", "ledger_charges", "ledger_intervals", "price_points", "offers", "instance_types")


@pytest.fixture(scope="session", params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def ledger_database(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    if request.param == "sqlite":
        path: Path = tmp_path_factory.mktemp("ledger") / "costopt.db"
        eng = make_engine(f"sqlite:///{path}")
        migrate(eng)
        yield eng
        eng.dispose()
    else:
        for eng in _postgres_engine():
            migrate(eng)
            yield eng


@pytest.fixture
def engine(ledger_database: Engine) -> Engine:
    """A migrated database on each backend, its ledger and price tables emptied for this test."""
    with ledger_database.begin() as conn:
        for table in _TABLES:
            conn.execute(text(f"DELETE FROM {table}"))
        conn.execute(text("UPDATE store_meta SET value = value + 1 WHERE name = 'price_version'"))
    return ledger_database
