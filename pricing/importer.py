"""The importer: detects the kind of each recorded price file and imports it into the store
(``costopt prices import PATH...``, and the seed of an empty store).

A file's kind is told by its content (JSON shape, CSV header), not by its name alone. The kinds are a
registry (:data:`KINDS`: name -> :class:`FileKind`, how it is told apart and parsed):

- ``aws-spot-page``: a raw ``describe-spot-price-history`` JSON page, parsed by
  :func:`pricing.aws_pages.parse_spot_page` (source ``aws-spot``, as the live collector). A page with a
  non-empty ``NextToken`` was cut short: it is imported and reported ``partial``.
- ``aws-spot-csv``: the normalized AWS spot history (one row = one price change event; source
  ``aws-spot``, so it and the raw pages give the same points).
- ``azure-sheet``: a hand-collected Azure sheet (``Date,NC12,...``) read by
  :func:`pricing.azure_sheets.parse_azure_sheet` with ``instance_mapping.csv`` of the folder above it.
- ``azure-daily-csv``: the normalized Azure daily prices (source ``azure-sheet``, as the sheets).
- ``gcp-history-csv``: GCP GPU VM price change points; a row gives an on-demand point and, when
  ``spot_usd_per_hour`` is filled, a spot point (source ``gcp-history``).
- ``list-prices``: the curated ``list_prices.csv`` (:func:`pricing.catalog.load_list_prices`).
- ``gcp-skus-page``: a Cloud Billing Catalog ``services.skus.list`` response saved as a file (what the live
  GCP collector fetches), read by the collector's own :func:`pricing.gcp.parse_skus_page` and composed by
  :func:`pricing.gcp.compose_prices` (source ``gcp``). The pages met while walking a folder are one
  listing (a VM's core, RAM and GPU SKUs may lie on different pages): read together, composed once, all
  or nothing for the listing; a page named explicitly is composed alone.
- ``azure-retail-page``: an Azure Retail Prices API page (``{"Items": [...], "NextPageLink": ...}``) saved
  as a file, read by the live collector's :func:`pricing.azure.parse_retail_page` (source ``azure``); a
  ``retailPrice`` of 0, Windows, Low Priority and unknown sizes are skipped as by the collector.

Anything else is refused with :class:`~costopt.errors.NotPriceData` (a README, a throughput JSON, the
GCP launch probes whose "price" is a formula, logs, the instance catalog or mapping).

Contract: each file is all-or-nothing. It is parsed completely and strictly first (JSON: a key given
twice with different values, or ``NaN``/``Infinity``, make the file malformed); a structural
problem raises :class:`~costopt.errors.MalformedInput`, any invalid record raises
:class:`~costopt.errors.BadRecord` naming the file, the line (CSV) or record index (JSON) and the
reason, and nothing of that file is stored. Parsed points then pass :func:`pricing.screen.screen_frame`
(zero, absurd per GPU-hour, future times, odd names, unknown regions, conflicting prices): one refused
point refuses the file. Every refused file is logged and counted in ``source_status`` under
``import:<kind>`` (``costopt prices sources`` shows it). A good file is written with one ``store.write`` (one
transaction); the instance types it reveals are then added when the store does not know them yet
(a richer catalog row is never overwritten). Importing the same data again inserts nothing.
Empty prices mean "not offered" and are counted in ``skipped_records``.
"""

from __future__ import annotations

import codecs
import csv
import fnmatch
import io
import json
import logging
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pandas as pd

from costopt.domain import (
    KNOWN_ACCELERATORS,
    MAX_SANE_USD_PER_HOUR,
    Cloud,
    InstanceType,
    Market,
    OfferKey,
    PricePoint,
    normalize_accelerator,
)
from costopt.errors import BadRecord, MalformedInput, NotPriceData
from costopt.registry import Registry, UnknownName
from pricing.aws_pages import LINUX_PRODUCTS, parse_spot_page, region_of_zone
from pricing.azure import lookup_size, parse_retail_page
from pricing.azure_sheets import (
    SHEET_REGIONS,
    SHEET_SOURCE,
    SPIKE_FACTOR,
    find_spikes,
    load_instance_mapping,
    parse_azure_sheet,
    sheet_size_to_arm,
)
from pricing.base import Problems, strict_json
from pricing.catalog import INSTANCE_COLUMNS, LIST_PRICES_FILE, PRICE_COLUMNS, load_list_prices
from pricing.ingest import KEY_COLUMNS
from pricing.screen import gpu_counts, price_faults, screen_frame, screen_types
from pricing.store import IMPORT_SOURCE_PREFIX, PriceStore, points_frame

log = logging.getLogger("costopt.pricing.importer")

# ----------------------------------------------------------------------------------------- kinds

AWS_PAGE = "aws-spot-page"
AWS_CSV = "aws-spot-csv"
AZURE_SHEET = "azure-sheet"
AZURE_CSV = "azure-daily-csv"
GCP_CSV = "gcp-history-csv"
LIST_PRICES = "list-prices"
GCP_PAGE = "gcp-skus-page"
AZURE_PAGE = "azure-retail-page"

AWS_SOURCE = "aws-spot"
GCP_SOURCE = "gcp-history"
LIST_SOURCE = "list-price"
GCP_PAGE_SOURCE = "gcp"
AZURE_PAGE_SOURCE = "azure"

AWS_CSV_COLUMNS = (
    "timestamp_utc",
    "region",
    "availability_zone",
    "instance_type",
    "gpu_type",
    "gpu_count",
    "product_description",
    "spot_usd_per_hour",
)
AZURE_CSV_COLUMNS = ("date", "region", "vm_size", "gpu_type", "gpu_count", "spot_usd_per_hour")
GCP_CSV_COLUMNS = (
    "snapshot_utc",
    "source_commit",
    "machine_type",
    "gpu_type",
    "gpu_count",
    "region",
    "ondemand_usd_per_hour",
    "spot_usd_per_hour",
)
PROBE_COLUMNS = ("probe_time_utc", "zone", "gpu_type", "gpu_count", "preemptible_usd_per_hour")
MAPPING_COLUMNS = ("Instance", "GPU type", "# GPUs")
MAPPING_FILE = "instance_mapping.csv"

PROBES_REASON = (
    "GCP preemptible launch probes: the printed price is a formula of the collecting script "
    "(GPUs x a fixed per-GPU rate x 1.15, no VM part), not an observed instance price; a row only "
    "says that a launch succeeded (availability data)"
)

Status = Literal["imported", "partial", "skipped", "refused", "failed"]

