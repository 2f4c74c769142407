"""Vectorized evaluation of one job over every offer (numpy, no Python loop per offer).

For a job of ``n`` GPUs on an offer of ``G`` GPUs of accelerator ``a`` at ``p`` USD/h:
- it fits when ``G >= n`` (one instance, consolidated); under per-GPU packing it pays ``p * n / G``;
- its clean run time is ``steps / throughput(job type, a, n) / 3600`` hours;
- spot preemptions arrive at ``lambda`` per hour (:class:`~costopt.risk.hazard.HazardModel`); each
  costs the restart time ``r`` plus the work since the last checkpoint (``c / 2`` on average), so
  the expected time is ``clean / (1 - lambda * (c / 2 + r)) + r`` (a renewal argument; the ``+ r``
  is the first boot and restore), and an offer where ``lambda * (c / 2 + r) >= 1`` never finishes;
- the time at confidence ``q`` counts the ``q``-quantile of a Poisson number of preemptions over the
  expected time, each losing a whole interval: ``clean + N_q * (c + r) + r``;
- the expected cost is the expected time at the job's price, plus moving its checkpoint (GB x
  egress USD/GB) when the offer is in another region or cloud.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy.stats import poisson

from costopt.domain import Cloud
from costopt.planning.model import DEFAULT_EGRESS, Assumptions, JobSpec
from costopt.risk.hazard import HazardModel
from costopt.throughput.catalog import ThroughputCatalog
from costopt.throughput.model import JobType

OFFER_COLUMNS = ("cloud", "region", "zone", "instance_type", "market", "accelerator", "gpu_count", "usd_per_hour")


@dataclass(frozen=True, eq=False)
class OfferTable:
    """Offers in effect at one time, column-wise, ready for vectorized evaluation.

    Offers without a known accelerator or GPU count are dropped (they cannot be planned on).
    """

    frame: pd.DataFrame
    accelerators: tuple[str, ...]
    acc_code: np.ndarray
    gpus: np.ndarray
    price: np.ndarray
    hazard: np.ndarray
    cloud: np.ndarray
    region: np.ndarray
    zone: np.ndarray
    instance_type: np.ndarray
    market: np.ndarray
    accelerator: np.ndarray

    @classmethod
    def from_frame(cls, offers: pd.DataFrame, hazards: HazardModel | None = None) -> OfferTable:
        missing = [c for c in OFFER_COLUMNS if c not in offers.columns]
        if missing:
            raise ValueError(f"offers frame lacks columns {missing}")
        usable = offers[offers["accelerator"].notna() & offers["gpu_count"].notna() & (offers["gpu_count"] > 0)]
        frame = usable.reset_index(drop=True)
        codes, uniques = pd.factorize(frame["accelerator"].to_numpy(dtype=object))
        model = hazards or HazardModel()
        return cls(
            frame=frame,
            accelerators=tuple(str(u) for u in uniques),
            acc_code=np.asarray(codes, dtype=np.int64),
            gpus=frame["gpu_count"].to_numpy(dtype=np.float64),
            price=frame["usd_per_hour"].to_numpy(dtype=np.float64),
            hazard=model.rates(frame) if len(frame) else np.zeros(0),
            cloud=frame["cloud"].to_numpy(dtype=object),
            region=frame["region"].to_numpy(dtype=object),
            zone=frame["zone"].to_numpy(dtype=object),
            instance_type=frame["instance_type"].to_numpy(dtype=object),
            market=frame["market"].to_numpy(dtype=object),
            accelerator=frame["accelerator"].to_numpy(dtype=object),
        )

    def __len__(self) -> int:
        return len(self.frame)


def throughput_by_accelerator(
    catalog: ThroughputCatalog, job_type: JobType, gpu_count: int, accelerators: tuple[str, ...]
) -> tuple[np.ndarray, np.ndarray]:
    """(steps/s per accelerator (NaN unknown, 0 cannot run), whether each is an estimate)."""
    tput = np.full(len(accelerators), np.nan)
    est = np.zeros(len(accelerators), dtype=bool)
    for i, acc in enumerate(accelerators):
        cell = catalog.get(job_type, acc, gpu_count)
        if cell is not None:
            tput[i] = cell.steps_per_s
            est[i] = cell.is_estimate
    return tput, est


@dataclass(frozen=True, eq=False)
class Evaluation:
    """Per-offer figures of one job (arrays aligned with ``OfferTable.frame``).

    ``feasible`` is False where the job cannot run at all (does not fit, unknown or zero throughput,
    preempted faster than it can progress); other arrays are NaN there.
    """

    job: JobSpec
    feasible: np.ndarray
    steps_per_s: np.ndarray
    estimated: np.ndarray
    job_price: np.ndarray
    clean_hours: np.ndarray
    expected_hours: np.ndarray
    expected_cost: np.ndarray
    move_cost: np.ndarray
    hazard: np.ndarray
    risk: np.ndarray
    why_not: np.ndarray  # int code per offer: 0 ok, 1 too small, 2 no throughput, 3 preempted too often

    def hours_at_confidence(self, confidence: float, assumptions: Assumptions) -> np.ndarray:
        """Run time (h) that the job beats with probability ``confidence``."""
        c, r = assumptions.checkpoint_interval_hours, assumptions.restart_hours
        mean_preemptions = np.where(self.feasible, self.hazard * self.expected_hours, 0.0)
        n_q = np.zeros_like(mean_preemptions)
        risky = mean_preemptions > 0  # on-demand and infeasible offers need no quantile
        if risky.any():
            n_q[risky] = poisson.ppf(confidence, mean_preemptions[risky])
        return np.asarray(self.clean_hours + n_q * (c + r) + r, dtype=np.float64)


WHY_NOT = {1: "instance has fewer GPUs than the job", 2: "no throughput for this GPU", 3: "preempted too often"}


def egress_rates(table: OfferTable, job: JobSpec, assumptions: Assumptions) -> np.ndarray:
    """USD/GB to move the job's checkpoint to each offer's region (0 when it has no location)."""
    if job.location is None or job.checkpoint_gb == 0 or len(table) == 0:
        return np.zeros(len(table))
    rates = assumptions.egress_usd_per_gb or DEFAULT_EGRESS
    src, src_region = job.location.cloud, job.location.region
    same_cloud = table.cloud == src.value
    same_region = same_cloud & (table.region == src_region)
    inter = rates.inter_region.get(src, 0.02)
    internet = rates.internet.get(src, 0.09)
    return np.where(same_region, 0.0, np.where(same_cloud, inter, internet))


def evaluate(
    job: JobSpec,
    table: OfferTable,
    catalog: ThroughputCatalog,
    assumptions: Assumptions | None = None,
    *,
    tput_cache: Mapping[tuple[JobType, int], tuple[np.ndarray, np.ndarray]] | None = None,
) -> Evaluation:
    """Expected time, cost and risk of ``job`` on every offer of ``table`` (see module docstring)."""
    a = assumptions or Assumptions()
    key = (job.job_type, job.gpu_count)
    if tput_cache is not None and key in tput_cache:
        by_acc, est_by_acc = tput_cache[key]
    else:
        by_acc, est_by_acc = throughput_by_accelerator(catalog, job.job_type, job.gpu_count, table.accelerators)
    n = float(job.gpu_count)
    tput = by_acc[table.acc_code] if len(table) else np.zeros(0)
    estimated = est_by_acc[table.acc_code] if len(table) else np.zeros(0, dtype=bool)
    fits = table.gpus >= n
    runs = np.nan_to_num(tput, nan=0.0) > 0
    c, r = a.checkpoint_interval_hours, a.restart_hours
    overhead = table.hazard * (c / 2 + r)
    progresses = overhead < 1
    feasible = fits & runs & progresses
    why_not = np.where(~fits, 1, np.where(~runs, 2, np.where(~progresses, 3, 0)))
    share = n / table.gpus if a.per_gpu_packing else np.ones(len(table))
    job_price = np.where(fits, table.price * share, np.nan)
    with np.errstate(divide="ignore", invalid="ignore"):
        clean = np.where(feasible, job.steps / tput / 3600.0, np.nan)
        expected_hours = np.where(feasible, clean / (1.0 - overhead) + r, np.nan)
    move = egress_rates(table, job, a) * job.checkpoint_gb
    expected_cost = expected_hours * job_price + move
    risk = np.where(feasible, 1.0 - np.exp(-table.hazard * expected_hours), np.nan)
    return Evaluation(
        job=job,
        feasible=feasible,
        steps_per_s=tput,
        estimated=estimated,
        job_price=job_price,
        clean_hours=clean,
        expected_hours=expected_hours,
        expected_cost=expected_cost,
        move_cost=move,
        hazard=table.hazard,
        risk=risk,
        why_not=why_not,
    )


def cloud_of(value: str) -> Cloud:
    return Cloud(value)
