"""Domain types of the core: clouds, markets, accelerators, instance types, offers and prices.

Conventions: prices are USD per instance-hour as ``float``; times are tz-aware UTC ``datetime``;
a regional (not zonal) price has ``zone == ""`` (never None, so unique keys hold).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum

from costopt.errors import BadRecord


class Cloud(StrEnum):
    AWS = "aws"
    GCP = "gcp"
    AZURE = "azure"
    SIM = "sim"
    LOCAL = "local"  # this machine: jobs as subprocesses (providers/local.py)


class Market(StrEnum):
    SPOT = "spot"
    ON_DEMAND = "on_demand"


# Canonical accelerator names. Keys of the alias table are lower-cased vendor spellings.
KNOWN_ACCELERATORS: tuple[str, ...] = (
    "k80",
    "p100",
    "v100",
    "t4",
    "a10g",
    "a10",
    "l4",
    "l40s",
    "a100",
    "a100-80gb",
    "h100",
    "h200",
    "b200",
    "rtx-pro-6000",
    "m60",
    "p4",
)
_ALIASES: dict[str, str] = {
    "nvidia-tesla-k80": "k80",
    "tesla k80": "k80",
    "k80": "k80",
    "nvidia-tesla-p100": "p100",
    "tesla p100": "p100",
    "p100": "p100",
    "nvidia-tesla-v100": "v100",
    "tesla v100": "v100",
    "v100": "v100",
    "nvidia-tesla-t4": "t4",
    "tesla t4": "t4",
    "t4": "t4",
    "t4g": "t4",
    "a10g": "a10g",
    "nvidia-a10g": "a10g",
    "a10": "a10",
    "nvidia-a10": "a10",
    "nvidia-l4": "l4",
    "l4": "l4",
    "l40s": "l40s",
    "nvidia-l40s": "l40s",
    "nvidia-tesla-a100": "a100",
    "a100": "a100",
    "a100-40gb": "a100",
    "nvidia-a100-80gb": "a100-80gb",
    "a100-80gb": "a100-80gb",
    "a100 80gb": "a100-80gb",
    "nvidia-h100-80gb": "h100",
    "nvidia-h100-mega-80gb": "h100",
    "h100": "h100",
    "nvidia-h200-141gb": "h200",
    "h200": "h200",
    "nvidia-b200": "b200",
    "b200": "b200",
    "nvidia-rtx-pro-6000": "rtx-pro-6000",
    "rtx6000": "rtx-pro-6000",
    "rtx-pro-6000": "rtx-pro-6000",
    "tesla m60": "m60",
    "m60": "m60",
    "nvidia-tesla-p4": "p4",
    "p4": "p4",
}


def normalize_accelerator(raw: str) -> str:
    """Map a vendor's GPU name (``nvidia-tesla-v100``, ``Tesla V100``, ``V100``) to its canonical name.

    Unknown names are returned lower-cased with spaces as dashes, so a new GPU is kept, not lost.
    """
    key = re.sub(r"\s+", " ", raw.strip().lower())
    if key in _ALIASES:
        return _ALIASES[key]
    if key.startswith("nvidia ") and key[7:] in _ALIASES:
        return _ALIASES[key[7:]]
    return key.replace(" ", "-")


@dataclass(frozen=True, slots=True)
class InstanceType:
    """A GPU instance shape. ``gpu_count`` may be fractional (some GCP shapes carry part of a GPU)."""

    cloud: Cloud
    name: str
    accelerator: str
    gpu_count: float
    vcpus: int | None = None
    memory_gib: float | None = None
    source: str = "catalog"


@dataclass(frozen=True, slots=True)
class OfferKey:
    """Where and how an instance type is sold. ``zone == ""`` means a regional price."""

    cloud: Cloud
    region: str
    zone: str
    instance_type: str
    market: Market

    def __post_init__(self) -> None:
        if not self.region or not self.instance_type:
            raise BadRecord(f"offer key needs a region and an instance type, got {self!r}")

    def __str__(self) -> str:
        """``cloud/region/zone/instance_type/market`` (zone empty for a regional offer), for messages."""
        return f"{self.cloud.value}/{self.region}/{self.zone}/{self.instance_type}/{self.market.value}"

    def to_doc(self) -> dict[str, str]:
        """The key as a JSON object of plain strings (how records on disk and in the database hold it)."""
        return {
            "cloud": self.cloud.value,
            "region": self.region,
            "zone": self.zone,
            "instance_type": self.instance_type,
            "market": self.market.value,
        }

    @classmethod
    def from_doc(cls, doc: Mapping[str, str]) -> OfferKey:
        """The inverse of :meth:`to_doc`."""
        return cls(Cloud(doc["cloud"]), doc["region"], doc["zone"], doc["instance_type"], Market(doc["market"]))


MAX_SANE_USD_PER_HOUR = 1000.0
"""No GPU instance of any cloud lists above this; a larger price is a bad record (per instance-hour; the
tighter per-GPU-hour bound is the setting ``max_usd_per_gpu_hour``, see :mod:`pricing.screen`)."""


@dataclass(frozen=True, slots=True)
class PricePoint:
    """A price change point: ``usd_per_hour`` holds from ``valid_from`` until the next point of ``key``.

    ``observed_at`` is when the source last confirmed this price (None: the record's own time,
    as for imported history).
    """

    key: OfferKey
    valid_from: datetime
    usd_per_hour: float
    source: str
    observed_at: datetime | None = None

    def __post_init__(self) -> None:
        check_price(self.usd_per_hour)
        if self.valid_from.tzinfo is None:
            raise BadRecord(f"valid_from must be tz-aware UTC, got naive {self.valid_from}")


def check_price(value: float) -> None:
    """Raise :class:`BadRecord` unless ``value`` is a plausible USD/hour price (0 < p <= 1000).

    A price of zero is not a price: sources that use 0 for "not offered" skip such records before
    building a point; anywhere else a zero is a bad record."""
    if not isinstance(value, (int, float)) or value != value:  # NaN != NaN
        raise BadRecord(f"price is not a number: {value!r}")
    if value < 0:
        raise BadRecord(f"negative price: {value}")
    if value == 0:
        raise BadRecord("price of zero: not a price (a source meaning 'not offered' must skip it)")
    if value > MAX_SANE_USD_PER_HOUR or value == float("inf"):
        raise BadRecord(f"absurd price {value} USD/h (above {MAX_SANE_USD_PER_HOUR})")


def utc(dt: datetime) -> datetime:
    """Return ``dt`` as tz-aware UTC; a naive datetime is taken to be UTC already."""
    return dt.replace(tzinfo=UTC) if dt.tzinfo is None else dt.astimezone(UTC)


def parse_utc(text: str) -> datetime:
    """Parse an ISO 8601 time (``Z`` or offset; a bare date is that UTC day's 00:00) to UTC.

    Raises :class:`BadRecord` for anything else.
    """
    s = text.strip()
    if not s:
        raise BadRecord("empty timestamp")
    try:
        dt = datetime.fromisoformat(s.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError as exc:
        raise BadRecord(f"unknown timestamp format: {text!r}") from exc
    return utc(dt)