_HEAD_BYTES = 64 * 1024
_ISO_TIME = re.compile(r"^\d{4}-\d{2}-\d{2}(?:[T ]\d{2}:\d{2}(?::\d{2}(?:\.\d{1,9})?)?(?:[Zz]|[+-]\d{2}:?\d{2})?)?$")
_ISO_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}$")
_SHEET_SIZE = re.compile(r"^[A-Z][A-Za-z]*\d+[A-Za-z0-9]*(?: [A-Za-z0-9]+)*$")
_TEXT_KINDS = {".md": "a Markdown document", ".txt": "a text file", ".out": "a log file", ".log": "a log file"}


# ----------------------------------------------------------------------------------------- reports


@dataclass(frozen=True, slots=True)
class ImportReport:
    """What importing one file did.

    ``status``: ``imported``; ``partial`` (imported, but the file itself is cut short, e.g. an AWS
    page with a ``NextToken``); ``skipped`` (not price data, met while walking a folder; not an
    error); ``refused`` (not price data, named explicitly); ``failed`` (malformed file or bad record:
    nothing of it was stored). ``points_read``: price points parsed; ``inserted``: new change points;
    ``unchanged``: points that repeated the price in effect; ``skipped_records``: empty prices ("not
    offered") and non-Linux AWS records. ``warnings``: kept-but-suspicious data (price spikes, a cut
    page, corrected prices).
    """

    path: Path
    kind: str
    status: Status
    points_read: int = 0
    inserted: int = 0
    unchanged: int = 0
    skipped_records: int = 0
    error: str | None = None
    warnings: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Detected:
    """A file's kind. ``refusal``: why it is not price data; ``malformed``: why it cannot be read."""

    path: Path
    kind: str
    refusal: str | None = None
    malformed: str | None = None
    payload: Any = None  # the parsed JSON of a page


@dataclass
class _Parsed:
    """A fully validated file, ready to write."""

    points: pd.DataFrame
    types: list[InstanceType]
    skipped: int = 0
    partial: bool = False
    warnings: list[str] = field(default_factory=list)
    warnings_logged: bool = False  # the parser logged them already


class UnknownFileKind(UnknownName):
    """A file kind name that is not registered; the message lists the known kinds."""


@dataclass(frozen=True, slots=True)
class FileKind:
    """One kind of recorded price file: how it is told apart and how it is parsed.

    A CSV kind is told by its exact ``header`` (any column order) or, for kinds told by the header's
    shape (the Azure sheets: ``Date`` then size names), by ``header_shape``; a JSON kind by
    ``json_shape`` on the parsed document, ``json_problem`` saying why a claimed document is malformed
    (None: it is not). ``file_pattern`` is the usual file name (a glob), used to name the kind a CSV
    with a wrong header was probably meant to be. ``parse`` parses strictly (all or nothing).
    ``confirmed_at_file_time``: the file is an answer taken at one time, vouching for every price in it
    as of then (see :func:`_confirmed_at_file_time`); otherwise each record keeps its own time.
    """

    name: str
    description: str
    parse: Callable[[Detected], _Parsed]
    header: tuple[str, ...] | None = None
    header_shape: Callable[[list[str]], bool] | None = None
    json_shape: Callable[[Any], bool] | None = None
    json_problem: Callable[[Any], str | None] | None = None
    file_pattern: str | None = None
    confirmed_at_file_time: bool = False


KINDS: Registry[FileKind] = Registry("price file kind", error=UnknownFileKind)
"""The kinds of file the importer loads (registered below, after their parsers); any other file is
refused as not price data."""


def _csv_headers() -> dict[str, tuple[str, ...]]:
    """The exact header of each CSV kind told by its header."""
    return {name: kind.header for name, kind in KINDS.items() if kind.header is not None}


# ----------------------------------------------------------------------------------------- detection


def _describe_text(path: Path, first_line: str) -> str:
    what = _TEXT_KINDS.get(path.suffix.lower())
    if what is None:
        what = "a license text" if "license" in path.name.lower() else "a text file"
    line = first_line.strip()
    shown = line if len(line) <= 70 else line[:67] + "..."
    return f"{what} (first line: {shown!r})"


def _refuse(path: Path, kind: str, what: str) -> Detected:
    return Detected(path, kind, refusal=f"{path}: not price data: {what}")


def _detect_json(path: Path) -> Detected:
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8-sig")
        obj = strict_json(text)
    except MalformedInput as exc:
        return Detected(path, "json", malformed=f"{path}: {exc}")
    except UnicodeDecodeError as exc:
        return Detected(path, "json", malformed=f"{path}: not UTF-8 JSON text ({exc.reason} at byte {exc.start})")
    except json.JSONDecodeError as exc:
        cut = exc.pos >= len(text.rstrip()) or (
            exc.msg.startswith("Unterminated string") and "\n" not in text[exc.pos :].rstrip()
        )
        why = "the file ends early (truncated?)" if cut else "not valid JSON"
        return Detected(path, "json", malformed=f"{path}: {why}: {exc.msg} at line {exc.lineno} column {exc.colno}")
    for name, kind in KINDS.items():
        if kind.json_shape is not None and kind.json_shape(obj):
            problem = kind.json_problem(obj) if kind.json_problem is not None else None
            if problem is not None:
                return Detected(path, name, malformed=f"{path}: {problem}")
            return Detected(path, name, payload=obj)
    if isinstance(obj, dict) and obj and all(normalize_accelerator(str(k)) in KNOWN_ACCELERATORS for k in obj):
        gpus = ", ".join(sorted(str(k) for k in obj))
        return _refuse(
            path, "throughput-json", f"JSON keyed by GPU type ({gpus}): looks like a throughput file, not prices"
        )
    if isinstance(obj, dict):
        keys = ", ".join(sorted(str(k) for k in obj)[:8])
        shape = f"a JSON object with keys [{keys}]"
    else:
        shape = f"a JSON {type(obj).__name__}"
    return _refuse(
        path,
        "json",
        f"{shape}, not a price page (known: a describe-spot-price-history page with 'SpotPriceHistory', a "
        "Cloud Billing Catalog page with 'skus', an Azure Retail Prices page with 'Items')",
    )


def _looks_like_sheet(header: Sequence[str]) -> bool:
    return len(header) > 1 and header[0] == "Date" and all(_SHEET_SIZE.match(c) for c in header[1:])


