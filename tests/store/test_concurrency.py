"""Concurrent writers: each write is one serialized transaction, so the store stays consistent."""

from __future__ import annotations

import threading

import pytest
from sqlalchemy import Engine

from costopt.domain import Cloud
from pricing import ingest
from pricing.store import PriceStore
from tests.store.helpers import h, key, price_of, pt, steps

SQLITE_UNSERIALIZED_WRITERS = (
    "store.py PriceStore.write L202-206 + costopt/db/engine.py make_engine: on SQLite nothing serializes writers "
    "(no BEGIN IMMEDIATE; pysqlite only opens the transaction at the first INSERT/UPDATE), so Ingestor reads the "
    "stored context outside any transaction. A write of 2.0@10h that read the context before another writer "
    "committed 3.0@20h then sets offers.current_* to (10h, 2.0): snapshot() serves 2.0 while the price in effect "
    "is 3.0, and a later change to 2.0@30h is taken as unchanged and lost (PostgreSQL is serialized by its "
    "advisory lock and passes)"
)


def test_a_write_racing_another_writer_keeps_the_current_price_and_later_changes(
    engine: Engine,
    other_store: PriceStore,
    monkeypatch: pytest.MonkeyPatch,
    request: pytest.FixtureRequest,
) -> None:
    first = PriceStore(engine)
    first.write([pt(0, 1.0)])
    paused, other_done = threading.Event(), threading.Event()
    original = ingest.Ingestor.stored_context

    def pause_after_reading_context(self, *args, **kwargs):
        context = original(self, *args, **kwargs)
        if threading.current_thread().name == "slow-writer":
            paused.set()
            other_done.wait(timeout=0.5)  # PostgreSQL: the other writer waits for our lock, so time out
        return context

    monkeypatch.setattr(ingest.Ingestor, "stored_context", pause_after_reading_context)
    errors: list[BaseException] = []

    def slow() -> None:
        try:
            first.write([pt(10, 2.0)])
        except BaseException as exc:  # reported below
            errors.append(exc)

    slow_writer = threading.Thread(target=slow, name="slow-writer")
    slow_writer.start()
    assert paused.wait(timeout=10)
    try:
        other_store.write([pt(20, 3.0)])
    finally:
        other_done.set()
        slow_writer.join(timeout=30)
    assert not errors

    assert steps(first) == [(h(0), 1.0), (h(10), 2.0), (h(20), 3.0)]
    assert [(o.valid_from, o.usd_per_hour) for o in PriceStore(engine).snapshot(include_stale=True)] == [(h(20), 3.0)]
    assert first.last_change(Cloud.AWS) == h(20)
    first.write([pt(30, 2.0)])
    assert price_of(first, h(31)) == 2.0


def test_concurrent_writers_of_different_offers_both_land(engine: Engine, other_store: PriceStore) -> None:
    store = PriceStore(engine)
    errors: list[BaseException] = []

    def writer(s: PriceStore, region: str) -> None:
        try:
            for i in range(15):
                s.write([pt(i, float(1 + i % 3), k=key(region=region, instance_type="g5.xlarge"))])
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(s, r)) for s, r in ((store, "r1"), (other_store, "r2"))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)

    assert not errors
    assert store.count_offers() == 2
    assert store.count_points() == 30
