"""The sanity rules every collected or imported price passes before it is stored ("screening").

A parser refuses what it can see on one record (a missing field, a non-USD currency, a unit other than
per hour, a price that is not a positive finite number below :data:`costopt.domain.MAX_SANE_USD_PER_HOUR`).
Screening adds the rules that need the whole batch or the catalog, applied to a price frame (the columns
of :func:`pricing.store.points_frame`) by :func:`screen_frame`:

- *price*: finite, above zero (a price of zero is not a price) and at most the per-instance bound;
- *per GPU-hour*: when the instance type's GPU count is known (the batch's own shapes, then the store's
  catalog), price / GPUs at most :attr:`ScreenRules.max_usd_per_gpu_hour` (setting
  ``COSTOPT_MAX_USD_PER_GPU_HOUR``, default 100; the dearest GPU of 2026 lists near 15 USD/GPU-h);
- *names*: region, zone and instance type are plain ASCII names (letters, digits, ``. _ + -``, at most
  128 characters): no control characters, spaces, look-alike unicode letters or empty region;
- *region*: of its cloud's shape (AWS ``us-east-1``, GCP ``us-central1``, Azure a lower-case name holding a
  direction or ``central``: ``eastus``, ``southeastasia``, ``usgovvirginia``); a shape, not a list, so a
  new region of a cloud passes while ``global``, ``Americas``, ``moon`` or an empty region do not; a zone
  starts with its region (GCP and Azure prices are regional: zone empty);
- *time*: ``valid_from`` (and ``observed_at``) not later than now + :attr:`ScreenRules.future_tolerance`
  (setting ``COSTOPT_PRICE_FUTURE_TOLERANCE``, default one hour);
- *conflicts*: two different prices for one offer at one time: every row of that offer and time is refused
  (which one is right cannot be told).

Live collectors drop the refused rows and store the rest (:func:`pricing.collect.run_source`); the importer
refuses the whole file when any row is refused (:mod:`pricing.importer`). Either way every refused row is
counted, logged with its source and shown by ``costopt prices sources``.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import cast

import numpy as np
import pandas as pd

from costopt.domain import MAX_SANE_USD_PER_HOUR, Cloud, InstanceType
from costopt.settings import Settings
from pricing.base import MAX_PROBLEMS_KEPT

log = logging.getLogger("costopt.pricing.screen")

DEFAULT_MAX_USD_PER_GPU_HOUR: float = Settings.model_fields["max_usd_per_gpu_hour"].default
"""Default of the setting ``max_usd_per_gpu_hour`` (read from it: one default)."""
DEFAULT_FUTURE_TOLERANCE: timedelta = Settings.model_fields["price_future_tolerance"].default
"""Default of the setting ``price_future_tolerance``."""

MAX_REASONS = MAX_PROBLEMS_KEPT
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+\-]{0,127}$")
"""A region, zone or instance-type name: plain ASCII, no spaces or control characters."""

REGION_RE: Mapping[str, re.Pattern[str]] = {
    Cloud.AWS.value: re.compile(r"^[a-z]{2}(?:-gov|-iso[a-z]?)?-[a-z]+-\d{1,2}$"),
    Cloud.GCP.value: re.compile(r"^[a-z]+-[a-z]+\d{1,2}$"),
    Cloud.AZURE.value: re.compile(r"^[a-z]*(?:east|west|north|south|central|virginia|arizona|texas)[a-z0-9]*$"),
}
"""The shape of each cloud's region names (other clouds: any plain name)."""


@dataclass(frozen=True, slots=True)
class ScreenRules:
    """The bounds of :func:`screen_frame` (see the module docstring)."""

    max_usd_per_gpu_hour: float = DEFAULT_MAX_USD_PER_GPU_HOUR
    future_tolerance: timedelta = DEFAULT_FUTURE_TOLERANCE

    @classmethod
    def from_settings(cls, settings: Settings) -> ScreenRules:
        return cls(settings.max_usd_per_gpu_hour, settings.price_future_tolerance)


@dataclass
class Screened:
    """The rows of a frame that passed (``frame``, index reset), how many were refused and the first reasons."""

    frame: pd.DataFrame
    refused: int = 0
    reasons: list[str] = field(default_factory=list)


def price_faults(price: np.ndarray) -> np.ndarray:
    """Why each USD/hour price (float array) is not a price, ``""`` where it is: finite, above zero and at
    most :data:`~costopt.domain.MAX_SANE_USD_PER_HOUR`. The vector form of
    :func:`costopt.domain.check_price`, the one rule of the screen, the importer's CSV checks and the
    store's last check (:func:`pricing.ingest.prepare`)."""
    return np.select(
        [~np.isfinite(price), price < 0, price == 0, price > MAX_SANE_USD_PER_HOUR],
        [
            "price is not a finite number",
            "negative price",
            "price of zero: not a price",
            f"absurd price (above {MAX_SANE_USD_PER_HOUR:g} USD/h)",
        ],
        default="",
    )


def _per_distinct(values: pd.Series, test: Callable[[str], bool]) -> np.ndarray:
    """``test`` of each value, computed once per distinct value (a batch repeats few names)."""
    codes, uniques = pd.factorize(values.fillna("").astype(str))
    verdict = np.array([test(str(u)) for u in uniques], dtype=bool)
    return verdict[codes] if len(codes) else np.zeros(0, dtype=bool)


