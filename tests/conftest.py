"""Shared fixtures: the real public data folder and per-test databases on both backends."""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from sqlalchemy import Engine, text

from costopt.db.engine import make_engine, migrate
from costopt.settings import Settings

PG_ADMIN_URL = os.environ.get("COSTOPT_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """``../shared/data`` (real public data). Required: CI lays it beside the checkout."""
    data = Settings().data_dir
    if data is None or not data.is_dir():
        pytest.fail("../shared/data is missing: the tests read real data from it (set COSTOPT_DATA_DIR)")
    return data


def _pg_available() -> bool:
    try:
        eng = make_engine(PG_ADMIN_URL)
        with eng.connect() as conn:
            conn.execute(text("select 1"))
        eng.dispose()
        return True
    except Exception:
        return False


@contextmanager
def pg_schema() -> Iterator[str]:
    """A PostgreSQL schema of its own (dropped afterwards); skips the test when PostgreSQL is not
    reachable, fails it under CI (where PostgreSQL is part of the machine)."""
    if not _pg_available():
        if os.environ.get("CI"):
            pytest.fail(f"PostgreSQL is required under CI and not reachable at {PG_ADMIN_URL}")
        pytest.skip(f"PostgreSQL not reachable at {PG_ADMIN_URL}")
    schema = f"t_{uuid.uuid4().hex[:12]}"
    admin = make_engine(PG_ADMIN_URL)
    with admin.begin() as conn:
        conn.execute(text(f'CREATE SCHEMA "{schema}"'))
    try:
        yield schema
    finally:
        with admin.begin() as conn:
            conn.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
        admin.dispose()


def _postgres_engine() -> Iterator[Engine]:
    with pg_schema() as schema:
        eng = make_engine(PG_ADMIN_URL, connect_args={"options": f"-csearch_path={schema}"})
        try:
            yield eng
        finally:
            eng.dispose()


BACKENDS = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
"""The ``params`` of a database fixture: ids ``[sqlite]``/``[postgres]``."""


_TEMPLATE: dict[str, Path] = {}


def _sqlite_template() -> Path:
    """A SQLite file migrated to the newest schema once per test process (copied for each test: a copy
    takes a millisecond, a migration a third of a second). tests/store/test_migrations.py runs the
    migrations themselves on fresh files."""
    if "sqlite" not in _TEMPLATE:
        folder = Path(tempfile.mkdtemp(prefix="costopt-template-"))
        eng = make_engine(f"sqlite:///{folder / 'template.db'}")
        migrate(eng)
        eng.dispose()
        _TEMPLATE["sqlite"] = folder / "template.db"
    return _TEMPLATE["sqlite"]


def migrated_engine(backend: str, folder: Path) -> Iterator[Engine]:
    """A migrated, empty database on ``backend`` (a SQLite file in ``folder``; a PostgreSQL schema of
    its own), disposed (and the schema dropped) when the generator closes."""
    if backend == "sqlite":
        target = folder / "costopt.db"
        shutil.copyfile(_sqlite_template(), target)  # the migrated schema, without running Alembic again
        eng = make_engine(f"sqlite:///{target}")
        yield eng
        eng.dispose()
    else:
        for eng in _postgres_engine():
            migrate(eng)
            yield eng


@pytest.fixture(params=BACKENDS)
def engine(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Engine]:
    """A migrated, empty database on each backend (SQLite file; PostgreSQL schema of its own)."""
    yield from migrated_engine(request.param, tmp_path)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked ``slow`` run first (otherwise in collection order): with ``pytest -n 2`` and the small
    scheduling chunks of ``addopts`` (``--maxschedchunk``), the workers share the long tests at the start
    instead of one worker finishing a minute-long test alone at the end."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)
