"""Preemption hazards per offer: what spot really costs.

A spot offer is preempted at a constant rate ``lambda`` (per instance-hour). On-demand offers are
never preempted (rate 0). The rate of an offer is looked up from the most specific evidence:
(cloud, zone, accelerator, GPU count) -> (cloud, zone, accelerator) -> (cloud, region, accelerator)
-> (cloud, accelerator) -> the cloud's default. Each estimate carries the one-event Gamma prior of
:mod:`costopt.risk.availability`, so thin evidence stays close to the default.

Documented defaults (:data:`DEFAULT_SPOT_HAZARD_PER_HOUR`) are the pooled estimates of the 2020
availability logs (AWS us-east-1, GCP us-west1/us-east1/us-central1: ``costopt risk hazards``
prints them) rounded, and for Azure, which has no log, the AWS figure (an assumption, stated).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

import numpy as np
import pandas as pd

from costopt.domain import Cloud, Market
from costopt.risk.availability import Lifetime

DEFAULT_SPOT_HAZARD_PER_HOUR: Mapping[Cloud, float] = MappingProxyType(
    {
        Cloud.AWS: 0.085,  # pooled 2020 us-east-1 log: 32 preemptions in 375 instance-hours
        Cloud.GCP: 0.63,  # pooled 2020 logs: 434 preemptions in 694 instance-hours (preemptible VMs)
        Cloud.AZURE: 0.085,  # no log: assumed equal to AWS
        Cloud.SIM: 0.085,
        Cloud.LOCAL: 0.0,  # this machine: preempted only when a drill says so
    }
)


def region_of_zone(cloud: Cloud, zone: str) -> str:
    """``us-east-1b`` -> ``us-east-1`` (AWS), ``us-west1-b`` -> ``us-west1`` (GCP); Azure zones are
    numbers within a region, so the caller's region is used there."""
    if cloud is Cloud.GCP:
        return re.sub(r"-[a-z]$", "", zone)
    return zone[:-1] if zone and zone[-1].isalpha() else zone


def _rate(events: int, hours: float, prior: float) -> float:
    return (1.0 + events) / (1.0 / prior + hours)


@dataclass(frozen=True)
class HazardModel:
    """Preemption rates per instance-hour for spot offers (0 for on-demand)."""

    defaults: Mapping[Cloud, float] = field(default_factory=lambda: dict(DEFAULT_SPOT_HAZARD_PER_HOUR))
    by_zone_shape: Mapping[tuple[str, str, str, int], float] = field(default_factory=dict)
    by_zone: Mapping[tuple[str, str, str], float] = field(default_factory=dict)
    by_region: Mapping[tuple[str, str, str], float] = field(default_factory=dict)
    by_accelerator: Mapping[tuple[str, str], float] = field(default_factory=dict)

    @classmethod
    def from_lifetimes(
        cls, lifetimes: Iterable[Lifetime], defaults: Mapping[Cloud, float] | None = None
    ) -> HazardModel:
        """Estimate every level of the lookup from observed lifetimes."""
        base = dict(defaults or DEFAULT_SPOT_HAZARD_PER_HOUR)
        levels: list[dict[tuple[object, ...], list[float]]] = [{}, {}, {}, {}]
        for lt in lifetimes:
            keys: list[tuple[object, ...]] = [
                (lt.cloud.value, lt.zone, lt.accelerator, lt.gpu_count),
                (lt.cloud.value, lt.zone, lt.accelerator),
                (lt.cloud.value, region_of_zone(lt.cloud, lt.zone), lt.accelerator),
                (lt.cloud.value, lt.accelerator),
            ]
            for level, key in zip(levels, keys, strict=True):
                acc = level.setdefault(key, [0.0, 0.0])
                acc[0] += 1.0 if lt.preempted else 0.0
                acc[1] += lt.hours

        def rates(level: dict[tuple[object, ...], list[float]]) -> dict[tuple[object, ...], float]:
            return {k: _rate(int(v[0]), v[1], base[Cloud(str(k[0]))]) for k, v in level.items()}

        return cls(
            defaults=base,
            by_zone_shape=rates(levels[0]),  # type: ignore[arg-type]
            by_zone=rates(levels[1]),  # type: ignore[arg-type]
            by_region=rates(levels[2]),  # type: ignore[arg-type]
            by_accelerator=rates(levels[3]),  # type: ignore[arg-type]
        )

    def rate(
        self, cloud: Cloud, region: str, zone: str, accelerator: str | None, gpu_count: float | None, market: Market
    ) -> float:
        """Preemptions per instance-hour of one offer."""
        if market is Market.ON_DEMAND:
            return 0.0
        c = cloud.value
        acc = accelerator or ""
        n = int(gpu_count) if gpu_count else 0
        found = (
            self.by_zone_shape.get((c, zone, acc, n))
            or self.by_zone.get((c, zone, acc))
            or self.by_region.get((c, region, acc))
            or self.by_accelerator.get((c, acc))
        )
        if found is not None:
            return float(found)
        return float(self.defaults.get(cloud, DEFAULT_SPOT_HAZARD_PER_HOUR[Cloud.AWS]))

    def rates(self, offers: pd.DataFrame) -> np.ndarray:
        """Vectorized :meth:`rate` over an offers frame (columns cloud, region, zone, accelerator,
        gpu_count, market). Distinct (cloud, region, zone, accelerator, gpus, market) combinations
        are looked up once each."""
        if offers.empty:
            return np.zeros(0)
        cols = ["cloud", "region", "zone", "accelerator", "gpu_count", "market"]
        keys = offers[cols].astype(object).where(offers[cols].notna(), None)
        codes, uniques = pd.MultiIndex.from_frame(keys).factorize()
        table = np.array(
            [self.rate(Cloud(u[0]), str(u[1]), str(u[2]), u[3], u[4], Market(u[5])) for u in uniques],
            dtype=np.float64,
        )
        out: np.ndarray = table[codes]
        return out