def _near_kind(path: Path, header: list[str]) -> str | None:
    """The price kind a CSV with an unknown header was probably meant to be (by name or columns)."""
    headers = _csv_headers()
    for name in headers:
        pattern = KINDS.get(name).file_pattern
        if pattern is not None and fnmatch.fnmatch(path.name.lower(), pattern):
            return name
    cols = set(header)
    best = max(headers.items(), key=lambda kv: len(cols & set(kv[1])) / len(kv[1]))
    return best[0] if len(cols & set(best[1])) * 2 >= len(best[1]) else None


def _detect_csv(path: Path, header: list[str]) -> Detected | None:
    """The kind of a file whose first line is ``header`` (None: not a known CSV header)."""
    cols = frozenset(header)
    if len(cols) == len(header):
        for name, expected in _csv_headers().items():
            if frozenset(expected) == cols:
                return Detected(path, name)
    if tuple(header) == PROBE_COLUMNS:
        return _refuse(path, "gcp-probes", PROBES_REASON)
    if tuple(header) == INSTANCE_COLUMNS:
        return _refuse(path, "instance-catalog", "the curated instance catalog (instance shapes, no prices)")
    if tuple(header[:3]) == MAPPING_COLUMNS:
        return _refuse(
            path, "azure-mapping", "the Azure sheets' size -> GPU mapping (read when importing the sheets beside it)"
        )
    for name, kind in KINDS.items():
        if kind.header_shape is not None and kind.header_shape(header):
            return Detected(path, name)
    return None


def detect(path: Path) -> Detected:
    """Tell a file's kind from its content (see the module docstring). Never raises for bad content;
    raises ``OSError`` when the file cannot be read."""
    with path.open("rb") as fh:
        head = fh.read(_HEAD_BYTES)
    suffix = path.suffix.lower()
    if not head.strip():
        if suffix in (".json", ".csv"):
            return Detected(path, suffix[1:], malformed=f"{path}: empty file")
        return _refuse(path, "empty", "an empty file")
    if b"\x00" in head:
        if suffix in (".json", ".csv"):
            return Detected(path, suffix[1:], malformed=f"{path}: binary content, not {suffix[1:].upper()} text")
        return _refuse(path, "binary", "a binary file")
    try:
        text = codecs.getincrementaldecoder("utf-8-sig")().decode(head, final=len(head) < _HEAD_BYTES)
    except UnicodeDecodeError as exc:
        if suffix in (".json", ".csv"):
            return Detected(path, suffix[1:], malformed=f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})")
        return _refuse(path, "binary", "a binary file (not UTF-8 text)")
    starts_json = text.lstrip()[:1] in ("{", "[")
    if suffix == ".json":
        return _detect_json(path)
    if starts_json:
        found = _detect_json(path)
        if found.malformed is None:
            return found
    first_line = text.splitlines()[0] if text else ""
    try:
        header = [h.strip() for h in next(csv.reader([first_line]), [])]
    except csv.Error:
        header = []
    if len(header) > 1:
        found_csv = _detect_csv(path, header)
        if found_csv is not None:
            return found_csv
        if suffix == ".csv":
            near = _near_kind(path, header)
            if near is not None:
                expected = ",".join(_csv_headers()[near])
                return Detected(
                    path, near, malformed=f"{path}: wrong header {','.join(header)!r} for {near}; expected {expected!r}"
                )
            known = "; ".join(",".join(h) for h in _csv_headers().values())
            return _refuse(
                path, "csv", f"a CSV with columns {','.join(header[:10])!r}, not a known price format (known: {known})"
            )
    if suffix == ".csv":
        return Detected(path, "csv", malformed=f"{path}: not a CSV file (first line {first_line[:70]!r})")
    return _refuse(path, "text", _describe_text(path, first_line))


def detect_kind(path: Path) -> str:
    """The kind of a price file (one of :data:`PRICE_KINDS`).

    Raises :class:`NotPriceData` for a file that is not price data and :class:`MalformedInput` for one
    that cannot be read as its kind.
    """
    found = detect(path)
    if found.malformed is not None:
        raise MalformedInput(found.malformed)
    if found.refusal is not None:
        raise NotPriceData(found.refusal)
    return found.kind


# ----------------------------------------------------------------------------------------- strict CSV reading


@dataclass
class _Table:
    """A CSV's cells by column (stripped text, object arrays) and each row's line number."""

    columns: dict[str, np.ndarray]
    lines: np.ndarray

    def __getitem__(self, name: str) -> np.ndarray:
        return self.columns[name]

    def __len__(self) -> int:
        return len(self.lines)


