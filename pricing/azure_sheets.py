"""Parser of the Azure spot price sheets of the 2020 "Training on a Dime" logs (replay import).

Files: ``logs/azure/cost/{us_east,us_north_central,us_south_central}.csv``, one row per day
(``Date`` as M/D/YYYY), one column per VM size (``NC6``, ``NC6s v3``, ...), prices as ``$0.12276``
USD per hour; an empty cell means the size was not offered there that day (skipped and counted).
``logs/azure/instance_mapping.csv`` (``Instance,GPU type,# GPUs``) gives each size's GPUs.

Naming: a sheet size is turned into the ARM size name used by the live collector by prefixing
``Standard_`` and replacing spaces with underscores (``NC6s v3`` -> ``Standard_NC6s_v3``,
``NC24r`` -> ``Standard_NC24r``). The region comes from the file name (``us_east`` -> ``eastus``,
``us_north_central`` -> ``northcentralus``, ``us_south_central`` -> ``southcentralus``).
"""

from __future__ import annotations

import csv
import logging
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from costopt.domain import (
    Cloud,
    InstanceType,
    Market,
    OfferKey,
    PricePoint,
    check_price,
    normalize_accelerator,
)
from costopt.errors import BadRecord, MalformedInput, NotPriceData
from pricing.azure import lookup_size
from pricing.base import ParsedPage, Problems

log = logging.getLogger("costopt.pricing.azure_sheets")

SHEET_SOURCE = "azure-sheet"
SHEET_REGIONS: Mapping[str, str] = {
    "us_east": "eastus",
    "us_north_central": "northcentralus",
    "us_south_central": "southcentralus",
}
SPIKE_FACTOR = 3.0
_PRICE = re.compile(r"^\$?\s*(\d+(?:\.\d*)?|\.\d+)$")


def sheet_size_to_arm(name: str) -> str:
    """``NC6s v3`` -> ``Standard_NC6s_v3``: the ARM size name of a sheet column."""
    parts = name.split()
    if not parts or not all(re.fullmatch(r"[A-Za-z0-9]+", p) for p in parts):
        raise BadRecord(f"not an Azure VM size name: {name!r}")
    return "Standard_" + "_".join(parts)


def load_instance_mapping(path: Path, *, source: str = SHEET_SOURCE) -> dict[str, InstanceType]:
    """Read ``instance_mapping.csv``: sheet size name -> :class:`InstanceType` (ARM name, GPUs).

    vCPUs and memory come from the Azure size table when it knows the size (else None).
    Raises :class:`MalformedInput` for a wrong header and :class:`BadRecord` (with the line number)
    for a bad row: the mapping is all-or-nothing.
    """
    with path.open(newline="", encoding="utf-8-sig") as fh:
        reader = csv.reader(fh)
        header = [h.strip() for h in next(reader, [])]
        if header[:3] != ["Instance", "GPU type", "# GPUs"]:
            raise MalformedInput(f"{path}: expected header 'Instance,GPU type,# GPUs', got {header!r}")
        out: dict[str, InstanceType] = {}
        for row in reader:
            if not any(c.strip() for c in row):
                continue
            where = f"{path.name} line {reader.line_num}"
            if len(row) < 3:
                raise BadRecord(f"{where}: expected 3 cells, got {len(row)}")
            size, gpu, count = (c.strip() for c in row[:3])
            try:
                gpus = float(count)
            except ValueError as exc:
                raise BadRecord(f"{where}: '# GPUs' is not a number: {count!r}") from exc
            if not gpu or gpus <= 0:
                raise BadRecord(f"{where}: needs a GPU type and a positive GPU count, got {gpu!r}, {count!r}")
            if size in out:
                raise BadRecord(f"{where}: size {size!r} is listed twice")
            arm = sheet_size_to_arm(size)
            known = lookup_size(arm)
            out[size] = InstanceType(
                Cloud.AZURE,
                arm,
                normalize_accelerator(gpu),
                gpus,
                known[1].vcpus if known else None,
                known[1].memory_gib if known else None,
                source,
            )
    if not out:
        raise MalformedInput(f"{path}: no sizes in the instance mapping")
    return out


@dataclass(frozen=True)
class PriceSpike:
    """A price more than ``factor`` times both its previous and next day's price (kept, flagged)."""

    key: OfferKey
    valid_from: datetime
    usd_per_hour: float
    previous_usd_per_hour: float
    next_usd_per_hour: float
    where: str


@dataclass
class AzureSheet(ParsedPage):
    """A parsed sheet: ``points`` (one per non-empty cell), ``problems`` (empty cells are
    ``skipped``, bad cells ``bad`` with line and column), ``cells`` read and flagged ``spikes``."""

    cells: int = 0
    spikes: list[PriceSpike] = field(default_factory=list)


def region_of_sheet(path: Path) -> str:
    """Azure region of a sheet from its file name (``us_east.csv`` -> ``eastus``)."""
    region = SHEET_REGIONS.get(path.stem)
    if region is None:
        raise NotPriceData(
            f"{path}: not a known Azure price sheet (expected one of "
            f"{', '.join(s + '.csv' for s in SHEET_REGIONS)}); pass region= explicitly for another file"
        )
    return region


def _parse_price(cell: str) -> float:
    m = _PRICE.match(cell)
    if m is None:
        raise BadRecord(f"price is not a dollar amount: {cell!r}")
    price = float(m.group(1))
    check_price(price)
    return price


