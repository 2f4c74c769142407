"""The curated instance catalog and published on-demand list prices (``data/catalog/``).

Two CSV files, both read strictly: a wrong header raises :class:`~costopt.errors.MalformedInput`, any
invalid row raises :class:`~costopt.errors.BadRecord` naming the file, the line and the reason (a curated
file is fixed by hand, so nothing is skipped silently).

- ``instance_types.csv``: ``cloud,instance_type,accelerator,gpu_count,vcpus,memory_gib,source``.
  ``accelerator`` is a canonical name of :data:`costopt.domain.KNOWN_ACCELERATORS`; ``gpu_count`` is a
  whole number, or a fraction below 1 for a shape that carries part of a GPU; ``vcpus``/``memory_gib``
  may be empty when no source gives them.
- ``list_prices.csv``: ``cloud,region,instance_type,usd_per_hour,valid_from,confirmed_at,source`` with
  ISO dates; a row becomes an on-demand regional :class:`~costopt.domain.PricePoint` holding from
  ``valid_from`` 00:00 UTC, last confirmed at ``confirmed_at`` 00:00 UTC.

``source`` holds one or more ids (``;``-separated) that ``data/catalog/SOURCES.md`` maps to a page.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from pathlib import Path
from types import MappingProxyType

from costopt.domain import (
    KNOWN_ACCELERATORS,
    Cloud,
    InstanceType,
    Market,
    OfferKey,
    PricePoint,
    check_price,
    normalize_accelerator,
)
from costopt.errors import BadRecord, MalformedInput

INSTANCE_TYPES_FILE = "instance_types.csv"
LIST_PRICES_FILE = "list_prices.csv"

INSTANCE_COLUMNS: tuple[str, ...] = (
    "cloud",
    "instance_type",
    "accelerator",
    "gpu_count",
    "vcpus",
    "memory_gib",
    "source",
)
PRICE_COLUMNS: tuple[str, ...] = (
    "cloud",
    "region",
    "instance_type",
    "usd_per_hour",
    "valid_from",
    "confirmed_at",
    "source",
)


# --------------------------------------------------------------------------------------------------
# CSV reading
# --------------------------------------------------------------------------------------------------


def _rows(path: Path, columns: tuple[str, ...]) -> Iterator[tuple[int, dict[str, str]]]:
    """Yield ``(line number, row)`` of a CSV whose header must be exactly ``columns``.

    Blank lines are skipped; a row with the wrong number of fields is a :class:`BadRecord`.
    """
    try:
        handle = path.open(encoding="utf-8-sig", newline="")
    except OSError as exc:
        raise MalformedInput(f"{path}: cannot read the file ({exc})") from exc
    with handle:
        reader = csv.reader(handle)
        try:
            header = next(reader, None)
        except csv.Error as exc:
            raise MalformedInput(f"{path}: not a CSV file ({exc})") from exc
        if header is None:
            raise MalformedInput(f"{path}: empty file; expected the header {','.join(columns)}")
        if tuple(h.strip() for h in header) != columns:
            raise MalformedInput(f"{path}: wrong header {','.join(header)!r}; expected {','.join(columns)!r}")
        while True:
            try:
                cells = next(reader)
            except StopIteration:
                return
            except csv.Error as exc:
                raise BadRecord(f"{path}:{reader.line_num}: unreadable CSV row ({exc})") from exc
            line = reader.line_num
            if not any(c.strip() for c in cells):
                continue
            if len(cells) != len(columns):
                raise BadRecord(
                    f"{path}:{line}: expected {len(columns)} fields ({','.join(columns)}), got {len(cells)}"
                )
            yield line, {name: cell.strip() for name, cell in zip(columns, cells, strict=True)}


class _RowError(Exception):
    """A reason a field is invalid; the reader adds the file and line."""


def _required(row: Mapping[str, str], name: str) -> str:
    value = row[name]
    if not value:
        raise _RowError(f"{name} is empty")
    if any(ch.isspace() for ch in value):
        raise _RowError(f"{name} {value!r} contains whitespace")
    return value


def _cloud(row: Mapping[str, str]) -> Cloud:
    raw = _required(row, "cloud")
    try:
        return Cloud(raw)
    except ValueError:
        raise _RowError(f"unknown cloud {raw!r} (one of {', '.join(c.value for c in Cloud)})") from None


def _number(row: Mapping[str, str], name: str) -> float:
    raw = _required(row, name)
    try:
        value = float(raw)
    except ValueError:
        raise _RowError(f"{name} {raw!r} is not a number") from None
    if not math.isfinite(value):
        raise _RowError(f"{name} {raw!r} is not a finite number")
    return value


def _gpu_count(row: Mapping[str, str]) -> float:
    count = _number(row, "gpu_count")
    if count <= 0:
        raise _RowError(f"gpu_count must be positive, got {row['gpu_count']!r}")
    if count >= 1 and not count.is_integer():
        raise _RowError(f"gpu_count {row['gpu_count']!r} must be a whole number (or below 1 for a partial GPU)")
    return count


def _optional_vcpus(row: Mapping[str, str]) -> int | None:
    raw = row["vcpus"]
    if not raw:
        return None
    if not raw.isdigit() or int(raw) <= 0:
        raise _RowError(f"vcpus must be a positive whole number or empty, got {raw!r}")
    return int(raw)


def _optional_memory(row: Mapping[str, str]) -> float | None:
    if not row["memory_gib"]:
        return None
    memory = _number(row, "memory_gib")
    if memory <= 0:
        raise _RowError(f"memory_gib must be positive or empty, got {row['memory_gib']!r}")
    return memory


def _accelerator(row: Mapping[str, str]) -> str:
    raw = _required(row, "accelerator")
    canonical = normalize_accelerator(raw)
    if raw != canonical:
        raise _RowError(f"accelerator {raw!r} is not canonical; write {canonical!r}")
    if canonical not in KNOWN_ACCELERATORS:
        raise _RowError(f"unknown accelerator {raw!r} (known: {', '.join(KNOWN_ACCELERATORS)})")
    return canonical


def _source(row: Mapping[str, str]) -> str:
    raw = row["source"]
    ids = [part.strip() for part in raw.split(";")]
    if not raw or not all(ids) or any(" " in part for part in ids):
        raise _RowError(f"source must be one or more ';'-separated ids, got {raw!r}")
    return ";".join(ids)


def _day(row: Mapping[str, str], name: str) -> date:
    raw = _required(row, name)
    try:
        if len(raw) != 10:
            raise ValueError(raw)
        return date.fromisoformat(raw)
    except ValueError:
        raise _RowError(f"{name} {raw!r} is not an ISO date (YYYY-MM-DD)") from None


def _midnight_utc(day: date) -> datetime:
    return datetime(day.year, day.month, day.day, tzinfo=UTC)


# --------------------------------------------------------------------------------------------------
# Loaders
# --------------------------------------------------------------------------------------------------


def load_instance_catalog(path: Path) -> list[InstanceType]:
    """Read ``instance_types.csv``: one :class:`InstanceType` per row, in file order.

    Raises :class:`MalformedInput` for a wrong header and :class:`BadRecord` (``file:line: reason``)
    for any invalid or duplicate ``(cloud, instance_type)`` row.
    """
    types: list[InstanceType] = []
    seen: dict[tuple[Cloud, str], int] = {}
    for line, row in _rows(path, INSTANCE_COLUMNS):
        try:
            cloud = _cloud(row)
            name = _required(row, "instance_type")
            if (cloud, name) in seen:
                raise _RowError(f"duplicate {cloud.value} {name!r} (first on line {seen[cloud, name]})")
            item = InstanceType(
                cloud=cloud,
                name=name,
                accelerator=_accelerator(row),
                gpu_count=_gpu_count(row),
                vcpus=_optional_vcpus(row),
                memory_gib=_optional_memory(row),
                source=_source(row),
            )
        except (_RowError, BadRecord) as exc:
            raise BadRecord(f"{path}:{line}: {exc}") from None
        seen[cloud, name] = line
        types.append(item)
    return types


def load_list_prices(path: Path, *, source: str = "list-price") -> list[PricePoint]:
    """Read ``list_prices.csv`` as on-demand regional price points (``zone == ""``).

    ``valid_from`` and ``observed_at`` are the row's ``valid_from`` and ``confirmed_at`` at 00:00 UTC;
    ``source`` names the points' source in the store (the row's ``source`` column is provenance).
    Raises :class:`MalformedInput` for a wrong header and :class:`BadRecord` (``file:line: reason``)
    for any invalid row, a confirmation before ``valid_from``, or a duplicate key and date.
    """
    points: list[PricePoint] = []
    seen: dict[tuple[Cloud, str, str, date], int] = {}
    for line, row in _rows(path, PRICE_COLUMNS):
        try:
            cloud = _cloud(row)
            region = _required(row, "region")
            name = _required(row, "instance_type")
            usd = _number(row, "usd_per_hour")
            check_price(usd)  # zero included: a price of zero is not a price, everywhere
            valid_from = _day(row, "valid_from")
            confirmed_at = _day(row, "confirmed_at")
            if confirmed_at < valid_from:
                raise _RowError(f"confirmed_at {confirmed_at} is before valid_from {valid_from}")
            _source(row)
            dup = (cloud, region, name, valid_from)
            if dup in seen:
                raise _RowError(
                    f"duplicate price of {cloud.value} {region} {name} from {valid_from} (first on line {seen[dup]})"
                )
            point = PricePoint(
                key=OfferKey(cloud, region, "", name, Market.ON_DEMAND),
                valid_from=_midnight_utc(valid_from),
                usd_per_hour=usd,
                source=source,
                observed_at=_midnight_utc(confirmed_at),
            )
        except (_RowError, BadRecord) as exc:
            raise BadRecord(f"{path}:{line}: {exc}") from None
        seen[dup] = line
        points.append(point)
    return points


# --------------------------------------------------------------------------------------------------
# Lookup
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class InstanceCatalog:
    """Instance types by ``(cloud, name)``; build with :meth:`of` or :func:`load_catalog`."""

    types: Mapping[tuple[Cloud, str], InstanceType] = field(default_factory=dict)

    @classmethod
    def of(cls, types: Iterable[InstanceType]) -> InstanceCatalog:
        """A catalog of ``types``; a later duplicate ``(cloud, name)`` replaces an earlier one."""
        return cls(MappingProxyType({(t.cloud, t.name): t for t in types}))

    def get(self, cloud: Cloud | str, name: str) -> InstanceType | None:
        """The instance type ``name`` of ``cloud``, or None when the catalog does not know it."""
        try:
            key = Cloud(cloud)
        except ValueError:
            return None
        return self.types.get((key, name))

    def accelerator_of(self, instance_type: str, cloud: Cloud | str) -> str | None:
        """The canonical accelerator of ``instance_type`` on ``cloud`` (None: unknown type)."""
        found = self.get(cloud, instance_type)
        return found.accelerator if found is not None else None

    def by_accelerator(self, accelerator: str) -> list[InstanceType]:
        """Every type carrying ``accelerator`` (any vendor spelling), sorted by cloud, GPUs, name."""
        wanted = normalize_accelerator(accelerator)
        found = [t for t in self.types.values() if t.accelerator == wanted]
        return sorted(found, key=lambda t: (t.cloud.value, t.gpu_count, t.name))

    def __len__(self) -> int:
        return len(self.types)

    def __iter__(self) -> Iterator[InstanceType]:
        return iter(self.types.values())


def load_catalog(directory: Path) -> InstanceCatalog:
    """The :class:`InstanceCatalog` of ``directory/instance_types.csv`` (e.g. ``Settings.catalog_dir``)."""
    return InstanceCatalog.of(load_instance_catalog(directory / INSTANCE_TYPES_FILE))