def _names_ok(values: pd.Series, *, allow_empty: bool) -> np.ndarray:
    return _per_distinct(values, lambda v: bool(NAME_RE.match(v)) or (allow_empty and v == ""))


def _region_ok(cloud: pd.Series, region: pd.Series) -> np.ndarray:
    out = np.ones(len(region), dtype=bool)
    pairs = pd.DataFrame({"c": cloud.astype(str), "r": region.fillna("").astype(str)})
    for key, idx in pairs.groupby(["c", "r"], sort=False).indices.items():
        cloud_name, region_name = (str(part) for part in cast(tuple[str, str], key))
        pattern = REGION_RE.get(cloud_name)
        if pattern is not None and not pattern.match(region_name):
            out[idx] = False
    return out


def _zone_outside_region(zone_region: str) -> bool:
    zone, _, region = zone_region.partition("\x00")
    return bool(zone) and not zone.startswith(region)


def _describe(row: pd.Series) -> str:
    zone = row.get("zone") or ""
    return (
        f"{row.get('cloud')}/{row.get('region')!r}/{zone!r}/{row.get('instance_type')!r}/{row.get('market')} "
        f"at {row.get('valid_from')}"
    )


def gpu_counts(types: Iterable[InstanceType]) -> dict[tuple[str, str], float]:
    """``(cloud, instance type) -> GPU count`` of the shapes given (later ones win)."""
    return {(t.cloud.value, t.name): float(t.gpu_count) for t in types}


def screen_frame(
    frame: pd.DataFrame,
    *,
    gpus: Mapping[tuple[str, str], float] | None = None,
    rules: ScreenRules | None = None,
    now: datetime | None = None,
) -> Screened:
    """Split a price frame into the rows that pass every rule and the count and reasons of the others.

    ``gpus``: GPU count per ``(cloud, instance type)`` (an unknown type is only held to the per-instance
    bound); ``now``: the time the future-time rule is judged at (default: the wall clock, UTC).
    """
    rules = rules or ScreenRules()
    now = now or datetime.now(UTC)
    frame = frame.reset_index(drop=True)
    n = len(frame)
    if n == 0:
        return Screened(frame)
    why = np.full(n, "", dtype=object)

    def refuse(mask: np.ndarray, reason: str | np.ndarray) -> None:
        fresh = mask & (why == "")
        if isinstance(reason, np.ndarray):
            why[fresh] = reason[fresh]
        else:
            why[fresh] = reason

    price = pd.to_numeric(frame["usd_per_hour"], errors="coerce").to_numpy(dtype=np.float64)
    faults = price_faults(price)
    refuse(faults != "", faults)
    for col, allow_empty in (("region", False), ("zone", True), ("instance_type", False)):
        refuse(~_names_ok(frame[col], allow_empty=allow_empty), f"{col} is not a plain name")
    refuse(~_region_ok(frame["cloud"], frame["region"]), "unknown region (not of its cloud's region shape)")
    zone_region = frame["zone"].fillna("").astype(str) + "\x00" + frame["region"].fillna("").astype(str)
    zone_wrong = _per_distinct(zone_region, _zone_outside_region)
    refuse(zone_wrong, "zone is not in its region")
    limit = pd.Timestamp(now + rules.future_tolerance)
    for col in ("valid_from", "observed_at"):
        if col in frame:
            times = pd.to_datetime(frame[col], utc=True, errors="coerce")
            refuse((times > limit).to_numpy(dtype=bool), f"{col} in the future (after {limit.isoformat()})")
    if gpus:
        keys = zip(frame["cloud"].astype(str).tolist(), frame["instance_type"].astype(str).tolist(), strict=True)
        count = np.array([gpus.get(k, np.nan) for k in keys], dtype=np.float64)
        with np.errstate(divide="ignore", invalid="ignore"):
            per_gpu = price / count
        over = (count > 0) & np.isfinite(per_gpu) & (per_gpu > rules.max_usd_per_gpu_hour)
        refuse(over, f"absurd price per GPU-hour (above {rules.max_usd_per_gpu_hour:g} USD)")
    cols = ["cloud", "region", "zone", "instance_type", "market", "valid_from"]
    keyed = frame[cols].assign(zone=frame["zone"].fillna(""), _p=price)
    prices_per_key = keyed.groupby(cols, sort=False, dropna=False)["_p"].transform("nunique").to_numpy()
    refuse(prices_per_key > 1, "several prices for one offer at one time")
    bad = why != ""
    reasons: list[str] = []
    for i in np.flatnonzero(bad)[:MAX_REASONS].tolist():
        reasons.append(f"{_describe(frame.iloc[i])}: {why[i]} ({price[i]:g} USD/h)")
    return Screened(frame[~bad].reset_index(drop=True), int(bad.sum()), reasons)


def screen_types(types: Iterable[InstanceType]) -> tuple[list[InstanceType], list[str]]:
    """The instance types with a plain name and a positive finite GPU count, and why the others were refused."""
    kept: list[InstanceType] = []
    refused: list[str] = []
    for t in types:
        if not NAME_RE.match(t.name):
            refused.append(f"instance type {t.name!r}: not a plain name")
        elif not (np.isfinite(t.gpu_count) and t.gpu_count > 0):
            refused.append(f"instance type {t.name!r}: GPU count {t.gpu_count!r} is not positive")
        else:
            kept.append(t)
    return kept, refused