def _parse_day(cell: str) -> datetime:
    try:
        day = datetime.strptime(cell.strip(), "%m/%d/%Y")
    except ValueError as exc:
        raise BadRecord(f"Date is not M/D/YYYY: {cell!r}") from exc
    return day.replace(tzinfo=UTC)


def find_spikes(series: list[tuple[PricePoint, str]], factor: float = SPIKE_FACTOR) -> Iterator[PriceSpike]:
    """Points of one offer's series (sorted by ``valid_from``) above ``factor`` x both neighbours."""
    for (prev, _), (cur, where), (nxt, _) in zip(series, series[1:], series[2:], strict=False):
        if cur.usd_per_hour > factor * prev.usd_per_hour and cur.usd_per_hour > factor * nxt.usd_per_hour:
            yield PriceSpike(cur.key, cur.valid_from, cur.usd_per_hour, prev.usd_per_hour, nxt.usd_per_hour, where)


def parse_azure_sheet(
    path: Path,
    mapping: Mapping[str, InstanceType],
    *,
    region: str | None = None,
    source: str = SHEET_SOURCE,
    strict: bool = False,
    spike_factor: float = SPIKE_FACTOR,
) -> AzureSheet:
    """Parse one sheet into spot :class:`PricePoint` s (zone "", ``valid_from`` = the UTC day 00:00,
    ``observed_at`` None) plus the :class:`InstanceType` of each column.

    ``mapping`` comes from :func:`load_instance_mapping`. Bad cells are counted in ``problems.bad``
    with ``"<file> line N column 'X'"`` (an importer refuses the file when ``problems.bad > 0``);
    ``strict=True`` raises :class:`BadRecord` at the first one instead. Prices above
    ``spike_factor`` x both neighbouring days are kept, logged as warnings and listed in ``spikes``.
    Raises :class:`MalformedInput` for a missing ``Date`` column or a size missing from ``mapping``.
    """
    region = region or region_of_sheet(path)
    problems = Problems(source)
    points: list[PricePoint] = []
    series: dict[str, list[tuple[PricePoint, str]]] = {}
    cells = 0

    def bad(where: str, why: str) -> None:
        if strict:
            raise BadRecord(f"{where}: {why}")
        problems.bad_record(where, why)

    with path.open(newline="", encoding="utf-8-sig") as fh:
        reader = csv.reader(fh)
        header = [h.strip() for h in next(reader, [])]
        if not header or header[0] != "Date":
            raise MalformedInput(f"{path}: first column must be 'Date', got {header[:1]!r}")
        columns = header[1:]
        if not columns or len(set(columns)) != len(columns):
            raise MalformedInput(f"{path}: needs distinct size columns after 'Date', got {columns!r}")
        missing = [c for c in columns if c not in mapping]
        if missing:
            raise MalformedInput(
                f"{path}: sizes {missing!r} are not in the instance mapping; add their GPU type and count "
                "to instance_mapping.csv"
            )
        types = [mapping[c] for c in columns]
        seen_days: dict[datetime, int] = {}
        for row in reader:
            if not any(c.strip() for c in row):
                continue
            line = reader.line_num
            if len(row) != len(header):
                bad(f"{path.name} line {line}", f"expected {len(header)} cells, got {len(row)}")
                continue
            try:
                day = _parse_day(row[0])
            except BadRecord as exc:
                bad(f"{path.name} line {line} column 'Date'", str(exc))
                continue
            if day in seen_days:
                bad(f"{path.name} line {line} column 'Date'", f"{row[0]} repeats line {seen_days[day]}")
                continue
            seen_days[day] = line
            for column, itype, cell in zip(columns, types, row[1:], strict=True):
                cells += 1
                where = f"{path.name} line {line} column {column!r}"
                text = cell.strip()
                if not text:
                    problems.skip(where, "empty cell: not offered")
                    continue
                try:
                    price = _parse_price(text)
                except BadRecord as exc:
                    bad(where, str(exc))
                    continue
                key = OfferKey(Cloud.AZURE, region, "", itype.name, Market.SPOT)
                point = PricePoint(key, day, price, source)
                points.append(point)
                series.setdefault(itype.name, []).append((point, where))
    spikes: list[PriceSpike] = []
    for name in sorted(series):
        ordered = sorted(series[name], key=lambda pw: pw[0].valid_from)
        for spike in find_spikes(ordered, spike_factor):
            log.warning(
                "%s: %s: %s %s on %s costs %.4f USD/h, over %g x both neighbouring days (%.4f, %.4f); "
                "kept as recorded, check it before trusting plans that use it",
                source,
                spike.where,
                region,
                name,
                spike.valid_from.date(),
                spike.usd_per_hour,
                spike_factor,
                spike.previous_usd_per_hour,
                spike.next_usd_per_hour,
            )
            spikes.append(spike)
    seen_types = {t.name: t for t in types if t.name in series}
    log.info(
        "%s: %s: %d points, %d empty cells skipped, %d bad, %d spikes flagged",
        source,
        path.name,
        len(points),
        problems.skipped,
        problems.bad,
        len(spikes),
    )
    return AzureSheet(points, problems, instance_types=list(seen_types.values()), cells=cells, spikes=spikes)