def _read_table(path: Path, columns: Sequence[str]) -> _Table:
    """Read a CSV whose header holds exactly ``columns`` (any order). Blank lines are ignored; a row
    with the wrong number of fields is a :class:`BadRecord` naming its line."""
    try:
        text = path.read_bytes().decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise MalformedInput(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from exc
    reader = csv.reader(io.StringIO(text, newline=""))
    try:
        header = [h.strip() for h in next(reader, [])]
    except csv.Error as exc:
        raise MalformedInput(f"{path}: not a CSV file ({exc})") from exc
    if sorted(header) != sorted(columns):
        raise MalformedInput(f"{path}: wrong header {','.join(header)!r}; expected {','.join(columns)!r}")
    width = len(header)
    rows: list[list[str]] = []
    lines: list[int] = []
    try:
        for cells in reader:
            if not cells:
                continue
            if len(cells) != width:
                raise BadRecord(
                    f"{path}: line {reader.line_num}: expected {width} fields ({','.join(header)}), got {len(cells)}"
                )
            rows.append(cells)
            lines.append(reader.line_num)
    except csv.Error as exc:
        raise BadRecord(f"{path}: line {reader.line_num}: unreadable CSV row ({exc})") from exc
    by_col = list(zip(*rows, strict=True)) if rows else [() for _ in header]
    data = {
        name: pd.Series(np.asarray(by_col[i], dtype=object), dtype=object).str.strip().to_numpy(dtype=object)
        for i, name in enumerate(header)
    }
    return _Table(data, np.asarray(lines, dtype=np.int64))


class _Checks:
    """Vectorized strict validation of a table; collects the first problem of each check and raises
    the earliest (by line) with the total number of bad rows."""

    def __init__(self, path: Path, table: _Table) -> None:
        self.path = path
        self.table = table
        self.bad = np.zeros(len(table), dtype=bool)
        self.first: list[tuple[int, str]] = []

    def flag(self, mask: np.ndarray, reason: Callable[[int], str]) -> None:
        """Mark rows of ``mask`` bad; ``reason(i)`` explains row ``i``."""
        idx = np.flatnonzero(mask)
        if len(idx):
            self.bad |= mask
            self.first.append((int(idx[0]), reason(int(idx[0]))))

    def raise_if_bad(self) -> None:
        if not self.first:
            return
        i, why = min(self.first)
        raise BadRecord.first_of(f"{self.path}: line {int(self.table.lines[i])}: {why}", int(self.bad.sum()))

    def text(self, name: str) -> np.ndarray:
        values = self.table[name]
        self.flag(values == "", lambda _: f"missing {name}")
        return values

    def number(self, name: str, *, optional: bool = False, price: bool = False) -> np.ndarray:
        """Floats of column ``name`` (NaN where empty and ``optional``). Prices must be within
        (0, MAX_SANE_USD_PER_HOUR] (zero is not a price; empty is "not offered"); other numbers (GPU
        counts) must be positive."""
        raw = self.table[name]
        empty = raw == ""
        values = pd.to_numeric(pd.Series(raw, dtype=object), errors="coerce").to_numpy(dtype=np.float64, copy=True)
        if not optional:
            self.flag(empty, lambda _: f"missing {name}")
        faulty = (price_faults(values) != "") if price else (~np.isfinite(values) | (values <= 0))
        wrong = ~empty & faulty
        self.flag(wrong, lambda i: _number_reason(name, str(raw[i]), float(values[i]), price=price))
        values[empty] = np.nan
        return values

    def time(self, name: str, *, date_only: bool = False) -> pd.Series:
        """UTC times of column ``name`` (ISO 8601; a bare date is that UTC day's 00:00)."""
        raw = self.table[name]
        pattern = _ISO_DATE if date_only else _ISO_TIME
        shaped = pd.Series(raw, dtype=object).str.fullmatch(pattern).to_numpy(dtype=bool)
        candidates = raw.copy()
        candidates[~shaped] = None
        parsed: pd.Series = pd.to_datetime(pd.Series(candidates), format="ISO8601", utc=True, errors="coerce")
        expected = "YYYY-MM-DD" if date_only else "ISO 8601, e.g. 2020-01-03T15:15:54Z"
        self.flag(raw == "", lambda _: f"missing {name}")
        self.flag(
            (raw != "") & parsed.isna().to_numpy(),
            lambda i: f"unknown timestamp format in {name}: {raw[i]!r} (expected {expected})",
        )
        return parsed

    def each(self, name: str, values: np.ndarray, convert: Callable[[str], str]) -> np.ndarray:
        """Apply ``convert`` to each distinct value; a :class:`BadRecord` flags the rows holding it."""
        uniq, inverse = np.unique(values.astype(str), return_inverse=True)
        out = np.empty(len(uniq), dtype=object)
        failed = np.zeros(len(uniq), dtype=bool)
        reasons: dict[int, str] = {}
        for j, value in enumerate(uniq.tolist()):
            if not value:
                out[j] = ""
                continue
            try:
                out[j] = convert(value)
            except BadRecord as exc:
                failed[j] = True
                reasons[j] = f"{name}: {exc}"
        self.flag(failed[inverse], lambda i: reasons[int(inverse[i])])
        return np.asarray(out[inverse], dtype=object)


def _number_reason(name: str, raw: str, value: float, *, price: bool) -> str:
    if np.isnan(value) and raw.strip().lower() != "nan":
        return f"{name} is not a number: {raw!r}"
    if np.isnan(value):
        return f"{name} is NaN"
    if not price:
        return f"{name} must be a positive number, got {raw!r}"
    if value < 0:
        return f"negative price in {name}: {raw}"
    if value == 0:
        return f"price of zero in {name}: not a price (leave the cell empty for 'not offered')"
    return f"absurd price in {name}: {raw} USD/h (above {MAX_SANE_USD_PER_HOUR:g})"


def _frame(
    cloud: Cloud,
    region: np.ndarray,
    zone: np.ndarray | str,
    instance_type: np.ndarray,
    market: Market,
    valid_from: pd.Series,
    price: np.ndarray,
    source: str,
) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "cloud": cloud.value,
            "region": region,
            "zone": zone,
            "instance_type": instance_type,
            "market": market.value,
            "valid_from": valid_from.reset_index(drop=True),
            "usd_per_hour": price,
            "source": source,
        }
    )


def _check_conflicts(path: Path, frame: pd.DataFrame, lines: np.ndarray | None) -> None:
    """Refuse a file holding two different prices for one offer at one time."""
    cols = [*KEY_COLUMNS, "valid_from"]
    dup = frame.duplicated(cols, keep=False).to_numpy()
    if not dup.any():
        return
    sub = frame[dup].assign(_line=lines[dup] if lines is not None else 0)
    n_prices = sub.groupby(cols, sort=False)["usd_per_hour"].transform("nunique")
    clash = sub[n_prices.to_numpy() > 1]
    if clash.empty:
        return
    first = clash.sort_values("_line").iloc[0]
    twins = clash[(clash[cols] == first[cols]).all(axis=1)]
    prices = ", ".join(f"{p:g}" for p in sorted(set(twins["usd_per_hour"])))
    if lines is not None:
        where = f"line {int(first['_line'])} (and line {int(twins['_line'].iloc[1])})"
    else:
        where = f"{len(twins)} records"
    raise BadRecord(
        f"{path}: {where}: {first['zone'] or first['region']} {first['instance_type']} {first['market']} at "
        f"{first['valid_from']} has several prices ({prices})"
    )


def _shapes(
    path: Path,
    lines: np.ndarray,
    cloud: Cloud,
    names: np.ndarray,
    gpu_type: np.ndarray,
    gpu_count: np.ndarray,
    times: pd.Series,
    source: str,
    *,
    sizes: Callable[[str], tuple[int | None, float | None]] | None = None,
) -> tuple[list[InstanceType], list[str]]:
    """The instance types of a validated table (rows with a GPU type and count). A type whose GPUs
    change along the file (a history relabelled, e.g. ``a2-ultragpu-1g`` a100 -> a100-80gb) takes
    its newest row's and is listed in the warnings."""
    frame = pd.DataFrame(
        {"name": names, "gpu": gpu_type, "gpus": gpu_count, "line": lines, "t": times.reset_index(drop=True)}
    ).sort_values(["t", "line"], kind="stable")
    frame = frame[(frame["name"] != "") & (frame["gpu"] != "") & frame["gpus"].notna()]
    frame["gpu"] = frame["gpu"].map(normalize_accelerator)
    distinct = frame.drop_duplicates(["name", "gpu", "gpus"], keep="last")
    warnings = []
    for name, group in distinct[distinct["name"].duplicated(keep=False)].groupby("name", sort=True):
        seen = "; ".join(f"{r.gpu} x {r.gpus:g} (last on line {r.line})" for r in group.itertuples())
        warnings.append(f"{path.name}: {name} changes GPUs along the file: {seen}; the newest is kept")
    out = []
    newest = distinct.drop_duplicates("name", keep="last")
    for name, gpu, gpus in zip(newest["name"].tolist(), newest["gpu"].tolist(), newest["gpus"].tolist(), strict=True):
        vcpus, memory = sizes(str(name)) if sizes is not None else (None, None)
        out.append(InstanceType(cloud, str(name), str(gpu), float(gpus), vcpus, memory, source))
    return out, warnings


