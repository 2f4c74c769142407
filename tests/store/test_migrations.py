"""Schema migrations: idempotent, detectable, and a clear StoreError when the database is unreachable."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import Engine, inspect

import costopt.db.schema  # noqa: F401  (every table, on the metadata)
from costopt.db.engine import current_revision, head_revision, is_migrated, make_engine, migrate
from costopt.db.metadata import metadata
from costopt.db.types import to_epoch_us
from costopt.errors import StoreError
from pricing.store import PriceStore
from tests.store.helpers import h, price_of, pt

TABLES = {"offers", "price_points", "price_repeats", "instance_types", "source_status", "store_meta"}


@pytest.fixture
def blank_sqlite(tmp_path: Path) -> Iterator[Engine]:
    eng = make_engine(f"sqlite:///{tmp_path / 'nested' / 'dir' / 'blank.db'}")
    yield eng
    eng.dispose()


def _closed_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_there_is_a_head_revision() -> None:
    assert head_revision()


def test_a_migrated_database_is_at_the_head_revision(engine: Engine) -> None:
    assert current_revision(engine) == head_revision()
    assert is_migrated(engine)
    assert set(inspect(engine).get_table_names()) >= TABLES


def test_the_migrated_schema_is_exactly_the_declared_schema(engine: Engine) -> None:
    with engine.connect() as conn:
        assert compare_metadata(MigrationContext.configure(conn), metadata) == []


def test_migrating_twice_changes_nothing(engine: Engine) -> None:
    store = PriceStore(engine)
    store.write([pt(0, 1.0), pt(5, 2.0)])

    migrate(engine)
    migrate(engine)

    assert is_migrated(engine)
    assert store.count_points() == 2
    assert price_of(PriceStore(engine), h(6)) == 2.0


def test_a_blank_database_is_not_migrated_until_migrate_runs(blank_sqlite: Engine) -> None:
    assert current_revision(blank_sqlite) is None
    assert not is_migrated(blank_sqlite)

    migrate(blank_sqlite)

    assert is_migrated(blank_sqlite)
    assert set(inspect(blank_sqlite).get_table_names()) >= TABLES
    store = PriceStore(blank_sqlite)
    assert store.write([pt(0, 1.0)]).inserted == 1
    assert price_of(store, h(1)) == 1.0


def test_current_revision_of_an_unreachable_postgres_raises_store_error() -> None:
    eng = make_engine(f"postgresql://postgres@127.0.0.1:{_closed_port()}/nothing", connect_args={"connect_timeout": 2})
    try:
        with pytest.raises(StoreError, match="unreachable"):
            current_revision(eng)
        with pytest.raises(StoreError):
            is_migrated(eng)
    finally:
        eng.dispose()


def test_current_revision_of_an_unopenable_sqlite_file_raises_store_error(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where a folder should be")
    eng = make_engine(f"sqlite:///{tmp_path / 'db-dir'}/x.db")
    (tmp_path / "db-dir").rmdir()
    (tmp_path / "db-dir").symlink_to(blocker)
    try:
        with pytest.raises(StoreError):
            current_revision(eng)
    finally:
        eng.dispose()


def test_the_price_version_counter_starts_at_zero(blank_sqlite: Engine) -> None:
    migrate(blank_sqlite)
    with blank_sqlite.connect() as conn:
        rows = conn.exec_driver_sql("SELECT name, value FROM store_meta").fetchall()
    assert [tuple(r) for r in rows] == [("price_version", 0)]


def test_a_store_written_before_0007_keeps_its_prices_and_resolves_late_points(blank_sqlite: Engine) -> None:
    migrate(blank_sqlite, "0006")
    with blank_sqlite.begin() as conn:  # what the 0006 store wrote: change points and the current one
        conn.exec_driver_sql(
            "INSERT INTO offers (id, cloud, region, zone, instance_type, market, current_valid_from,"
            " current_usd_per_hour, current_source, last_confirmed_at, last_source)"
            " VALUES (1, 'aws', 'us-east-1', '', 'p3.2xlarge', 'spot', ?, 2.0, 'src', ?, 'src')",
            (to_epoch_us(h(10)), to_epoch_us(h(10))),
        )
        conn.exec_driver_sql(
            "INSERT INTO price_points VALUES (1, ?, 1.0, 'src'), (1, ?, 2.0, 'src')",
            (to_epoch_us(h(0)), to_epoch_us(h(10))),
        )

    migrate(blank_sqlite)

    with blank_sqlite.connect() as conn:
        assert conn.exec_driver_sql("SELECT newest_valid_from FROM offers").scalar_one() == to_epoch_us(h(10))
    store = PriceStore(blank_sqlite)
    assert [price_of(store, h(t)) for t in (1, 10)] == [1.0, 2.0]
    result = store.write([pt(5, 3.0), pt(12, 2.0)])  # reaches back before the newest observation
    assert (result.inserted, result.unchanged) == (1, 1)
    assert [price_of(store, h(t)) for t in (4, 5, 10, 13)] == [1.0, 3.0, 2.0, 2.0]


def test_fleet_jobs_written_before_0015_are_owed_what_they_received(blank_sqlite: Engine) -> None:
    # the allocation integral (fleet_jobs.owed) was not kept before 0015: a job in a fleet then starts level
    # with its part (owed = received), not as if it had taken every second it ran
    migrate(blank_sqlite, "0014")
    with blank_sqlite.begin() as conn:
        conn.exec_driver_sql(
            "INSERT INTO fleet_jobs (job_id, fleet_id, team_id, weight, gpus, throughput, steps_total, arrived_at,"
            " status, received, updated_at) VALUES ('job-a', 'fleet-1', 'team-a', 1.0, 1, '{\"v100\": 10.0}', 100,"
            " ?, 'running', '{\"v100\": 720.0}', ?)",
            (to_epoch_us(h(0)), to_epoch_us(h(1))),
        )
    migrate(blank_sqlite)
    with blank_sqlite.connect() as conn:
        row = conn.exec_driver_sql("SELECT owed, owed_at FROM fleet_jobs WHERE job_id = 'job-a'").one()
    assert (row.owed, row.owed_at) == ('{"v100": 720.0}', None)
