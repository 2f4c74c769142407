"""Fixtures of the price-store contract tests.

``engine`` overrides the one of tests/conftest.py with the same contract (a migrated, empty database on
each backend, ids ``[sqlite]``/``[postgres]``), but migrates one database per backend per session and
empties its tables before each test: creating and migrating a PostgreSQL schema per test would cost
most of this suite's time budget.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy import Engine, text

from costopt.db.engine import make_engine
from pricing.store import PriceStore
from tests.conftest import BACKENDS, migrated_engine
from tests.store.helpers import reset


@pytest.fixture(scope="session", params=BACKENDS)
def store_database(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    yield from migrated_engine(request.param, tmp_path_factory.mktemp("store"))


@pytest.fixture
def engine(store_database: Engine) -> Engine:
    """A migrated database on each backend, emptied (and its price version bumped) for this test."""
    reset(store_database)
    return store_database


@pytest.fixture
def store(engine: Engine) -> PriceStore:
    return PriceStore(engine)


def same_database_engine(engine: Engine) -> Engine:
    """A second engine (own pool, own connections, as another process would have) on ``engine``'s database."""
    url = engine.url.render_as_string(hide_password=False)
    if engine.dialect.name == "postgresql":
        with engine.connect() as conn:
            schema = conn.execute(text("SELECT current_schema()")).scalar_one()
        return make_engine(url, connect_args={"options": f"-csearch_path={schema}"})
    return make_engine(url)


@pytest.fixture
def other_engine(engine: Engine) -> Iterator[Engine]:
    eng = same_database_engine(engine)
    yield eng
    eng.dispose()


@pytest.fixture
def other_store(other_engine: Engine) -> PriceStore:
    """Another PriceStore on the same database through its own engine (another process's view)."""
    return PriceStore(other_engine)