def _azure_size(arm: str) -> tuple[int | None, float | None]:
    known = lookup_size(arm)
    return (known[1].vcpus, known[1].memory_gib) if known else (None, None)


# ----------------------------------------------------------------------------------------- parsers


def _parse_aws_page(found: Detected) -> _Parsed:
    path = found.path
    page = parse_spot_page(found.payload, source=AWS_SOURCE, where=f"{path}:")
    _bad_problems(page.problems)
    records = len(found.payload["SpotPriceHistory"])
    frame = points_frame(page.points)
    _check_conflicts(path, frame, None)
    warnings = []
    if page.next_token:
        warnings.append(
            f"{path.name}: the page has a NextToken: AWS had more records than this page holds "
            f"({records} read); the series is cut at its oldest record"
        )
    return _Parsed(frame, [], skipped=records - len(page.points), partial=bool(page.next_token), warnings=warnings)


def _parse_aws_csv(path: Path) -> _Parsed:
    table = _read_table(path, AWS_CSV_COLUMNS)
    chk = _Checks(path, table)
    valid_from = chk.time("timestamp_utc")
    region = chk.text("region")
    zone = chk.text("availability_zone")
    itype = chk.text("instance_type")
    gpu_type = chk.text("gpu_type")
    gpu_count = chk.number("gpu_count")
    product = chk.text("product_description")
    price = chk.number("spot_usd_per_hour", price=True)
    zone_region = chk.each("availability_zone", zone, region_of_zone)
    chk.flag(
        (zone_region != "") & (region != "") & (zone_region != region),
        lambda i: f"availability_zone {zone[i]} is not in region {region[i]}",
    )
    chk.raise_if_bad()
    types, warnings = _shapes(path, table.lines, Cloud.AWS, itype, gpu_type, gpu_count, valid_from, AWS_SOURCE)
    linux = np.isin(product, list(LINUX_PRODUCTS))
    frame = _frame(Cloud.AWS, region, zone, itype, Market.SPOT, valid_from, price, AWS_SOURCE)[linux]
    _check_conflicts(path, frame.reset_index(drop=True), table.lines[linux])
    return _Parsed(frame.reset_index(drop=True), types, skipped=int((~linux).sum()), warnings=warnings)


def _parse_azure_csv(path: Path) -> _Parsed:
    table = _read_table(path, AZURE_CSV_COLUMNS)
    chk = _Checks(path, table)
    day = chk.time("date", date_only=True)
    region = chk.text("region")
    size = chk.text("vm_size")
    gpu_type = chk.text("gpu_type")
    gpu_count = chk.number("gpu_count")
    price = chk.number("spot_usd_per_hour", optional=True, price=True)
    arm = chk.each("vm_size", size, sheet_size_to_arm)
    chk.raise_if_bad()
    types, warnings = _shapes(
        path, table.lines, Cloud.AZURE, arm, gpu_type, gpu_count, day, SHEET_SOURCE, sizes=_azure_size
    )
    offered = ~np.isnan(price)
    frame = _frame(Cloud.AZURE, region, "", arm, Market.SPOT, day, price, SHEET_SOURCE)[offered]
    frame = frame.reset_index(drop=True)
    lines = table.lines[offered]
    _check_conflicts(path, frame, lines)
    warnings += _spike_warnings(path, frame, lines)
    return _Parsed(frame, types, skipped=int((~offered).sum()), warnings=warnings)


def _spike_warnings(path: Path, frame: pd.DataFrame, lines: np.ndarray) -> list[str]:
    """Prices over ``SPIKE_FACTOR`` x both neighbouring days (kept as recorded, flagged)."""
    series: dict[tuple[str, str], list[tuple[PricePoint, str]]] = {}
    columns = (frame[c].tolist() for c in ("region", "instance_type", "valid_from", "usd_per_hour"))
    for region, itype, day, usd, line in zip(*columns, lines.tolist(), strict=True):
        key = OfferKey(Cloud.AZURE, str(region), "", str(itype), Market.SPOT)
        point = PricePoint(key, day, float(usd), SHEET_SOURCE)
        series.setdefault((key.region, key.instance_type), []).append((point, f"{path.name} line {line}"))
    warnings = []
    for name in sorted(series):
        ordered = sorted(series[name], key=lambda pw: pw[0].valid_from)
        for s in find_spikes(ordered):
            warnings.append(
                _spike_text(s.where, s.key, s.valid_from, s.usd_per_hour, s.previous_usd_per_hour, s.next_usd_per_hour)
            )
    return warnings


def _spike_text(where: str, key: OfferKey, day: datetime, usd: float, prev: float, nxt: float) -> str:
    return (
        f"{where}: {key.region} {key.instance_type} on {day.date()} costs {usd:g} USD/h, over {SPIKE_FACTOR:g} x both "
        f"neighbouring days ({prev:g}, {nxt:g}): kept as recorded, check it"
    )


def _parse_azure_sheet(path: Path) -> _Parsed:
    candidates = [path.parent / MAPPING_FILE, path.parent.parent / MAPPING_FILE]
    mapping_path = next((p for p in candidates if p.is_file()), None)
    if mapping_path is None:
        raise MalformedInput(
            f"{path}: an Azure price sheet needs {MAPPING_FILE} (sheet size -> GPU type and count) in the "
            f"folder above it; expected {candidates[1]}"
        )
    if path.stem not in SHEET_REGIONS:
        raise MalformedInput(
            f"{path}: looks like an Azure price sheet, but its region is not known from its name "
            f"(expected one of {', '.join(s + '.csv' for s in SHEET_REGIONS)})"
        )
    mapping = load_instance_mapping(mapping_path)
    sheet = parse_azure_sheet(path, mapping, strict=True)
    warnings = [
        _spike_text(s.where, s.key, s.valid_from, s.usd_per_hour, s.previous_usd_per_hour, s.next_usd_per_hour)
        for s in sheet.spikes
    ]
    frame = points_frame(sheet.points)
    return _Parsed(
        frame, list(sheet.instance_types), skipped=sheet.problems.skipped, warnings=warnings, warnings_logged=True
    )


