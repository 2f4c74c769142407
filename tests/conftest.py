"""Shared fixtures: the real public data folder and per-test databases on both backends."""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from queue import Queue
from typing import Any

# One BLAS thread per process, set before numpy loads (the xdist workers and the services tests start inherit
# it): two test workers each running OpenBLAS on both cores oversubscribed the machine; tests/throughput and
# tests/planning took 49 s (93 s of CPU) with the default threads, 25 s (45 s of CPU) with one.
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")
# The services the tests build (and the ones they start as processes) keep their heaps collectable: a frozen
# heap (COSTOPT_GC_FREEZE, api/heap.py) would keep every dropped test app's cycles for the process's life.
os.environ.setdefault("COSTOPT_GC_FREEZE", "false")

import pytest  # noqa: E402
from sqlalchemy import Engine, event, text  # noqa: E402

from costopt.db.engine import make_engine, migrate  # noqa: E402
from costopt.settings import Settings  # noqa: E402

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
    admin.dispose()
    try:
        yield schema
    finally:
        _drop_later(schema)


_DROPS: Queue[str] = Queue()
_DROPPER: list[threading.Thread] = []


def _drop_later(schema: str) -> None:
    """Drop ``schema`` in a thread of this test process (a cascade drop takes 0.2-0.5 s of the server per
    test under the suite's load); :func:`pytest_sessionfinish` waits until every one queued is dropped."""
    if not _DROPPER:
        thread = threading.Thread(target=_dropper, name="drop test schemas", daemon=True)
        _DROPPER.append(thread)
        thread.start()
    _DROPS.put(schema)


def _dropper() -> None:
    admin = make_engine(PG_ADMIN_URL)
    while True:
        schema = _DROPS.get()
        try:
            with admin.begin() as conn:
                conn.execute(text("SET LOCAL lock_timeout = '60s'"))  # a leaked connection never hangs it
                conn.execute(text(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'))
        except Exception as exc:  # a cleanup: say so, never fail a test that has passed
            logging.getLogger("tests").warning("could not drop test schema %s: %s", schema, exc)
        finally:
            _DROPS.task_done()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Every test schema queued for dropping is dropped before the test process ends."""
    if _DROPPER:
        _DROPS.join()


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


def migrated_engine(backend: str, folder: Path, *, replay: bool = False) -> Iterator[Engine]:
    """A migrated, empty database on ``backend`` (a SQLite file in ``folder``; a PostgreSQL schema of
    its own), disposed (and the schema dropped) when the generator closes. ``replay``: a PostgreSQL schema
    gets the recorded statements of a real migration (:func:`_pg_migration`) instead of running Alembic
    (the per-test ``engine``; the session-scoped databases of tests/store, tests/ledger and tests/reports
    migrate for real, so tests/store/test_migrations.py checks Alembic's own result)."""
    if backend == "sqlite":
        target = folder / "costopt.db"
        shutil.copyfile(_sqlite_template(), target)  # the migrated schema, without running Alembic again
        eng = make_engine(f"sqlite:///{target}")
        yield eng
        eng.dispose()
    else:
        for eng in _postgres_engine():
            if replay:
                with eng.begin() as conn:
                    cursor = conn.connection.cursor()  # the statements as the driver got them, with parameters
                    for statement, parameters in _pg_migration():
                        cursor.execute(statement, parameters)
                    cursor.close()
            else:
                migrate(eng)
            yield eng


_PG_MIGRATION: list[tuple[str, Any]] = []


def _pg_migration() -> list[tuple[str, Any]]:
    """Every statement that migrating an empty PostgreSQL schema to the newest revision executes, recorded
    once per test process from a real :func:`migrate` (the DDL in its order, the version row; unqualified,
    so they act on the search path's schema). Replayed on each test's schema, they give the migrated schema
    (same tables, columns, defaults, constraints, indexes, sequences, revision) without Alembic's loading
    of every revision: ~0.3 s per test instead of ~0.75 s. tests/store/test_migrations.py runs the
    migrations themselves."""
    if not _PG_MIGRATION:
        with pg_schema() as schema:
            eng = make_engine(PG_ADMIN_URL, connect_args={"options": f"-csearch_path={schema}"})
            seen: list[tuple[str, Any]] = []

            @event.listens_for(eng, "before_cursor_execute")
            def record(conn: Any, cursor: Any, statement: str, parameters: Any, context: Any, many: bool) -> None:
                assert not many, "a migration statement with many parameter sets: replay it as such"
                seen.append((statement, dict(parameters) or None))  # None: executed without parameters

            migrate(eng)
            eng.dispose()
        _PG_MIGRATION.extend(seen)
    return _PG_MIGRATION


@pytest.fixture(params=BACKENDS)
def engine(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Engine]:
    """A migrated, empty database on each backend (SQLite file; PostgreSQL schema of its own)."""
    yield from migrated_engine(request.param, tmp_path, replay=True)


ALL_BACKENDS_ENV = "COSTOPT_TEST_ALL_BACKENDS"
"""Set (to anything but empty or 0): tests marked ``one_backend_each`` run on both backends too
(``make test-all-backends``)."""


def _one_backend_each(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked ``one_backend_each`` (modules whose subject is not the database: clouds, the job engine,
    the migrator's state machine, the HTTP faces) run each case on one backend instead of both: a module's
    cases (a test function with its other parameters) take SQLite and PostgreSQL in turn, in collection
    order, so both backends run every such module and no case runs twice. The store, the ledger, the reports'
    queries, the importer and the replicas run everything on both. ``COSTOPT_TEST_ALL_BACKENDS=1`` keeps both."""
    if os.environ.get(ALL_BACKENDS_ENV, "") not in ("", "0"):
        return
    cases: dict[tuple[str, str], int] = {}  # (module, case) -> the case's index in its module
    per_module: dict[str, int] = {}
    keep: list[pytest.Item] = []
    drop: list[pytest.Item] = []
    for item in items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        if item.get_closest_marker("one_backend_each") is None or params.get("engine") not in ("sqlite", "postgres"):
            keep.append(item)
            continue
        module = item.nodeid.split("::")[0]
        others = sorted((k, str(v)) for k, v in params.items() if k != "engine")
        case = (module, f"{getattr(item, 'originalname', item.name)}{others}")
        if case not in cases:
            cases[case] = per_module.get(module, 0)
            per_module[module] = cases[case] + 1
        wanted = ("sqlite", "postgres")[cases[case] % 2]
        (keep if params["engine"] == wanted else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked ``one_backend_each`` keep one backend per case (:func:`_one_backend_each`). Tests marked
    ``slow`` run first (otherwise in collection order): with ``pytest -n 3`` and the small scheduling chunks
    of ``addopts`` (``--maxschedchunk``), the workers share the long tests at the start instead of one worker
    finishing a minute-long test alone at the end."""
    _one_backend_each(config, items)
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)
