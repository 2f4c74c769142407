"""Fixtures of the ledger tests.

``engine`` overrides the one of tests/conftest.py with the same contract (a migrated, empty database on
each backend, ids ``[sqlite]``/``[postgres]``), as tests/store does: one database per backend per session,
emptied before each test, because creating and migrating a PostgreSQL schema per test would cost most of
this suite's time.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy import Engine, text

from tests.conftest import BACKENDS, migrated_engine
from tests.store.helpers import reset

_LEDGER_TABLES = ("ledger_segments", "ledger_charges", "ledger_intervals")


@pytest.fixture(scope="session", params=BACKENDS)
def ledger_database(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    yield from migrated_engine(request.param, tmp_path_factory.mktemp("ledger"))


@pytest.fixture
def engine(ledger_database: Engine) -> Engine:
    """A migrated database on each backend, its ledger and price tables emptied for this test."""
    with ledger_database.begin() as conn:
        for table in _LEDGER_TABLES:
            conn.execute(text(f"DELETE FROM {table}"))
    reset(ledger_database)
    return ledger_database
