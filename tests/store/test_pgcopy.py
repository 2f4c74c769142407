"""The binary COPY encoder, round-tripped through a real PostgreSQL (COPY into a temp table, read back)."""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pricing.pgcopy import PgType, encode_binary_copy

pytestmark = pytest.mark.postgres

PG_URL = os.environ.get("COSTOPT_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test").replace(
    "postgresql+psycopg://", "postgresql://"
)
PG_TYPES = {"int4": "int4", "int8": "int8", "float8": "float8", "timestamptz": "timestamptz", "text": "text"}


@pytest.fixture(scope="module")
def pg() -> Iterator[Any]:
    psycopg = pytest.importorskip("psycopg")
    try:
        conn = psycopg.connect(PG_URL, autocommit=True, connect_timeout=3)
    except psycopg.OperationalError:
        if os.environ.get("CI"):
            raise
        pytest.skip(f"PostgreSQL not reachable at {PG_URL}")
    conn.execute("SET TIME ZONE 'UTC'")
    yield conn
    conn.close()


def round_trip(pg: Any, columns: list[tuple[PgType, np.ndarray]], chunks: int = 1) -> list[tuple[Any, ...]]:
    """COPY the columns (plus a row number) into a temp table in ``chunks`` payloads; rows back in order."""
    n = len(columns[0][1])
    cols: list[tuple[PgType, np.ndarray]] = [("int4", np.arange(n, dtype=np.int64)), *columns]
    ddl = ", ".join(f"c{i} {PG_TYPES[kind]}" for i, (kind, _) in enumerate(cols))
    pg.execute("DROP TABLE IF EXISTS copy_rt")
    pg.execute(f"CREATE TEMP TABLE copy_rt ({ddl})")
    bounds = np.linspace(0, n, chunks + 1).astype(int)
    with pg.cursor() as cur, cur.copy("COPY copy_rt FROM STDIN (FORMAT binary)") as copy:
        for i in range(chunks):
            lo, hi = bounds[i], bounds[i + 1]
            copy.write(
                encode_binary_copy([(kind, arr[lo:hi]) for kind, arr in cols], header=i == 0, trailer=i == chunks - 1)
            )
    select = ", ".join(
        f"(extract(epoch FROM c{i}) * 1000000)::int8" if kind == "timestamptz" else f"c{i}"
        for i, (kind, _) in enumerate(cols)
    )
    rows = pg.execute(f"SELECT {select} FROM copy_rt ORDER BY c0").fetchall()
    return [tuple(r[1:]) for r in rows]


TEXTS = ["", "a", "ab", "héllo", "日本語テキスト", "emoji 🎉🚀", "x" * 1000, "tab\tnew\nline\\ 'q' \"d\"", "", "a"]


def test_text_of_every_length_and_script_round_trips(pg: Any) -> None:
    rows = round_trip(pg, [("text", np.array(TEXTS, dtype=object))])
    assert [r[0] for r in rows] == TEXTS


def test_empty_strings_stay_empty_strings_not_null(pg: Any) -> None:
    rows = round_trip(pg, [("text", np.array(["", "", ""], dtype=object))])
    assert rows == [("",), ("",), ("",)]


def test_several_text_columns_of_mixed_lengths_round_trip(pg: Any) -> None:
    a = np.array(TEXTS, dtype=object)
    b = np.array(list(reversed(TEXTS)), dtype=object)
    c = np.array(["é" * (i % 3) for i in range(len(TEXTS))], dtype=object)
    rows = round_trip(pg, [("text", a), ("float8", np.arange(len(TEXTS), dtype=np.float64)), ("text", b), ("text", c)])
    assert rows == list(zip(a, np.arange(len(TEXTS), dtype=np.float64), b, c, strict=True))


FLOATS = [0.0, -0.0, 0.1, 1 / 3, 2 / 3, 0.30000000000000004, 5e-324, 1e-300, 1.7976931348623157e308, -1.5, 3.06, 1e20]


def test_floats_round_trip_exactly(pg: Any) -> None:
    rows = round_trip(pg, [("float8", np.array(FLOATS))])
    for (got,), want in zip(rows, FLOATS, strict=True):
        assert repr(got) == repr(want)
        assert math.copysign(1, got) == math.copysign(1, want)


def test_int4_and_int8_round_trip_at_their_limits(pg: Any) -> None:
    i4 = np.array([0, 1, -1, 2**31 - 1, -(2**31)], dtype=np.int64)
    i8 = np.array([0, 1, -1, 2**63 - 1, -(2**63) + 1], dtype=np.int64)
    assert round_trip(pg, [("int4", i4), ("int8", i8)]) == list(zip(i4.tolist(), i8.tolist(), strict=True))


def test_timestamps_round_trip_to_the_microsecond(pg: Any) -> None:
    us = np.array(
        [
            0,
            1,
            946_684_800_000_000,  # the PostgreSQL epoch
            946_684_799_999_999,
            1_740_787_200_123_456,
            4_102_444_799_999_999,
            -1_000_000_000_000_001,  # before 1970
        ],
        dtype=np.int64,
    )
    rows = round_trip(pg, [("timestamptz", us * 1000)])
    assert [r[0] for r in rows] == us.tolist()


def test_a_payload_sent_in_several_chunks_round_trips(pg: Any) -> None:
    n = 50
    texts = np.array([f"row-{i}-" + "é" * (i % 7) for i in range(n)], dtype=object)
    floats = np.linspace(0, 1, n)
    rows = round_trip(pg, [("text", texts), ("float8", floats)], chunks=4)
    assert rows == list(zip(texts, floats, strict=True))


def test_zero_rows_are_a_valid_payload(pg: Any) -> None:
    assert round_trip(pg, [("text", np.array([], dtype=object)), ("float8", np.array([]))]) == []


def test_columns_of_different_lengths_are_refused() -> None:
    with pytest.raises(ValueError, match="different lengths"):
        encode_binary_copy([("int4", np.arange(2)), ("int4", np.arange(3))])
    with pytest.raises(ValueError, match="no columns"):
        encode_binary_copy([])


_text = st.text(alphabet=st.characters(codec="utf-8", exclude_characters="\x00"), max_size=40)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    rows=st.lists(
        st.tuples(
            _text,
            st.floats(allow_nan=False),
            st.integers(-(2**31), 2**31 - 1),
            st.integers(-(2**50), 2**52),
            _text,
        ),
        max_size=30,
    )
)
def test_any_rows_round_trip(pg: Any, rows: list[tuple[str, float, int, int, str]]) -> None:
    cols = list(zip(*rows, strict=True)) if rows else [(), (), (), (), ()]
    columns: list[tuple[PgType, np.ndarray]] = [
        ("text", np.array(cols[0], dtype=object)),
        ("float8", np.array(cols[1], dtype=np.float64)),
        ("int4", np.array(cols[2], dtype=np.int64)),
        ("timestamptz", np.array(cols[3], dtype=np.int64) * 1000),
        ("text", np.array(cols[4], dtype=object)),
    ]
    got = round_trip(pg, columns)
    assert got == [(a, b, c, d, e) for a, b, c, d, e in rows]
