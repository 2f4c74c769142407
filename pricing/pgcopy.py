"""Vectorized encoder of PostgreSQL's binary COPY format (no Python loop per row).

Columns are numpy arrays: ``int4``/``int8``/``float8`` numbers, ``timestamptz`` as int64 nanoseconds
since the Unix epoch (UTC; truncated to microseconds), ``text`` as an object array of str. Rows are
grouped by the byte lengths of their text values so each group is one fixed-width numpy record
array; COPY does not care about row order.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import numpy as np
import pandas as pd

PgType = Literal["int4", "int8", "float8", "timestamptz", "text"]

_HEADER = b"PGCOPY\n\xff\r\n\x00" + (0).to_bytes(4, "big") + (0).to_bytes(4, "big")
_TRAILER = (-1).to_bytes(2, "big", signed=True)
_PG_EPOCH_US = 946_684_800_000_000  # 2000-01-01T00:00:00Z in microseconds since 1970
_FIXED = {"int4": (">i4", 4), "int8": (">i8", 8), "float8": (">f8", 8), "timestamptz": (">i8", 8)}


def encode_binary_copy(
    columns: Sequence[tuple[PgType, np.ndarray]], *, header: bool = True, trailer: bool = True
) -> bytes:
    """Encode rows (given column-wise) as binary COPY data. A payload sent in several chunks has the
    header on the first chunk only and the trailer on the last only."""
    if not columns:
        raise ValueError("no columns to encode")
    n = len(columns[0][1])
    if any(len(arr) != n for _, arr in columns):
        raise ValueError("columns of different lengths")
    values: list[np.ndarray] = []
    text_lengths: list[np.ndarray] = []
    for kind, arr in columns:
        if kind == "text":
            inverse, uniq = pd.factorize(np.asarray(arr, dtype=object))
            enc = np.array([str(u).encode("utf-8") for u in uniq] + [b""], dtype=object)
            lens = np.array([len(b) for b in enc], dtype=np.int64)[inverse]
            values.append(enc[inverse])
            text_lengths.append(lens)
        elif kind == "timestamptz":
            values.append(np.asarray(arr, dtype=np.int64) // 1000 - _PG_EPOCH_US)
        else:
            values.append(np.asarray(arr))
    parts = [_HEADER] if header else []
    if len(text_lengths) == 1:
        inverse, uniq_len = pd.factorize(text_lengths[0])
        groups = np.asarray(uniq_len, dtype=np.int64).reshape(-1, 1)
    elif text_lengths:
        stacked = np.stack(text_lengths, axis=1)
        groups, inverse = np.unique(stacked, axis=0, return_inverse=True)
        inverse = inverse.ravel()
    else:
        groups, inverse = np.zeros((1, 0), dtype=np.int64), np.zeros(n, dtype=np.int64)
    for g, lens in enumerate(groups):
        idx = np.flatnonzero(inverse == g) if len(groups) > 1 else np.arange(n)
        fields: list[tuple[str, str]] = [("nfields", ">i2")]
        t = 0
        for i, (kind, _) in enumerate(columns):
            fields.append((f"len{i}", ">i4"))
            if kind == "text":
                fields.append((f"v{i}", f"S{int(lens[t])}" if lens[t] else "V0"))
                t += 1
            else:
                fields.append((f"v{i}", _FIXED[kind][0]))
        rec = np.empty(len(idx), dtype=np.dtype(fields))
        rec["nfields"] = len(columns)
        t = 0
        for i, (kind, _) in enumerate(columns):
            if kind == "text":
                rec[f"len{i}"] = int(lens[t])
                if lens[t]:
                    rec[f"v{i}"] = values[i][idx].astype(f"S{int(lens[t])}")
                t += 1
            else:
                rec[f"len{i}"] = _FIXED[kind][1]
                rec[f"v{i}"] = values[i][idx]
        parts.append(rec.tobytes())
    if trailer:
        parts.append(_TRAILER)
    return b"".join(parts)