def _parse_gcp_csv(path: Path) -> _Parsed:
    table = _read_table(path, GCP_CSV_COLUMNS)
    chk = _Checks(path, table)
    snapshot = chk.time("snapshot_utc")
    machine = chk.text("machine_type")
    gpu_type = chk.text("gpu_type")
    gpu_count = chk.number("gpu_count", optional=True)  # empty for fractional-GPU shapes
    region = chk.text("region")
    on_demand = chk.number("ondemand_usd_per_hour", price=True)
    spot = chk.number("spot_usd_per_hour", optional=True, price=True)  # empty before spot existed
    chk.raise_if_bad()
    types, warnings = _shapes(path, table.lines, Cloud.GCP, machine, gpu_type, gpu_count, snapshot, GCP_SOURCE)
    has_spot = ~np.isnan(spot)
    frame = pd.concat(
        [
            _frame(Cloud.GCP, region, "", machine, Market.ON_DEMAND, snapshot, on_demand, GCP_SOURCE),
            _frame(Cloud.GCP, region, "", machine, Market.SPOT, snapshot, spot, GCP_SOURCE)[has_spot],
        ],
        ignore_index=True,
    )
    _check_conflicts(path, frame, np.concatenate([table.lines, table.lines[has_spot]]))
    return _Parsed(frame, types, skipped=int((~has_spot).sum()), warnings=warnings)


def _parse_list_prices(path: Path) -> _Parsed:
    return _Parsed(points_frame(load_list_prices(path, source=LIST_SOURCE)), [])


def _bad_problems(problems: Problems) -> None:
    """Raise the first bad record of a page parsed by a live collector's parser (all or nothing)."""
    if problems.bad:
        raise BadRecord.first_of(problems.reasons[0], problems.bad)


def _parse_gcp_listing(founds: Sequence[Detected]) -> _Parsed:
    """The pages of one Cloud Billing Catalog listing (one file, or the pages of one folder) read together
    and composed once: a VM's core, RAM and GPU SKUs may lie on different pages. All or nothing: a bad
    record on any page refuses every page. Partial when every page has a ``nextPageToken`` (the last
    page is missing)."""
    from pricing.gcp import SHAPES_BY_NAME, ComponentPrices, compose_prices, parse_skus_page  # SDK: when needed

    components = ComponentPrices()
    problems = Problems(GCP_PAGE_SOURCE)
    tokens = []
    for found in founds:
        _, _, token = parse_skus_page(
            found.payload, source=GCP_PAGE_SOURCE, where=f"{found.path}:", components=components, problems=problems
        )
        tokens.append(token)
    points = compose_prices(components, None, None, problems, source=GCP_PAGE_SOURCE)
    _bad_problems(problems)
    frame = points_frame(points)
    names = sorted({p.key.instance_type for p in points})
    types = [SHAPES_BY_NAME[n].instance_type() for n in names if n in SHAPES_BY_NAME]
    warnings = []
    partial = all(tokens)
    if partial:
        what = "the page has" if len(founds) == 1 else f"each of the {len(founds)} pages has"
        warnings.append(f"{founds[-1].path.name}: {what} a nextPageToken: the catalog continues on a page not given")
    return _Parsed(frame, types, skipped=problems.skipped, partial=partial, warnings=warnings)


def _parse_gcp_page(found: Detected) -> _Parsed:
    return _parse_gcp_listing([found])


def _parse_azure_page(found: Detected) -> _Parsed:
    path = found.path
    page = parse_retail_page(found.payload, source=AZURE_PAGE_SOURCE, where=f"{path}:")
    _bad_problems(page.problems)
    frame = points_frame(page.points)
    _check_conflicts(path, frame, None)
    warnings = []
    if page.next_token:
        warnings.append(f"{path.name}: the page has a NextPageLink: the answer continues on another page")
    return _Parsed(
        frame.drop_duplicates(ignore_index=True),
        page.instance_types,
        skipped=page.problems.skipped,
        partial=bool(page.next_token),
        warnings=warnings,
    )


_NAME_DATE = re.compile(r"^(\d{4}-\d{2}-\d{2})\.")


def _confirmed_at_file_time(parsed: _Parsed, path: Path) -> _Parsed:
    """A recorded answer vouches for every price in it as of when it was taken: the newest record
    time in the file, or the date in its name (``2020-03-23.p3.2xlarge.json``) when later. (An API
    answer lists the price in effect of every key it names; this is the confirmation rule of
    imported snapshots. Sources that record every observation, like the daily Azure sheets, keep
    each record's own time instead.)"""
    frame = parsed.points
    if frame.empty:
        return parsed
    taken = pd.Timestamp(frame["valid_from"].max())
    m = _NAME_DATE.match(path.name)
    if m is not None:
        taken = max(taken, pd.Timestamp(m.group(1), tz="UTC"))
    frame = frame.copy()
    frame["observed_at"] = taken
    parsed.points = frame
    return parsed


def _parse(found: Detected) -> _Parsed:
    """Parse a file :func:`detect` found well-formed price data (its kind is a registered one)."""
    kind = KINDS.get(found.kind)
    parsed = kind.parse(found)
    return _confirmed_at_file_time(parsed, found.path) if kind.confirmed_at_file_time else parsed


# ----------------------------------------------------------------------------------------- the kinds


def _spot_page_problem(obj: Any) -> str | None:
    return None if isinstance(obj["SpotPriceHistory"], list) else "'SpotPriceHistory' is not a list"


def _list_problem(name: str) -> Callable[[Any], str | None]:
    return lambda obj: None if isinstance(obj[name], list) else f"{name!r} is not a list"


