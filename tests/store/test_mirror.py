"""The in-process mirror never serves prices older than the last committed write, whoever wrote it."""

from __future__ import annotations

import multiprocessing
from typing import Any

import pytest
from sqlalchemy import Engine

from costopt.db.engine import make_engine
from costopt.domain import Cloud, InstanceType
from costopt.errors import BadRecord
from pricing.store import PriceStore
from tests.store.conftest import same_database_engine
from tests.store.helpers import KEY, T0, ZONAL, frame, h, offer_tuple, price_of, pt


def _view(store: PriceStore) -> tuple[object, ...]:
    """What a reader sees: the current snapshot and two as-of snapshots (all through the mirror)."""
    return (
        [offer_tuple(o) for o in store.snapshot(include_stale=True)],
        [offer_tuple(o) for o in store.snapshot(h(2.5), include_stale=True)],
        [offer_tuple(o) for o in store.snapshot(h(100), include_stale=True)],
    )


def test_a_reader_sees_a_new_price_written_by_another_store_on_the_same_engine(engine: Engine) -> None:
    reader, writer = PriceStore(engine), PriceStore(engine)
    writer.write([pt(0, 1.0)])
    assert price_of(reader, h(3)) == 1.0
    assert [o.usd_per_hour for o in reader.snapshot(include_stale=True)] == [1.0]

    writer.write([pt(2, 2.0)])

    assert price_of(reader, h(3)) == 2.0
    assert [o.usd_per_hour for o in reader.snapshot(include_stale=True)] == [2.0]


def test_a_reader_sees_every_write_of_another_store_on_its_own_engine(
    store: PriceStore, other_store: PriceStore
) -> None:
    store.write([pt(0, 1.0)])
    _view(store)  # the reader's mirror is warm
    steps = [
        [pt(1, 2.0)],  # append
        [pt(2, 3.0, k=ZONAL)],  # new offer
        [pt(1, 2.5)],  # correction
        [pt(0.5, 2.5)],  # out-of-order point removing its successor
        [pt(3, 2.5, observed_at=90)],  # confirmation only
        [pt(50, 0.5, k=ZONAL)],  # change far later
    ]
    for batch in steps:
        other_store.write(batch)
        assert _view(store) == _view(PriceStore(store.engine, mirror_max_points=1_000)), batch


def test_writers_taking_turns_always_read_their_own_and_each_others_latest_price(
    store: PriceStore, other_store: PriceStore
) -> None:
    for i in range(12):
        writer, reader = (store, other_store) if i % 2 else (other_store, store)
        writer.write([pt(i, float(i + 1))])
        assert price_of(reader, h(i)) == float(i + 1)
        assert price_of(writer, h(i)) == float(i + 1)
        assert [o.usd_per_hour for o in reader.snapshot(include_stale=True)] == [float(i + 1)]


def test_a_catalog_update_by_another_store_reaches_the_readers_join(store: PriceStore, other_store: PriceStore) -> None:
    store.write([pt(0, 1.0)])
    assert store.snapshot(h(1), accelerator="v100", include_stale=True) == []

    other_store.upsert_instance_types([InstanceType(Cloud.AWS, KEY.instance_type, "v100", 1)], now=T0)

    assert [o.key for o in store.snapshot(h(1), accelerator="v100", include_stale=True)] == [KEY]
    assert [o.accelerator for o in store.snapshot(include_stale=True)] == ["v100"]


def test_a_refused_write_by_another_store_changes_nothing_a_reader_sees(
    store: PriceStore, other_store: PriceStore
) -> None:
    store.write([pt(0, 1.0), pt(2, 2.0)])
    before = _view(store)
    bad = frame([pt(3, 5.0), pt(4, 6.0)])
    bad.loc[1, "cloud"] = "oracle"

    with pytest.raises(BadRecord):
        other_store.write(bad)

    assert _view(store) == before


def _write_from_another_process(url: str, schema: str | None) -> None:
    """Runs in a forked child: its own engine, its own PriceStore, its own connections."""
    kwargs: dict[str, Any] = {"connect_args": {"options": f"-csearch_path={schema}"}} if schema else {}
    child_engine = make_engine(url, **kwargs)
    PriceStore(child_engine).write([pt(2, 2.0), pt(1, 0.5)])
    child_engine.dispose()


def test_a_reader_sees_prices_written_by_another_process(store: PriceStore, other_engine: Engine) -> None:
    store.write([pt(0, 1.0)])
    assert price_of(store, h(3)) == 1.0
    assert price_of(store, h(1.5)) == 1.0
    schema = None
    if other_engine.dialect.name == "postgresql":
        with other_engine.connect() as conn:
            schema = conn.exec_driver_sql("SELECT current_schema()").scalar_one()
    other_engine.dispose()  # no pooled connection may cross the fork
    store.engine.dispose()

    child = multiprocessing.get_context("fork").Process(
        target=_write_from_another_process, args=(other_engine.url.render_as_string(hide_password=False), schema)
    )
    child.start()
    child.join(timeout=60)
    assert child.exitcode == 0

    assert price_of(store, h(3)) == 2.0
    assert price_of(store, h(1.5)) == 0.5
    assert [o.usd_per_hour for o in store.snapshot(include_stale=True)] == [2.0]


def test_a_reader_on_a_fresh_engine_agrees_with_a_long_lived_one(store: PriceStore, engine: Engine) -> None:
    store.write([pt(0, 1.0), pt(1, 2.0, k=ZONAL)])
    _view(store)
    store.write([pt(2, 3.0), pt(3, 0.5, k=ZONAL)])
    fresh_engine = same_database_engine(engine)
    try:
        assert _view(store) == _view(PriceStore(fresh_engine))
    finally:
        fresh_engine.dispose()


@pytest.mark.parametrize("offers", [0, 1, 40, 256, 257, 900])
def test_key_rank_is_each_offers_position_in_key_order_on_both_sort_paths(offers: int) -> None:
    """with_key_rank sorts a few offers with numpy and many with pandas: the same ranks, ties (the same key
    twice) in row order."""
    import random

    import pandas as pd

    from pricing.mirror import with_key_rank

    r = random.Random(offers)
    rows = [
        (
            r.choice(["aws", "gcp"]),
            r.choice(["us-east-1", "eu-west-1"]),
            r.choice(["", "a", "b"]),
            f"t{r.randint(0, 9)}",
            r.choice(["spot", "on_demand"]),
        )
        for _ in range(offers)
    ]
    frame = pd.DataFrame(
        rows, columns=["cloud", "region", "zone", "instance_type", "market"], index=range(100, 100 + offers)
    )
    ranks = with_key_rank(frame)["key_rank"].tolist()
    expected = [0] * offers
    for position, row in enumerate(sorted(range(offers), key=lambda i: (rows[i], i))):
        expected[row] = position
    assert ranks == expected