for _kind in (
    FileKind(
        AWS_PAGE,
        "a raw describe-spot-price-history JSON page (a NextToken: imported, reported partial)",
        _parse_aws_page,
        json_shape=lambda obj: isinstance(obj, dict) and "SpotPriceHistory" in obj,
        json_problem=_spot_page_problem,
        confirmed_at_file_time=True,
    ),
    FileKind(
        AWS_CSV,
        "the normalized AWS spot history (one row = one price change)",
        lambda found: _parse_aws_csv(found.path),
        header=AWS_CSV_COLUMNS,
        file_pattern="aws_spot_price_history*.csv",
        confirmed_at_file_time=True,
    ),
    FileKind(
        AZURE_SHEET,
        "a hand-collected Azure sheet (Date,<size>,...; instance_mapping.csv in the folder above)",
        lambda found: _parse_azure_sheet(found.path),
        header_shape=_looks_like_sheet,
    ),
    FileKind(
        AZURE_CSV,
        "the normalized Azure daily prices",
        lambda found: _parse_azure_csv(found.path),
        header=AZURE_CSV_COLUMNS,
        file_pattern="azure_spot_price_daily*.csv",
    ),
    # The GCP history records change points only (removals are not recorded): every key is taken to be
    # offered still at the file's last snapshot.
    FileKind(
        GCP_CSV,
        "GCP GPU VM price change points (on-demand, and spot when filled)",
        lambda found: _parse_gcp_csv(found.path),
        header=GCP_CSV_COLUMNS,
        file_pattern="gcp_gpu_vm_prices_history*.csv",
        confirmed_at_file_time=True,
    ),
    FileKind(
        LIST_PRICES,
        "the curated list prices (data/catalog/list_prices.csv)",
        lambda found: _parse_list_prices(found.path),
        header=PRICE_COLUMNS,
        file_pattern="list_prices*.csv",
    ),
    FileKind(
        GCP_PAGE,
        "a Cloud Billing Catalog skus page as the GCP collector fetches it (a nextPageToken: reported partial)",
        _parse_gcp_page,
        json_shape=lambda obj: isinstance(obj, dict) and "skus" in obj,
        json_problem=_list_problem("skus"),
        confirmed_at_file_time=True,
    ),
    FileKind(
        AZURE_PAGE,
        "an Azure Retail Prices API page as the Azure collector fetches it (a NextPageLink: reported partial)",
        _parse_azure_page,
        json_shape=lambda obj: isinstance(obj, dict) and "Items" in obj,
        json_problem=_list_problem("Items"),
        confirmed_at_file_time=True,
    ),
):
    KINDS.register(_kind.name, _kind)

PRICE_KINDS: frozenset[str] = frozenset(KINDS.names())
"""The kinds of file the importer loads; any other kind is refused as not price data."""


def _named(path: Path, exc: BadRecord | MalformedInput) -> BadRecord | MalformedInput:
    """The same error, its message prefixed with the file's path when it does not name it yet."""
    msg = str(exc)
    if str(path) in msg:
        return exc
    if isinstance(exc, BadRecord):
        return BadRecord(f"{path}: {msg}", count=exc.count)
    return type(exc)(f"{path}: {msg}")


# ----------------------------------------------------------------------------------------- import


def _screen(store: PriceStore, path: Path, parsed: _Parsed, gpus: dict[tuple[str, str], float]) -> None:
    """Refuse the file (:class:`BadRecord`) when any of its points or shapes breaks a rule of
    :func:`pricing.screen.screen_frame` / :func:`pricing.screen.screen_types`."""
    types, refused_types = screen_types(parsed.types)
    if refused_types:
        raise BadRecord.first_of(f"{path}: {refused_types[0]}", len(refused_types), "refused instance types")
    screened = screen_frame(parsed.points, gpus={**gpus, **gpu_counts(types)}, rules=store.screen_rules)
    if screened.refused:
        raise BadRecord.first_of(f"{path}: {screened.reasons[0]}", screened.refused, "refused points")


def _import(store: PriceStore, found: Detected, gpus: dict[tuple[str, str], float]) -> ImportReport:
    path = found.path
    if found.malformed is not None:
        raise MalformedInput(found.malformed)
    if found.refusal is not None:
        raise NotPriceData(found.refusal)
    try:
        parsed = _parse(found)
        _screen(store, path, parsed, gpus)
    except (BadRecord, MalformedInput) as exc:
        raise _named(path, exc) from exc
    return _write(store, path, found.kind, parsed, gpus)


def _write(
    store: PriceStore,
    path: Path,
    kind: str,
    parsed: _Parsed,
    gpus: dict[tuple[str, str], float],
) -> ImportReport:
    """Store a parsed and screened file (one write), add the instance types it reveals (those not in
    ``gpus``, the known types' GPU counts, which they then join), report."""
    result = store.write(parsed.points)
    warnings = list(parsed.warnings)
    for w in [] if parsed.warnings_logged else parsed.warnings:
        log.warning("%s", w)
    if result.corrected:
        warnings.append(f"{result.corrected} stored price(s) at the same offer and time were replaced by this file's")
    new_types: dict[tuple[str, str], InstanceType] = {}
    for t in parsed.types:
        if (t.cloud.value, t.name) not in gpus:
            new_types.setdefault((t.cloud.value, t.name), t)
    if new_types:
        store.upsert_instance_types(new_types.values())
        gpus.update(gpu_counts(new_types.values()))
    report = ImportReport(
        path=path,
        kind=kind,
        status="partial" if parsed.partial else "imported",
        points_read=len(parsed.points),
        inserted=result.inserted,
        unchanged=result.unchanged,
        skipped_records=parsed.skipped,
        warnings=tuple(warnings),
    )
    log.info(
        "imported %s (%s): %d points read, %d new, %d unchanged, %d skipped%s",
        path,
        kind,
        report.points_read,
        report.inserted,
        report.unchanged,
        report.skipped_records,
        " (partial)" if parsed.partial else "",
    )
    return report


def _known_types(store: PriceStore) -> dict[tuple[str, str], float]:
    """The store's instance types, as their GPU counts by ``(cloud, name)`` (the screen's per-GPU bound
    and the importer's "is this type new" both read it)."""
    return gpu_counts(store.instance_types())


def import_source(kind: str) -> str:
    """The ``source_status`` name imports of files of ``kind`` are recorded under (``import:<kind>``)."""
    return f"{IMPORT_SOURCE_PREFIX}{kind}"


def _bad_count(exc: Exception | None) -> int:
    """How many records a refusal stands for (:attr:`BadRecord.count`); 0 for a malformed file
    (refused as a whole, no record read)."""
    return exc.count if isinstance(exc, BadRecord) else 0


def _record(store: PriceStore, report: ImportReport, exc: Exception | None = None) -> None:
    """Count one imported or refused price file in ``source_status`` (``costopt prices sources``)."""
    name = import_source(report.kind)
    if report.status in ("imported", "partial"):
        store.record_fetch(
            name,
            ok=True,
            points=report.points_read,
            skipped=report.skipped_records,
            partial=report.status == "partial",
        )
    elif report.status == "failed":
        store.record_fetch(
            name,
            ok=False,
            error=report.error,
            bad_records=_bad_count(exc),
            refused_pages=1,
            rejection=report.error,
        )


def import_file(store: PriceStore, path: Path) -> ImportReport:
    """Import one file (all or nothing) and report what it did (status ``imported`` or ``partial``).

    Raises :class:`NotPriceData` for a file that is not price data, :class:`MalformedInput` for a file
    of the wrong structure and :class:`BadRecord` for a file holding an invalid record; the error
    names the file (and the line or record); nothing of the file is stored then (the refusal is
    counted in ``source_status`` under ``import:<kind>``).
    """
    gpus = _known_types(store)
    found = detect(Path(path))
    try:
        report = _import(store, found, gpus)
    except (BadRecord, MalformedInput) as exc:
        log.error("failed: %s", exc)
        _record(store, ImportReport(Path(path), found.kind, "failed", error=str(exc)), exc)
        raise
    _record(store, report)
    return report


def _walk(paths: Sequence[Path]) -> Iterator[tuple[Path, bool]]:
    """``(file, found_in_a_folder)`` for every path; folders are walked recursively in sorted order."""
    for p in paths:
        p = Path(p)
        if p.is_dir():
            for f in sorted(q for q in p.rglob("*") if q.is_file()):
                yield f, True
        else:
            yield p, False


def import_paths(
    store: PriceStore,
    paths: Sequence[Path],
    *,
    progress: Callable[[ImportReport], None] | None = None,
) -> list[ImportReport]:
    """Import files and folders (walked recursively, sorted); one report per file, in order.

    Never raises for a file's content: a file that is not price data is ``skipped`` when met in a
    folder and ``refused`` when named explicitly; a malformed or bad file is ``failed`` (nothing of
    it stored) and the others are still imported. Store errors (database down) propagate.
    ``progress`` is called with each report as soon as its file is done.

    The GCP ``skus`` pages met while walking a folder are, per folder, one listing: read together,
    composed once and stored with one write (all or nothing for the listing; :func:`_parse_gcp_listing`).
    The first page's report carries the listing's counts, the others' say they were composed with it.
    A page named explicitly is composed alone.
    """
    gpus = _known_types(store)
    reports: list[ImportReport] = []
    items = list(_walk(paths))
    listings = _gcp_listings([p for p, in_folder in items if in_folder])
    done: set[Path] = set()
    for path, in_folder in items:
        if path in done:
            continue
        listing = listings.get(path)
        if listing is not None:
            for report, exc in _import_listing(store, listing, gpus):
                _record(store, report, exc)
                reports.append(report)
                done.add(report.path)
                if progress is not None:
                    progress(report)
            continue
        kind = "unknown"
        refusal: Exception | None = None
        try:
            found = detect(path)
            kind = found.kind
            report = _import(store, found, gpus)
        except NotPriceData as exc:
            status: Status = "skipped" if in_folder else "refused"
            report = ImportReport(path, kind, status, error=str(exc))
            (log.info if in_folder else log.error)("%s: %s", status, exc)
        except (BadRecord, MalformedInput) as exc:
            report = ImportReport(path, kind, "failed", error=str(exc))
            refusal = exc
            log.error("failed: %s", exc)
        except OSError as exc:
            report = ImportReport(path, kind, "failed", error=f"{path}: cannot read: {exc.strerror or exc}")
            log.error("failed: %s", report.error)
        _record(store, report, refusal)
        reports.append(report)
        if progress is not None:
            progress(report)
    return reports


def _gcp_listings(paths: Sequence[Path]) -> dict[Path, list[Detected]]:
    """The GCP ``skus`` pages among ``paths`` grouped by folder, when a folder holds more than one,
    keyed by the group's first path (an unreadable or malformed file is left to the per-file path)."""
    groups: dict[Path, list[Detected]] = {}
    for path in paths:
        if path.suffix.lower() != ".json":
            continue
        try:
            found = detect(path)
        except OSError:
            continue
        if found.kind == GCP_PAGE and found.malformed is None:
            groups.setdefault(path.parent, []).append(found)
    return {group[0].path: group for group in groups.values() if len(group) > 1}


def _import_listing(
    store: PriceStore, listing: list[Detected], gpus: dict[tuple[str, str], float]
) -> list[tuple[ImportReport, Exception | None]]:
    """Import the pages of one GCP listing together; one report per page (see :func:`import_paths`)."""
    first = listing[0].path
    try:
        parsed = _confirmed_at_file_time(_parse_gcp_listing(listing), first)
        _screen(store, first, parsed, gpus)
    except (BadRecord, MalformedInput) as exc:
        pages = ", ".join(f.path.name for f in listing)
        error = f"{exc} (the listing of {len(listing)} pages {pages} is refused whole)"
        log.error("failed: %s", error)
        # every page refused; the bad records counted once
        refused = [ImportReport(f.path, GCP_PAGE, "failed", error=error) for f in listing]
        return [(report, exc if i == 0 else None) for i, report in enumerate(refused)]
    head = _write(store, first, GCP_PAGE, parsed, gpus)
    note = f"composed together with {first.name} (one listing of {len(listing)} pages; counts on its report)"
    rest = [ImportReport(f.path, GCP_PAGE, head.status, warnings=(note,)) for f in listing[1:]]
    return [(head, None), *((r, None) for r in rest)]


def seed_paths(data_dir: Path, catalog_dir: Path) -> list[Path]:
    """The default seed set (existing paths only): the price CSVs of ``<data_dir>/prices/`` (told by
    content; the GCP probes and throughput files are left out), the raw AWS spot pages folder and the
    raw Azure sheets of ``<data_dir>/raw/training_on_a_dime/logs/``, and ``<catalog_dir>/list_prices.csv``.
    """
    out: list[Path] = []
    prices = data_dir / "prices"
    if prices.is_dir():
        out.extend(p for p in sorted(prices.glob("*.csv")) if p.is_file() and detect(p).refusal is None)
    logs = data_dir / "raw" / "training_on_a_dime" / "logs"
    if (logs / "aws" / "cost").is_dir():
        out.append(logs / "aws" / "cost")
    if (logs / "azure" / "cost").is_dir():
        out.extend(sorted(p for p in (logs / "azure" / "cost").glob("*.csv") if p.stem in SHEET_REGIONS))
    if (catalog_dir / LIST_PRICES_FILE).is_file():
        out.append(catalog_dir / LIST_PRICES_FILE)
    return out
